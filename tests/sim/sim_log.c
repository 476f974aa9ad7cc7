/* sim_log.c - io/eventlog.h into memory (sim_log.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../../io/eventlog.h"
#include "sim_log.h"

static struct {
    char lines[SIM_LOG_LINES][320];
    unsigned next, count;
    int echo;
    char seen[1024];           /* " name name ..." of the events since the clear */
} sim_log;

void sim_log_echo(int on) { sim_log.echo = on; }

void sim_log_clear(void)
{
    sim_log.next = sim_log.count = 0;
    sim_log.seen[0] = '\0';
}

void sim_log_print(void)
{
    unsigned first = (sim_log.next + SIM_LOG_LINES - sim_log.count) % SIM_LOG_LINES;
    for (unsigned i = 0; i < sim_log.count; i++) printf("  log: %s\n", sim_log.lines[(first + i) % SIM_LOG_LINES]);
}

int sim_log_saw(const char *event)
{
    char word[80];
    snprintf(word, sizeof word, " %s ", event);
    return strstr(sim_log.seen, word) != NULL;
}

void log_set_verbosity(int verbose) { (void)verbose; }
int log_enabled(enum bg_log_level level) { return level <= BG_LOG_INFO; }

void log_event(enum bg_log_level level, const char *event, const char *fmt, ...)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    if (level > BG_LOG_INFO) return;
    char *line = sim_log.lines[sim_log.next];
    int n = snprintf(line, sizeof sim_log.lines[0], "level=%s event=%s ", names[level], event);
    if (fmt && n > 0 && (size_t)n < sizeof sim_log.lines[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(line + n, sizeof sim_log.lines[0] - (size_t)n, fmt, ap);
        va_end(ap);
    }
    sim_log.next = (sim_log.next + 1) % SIM_LOG_LINES;
    if (sim_log.count < SIM_LOG_LINES) sim_log.count++;
    size_t used = strlen(sim_log.seen);
    if (!sim_log_saw(event) && used + strlen(event) + 3 < sizeof sim_log.seen)
        snprintf(sim_log.seen + used, sizeof sim_log.seen - used, " %s ", event);
    if (sim_log.echo) printf("  log: %s\n", line);
}

/* Values go into the lines as they are: these lines are for people
 * reading a failing seed, not for a parser. */
const char *log_str(const char *s) { return s ? s : "-"; }
