/* tempdir.h - a private directory under /tmp for a unit test's files (a
 * write-ahead log), made and removed again. Header-only: one per test. */
#ifndef BEANGATE_TEST_TEMPDIR_H
#define BEANGATE_TEST_TEMPDIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

/* Make /tmp/bg-<what>-XXXXXX into dir (room for 40 bytes). */
static void tempdir_make(char *dir, size_t size, const char *what)
{
    snprintf(dir, size, "/tmp/bg-%s-XXXXXX", what);
    assert_non_null(mkdtemp(dir));
}

/* Remove dir and the files in it (it has no subdirectories). */
static void tempdir_remove(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    rmdir(dir);
}

#endif
