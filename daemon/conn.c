/* conn — packet I/O of one peer. */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <dlshare/dlshare.h>
#include <utlist.h>

#include "chan.h"
#include "log.h"

/* At most this many packets read or written per wakeup, so one busy peer
 * cannot starve the others. */
#define CONN_BATCH 32
/* Replies up to this size, with nothing queued before them, are packed on
 * the stack and sent at once (conn_send). */
#define CONN_DIRECT_MAX 1024

int conn_set_init(struct conn_set *set, uv_loop_t *loop,
		  const struct conn_ops *ops, const struct conn_limits *limits)
{
	memset(set, 0, sizeof(*set));
	set->loop = loop;
	set->ops = ops;
	set->limits = limits;
	set->rbuf = malloc(limits->max_packet);
	return set->rbuf ? 0 : -ENOMEM;
}

void conn_set_deinit(struct conn_set *set)
{
	free(set->rbuf);
	set->rbuf = NULL;
	wire_block_free(set->spare);
	set->spare = NULL;
	wire_memo_clear(&set->memo);
}

/* fds entered (delta > 0) or left c's queue: counted here and, through
 * ops->queued_fds, wherever the user charges them. */
static void queued_fds(struct conn *c, int delta)
{
	c->out_fds += delta;
	if (c->set->ops->queued_fds)
		c->set->ops->queued_fds(c, delta);
}

/* Gives up an fd of c's (wire_drop_fn): through ops->close_fd where the
 * user has one. */
static void conn_drop_fd(void *ud, int fd)
{
	struct conn *c = ud;

	if (c->set->ops->close_fd)
		c->set->ops->close_fd(c, fd);
	else
		close(fd);
}


/* Frees a packet that left the queue, giving back its fds' quota. */
static void outpkt_free(struct conn *c, struct outpkt *p)
{
	queued_fds(c, -(int)p->nfds);
	wire_drop_fds(p->fds, p->nfds, conn_drop_fd, c);
	free(p->data);
	free(p);
}

int conn_may_queue_fds(struct conn *c, unsigned nfds, struct refusal *why)
{
	const struct conn_ops *ops = c->set->ops;

	if (!nfds)
		return 0;
	/* fds wait in the queue only while the peer does not read; each is
	 * an open file of the daemon's. */
	if (c->out_fds + nfds > c->set->limits->max_out_fds) {
		*why = (struct refusal){ "fds queued to one connection",
					 METRICS_LIMIT_MAX_OUT_FDS };
		return -EDQUOT;
	}
	return ops->may_queue_fds ? ops->may_queue_fds(c, nfds, why) : 0;
}

static void on_poll(uv_poll_t *h, int status, int events);

static void conn_update_poll(struct conn *c)
{
	int events = 0;

	if (!conn_open(c))
		return;
	/* Reading never pauses for output: a peer that does not read its
	 * replies is cut off at max_output (conn_send), not parked. */
	events |= UV_READABLE;
	if (c->out_head)
		events |= UV_WRITABLE;
	/* libuv 1.44 re-registers the fd with epoll on every start: three
	 * epoll_ctl calls per request when nothing changed. */
	if (events == c->armed)
		return;
	c->armed = events;
	uv_poll_start(&c->poll, events, on_poll);
}

/* One of c's handles is closed: the last frees c. */
static void handle_gone(struct conn *c)
{
	if (--c->handles == 0)
		c->set->ops->free(c);
}

static void on_closed(uv_handle_t *h)
{
	handle_gone(h->data);
}

static void on_chan_closed(uv_handle_t *h)
{
	struct conn *c = h->data;

	free((char *)h - offsetof(struct conn_chan, poll));
	handle_gone(c);
}

/* The channel's last word as c closes: a request the client still waits
 * for, taken or not, is answered CHAN_CLOSED (it then reads the socket,
 * where the reason or the end of file is), so that it does not wait out
 * its timeout. */
