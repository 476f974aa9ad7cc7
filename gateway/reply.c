/* reply.c - the responses of the gateway, below every handler: JSON,
 * application/problem+json (one table of status titles, one table of
 * outcome -> status, code, detail), no body, a raw job, and bytes; and the
 * CORS headers of every response, in one place (send_response). It calls
 * libmicrohttpd, jansson and cors.c, below it. Each function
 * returns 0 when the response was queued, GW_NO_REPLY when it could not be
 * (out of memory, or a response was queued already). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"

/* The title of each status the gateway sends in a problem. */
static const struct {
    unsigned status;
    const char *title;
} titles[] = {
    {400, "Bad Request"},           {401, "Unauthorized"},
    {403, "Forbidden"},
    {404, "Not Found"},             {405, "Method Not Allowed"},
    {408, "Request Timeout"},       {409, "Conflict"},
    {413, "Content Too Large"},     {421, "Misdirected Request"},
    {422, "Unprocessable Content"}, {431, "Request Header Fields Too Large"},
    {500, "Internal Server Error"}, {501, "Not Implemented"},
    {503, "Service Unavailable"},   {505, "HTTP Version Not Supported"},
};

const char *gw_status_title(unsigned status)
{
    for (size_t i = 0; i < sizeof titles / sizeof titles[0]; i++)
        if (titles[i].status == status) return titles[i].title;
    return "Internal Server Error";
}

/* The engine's outcomes and the gateway's conflicts as HTTP problems. A
 * handler with more to say about its request (which job, in which state)
 * passes its own detail. A 409's code says what happened; the hint of one
 * about a reservation held elsewhere never asks for a token: there is none. */
static const struct gw_problem outcome_problems[] = {
    {BG_NOT_FOUND, 404, "NOT_FOUND", "no such job in a state that allows this"},
    {GW_RESERVATION_REQUIRED, 409, "RESERVATION_REQUIRED",
     "the job is reserved over HTTP: give the token of that reservation "
     "(header X-Reservation: TOKEN, or ?reservation=TOKEN)"},
    {GW_RESERVATION_MISMATCH, 409, "RESERVATION_MISMATCH",
     "the reservation token is wrong, or its reservation has ended"},
    {GW_RESERVED_ELSEWHERE, 409, "RESERVED_ELSEWHERE",
     "the job is reserved by a beanstalk or Gearman client or by push delivery: only that "
     "reservation can act on it, and HTTP has no token for it"},
    {GW_NOT_RESERVED, 409, "NOT_RESERVED",
     "the job is not reserved: only a reserved job can be released, buried or touched"},
    {GW_NOT_BURIED_OR_DELAYED, 409, "NOT_BURIED_OR_DELAYED", "only a buried or delayed job can be kicked"},
    {GW_ALREADY_RESERVED, 409, "ALREADY_RESERVED", "the job is already reserved"},
    {BG_BAD_FORMAT, 400, "BAD_FORMAT", "the request is malformed"},
    {BG_JOB_TOO_BIG, 413, "JOB_TOO_BIG", "the body is larger than the maximum job size"},
    {BG_DRAINING, 503, "DRAINING", "the server is draining: no new jobs"},
    {BG_OUT_OF_MEMORY, 503, "OUT_OF_MEMORY", "the server is out of memory"},
    {BG_LOG_UNAVAILABLE, 503, "LOG_UNAVAILABLE", "the write-ahead log cannot write"},
    {BG_MEMORY_CEILING, 503, "OUT_OF_MEMORY",
     "the jobs held reach the job-memory ceiling (--max-job-memory): no new job until some are deleted"},
};

struct gw_problem gw_outcome_problem(int outcome)
{
    for (size_t i = 0; i < sizeof outcome_problems / sizeof outcome_problems[0]; i++)
        if (outcome_problems[i].outcome == outcome) return outcome_problems[i];
    return (struct gw_problem){outcome, 500, bg_outcome_word(outcome), "internal error"};
}

/* The gateway's origins (gw_reply_set_cors); NULL: CORS is off. */
static const struct gw_cors *cors_origins;

void gw_reply_set_cors(const struct gw_cors *cors) { cors_origins = cors; }

/* The responses' budget (gw_reply_set_budget); NULL: not counted. */
static struct gw_response_budget *budget;

void gw_reply_set_budget(struct gw_response_budget *b) { budget = b; }

/* A response's copy: its size, then its bytes. */
struct response_copy {
    size_t n;
    char bytes[];
};

/* libmicrohttpd is done with a response: free its copy, and give its
 * bytes back to the budget. */
static void free_copy(void *cls)
{
    struct response_copy *copy = cls;
    if (budget) budget->count.held -= copy->n;
    free(copy);
}

/* A response whose body is a copy of n bytes (counted in the budget);
 * NULL: out of memory, or *refused set: a read's response over the budget
 * (nothing made). */
