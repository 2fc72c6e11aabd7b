/* get — Get requests. A get that finds its version is answered at once:
 * a lease, and each buffer's fd the first time its peer needs it. One that
 * finds none and may wait is parked, by name (which need not exist yet),
 * until a version it matches is published (get_published), its timeout
 * (a timer per park) or its peer goes. Parked gets count as requests in
 * flight of their peer. Loop thread only.
 */
#ifndef DLSHARE_GET_H
#define DLSHARE_GET_H

#include <stdint.h>

#include "daemon.h"
#include "peer.h"

struct park;
struct waitq;

/* A sealed version's reply to a warm get (one that needs no fd) is kept
 * packed with it, less its request id and lease, when it is at most this
 * many bytes (a version of about a dozen tensors); longer ones are
 * encoded each time. */
#define GET_TAIL_MAX 1024

/* Handles a Get of peer: answered now, or parked. */
void get_request(struct peer *peer, uint64_t id, const Dlshare__Get *m);

/* Handles a Take of peer (a queue name): the oldest queued version now,
 * or parked like a get until one is queued (get_published). */
void take_request(struct peer *peer, uint64_t id, const Dlshare__Take *m);

/* A version of e was published: answers the parked gets of its name that
 * it, or an error (the name's mode changed), settles. The registry's
 * published callback. */
void get_published(struct daemon *d, const struct entry *e);

/* peer is closing: its parked gets go unanswered. */
void get_peer_closed(struct peer *peer);

/* Frees what is left at shutdown (nothing, once every peer closed). */
void get_deinit(struct daemon *d);

#endif
