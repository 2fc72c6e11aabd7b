/* daemon — what the request handlers share: the loop, the limits, the
 * registry, the connections, the counters, and the state of requests that
 * span peers (parked gets by name, daemon-owned GPU memory, seals by uid).
 *
 * server.c puts it together and takes it apart; dispatch and the request
 * modules work in it, each peer through peer->d. It calls nothing above
 * it: the registry's and the conns' callbacks are given to daemon_init.
 * Loop thread only.
 */
#ifndef DLSHARE_DAEMON_H
#define DLSHARE_DAEMON_H

#include <stdint.h>
#include <uv.h>

#include "closer.h"
#include "conn.h"
#include "metrics.h"
#include "registry.h"

/* Named limits of the daemon beyond the registry's, each with a default
 * (server.h) and a flag (config.c). */
struct daemon_limits {
	uint32_t max_packet;      /* bytes in one packet, either way */
	uint32_t max_fds;         /* fds in one packet from a peer */
	uint32_t max_inflight;    /* requests in flight of one connection */
	uint32_t max_connections; /* connections at once */
	uint64_t max_output;      /* bytes queued to one peer before it is cut */
	uint32_t list_page;       /* names in one List answer */
	uint32_t hello_timeout_ms; /* a peer must say Hello within this */
	uint32_t max_out_fds;     /* fds queued to one peer, not yet sent */
	uint32_t uid_seals;       /* seals of one uid on the thread pool */
	uint32_t max_watch_names; /* names in one WatchReply (1.6) */
	uint32_t watch_deletions; /* deletions the change log keeps (1.6) */
	uint32_t board_slots;     /* of the version board, 0: none (1.7) */
	uint32_t channel;         /* 1: request channels (1.9), 0: none */
};

struct waitq;
struct wpark;
struct devmem;
struct seal_uid;
struct mcheck_uid;
struct qwaitq;
struct peer;

/* What create.c calls when a Create that may wait for room finds its queue
 * name full after all (its buffers were made on the thread pool, and other
 * producers filled the queue meanwhile): the request goes back to the
 * queue's gate (queue.c), to wait until deadline (uv_now; UINT64_MAX:
 * none) or go on at once. m is the caller's; the callee copies what it
 * keeps. Given by dispatch (dispatch_init), which knows both modules. */
typedef void daemon_create_full_fn(struct peer *peer, uint64_t id,
				   const Dlshare__Create *m,
				   uint64_t deadline);

struct daemon {
	uv_loop_t *loop;
	const struct daemon_limits *limits;
	struct registry reg;
	struct closer closer;     /* the registry's large fds, closed off
				   * the loop (ops->close_aside) */
	struct board board;       /* the version board (1.7), the registry's */
	struct conn_limits conn_limits; /* from limits, for conns */
	struct conn_set conns;    /* every peer's conn (struct peer) */
	struct waitq *waiters;    /* parked gets by name (get.c) */
	struct devmem *devmem;    /* daemon-owned cuda-ipc memory (create.c) */
	struct seal_uid *seal_uids; /* seals by uid (seal.c) */
	struct mcheck_uid *mcheck_uids; /* manifest checks by uid (mcheck.c) */
	uv_timer_t expire;        /* TTL expiry (expire.c) */
	uint64_t expire_at;       /* when it wakes next; UINT64_MAX: never */
	int expire_open;
	uint64_t nparked;         /* parked gets of every peer */
	struct qwaitq *qwaiters;  /* creates waiting for room, by queue
				   * name (queue.c) */
	uint64_t nqwaiting;       /* those creates, of every peer */
	daemon_create_full_fn *create_full; /* queue.c's, see above */
	uint64_t requests;        /* packets handled */
	struct metrics metrics;   /* counters by type, code, limit, reason */
	uint64_t started_ms;
	/* Watches (watch.c, 1.6): the change log, oldest first; changes
	 * numbered so far; the newest deletion forgotten; deletions in the
	 * log, and the oldest of them; parked watches of every peer (also
	 * counted in nparked). */
	struct registry_link *wlog;
	uint64_t wseq;
	uint64_t wfloor;
	uint32_t wdeleted;
	struct registry_link *wdel_oldest;
	struct wpark *wparks;
};

/* Prepares d: limits (kept by reference) and the packet size before Hello
 * for conns, reg's limits, the registry's and the conns' callbacks (rops
 * get d as their ud). Returns 0 or -ENOMEM; d can be deinited either way.
 */
int daemon_init(struct daemon *d, uv_loop_t *loop,
		const struct daemon_limits *limits, uint32_t hello_packet,
		const struct registry_limits *reg,
		const struct registry_ops *rops, const struct conn_ops *cops);

/* Frees the registry and the receive buffer; every conn must be closed,
 * and what the request modules keep in d freed (dispatch_deinit). */
void daemon_deinit(struct daemon *d);

uint64_t daemon_uptime_ms(const struct daemon *d);

/* Closes n fds a peer sent (or that were made for one) and that nobody
 * keeps, skipping negative ones and setting each to -1: off the loop,
 * through the closer, since the peer may have closed its own copies and
 * left the daemon a large memfd's last reference; at once where the
 * closer cannot take them. */
void daemon_drop_fds(struct daemon *d, int *fds, unsigned n);

#endif
