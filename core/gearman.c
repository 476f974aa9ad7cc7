/* gearman.c - the Gearman protocol's wire format: request packets, response
 * and request encoding, text admin lines, function names as tube names.
 * Pure: no I/O, no allocation except through bg_buf.
 *
 * Where gearmand 1.1.20 behaves in a way we keep on purpose, the comment says
 * "gearmand:"; where we differ from it on purpose, "unlike gearmand:". The
 * measurements behind both are recorded in tests/unit/test_gearman_codec.c.
 */
#include <string.h>

#include "gearman.h"

/* ---- the packet type table ---------------------------------------------- */

/* What an argument is, for its length limit. */
enum field {
    F_ANY,        /* no limit of its own (data, numbers) */
    F_FUNCTION,   /* GM_FUNCTION_MAX */
    F_UNIQUE,     /* GM_UNIQUE_MAX */
    F_HANDLE,     /* GM_HANDLE_MAX */
    F_CLIENT_ID,  /* GM_CLIENT_ID_MAX */
    F_OPTION,     /* GM_OPTION_MAX */
};

static const uint32_t field_max[] = {
    [F_ANY] = UINT32_MAX, [F_FUNCTION] = GM_FUNCTION_MAX, [F_UNIQUE] = GM_UNIQUE_MAX,
    [F_HANDLE] = GM_HANDLE_MAX, [F_CLIENT_ID] = GM_CLIENT_ID_MAX, [F_OPTION] = GM_OPTION_MAX,
};

struct type_info {
    const char *name;
    int8_t nargs;               /* request argument count; -1: not a request */
    uint8_t field[GM_ARGS_MAX]; /* enum field of each argument */
};

#define RESPONSE(n) {n, -1, {0}}
#define FN F_FUNCTION
#define UQ F_UNIQUE
#define HD F_HANDLE

