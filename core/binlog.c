/* binlog.c - beanstalkd's binlog.N files read (the contract: binlog.h). */
#include <stdlib.h>
#include <string.h>

#include "binlog.h"

/* One format version's layout. */
struct layout {
    size_t name_len_size;      /* bytes of the name length field */
    size_t record_size;        /* bytes of the job record */
    int64_t ns_per_unit;       /* of its times */
};

static const struct layout layout7 = {4, 80, 1};
static const struct layout layout5 = {8, 77, 1000};

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

void bg_binlog_init(struct bg_binlog *b)
{
    memset(b, 0, sizeof *b);
}

void bg_binlog_free(struct bg_binlog *b)
{
    bg_free(b->jobs);
    bg_free(b->slots);
    memset(b, 0, sizeof *b);
}

static size_t slot_of(uint64_t id, size_t slot_count)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 17) & (slot_count - 1);
}

const struct bg_binlog_job *bg_binlog_find(const struct bg_binlog *b, uint64_t id)
{
    if (!b->slot_count) return NULL;
    for (size_t i = slot_of(id, b->slot_count);; i = (i + 1) & (b->slot_count - 1)) {
        if (!b->slots[i]) return NULL;
        if (b->jobs[b->slots[i] - 1].id == id) return &b->jobs[b->slots[i] - 1];
    }
}

/* Room for one more job (and its slot): 0 or BG_OUT_OF_MEMORY. */
static int make_room(struct bg_binlog *b)
{
    if (b->count == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        struct bg_binlog_job *a = bg_realloc(b->jobs, cap * sizeof *a);
        if (!a) return BG_OUT_OF_MEMORY;
        b->jobs = a;
        b->cap = cap;
    }
    if ((b->count + 1) * 2 > b->slot_count) {
        size_t count = b->slot_count ? b->slot_count * 2 : 128;
        size_t *slots = bg_malloc(count * sizeof *slots);
        if (!slots) return BG_OUT_OF_MEMORY;
        memset(slots, 0, count * sizeof *slots);
        for (size_t k = 0; k < b->count; k++) {
            size_t i = slot_of(b->jobs[k].id, count);
            while (slots[i]) i = (i + 1) & (count - 1);
            slots[i] = k + 1;
        }
        bg_free(b->slots);
        b->slots = slots;
        b->slot_count = count;
    }
    return 0;
}

/* A job record as read, before it is applied. */
struct record {
    size_t name_len;
    const char *name;
    struct bg_binlog_job job;
    int32_t body_size;
};

/* Decode the job record at p in layout l. */
static void decode_record(const struct layout *l, const unsigned char *p, struct record *r)
{
    struct bg_binlog_job *j = &r->job;
    uint64_t unit = (uint64_t)l->ns_per_unit; /* wraps on nonsense, which is then refused */
    j->id = get_u64(p);
    j->pri = get_u32(p + 8);
    j->delay_ns = (int64_t)(get_u64(p + 16) * unit);
    j->ttr_ns = (int64_t)(get_u64(p + 24) * unit);
    r->body_size = (int32_t)get_u32(p + 32);
    j->created_ns = (int64_t)(get_u64(p + 40) * unit);
    j->deadline_ns = (int64_t)(get_u64(p + 48) * unit);
    j->reserves = get_u32(p + 56);
    j->timeouts = get_u32(p + 60);
    j->releases = get_u32(p + 64);
    j->buries = get_u32(p + 68);
    j->kicks = get_u32(p + 72);
    j->state = p[76];
}

/* Apply a valid record to b (as beanstalkd's readrec does). 0 or
 * BG_OUT_OF_MEMORY. */
static int apply(struct bg_binlog *b, const struct record *r, struct bg_binlog_file *report)
{
    struct bg_binlog_job *j = (struct bg_binlog_job *)bg_binlog_find(b, r->job.id);
    int live = j && j->live;
    if (r->name_len) report->full_records++;
    if (!r->name_len) { /* a short record: changes a live job, else ignored */
        if (!live) return 0;
        if (r->job.state == BG_BINLOG_DELETED) {
            j->live = 0;
            return 0;
        }
        struct bg_binlog_job keep = *j;
        *j = r->job;
        j->tube = keep.tube;
        j->tube_len = keep.tube_len;
        j->body = keep.body;
        j->body_len = keep.body_len;
        j->live = 1;
        return 0;
    }
    if (r->job.state == BG_BINLOG_DELETED) {
        if (j) j->live = 0;
        return 0;
    }
    if (!j) {
        if (make_room(b) != 0) return BG_OUT_OF_MEMORY;
        j = &b->jobs[b->count++];
        size_t i = slot_of(r->job.id, b->slot_count);
        while (b->slots[i]) i = (i + 1) & (b->slot_count - 1);
        b->slots[i] = b->count;
    }
    if (!live) report->jobs_made++;
    *j = r->job;
    j->tube = r->name;
    j->tube_len = (uint8_t)r->name_len;
    j->live = 1;
    return 0;
}

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* Read the records of a file of layout l from `at`; stops at the end
 * record, the end of the data or the first bad record (noted in report). */
