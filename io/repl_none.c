/* repl_none.c - replication in a build without libnats (BEANGATE_NATS=OFF,
 * or AUTO without libnats-dev): the settings parse, and starting with
 * --replicate says it is unavailable (repl.h). */
#include "../core/core.h"
#include "eventlog.h"
#include "repl.h"

int repl_available(void) { return 0; }

int repl_open(struct repl **out, const struct repl_config *cfg, struct event_base *base,
              const struct repl_events *ev)
{
    (void)out, (void)base, (void)ev;
    log_event(BG_LOG_ERROR, "replication_unavailable", "servers=%s msg=%s", log_str(cfg->servers),
              log_str("replication unavailable: built without libnats (install libnats-dev and "
                      "build again, or start without --replicate)"));
    return BG_BAD_FORMAT;
}

int repl_append(struct repl *r, const char *data, size_t len, uint64_t *first_seq)
{
    (void)r, (void)data, (void)len, (void)first_seq;
    return REPL_STOPPED;
}

int repl_purge(struct repl *r, uint64_t seq) { (void)r, (void)seq; return BG_IO_ERROR; }
void repl_stop(struct repl *r) { (void)r; }
void repl_stop_within(struct repl *r, uint32_t ms) { (void)r, (void)ms; }
void repl_get_stats(const struct repl *r, struct repl_stats *out) { (void)r; *out = (struct repl_stats){0}; }
const char *repl_role_name(enum repl_role role) { (void)role; return "none"; }
void repl_close(struct repl *r) { (void)r; }