/* Indexed by type; a NULL name is a number gearman does not use. */
static const struct type_info types[GM_TYPE_LAST + 1] = {
    [GM_CAN_DO] = {"CAN_DO", 1, {FN}},
    [GM_CANT_DO] = {"CANT_DO", 1, {FN}},
    [GM_RESET_ABILITIES] = {"RESET_ABILITIES", 0, {0}},
    [GM_PRE_SLEEP] = {"PRE_SLEEP", 0, {0}},
    [GM_NOOP] = RESPONSE("NOOP"),
    [GM_SUBMIT_JOB] = {"SUBMIT_JOB", 3, {FN, UQ}},
    [GM_JOB_CREATED] = RESPONSE("JOB_CREATED"),
    [GM_GRAB_JOB] = {"GRAB_JOB", 0, {0}},
    [GM_NO_JOB] = RESPONSE("NO_JOB"),
    [GM_JOB_ASSIGN] = RESPONSE("JOB_ASSIGN"),
    [GM_WORK_STATUS] = {"WORK_STATUS", 3, {HD}},
    [GM_WORK_COMPLETE] = {"WORK_COMPLETE", 2, {HD}},
    [GM_WORK_FAIL] = {"WORK_FAIL", 1, {HD}},
    [GM_GET_STATUS] = {"GET_STATUS", 1, {HD}},
    [GM_ECHO_REQ] = {"ECHO_REQ", 1, {0}},
    [GM_ECHO_RES] = RESPONSE("ECHO_RES"),
    [GM_SUBMIT_JOB_BG] = {"SUBMIT_JOB_BG", 3, {FN, UQ}},
    [GM_ERROR] = RESPONSE("ERROR"),
    [GM_STATUS_RES] = RESPONSE("STATUS_RES"),
    [GM_SUBMIT_JOB_HIGH] = {"SUBMIT_JOB_HIGH", 3, {FN, UQ}},
    [GM_SET_CLIENT_ID] = {"SET_CLIENT_ID", 1, {F_CLIENT_ID}},
    [GM_CAN_DO_TIMEOUT] = {"CAN_DO_TIMEOUT", 2, {FN}},
    [GM_ALL_YOURS] = {"ALL_YOURS", 0, {0}},
    [GM_WORK_EXCEPTION] = {"WORK_EXCEPTION", 2, {HD}},
    [GM_OPTION_REQ] = {"OPTION_REQ", 1, {F_OPTION}},
    [GM_OPTION_RES] = RESPONSE("OPTION_RES"),
    [GM_WORK_DATA] = {"WORK_DATA", 2, {HD}},
    [GM_WORK_WARNING] = {"WORK_WARNING", 2, {HD}},
    [GM_GRAB_JOB_UNIQ] = {"GRAB_JOB_UNIQ", 0, {0}},
    [GM_JOB_ASSIGN_UNIQ] = RESPONSE("JOB_ASSIGN_UNIQ"),
    [GM_SUBMIT_JOB_HIGH_BG] = {"SUBMIT_JOB_HIGH_BG", 3, {FN, UQ}},
    [GM_SUBMIT_JOB_LOW] = {"SUBMIT_JOB_LOW", 3, {FN, UQ}},
    [GM_SUBMIT_JOB_LOW_BG] = {"SUBMIT_JOB_LOW_BG", 3, {FN, UQ}},
    /* function, unique, minute, hour, day of month, month, day of week, data */
    [GM_SUBMIT_JOB_SCHED] = {"SUBMIT_JOB_SCHED", 8, {FN, UQ}},
    /* function, unique, epoch, data */
    [GM_SUBMIT_JOB_EPOCH] = {"SUBMIT_JOB_EPOCH", 4, {FN, UQ}},
    /* gearmand: function, unique, reducer, aggregator, data (four NULs) */
    [GM_SUBMIT_REDUCE_JOB] = {"SUBMIT_REDUCE_JOB", 5, {FN, UQ, FN, FN}},
    [GM_SUBMIT_REDUCE_JOB_BACKGROUND] = {"SUBMIT_REDUCE_JOB_BACKGROUND", 5, {FN, UQ, FN, FN}},
    [GM_GRAB_JOB_ALL] = {"GRAB_JOB_ALL", 0, {0}},
    [GM_JOB_ASSIGN_ALL] = RESPONSE("JOB_ASSIGN_ALL"),
    [GM_GET_STATUS_UNIQUE] = {"GET_STATUS_UNIQUE", 1, {UQ}},
    [GM_STATUS_RES_UNIQUE] = RESPONSE("STATUS_RES_UNIQUE"),
};

#undef RESPONSE
#undef FN
#undef UQ
#undef HD

const char *gm_type_name(uint32_t t)
{
    return t <= GM_TYPE_LAST ? types[t].name : NULL;
}

int gm_request_command(uint32_t t)
{
    switch (t) {
    case GM_SUBMIT_JOB: case GM_SUBMIT_JOB_BG: case GM_SUBMIT_JOB_HIGH: case GM_SUBMIT_JOB_HIGH_BG:
    case GM_SUBMIT_JOB_LOW: case GM_SUBMIT_JOB_LOW_BG: case GM_SUBMIT_JOB_EPOCH:
        return BG_CMD_PUT;
    case GM_GRAB_JOB: case GM_GRAB_JOB_UNIQ: case GM_GRAB_JOB_ALL: return BG_CMD_RESERVE_WITH_TIMEOUT;
    case GM_WORK_COMPLETE: case GM_WORK_FAIL: case GM_WORK_EXCEPTION: return BG_CMD_DELETE;
    case GM_CAN_DO: case GM_CAN_DO_TIMEOUT: return BG_CMD_WATCH;
    case GM_CANT_DO: return BG_CMD_IGNORE;
    case GM_GET_STATUS: case GM_GET_STATUS_UNIQUE: return BG_CMD_STATS_JOB;
    default: return -1;
    }
}

