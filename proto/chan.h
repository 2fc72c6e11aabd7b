/* chan — the request channel (protocol 1.9): one request and its reply at a
 * time through a memfd the daemon shares with one connection, beside the
 * socket.
 *
 * A request over the socket costs each side a sendmsg and a recvmsg, and the
 * kernel an skb per packet; through the channel the client writes the frame
 * into the request slot and adds one to an eventfd the daemon polls, and the
 * daemon writes its reply into the reply slot and wakes the client with a
 * futex on the reply's sequence word. Fds never travel this way: a reply
 * that attaches any, or does not fit the slot, goes over the socket, and
 * the slot says so.
 *
 * The two ways are one ordered stream: each side counts the packets it sent
 * and received on the socket. A request in the slot says how many the client
 * had sent before it (the daemon handles it only after it read as many), a
 * reply how many the daemon had sent before it (the client reads as many
 * before it uses the reply). docs/protocol.md, "1.9 — the request channel".
 *
 * The memfd is the daemon's, sealed at its size; the client maps it read and
 * write and may scribble on it at any time: the daemon reads a request's
 * length once, bounds it, and copies the request out before it decodes it,
 * and reads nothing else of the client's. The eventfd is one open file
 * for both, whose O_NONBLOCK the client may clear: the daemon reads it
 * with RWF_NOWAIT (chan_drain), which never blocks.
 */
#ifndef DLSHARE_CHAN_H
#define DLSHARE_CHAN_H

#include <stdatomic.h>
#include <stdint.h>

/* The memfd's size: a page for requests, the rest for replies. */
#define CHAN_BYTES (16u * 1024u)
#define CHAN_REQ_OFF 0u
#define CHAN_REP_OFF 4096u

/* The request slot's head; the frame follows it. */
struct chan_req {
	_Atomic uint32_t seq;     /* the client's request count, set last */
	uint32_t len;             /* bytes of the frame */
	uint64_t sock_sent;       /* packets the client had sent on the
				   * socket before this request */
};

/* How a reply came. */
enum chan_how {
	CHAN_HERE = 1,            /* in the reply slot */
	CHAN_SOCKET = 2,          /* over the socket (it attaches fds, or is
				   * too large for the slot) */
	CHAN_CLOSED = 3,          /* the daemon is closing the connection:
				   * read the socket for its last word */
};

/* The reply slot's head; the frame follows it. */
struct chan_rep {
	_Atomic uint32_t seq;     /* the request answered (futex word), set
				   * last */
	uint32_t how;             /* enum chan_how */
	uint32_t len;             /* bytes of the frame (CHAN_HERE) */
	uint32_t pad;
	uint64_t sock_sent;       /* packets the daemon had sent on the
				   * socket before this reply */
};

#define CHAN_REQ_MAX (CHAN_REP_OFF - CHAN_REQ_OFF - sizeof(struct chan_req))
#define CHAN_REP_MAX (CHAN_BYTES - CHAN_REP_OFF - sizeof(struct chan_rep))

static inline struct chan_req *chan_req_of(void *base)
{
	return (struct chan_req *)((char *)base + CHAN_REQ_OFF);
}

static inline struct chan_rep *chan_rep_of(void *base)
{
	return (struct chan_rep *)((char *)base + CHAN_REP_OFF);
}

static inline uint8_t *chan_req_body(void *base)
{
	return (uint8_t *)(chan_req_of(base) + 1);
}

static inline uint8_t *chan_rep_body(void *base)
{
	return (uint8_t *)(chan_rep_of(base) + 1);
}

/* Wakes whoever waits on w (a word of a shared mapping). Never blocks. */
void chan_wake(_Atomic uint32_t *w);

/* Waits while *w holds v, at most ms milliseconds. Returns 0 when woken or
 * *w no longer held v, -ETIMEDOUT, or -EINTR. */
int chan_wait(_Atomic uint32_t *w, uint32_t v, int ms);

/* Makes the daemon's side of a channel: a memfd of CHAN_BYTES sealed at
 * that size and mapped at *base (*mfd, for the client), and the eventfd
 * (*efd) the client wakes the daemon with. Returns 0 or -errno (nothing
 * left open). */
int chan_make(void **base, int *mfd, int *efd);

/* Reads efd's count to zero without blocking, whatever its flags. Returns
 * 0 (also when there was nothing) or -errno. */
int chan_drain(int efd);

/* 0 when this kernel lets chan_drain read an eventfd without blocking
 * (RWF_NOWAIT on eventfds, Linux 5.12 and later), else -errno. */
int chan_supported(void);

#endif
