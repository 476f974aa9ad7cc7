/* metrics.c - operations endpoints: /metrics in the Prometheus text format
 * 0.0.4, /livez and /readyz; and the HTTP request counters behind
 * beangate_http_requests_total and beangate_http_request_duration_seconds.
 *
 * The server figures come from the same stats model as beanstalk `stats`
 * (struct bg_engine counters, bg_stats_tube). Every label value is bounded:
 * routes are the table's patterns, methods a fixed list, statuses the few
 * the gateway sends, and at most GW_METRICS_TUBES_MAX tubes are exported. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"

/* ---- HTTP request counters --------------------------------------------- */

static const char *const method_names[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH",
                                           "OPTIONS", "other"};
#define METHOD_COUNT ((int)(sizeof method_names / sizeof method_names[0]))

/* Upper bounds of the latency buckets, as numbers and as label text. */
static const double bucket_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                   0.25, 0.5, 1, 2.5, 5, 10, 30};
static const char *const bucket_text[] = {"0.0005", "0.001", "0.0025", "0.005", "0.01",
                                          "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5",
                                          "5", "10", "30"};
#define BUCKETS ((int)(sizeof bucket_le / sizeof bucket_le[0]))

/* Series of beangate_http_requests_total kept at most; more are dropped
 * and counted (cannot happen with the statuses the gateway sends). */
#define STATUS_SERIES_MAX 4096

struct route_hist {
    uint64_t in_bucket[BUCKETS]; /* not cumulative: rendering adds them up */
    uint64_t count;
    double sum;
};

struct status_series {
    int route, method;
    unsigned status;
    uint64_t n;
};

struct gw_metrics {
    int routes;                  /* route labels + 1: the last is "no route" */
    const char **labels;         /* the route labels (not owned) */
    struct route_hist *hist;
    struct status_series *series;
    size_t series_len, series_cap;
    uint64_t dropped;
};

struct gw_metrics *gw_metrics_new(const char *const *route_labels, int n)
{
    struct gw_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->routes = n + 1;
    m->hist = calloc((size_t)m->routes, sizeof *m->hist);
    m->labels = calloc((size_t)m->routes, sizeof *m->labels);
    if (!m->hist || !m->labels) {
        gw_metrics_free(m);
        return NULL;
    }
    for (int i = 0; i < n; i++) m->labels[i] = route_labels[i];
    m->labels[n] = "unmatched";
    return m;
}

void gw_metrics_free(struct gw_metrics *m)
{
    if (!m) return;
    free(m->hist);
    free(m->labels);
    free(m->series);
    free(m);
}

int gw_metrics_method_index(const char *method)
{
    for (int i = 0; i < METHOD_COUNT - 1; i++)
        if (strcmp(method, method_names[i]) == 0) return i;
    return METHOD_COUNT - 1;
}

const char *gw_metrics_method_name(int index)
{
    return index >= 0 && index < METHOD_COUNT ? method_names[index] : "other";
}

void gw_metrics_observe(struct gw_metrics *m, int route, int method, unsigned status,
                        double seconds)
{
    if (!m) return;
    if (route < 0 || route >= m->routes - 1) route = m->routes - 1;
    if (method < 0 || method >= METHOD_COUNT) method = METHOD_COUNT - 1;
    if (status > 999) status = 0;
    if (seconds < 0) seconds = 0;
    struct route_hist *h = &m->hist[route];
    h->count++;
    h->sum += seconds;
    for (int b = 0; b < BUCKETS; b++) {
        if (seconds <= bucket_le[b]) {
            h->in_bucket[b]++;
            break;
        }
    }
    for (size_t i = 0; i < m->series_len; i++) {
        struct status_series *s = &m->series[i];
        if (s->route == route && s->method == method && s->status == status) {
            s->n++;
            return;
        }
    }
    if (m->series_len == m->series_cap) {
        size_t cap = m->series_cap ? m->series_cap * 2 : 64;
        struct status_series *grown = cap <= STATUS_SERIES_MAX
                                          ? realloc(m->series, cap * sizeof *grown) : NULL;
        if (!grown) {
            m->dropped++;
            return;
        }
        m->series = grown;
        m->series_cap = cap;
    }
    m->series[m->series_len++] = (struct status_series){route, method, status, 1};
}