int gm_admin_command(int cmd) { return cmd == GM_ADMIN_CANCEL_JOB ? BG_CMD_DELETE : -1; }

int gm_request_nargs(uint32_t t)
{
    if (t > GM_TYPE_LAST || !types[t].name || types[t].nargs < 0) return BG_BAD_FORMAT;
    return types[t].nargs;
}

/* ---- packets ------------------------------------------------------------ */

static uint32_t get_be32(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
}

static void put_be32(char *p, uint32_t v)
{
    p[0] = (char)(v >> 24);
    p[1] = (char)(v >> 16);
    p[2] = (char)(v >> 8);
    p[3] = (char)v;
}

/* The largest packet whose length still fits the int we return. */
#define PACKET_SIZE_LIMIT ((uint32_t)(INT32_MAX - GM_HEADER_SIZE))

/* Split body[0..size) into n arguments: n-1 NUL-terminated ones and the
 * rest (which may hold NULs). GM_FAULT_ARGS on a missing NUL. */
static int split_args(const char *body, uint32_t size, uint32_t n, struct gm_packet *p)
{
    const char *at = body, *end = body + size;
    for (uint32_t i = 0; i + 1 < n; i++) {
        const char *nul = memchr(at, '\0', (size_t)(end - at));
        if (!nul) return GM_FAULT_ARGS;
        p->arg[i] = at;
        p->arg_len[i] = (uint32_t)(nul - at);
        at = nul + 1;
    }
    if (n) {
        p->arg[n - 1] = at;
        p->arg_len[n - 1] = (uint32_t)(end - at);
    }
    return 0;
}

/* GM_FAULT_FIELD if an argument of type t is over its field's limit. */
static int check_fields(uint32_t t, const struct gm_packet *p)
{
    for (uint32_t i = 0; i < p->nargs; i++)
        if (p->arg_len[i] > field_max[types[t].field[i]]) return GM_FAULT_FIELD;
    return 0;
}

int gm_parse_request(const char *data, size_t len, uint32_t max_size, struct gm_packet *p)
{
    if (len < GM_HEADER_SIZE) return 0;
    memset(p, 0, sizeof *p);
    p->type = get_be32(data + 4);
    p->size = get_be32(data + 8);
    int nargs = gm_request_nargs(p->type);
    int fault = memcmp(data, "\0REQ", 4) != 0 ? GM_FAULT_MAGIC
              : nargs < 0 ? GM_FAULT_TYPE
              : p->size > max_size || p->size > PACKET_SIZE_LIMIT ? GM_FAULT_TOO_BIG : GM_FAULT_NONE;
    if (fault == GM_FAULT_NONE) {
        if (len - GM_HEADER_SIZE < p->size) return 0;
        /* gearmand: a type without arguments ignores any body it is sent */
        p->nargs = (uint32_t)nargs;
        fault = split_args(data + GM_HEADER_SIZE, p->size, p->nargs, p);
        if (fault == GM_FAULT_NONE) fault = check_fields(p->type, p);
    }
    if (fault == GM_FAULT_NONE) return (int)(GM_HEADER_SIZE + p->size);
    p->fault = (uint8_t)fault;
    return BG_BAD_FORMAT;
}

/* Append one packet with the given magic; 0 or BG_OUT_OF_MEMORY (also for a
 * packet whose size does not fit the header). */
static int encode(struct bg_buf *out, const char *magic, uint32_t t, uint32_t n,
                  const char *const *arg, const uint32_t *len)
{
    uint64_t size = n ? n - 1 : 0;
    for (uint32_t i = 0; i < n; i++) size += len[i];
    if (size > UINT32_MAX) return BG_OUT_OF_MEMORY;
    char *p = bg_buf_reserve(out, GM_HEADER_SIZE + (size_t)size);
    if (!p) return BG_OUT_OF_MEMORY;
    memcpy(p, magic, 4);
    put_be32(p + 4, t);
    put_be32(p + 8, (uint32_t)size);
    char *at = p + GM_HEADER_SIZE;
    for (uint32_t i = 0; i < n; i++) {
        if (len[i]) memcpy(at, arg[i], len[i]);
        at += len[i];
        if (i + 1 < n) *at++ = '\0';
    }
    out->len += GM_HEADER_SIZE + (size_t)size;
    return 0;
}

