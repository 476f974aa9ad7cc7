/* json.c - the stats model and jobs rendered as JSON (same numbers as the
 * beanstalk YAML: both come from core/stats.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"

/* Base64 (RFC 4648, padded) of n bytes as a new JSON string. */
static json_t *base64_string(const char *p, size_t n)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t out_len = 4 * ((n + 2) / 3);
    char *out = malloc(out_len + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)(unsigned char)p[i] << 16;
        if (i + 1 < n) v |= (uint32_t)(unsigned char)p[i + 1] << 8;
        if (i + 2 < n) v |= (unsigned char)p[i + 2];
        out[o++] = abc[v >> 18 & 63];
        out[o++] = abc[v >> 12 & 63];
        out[o++] = i + 1 < n ? abc[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? abc[v & 63] : '=';
    }
    json_t *s = json_stringn(out, o);
    free(out);
    return s;
}

/* The value of a base64 character of the standard alphabet, or -1. */
static int base64_value(char ch)
{
    return ch >= 'A' && ch <= 'Z' ? ch - 'A' : ch >= 'a' && ch <= 'z' ? ch - 'a' + 26
         : ch >= '0' && ch <= '9' ? ch - '0' + 52 : ch == '+' ? 62 : ch == '/' ? 63 : -1;
}

char *gw_base64_decode(const char *text, size_t len, size_t *n, int *bad)
{
    *bad = 1;
    if (len % 4 != 0) return NULL;
    size_t pad = len && text[len - 1] == '=' ? (len > 1 && text[len - 2] == '=' ? 2 : 1) : 0;
    size_t symbols = len - pad;
    char *out = malloc(len / 4 * 3 + 1);
    if (!out) {
        *bad = 0;
        return NULL;
    }
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < symbols; i++) {
        int v = base64_value(text[i]);
        if (v < 0) { /* outside the alphabet, or '=' before the end */
            free(out);
            return NULL;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)(acc >> bits & 0xff);
        }
    }
    /* what is left is the unused low bits of the last character: 2 or 4 of
     * them with padding, and they must be zero (canonical) */
    if (bits && (acc & ((1u << bits) - 1)) != 0) {
        free(out);
        return NULL;
    }
    *n = o;
    return out;
}

json_t *gw_json_job(struct bg_engine *e, const struct bg_job *j, bg_time now,
                    const char *token, int with_body)
{
    bg_engine_show_job(e, j);
    struct bg_stats_job sj;
    bg_stats_job(e, j, now, &sj);
    json_t *v = json_pack("{s:I, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                          "id", (json_int_t)sj.id, "tube", sj.tube, "state", sj.state,
                          "priority", (json_int_t)sj.pri, "age", (json_int_t)sj.age_s,
                          "delay", (json_int_t)sj.delay_s, "ttr", (json_int_t)sj.ttr_s,
                          "time_left", (json_int_t)sj.time_left_s,
                          "reserves", (json_int_t)sj.reserves, "timeouts", (json_int_t)sj.timeouts,
                          "releases", (json_int_t)sj.releases, "buries", (json_int_t)sj.buries,
                          "kicks", (json_int_t)sj.kicks);
    if (!v) return NULL;
    if (token) json_object_set_new(v, "reservation", json_string(token));
    if (!token && j->state == BG_JOB_RESERVED) { /* the client that holds it (GET /clients); null: a token */
        uint64_t by = bg_job_reserved_by(j);
        json_object_set_new(v, "reserved_by", by ? json_integer((json_int_t)by) : json_null());
    }
    if (with_body) {
        size_t n = j->body_size - 2;
        json_t *body = json_stringn(j->body, n); /* NULL unless valid UTF-8 */
        if (body) json_object_set_new(v, "body", body);
        else json_object_set_new(v, "body_base64", base64_string(j->body, n));
    }
    return v;
}

json_t *gw_json_tube(const struct bg_stats_tube *st)
{
    return json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                     "name", st->name, "current_jobs_urgent", (json_int_t)st->urgent,
                     "current_jobs_ready", (json_int_t)st->ready,
                     "current_jobs_reserved", (json_int_t)st->reserved,
                     "current_jobs_delayed", (json_int_t)st->delayed,
                     "current_jobs_buried", (json_int_t)st->buried,
                     "total_jobs", (json_int_t)st->total_jobs, "current_using", (json_int_t)st->using,
                     "current_watching", (json_int_t)st->watching,
                     "current_waiting", (json_int_t)st->waiting, "cmd_delete", (json_int_t)st->cmd_delete,
                     "cmd_pause_tube", (json_int_t)st->cmd_pause, "pause", (json_int_t)st->pause_s,
                     "pause_time_left", (json_int_t)st->pause_left_s);
}

