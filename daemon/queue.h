/* queue — producers waiting for room in a queue name. A Create into a
 * full queue name that may wait is parked here, by name, a copy of the
 * request kept (bounded: it counts as a request in flight of its peer),
 * until a version of the name is consumed (the registry's queue_room), its
 * timeout or its peer's end; then it runs again as if it came now. Waiters
 * of one name go in arrival order, and a new Create waits behind them. One
 * whose buffers were made on the thread pool and that found the queue full
 * after all comes back (queue_create_full), behind those waiting then.
 * The registry's side of queue names (depth, take, redelivery) is in
 * registry.c; takes are parked by get.c. Loop thread only.
 */
#ifndef DLSHARE_QUEUE_H
#define DLSHARE_QUEUE_H

#include <stdint.h>

#include "daemon.h"
#include "peer.h"

struct qwait;

/* Whether a Create of name m must wait or fail for room: 0 (go on), or 1
 * when this call answered or parked it. Only for requests asking for a
 * queue (m->has_queue_depth). */
int queue_create_gate(struct peer *peer, uint64_t id, const Dlshare__Create *m);

/* daemon->create_full (dispatch gives it): m, which may wait, found its
 * queue full once its buffers were made on the thread pool. It goes
 * through the gate again: parked behind the name's waiters until deadline
 * (its first one: the wait does not restart), refused when that passed,
 * or on to create_resume when there is room now. */
void queue_create_full(struct peer *peer, uint64_t id,
		       const Dlshare__Create *m, uint64_t deadline);

/* How many creates wait for room in name. */
uint32_t queue_waiting(struct daemon *d, const char *name);

/* The registry's queue_room callback: wakes the first waiter of name (on
 * the next turn of the loop, never inside the registry). */
void queue_room(struct daemon *d, const char *name);

/* peer is closing: its waiting creates go unanswered. */
void queue_peer_closed(struct peer *peer);

/* Frees what is left at shutdown (nothing, once every peer closed). */
void queue_deinit(struct daemon *d);

#endif
