/* push.h - push delivery (issue 14): beangate reserves jobs from a tube as an
 * ordinary engine client and POSTs each one to the HTTP endpoint the operator
 * configured for that tube; 2xx deletes the job, a retryable failure releases
 * it with a backoff, anything else (or the last attempt) buries it.
 *
 * The pure parts (syntax, retry policy, rate limit, the table of last
 * failures) are core/push.c; this is the I/O: the subscriptions' secret
 * and TLS files, libcurl's multi interface on the libevent loop (http and
 * https), HMAC-SHA256 (nettle), the timers, and the JSON and metrics the
 * gateway shows. Everything runs on the loop thread (curl's resolver may
 * use a thread of its own). */
#ifndef BEANGATE_PUSH_H
#define BEANGATE_PUSH_H

#include <stdio.h>
#include <event2/event.h>
#include <jansson.h>

#include "../core/core.h"
#include "../io/wal.h"

#define PUSH_GRACE_DEFAULT 10     /* seconds SIGTERM lets deliveries finish */
#define PUSH_GRACE_MAX 3600
#define PUSH_SECRET_MAX 4096      /* bytes in a secret file */
#define PUSH_RESPONSE_BODY_MAX 65536 /* a larger response body is cut (the status counts) */

/* One subscription list text and where it came from, for messages
 * ("--push", "BEANGATE_PUSH", a file's path). */
struct push_source {
    const char *text;
    const char *origin;
};

/* The subscriptions, checked and with their secrets read. */
struct push_setup {
    struct bg_push_spec *specs;
    unsigned char **secrets;      /* NULL: not signed */
    size_t *secret_lens;
    size_t count;
    uint32_t grace_s;
};

/* Parse every source, then the file (one subscription per line), check them
 * (a tube at most once, at most BG_PUSH_SUBSCRIPTIONS_MAX; an https one's
 * ca-file, cert-file and key-file readable PEM) and read their secret files. 0, or the usage exit status after an error line naming the
 * origin, line and why. file may be NULL. Never logs a secret. */
int push_setup_load(struct push_setup *out, const struct push_source *sources, size_t n,
                    const char *file, uint32_t grace_s);
void push_setup_free(struct push_setup *s);

struct push;

/* Start delivering. NULL when setup has no subscription, or after an error
 * line. now() is the server's monotonic clock; changed(arg) is called after
 * push changed the queue (the server re-arms its timer, the log batches). */
struct push *push_start(const struct push_setup *setup, struct event_base *base,
                        struct bg_engine *engine, bg_time (*now)(void),
                        void (*changed)(void *), void *arg);
/* Deliveries wait for the log (io/wal.h): a job is POSTed only once the
 * log keeps its put (ids and bodies never escape before). NULL: no log. */
void push_set_log(struct push *p, struct wal *w);
/* SIGTERM: stop reserving; deliveries in flight may finish within the grace.
 * Returns 1 when done(arg) will be called later (all finished, or the grace
 * ran out), 0 when nothing is in flight or stopping had begun already (a
 * second signal): the caller stops now. NULL: 0. */
int push_stop(struct push *p, void (*done)(void *), void *arg);
/* Cancel what is still in flight and release those jobs (delay 0, priority
 * kept), close the engine clients, free everything. NULL does nothing. */
void push_free(struct push *p);

/* The subscriptions as JSON (GET /subscriptions, GET /stats): a new array. */
json_t *push_subscriptions_json(void *p);
/* Job id's last delivery failure as a new JSON object, or NULL if none is
 * known (GET /jobs/{id}: last_delivery_error). */
json_t *push_job_error_json(void *p, uint64_t id);
/* Nonzero if client c is one of push delivery's (gw_push_hooks.owns). */
int push_owns_client(void *p, const struct bg_client *c);
/* Append the push families to out (Prometheus text). 0 or BG_OUT_OF_MEMORY. */
int push_metrics(void *p, struct bg_buf *out);
/* One line per subscription for the startup block. */
void push_describe(const struct push *p, FILE *f);

#endif
