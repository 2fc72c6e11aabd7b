/* watch — Watch requests (protocol 1.6): "tell me when some name under this
 * prefix changes after point N". The daemon numbers every change (a
 * version sealed as a name's newest, a name deleted) with one daemon-wide
 * counter and keeps a log with one node per name, ordered by its last
 * change, plus the newest --watch-deletions deletions. A Watch walks the
 * log from its point on (never every name); one that finds nothing may
 * park, and a change wakes only the parked watches whose prefix holds the
 * name and whose peer may read it. A live name's node is its entry's link
 * (entry->wl); a deletion's is this module's. Loop thread only.
 */
#ifndef DLSHARE_WATCH_H
#define DLSHARE_WATCH_H

#include <stdint.h>

#include "daemon.h"
#include "peer.h"

/* Names one WatchReply reports at most (--max-watch-names). */
#define WATCH_NAMES_DEFAULT 256u
/* Deletions the log remembers (--watch-deletions): a watcher further
 * behind is told it lost some (WatchReply.lost). */
#define WATCH_DELETIONS_DEFAULT 4096u

/* Handles a Watch of peer: answered now, or parked. */
void watch_request(struct peer *peer, uint64_t id, const Dlshare__Watch *m);

/* A version of e became its newest (the registry's published callback). */
void watch_published(struct daemon *d, struct entry *e);

/* e leaves the name map (deleted, or its last version died): a deletion.
 * The registry's removed callback. */
void watch_removed(struct daemon *d, struct entry *e);

/* peer is closing: its parked watches go unanswered. */
void watch_peer_closed(struct peer *peer);

/* Frees the log at shutdown (every peer closed). */
void watch_deinit(struct daemon *d);

#endif