static void chan_close(struct conn *c)
{
	struct conn_chan *ch = c->chan;
	struct chan_rep *rep = chan_rep_of(ch->base);
	uint32_t seq = atomic_load_explicit(&chan_req_of(ch->base)->seq,
					    memory_order_acquire);

	/* Not over an answer the client may be reading. */
	if (seq != atomic_load_explicit(&rep->seq, memory_order_relaxed)) {
		rep->how = CHAN_CLOSED;
		atomic_store_explicit(&rep->seq, seq, memory_order_release);
		chan_wake(&rep->seq);
	}
	munmap(ch->base, CHAN_BYTES);
	c->chan = NULL;
	/* ch goes with its handle (on_chan_closed); the fd only after
	 * libuv forgot it. */
	uv_close((uv_handle_t *)&ch->poll, on_chan_closed);
	close(ch->fd);
}

void conn_fail(struct conn *c, const char *why)
{
	if (c->state != CONN_OPEN)
		return;
	c->state = CONN_FAILING;
	c->why = why;
	c->armed = 0;
	/* Inside on_poll the conn is closed (uv_close stops the handle)
	 * before the loop polls again: no stop of its own, which would cost
	 * a second epoll_ctl and libuv's scan of the pending events per peer
	 * (a kill storm's hang-ups). Elsewhere the reap may come later, and a
	 * level-triggered hang-up must not wake the loop until then. */
	if (!c->set->in_poll)
		uv_poll_stop(&c->poll);
	if (!c->set->in_poll && c->chan)
		uv_poll_stop(&c->chan->poll);
	c->doomed_next = c->set->doomed;
	c->set->doomed = c;
}

