/* peer — one client of the daemon as the request handlers see it: its conn
 * (packet I/O), its stake in the registry (leases, pending and exported
 * versions), the buffers whose fds it was sent, and its requests in flight
 * (parked gets, GPU creates, seals).
 *
 * A peer embeds its conn and lives as long as it: peer_new makes it at
 * accept, peer_drop lets go of what it holds when its conn closes
 * (dispatch's closed callback), peer_free frees it in the conn's free
 * callback. Loop thread only.
 */
#ifndef DLSHARE_PEER_H
#define DLSHARE_PEER_H

#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "daemon.h"
#include "registry.h"

struct park;
struct wpark;
struct gpu_job;
struct seal_job;
struct mcheck_job;

/* A buffer whose fd this peer already received: in the peer's map by id
 * and on the buffer's list of holders (rbuffer.holders), so that freeing a
 * buffer reaches the peers that have it without a scan of every peer. */
struct sent_buf {
	uint64_t id;
	struct peer *peer;
	struct rbuffer *buf;      /* alive while on its holders list */
	UT_hash_handle hh;        /* peer->sent */
	struct sent_buf *bprev, *bnext; /* buf->holders */
};

struct peer {
	struct conn conn;         /* peer_of_conn() */
	struct daemon *d;
	struct registry_owner owner; /* peer_of_owner() */
	struct sent_buf *sent;
	struct park *parked;      /* gets waiting for a version (get.c) */
	struct wpark *watches;    /* watches waiting for a change (watch.c) */
	struct gpu_job *jobs;     /* creates making GPU memory (create.c) */
	struct seal_job *seals;   /* seals waiting or running (seal.c) */
	struct mcheck_job *mchecks; /* manifests being checked (mcheck.c) */
	struct qwait *qwaits;     /* creates waiting for room in a queue
				   * name (queue.c) */
	uint32_t inflight;        /* requests in flight: parks, jobs, seals */
	uint32_t minor;           /* the protocol minor its Hello said */
	/* Metrics (daemon/metrics.h): the request type an Error sent now
	 * answers (set while a request is handled, and by the modules that
	 * answer later; METRICS_REQ_OTHER between), and the limit the next
	 * Error is about (0: none named). */
	uint8_t answering;
	uint8_t limit_hit;
};

/* peer's Errors from now on answer a request of type r (METRICS_REQ_OTHER:
 * none): errors by type. */
static inline void peer_answering(struct peer *peer, enum metrics_req r)
{
	peer->answering = (uint8_t)r;
}

/* The next Error sent to peer refuses a request at limit l. */
static inline void peer_limit_hit(struct peer *peer, enum metrics_limit l)
{
	peer->limit_hit = (uint8_t)l;
}

/* Makes the peer of fd, an accepted socket, and starts reading from it.
 * Returns 0; -EDQUOT when the peer's uid has its quota of connections (fd
 * stays the caller's, to refuse politely); or another -errno (fd is closed
 * then). */
int peer_new(struct daemon *d, int fd);

static inline struct peer *peer_of_conn(struct conn *c)
{
	return (struct peer *)((char *)c - offsetof(struct peer, conn));
}

static inline struct peer *peer_of_owner(struct registry_owner *o)
{
	return (struct peer *)((char *)o - offsetof(struct peer, owner));
}

/* Records that peer received rb's fd: it hears when rb goes, and is not
 * sent the fd again. Returns 0, or -ENOMEM after which peer is failing. */
int peer_sent_add(struct peer *peer, struct rbuffer *rb);

/* Forgets that peer was sent the fds of the buffers (and manifests) ids,
 * which it says never came (Frame.unreceived, 1.8): the next reply that
 * names one attaches its fd again. Unknown ids are ignored. */
void peer_sent_forget(struct peer *peer, const uint64_t *ids, size_t n);

/* The fds of b go: every peer that has them forgets b and, when still
 * open, is told (BufferGone). */
void peer_buffer_freed(struct rbuffer *b);

/* The per-uid part of conn_may_queue_fds (conn_ops.may_queue_fds). */
int peer_may_queue_fds(struct peer *peer, unsigned nfds,
		       struct refusal *why);

/* Charges delta queued fds to peer's uid and the daemon (conn_ops.queued_fds). */
void peer_queued_fds(struct peer *peer, int delta);

/* Lets go of peer's stake in the registry and of its sent set; its conn is
 * closing, and its requests in flight are gone. */
void peer_drop(struct peer *peer);

/* Frees peer (conn_ops.free). */
void peer_free(struct peer *peer);

#endif