int gm_encode_response(struct bg_buf *out, uint32_t t, uint32_t n,
                       const char *const *arg, const uint32_t *len)
{
    return encode(out, "\0RES", t, n, arg, len);
}

int gm_encode_request(struct bg_buf *out, uint32_t t, uint32_t n,
                      const char *const *arg, const uint32_t *len)
{
    return encode(out, "\0REQ", t, n, arg, len);
}

/* Codes are gearmand's where it answers the same fault with an ERROR. */
static const struct {
    int fault;
    const char *code, *text;
} error_texts[] = {
    {GM_FAULT_MAGIC, "INVALID_MAGIC", "Request magic expected"},        /* gearmand's words */
    {GM_FAULT_TYPE, "INVALID_COMMAND", "Command not expected"},         /* gearmand's words */
    {GM_FAULT_ARGS, "INVALID_PACKET", "Packet has too few arguments"},  /* gearmand: no reply */
    {GM_FAULT_TOO_BIG, "ARGUMENT_TOO_LARGE", "Packet too large"},       /* gearmand: no limit */
    {GM_FAULT_FIELD, "ARGUMENT_TOO_LARGE", "Argument too large"},       /* gearmand: code only */
};

void gm_error_text(int fault, const char **code, const char **text)
{
    for (size_t i = 0; i < sizeof error_texts / sizeof error_texts[0]; i++) {
        if (error_texts[i].fault == fault) {
            *code = error_texts[i].code;
            *text = error_texts[i].text;
            return;
        }
    }
    *code = "UNKNOWN_ERROR";
    *text = "Unknown error";
}

/* ---- text admin lines ---------------------------------------------------- */

#define ADMIN_WORDS_MAX (1 + GM_ADMIN_ARGS_MAX)

struct word {
    const char *p;
    uint32_t len;
};

/* gearmand: words end at a space; the spaces after one are skipped, but a
 * leading space makes an empty first word and trailing spaces an empty last
 * word ("show jobs " has three words). Only ' ' separates (a tab is part of
 * a word). Returns the word count, or -1 past ADMIN_WORDS_MAX. */
static int split_words(const char *p, size_t len, struct word w[ADMIN_WORDS_MAX])
{
    const char *end = p + len;
    int n = 0;
    for (;;) {
        const char *sp = memchr(p, ' ', (size_t)(end - p));
        const char *stop = sp ? sp : end;
        if (n == ADMIN_WORDS_MAX) return -1;
        w[n].p = p;
        w[n].len = (uint32_t)(stop - p);
        n++;
        if (!sp) return n;
        p = sp + 1;
        while (p < end && *p == ' ') p++;
    }
}

/* Nonzero if word w is `lit` in any case (gearmand compares with strcasecmp). */
static int word_is(const struct word *w, const char *lit)
{
    size_t n = strlen(lit);
    if (w->len != n) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = w->p[i];
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if (c != lit[i]) return 0;
    }
    return 1;
}

/* The admin commands: up to three words that name one, in table order. */
static const struct {
    const char *words[3];
    int cmd;
} admin_commands[] = {
    {{"status"}, GM_ADMIN_STATUS},
    {{"workers"}, GM_ADMIN_WORKERS},
    {{"version"}, GM_ADMIN_VERSION},
    {{"maxqueue"}, GM_ADMIN_MAXQUEUE},
    {{"shutdown"}, GM_ADMIN_SHUTDOWN},
    {{"getpid"}, GM_ADMIN_GETPID},
    {{"show", "jobs"}, GM_ADMIN_SHOW_JOBS},
    {{"show", "unique", "jobs"}, GM_ADMIN_SHOW_UNIQUE_JOBS},
    {{"verbose"}, GM_ADMIN_VERBOSE},
    {{"cancel", "job"}, GM_ADMIN_CANCEL_JOB},
};

