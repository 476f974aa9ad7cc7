/* fuzz_binlog.c - libFuzzer harness for the reader of beanstalkd's binlog.N
 * files (core/binlog.c): the input is one or more files, split at the
 * bytes "\nFILE\n"; each is read in turn, then classified. The checks: a
 * report's offset lies in its file, and every live job is whole (a body
 * inside the input ending in CRLF, a valid tube name, a live state). */
/* the checks are the point: keep assert() in release builds (NDEBUG) */
#undef NDEBUG
#define _GNU_SOURCE /* memmem */
#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "binlog.h"

#define MAX_FILES 4

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char split[] = "\nFILE\n";
    const char *p = (const char *)data, *end = p + size;
    struct bg_binlog log;
    struct bg_binlog_file files[MAX_FILES];
    size_t n = 0;
    bg_binlog_init(&log);
    while (n < MAX_FILES) {
        const char *next = n + 1 < MAX_FILES ? memmem(p, (size_t)(end - p), split, sizeof split - 1) : NULL;
        size_t len = next ? (size_t)(next - p) : (size_t)(end - p);
        if (bg_binlog_read(&log, p, len, &files[n]) != 0) break;
        assert(files[n].offset <= len);
        n++;
        if (!next) break;
        p = next + sizeof split - 1;
    }
    bg_binlog_classify(files, n);
    for (size_t i = 0; i < log.count; i++) {
        const struct bg_binlog_job *j = &log.jobs[i];
        assert(bg_binlog_find(&log, j->id) == j);
        assert(j->id && j->id <= log.max_id);
        if (!j->live) continue;
        assert(j->state >= BG_BINLOG_READY && j->state <= BG_BINLOG_DELAYED);
        assert(bg_tube_name_valid(j->tube, j->tube_len));
        assert(j->tube >= (const char *)data && j->tube + j->tube_len <= end);
        assert(j->body_len >= 2 && j->body >= (const char *)data && j->body + j->body_len <= end);
        assert(memcmp(j->body + j->body_len - 2, "\r\n", 2) == 0);
    }
    bg_binlog_free(&log);
    return 0;
}