static struct MHD_Response *copied_response(const void *bytes, size_t n, int *refused)
{
    *refused = 0;
    if (budget && budget->refusable && !bg_reply_fits(&budget->count, 0, n)) {
        *refused = 1;
        return NULL;
    }
    struct response_copy *copy = malloc(sizeof *copy + n);
    if (!copy) return NULL;
    copy->n = n;
    if (n) memcpy(copy->bytes, bytes, n);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer_with_free_callback_cls(n, copy->bytes, free_copy, copy);
    if (!resp) {
        free(copy);
        return NULL;
    }
    if (budget) budget->count.held += n;
    return resp;
}

/* The answer to a read whose response does not fit the budget. */
static int reply_over_budget(struct MHD_Connection *c)
{
    return gw_reply_problem(c, 503, "RESPONSE_BUFFER_FULL",
                            "the server holds as many unsent responses as it may "
                            "(--http-max-response-buffer): retry later");
}

/* Queue resp (NULL: out of memory) for c with the headers every response
 * carries, and let it go. Every response of the gateway leaves through
 * here. A browser must not run or render a response as another type than
 * it says (a job body loaded by a <script> of another site); no cache
 * keeps one whose handler did not say how long it may (queue state, job
 * bodies: the dashboard's files and /metrics say); and the CORS headers. */
static int send_response(struct MHD_Connection *c, unsigned status, struct MHD_Response *resp)
{
    if (!resp) return GW_NO_REPLY;
    if (!MHD_get_response_header(resp, "X-Content-Type-Options")) /* ui.c sets its own */
        MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    if (!MHD_get_response_header(resp, "Cache-Control"))
        MHD_add_response_header(resp, "Cache-Control", "no-store");
    if (cors_origins) {
        /* the answer depends on the Origin: a cache must not give one
         * origin's answer to another */
        MHD_add_response_header(resp, "Vary", "Origin");
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        if (gw_cors_allows(cors_origins, origin)) {
            MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
            MHD_add_response_header(resp, "Access-Control-Expose-Headers", GW_CORS_EXPOSE_HEADERS);
        }
    }
    int rc = MHD_queue_response(c, status, resp) == MHD_YES ? 0 : GW_NO_REPLY;
    MHD_destroy_response(resp);
    return rc;
}

/* Queue a response made of n bytes (copied unless copy is 0: then they live
 * as long as the process), with a Content-Type unless type is NULL, and
 * the count headers of h. A copy counts in the responses' budget, and a
 * read's may be refused for it (503 RESPONSE_BUFFER_FULL instead). */
static int queue(struct MHD_Connection *c, unsigned status, const void *bytes, size_t n, int copy,
                 const char *type, const struct gw_header *h, size_t count)
{
    int refused = 0;
    struct MHD_Response *resp = copy ? copied_response(bytes, n, &refused)
                                     : MHD_create_response_from_buffer(n, (void *)bytes, MHD_RESPMEM_PERSISTENT);
    if (refused) return reply_over_budget(c);
    if (resp && type) MHD_add_response_header(resp, "Content-Type", type);
    for (size_t i = 0; resp && i < count; i++) MHD_add_response_header(resp, h[i].name, h[i].value);
    return send_response(c, status, resp);
}

/* Append the header name: value to h[*count] unless name is NULL. */
static void add_header(struct gw_header *h, size_t *count, const char *name, const char *value)
{
    if (name) h[(*count)++] = (struct gw_header){name, value};
}

int gw_reply_json(struct MHD_Connection *c, unsigned status, json_t *v, const char *location)
{
    return gw_reply_json_header(c, status, v, location, NULL, NULL);
}

int gw_reply_json_header(struct MHD_Connection *c, unsigned status, json_t *v,
                         const char *location, const char *name, const char *value)
{
    /* 15 significant digits: a rounded real (0.17) prints as written, not
     * as its nearest double (0.17000000000000001) */
    char *text = v ? json_dumps(v, JSON_COMPACT | JSON_REAL_PRECISION(15)) : NULL;
    json_decref(v);
    if (!text) return GW_NO_REPLY;
    size_t n = strlen(text);
    text[n] = '\n'; /* json_dumps leaves room for the NUL we overwrite */
    int rc = gw_reply_json_text(c, status, text, n + 1, location, name, value);
    free(text);
    return rc;
}

int gw_reply_json_text(struct MHD_Connection *c, unsigned status, const char *text, size_t n,
                       const char *location, const char *name, const char *value)
{
    struct gw_header h[2];
    size_t count = 0;
    add_header(h, &count, location ? "Location" : NULL, location);
    add_header(h, &count, name, value);
    return queue(c, status, text, n, 1, "application/json", h, count);
}

int gw_reply_problem(struct MHD_Connection *c, unsigned status, const char *code,
                     const char *detail)
{
    return gw_reply_problem_header(c, status, code, detail, NULL, NULL);
}

