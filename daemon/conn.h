/* conn — packet I/O of one peer: a SOCK_SEQPACKET socket under a uv_poll_t,
 * whole packets in (one Frame and the fds it says it carries), and a
 * bounded output queue.
 *
 * A conn knows nothing of what packets mean. Its user embeds it in a
 * per-peer struct of its own (container_of) and gives every conn of a
 * struct conn_set the same table of callbacks (struct conn_ops) and the same
 * limits (struct conn_limits).
 *
 * A request may also come through c's request channel (conn_chan_open),
 * and its answer then goes back there unless it attaches fds: ops->frame
 * and conn_send are the same either way.
 *
 * A conn is OPEN; then FAILING when something went wrong (it no longer reads
 * or sends and waits on its set's doomed list); then CLOSING once
 * conn_reap() dropped its queue, told ops->closed and closed its handle;
 * ops->free gets it in the handle's close callback. A conn never dies in the
 * middle of a callback: failures only doom it, and whoever runs a libuv
 * callback that may doom one calls conn_reap() at its end. Loop thread only.
 */
#ifndef DLSHARE_CONN_H
#define DLSHARE_CONN_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "metrics.h"
#include "wire.h"

struct conn;

enum conn_state { CONN_OPEN, CONN_FAILING, CONN_CLOSING };

/* What a conn may cost and receive; the conn_set's user keeps it alive. */
struct conn_limits {
	uint32_t max_packet;      /* bytes in one packet, either way */
	uint32_t max_fds;         /* fds in one packet from a peer */
	uint32_t hello_packet;    /* bytes in one packet before Hello (which
				   * carries no fds); <= max_packet */
	uint32_t hello_timeout_ms; /* a peer must say Hello within this */
	uint64_t max_output;      /* bytes queued to a peer before it is cut */
	uint32_t max_out_fds;     /* fds queued to a peer, not yet sent */
};

/* What a conn tells its user. Every callback runs on the loop thread, from
 * a conn's own poll callback or from conn_reap(). */
struct conn_ops {
	/* A whole packet from c: decoded, with exactly the fds its frame says
	 * it carries, which the callee takes over (closes or keeps). c may
	 * be failing on return; it is not freed before conn_reap(). */
	void (*frame)(struct conn *c, const struct wire_msg *m, int *fds,
		      unsigned nfds);
	/* Whether nfds more fds may be queued to c as far as limits beyond
	 * c's own go (quotas shared with other conns): 0, or -EDQUOT with
	 * *why naming the limit (a static string). May be NULL. */
	int (*may_queue_fds)(struct conn *c, unsigned nfds, struct refusal *why);
	/* delta fds entered (> 0) or left (< 0) c's queue: charge or refund
	 * them where may_queue_fds counts them. May be NULL. */
	void (*queued_fds)(struct conn *c, int delta);
	/* Takes a dup that left c's queue, to close (where the loop need not
	 * wait: it may be a buffer's last reference, whose close frees its
	 * pages). May be NULL: closed at once. */
	void (*close_fd)(struct conn *c, int fd);
	/* c is closing: its queue is gone, its handle not yet. The user
	 * drops what the peer held; c must not be sent to any more. */
	void (*closed)(struct conn *c);
	/* The loop let go of c's handle: free the struct that embeds c. */
	void (*free)(struct conn *c);
	/* An Error with this DLSHARE_E* code is being sent to c (counted
	 * by the user: metrics). May be NULL. */
	void (*error_sent)(struct conn *c, int code);
};

/* The conns of one loop: their callbacks and limits, the one receive
 * buffer they share (each packet is handled as soon as it is read), the
 * list of them, and the doomed ones conn_reap() closes. */
struct conn_set {
	uv_loop_t *loop;
	const struct conn_ops *ops;
	const struct conn_limits *limits;
	uint8_t *rbuf;            /* limits->max_packet bytes */
	struct wire_msg *spare;   /* the last packet's decode block, for
	                           * the next (wire_decode_in) */
	/* The last Get's body, decoded: the next Get of the same bytes,
	 * from any conn, is not decoded again (wire_memo). */
	struct wire_memo memo;
	struct conn *conns;       /* started, not yet closing */
	uint32_t n;               /* of them */
	struct conn *doomed;      /* failing, closed by conn_reap() */
	uint64_t next_id;
	unsigned in_poll;         /* inside on_poll, which reaps before it
	                           * returns to the loop */
};

struct outpkt {
	struct outpkt *next;
	uint8_t *data;
	size_t len;
	unsigned nfds;
	int fds[];                /* our own dups, closed once sent */
};

/* A conn's request channel (1.9, proto/chan.h), made by conn_chan_open:
 * apart, so that a connection without one costs a pointer. */
