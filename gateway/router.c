/* router.c - the HTTP route table and URL matching. One row per path and
 * method: its handler, how much body it reads, who may call it, the
 * beanstalk command it counts as, and what a scoped token needs for it
 * (issue 23): the kind of action (produce, consume, manage, read) and where
 * its tube comes from (the path, ?tubes=, the job's tube). Rows without a
 * kind are open, or views of the whole server that show a scoped token only
 * the tubes it sees. HEAD is served by the GET row; the Allow
 * header of a 405 lists the rows that share the path. A request is matched
 * once (http.c keeps the match in the request). */
#include <stdio.h>
#include <string.h>

#include "gateway.h"

/* Path patterns: "*" matches one segment. A path may end with a '/' or
 * not, except that a pattern ending with '/' ("/ui/", the dashboard's page,
 * a folder address for its relative links) matches only a path that ends
 * with one: it stands before its twin without. Rows of one path stand
 * together, in the order the Allow header lists their methods.
 * (tests/http/test_http.py reads this table to compare it with
 * openapi/openapi.yaml.) */
static const struct gw_route routes[] = {
    {"/stats", GW_GET, gw_handle_stats, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_STATS,
     GW_KIND_NONE, GW_TUBE_NONE},
    {"/stats/tubes", GW_GET, gw_handle_stats_tubes, GW_BODY_NONE, GW_AUTH_TOKEN, -1,
     GW_KIND_NONE, GW_TUBE_NONE},
    {"/stats/history", GW_GET, gw_handle_stats_history, GW_BODY_NONE, GW_AUTH_TOKEN, -1,
     GW_KIND_NONE, GW_TUBE_NONE},
    {"/tubes", GW_GET, gw_handle_tubes, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_LIST_TUBES,
     GW_KIND_NONE, GW_TUBE_NONE},
    {"/tubes/*", GW_GET, gw_handle_tube, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_STATS_TUBE,
     BG_SCOPE_READ, GW_TUBE_PATH},
    {"/tubes/*/jobs", GW_GET, gw_handle_tube_jobs, GW_BODY_NONE, GW_AUTH_TOKEN, -1,
     BG_SCOPE_READ, GW_TUBE_PATH},
    {"/tubes/*/jobs", GW_POST, gw_handle_put, GW_BODY_JOB, GW_AUTH_TOKEN, BG_CMD_PUT,
     BG_SCOPE_PRODUCE, GW_TUBE_PATH},
    /* a bulk delete counts no command itself: bulk.c counts one cmd-delete per job deleted */
    {"/tubes/*/jobs", GW_DELETE, gw_handle_tube_jobs_delete, GW_BODY_NONE, GW_AUTH_TOKEN, -1,
     BG_SCOPE_MANAGE, GW_TUBE_PATH},
    {"/tubes/*/jobs/batch", GW_POST, gw_handle_batch_put, GW_BODY_BATCH, GW_AUTH_TOKEN, BG_CMD_PUT,
     BG_SCOPE_PRODUCE, GW_TUBE_PATH},
    {"/tubes/*/reservations", GW_POST, gw_handle_tube_reserve, GW_BODY_NONE, GW_AUTH_TOKEN,
     BG_CMD_RESERVE_WITH_TIMEOUT, BG_SCOPE_CONSUME, GW_TUBE_PATH},
    {"/tubes/*/kick", GW_POST, gw_handle_tube_kick, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_KICK,
     BG_SCOPE_MANAGE, GW_TUBE_PATH},
    {"/tubes/*/pause", GW_POST, gw_handle_tube_pause, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_PAUSE_TUBE,
     BG_SCOPE_MANAGE, GW_TUBE_PATH},
    {"/tubes/*/ready", GW_GET, gw_handle_peek_ready, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_PEEK_READY,
     BG_SCOPE_READ, GW_TUBE_PATH},
    {"/tubes/*/delayed", GW_GET, gw_handle_peek_delayed, GW_BODY_NONE, GW_AUTH_TOKEN,
     BG_CMD_PEEK_DELAYED, BG_SCOPE_READ, GW_TUBE_PATH},
    {"/tubes/*/buried", GW_GET, gw_handle_peek_buried, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_PEEK_BURIED,
     BG_SCOPE_READ, GW_TUBE_PATH},
    {"/reservations", GW_POST, gw_handle_reserve, GW_BODY_NONE, GW_AUTH_TOKEN,
     BG_CMD_RESERVE_WITH_TIMEOUT, BG_SCOPE_CONSUME, GW_TUBE_QUERY},
    {"/jobs/*", GW_GET, gw_handle_job, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_STATS_JOB,
     BG_SCOPE_READ, GW_TUBE_JOB},
    {"/jobs/*", GW_DELETE, gw_handle_job_delete, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_DELETE,
     GW_KIND_DELETE, GW_TUBE_JOB},
    {"/jobs/*/body", GW_GET, gw_handle_job_body, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_PEEK,
     BG_SCOPE_READ, GW_TUBE_JOB},
    {"/jobs/*/release", GW_POST, gw_handle_job_release, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_RELEASE,
     BG_SCOPE_CONSUME, GW_TUBE_JOB},
    {"/jobs/*/bury", GW_POST, gw_handle_job_bury, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_BURY,
     BG_SCOPE_CONSUME, GW_TUBE_JOB},
    {"/jobs/*/touch", GW_POST, gw_handle_job_touch, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_TOUCH,
     BG_SCOPE_CONSUME, GW_TUBE_JOB},
    {"/jobs/*/kick", GW_POST, gw_handle_job_kick, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_KICK_JOB,
     BG_SCOPE_MANAGE, GW_TUBE_JOB},
    {"/jobs/*/reservations", GW_POST, gw_handle_job_reserve, GW_BODY_NONE, GW_AUTH_TOKEN,
     BG_CMD_RESERVE_JOB, BG_SCOPE_CONSUME, GW_TUBE_JOB},
    {"/openapi.yaml", GW_GET, gw_handle_openapi, GW_BODY_NONE, GW_AUTH_TOKEN, -1,
     GW_KIND_NONE, GW_TUBE_NONE},
    {"/auth", GW_GET, gw_handle_auth, GW_BODY_NONE, GW_AUTH_TOKEN, -1,
     GW_KIND_NONE, GW_TUBE_NONE},
    {"/livez", GW_GET, gw_handle_livez, GW_BODY_NONE, GW_AUTH_OPEN, -1,
     GW_KIND_NONE, GW_TUBE_NONE},
    {"/readyz", GW_GET, gw_handle_readyz, GW_BODY_NONE, GW_AUTH_OPEN, -1,
     GW_KIND_NONE, GW_TUBE_NONE},
    {"/metrics", GW_GET, gw_handle_metrics, GW_BODY_NONE, GW_AUTH_METRICS, -1,
     GW_KIND_NONE, GW_TUBE_NONE},
    {"/clients", GW_GET, gw_handle_clients, GW_BODY_NONE, GW_AUTH_TOKEN, -1,
     BG_SCOPE_READ, GW_TUBE_ALL},
    {"/clients/*", GW_DELETE, gw_handle_client_delete, GW_BODY_NONE, GW_AUTH_TOKEN, -1,
     BG_SCOPE_MANAGE, GW_TUBE_ALL},
    {"/subscriptions", GW_GET, gw_handle_subscriptions, GW_BODY_NONE, GW_AUTH_TOKEN, -1,
     GW_KIND_NONE, GW_TUBE_NONE},
    {"/ui/", GW_GET, gw_handle_ui_file, GW_BODY_NONE, GW_AUTH_PUBLIC, -1,
     GW_KIND_NONE, GW_TUBE_NONE},
    {"/ui", GW_GET, gw_handle_ui_redirect, GW_BODY_NONE, GW_AUTH_PUBLIC, -1,
     GW_KIND_NONE, GW_TUBE_NONE},
    {"/ui/*", GW_GET, gw_handle_ui_file, GW_BODY_NONE, GW_AUTH_PUBLIC, -1,
     GW_KIND_NONE, GW_TUBE_NONE},
};
#define ROUTES ((int)(sizeof routes / sizeof routes[0]))

