/* storage_faulty.h - a test hook of the real binary: io/storage.h on the
 * real files (a posix storage), failing calls as a control file says
 * (docs/durability.md, "Testing disk faults"). Used only when the
 * environment variable BEANGATE_TEST_DISK_FAULTS names that file. */
#ifndef BEANGATE_STORAGE_FAULTY_H
#define BEANGATE_STORAGE_FAULTY_H

#include "storage.h"

#define STORAGE_FAULTS_ENV "BEANGATE_TEST_DISK_FAULTS"

/* Wrap inner (which the wrapper then owns: destroy frees both) so that its
 * calls on *.wal files fail as control_path says. The file is read again
 * whenever its size or mtime changed; lines (one fault each, an empty or
 * missing file: none):
 *   write EIO | sync EIO | sync_dir EIO   every such call fails (any errno
 *                                         name of ENOSPC, EIO, EDQUOT, EROFS)
 *   write EIO once | sync EIO once        the next such call fails, then not
 * A failed sync of a segment also zeroes what was written to it since its
 * last good sync (the pages a kernel may drop after a writeback error).
 *   sync delay 300ms                      every sync first waits that long
 *   write short                           a write takes half its bytes
 * 0 or ENOMEM. */
int storage_faulty_wrap(struct storage **out, struct storage *inner, const char *control_path);

#endif
