/* fuzz_gearman.c - libFuzzer harness for the Gearman codec and the
 * Gearman session on the engine.
 *
 * The codec: the input is read as a server reads a connection: admin lines
 * and request packets back to back, dispatched on the first byte, until one
 * is incomplete or malformed. Every parsed packet is checked against its
 * type, cut short (must ask for more bytes) and re-encoded (must give the
 * same packet back). The input is also tried as a function name (round
 * trip through a tube name) and as a tube name.
 *
 * The sessions: the input is also a script for three sessions of one
 * engine (core/gearman_session.c): each step feeds one session a request
 * made from the next bytes (any type, arguments cut from the input, a few
 * function names and handles so that workers and clients meet), raw bytes,
 * or an admin line; or moves time (with or without a tick), sweeps, drops a
 * session's output as a socket would take it, or closes and reopens a
 * session. The last session runs under a scope the input's last byte
 * picks (fuzz_scopes.h; 0: unscoped), as a client certificate's identity
 * line gives it. After every step the engine's invariant audit must pass
 * and waiting must equal the sleeping workers. ASan/UBSan catch memory errors;
 * the asserts catch broken contracts. */
/* the checks are the point: keep assert() in release builds (NDEBUG) */
#undef NDEBUG
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gearman.h"
#include "fuzz_scopes.h"