/* ---- rendering --------------------------------------------------------- */

static const char *route_label(const struct gw_metrics *m, int route)
{
    return m->labels[route];
}

/* The HELP and TYPE lines of a family. */
static int family(struct bg_buf *b, const char *name, const char *type, const char *help)
{
    return bg_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value with \\, \" and \n escaped. */
static int label_value(struct bg_buf *b, const char *s)
{
    int rc = 0;
    for (const char *p = s; rc == 0 && *p; p++) {
        const char *esc = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        rc = esc ? bg_buf_append(b, esc, 2) : bg_buf_append(b, p, 1);
    }
    return rc;
}

/* name{label="value"} n */
static int sample1(struct bg_buf *b, const char *name, const char *label, const char *value,
                   uint64_t n)
{
    int rc = bg_buf_printf(b, "%s{%s=\"", name, label);
    if (rc == 0) rc = label_value(b, value);
    if (rc == 0) rc = bg_buf_printf(b, "\"} %llu\n", (unsigned long long)n);
    return rc;
}

/* name{tube="t",label="value"} n */
static int tube_sample(struct bg_buf *b, const char *name, const char *tube, const char *label,
                       const char *value, uint64_t n)
{
    int rc = bg_buf_printf(b, "%s{tube=\"", name);
    if (rc == 0) rc = label_value(b, tube);
    if (rc == 0 && label) rc = bg_buf_printf(b, "\",%s=\"%s", label, value);
    if (rc == 0) rc = bg_buf_printf(b, "\"} %llu\n", (unsigned long long)n);
    return rc;
}

static int gauge(struct bg_buf *b, const char *name, const char *help, uint64_t n)
{
    int rc = family(b, name, "gauge", help);
    if (rc == 0) rc = bg_buf_printf(b, "%s %llu\n", name, (unsigned long long)n);
    return rc;
}

static int counter(struct bg_buf *b, const char *name, const char *help, uint64_t n)
{
    int rc = family(b, name, "counter", help);
    if (rc == 0) rc = bg_buf_printf(b, "%s %llu\n", name, (unsigned long long)n);
    return rc;
}

/* The log's counters per sink (disk, stream): one family each, a sample
 * per sink. */
static int render_log_sinks(struct bg_buf *b, const struct bg_process_info *pi)
{
    static const struct {
        const char *name, *help;
        size_t offset;
    } families[] = {
        {"beangate_binlog_sink_attempts_total", "Batches the log handed to a sink (disk, stream).",
         offsetof(struct bg_log_sink_counters, attempts)},
        {"beangate_binlog_sink_failures_total", "Batches a sink failed.",
         offsetof(struct bg_log_sink_counters, failures)},
        {"beangate_binlog_sink_retries_total", "Failed batches handed to a sink again (once a second).",
         offsetof(struct bg_log_sink_counters, retries)},
        {"beangate_binlog_sink_bytes_total", "Bytes a sink took.", offsetof(struct bg_log_sink_counters, bytes)},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof families / sizeof families[0] && rc == 0; i++) {
        rc = family(b, families[i].name, "counter", families[i].help);
        const uint64_t *disk = (const uint64_t *)((const char *)&pi->binlog_disk + families[i].offset);
        const uint64_t *stream = (const uint64_t *)((const char *)&pi->binlog_stream + families[i].offset);
        if (rc == 0)
            rc = bg_buf_printf(b, "%s{sink=\"disk\"} %llu\n%s{sink=\"stream\"} %llu\n", families[i].name,
                               (unsigned long long)*disk, families[i].name, (unsigned long long)*stream);
    }
    return rc;
}

/* Replication's families (--replicate): the role, the stream's sequences
 * and lag, acknowledgements, purges, the lease. */
static int render_replication(struct bg_buf *b, const struct bg_process_info *pi)
{
    static const char *const roles[] = {"standby", "taking_over", "primary", "lost"};
    int rc = family(b, "beangate_replication_role", "gauge",
                    "1 for this node's replication role (standby, taking_over, primary, lost).");
    for (size_t i = 0; rc == 0 && i < sizeof roles / sizeof roles[0]; i++)
        rc = sample1(b, "beangate_replication_role", "role", roles[i],
                     pi->repl_role && strcmp(pi->repl_role, roles[i]) == 0);
    if (rc == 0)
        rc = gauge(b, "beangate_replication_primary", "1 while this node serves as the primary, else 0.",
                   (uint64_t)pi->repl_primary);
    if (rc == 0)
        rc = gauge(b, "beangate_replication_stream_last_seq",
                   "The stream's last sequence as this node last saw it.", pi->repl_stream_last_seq);
    if (rc == 0)
        rc = gauge(b, "beangate_replication_applied_seq",
                   "A standby: the last message of the stream applied.", pi->repl_applied_seq);
    if (rc == 0)
        rc = gauge(b, "beangate_replication_lag_messages",
                   "A standby: messages seen in the stream and not applied yet.",
                   pi->repl_primary || pi->repl_stream_last_seq < pi->repl_applied_seq
                       ? 0 : pi->repl_stream_last_seq - pi->repl_applied_seq);
    if (rc == 0)
        rc = counter(b, "beangate_replication_messages_published_total",
                     "Messages of log records the stream acknowledged (each a quorum's).",
                     pi->repl_messages_published);
    if (rc == 0)
        rc = counter(b, "beangate_replication_publish_retries_total",
                     "Publishes tried again (no quorum, a leader election, a lost connection).",
                     pi->repl_publish_retries);
    if (rc == 0)
        rc = counter(b, "beangate_replication_purges_total",
                     "Purges of the stream behind a complete snapshot.", pi->repl_purges);
    if (rc == 0)
        rc = counter(b, "beangate_replication_lease_renewals_total", "Renewals of the leadership lease.",
                     pi->repl_lease_renewals);
    if (rc == 0)
        rc = counter(b, "beangate_replication_lease_failures_total",
                     "Renewals of the lease that failed.", pi->repl_lease_failures);
    if (rc == 0 && pi->repl_lease_age_ms >= 0)
        rc = gauge(b, "beangate_replication_lease_age_ms",
                   "Milliseconds since the primary last renewed its lease.", (uint64_t)pi->repl_lease_age_ms);
    return rc;
}

static int render_server(const struct gateway *gw, struct bg_buf *b, bg_time now)
{
    const struct bg_engine *e = gw->engine;
    int rc = family(b, "beangate_current_jobs", "gauge",
                    "Jobs in the server now, by state (current-jobs-* of stats).");
    if (rc == 0) rc = sample1(b, "beangate_current_jobs", "state", "ready", e->ready_count);
    if (rc == 0) rc = sample1(b, "beangate_current_jobs", "state", "delayed", e->delayed_count);
    if (rc == 0) rc = sample1(b, "beangate_current_jobs", "state", "reserved", e->reserved_count);
    if (rc == 0) rc = sample1(b, "beangate_current_jobs", "state", "buried", e->buried_count);
    if (rc == 0)
        rc = gauge(b, "beangate_current_jobs_urgent",
                   "Ready jobs with a priority below 1024 (current-jobs-urgent).", e->urgent_count);
    if (rc == 0)
        rc = counter(b, "beangate_jobs_total", "Jobs put since the start (total-jobs).",
                     e->stat.total_jobs);
    if (rc == 0)
        rc = counter(b, "beangate_jobs_reserved_total",
                     "Reservations made since the start, by every front-end; a job reserved "
                     "again counts again (total_jobs_reserved of GET /stats).",
                     e->stat.total_jobs_reserved);
    if (rc == 0)
        rc = counter(b, "beangate_jobs_deleted_total",
                     "Jobs deleted since the start, by every front-end (total_jobs_deleted of "
                     "GET /stats).", e->stat.total_jobs_deleted);
    if (rc == 0)
        rc = counter(b, "beangate_job_timeouts_total",
                     "Reservations that ran out of time (job-timeouts).", e->stat.job_timeouts);
    if (rc == 0)
        rc = family(b, "beangate_commands_total", "counter",
                    "Requests of every front-end by the beanstalk command they perform "
                    "(cmd-* of stats; docs/operations.md, Command counters).");
    for (int i = 0; rc == 0 && i < BG_CMD_COUNT; i++)
        rc = sample1(b, "beangate_commands_total", "command", bg_cmd_names[i], e->stat.cmd[i]);
    if (rc == 0)
        rc = gauge(b, "beangate_current_connections",
                   "Open beanstalk and Gearman connections (current-connections).", e->connections);
    if (rc == 0)
        rc = family(b, "beangate_clients", "gauge",
                    "Clients GET /clients lists, by protocol: beanstalk and Gearman connections, "
                    "HTTP long-polls, push subscriptions.");
    for (int p = 0; rc == 0 && p < BG_CLIENT_PROTOCOLS; p++)
        rc = sample1(b, "beangate_clients", "protocol", bg_client_protocol_name((enum bg_client_protocol)p),
                     bg_clients_count(e, (enum bg_client_protocol)p));
    if (rc == 0)
        rc = counter(b, "beangate_connections_total",
                     "Beanstalk and Gearman connections accepted since the start (total-connections).",
                     e->stat.total_connections);
    if (rc == 0)
        rc = counter(b, "beangate_cross_protocol_closed_total",
                     "Beanstalk and Gearman connections closed on a line of HTTP, a web page's "
                     "request (cross_protocol_closed of GET /stats; docs/security.md).",
                     e->stat.cross_protocol_closed);
    if (rc == 0)
        rc = counter(b, "beangate_permission_denied_total",
                     "Requests of every protocol refused by their scope, and jobs hidden as not found "
                     "from a scope that cannot see them (permission_denied of GET /stats; "
                     "docs/security.md).",
                     e->stat.permission_denied);
    if (rc == 0)
        rc = gauge(b, "beangate_current_producers",
                   "Connections that have put a job (current-producers).", e->producers);
    if (rc == 0)
        rc = gauge(b, "beangate_current_workers",
                   "Connections that have reserved a job (current-workers).", e->workers);
    if (rc == 0)
        rc = gauge(b, "beangate_current_waiting",
                   "Clients waiting in a reserve, and sleeping Gearman workers (current-waiting).",
                   e->waiting);
    if (rc == 0) rc = gauge(b, "beangate_current_tubes", "Tubes that exist (current-tubes).", e->tube_count);
    if (rc == 0)
        rc = gauge(b, "beangate_draining", "1 while the server is draining (SIGUSR1), else 0.",
                   e->draining ? 1 : 0);
    if (rc == 0)
        rc = gauge(b, "beangate_ready", "1 when /readyz answers 200, else 0.",
                   gw->ready && !e->draining && !e->journal_broken && !bg_engine_memory_full(e) &&
                           !gw_role_refusal(gw, NULL, 0) ? 1 : 0);
    if (rc == 0)
        rc = gauge(b, "beangate_binlog_failed",
                   "1 while the write-ahead log cannot write (puts are refused), else 0.",
                   e->journal_broken ? 1 : 0);
    struct bg_process_info pi = {0};
    if (gw->cfg.process_info) gw->cfg.process_info(gw->cfg.log_arg, &pi);
    if (rc == 0 && pi.binlog_current) { /* the log figures only with -b (segments count from 1) */
        rc = counter(b, "beangate_binlog_records_written_total",
                     "Records written to the write-ahead log since the start (binlog-records-written).",
                     pi.binlog_written);
        if (rc == 0)
            rc = counter(b, "beangate_binlog_records_migrated_total",
                         "Records rewritten by compaction since the start (binlog-records-migrated).",
                         pi.binlog_migrated);
        if (rc == 0)
            rc = gauge(b, "beangate_binlog_current_index",
                       "Index of the segment being written (binlog-current-index).", pi.binlog_current);
        if (rc == 0)
            rc = gauge(b, "beangate_binlog_oldest_index",
                       "Index of the oldest segment kept (binlog-oldest-index).", pi.binlog_oldest);
        if (rc == 0)
            rc = gauge(b, "beangate_binlog_torn_records",
                       "Torn or corrupt tails dropped at the last recovery.", pi.binlog_torn);
        if (rc == 0)
            rc = counter(b, "beangate_binlog_unlink_failures_total",
                         "Superseded log segments whose deletion failed (kept; recovery deletes them).",
                         pi.binlog_unlink_failures);
    }
    if (rc == 0 && (pi.binlog_enabled || pi.repl_enabled)) rc = render_log_sinks(b, &pi);
    if (rc == 0 && pi.repl_enabled) rc = render_replication(b, &pi);
    if (rc == 0)
        rc = gauge(b, "beangate_max_job_size_bytes", "The maximum job size (-z).", e->max_job_size);
    if (rc == 0) rc = family(b, "beangate_uptime_seconds", "gauge", "Seconds since the server started.");
    if (rc == 0)
        rc = bg_buf_printf(b, "beangate_uptime_seconds %.3f\n",
                           now > gw->started_at ? (double)(now - gw->started_at) / 1e9 : 0.0);
    if (rc == 0) rc = family(b, "beangate_build_info", "gauge", "Always 1; the labels tell the version.");
    if (rc == 0)
        rc = bg_buf_printf(b, "beangate_build_info{version=\"%s\",protocol=\"%s\"} 1\n",
                           BEANGATE_VERSION, BG_VERSION);
    return rc;
}

/* The per-tube families with one sample per tube: a field of the stats
 * model each. */
static const struct {
    const char *name, *type, *help;
    size_t field; /* offset of a uint64_t in struct bg_stats_tube */
} tube_families[] = {
    {"beangate_tube_current_jobs_urgent", "gauge", "Ready jobs of a tube with a priority below 1024.",
     offsetof(struct bg_stats_tube, urgent)},
    {"beangate_tube_jobs_total", "counter",
     "Jobs put into a tube since it was created (it starts again at 0 if the tube goes away and "
     "comes back).",
     offsetof(struct bg_stats_tube, total_jobs)},
    {"beangate_tube_current_waiting", "gauge", "Clients waiting in a reserve on a tube.",
     offsetof(struct bg_stats_tube, waiting)},
};

/* The per-tube series of the first GW_METRICS_TUBES_MAX tubes that scope
 * sees (NULL: every tube). */
static int render_tubes(const struct gateway *gw, struct bg_buf *b, bg_time now,
                        const struct bg_scope *scope)
{
    const struct bg_engine *e = gw->engine;
    const struct bg_tube **shown = malloc(GW_METRICS_TUBES_MAX * sizeof *shown);
    if (!shown) return BG_OUT_OF_MEMORY;
    uint32_t n = 0, seen = 0;
    for (uint32_t i = 0; i < e->tube_count; i++) {
        const struct bg_tube *t = e->tube_list[i];
        if (scope && !bg_scope_sees(scope, t->name, strlen(t->name))) continue;
        seen++;
        if (n < GW_METRICS_TUBES_MAX) shown[n++] = t;
    }
    static const char *const states[] = {"ready", "delayed", "reserved", "buried"};
    struct bg_stats_tube st;
    int rc = family(b, "beangate_tube_current_jobs", "gauge", "Jobs in a tube now, by state.");
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        bg_stats_tube(shown[i], now, &st);
        const uint64_t by_state[] = {st.ready, st.delayed, st.reserved, st.buried};
        for (int k = 0; rc == 0 && k < 4; k++)
            rc = tube_sample(b, "beangate_tube_current_jobs", st.name, "state", states[k], by_state[k]);
    }
    for (size_t f = 0; f < sizeof tube_families / sizeof tube_families[0]; f++) {
        if (rc == 0) rc = family(b, tube_families[f].name, tube_families[f].type, tube_families[f].help);
        for (uint32_t i = 0; rc == 0 && i < n; i++) {
            bg_stats_tube(shown[i], now, &st);
            uint64_t v = *(const uint64_t *)((const char *)&st + tube_families[f].field);
            rc = tube_sample(b, tube_families[f].name, st.name, NULL, NULL, v);
        }
    }
    if (rc == 0) rc = family(b, "beangate_tube_paused", "gauge", "1 while a tube is paused, else 0.");
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const struct bg_tube *t = shown[i];
        rc = tube_sample(b, "beangate_tube_paused", t->name, NULL, NULL,
                         t->pause_ns && t->unpause_at > now ? 1 : 0);
    }
    free(shown);
    if (rc == 0)
        rc = gauge(b, "beangate_tubes_exported", "Tubes that have beangate_tube_* series here.", n);
    if (rc == 0)
        rc = gauge(b, "beangate_tubes_omitted",
                   "Tubes left out of the beangate_tube_* series (at most 1000 are exported).",
                   seen - n);
    return rc;
}

