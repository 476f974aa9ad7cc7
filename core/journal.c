/* journal.c - the write-ahead log's record format: encoding and decoding,
 * pure (no files). A segment is a header followed by records:
 *
 *   segment header  "BGWAL\r\n\0" u32 version u32 reserved          (16 bytes)
 *   record          u32 payload_len  u32 crc32c(type..payload)  u8 type  payload
 *
 * All integers little-endian. A record whose length runs past the end of the
 * data is a torn tail; one whose checksum does not match is corrupt. Either
 * way the reader stops there and says so; it never guesses. After such a
 * stop, bg_journal_examine looks at what follows (only to classify it as a
 * torn tail or damage and to count what would be lost; nothing after the
 * stop is ever applied). */
#include <string.h>

#include "core.h"

static const char segment_magic[8] = {'B', 'G', 'W', 'A', 'L', '\r', '\n', '\0'};

/* ---- CRC-32C (Castagnoli) and CRC-32 (IEEE), table-driven -------------- */

/* A reflected CRC-32's table for polynomial poly (reversed bit order). */
static void crc_init(uint32_t table[256], uint32_t poly)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? poly ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
}

/* The reflected CRC-32 of p[0..n) with table (of polynomial poly, filled
 * on first use): initial value and final xor all ones. */
static uint32_t crc_run(uint32_t table[256], uint32_t poly, const unsigned char *p, size_t n)
{
    if (!table[1]) crc_init(table, poly);
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static uint32_t crc32c_table[256], crc32_table[256];

uint32_t bg_crc32(const void *data, size_t n)
{
    return crc_run(crc32_table, 0xEDB88320u, data, n);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The same CRC with the SSE4.2 instruction, 8 bytes at a time. */
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(const unsigned char *p, size_t n)
{
    uint64_t c = 0xFFFFFFFFu;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
    }
    uint32_t c32 = (uint32_t)c;
    for (; n; n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32 ^ 0xFFFFFFFFu;
}
#endif

uint32_t bg_crc32c(const void *data, size_t n)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    static int has_sse42 = -1;
    if (has_sse42 < 0) has_sse42 = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    if (has_sse42) return crc32c_sse42(data, n);
#endif
    return crc_run(crc32c_table, 0x82F63B78u, data, n);
}

/* ---- little-endian helpers --------------------------------------------- */

static void put_u8(unsigned char **p, uint8_t v) { *(*p)++ = v; }

static void put_u32(unsigned char **p, uint32_t v)
{
    for (int i = 0; i < 4; i++) *(*p)++ = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char **p, uint64_t v)
{
    for (int i = 0; i < 8; i++) *(*p)++ = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

/* ---- encoding ---------------------------------------------------------- */

void bg_journal_segment_header(char out[BG_JOURNAL_HEADER_SIZE])
{
    unsigned char *p = (unsigned char *)out;
    memcpy(p, segment_magic, sizeof segment_magic);
    p += sizeof segment_magic;
    put_u32(&p, BG_JOURNAL_VERSION);
    put_u32(&p, 0);
}

int bg_journal_check_header(const char *data, size_t len)
{
    if (len < BG_JOURNAL_HEADER_SIZE || memcmp(data, segment_magic, sizeof segment_magic) != 0)
        return BG_BAD_FORMAT;
    if (get_u32((const unsigned char *)data + 8) != BG_JOURNAL_VERSION) return BG_BAD_FORMAT;
    return 0;
}

/* The frame around a record's payload: length, checksum, type. */
#define FRAME (4 + 4 + 1)

/* Reserve room for a record of `payload` bytes; returns where the type byte
 * goes. The length and checksum are filled in by finish_record. */
static unsigned char *start_record(struct bg_buf *out, size_t payload)
{
    unsigned char *p = (unsigned char *)bg_buf_reserve(out, FRAME + payload);
    return p ? p + 8 : NULL;
}

size_t bg_journal_record_span(const char *data, size_t len)
{
    return len < 4 ? 0 : FRAME + (size_t)get_u32((const unsigned char *)data);
}

static void finish_record(struct bg_buf *out, unsigned char *type_at, unsigned char *end)
{
    unsigned char *head = type_at - 8;
    uint32_t payload = (uint32_t)(end - type_at - 1);
    unsigned char *p = head;
    put_u32(&p, payload);
    put_u32(&p, bg_crc32c(type_at, (size_t)(end - type_at)));
    out->len += (size_t)(end - head);
}

/* The fields every job record carries, after the type byte. */
#define JOB_FIXED (8 + 4 + 1 + 4 + 4 + 8 + 8 + 5 * 4)

static void put_job_fixed(unsigned char **p, const struct bg_journal_job *r)
{
    put_u64(p, r->id);
    put_u32(p, r->pri);
    put_u8(p, r->state);
    put_u32(p, r->delay_s);
    put_u32(p, r->ttr_s);
    put_u64(p, r->deadline_wall);
    put_u64(p, r->created_wall);
    put_u32(p, r->reserves);
    put_u32(p, r->timeouts);
    put_u32(p, r->releases);
    put_u32(p, r->buries);
    put_u32(p, r->kicks);
}

/* The payload of a job record: fixed fields, tube, and body if any. */
static size_t job_payload(size_t tube_len, int with_body, uint32_t body_len)
{
    return JOB_FIXED + 1 + tube_len + (with_body ? 4 + (size_t)body_len : 0);
}

size_t bg_journal_job_record_size(size_t tube_len, uint32_t body_len)
{
    return FRAME + job_payload(tube_len, 1, body_len);
}

int bg_journal_encode_job(struct bg_buf *out, const struct bg_journal_job *r, int with_body)
{
    size_t tube_len = strlen(r->tube);
    size_t payload = job_payload(tube_len, with_body, r->body_len);
    unsigned char *type_at = start_record(out, payload);
    if (!type_at) return BG_OUT_OF_MEMORY;
    unsigned char *p = type_at;
    put_u8(&p, with_body ? BG_REC_JOB : BG_REC_UPDATE);
    put_job_fixed(&p, r);
    put_u8(&p, (uint8_t)tube_len);
    memcpy(p, r->tube, tube_len);
    p += tube_len;
    if (with_body) {
        put_u32(&p, r->body_len);
        memcpy(p, r->body, r->body_len);
        p += r->body_len;
    }
    finish_record(out, type_at, p);
    return 0;
}

int bg_journal_encode_delete(struct bg_buf *out, uint64_t id)
{
    unsigned char *type_at = start_record(out, 8);
    if (!type_at) return BG_OUT_OF_MEMORY;
    unsigned char *p = type_at;
    put_u8(&p, BG_REC_DELETE);
    put_u64(&p, id);
    finish_record(out, type_at, p);
    return 0;
}

int bg_journal_encode_snapshot_end(struct bg_buf *out)
{
    unsigned char *type_at = start_record(out, 0);
    if (!type_at) return BG_OUT_OF_MEMORY;
    unsigned char *p = type_at;
    put_u8(&p, BG_REC_SNAPSHOT_END);
    finish_record(out, type_at, p);
    return 0;
}

int bg_journal_encode_pause(struct bg_buf *out, const char *tube, uint32_t pause_s,
                            uint64_t unpause_wall)
{
    size_t tube_len = strlen(tube);
    unsigned char *type_at = start_record(out, 4 + 8 + 1 + tube_len);
    if (!type_at) return BG_OUT_OF_MEMORY;
    unsigned char *p = type_at;
    put_u8(&p, BG_REC_PAUSE);
    put_u32(&p, pause_s);
    put_u64(&p, unpause_wall);
    put_u8(&p, (uint8_t)tube_len);
    memcpy(p, tube, tube_len);
    p += tube_len;
    finish_record(out, type_at, p);
    return 0;
}

/* ---- decoding ---------------------------------------------------------- */

/* Read a tube name of n bytes into out; 0 or BG_BAD_FORMAT. */
static int get_tube(const unsigned char *p, size_t n, char out[BG_TUBE_NAME_MAX + 1])
{
    if (!bg_tube_name_valid((const char *)p, n)) return BG_BAD_FORMAT;
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

int bg_journal_decode(const char *data, size_t len, struct bg_journal_record *rec, size_t *used)
{
    const unsigned char *p = (const unsigned char *)data;
    if (len < FRAME) return BG_TORN;
    uint32_t payload = get_u32(p);
    if (payload > BG_JOB_SIZE_LIMIT + 1024u) return BG_CORRUPT;
    if (len - FRAME < payload) return BG_TORN;
    if (get_u32(p + 4) != bg_crc32c(p + 8, (size_t)payload + 1)) return BG_CORRUPT;
    const unsigned char *b = p + FRAME, *end = b + payload;
    memset(rec, 0, sizeof *rec);
    rec->type = p[8];
    switch (rec->type) {
    case BG_REC_JOB:
    case BG_REC_UPDATE: {
        struct bg_journal_job *j = &rec->job;
        if (payload < JOB_FIXED + 1) return BG_CORRUPT;
        j->id = get_u64(b);
        j->pri = get_u32(b + 8);
        j->state = b[12];
        j->delay_s = get_u32(b + 13);
        j->ttr_s = get_u32(b + 17);
        j->deadline_wall = get_u64(b + 21);
        j->created_wall = get_u64(b + 29);
        j->reserves = get_u32(b + 37);
        j->timeouts = get_u32(b + 41);
        j->releases = get_u32(b + 45);
        j->buries = get_u32(b + 49);
        j->kicks = get_u32(b + 53);
        b += JOB_FIXED;
        size_t tube_len = *b++;
        if ((size_t)(end - b) < tube_len || get_tube(b, tube_len, rec->tube) != 0)
            return BG_CORRUPT;
        j->tube = rec->tube;
        b += tube_len;
        if (j->state != BG_JOB_READY && j->state != BG_JOB_DELAYED && j->state != BG_JOB_BURIED)
            return BG_CORRUPT;
        if (rec->type == BG_REC_JOB) {
            if (end - b < 4) return BG_CORRUPT;
            j->body_len = get_u32(b);
            b += 4;
            if ((size_t)(end - b) != j->body_len || j->body_len < 2) return BG_CORRUPT;
            j->body = (const char *)b;
            b += j->body_len;
        }
        break;
    }
    case BG_REC_DELETE:
        if (payload != 8) return BG_CORRUPT;
        rec->job.id = get_u64(b);
        b += 8;
        break;
    case BG_REC_SNAPSHOT_END:
        if (payload != 0) return BG_CORRUPT;
        break;
    case BG_REC_PAUSE: {
        if (payload < 13) return BG_CORRUPT;
        rec->pause_s = get_u32(b);
        rec->unpause_wall = get_u64(b + 4);
        size_t tube_len = b[12];
        b += 13;
        if ((size_t)(end - b) != tube_len || get_tube(b, tube_len, rec->tube) != 0)
            return BG_CORRUPT;
        b += tube_len;
        break;
    }
    default:
        return BG_CORRUPT;
    }
    if (b != end) return BG_CORRUPT;
    *used = (size_t)(end - p);
    return 0;
}

/* ---- where a segment stops being readable, and what follows ------------ */

static int valid_state(uint8_t s)
{
    return s == BG_JOB_READY || s == BG_JOB_DELAYED || s == BG_JOB_BURIED;
}

/* If the record header at p (avail bytes from there to the end of the data)
 * agrees with the format, as far as the bytes present show (length, type,
 * and the lengths and state inside the payload), its payload length; else
 * -1. No checksum is computed: this is the cheap test before one. */
static int64_t frame_payload(const unsigned char *p, size_t avail)
{
    if (avail < FRAME) return -1;
    uint32_t payload = get_u32(p);
    if (payload > BG_JOB_SIZE_LIMIT + 1024u) return -1;
    const unsigned char *b = p + FRAME;
    size_t have = avail - FRAME; /* payload bytes present */
    int ok;
    switch (p[8]) {
    case BG_REC_DELETE: ok = payload == 8; break;
    case BG_REC_SNAPSHOT_END: ok = payload == 0; break;
    case BG_REC_PAUSE:
        ok = payload >= 14 && payload <= 13 + BG_TUBE_NAME_MAX && (have <= 12 || b[12] == payload - 13);
        break;
    case BG_REC_JOB:
    case BG_REC_UPDATE: {
        ok = payload >= JOB_FIXED + 2 && (have <= 12 || valid_state(b[12]));
        if (!ok || have <= JOB_FIXED) break;
        size_t tube = b[JOB_FIXED], fields = JOB_FIXED + 1 + tube;
        if (tube == 0 || tube > BG_TUBE_NAME_MAX) ok = 0;
        else if (p[8] == BG_REC_UPDATE) ok = payload == fields;
        else ok = payload >= fields + 4 + 2 && (have < fields + 4 || get_u32(b + fields) == payload - fields - 4);
        break;
    }
    default: ok = 0;
    }
    return ok ? (int64_t)payload : -1;
}

/* Nonzero if the record at p has a length that fits in avail and a
 * checksum that matches (whatever its fields say). */
static int checksum_matches(const unsigned char *p, size_t avail)
{
    if (avail < FRAME) return 0;
    uint32_t payload = get_u32(p);
    return payload <= avail - FRAME && get_u32(p + 4) == bg_crc32c(p + 8, (size_t)payload + 1);
}

enum bg_journal_damage bg_journal_header_damage(const char *data, size_t len)
{
    char want[BG_JOURNAL_HEADER_SIZE];
    bg_journal_segment_header(want);
    size_t n = len < sizeof want ? len : sizeof want;
    int zeros = 1;
    for (size_t i = 0; i < n; i++) zeros &= data[i] == 0;
    if (zeros) return BG_DAMAGE_NO_HEADER; /* never written (a crash after the file was made) */
    if (len < sizeof want) return memcmp(data, want, n) == 0 ? BG_DAMAGE_NO_HEADER : BG_DAMAGE_BAD_HEADER;
    if (memcmp(data, segment_magic, sizeof segment_magic) != 0) return BG_DAMAGE_BAD_HEADER;
    return get_u32((const unsigned char *)data + 8) == BG_JOURNAL_VERSION ? BG_DAMAGE_NONE
                                                                         : BG_DAMAGE_OTHER_VERSION;
}

/* What is wrong with the record at p, which bg_journal_decode refused. */
static enum bg_journal_damage record_damage(const unsigned char *p, size_t avail)
{
    if (avail < FRAME) return BG_DAMAGE_TRUNCATED;
    if (checksum_matches(p, avail)) return BG_DAMAGE_BAD_RECORD;
    int64_t payload = frame_payload(p, avail);
    if (payload < 0) return BG_DAMAGE_BAD_FRAME;
    return (uint64_t)payload > avail - FRAME ? BG_DAMAGE_TRUNCATED : BG_DAMAGE_CHECKSUM;
}

/* Nonzero if data[offset, len) starts with a page never written back: zero
 * bytes from offset up to the end of its page, and more data after it.
 *
 * Why it is safe to call the stop a torn tail then (docs/durability.md,
 * "Torn tail or damage"): offset is where a record starts (the end of the
 * last good one, or the header), and every record the log writes has a
 * nonzero type byte in its frame, every header a nonzero magic; zeros
 * there up to a page end mean the page holding them was never written
 * back. A sync writes back every page written before it and synced bytes
 * never vanish, so nothing from offset on was synced: the records after
 * the hole are the unsynced rest of the same writes (the kernel wrote a
 * later page first). When the page ends inside the frame (fewer than its 9
 * bytes before the page end), the zeros are the low bytes of the record's
 * length, and of its checksum, which are zero for a written record only by
 * chance (a length a multiple of 256, ...); the record still fails to
 * decode, so a write was lost there.
 *
 * Zeros inside a record (a job body may be all zeros) never count: only
 * the bytes at the stop itself are looked at, and they are the frame of a
 * record, never a body. A zero run that ends elsewhere than at a page end
 * (a torn sector, a zeroed range inside a page) or a bad record with
 * nonzero bytes at the stop stays damage when records follow. */
static int unwritten_page_at(const unsigned char *p, size_t len, size_t offset)
{
    size_t page_end = (offset / BG_JOURNAL_PAGE_SIZE + 1) * BG_JOURNAL_PAGE_SIZE;
    if (page_end >= len) return 0; /* zeros to the end: a torn tail anyway if nothing follows */
    for (size_t i = offset; i < page_end; i++)
        if (p[i]) return 0;
    return 1;
}

void bg_journal_examine(const char *data, size_t len, size_t offset, size_t budget,
                        struct bg_journal_tail *t,
                        void (*each)(void *ctx, const struct bg_journal_record *rec), void *ctx)
{
    const unsigned char *p = (const unsigned char *)data;
    memset(t, 0, sizeof *t);
    t->offset = offset;
    t->dropped_bytes = len - offset;
    t->search_complete = 1;
    size_t at = offset;
    if (offset < BG_JOURNAL_HEADER_SIZE) {
        t->damage = bg_journal_header_damage(data, len);
        at = BG_JOURNAL_HEADER_SIZE;
    } else {
        t->damage = record_damage(p + offset, len - offset);
    }
    t->unwritten_page = unwritten_page_at(p, len, offset);
    size_t spent = 0, used;
    struct bg_journal_record rec;
    while (at < len) {
        if (bg_journal_decode(data + at, len - at, &rec, &used) == 0) {
            t->readable++;
            t->readable_bytes += used;
            t->readable_by_type[rec.type]++;
            if (each) each(ctx, &rec);
            at += used;
            continue;
        }
        /* a bad record whose frame is believable: skip it whole (never look
         * for records inside it: a body may hold anything) */
        int64_t payload = frame_payload(p + at, len - at);
        uint32_t claimed = len - at >= FRAME ? get_u32(p + at) : 0;
        if (payload < 0 && len - at >= FRAME && claimed <= len - at - FRAME) { /* a type we do not know? */
            if (spent + claimed + 1 > budget) {
                t->search_complete = 0;
                return;
            }
            spent += (size_t)claimed + 1;
            if (checksum_matches(p + at, len - at)) payload = claimed;
        }
        if (payload >= 0) {
            if ((uint64_t)payload > len - at - FRAME) break; /* cut by the end of the data */
            at += FRAME + (size_t)payload;
            continue;
        }
        /* no record can start here: look for the next readable one */
        size_t next = at + 1;
        for (; next + FRAME <= len; next++) {
            int64_t n = frame_payload(p + next, len - next);
            if (n < 0 || (uint64_t)n > len - next - FRAME) continue;
            if (spent + (size_t)n + 1 > budget) {
                t->search_complete = 0;
                return;
            }
            spent += (size_t)n + 1;
            if (bg_journal_decode(data + next, len - next, &rec, &used) == 0) break;
        }
        if (next + FRAME > len) break;
        at = next;
    }
}

int bg_journal_tail_torn(const struct bg_journal_tail *t)
{
    switch (t->damage) {
    case BG_DAMAGE_NO_HEADER:
    case BG_DAMAGE_TRUNCATED:
    case BG_DAMAGE_CHECKSUM:
    case BG_DAMAGE_BAD_FRAME:
        return t->unwritten_page || (t->readable == 0 && t->search_complete);
    default:
        return 0; /* a foreign header, or a record with a good checksum and bad fields:
                   * no interrupted write leaves those */
    }
}

const char *bg_journal_damage_name(enum bg_journal_damage d)
{
    static const char *const names[] = {
        [BG_DAMAGE_NONE] = "none",
        [BG_DAMAGE_NO_HEADER] = "no_header",
        [BG_DAMAGE_BAD_HEADER] = "bad_header",
        [BG_DAMAGE_OTHER_VERSION] = "other_version",
        [BG_DAMAGE_TRUNCATED] = "truncated",
        [BG_DAMAGE_CHECKSUM] = "checksum",
        [BG_DAMAGE_BAD_RECORD] = "bad_record",
        [BG_DAMAGE_BAD_FRAME] = "bad_frame",
    };
    return (unsigned)d < sizeof names / sizeof names[0] ? names[d] : "unknown";
}