void conn_close(struct conn *c, const char *why)
{
	struct conn_set *set = c->set;

	if (c->state == CONN_CLOSING)
		return;
	log_info("conn %llu (pid %d uid %u) closed: %s",
		 (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid,
		 why);
	c->state = CONN_CLOSING;
	/* No uv_poll_stop here: uv_close below stops the handle itself, and
	 * each stop is an epoll_ctl plus a scan of the loop's pending events
	 * (libuv's invalidate_fd), which a kill storm pays once per peer. */
	/* The queue first: its fds are charged where ops->closed may free
	 * the record (the peer's uid's, in the daemon). */
	while (c->out_head) {
		struct outpkt *p = c->out_head;

		c->out_head = p->next;
		outpkt_free(c, p);
	}
	c->out_tail = NULL;
	c->out_bytes = 0;
	set->ops->closed(c);
	DL_DELETE(set->conns, c);
	set->n--;
	if (c->chan)
		chan_close(c);
	/* The memory goes in on_closed, after the loop let go of the handle;
	 * the fd only after libuv forgot it. */
	uv_close((uv_handle_t *)&c->poll, on_closed);
	close(c->fd);
	c->fd = -1;
}

void conn_reap(struct conn_set *set)
{
	/* Closing one conn may doom others (their pushes overflow). */
	while (set->doomed) {
		struct conn *c = set->doomed;

		set->doomed = c->doomed_next;
		c->doomed_next = NULL;
		conn_close(c, c->why);
	}
}

/* Sends queued packets, at most CONN_BATCH. Returns 0 or -errno (fatal). */
static int conn_flush(struct conn *c)
{
	for (int i = 0; i < CONN_BATCH && c->out_head; i++) {
		struct outpkt *p = c->out_head;
		int err = wire_send(c->fd, p->data, p->len, p->fds, p->nfds,
				    MSG_DONTWAIT);

		if (err == -EAGAIN)
			return 0;
		if (err)
			return err;
		c->out_head = p->next;
		if (!c->out_head)
			c->out_tail = NULL;
		c->out_bytes -= p->len;
		outpkt_free(c, p);
	}
	return 0;
}

/* Queues len bytes (data, which c takes) with nfds fds (dup'd) behind
 * what c has queued, and sends what the socket takes. Returns as
 * conn_send. */
static int conn_queue(struct conn *c, uint8_t *data, size_t len,
		      const int *fds, unsigned nfds)
{
	const struct conn_limits *lim = c->set->limits;
	struct refusal why;
	struct outpkt *p;
	int err;

	if (c->out_bytes + len > lim->max_output) {
		free(data);
		conn_fail(c, "output limit reached: peer does not read");
		return -ENOBUFS;
	}
	/* Requests that attach fds check conn_may_queue_fds first and answer
	 * with an error; this is the backstop. */
	if (conn_may_queue_fds(c, nfds, &why)) {
		free(data);
		conn_fail(c, "fd limit reached: peer does not read");
		return -ENOBUFS;
	}
	p = calloc(1, sizeof(*p) + nfds * sizeof(int));
	if (!p) {
		free(data);
		conn_fail(c, "out of memory");
		return -ENOMEM;
	}
	p->data = data;
	p->len = len;
	queued_fds(c, (int)nfds);
	/* Our dups: the originals may be closed before this packet leaves. */
	for (unsigned i = 0; i < nfds; i++) {
		p->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
		if (p->fds[i] < 0) {
			err = -errno;
			/* Give back the quota of the dups never made. */
			queued_fds(c, -(int)(nfds - i));
			p->nfds = i;
			outpkt_free(c, p);
			conn_fail(c, "cannot duplicate fd");
			return err;
		}
		p->nfds = i + 1;
	}
	if (c->out_tail)
		c->out_tail->next = p;
	else
		c->out_head = p;
	c->out_tail = p;
	c->out_bytes += len;
	c->tx_packets++;
	err = conn_flush(c);
	if (err) {
		conn_fail(c, "send failed");
		return err;
	}
	conn_update_poll(c);
	return 0;
}

/* Sends buf straight from the caller's memory (with the caller's fds: the
 * kernel takes its own references) when nothing is queued before it.
 * Returns 0 when it went, 1 when it must be queued, or -errno (c is
 * failing). */
static int conn_send_direct(struct conn *c, const uint8_t *buf, size_t len,
			    const int *fds, unsigned nfds)
{
	int err;

	if (c->out_head)
		return 1;
	err = wire_send(c->fd, buf, len, fds, nfds, MSG_DONTWAIT);
	if (err == -EAGAIN)
		return 1;
	if (err)
		conn_fail(c, "send failed");
	else
		c->tx_packets++;
	return err;
}

static int conn_too_large(struct conn *c, int err)
{
	log_warn("conn %llu: reply does not fit a packet (%d)",
		 (unsigned long long)c->id, err);
	conn_fail(c, "reply too large");
	return err;
}

/* conn_send over the socket. */
static int sock_send(struct conn *c, Dlshare__Frame *f, const int *fds,
		     unsigned nfds)
{
	const struct conn_limits *lim = c->set->limits;
	uint8_t *data;
	size_t len;
	int err;

	/* Nothing queued and a small packet (every reply to a get of a
	 * cached buffer): from the stack, and no queue entry when it goes
	 * at once. */
	if (!c->out_head) {
		uint8_t buf[CONN_DIRECT_MAX];
		size_t cap = lim->max_packet < sizeof(buf) ? lim->max_packet :
			     sizeof(buf);

		/* A GetReply of host buffers without protobuf-c's two walks
		 * (wire_pack_fast), any other small frame with them. */
		len = wire_pack_fast(f, buf, cap);
		if (!len) {
			len = dlshare__frame__get_packed_size(f);
			if (len > cap)
				goto queue;
			dlshare__frame__pack(f, buf);
		}
		err = conn_send_direct(c, buf, len, fds, nfds);
		if (err <= 0)
			return err;
	}
queue:
	err = wire_encode(f, lim->max_packet, &data, &len);
	if (err)
		return conn_too_large(c, err);
	return conn_queue(c, data, len, fds, nfds);
}

/* The reply to the channel's request is in its slot (how CHAN_HERE), or
 * went over the socket (CHAN_SOCKET): tells the client. */
static void chan_answered(struct conn *c, uint32_t how, size_t len)
{
	struct chan_rep *rep = chan_rep_of(c->chan->base);

	c->chan->busy = 0;
	rep->how = how;
	rep->len = (uint32_t)len;
	rep->sock_sent = c->tx_packets;
	atomic_store_explicit(&rep->seq, c->chan->seq, memory_order_release);
	chan_wake(&rep->seq);
}

/* Answers the channel's request with f: in the reply slot when it attaches
 * no fds and fits, else over the socket. Returns as conn_send. */
static int chan_send(struct conn *c, Dlshare__Frame *f, const int *fds,
		     unsigned nfds)
{
	uint8_t *body = chan_rep_body(c->chan->base);
	size_t len = 0;
	int err;

	if (!nfds) {
		len = wire_pack_fast(f, body, CHAN_REP_MAX);
		if (!len && dlshare__frame__get_packed_size(f) <= CHAN_REP_MAX)
			len = dlshare__frame__pack(f, body);
	}
	if (len) {
		chan_answered(c, CHAN_HERE, len);
		return 0;
	}
	err = sock_send(c, f, fds, nfds);
	if (c->chan)
		chan_answered(c, CHAN_SOCKET, 0);
	return err;
}

int conn_send(struct conn *c, Dlshare__Frame *f, const int *fds,
	      unsigned nfds)
{
	if (!conn_open(c))
		return -EPIPE;
	f->nfds = nfds;
	f->has_nfds = nfds > 0;
	if (c->chan && c->chan->busy && f->id == c->chan->id)
		return chan_send(c, f, fds, nfds);
	return sock_send(c, f, fds, nfds);
}

/* conn_send_packed over the socket. */
static int sock_send_packed(struct conn *c, const uint8_t *buf, size_t len)
{
	uint8_t *data;
	int err;

	if (len > c->set->limits->max_packet)
		return conn_too_large(c, -E2BIG);
	err = conn_send_direct(c, buf, len, NULL, 0);
	if (err <= 0)
		return err;
	data = malloc(len);
	if (!data) {
		conn_fail(c, "out of memory");
		return -ENOMEM;
	}
	memcpy(data, buf, len);
	return conn_queue(c, data, len, NULL, 0);
}

int conn_send_packed(struct conn *c, uint64_t id, const uint8_t *buf,
		     size_t len)
{
	int err;

	if (!conn_open(c))
		return -EPIPE;
	if (!c->chan || !c->chan->busy || id != c->chan->id)
		return sock_send_packed(c, buf, len);
	if (len <= CHAN_REP_MAX) {
		memcpy(chan_rep_body(c->chan->base), buf, len);
		chan_answered(c, CHAN_HERE, len);
		return 0;
	}
	err = sock_send_packed(c, buf, len);
	if (c->chan)
		chan_answered(c, CHAN_SOCKET, 0);
	return err;
}

int conn_send_error(struct conn *c, uint64_t id, int code, const char *fmt,
		    ...)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Error e = DLSHARE__ERROR__INIT;
	char msg[512];
	va_list ap;

	if (c->set->ops->error_sent)
		c->set->ops->error_sent(c, code);
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	e.code = code;
	e.message = msg;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_ERROR;
	f.error = &e;
	return conn_send(c, &f, NULL, 0);
}