/* The gateway's connections: open, refused and closed by it, and the bodies
 * it holds (admit.c's counters, GW_CONN_EVENTS). */
static int render_connections(const struct gateway *gw, struct bg_buf *b)
{
    static const char *const refused[] = {"connections", "address", "fd_limit"};
    static const char *const closed[] = {"evicted", "header_timeout", "bad_head", "client"};
    const struct gw_admit *a = &gw->admit;
    int rc = gauge(b, "beangate_http_connections", "HTTP connections open.", a->open);
    if (rc == 0)
        rc = gauge(b, "beangate_http_connections_parked",
                   "Idle keep-alive HTTP connections taken back from libmicrohttpd (counted in "
                   "beangate_http_connections too).", a->parked);
    if (rc == 0)
        rc = family(b, "beangate_http_connections_refused_total", "counter",
                    "HTTP connections refused at accept: every slot busy in a request (connections, "
                    "address) or no descriptor left (fd_limit).");
    for (int i = 0; rc == 0 && i < 3; i++)
        rc = sample1(b, "beangate_http_connections_refused_total", "reason", refused[i],
                     a->events[GW_REFUSED_CONNECTIONS + i]);
    if (rc == 0)
        rc = family(b, "beangate_http_connections_closed_total", "counter",
                    "HTTP connections closed early: evicted for a new one, head not complete in time, "
                    "a first head refused, or the client left or broke the protocol.");
    for (int i = 0; rc == 0 && i < 4; i++)
        rc = sample1(b, "beangate_http_connections_closed_total", "reason", closed[i],
                     a->events[GW_CLOSED_EVICTED + i]);
    if (rc == 0)
        rc = counter(b, "beangate_http_tls_refusals_total",
                     "HTTPS connections refused at --http-max-connections and answered 503 inside TLS "
                     "(a handshake each, within a budget per second: docs/security.md).", a->tls_refusals_answered);
    if (rc == 0)
        rc = counter(b, "beangate_http_tls_refusals_unanswered_total",
                     "HTTPS connections refused at --http-max-connections and closed without a handshake: "
                     "over the handshake budget, or too many refusals lingering.", a->tls_refusals_unanswered);
    if (rc == 0)
        rc = gauge(b, "beangate_http_body_buffer_bytes",
                   "Bytes of request bodies budgeted now (at most --http-max-body-buffer).",
                   gw->body_buffered);
    if (rc == 0)
        rc = gauge(b, "beangate_http_response_buffer_bytes",
                   "Bytes of HTTP responses built and not yet sent (reads are refused past "
                   "--http-max-response-buffer).",
                   gw->responses.count.held);
    if (rc == 0)
        rc = counter(b, "beangate_http_responses_refused_total",
                     "GET and HEAD responses refused with 503 RESPONSE_BUFFER_FULL: over 16 KiB and no room "
                     "under --http-max-response-buffer.",
                     gw->responses.count.refused);
    return rc;
}