static int read_records(struct bg_binlog *b, const struct layout *l, const unsigned char *data, size_t len,
                        size_t at, struct bg_binlog_file *report)
{
    size_t last_nonzero = len; /* one past the file's last nonzero byte */
    while (last_nonzero > 0 && !data[last_nonzero - 1]) last_nonzero--;
    while (at < len) {
        size_t start = at;
        report->offset = start;
        if (at >= last_nonzero) return 0; /* only zeros left: the end */
        if (len - at < l->name_len_size + l->record_size) {
            report->damage = BG_BINLOG_TRUNCATED;
            return 0;
        }
        uint64_t name_len = l->name_len_size == 4 ? (uint64_t)(int64_t)(int32_t)get_u32(data + at)
                                                  : get_u64(data + at);
        at += l->name_len_size;
        if (name_len > BG_TUBE_NAME_MAX) { /* a negative int32 too */
            report->damage = BG_BINLOG_BAD_NAME_LENGTH;
            return 0;
        }
        struct record r = {.name_len = (size_t)name_len, .name = (const char *)data + at};
        if (len - at < r.name_len + l->record_size) {
            report->damage = BG_BINLOG_TRUNCATED;
            return 0;
        }
        at += r.name_len;
        decode_record(l, data + at, &r);
        at += l->record_size;
        if (!r.job.id) { /* the end record: only zeros may follow */
            if (last_nonzero > at) {
                size_t k = at;
                while (!data[k]) k++;
                report->offset = k;
                report->damage = BG_BINLOG_DATA_AFTER_END;
            }
            return 0;
        }
        if (r.name_len && !bg_tube_name_valid(r.name, r.name_len)) {
            report->damage = BG_BINLOG_BAD_TUBE;
            return 0;
        }
        if (r.job.state > BG_BINLOG_DELAYED) {
            report->damage = BG_BINLOG_BAD_STATE;
            return 0;
        }
        if (r.job.delay_ns < 0 || r.job.ttr_ns < 0 || r.job.created_ns < 0 || r.body_size < 2 ||
            (uint64_t)r.job.delay_ns / BG_SECOND > UINT32_MAX || (uint64_t)r.job.ttr_ns / BG_SECOND > UINT32_MAX) {
            report->damage = BG_BINLOG_BAD_FIELD;
            return 0;
        }
        r.job.body_len = (uint32_t)r.body_size;
        if (r.name_len) {
            /* a torn put: the job record was written, its body not (all of
             * it, or the part that is missing, reads as zeros to the end) */
            if (len - at < r.job.body_len ||
                (memcmp(data + at + r.job.body_len - 2, "\r\n", 2) != 0 && last_nonzero <= at + r.job.body_len)) {
                if (r.job.id > b->max_id) b->max_id = r.job.id;
                report->damage = BG_BINLOG_TRUNCATED;
                return 0;
            }
            if (memcmp(data + at + r.job.body_len - 2, "\r\n", 2) != 0) {
                report->damage = BG_BINLOG_BAD_BODY;
                return 0;
            }
            r.job.body = (const char *)data + at;
            at += r.job.body_len;
        }
        if (r.job.id > b->max_id) b->max_id = r.job.id;
        report->records++;
        if (apply(b, &r, report) != 0) return BG_OUT_OF_MEMORY;
    }
    report->offset = len;
    return 0;
}

int bg_binlog_read(struct bg_binlog *b, const char *data, size_t len, struct bg_binlog_file *report)
{
    const unsigned char *p = (const unsigned char *)data;
    memset(report, 0, sizeof *report);
    report->bytes = len;
    if (len < 4 || !get_u32(p)) {
        /* created (and maybe zero-filled), the version never written */
        report->damage = all_zero(p, len) ? BG_BINLOG_NEVER_WRITTEN : BG_BINLOG_BAD_VERSION;
        return 0;
    }
    int version = (int)get_u32(p);
    const struct layout *l = version == 7 ? &layout7 : version == 5 ? &layout5 : NULL;
    if (!l) {
        report->damage = BG_BINLOG_BAD_VERSION;
        return 0;
    }
    report->version = version;
    return read_records(b, l, p, len, 4, report);
}

void bg_binlog_classify(struct bg_binlog_file *files, size_t n)
{
    for (size_t i = n; i-- > 0;) {
        struct bg_binlog_file *f = &files[i];
        if (!f->records && (f->damage == BG_BINLOG_OK || f->damage == BG_BINLOG_NEVER_WRITTEN)) continue;
        f->torn = f->damage == BG_BINLOG_TRUNCATED;
        return;
    }
}

int bg_binlog_damaged(const struct bg_binlog_file *f)
{
    return f->damage != BG_BINLOG_OK && f->damage != BG_BINLOG_NEVER_WRITTEN && !f->torn;
}

const char *bg_binlog_damage_name(enum bg_binlog_damage d)
{
    static const char *const names[] = {
        [BG_BINLOG_OK] = "none", [BG_BINLOG_NEVER_WRITTEN] = "never_written",
        [BG_BINLOG_TRUNCATED] = "truncated", [BG_BINLOG_BAD_VERSION] = "bad_version",
        [BG_BINLOG_BAD_NAME_LENGTH] = "bad_name_length", [BG_BINLOG_BAD_TUBE] = "bad_tube_name",
        [BG_BINLOG_BAD_STATE] = "bad_state", [BG_BINLOG_BAD_FIELD] = "bad_field",
        [BG_BINLOG_BAD_BODY] = "bad_body", [BG_BINLOG_DATA_AFTER_END] = "data_after_end",
    };
    return (unsigned)d < sizeof names / sizeof *names ? names[d] : "unknown";
}