/* How many leading words of w[0..n) name command i; 0 if they do not. */
static int match_command(size_t i, const struct word *w, int n)
{
    int k = 0;
    for (; k < 3 && admin_commands[i].words[k]; k++)
        if (k >= n || !word_is(&w[k], admin_commands[i].words[k])) return 0;
    return k;
}

int gm_admin_parse(const char *data, size_t len, struct gm_admin_line *line)
{
    size_t scan = len < GM_ADMIN_LINE_MAX ? len : GM_ADMIN_LINE_MAX;
    const char *nl = memchr(data, '\n', scan);
    if (!nl && len < GM_ADMIN_LINE_MAX) return 0;
    if (!nl) {
        line->fault = GM_FAULT_TOO_BIG;
        return BG_BAD_FORMAT;
    }
    size_t line_len = (size_t)(nl - data);
    if (line_len && data[line_len - 1] == '\r') line_len--; /* one "\r" only */

    struct word w[ADMIN_WORDS_MAX];
    int n = split_words(data, line_len, w);
    if (n < 0) {
        line->fault = GM_FAULT_ARGS;
        return BG_BAD_FORMAT;
    }
    memset(line, 0, sizeof *line);
    line->cmd = GM_ADMIN_UNKNOWN;
    line->word = w[0].p;
    line->word_len = w[0].len;
    int skip = 1; /* an unknown command's arguments follow its first word */
    for (size_t i = 0; i < sizeof admin_commands / sizeof admin_commands[0]; i++) {
        int k = match_command(i, w, n);
        if (k) {
            line->cmd = admin_commands[i].cmd;
            skip = k;
            break;
        }
    }
    for (int i = skip; i < n; i++) {
        line->arg[line->nargs] = w[i].p;
        line->arg_len[line->nargs++] = w[i].len;
    }
    return (int)(nl - data) + 1;
}

/* ---- function names and tubes ------------------------------------------- */

static const char hex_digits[] = "0123456789ABCDEF";

/* Value of hex digit c (either case), or -1. */
static int hex_value(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

int gm_function_to_tube(const char *fn, size_t len, char out[BG_TUBE_NAME_MAX + 1])
{
    if (len == 0) return BG_BAD_FORMAT;
    if (bg_tube_name_valid(fn, len) && !memchr(fn, '$', len)) {
        memcpy(out, fn, len);
        out[len] = '\0';
        return (int)len;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        char c = fn[i];
        int escape = c == '$' || !bg_tube_name_char(c) || (i == 0 && c == '-');
        if (n + (escape ? 3 : 1) > BG_TUBE_NAME_MAX) return BG_BAD_FORMAT;
        if (escape) {
            unsigned char u = (unsigned char)c;
            out[n++] = '$';
            out[n++] = hex_digits[u >> 4];
            out[n++] = hex_digits[u & 15];
        } else {
            out[n++] = c;
        }
    }
    out[n] = '\0';
    return (int)n;
}

int gm_tube_to_function(const char *tube, char *out, size_t out_cap)
{
    size_t n = 0;
    for (const char *p = tube; *p; p++) {
        char c = *p;
        int hi, lo;
        if (c == '$' && (hi = hex_value(p[1])) >= 0 && (lo = hex_value(p[2])) >= 0) {
            c = (char)(hi << 4 | lo);
            p += 2;
        }
        if (n + 1 >= out_cap) return BG_BAD_FORMAT;
        out[n++] = c;
    }
    if (n >= out_cap) return BG_BAD_FORMAT;
    out[n] = '\0';
    return (int)n;
}