static const char *const method_names[] = {"GET", "HEAD", "POST", "DELETE", "OPTIONS"};

static unsigned long match_count;

/* Split url into at most GW_MAX_SEGMENTS segments in buf, each with its %2F
 * and %2E decoded (gw_decode_segment); returns the count, or -1 if there are
 * more, one is empty, or url does not start with '/'. *slash_end: url ends
 * with a '/' after a segment. */
static int split_path(const char *url, char *buf, size_t size, char *seg[GW_MAX_SEGMENTS],
                      int *slash_end)
{
    size_t len = strlen(url);
    *slash_end = len > 1 && url[len - 1] == '/';
    if (len >= size || url[0] != '/') return -1;
    strcpy(buf, url);
    int n = 0;
    char *p = buf + 1;
    if (!*p) return 0;
    for (;;) {
        if (n == GW_MAX_SEGMENTS) return -1;
        seg[n++] = p;
        char *slash = strchr(p, '/');
        if (!slash) break;
        *slash = '\0';
        p = slash + 1;
        if (!*p) break; /* a trailing slash is allowed */
    }
    for (int i = 0; i < n; i++) {
        if (!*seg[i]) return -1;
        gw_decode_segment(seg[i]);
    }
    return n;
}

/* The table's patterns split once (split_path), at the first match: their
 * segments ("*" matches any), and for each path's first row the Allow list
 * of its rows, so that a request's match splits and formats nothing but
 * its own path. */