#define FUZZ_MAX_SIZE 256 /* small, so that GM_FAULT_TOO_BIG is reached often */

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
                assert(r == 0 || (r == BG_BAD_FORMAT && (line.fault == GM_FAULT_TOO_BIG ||
                                                         line.fault == GM_FAULT_ARGS)));
                if (r < 0 && line.fault == GM_FAULT_TOO_BIG) assert(len - at >= GM_ADMIN_LINE_MAX);
                return;
            }
            check_admin(d + at, r, &line);
            at += (size_t)r;
        } else {
            struct gm_packet p;
            int r = gm_parse_request(d + at, len - at, FUZZ_MAX_SIZE, &p);
            if (r <= 0) {
                if (r < 0) {
                    assert(r == BG_BAD_FORMAT);
                    const char *code = NULL, *text = NULL;
                    gm_error_text(p.fault, &code, &text);
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
        assert(r == BG_BAD_FORMAT);
    }
    /* the input as a tube name (up to its first NUL) */
    char *t = malloc(len + 1);
    assert(t);
    memcpy(t, d, len);
    t[len] = '\0';
    size_t tlen = strlen(t);
    char small[8];
    r = gm_tube_to_function(t, small, sizeof small);
    assert(r == BG_BAD_FORMAT || (r >= 0 && (size_t)r <= tlen && r < (int)sizeof small));
    char *big = malloc(tlen + 1);
    assert(big);
    r = gm_tube_to_function(t, big, tlen + 1);
    assert(r >= 0 && (size_t)r <= tlen && big[r] == '\0');
    free(big);
    free(t);
}

/* ---- sessions on the engine ----------------------------------------------- */

#define SESSIONS 3

struct script {
    const uint8_t *p;
    size_t left;
};

static uint8_t next_byte(struct script *sc)
{
    if (!sc->left) return 0;
    sc->left--;
    return *sc->p++;
}

/* Up to max bytes of the script as an argument (its length from a byte). */
static uint32_t next_bytes(struct script *sc, const char **out, uint32_t max)
{
    uint32_t n = next_byte(sc) % (max + 1);
    if (n > sc->left) n = (uint32_t)sc->left;
    *out = (const char *)sc->p;
    sc->p += n;
    sc->left -= n;
    return n;
}

static const char *const functions[] = {"f", "g", "f$", "a b"};
static const char *const admin_lines[] = {
    "status\n", "workers\n", "show jobs\n", "show unique jobs\n", "maxqueue f 1\n",
    "maxqueue g\n", "cancel job H:fuzz:1\n", "cancel job H:fuzz:2\n", "version\n",
    "getpid\n", "verbose\n", "shutdown graceful\n", "shutdown\n", "bogus\n",
};

static const char *fuzz_verbosity(void *ctx) { (void)ctx; return "INFO"; }
static uint64_t fuzz_wall_s(void *ctx) { return *(const uint64_t *)ctx; }
static void fuzz_stop(void *ctx, enum gm_stop how) { (void)ctx, (void)how; }

/* A request of a type chosen by the script, with arguments from it. */
static void feed_request(struct script *sc, struct gm_session *s, bg_time now)
{
    uint32_t type = 1 + next_byte(sc) % GM_TYPE_LAST;
    int n = gm_request_nargs(type);
    if (n < 0) type = GM_GRAB_JOB, n = 0;
    const char *arg[GM_ARGS_MAX];
    uint32_t len[GM_ARGS_MAX];
    char handle[32];
    for (int i = 0; i < n; i++) {
        uint8_t how = next_byte(sc);
        if (how % 4 == 0) { /* a function name */
            arg[i] = functions[how / 4 % 4];
            len[i] = (uint32_t)strlen(arg[i]);
        } else if (how % 4 == 1) { /* a handle of one of the first jobs */
            len[i] = (uint32_t)snprintf(handle, sizeof handle, "H:fuzz:%u", 1 + how / 4 % 8);
            arg[i] = handle;
        } else { /* bytes of the script (no NUL but in the last) */
            len[i] = next_bytes(sc, &arg[i], 24);
            if (i + 1 < n && memchr(arg[i], '\0', len[i])) len[i] = 0;
        }
    }
    struct bg_buf b = {0};
    assert(gm_encode_request(&b, type, (uint32_t)n, arg, len) == 0);
    size_t used = gm_session_feed(s, bg_buf_head(&b), b.len, now);
    assert(used == b.len || s->stream.closing || used == 0);
    bg_buf_free(&b);
}

/* Run the input as a script of three sessions on one engine. */
static void run_sessions(const uint8_t *data, size_t size)
{
    struct bg_engine e;
    struct gm_server g;
    struct gm_session s[SESSIONS];
    uint64_t wall_s = 1700000000;
    bg_time now = 1000 * BG_SECOND;
    static const uint64_t key[2] = {3, 4};
    assert(bg_engine_init(&e, 64, NULL) == 0);
    struct gm_hooks hooks = {&wall_s, 1, "fuzz", fuzz_verbosity, fuzz_wall_s, fuzz_stop, NULL};
    assert(gm_server_init(&g, &e, &hooks, 64 + 4096, 1, key) == 0);
    const struct bg_scope *scoped = fuzz_pick_scope(size ? data[size - 1] % 8 : 0);
    for (int i = 0; i < SESSIONS; i++) {
        assert(gm_session_init(&g, &s[i], i, "fuzz") == 0);
        s[i].stream.out_limit = 4096;
        s[i].stream.out_max = 1 << 16;
    }
    s[SESSIONS - 1].scope = scoped;
    struct script sc = {data, size};
    while (sc.left) {
        uint8_t op = next_byte(&sc);
        struct gm_session *t = &s[op % SESSIONS];
        int k = op % SESSIONS;
        switch (op / SESSIONS % 8) {
        case 0: case 1: case 2:
            if (!t->stream.closing) feed_request(&sc, t, now);
            break;
        case 3: { /* raw bytes: a packet or line cut anywhere */
            const char *raw;
            uint32_t n = next_bytes(&sc, &raw, 40);
            if (!t->stream.closing) assert(gm_session_feed(t, raw, n, now) <= n);
            break;
        }
        case 4: {
            const char *line = admin_lines[next_byte(&sc) % (sizeof admin_lines / sizeof admin_lines[0])];
            if (!t->stream.closing) gm_session_feed(t, line, strlen(line), now);
            break;
        }
        case 5: { /* time moves; the timer may run or not */
            uint8_t b = next_byte(&sc);
            now += (bg_time)(b % 16) * 500000000ull;
            wall_s += b % 16 / 2;
            if (b & 0x80) bg_engine_tick(&e, now);
            break;
        }
        case 6:
            gm_server_sweep(&g, 1 + next_byte(&sc) % 64);
            for (int i = 0; i < SESSIONS; i++) bg_buf_clear(&s[i].stream.out); /* the sockets took it */
            break;
        case 7: /* the connection closes and a new one takes its place */
            gm_session_close(t, now);
            assert(gm_session_init(&g, t, k, "fuzz") == 0);
            t->stream.out_limit = 4096;
            t->stream.out_max = 1 << 16;
            if (k == SESSIONS - 1) t->scope = scoped;
            break;
        }
        const char *broken;
        if (bg_engine_audit(&e, &broken) != 0) {
            fprintf(stderr, "engine audit: %s\n", broken);
            abort();
        }
        uint64_t sleeping = 0;
        for (int i = 0; i < SESSIONS; i++) sleeping += s[i].sleeping;
        assert(e.waiting == sleeping);
    }
    for (int i = 0; i < SESSIONS; i++) gm_session_close(&s[i], now);
    gm_server_destroy(&g, now);
    assert(e.reserved_count == 0 && e.waiting == 0);
    assert(e.ready_count + e.delayed_count + e.buried_count == e.job_count);
    bg_engine_destroy(&e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    read_stream((const char *)data, size);
    check_names((const char *)data, size);
    run_sessions(data, size);
    return 0;
}
