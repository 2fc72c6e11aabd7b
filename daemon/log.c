/* log — sd-daemon style lines on stderr. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int level = LOG_INFO;

void log_set_level(int prio)
{
	level = prio;
}

int log_get_level(void)
{
	return level;
}

int log_parse_level(const char *s)
{
	static const char *const names[] = {
		[LOG_ERR] = "error", [LOG_WARNING] = "warning",
		[LOG_NOTICE] = "notice", [LOG_INFO] = "info",
		[LOG_DEBUG] = "debug",
	};
	char *end;
	long n;

	for (int i = LOG_ERR; i <= LOG_DEBUG; i++)
		if (names[i] && strcmp(s, names[i]) == 0)
			return i;
	n = strtol(s, &end, 10);
	if (*s && !*end && n >= LOG_ERR && n <= LOG_DEBUG)
		return (int)n;
	return -1;
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
	fprintf(stderr, "<%d>%s\n", prio, line);
}