static int render_http(const struct gateway *gw, struct bg_buf *b)
{
    const struct gw_metrics *m = gw->metrics;
    int rc = family(b, "beangate_http_requests_total", "counter",
                    "HTTP requests by route pattern, method and status (0: the client went "
                    "away before a response).");
    for (size_t i = 0; rc == 0 && i < m->series_len; i++) {
        const struct status_series *s = &m->series[i];
        rc = bg_buf_printf(b, "beangate_http_requests_total{route=\"");
        if (rc == 0) rc = label_value(b, route_label(m, s->route));
        if (rc == 0)
            rc = bg_buf_printf(b, "\",method=\"%s\",status=\"%u\"} %llu\n", method_names[s->method],
                               s->status, (unsigned long long)s->n);
    }
    if (rc == 0)
        rc = counter(b, "beangate_http_requests_untracked_total",
                     "HTTP requests left out of beangate_http_requests_total (too many series).",
                     m->dropped);
    if (rc == 0)
        rc = family(b, "beangate_http_request_duration_seconds", "histogram",
                    "HTTP request time by route pattern, from the request's headers to the "
                    "end of its response (long-polls included).");
    for (int r = 0; rc == 0 && r < m->routes; r++) {
        const struct route_hist *h = &m->hist[r];
        if (!h->count) continue;
        uint64_t cumulative = 0;
        for (int k = 0; rc == 0 && k <= BUCKETS; k++) {
            cumulative += k < BUCKETS ? h->in_bucket[k] : 0;
            rc = bg_buf_printf(b, "beangate_http_request_duration_seconds_bucket{route=\"");
            if (rc == 0) rc = label_value(b, route_label(m, r));
            if (rc == 0)
                rc = bg_buf_printf(b, "\",le=\"%s\"} %llu\n", k < BUCKETS ? bucket_text[k] : "+Inf",
                                   (unsigned long long)(k < BUCKETS ? cumulative : h->count));
        }
        if (rc == 0) rc = bg_buf_printf(b, "beangate_http_request_duration_seconds_sum{route=\"");
        if (rc == 0) rc = label_value(b, route_label(m, r));
        if (rc == 0) rc = bg_buf_printf(b, "\"} %.9f\n", h->sum);
        if (rc == 0) rc = bg_buf_printf(b, "beangate_http_request_duration_seconds_count{route=\"");
        if (rc == 0) rc = label_value(b, route_label(m, r));
        if (rc == 0) rc = bg_buf_printf(b, "\"} %llu\n", (unsigned long long)h->count);
    }
    if (rc == 0)
        rc = gauge(b, "beangate_http_requests_in_flight",
                   "HTTP requests begun and not finished (long-polls included).", gw->in_flight);
    if (rc == 0) rc = render_connections(gw, b);
    return rc;
}