/* A framing error: tell the peer why (best effort) and cut it off. */
static void conn_protocol_error(struct conn *c, const char *why)
{
	/* why is a static string. */
	log_warn("conn %llu (pid %d): protocol error: %s",
		 (unsigned long long)c->id, (int)c->pid, why);
	conn_send_error(c, 0, DLSHARE_EPROTO, "protocol error: %s", why);
	conn_fail(c, why);
}

/* A peer that sends one request and waits for its reply (every get
 * loop) has nothing behind the packet just read: trying for a second
 * costs a recvmsg that fails with EAGAIN, a third of the daemon's system
 * calls per get. When a wakeup found just one packet, the next
 * CONN_SINGLE_RUN wakeups read one and go back to epoll, which is level
 * triggered in libuv: a packet left behind brings the next wakeup at
 * once. Then one wakeup tries again for a batch. */
#define CONN_SINGLE_RUN 16

/* Decodes the len bytes of set->rbuf, a packet that brought nfds fds or
 * (chan) the channel's request, and hands it to ops->frame. */
static void conn_handle(struct conn *c, size_t len, int *fds, unsigned nfds,
			int chan)
{
	struct conn_set *set = c->set;
	struct wire_msg *m;
	int err;

	/* The block is m's now (a nested read finds none). */
	err = wire_decode_in(set->spare, set->rbuf, len, 0, &set->memo, &m);
	set->spare = NULL;
	if (err) {
		wire_drop_fds(fds, nfds, conn_drop_fd, c);
		conn_protocol_error(c, "malformed packet");
		return;
	}
	if (m->frame->nfds != nfds) {
		wire_drop_fds(fds, nfds, conn_drop_fd, c);
		wire_msg_free(m);
		conn_protocol_error(c, "fd count does not match the packet");
		return;
	}
	if (chan) {
		/* Its answer goes back through the channel (conn_send): a
		 * request that wants none (id 0) has no place there. */
		if (m->frame->id == 0) {
			wire_msg_free(m);
			conn_protocol_error(c, "channel request with id 0");
			return;
		}
		c->chan->busy = 1;
		c->chan->id = m->frame->id;
	}
	set->ops->frame(c, m, fds, nfds);
	m = wire_msg_keep(m);
	if (set->spare)
		wire_block_free(m);
	else
		set->spare = m;
}