/* The problem object of a status, code and detail (NULL: out of memory). */
static json_t *problem_object(unsigned status, const char *code, const char *detail)
{
    return json_pack("{s:s, s:s, s:i, s:s, s:s}", "type", "about:blank", "title",
                     gw_status_title(status), "status", (int)status, "detail", detail, "code", code);
}

/* The compact text of problem v (taken over; NULL: out of memory). */
static char *problem_dump(json_t *v)
{
    char *text = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    return text;
}

char *gw_problem_text(unsigned status, const char *code, const char *detail)
{
    return problem_dump(problem_object(status, code, detail));
}

/* Queue a problem's text (taken over; NULL: out of memory) with
 * Retry-After for a 503 and one more header (name may be NULL). */
static int queue_problem(struct MHD_Connection *c, unsigned status, char *text, const char *name,
                         const char *value)
{
    if (!text) return GW_NO_REPLY;
    struct gw_header h[2];
    size_t count = 0;
    add_header(h, &count, status == 503 ? "Retry-After" : NULL, "5");
    add_header(h, &count, name, value);
    int rc = queue(c, status, text, strlen(text), 1, "application/problem+json", h, count);
    free(text);
    return rc;
}

int gw_reply_problem_header(struct MHD_Connection *c, unsigned status, const char *code,
                            const char *detail, const char *name, const char *value)
{
    return queue_problem(c, status, gw_problem_text(status, code, detail), name, value);
}

int gw_reply_permission_denied(struct MHD_Connection *c, const char *required)
{
    char detail[BG_SCOPE_REQUIRED_MAX + 96];
    snprintf(detail, sizeof detail, "this token's scope does not allow this request: it needs %s",
             required);
    json_t *v = problem_object(403, "PERMISSION_DENIED", detail);
    if (v && json_object_set_new(v, "required_scope", json_string(required)) != 0) {
        json_decref(v);
        v = NULL;
    }
    return queue_problem(c, 403, problem_dump(v), NULL, NULL);
}

int gw_reply_outcome(struct MHD_Connection *c, int outcome)
{
    return gw_reply_outcome_detail(c, outcome, NULL);
}

int gw_reply_outcome_detail(struct MHD_Connection *c, int outcome, const char *detail)
{
    struct gw_problem p = gw_outcome_problem(outcome);
    return gw_reply_problem(c, p.status, p.code, detail ? detail : p.detail);
}

int gw_reply_empty(struct MHD_Connection *c, unsigned status)
{
    return queue(c, status, "", 0, 0, NULL, NULL, 0);
}

int gw_reply_bytes(struct MHD_Connection *c, unsigned status, const void *bytes, size_t n,
                   int copy, const char *type, const char *name, const char *value)
{
    struct gw_header h[1];
    size_t count = 0;
    add_header(h, &count, name, value);
    return queue(c, status, bytes, n, copy, type, h, count);
}

int gw_reply_static(struct MHD_Connection *c, unsigned status, const void *bytes, size_t n,
                    const char *type, const struct gw_header *headers, size_t count)
{
    return queue(c, status, bytes, n, 0, type, headers, count);
}

int gw_reply_raw_job(struct MHD_Connection *c, const struct bg_job *j, const char *token)
{
    int refused = 0;
    struct MHD_Response *resp = copied_response(j->body, j->body_size - 2, &refused);
    if (refused) return reply_over_budget(c);
    if (!resp) return GW_NO_REPLY;
    char num[32];
    MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
    snprintf(num, sizeof num, "%llu", (unsigned long long)j->id);
    MHD_add_response_header(resp, "X-Job-Id", num);
    MHD_add_response_header(resp, "X-Job-Tube", j->tube->name);
    snprintf(num, sizeof num, "%u", j->pri);
    MHD_add_response_header(resp, "X-Job-Priority", num);
    snprintf(num, sizeof num, "%u", j->ttr_s);
    MHD_add_response_header(resp, "X-Job-Ttr", num);
    if (token) MHD_add_response_header(resp, "X-Reservation", token);
    /* a browser that opens the body's URL saves it instead of showing it */
    MHD_add_response_header(resp, "Content-Disposition", "attachment");
    return send_response(c, 200, resp);
}

int gw_reply_options(struct MHD_Connection *c, const char *allow, int preflight)
{
    char methods[64];
    snprintf(methods, sizeof methods, "%s, OPTIONS", allow);
    struct gw_header h[4] = {{"Allow", methods},
                             {"Access-Control-Allow-Methods", allow},
                             {"Access-Control-Allow-Headers", GW_CORS_ALLOW_HEADERS},
                             {"Access-Control-Max-Age", GW_CORS_MAX_AGE}};
    return queue(c, 204, "", 0, 0, NULL, h, preflight ? 4 : 1);
}
