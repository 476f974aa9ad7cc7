/* fuzz_gearman.c - libFuzzer harness for the Gearman wire codec. The input
 * is read as a server reads a connection: admin lines and request packets
 * back to back, dispatched on the first byte, until one is incomplete or
 * malformed. Every parsed packet is checked against its type, cut short
 * (must ask for more bytes) and re-encoded (must give the same packet
 * back). The input is also tried as a function name (round trip through
 * a tube name) and as a tube name. ASan/UBSan catch memory errors; the
 * asserts catch broken contracts. */
/* the checks are the point: keep assert() in release builds (NDEBUG) */
#undef NDEBUG
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gearman.h"

#define FUZZ_MAX_SIZE 256 /* small, so that GM_ETOO_BIG is reached often */

static const uint32_t limit_of_type_arg0[GM_TYPE_LAST + 1] = {
    [GM_CAN_DO] = GM_FUNCTION_MAX, [GM_CANT_DO] = GM_FUNCTION_MAX,
    [GM_CAN_DO_TIMEOUT] = GM_FUNCTION_MAX, [GM_SUBMIT_JOB] = GM_FUNCTION_MAX,
    [GM_GET_STATUS] = GM_HANDLE_MAX, [GM_WORK_COMPLETE] = GM_HANDLE_MAX,
    [GM_SET_CLIENT_ID] = GM_CLIENT_ID_MAX, [GM_OPTION_REQ] = GM_OPTION_MAX,
    [GM_GET_STATUS_UNIQUE] = GM_UNIQUE_MAX,
};

/* One packet at d[0..len) that parsed to p using `used` bytes. */
static void check_packet(const char *d, size_t len, int used, const struct gm_packet *p)
{
    assert(used >= GM_HEADER_SIZE && (size_t)used <= len);
    assert((uint32_t)used == GM_HEADER_SIZE + p->size && p->size <= FUZZ_MAX_SIZE);
    assert(memcmp(d, "\0REQ", 4) == 0);
    assert(gm_request_nargs(p->type) == (int)p->nargs && gm_type_name(p->type));
    for (uint32_t i = 0; i < p->nargs; i++) {
        assert(p->arg[i] >= d + GM_HEADER_SIZE && p->arg[i] + p->arg_len[i] <= d + used);
        if (i + 1 < p->nargs) assert(!memchr(p->arg[i], '\0', p->arg_len[i]));
    }
    if (p->nargs && limit_of_type_arg0[p->type]) assert(p->arg_len[0] <= limit_of_type_arg0[p->type]);
    if (p->type == GM_SUBMIT_JOB) assert(p->arg_len[1] <= GM_UNIQUE_MAX);

    /* one byte short: more bytes needed */
    struct gm_packet q;
    char *shorter = malloc((size_t)used - 1);
    assert(shorter);
    memcpy(shorter, d, (size_t)used - 1);
    assert(gm_parse_request(shorter, (size_t)used - 1, FUZZ_MAX_SIZE, &q) == 0);
    free(shorter);

    /* re-encoded: the same bytes, unless a type without arguments had a body */
    struct bg_buf out = {0};
    assert(gm_encode_request(&out, p->type, p->nargs, p->arg, p->arg_len) == 0);
    if (p->nargs) {
        assert(out.len == (size_t)used && memcmp(bg_buf_head(&out), d, out.len) == 0);
    } else {
        assert(out.len == GM_HEADER_SIZE && memcmp(bg_buf_head(&out), d, 8) == 0);
    }
    assert(gm_parse_request(bg_buf_head(&out), out.len, FUZZ_MAX_SIZE, &q) == (int)out.len);
    assert(q.type == p->type && q.nargs == p->nargs);
    bg_buf_free(&out);
}

static void check_admin(const char *d, int used, const struct gm_admin_line *line)
{
    assert(used >= 1 && used <= GM_ADMIN_LINE_MAX && d[used - 1] == '\n');
    assert(line->cmd >= GM_ADMIN_STATUS && line->cmd <= GM_ADMIN_UNKNOWN);
    assert(line->nargs <= GM_ADMIN_ARGS_MAX);
    assert(line->word == d && line->word + line->word_len <= d + used);
    assert(!memchr(line->word, ' ', line->word_len) && !memchr(line->word, '\n', line->word_len));
    for (uint32_t i = 0; i < line->nargs; i++) {
        assert(line->arg[i] > d && line->arg[i] + line->arg_len[i] <= d + used);
        assert(!memchr(line->arg[i], ' ', line->arg_len[i]));
    }
}

/* Read d[0..len) as a connection would; stop at the first incomplete or
 * malformed unit, as a server would wait or close. */
static void read_stream(const char *d, size_t len)
{
    size_t at = 0;
    while (at < len) {
        if (d[at] != '\0') {
            struct gm_admin_line line;
            int r = gm_admin_parse(d + at, len - at, &line);
            if (r <= 0) {
                assert(r == 0 || r == GM_ETOO_BIG || r == GM_EARGS);
                if (r == GM_ETOO_BIG) assert(len - at >= GM_ADMIN_LINE_MAX);
                return;
            }
            check_admin(d + at, r, &line);
            at += (size_t)r;
        } else {
            struct gm_packet p;
            int r = gm_parse_request(d + at, len - at, FUZZ_MAX_SIZE, &p);
            if (r <= 0) {
                if (r < 0) {
                    const char *code = NULL, *text = NULL;
                    gm_error_text(r, &code, &text);
                    assert(code && text && strcmp(code, "UNKNOWN_ERROR") != 0);
                    assert(len - at >= GM_HEADER_SIZE);
                } else {
                    assert(len - at < GM_HEADER_SIZE || len - at < GM_HEADER_SIZE + (size_t)p.size);
                }
                return;
            }
            check_packet(d + at, len - at, r, &p);
            at += (size_t)r;
        }
    }
}

/* The input as a function name: a valid tube name that decodes back. */
static void check_names(const char *d, size_t len)
{
    char tube[BG_TUBE_NAME_MAX + 1], fn[BG_TUBE_NAME_MAX + 1];
    int r = gm_function_to_tube(d, len, tube);
    if (r >= 0) {
        assert(r > 0 && bg_tube_name_valid(tube, (size_t)r) && tube[r] == '\0');
        assert(gm_tube_to_function(tube, fn, sizeof fn) == (int)len);
        assert(memcmp(fn, d, len) == 0);
    } else {
        assert(r == GM_EFIELD);
    }
    /* the input as a tube name (up to its first NUL) */
    char *t = malloc(len + 1);
    assert(t);
    memcpy(t, d, len);
    t[len] = '\0';
    size_t tlen = strlen(t);
    char small[8];
    r = gm_tube_to_function(t, small, sizeof small);
    assert(r == GM_EFIELD || (r >= 0 && (size_t)r <= tlen && r < (int)sizeof small));
    char *big = malloc(tlen + 1);
    assert(big);
    r = gm_tube_to_function(t, big, tlen + 1);
    assert(r >= 0 && (size_t)r <= tlen && big[r] == '\0');
    free(big);
    free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    read_stream((const char *)data, size);
    check_names((const char *)data, size);
    return 0;
}
