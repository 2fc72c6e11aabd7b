/* log — the daemon's log: lines on stderr with sd-daemon(3) priority
 * prefixes ("<3>..."), which the journal turns into priorities. Loop thread
 * or any thread (one fprintf per line). */
#ifndef DLSHARE_LOG_H
#define DLSHARE_LOG_H

#include <syslog.h>

/* Sets the most verbose priority logged (LOG_ERR .. LOG_DEBUG). */
void log_set_level(int prio);
int log_get_level(void);
/* Parses "error", "warning", "notice", "info", "debug" (or 3..7).
 * Returns the priority or -1. */
int log_parse_level(const char *s);

void log_msg(int prio, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define log_err(...) log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARNING, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_NOTICE, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
