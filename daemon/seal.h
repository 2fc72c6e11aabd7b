/* seal — Seal requests, with the write seal on libuv's thread pool.
 *
 * F_ADD_SEALS(F_SEAL_WRITE) waits in the kernel while pages of the memfd
 * are pinned (vmsplice, O_DIRECT, RDMA): about 150 ms, then EBUSY, and the
 * peer that pinned them decides how often. So the loop never makes that
 * call: a Seal begins on the loop (registry_seal_begin: the version is
 * "sealing"), a worker seals the host buffers, and the loop ends it
 * (registry_seal_end) and answers. A seal counts as a request in flight of
 * its conn, waiting or running.
 *
 * The pool is small (UV_THREADPOOL_SIZE, 4 by default) and GPU creates use
 * it too: at most uid_seals seals of one uid run at once, the others wait
 * in their uid's queue, first come first served. A uid that stalls its
 * seals stalls only its own. Loop thread only (seal_work excepted).
 */
#ifndef DLSHARE_SEAL_H
#define DLSHARE_SEAL_H

#include "daemon.h"
#include "peer.h"

struct seal_job;
struct seal_uid;

/* Handles a Seal of peer: answered now with an error, or later. */
void seal_request(struct peer *peer, uint64_t id, const Dlshare__Seal *m);

/* peer is closing: its waiting seals are dropped (their versions are
 * pending again, for registry_owner_drop), its running ones end without
 * it. */
void seal_peer_closed(struct peer *peer);

/* Pools daemon-owned CUDA events (a struct gpu_events) for the next seals
 * (gpu_events_recycle), and destroys those beyond the pool off the loop. */
void seal_events_free(struct daemon *d, void *g);

/* Frees what is left at shutdown (nothing, once the loop ran dry). */
void seal_deinit(struct daemon *d);

#endif
