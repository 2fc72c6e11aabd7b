/* metrics — the daemon's StatsReply as the Prometheus text exposition
 * format (version 0.0.4): the one table of metric families (name, type,
 * help, labels) that `dlsharectl metrics` prints and dlsharectl(1) lists
 * (man/genmetrics.c prints the list from it at build time). Pure: no
 * socket, no state; any thread.
 */
#ifndef DLSHARE_CLIENT_METRICS_H
#define DLSHARE_CLIENT_METRICS_H

#include <stddef.h>
#include <stdio.h>

#include "dlshare.pb-c.h"

/* Writes sr (NULL: the daemon did not answer, and only dlshare_up 0 is
 * written) as exposition text into a malloc'd, NUL-terminated *text of
 * *len bytes. Returns 0 or -ENOMEM. */
int metrics_render(const Dlshare__StatsReply *sr, char **text, size_t *len);

/* The families as man(7) .TP paragraphs, for dlsharectl(1). */
void metrics_print_man(FILE *out);

#endif
