/* stats — Stats requests: the daemon's gauges and, when asked (protocol
 * 1.5, Stats.counters), its counters by type, code, limit and reason, the
 * live buffers by kind and device, the per-uid quotas and what the uids
 * nearest them use. The reply is built on the stack from counters kept
 * elsewhere (struct daemon, struct metrics, the registry): answering costs
 * a walk of the uid table and nothing on any other request. Loop thread
 * only.
 */
#ifndef DLSHARE_STATS_H
#define DLSHARE_STATS_H

#include <stdint.h>

#include "peer.h"

/* Per-uid rows one StatsReply carries at most: uids (1.4, by bytes) and
 * usage (1.5, nearest a quota first). */
#define STATS_UIDS_MAX 64u

/* Answers a Stats of peer. */
void stats_request(struct peer *peer, uint64_t id, const Dlshare__Stats *m);

#endif
