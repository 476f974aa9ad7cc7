/* stats.c - the one stats model (server, tube, job) and its rendering as
 * the reference's YAML. The gateway renders the same structs as JSON. */
#include <string.h>

#include "core.h"

static const char *const job_state_names[] = {"ready", "delayed", "reserved", "buried"};

void bg_stats_job(const struct bg_engine *e, const struct bg_job *j, bg_time now,
                  struct bg_stats_job *out)
{
    (void)e;
    out->id = j->id;
    out->tube = j->tube->name;
    out->state = job_state_names[j->state];
    out->pri = j->pri;
    out->age_s = now > j->created_at ? (now - j->created_at) / BG_SECOND : 0;
    out->delay_s = bg_job_delay(j);
    out->ttr_s = j->ttr_s;
    out->time_left_s = 0;
    bg_time deadline = bg_job_deadline(j);
    if ((j->state == BG_JOB_RESERVED || j->state == BG_JOB_DELAYED) && deadline > now)
        out->time_left_s = (deadline - now) / BG_SECOND;
    out->reserves = bg_job_reserves(j);
    out->timeouts = bg_job_timeouts(j);
    out->releases = bg_job_releases(j);
    out->buries = bg_job_buries(j);
    out->kicks = bg_job_kicks(j);
}

void bg_stats_tube(const struct bg_tube *t, bg_time now, struct bg_stats_tube *out)
{
    out->name = t->name;
    out->urgent = t->urgent_count;
    out->ready = t->ready.len;
    out->reserved = t->reserved.len;
    out->delayed = t->delayed.len;
    out->buried = t->buried.len;
    out->total_jobs = t->stat.total_jobs;
    out->using = t->using_count;
    out->watching = t->watching_count;
    out->waiting = t->waiting_len;
    out->cmd_delete = t->stat.cmd_delete;
    out->cmd_pause = t->stat.cmd_pause;
    out->pause_s = t->pause_ns / BG_SECOND;
    out->pause_left_s = t->pause_ns && t->unpause_at > now ? (t->unpause_at - now) / BG_SECOND : 0;
}

/* Wrap the YAML document in yaml as "OK <n>\r\n<yaml>\r\n" on out. */
static int finish_ok(struct bg_buf *out, struct bg_buf *yaml, int rc)
{
    if (rc == 0) rc = bg_buf_printf(out, "OK %zu\r\n", yaml->len);
    if (rc == 0) rc = bg_buf_append(out, bg_buf_head(yaml), yaml->len);
    if (rc == 0) rc = bg_buf_append(out, "\r\n", 2);
    bg_buf_free(yaml);
    return rc;
}

const char *const bg_cmd_names[BG_CMD_COUNT] = {
    "put", "peek", "peek-ready", "peek-delayed", "peek-buried", "reserve",
    "reserve-with-timeout", "delete", "release", "use", "watch", "ignore", "bury", "kick",
    "touch", "stats", "stats-job", "stats-tube", "list-tubes", "list-tube-used",
    "list-tubes-watched", "pause-tube", "reserve-job", "kick-job", "quit",
};

void bg_count_cmd(struct bg_engine *e, enum bg_cmd cmd, uint64_t n)
{
    e->stat.cmd[cmd] += n;
}

