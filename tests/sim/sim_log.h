/* sim_log.h - io/eventlog.h for the simulator: event lines go to a ring in
 * memory (the last SIM_LOG_LINES), printed when a seed fails, or at once
 * with sim_log_echo. */
#ifndef BEANGATE_SIM_LOG_H
#define BEANGATE_SIM_LOG_H

#define SIM_LOG_LINES 40

void sim_log_echo(int on);
void sim_log_clear(void);
/* Write the lines kept to stdout, oldest first. */
void sim_log_print(void);
/* Nonzero if an event of this name was logged since sim_log_clear. */
int sim_log_saw(const char *event);

#endif
