/* log — lines on stderr, sd-daemon prefixes under the journal, a rate limit
 * for what peers cause. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LOG_WINDOW_MS 1000

static const char *const level_names[] = {
	[LOG_ERR] = "error", [LOG_WARNING] = "warning",
	[LOG_NOTICE] = "notice", [LOG_INFO] = "info",
	[LOG_DEBUG] = "debug",
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int level = LOG_INFO;
static int prefix = -1;          /* -1: not decided yet; else 0 or 1 */
static uint32_t rate;            /* 0: no limit */
static uint64_t window_start;    /* ms, monotonic */
static uint32_t window_lines;
static uint64_t suppressed;

void log_set_level(int prio)
{
	level = prio;
}

int log_parse_level(const char *s)
{
	char *end;
	long n;

	for (int i = LOG_ERR; i <= LOG_DEBUG; i++)
		if (level_names[i] && strcmp(s, level_names[i]) == 0)
			return i;
	n = strtol(s, &end, 10);
	if (*s && !*end && n >= LOG_ERR && n <= LOG_DEBUG)
		return (int)n;
	return -1;
}

const char *log_level_name(int prio)
{
	return prio >= LOG_ERR && prio <= LOG_DEBUG ? level_names[prio] : NULL;
}

int log_stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	char tail;

	/* systemd sets "DEV:INO" of the stream it connected stderr (or
	 * stdout) to; a redirected stderr no longer matches it. */
	if (!js || sscanf(js, "%llu:%llu%c", &dev, &ino, &tail) != 2)
		return 0;
	if (fstat(STDERR_FILENO, &st) < 0)
		return 0;
	return (unsigned long long)st.st_dev == dev &&
	       (unsigned long long)st.st_ino == ino;
}

static const char *const prefix_names[] = {
	[LOG_PREFIX_AUTO] = "auto", [LOG_PREFIX_ALWAYS] = "always",
	[LOG_PREFIX_NEVER] = "never",
};

int log_parse_prefix(const char *s)
{
	for (int i = LOG_PREFIX_AUTO; i <= LOG_PREFIX_NEVER; i++)
		if (strcmp(s, prefix_names[i]) == 0)
			return i;
	return -1;
}

const char *log_prefix_name(enum log_prefix p)
{
	return p <= LOG_PREFIX_NEVER ? prefix_names[p] : NULL;
}

void log_set_prefix(enum log_prefix p)
{
	int on = p == LOG_PREFIX_ALWAYS ||
		 (p == LOG_PREFIX_AUTO && log_stderr_is_journal());

	pthread_mutex_lock(&lock);
	prefix = on;
	pthread_mutex_unlock(&lock);
}

void log_set_rate_limit(uint32_t per_second)
{
	pthread_mutex_lock(&lock);
	rate = per_second;
	pthread_mutex_unlock(&lock);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Writes one line; lock held. */
static void emit(int prio, const char *line)
{
	if (prefix < 0)
		prefix = log_stderr_is_journal();
	if (prefix)
		fprintf(stderr, "<%d>%s\n", prio, line);
	else if (prio <= LOG_ERR)
		fprintf(stderr, "error: %s\n", line);
	else if (prio == LOG_WARNING)
		fprintf(stderr, "warning: %s\n", line);
	else
		fprintf(stderr, "%s\n", line);
}

/* Starts a new window when the last one is over, telling what it dropped.
 * Lock held. */
static void roll(uint64_t now)
{
	char line[128];

	if (now - window_start < LOG_WINDOW_MS)
		return;
	if (suppressed) {
		snprintf(line, sizeof(line),
			 "suppressed %llu messages (more than %u a second)",
			 (unsigned long long)suppressed, rate);
		emit(LOG_WARNING, line);
		suppressed = 0;
	}
	window_start = now;
	window_lines = 0;
}

void log_flush(void)
{
	pthread_mutex_lock(&lock);
	if (suppressed)
		roll(now_ms());
	pthread_mutex_unlock(&lock);
}

void log_msg(int prio, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	if (prio > level)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* One event, one line: a peer's name or agent string with a newline
	 * would otherwise forge lines, "<0>" prefix and all. */
	for (char *p = line; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	pthread_mutex_lock(&lock);
	if (rate && (prio == LOG_WARNING || prio >= LOG_INFO)) {
		roll(now_ms());
		if (window_lines >= rate) {
			suppressed++;
			pthread_mutex_unlock(&lock);
			return;
		}
		window_lines++;
	}
	emit(prio, line);
	pthread_mutex_unlock(&lock);
}