int bg_render_stats(struct bg_buf *out, const struct bg_engine *e,
                    const struct bg_process_info *pi)
{
    struct bg_buf y = {0};
    int rc = bg_buf_printf(&y,
        "---\ncurrent-jobs-urgent: %llu\ncurrent-jobs-ready: %llu\n"
        "current-jobs-reserved: %llu\ncurrent-jobs-delayed: %llu\n"
        "current-jobs-buried: %llu\n",
        (unsigned long long)e->urgent_count, (unsigned long long)e->ready_count,
        (unsigned long long)e->reserved_count, (unsigned long long)e->delayed_count,
        (unsigned long long)e->buried_count);
    for (size_t i = 0; rc == 0 && i < BG_CMD_STATS_SHOWN; i++)
        rc = bg_buf_printf(&y, "cmd-%s: %llu\n", bg_cmd_names[i], (unsigned long long)e->stat.cmd[i]);
    if (rc == 0)
        rc = bg_buf_printf(&y,
            "job-timeouts: %llu\ntotal-jobs: %llu\nmax-job-size: %u\ncurrent-tubes: %u\n"
            "current-connections: %llu\ncurrent-producers: %llu\ncurrent-workers: %llu\n"
            "current-waiting: %llu\ntotal-connections: %llu\npid: %ld\n"
            "version: \"%s\"\nrusage-utime: %.6f\nrusage-stime: %.6f\nuptime: %llu\n"
            "binlog-oldest-index: %llu\nbinlog-current-index: %llu\n"
            "binlog-records-migrated: %llu\nbinlog-records-written: %llu\n"
            "binlog-max-size: %llu\ndraining: %s\nid: %s\nhostname: %s\nos: %s\n"
            "platform: %s\n",
            (unsigned long long)e->stat.job_timeouts, (unsigned long long)e->stat.total_jobs,
            e->max_job_size, e->tube_count, (unsigned long long)e->connections,
            (unsigned long long)e->producers, (unsigned long long)e->workers,
            (unsigned long long)e->waiting, (unsigned long long)e->stat.total_connections,
            pi->pid, BG_VERSION, pi->utime, pi->stime,
            (unsigned long long)pi->uptime_s, (unsigned long long)pi->binlog_oldest,
            (unsigned long long)pi->binlog_current, (unsigned long long)pi->binlog_migrated,
            (unsigned long long)pi->binlog_written, (unsigned long long)pi->binlog_max_size,
            e->draining ? "true" : "false", pi->instance_id ? pi->instance_id : "",
            pi->hostname ? pi->hostname : "", pi->os ? pi->os : "",
            pi->platform ? pi->platform : "");
    return finish_ok(out, &y, rc);
}

int bg_render_stats_tube(struct bg_buf *out, const struct bg_stats_tube *st)
{
    struct bg_buf y = {0};
    int rc = bg_buf_printf(&y,
        "---\nname: %s\ncurrent-jobs-urgent: %llu\ncurrent-jobs-ready: %llu\n"
        "current-jobs-reserved: %llu\ncurrent-jobs-delayed: %llu\n"
        "current-jobs-buried: %llu\ntotal-jobs: %llu\ncurrent-using: %llu\n"
        "current-watching: %llu\ncurrent-waiting: %llu\ncmd-delete: %llu\n"
        "cmd-pause-tube: %llu\npause: %llu\npause-time-left: %llu\n",
        st->name, (unsigned long long)st->urgent, (unsigned long long)st->ready,
        (unsigned long long)st->reserved, (unsigned long long)st->delayed,
        (unsigned long long)st->buried, (unsigned long long)st->total_jobs,
        (unsigned long long)st->using, (unsigned long long)st->watching,
        (unsigned long long)st->waiting, (unsigned long long)st->cmd_delete,
        (unsigned long long)st->cmd_pause, (unsigned long long)st->pause_s,
        (unsigned long long)st->pause_left_s);
    return finish_ok(out, &y, rc);
}

int bg_render_stats_job(struct bg_buf *out, const struct bg_stats_job *sj)
{
    struct bg_buf y = {0};
    int rc = bg_buf_printf(&y,
        "---\nid: %llu\ntube: %s\nstate: %s\npri: %u\nage: %llu\ndelay: %llu\n"
        "ttr: %llu\ntime-left: %llu\nfile: 0\nreserves: %u\ntimeouts: %u\n"
        "releases: %u\nburies: %u\nkicks: %u\n",
        (unsigned long long)sj->id, sj->tube, sj->state, sj->pri,
        (unsigned long long)sj->age_s, (unsigned long long)sj->delay_s,
        (unsigned long long)sj->ttr_s, (unsigned long long)sj->time_left_s,
        sj->reserves, sj->timeouts, sj->releases, sj->buries, sj->kicks);
    return finish_ok(out, &y, rc);
}