json_t *gw_json_server(const struct bg_engine *e, const struct bg_process_info *pi,
                       unsigned http_connections)
{
    json_t *v = json_pack("{s:I, s:I, s:I, s:I, s:I}",
                          "current_jobs_urgent", (json_int_t)e->urgent_count,
                          "current_jobs_ready", (json_int_t)e->ready_count,
                          "current_jobs_reserved", (json_int_t)e->reserved_count,
                          "current_jobs_delayed", (json_int_t)e->delayed_count,
                          "current_jobs_buried", (json_int_t)e->buried_count);
    if (!v) return NULL;
    for (size_t i = 0; i < BG_CMD_STATS_SHOWN; i++) {
        char key[40] = "cmd_"; /* the YAML key with '_' for '-' */
        for (size_t k = 0; bg_cmd_names[i][k] && k + 5 < sizeof key; k++)
            key[4 + k] = bg_cmd_names[i][k] == '-' ? '_' : bg_cmd_names[i][k];
        json_object_set_new(v, key, json_integer((json_int_t)e->stat.cmd[i]));
    }
    json_object_set_new(v, "job_timeouts", json_integer((json_int_t)e->stat.job_timeouts));
    json_object_set_new(v, "total_jobs", json_integer((json_int_t)e->stat.total_jobs));
    json_object_set_new(v, "max_job_size", json_integer(e->max_job_size));
    json_object_set_new(v, "current_tubes", json_integer(e->tube_count));
    json_object_set_new(v, "current_connections", json_integer((json_int_t)e->connections));
    json_object_set_new(v, "current_producers", json_integer((json_int_t)e->producers));
    json_object_set_new(v, "current_workers", json_integer((json_int_t)e->workers));
    json_object_set_new(v, "current_waiting", json_integer((json_int_t)e->waiting));
    json_object_set_new(v, "total_connections", json_integer((json_int_t)e->stat.total_connections));
    json_object_set_new(v, "draining", json_boolean(e->draining));
    json_object_set_new(v, "binlog_failed", json_boolean(e->journal_broken));
    struct bg_process_info none = {0};
    if (!pi) pi = &none;
    json_object_set_new(v, "binlog_oldest_index", json_integer((json_int_t)pi->binlog_oldest));
    json_object_set_new(v, "binlog_current_index", json_integer((json_int_t)pi->binlog_current));
    json_object_set_new(v, "binlog_records_migrated", json_integer((json_int_t)pi->binlog_migrated));
    json_object_set_new(v, "binlog_records_written", json_integer((json_int_t)pi->binlog_written));
    json_object_set_new(v, "binlog_max_size", json_integer((json_int_t)pi->binlog_max_size));
    json_object_set_new(v, "binlog_torn_records", json_integer((json_int_t)pi->binlog_torn));
    /* beyond beanstalk's stats keys: what the dashboard's overview shows */
    json_object_set_new(v, "version", json_string(BEANGATE_VERSION));
    json_object_set_new(v, "uptime", json_integer((json_int_t)pi->uptime_s));
    uint64_t gearman = pi->gearman_connections <= e->connections ? pi->gearman_connections : e->connections;
    json_object_set_new(v, "current_beanstalk_connections", json_integer((json_int_t)(e->connections - gearman)));
    json_object_set_new(v, "current_gearman_connections", json_integer((json_int_t)gearman));
    json_object_set_new(v, "current_http_connections", json_integer(http_connections));
    /* what happened to jobs, whatever front-end asked (the cmd_* count requests) */
    json_object_set_new(v, "total_jobs_reserved", json_integer((json_int_t)e->stat.total_jobs_reserved));
    json_object_set_new(v, "total_jobs_deleted", json_integer((json_int_t)e->stat.total_jobs_deleted));
    /* beanstalk and Gearman connections closed on a line of HTTP (docs/security.md) */
    json_object_set_new(v, "cross_protocol_closed", json_integer((json_int_t)e->stat.cross_protocol_closed));
    /* requests of every protocol refused by their scope (docs/security.md, Refusals) */
    json_object_set_new(v, "permission_denied", json_integer((json_int_t)e->stat.permission_denied));
    json_object_set_new(v, "binlog_enabled", json_boolean(pi->binlog_enabled));
    json_object_set_new(v, "binlog_size", json_integer((json_int_t)pi->binlog_bytes));
    json_object_set_new(v, "binlog_unlink_failures", json_integer((json_int_t)pi->binlog_unlink_failures));
    /* what the log did with each sink (docs/durability.md, "Stats") */
    const struct bg_log_sink_counters *sinks[] = {&pi->binlog_disk, &pi->binlog_stream};
    static const char *const sink_names[] = {"disk", "stream"};
    for (size_t i = 0; i < 2; i++) {
        char key[48];
        const char *sink = sink_names[i];
        snprintf(key, sizeof key, "binlog_%s_attempts", sink);
        json_object_set_new(v, key, json_integer((json_int_t)sinks[i]->attempts));
        snprintf(key, sizeof key, "binlog_%s_failures", sink);
        json_object_set_new(v, key, json_integer((json_int_t)sinks[i]->failures));
        snprintf(key, sizeof key, "binlog_%s_retries", sink);
        json_object_set_new(v, key, json_integer((json_int_t)sinks[i]->retries));
        snprintf(key, sizeof key, "binlog_%s_bytes", sink);
        json_object_set_new(v, key, json_integer((json_int_t)sinks[i]->bytes));
    }
    /* --shard K/N (0 of 1 when not sharded): docs/scaling.md */
    json_object_set_new(v, "shard_index", json_integer(e->shard_index));
    json_object_set_new(v, "shard_count", json_integer(e->shard_count));
    json_object_set_new(v, "binlog_last_sync_age_ms", pi->binlog_enabled && pi->binlog_sync_age_ms >= 0
                                                          ? json_integer(pi->binlog_sync_age_ms)
                                                          : json_null());
    return v;
}
