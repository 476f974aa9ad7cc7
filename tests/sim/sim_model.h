/* sim_model.h - what the simulator expects of a recovered log.
 *
 * Every record the engine hands the log is noted as a change (the
 * simulator's journal hooks); a change is acknowledged once the reply of
 * the command that made it may go (the reply rule, sim.c). Ids a reply
 * showed (a put's, a reserve's) are noted too. After a crash the recovered
 * engine is checked against what was acknowledged:
 *   - a job whose last acknowledged change put or updated it is there
 *     (unless a later, unacknowledged delete may have reached the disk);
 *   - a job whose delete was acknowledged is not;
 *   - a job that is there was put by this run, with its body and tube, and
 *     a priority and buried-ness of its last acknowledged change or of a
 *     later one;
 *   - the next id is above every id a reply ever showed (ids are never
 *     reused).
 * Then the recovered engine becomes the new base: what recovery read from
 * the disk is what the server now serves. */
#ifndef BEANGATE_SIM_MODEL_H
#define BEANGATE_SIM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../../core/core.h"

#define MODEL_NO_REPLY UINT64_MAX  /* a change no reply reports (a timer's) */
#define MODEL_TUBE_MAX (BG_TUBE_NAME_MAX + 1)

enum change_kind { CH_PUT, CH_UPDATE, CH_DELETE, CH_SHOWN };

struct change {
    uint64_t id;
    uint64_t mark;             /* the reply's mark; MODEL_NO_REPLY */
    uint64_t body_hash;
    uint32_t body_len, pri;
    uint8_t kind, state, acked, has_mark;
    char tube[MODEL_TUBE_MAX];
};

/* What a job must look like after a crash. */
struct expect {
    uint8_t known;             /* put by this run (or found at a recovery) */
    uint8_t acked;             /* a change of it was acknowledged */
    uint8_t present;           /* ... and the last such one left it alive */
    uint8_t buried;            /* ... buried */
    uint8_t later_delete;      /* an unacknowledged delete came after it */
    uint8_t later_count;       /* unacknowledged changes after it (capped) */
    uint32_t pri;
    uint32_t later_pri[6];     /* their priorities (the first six) */
    uint64_t body_hash;
    uint32_t body_len;
    char tube[MODEL_TUBE_MAX];
};

struct model {
    struct expect *base;       /* by id: the state at the last recovery */
    size_t base_cap;
    struct change *log;        /* since then */
    size_t nlog, log_cap;
    uint64_t max_shown;        /* the highest id an acknowledged reply showed */
    uint64_t max_known;        /* the highest id made */
};

void model_init(struct model *m);
void model_free(struct model *m);
/* Note a change (its mark comes later: model_set_mark). Returns its index. */
size_t model_note(struct model *m, const struct change *c);
/* The command whose changes are log[from, nlog) has a reply waiting for
 * mark (MODEL_NO_REPLY: none). */
void model_set_mark(struct model *m, size_t from, uint64_t mark);
/* Acknowledge every change whose reply may go: may_go(ctx, mark). */
void model_ack(struct model *m, int (*may_go)(void *ctx, uint64_t mark), void *ctx);
/* Check the recovered engine e; 0, or -1 with a sentence in why. */
int model_check(struct model *m, struct bg_engine *e, char *why, size_t why_size);
/* e is the new base; the change log starts empty. */
void model_rebase(struct model *m, struct bg_engine *e);
/* FNV-1a of a job body. */
uint64_t model_body_hash(const char *body, size_t len);

#endif