static struct compiled_route {
    char buf[64];
    char *seg[GW_MAX_SEGMENTS];
    int nseg;
    int slash_end;
    int first;      /* the index of its path's first row */
    char allow[48]; /* a path's first row: its methods, as Allow lists them */
} compiled[ROUTES];
static int routes_compiled;

/* Append a method to an Allow list. */
static void allow_add(char *allow, size_t size, enum gw_method m)
{
    size_t o = strlen(allow);
    snprintf(allow + o, size - o, "%s%s", o ? ", " : "", method_names[m]);
}

/* Fill compiled[] from the table (once). */
static void compile_routes(void)
{
    for (int i = 0; i < ROUTES; i++) {
        struct compiled_route *c = &compiled[i];
        c->nseg = split_path(routes[i].pattern, c->buf, sizeof c->buf, c->seg, &c->slash_end);
        c->first = i > 0 && strcmp(routes[i - 1].pattern, routes[i].pattern) == 0 ? compiled[i - 1].first : i;
        if (c->first != i) continue;
        for (int k = i; k < ROUTES && strcmp(routes[k].pattern, routes[i].pattern) == 0; k++) {
            allow_add(c->allow, sizeof c->allow, routes[k].method);
            if (routes[k].method == GW_GET) allow_add(c->allow, sizeof c->allow, GW_HEAD);
        }
    }
    routes_compiled = 1;
}

/* Nonzero if the segments of a path (slash_end: it ends with '/') match
 * the compiled pattern c. */
static int pattern_matches(const struct compiled_route *c, char *seg[], int n, int slash_end)
{
    if (c->nseg != n || (c->slash_end && !slash_end)) return 0;
    for (int i = 0; i < n; i++)
        if (!(c->seg[i][0] == '*' && !c->seg[i][1]) && strcmp(c->seg[i], seg[i]) != 0) return 0;
    return 1;
}

enum gw_method gw_method_of(const char *method)
{
    for (int m = GW_GET; m < GW_OTHER; m++)
        if (strcmp(method, method_names[m]) == 0) return (enum gw_method)m;
    return GW_OTHER;
}

int gw_match_route(const char *method, const char *url, struct gw_match *m)
{
    if (!routes_compiled) compile_routes();
    match_count++;
    m->route = NULL;
    m->path = -1;
    m->allow = "";
    m->nseg = 0;
    m->method = gw_method_of(method);
    m->status = 404;
    int slash_end;
    int n = split_path(url, m->buf, sizeof m->buf, m->seg, &slash_end);
    if (n < 0) return m->status;
    m->nseg = n;
    /* HEAD is served by the GET row */
    enum gw_method wanted = m->method == GW_HEAD ? GW_GET : m->method;
    for (int i = 0; i < ROUTES; i++) {
        if (!pattern_matches(&compiled[i], m->seg, n, slash_end)) continue;
        /* the rows of this path: the first, the one of the method, Allow */
        m->path = i;
        m->route = &routes[i];
        m->allow = compiled[i].allow;
        m->status = 405;
        for (int k = i; k < ROUTES && compiled[k].first == i; k++)
            if (routes[k].method == wanted) {
                m->route = &routes[k];
                m->status = 0;
                break;
            }
        return m->status;
    }
    return m->status;
}

unsigned long gw_match_count(void) { return match_count; }

uint64_t gw_batch_body_limit(uint64_t max_job_size)
{
    return GW_BATCH_MAX * ((max_job_size + 2) / 3 * 4 + GW_BATCH_ENTRY_SLACK);
}

int gw_route_count(void) { return ROUTES; }

const struct gw_route *gw_route_at(int i) { return i >= 0 && i < ROUTES ? &routes[i] : NULL; }

/* The pattern with each "*" named as in openapi.yaml: {tube} after
 * "tubes", {id} after "jobs", {asset} after "ui"; a trailing '/' kept. */
static void name_pattern(const char *pattern, char *out, size_t size)
{
    char buf[64];
    char *seg[GW_MAX_SEGMENTS];
    int slash_end;
    int n = split_path(pattern, buf, sizeof buf, seg, &slash_end);
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < n && o < size; i++) {
        const char *name = seg[i];
        if (strcmp(name, "*") == 0)
            name = i > 0 && strcmp(seg[i - 1], "tubes") == 0 ? "{tube}"
                 : i > 0 && strcmp(seg[i - 1], "jobs") == 0 ? "{id}"
                 : i > 0 && strcmp(seg[i - 1], "ui") == 0 ? "{asset}" : "{x}";
        o += (size_t)snprintf(out + o, size - o, "/%s", name);
    }
    if (n > 0 && slash_end && o < size) snprintf(out + o, size - o, "/");
    if (n <= 0) snprintf(out, size, "%s", pattern);
}

const char *gw_route_pattern(int i)
{
    static char names[ROUTES][64];
    if (i < 0 || i >= ROUTES) return NULL;
    if (!names[i][0]) name_pattern(routes[i].pattern, names[i], sizeof names[i]);
    return names[i];
}