/* Takes the channel's request when there is a new one and nothing the
 * client sent on the socket before it is unread; its answer goes back
 * through the channel (conn_send). The slot is the client's memory: its
 * length is read once and bounded, and the request copied out before it
 * is decoded. */
static void chan_take(struct conn *c)
{
	struct chan_req *req = chan_req_of(c->chan->base);
	volatile const struct chan_req *vreq = req;
	size_t cap = c->set->limits->max_packet;
	uint32_t seq;
	uint64_t sent;
	size_t len;

	if (c->chan->busy)
		return;
	seq = atomic_load_explicit(&req->seq, memory_order_acquire);
	if (seq == c->chan->seq)
		return;
	sent = vreq->sock_sent;
	if (sent > c->rx_packets) {
		/* What it sent first is not read yet: conn_read comes back
		 * here after each packet. */
		c->chan->behind = 1;
		return;
	}
	c->chan->behind = 0;
	len = vreq->len;
	if (len == 0 || len > CHAN_REQ_MAX || len > cap) {
		conn_protocol_error(c, "channel request larger than its slot");
		return;
	}
	memcpy(c->set->rbuf, chan_req_body(c->chan->base), len);
	c->chan->seq = seq;
	/* A frame that fails to decode is a protocol error: its answer goes
	 * over the socket, and CHAN_CLOSED follows as c closes. */
	conn_handle(c, len, NULL, 0, 1);
	/* Nothing answered it now: it waits (a parked get), and its answer
	 * comes later through conn_send. */
}

static void on_chan_poll(uv_poll_t *h, int status, int events)
{
	struct conn *c = h->data;
	struct conn_set *set = c->set;

	(void)events;
	set->in_poll++;
	if (status < 0) {
		conn_fail(c, "poll failed");
	} else if (conn_open(c)) {
		/* The count to zero; a later wakeup makes it readable
		 * again (the loop is level triggered). */
		if (chan_drain(c->chan->fd))
			conn_fail(c, "channel read failed");
		else
			chan_take(c);
	}
	conn_reap(set);
	set->in_poll--;
}

int conn_chan_open(struct conn *c, int *mfd, int *efd)
{
	struct conn_chan *ch;
	int err;

	if (c->chan)
		return -EEXIST;
	if (!(ch = calloc(1, sizeof(*ch))))
		return -ENOMEM;
	err = chan_make(&ch->base, mfd, &ch->fd);
	if (err) {
		free(ch);
		return err;
	}
	err = uv_poll_init(c->set->loop, &ch->poll, ch->fd);
	if (err) {
		munmap(ch->base, CHAN_BYTES);
		close(ch->fd);
		close(*mfd);
		free(ch);
		return -ENOMEM;
	}
	ch->poll.data = c;
	c->handles++;
	c->chan = ch;
	*efd = ch->fd;
	uv_poll_start(&ch->poll, UV_READABLE, on_chan_poll);
	return 0;
}

