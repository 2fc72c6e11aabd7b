/* expire — the one timer that deletes the names whose TTL passed.
 *
 * The registry keeps the names with a TTL in a min-heap by expiry
 * (daemon/lifetime.c); this wakes at its top, deletes at most
 * EXPIRE_BATCH names per wakeup, and sleeps again until the next one is due.
 * The timer is embedded in struct daemon. Loop thread only.
 */
#ifndef DLSHARE_EXPIRE_H
#define DLSHARE_EXPIRE_H

#include "daemon.h"

/* Names deleted by their TTL in one wakeup of the loop: a million names
 * expiring at once cost many short turns, not one long one. */
#define EXPIRE_BATCH 256u

/* Starts the timer's life (stopped). */
void expire_init(struct daemon *d);
/* Closes the timer; expire_arm does nothing afterwards. */
void expire_close(struct daemon *d);
/* Wakes at the registry's next expiry, if that is earlier than the wakeup
 * already planned (the registry's ops->expiry_changed). */
void expire_arm(struct daemon *d);

#endif
