/* relay — dlshare-relay's core: one UCP worker driven from an epoll loop
 * (the worker's wakeup fd, an eventfd from the serving threads, a signalfd,
 * a 100 ms timerfd for deadlines); peers that connect to --listen and are
 * served; peers named by --connect that are mirrored. Every UCX call is
 * made on the loop's thread; serving threads only talk to the local
 * daemon through libdlshare. */
#ifndef DLSHARE_RELAY_RELAY_H
#define DLSHARE_RELAY_RELAY_H

#include "config.h"

/* Runs until SIGINT or SIGTERM. Returns 0 on a clean stop, 1 when it could
 * not start (after a message on stderr). */
int relay_run(const struct relay_config *cfg);

#endif
