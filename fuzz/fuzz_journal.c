/* fuzz_journal.c - libFuzzer harness for the recovery reader: the input is
 * a log segment; every record it decodes is applied to an engine, as
 * recovery does. ASan/UBSan watch the decoder and the restore paths. */
/* the checks are the point: keep assert() in release builds (NDEBUG) */
#undef NDEBUG
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct bg_engine e;
    if (bg_engine_init(&e, BG_JOB_SIZE_DEFAULT, NULL) != 0) return 0;
    const char *p = (const char *)data;
    size_t at = bg_journal_check_header(p, size) == 0 ? BG_JOURNAL_HEADER_SIZE : 0;
    bg_time now = 1000 * BG_SECOND;
    struct bg_journal_record rec;
    size_t used;
    while (at < size && bg_journal_decode(p + at, size - at, &rec, &used) == 0) {
        assert(used > 0 && used <= size - at);
        at += used;
        bg_time deadline = now + (rec.job.deadline_wall % (1000 * BG_SECOND));
        switch (rec.type) {
        case BG_REC_JOB: bg_engine_restore_job(&e, &rec.job, deadline, now, now); break;
        case BG_REC_UPDATE: bg_engine_restore_update(&e, &rec.job, deadline, now); break;
        case BG_REC_DELETE: bg_engine_restore_delete(&e, rec.job.id); break;
        case BG_REC_PAUSE: bg_engine_restore_pause(&e, rec.tube, rec.pause_s, deadline, now); break;
        }
        /* restores keep the structure whole (side records included); no
         * waiter exists, so the matching invariant holds too */
        const char *broken;
        if (bg_engine_audit(&e, &broken) != 0) {
            fprintf(stderr, "engine audit: %s\n", broken);
            abort();
        }
    }
    bg_engine_tick(&e, now + 2000 * BG_SECOND);
    assert(e.ready_count + e.delayed_count + e.buried_count == e.job_count);
    bg_engine_destroy(&e);
    return 0;
}