static void conn_read(struct conn *c)
{
	struct conn_set *set = c->set;
	const struct conn_limits *lim = set->limits;
	int single = c->read_single > 0;

	if (single)
		c->read_single--;
	for (int i = 0; i < CONN_BATCH && conn_open(c); i++) {
		int fds[WIRE_FDS_MAX];
		unsigned nfds = 0;
		size_t len = 0, cap;
		int err;

		/* Before Hello a peer is unknown: it gets a small packet. */
		cap = c->hello ? lim->max_packet : lim->hello_packet;
		/* Every fd a peer sends is the daemon's to close, and the
		 * peer may have closed its own: a large memfd's last
		 * reference. None is closed here (conn_drop_fd). */
		err = wire_recv_ex(c->fd, set->rbuf, cap, fds,
				   c->hello ? lim->max_fds : 0, &len, &nfds,
				   MSG_DONTWAIT, conn_drop_fd, c);
		if (err == -EAGAIN) {
			if (i == 1)
				c->read_single = CONN_SINGLE_RUN;
			return;
		}
		if (err == -ECONNRESET) {
			/* The peer closed with packets of ours unread: the
			 * kernel says so once, ahead of the packets the peer
			 * sent last, which are still read (a Release sent
			 * just before the close must count, or a released
			 * take would go back to its queue); end of file
			 * follows them. */
			continue;
		}
		if (err == -EMSGSIZE) {
			conn_protocol_error(c, "packet larger than the limit");
			return;
		}
		if (err == -EPROTO) {
			conn_protocol_error(c, "too many fds in one packet");
			return;
		}
		if (err == -EMFILE) {
			/* Not the peer's doing, but its request cannot be
			 * served whole; --max-open-fds is there to keep the
			 * daemon from this. */
			wire_drop_fds(fds, nfds, conn_drop_fd, c);
			log_warn("conn %llu (pid %d): out of file descriptors "
				 "(RLIMIT_NOFILE) for the fds of a packet",
				 (unsigned long long)c->id, (int)c->pid);
			conn_send_error(c, 0, DLSHARE_ELIMIT,
					"the daemon is out of file descriptors "
					"(RLIMIT_NOFILE): a packet's fds could "
					"not be received");
			conn_fail(c, "out of fds to receive");
			return;
		}
		if (err) {
			conn_fail(c, "receive failed");
			return;
		}
		if (len == 0 && nfds == 0) {
			conn_fail(c, "peer hung up");
			return;
		}
		c->rx_packets++;
		conn_handle(c, len, fds, nfds, 0);
		/* A request of the channel's that waited for this one. */
		if (c->chan && c->chan->behind && conn_open(c))
			chan_take(c);
		if (single)
			return;
	}
}

static void on_poll(uv_poll_t *h, int status, int events)
{
	struct conn *c = h->data;
	struct conn_set *set = c->set;

	set->in_poll++;
	if (status == UV_ECONNRESET || status == UV_EPIPE ||
	    status == UV_EBADF) {
		/* A peer that closed with data of ours still unread shows up
		 * as a reset (POLLERR, which libuv reports as EBADF): a
		 * hang-up, not a daemon problem. What it sent before it
		 * closed is read first (conn_read), as after an orderly
		 * close; libuv stopped the handle, so it is armed again for
		 * what one batch leaves. */
		c->armed = 0;
		if (conn_open(c))
			conn_read(c);
		conn_update_poll(c);
	} else if (status < 0) {
		conn_fail(c, "poll failed");
	} else {
		if ((events & UV_WRITABLE) && conn_flush(c))
			conn_fail(c, "send failed");
		if ((events & UV_READABLE) && conn_open(c))
			conn_read(c);
		conn_update_poll(c);
	}
	/* c is not freed before the loop runs its close callback. Every
	 * conn doomed in this callback is closed here (in_poll). */
	conn_reap(set);
	set->in_poll--;
}

void conn_sweep(struct conn_set *set)
{
	uint64_t now = uv_now(set->loop);
	uint32_t limit = set->limits->hello_timeout_ms;
	struct conn *c;

	/* A peer that never says Hello holds a slot for nothing. */
	DL_FOREACH(set->conns, c)
		if (conn_open(c) && !c->hello && now - c->born_ms >= limit) {
			log_info("conn %llu (pid %d uid %u): no Hello within %u ms",
				 (unsigned long long)c->id, (int)c->pid,
				 (unsigned)c->uid, limit);
			conn_fail(c, "no Hello in time");
		}
	conn_reap(set);
}

int conn_init(struct conn *c, struct conn_set *set, int fd)
{
	struct ucred cred;
	socklen_t clen = sizeof(cred);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0)
		return -errno;
	c->set = set;
	c->id = ++set->next_id;
	c->fd = fd;
	c->state = CONN_OPEN;
	c->pid = cred.pid;
	c->uid = cred.uid;
	c->gid = cred.gid;
	c->born_ms = uv_now(set->loop);
	return 0;
}

int conn_start(struct conn *c)
{
	struct conn_set *set = c->set;
	int err = uv_poll_init(set->loop, &c->poll, c->fd);

	if (err)
		return err;
	c->poll.data = c;
	c->handles = 1;
	DL_APPEND(set->conns, c);
	set->n++;
	log_debug("conn %llu: pid %d uid %u gid %u",
		  (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid,
		  (unsigned)c->gid);
	c->armed = UV_READABLE;
	uv_poll_start(&c->poll, UV_READABLE, on_poll);
	return 0;
}
