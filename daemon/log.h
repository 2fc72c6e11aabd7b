/* log — the daemon's log: one line per event on stderr.
 *
 * Under systemd (stderr is the journal's stream, as JOURNAL_STREAM says) or
 * with --log-prefix=always, each line starts with an sd-daemon(3) priority
 * prefix ("<3>..."), which the journal turns into a priority; otherwise lines
 * are plain, for a person at a terminal. Error and notice lines tell the
 * daemon's own story and are never dropped; warning, info and debug lines are
 * what peers cause, so a misbehaving peer could flood them: past the rate
 * limit they are dropped and counted, and one line says how many. Control
 * characters become '?', so a peer's string cannot forge a line. Never log a
 * CUDA IPC handle or any other bearer token. Any thread (a mutex orders
 * lines).
 */
#ifndef DLSHARE_LOG_H
#define DLSHARE_LOG_H

#include <stdint.h>
#include <syslog.h>

enum log_prefix {
	LOG_PREFIX_AUTO,   /* prefixes when stderr is the journal */
	LOG_PREFIX_ALWAYS,
	LOG_PREFIX_NEVER,
};

/* Sets the most verbose priority logged (LOG_ERR .. LOG_DEBUG). */
void log_set_level(int prio);
/* Parses "error", "warning", "notice", "info", "debug" (or 3..7).
 * Returns the priority or -1. */
int log_parse_level(const char *s);
/* The name log_parse_level reads back, or NULL. */
const char *log_level_name(int prio);

/* Decides about prefixes now (AUTO looks at JOURNAL_STREAM and stderr).
 * Until it is called the first line decides, as AUTO. */
void log_set_prefix(enum log_prefix p);
/* Parses "auto", "always", "never". Returns the value or -1. */
int log_parse_prefix(const char *s);
const char *log_prefix_name(enum log_prefix p);
/* 1 when stderr is the stream JOURNAL_STREAM names, else 0. */
int log_stderr_is_journal(void);

/* At most per_second warning, info and debug lines each second; 0: no
 * limit (the default until called). */
void log_set_rate_limit(uint32_t per_second);
/* Reports lines dropped in a second that is over. Call it now and then (the
 * daemon does from its status timer) so a flood that stopped is told. */
void log_flush(void);

void log_msg(int prio, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define log_err(...) log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARNING, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_NOTICE, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