/* Append the lines of text[0..len) to out, leaving out the samples whose
 * first label is tube="T" for a tube T that scope does not see (push
 * delivery's families: their tube names need no escaping). */
static int append_seen_samples(struct bg_buf *out, const char *text, size_t len,
                               const struct bg_scope *scope)
{
    static const char label[] = "{tube=\"";
    int rc = 0;
    for (size_t at = 0; rc == 0 && at < len;) {
        const char *line = text + at, *nl = memchr(line, '\n', len - at);
        size_t n = nl ? (size_t)(nl - line) + 1 : len - at;
        at += n;
        const char *tube = line[0] == '#' ? NULL : memchr(line, '{', n);
        if (tube && n - (size_t)(tube - line) > sizeof label - 1 &&
            memcmp(tube, label, sizeof label - 1) == 0) {
            tube += sizeof label - 1;
            const char *end = memchr(tube, '"', n - (size_t)(tube - line));
            if (end && !bg_scope_sees(scope, tube, (size_t)(end - tube))) continue;
        }
        rc = bg_buf_append(out, line, n);
    }
    return rc;
}

/* Push delivery's families (the hook's), with scope's tubes only. */
static int render_push(const struct gateway *gw, struct bg_buf *out, const struct bg_scope *scope)
{
    if (!scope) return gw->push.metrics(gw->push.arg, out);
    struct bg_buf all = {0};
    int rc = gw->push.metrics(gw->push.arg, &all);
    if (rc == 0) rc = append_seen_samples(out, bg_buf_head(&all), all.len, scope);
    bg_buf_free(&all);
    return rc;
}

