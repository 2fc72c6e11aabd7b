/* conn — one peer of the daemon: packet I/O under a uv_poll_t, a bounded
 * output queue and the peer's stake in the registry.
 *
 * A conn is OPEN; then FAILING when something went wrong (it no longer reads
 * or sends and waits on the server's doomed list); then CLOSING once
 * server_reap() dropped its queue and registry stake and closed its handle;
 * its memory goes in the close callback. A conn never dies in the middle of
 * a callback that could reach it from the registry: failures only doom it,
 * and the event callbacks reap at their end. Loop thread only.
 */
#ifndef DLSHARE_CONN_H
#define DLSHARE_CONN_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "registry.h"
#include "wire.h"

struct server;
struct park;
struct gpu_job;
struct seal_job;

enum conn_state { CONN_OPEN, CONN_FAILING, CONN_CLOSING };

/* A buffer whose fd this peer already received: in the conn's map by id
 * and on the buffer's list of holders (rbuffer.holders), so that freeing a
 * buffer reaches the peers that have it without a scan of every peer. */
struct sent_buf {
	uint64_t id;
	struct conn *conn;
	struct rbuffer *buf;      /* alive while on its holders list */
	UT_hash_handle hh;        /* conn->sent */
	struct sent_buf *bprev, *bnext; /* buf->holders */
};

/* Forgets that sb's peer has sb's buffer, and frees sb. */
void conn_sent_drop(struct sent_buf *sb);

struct outpkt {
	struct outpkt *next;
	uint8_t *data;
	size_t len;
	unsigned nfds;
	int fds[];                /* our own dups, closed once sent */
};

struct conn {
	struct server *srv;
	uint64_t id;
	int fd;
	enum conn_state state;
	int hello;                /* the handshake is done */
	uv_poll_t poll;
	struct registry_owner owner;
	struct sent_buf *sent;
	struct outpkt *out_head, *out_tail;
	uint64_t out_bytes;
	uint32_t out_fds;         /* fds in the queue (our dups) */
	struct park *parked;
	struct gpu_job *jobs;     /* creates making GPU memory (dispatch.c) */
	struct seal_job *seals;   /* seals waiting or running (seal.c) */
	uint32_t nparked;         /* requests in flight: parks, jobs, seals */
	struct conn *prev, *next; /* server->conns */
	struct conn *doomed_next; /* server->doomed */
	uint64_t born_ms;         /* loop time of accept */
	int armed;                /* events the poll handle waits for */
	const char *why;          /* why it is failing (a static string) */
};

/* Takes over fd, an accepted socket, and starts reading from it.
 * Returns 0; -EDQUOT when the peer's uid has its quota of connections (fd
 * stays the caller's, to refuse politely); or another -errno (fd is closed
 * then). */
int conn_new(struct server *s, int fd);

/* Closes conns that did not say Hello within hello_timeout_ms. */
void conn_sweep(struct server *s);

static inline int conn_open(const struct conn *c)
{
	return c->state == CONN_OPEN;
}

/* Encodes f and queues it with nfds fds (dup'd: the caller keeps its own).
 * Sends at once when the socket takes it. Returns 0, or -errno after which
 * the conn is failing (output limit crossed, encode failure, dead peer). */
int conn_send(struct conn *c, Dlshare__Frame *f, const int *fds,
	      unsigned nfds);

/* Whether nfds more fds may be queued to c: 0, or -EDQUOT with *why
 * naming the limit (per connection, or per uid; a static string). */
int conn_may_queue_fds(struct conn *c, unsigned nfds, const char **why);

/* Sends an Error frame answering request id. Returns as conn_send. */
int conn_send_error(struct conn *c, uint64_t id, int dlshare_code,
		    const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Dooms c: it stops reading and sending and is closed by server_reap().
 * why must be a static string. Safe to call on a failing conn. */
void conn_fail(struct conn *c, const char *why);

/* Drops everything the peer held and closes it now. Only for server_reap()
 * and server_shutdown(); safe to call twice. */
void conn_close(struct conn *c, const char *why);

/* Of a registry owner embedded in a conn, the conn. */
struct conn *conn_of_owner(struct registry_owner *o);

#endif