struct conn_chan {
	void *base;               /* the memfd, mapped */
	int fd;                   /* the eventfd the peer wakes us with */
	uv_poll_t poll;
	uint32_t seq;             /* the last request taken */
	int busy;                 /* taken and not yet answered... */
	uint64_t id;              /* ...the Frame.id of that request */
	int behind;               /* a request waits for socket packets sent
				   * before it */
};

struct conn {
	struct conn_set *set;
	uint64_t id;              /* daemon-wide, never reused */
	int fd;
	enum conn_state state;
	int hello;                /* the peer said Hello (its user sets it):
				   * max_packet and max_fds apply, and
				   * hello_timeout_ms no longer does */
	pid_t pid;                /* SO_PEERCRED at accept */
	uid_t uid;
	gid_t gid;
	uv_poll_t poll;
	struct outpkt *out_head, *out_tail;
	uint64_t out_bytes;
	uint32_t out_fds;         /* fds in the queue (our dups) */
	struct conn *prev, *next; /* set->conns */
	struct conn *doomed_next; /* set->doomed */
	uint64_t born_ms;         /* loop time of conn_init */
	int armed;                /* events the poll handle waits for */
	/* Wakeups left that read one packet and do not try a second
	 * (conn_read): set when the peer sends one request at a time. */
	unsigned read_single;
	const char *why;          /* why it is failing (a static string) */
	unsigned handles;         /* libuv handles not yet closed */
	/* Packets received and sent on the socket: the order of the socket
	 * and the request channel (proto/chan.h). */
	uint64_t rx_packets;
	uint64_t tx_packets;
	struct conn_chan *chan;   /* its request channel (1.9), or NULL */
};

/* Prepares set for conns on loop with ops and limits (both kept by
 * reference). Returns 0 or -ENOMEM. */
int conn_set_init(struct conn_set *set, uv_loop_t *loop,
		  const struct conn_ops *ops, const struct conn_limits *limits);

/* Frees what set holds; its conns must be closed and their handles too
 * (the loop ran). Safe on a set that conn_set_init failed on or never saw,
 * if it was zeroed. */
void conn_set_deinit(struct conn_set *set);

/* Makes c (zeroed by the caller) the conn of fd, an accepted socket, and
 * reads its peer's credentials (SO_PEERCRED). Nothing polls yet. Returns 0
 * or -errno; fd stays the caller's either way until conn_start. */
int conn_init(struct conn *c, struct conn_set *set, int fd);

/* Starts reading from c's fd; c joins its set, and its fd is c's from now
 * on. Returns 0 or a libuv error (then nothing changed). */
int conn_start(struct conn *c);

static inline int conn_open(const struct conn *c)
{
	return c->state == CONN_OPEN;
}

/* Encodes f and queues it with nfds fds (dup'd: the caller keeps its own).
 * Sends at once when the socket takes it. Returns 0, or -errno after which
 * the conn is failing (output limit crossed, encode failure, dead peer). */
int conn_send(struct conn *c, Dlshare__Frame *f, const int *fds,
	      unsigned nfds);
/* Sends a packet already packed (len bytes, no fds; the answer to request
 * id) as conn_send sends a frame: at once from buf when it can, else a copy
 * queued. */
int conn_send_packed(struct conn *c, uint64_t id, const uint8_t *buf,
		     size_t len);

/* Makes c's request channel (1.9, proto/chan.h) and starts polling it.
 * Returns 0 with the memfd (*mfd) and the eventfd (*efd) for the peer: the
 * caller sends both and closes *mfd (*efd stays c's); or -errno (c goes
 * without). */
int conn_chan_open(struct conn *c, int *mfd, int *efd);

/* Whether nfds more fds may be queued to c: 0, or -EDQUOT with *why
 * naming the limit (per connection, or ops->may_queue_fds's; a static
 * string). */
int conn_may_queue_fds(struct conn *c, unsigned nfds, struct refusal *why);

/* Sends an Error frame answering request id. Returns as conn_send. */
int conn_send_error(struct conn *c, uint64_t id, int dlshare_code,
		    const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Dooms c: it stops reading and sending and is closed by conn_reap().
 * why must be a static string. Safe to call on a failing conn. */
void conn_fail(struct conn *c, const char *why);

/* Drops c's queue, tells ops->closed and closes it now. Only for
 * conn_reap() and a daemon shutting down; safe to call twice. */
void conn_close(struct conn *c, const char *why);

/* Closes every doomed conn of set. Called at the end of each libuv
 * callback that may doom one, never inside the registry. */
void conn_reap(struct conn_set *set);

/* Dooms the conns of set that did not say Hello within hello_timeout_ms,
 * and reaps. */
void conn_sweep(struct conn_set *set);

#endif