int gw_metrics_render(const struct gateway *gw, struct bg_buf *out, bg_time now,
                      const struct bg_scope *scope)
{
    int rc = render_server(gw, out, now);
    if (rc == 0) rc = render_tubes(gw, out, now, scope);
    if (rc == 0 && gw->metrics) rc = render_http(gw, out);
    if (rc == 0 && gw->push.metrics) rc = render_push(gw, out, scope);
    if (rc == 0 && gw->cfg.extra_metrics) rc = gw->cfg.extra_metrics(gw->cfg.log_arg, out);
    return rc;
}

/* ---- the endpoints ----------------------------------------------------- */

int gw_handle_metrics(struct gw_request *r)
{
    struct bg_buf b = {0};
    if (gw_metrics_render(r->gw, &b, r->gw->now(), r->scope) != 0) {
        bg_buf_free(&b);
        return BG_OUT_OF_MEMORY;
    }
    int rc = gw_reply_bytes(r->conn, 200, bg_buf_head(&b), b.len, 1,
                            "text/plain; version=0.0.4; charset=utf-8", "Cache-Control", "no-store");
    bg_buf_free(&b);
    return rc;
}

int gw_handle_livez(struct gw_request *r)
{
    return gw_reply_json(r->conn, 200, json_pack("{s:s}", "status", "ok"), NULL);
}

const char *gw_role_refusal(const struct gateway *gw, char *detail, size_t size)
{
    return gw->role ? gw->role(gw->role_arg, detail, size) : NULL;
}

int gw_handle_readyz(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    char detail[160];
    const char *role = gw_role_refusal(gw, detail, sizeof detail);
    if (role) return gw_reply_problem(r->conn, 503, role, detail);
    if (gw->engine->draining)
        return gw_reply_problem(r->conn, 503, "DRAINING", "the server is draining: no new jobs");
    if (!gw->ready)
        return gw_reply_problem(r->conn, 503, "STARTING", "the server is not serving yet");
    if (gw->engine->journal_broken)
        return gw_reply_problem(r->conn, 503, "LOG_UNAVAILABLE",
                                "the write-ahead log cannot write: puts are refused until it can");
    if (bg_engine_memory_full(gw->engine))
        return gw_reply_problem(r->conn, 503, "OUT_OF_MEMORY",
                                "the jobs held reach the job-memory ceiling (--max-job-memory): "
                                "puts are refused until jobs are deleted");
    return gw_reply_json(r->conn, 200, json_pack("{s:s}", "status", "ok"), NULL);
}
