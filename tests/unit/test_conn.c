/* test_conn — module tests of daemon/conn: one peer's packet I/O over a
 * SOCK_SEQPACKET socketpair, with a private libuv loop run by hand and a
 * table of callbacks that records what the conn told its user. No
 * dispatch, no registry, no daemon.
 *
 * The test holds the peer's end (t->peer) and speaks raw packets through
 * proto/wire; the conn under test holds the other end.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "fds.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

#include "conn.h"
#include "log.h"
#include "wire.h"

#define T_MAX_PACKET 4096u
#define T_HELLO_PACKET 512u
#define T_MAX_FDS 4u
#define T_MAX_OUTPUT (64u * 1024u)
#define T_MAX_OUT_FDS 8u

/* What the conn told us about one conn, and the conn itself. */
struct tconn {
	struct conn conn;
	int frames;               /* ops.frame calls */
	int last_case;            /* the last frame's body */
	uint64_t last_id;
	unsigned last_nfds;
	int fds_open;             /* the last frame's fds were open */
	int closed;               /* ops.closed calls */
	int queued_at_close;      /* out_fds when ops.closed ran */
	int64_t queued;           /* sum of ops.queued_fds deltas */
	int freed;                /* ops.free ran (the memory goes at the
				   * end of the test, so that it can look) */
};

struct fix {
	uv_loop_t loop;
	struct conn_set set;
	struct conn_limits lim;
	int fd_base;              /* before the test */
	int fd_loop;              /* with the loop and the set, no conn */
	int quota;                /* fds ops.may_queue_fds lets through */
	int freed;                /* ops.free calls */
	struct tconn *t[4];       /* every conn opened */
	unsigned nt;
	int peer;                 /* the test's end of the last socketpair */
};

static struct fix *cur;       /* the running test's, for the callbacks */

static struct tconn *tconn_of(struct conn *c)
{
	return (struct tconn *)((char *)c - offsetof(struct tconn, conn));
}

static int fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

static void on_frame(struct conn *c, const struct wire_msg *m, int *fds,
		     unsigned nfds)
{
	struct tconn *t = tconn_of(c);

	t->frames++;
	t->last_case = (int)m->frame->body_case;
	t->last_id = m->frame->id;
	t->last_nfds = nfds;
	t->fds_open = 1;
	for (unsigned i = 0; i < nfds; i++)
		t->fds_open &= fd_open(fds[i]);
	/* The callee owns them. */
	wire_close_fds(fds, nfds);
}

static int on_may_queue_fds(struct conn *c, unsigned nfds,
			   struct refusal *why)
{
	struct tconn *t = tconn_of(c);

	if (t->conn.out_fds + nfds > (unsigned)cur->quota) {
		*why = (struct refusal){ "the test's quota",
					 METRICS_LIMIT_UID_FDS };
		return -EDQUOT;
	}
	return 0;
}

static void on_queued_fds(struct conn *c, int delta)
{
	tconn_of(c)->queued += delta;
}

static void on_closed(struct conn *c)
{
	struct tconn *t = tconn_of(c);

	t->closed++;
	t->queued_at_close = (int)c->out_fds;
}

static void on_free(struct conn *c)
{
	struct tconn *t = tconn_of(c);

	assert_int_equal(t->freed, 0);
	t->freed = 1;
	cur->freed++;
}

static const struct conn_ops ops = {
	.frame = on_frame,
	.may_queue_fds = on_may_queue_fds,
	.queued_fds = on_queued_fds,
	.closed = on_closed,
	.free = on_free,
};

/* Runs the loop until nothing more happens at once. */
static void pump(struct fix *f)
{
	for (int i = 0; i < 8; i++)
		uv_run(&f->loop, UV_RUN_NOWAIT);
}

/* A conn over a fresh socketpair, started. */
static struct tconn *open_conn(struct fix *f)
{
	struct tconn *t = calloc(1, sizeof(*t));
	int sv[2];

	assert_non_null(t);
	assert_true(f->nt < sizeof(f->t) / sizeof(f->t[0]));
	f->t[f->nt++] = t;
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK |
				    SOCK_CLOEXEC, 0, sv), 0);
	assert_int_equal(conn_init(&t->conn, &f->set, sv[1]), 0);
	assert_int_equal(t->conn.uid, getuid());
	assert_int_equal(t->conn.pid, getpid());
	assert_int_equal(conn_start(&t->conn), 0);
	f->peer = sv[0];
	return t;
}

static int setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	log_set_level(LOG_ERR);
	f->fd_base = fds_count(getpid());
	f->quota = 1000;
	f->lim = (struct conn_limits){
		.max_packet = T_MAX_PACKET,
		.max_fds = T_MAX_FDS,
		.hello_packet = T_HELLO_PACKET,
		.hello_timeout_ms = 10000,
		.max_output = T_MAX_OUTPUT,
		.max_out_fds = T_MAX_OUT_FDS,
	};
	if (uv_loop_init(&f->loop) ||
	    conn_set_init(&f->set, &f->loop, &ops, &f->lim))
		return -1;
	f->fd_loop = fds_count(getpid());
	f->peer = -1;
	cur = f;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fix *f = *state;

	while (f->set.conns)
		conn_close(f->set.conns, "test over");
	conn_reap(&f->set);
	pump(f);
	assert_int_equal(f->set.n, 0);
	assert_int_equal(f->freed, (int)f->nt);
	for (unsigned i = 0; i < f->nt; i++) {
		assert_int_equal(f->t[i]->closed, 1);
		free(f->t[i]);
	}
	conn_set_deinit(&f->set);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	if (f->peer >= 0)
		close(f->peer);
	/* Every fd a conn received, queued or held is closed. */
	assert_int_equal(fds_count(getpid()), f->fd_base);
	cur = NULL;
	free(f);
	return 0;
}

/* Sends f with nfds fds (the frame says claimed) from the peer's end. */
static void send_frame(struct fix *fx, Dlshare__Frame *f, const int *fds,
		       unsigned nfds, unsigned claimed)
{
	uint8_t *data;
	size_t len;

	f->nfds = claimed;
	f->has_nfds = claimed > 0;
	assert_int_equal(wire_encode(f, 1u << 20, &data, &len), 0);
	assert_int_equal(wire_send(fx->peer, data, len, fds, nfds, 0), 0);
	free(data);
}

static void send_hello(struct fix *fx, uint64_t id)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;

	h.major = WIRE_PROTO_MAJOR;
	h.minor = WIRE_PROTO_MINOR;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &h;
	send_frame(fx, &f, NULL, 0, 0);
}

/* A Stats request of about size bytes (the agent string pads it). */
static void send_padded(struct fix *fx, uint64_t id, size_t size,
			const int *fds, unsigned nfds, unsigned claimed)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;
	char *pad = malloc(size + 1);

	assert_non_null(pad);
	memset(pad, 'x', size);
	pad[size] = 0;
	h.agent = pad;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &h;
	send_frame(fx, &f, fds, nfds, claimed);
	free(pad);
}

/* n memfds, to ride on a packet. */
static void make_fds(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		fds[i] = memfd_create("test_conn", MFD_CLOEXEC);
		assert_true(fds[i] >= 0);
	}
}

/* Reads what the conn sent until its end is closed: how many packets, and
 * the last Error's code and id (or 0 and ~0 when none). */
static int drain(struct fix *fx, int *code, uint64_t *id, int *eof)
{
	uint8_t buf[T_MAX_PACKET];
	int fds[WIRE_FDS_MAX];
	int n = 0;

	*code = 0;
	*id = ~UINT64_C(0);
	*eof = 0;
	for (;;) {
		size_t len = 0;
		unsigned nfds = 0;
		struct wire_msg *m;
		int err = wire_recv(fx->peer, buf, sizeof(buf), fds,
				    WIRE_FDS_MAX, &len, &nfds, MSG_DONTWAIT);

		if (err == -EAGAIN)
			return n;
		assert_int_equal(err, 0);
		wire_close_fds(fds, nfds);
		if (len == 0 && nfds == 0) {
			*eof = 1;
			return n;
		}
		n++;
		assert_int_equal(wire_decode(buf, len, &m), 0);
		if (m->frame->body_case == DLSHARE__FRAME__BODY_ERROR) {
			*code = m->frame->error->code;
			*id = m->frame->id;
		}
		wire_msg_free(m);
	}
}

/* The conn cut the peer off for a protocol error: one Error (EPROTO, id
 * 0), then end of file, ops.closed once, and the memory freed. */
static void assert_protocol_error(struct fix *fx, struct tconn *t)
{
	int code, eof;
	uint64_t id;

	pump(fx);
	assert_int_equal(fx->freed, 1);
	assert_int_equal(t->closed, 1);
	assert_true(t->freed);
	assert_int_equal(drain(fx, &code, &id, &eof), 1);
	assert_int_equal(code, DLSHARE_EPROTO);
	assert_int_equal(id, 0);
	assert_true(eof);
	assert_int_equal(fx->set.n, 0);
}

/* ---- framing ------------------------------------------------------------ */

static void test_frames_arrive_whole(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);
	int fds[2];

	send_hello(fx, 7);
	pump(fx);
	assert_int_equal(t->frames, 1);
	assert_int_equal(t->last_case, DLSHARE__FRAME__BODY_HELLO);
	assert_int_equal(t->last_id, 7);
	assert_int_equal(t->last_nfds, 0);

	/* Known, a peer may send fds: they reach the user, open. */
	t->conn.hello = 1;
	make_fds(fds, 2);
	send_padded(fx, 8, 100, fds, 2, 2);
	wire_close_fds(fds, 2);
	pump(fx);
	assert_int_equal(t->frames, 2);
	assert_int_equal(t->last_id, 8);
	assert_int_equal(t->last_nfds, 2);
	assert_true(t->fds_open);
	assert_int_equal(t->closed, 0);
	assert_true(conn_open(&t->conn));
}

/* More packets than one wakeup reads: every one arrives, in order. */
static void test_many_packets(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);

	for (uint64_t i = 1; i <= 100; i++)
		send_hello(fx, i);
	pump(fx);
	assert_int_equal(t->frames, 100);
	assert_int_equal(t->last_id, 100);
}

static void test_oversize_before_hello(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);

	/* Before Hello a peer gets hello_packet bytes, not max_packet. */
	send_padded(fx, 1, T_HELLO_PACKET + 16, NULL, 0, 0);
	assert_protocol_error(fx, t);
}

static void test_oversize_after_hello(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);

	t->conn.hello = 1;
	send_padded(fx, 1, T_HELLO_PACKET + 16, NULL, 0, 0);
	pump(fx);
	assert_int_equal(t->frames, 1);
	send_padded(fx, 2, T_MAX_PACKET + 16, NULL, 0, 0);
	assert_protocol_error(fx, t);
}

static void test_malformed_packet(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);
	uint8_t junk[32];
	int fds[2];

	memset(junk, 0xff, sizeof(junk));
	t->conn.hello = 1;
	make_fds(fds, 2);
	assert_int_equal(wire_send(fx->peer, junk, sizeof(junk), fds, 2, 0), 0);
	wire_close_fds(fds, 2);
	assert_protocol_error(fx, t);
	assert_int_equal(fds_count(getpid()), fx->fd_loop + 1); /* fx->peer */
}

/* ---- fds ---------------------------------------------------------------- */

/* A packet whose fds do not match its count: every fd received is closed
 * (the teardown counts them), and the peer is cut off. */
static void test_fd_count_mismatch(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);
	int fds[3];

	t->conn.hello = 1;
	make_fds(fds, 3);
	send_padded(fx, 1, 10, fds, 3, 2);
	wire_close_fds(fds, 3);
	assert_protocol_error(fx, t);
	assert_int_equal(fds_count(getpid()), fx->fd_loop + 1);
}

static void test_fds_claimed_not_sent(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);

	t->conn.hello = 1;
	send_padded(fx, 1, 10, NULL, 0, 1);
	assert_protocol_error(fx, t);
}

/* More fds than max_fds: the kernel truncates the control data
 * (MSG_CTRUNC); the ones that came are closed, and the peer is cut off. */
static void test_too_many_fds(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);
	int fds[T_MAX_FDS + 3];

	t->conn.hello = 1;
	make_fds(fds, T_MAX_FDS + 3);
	send_padded(fx, 1, 10, fds, T_MAX_FDS + 3, T_MAX_FDS + 3);
	wire_close_fds(fds, T_MAX_FDS + 3);
	assert_protocol_error(fx, t);
	assert_int_equal(fds_count(getpid()), fx->fd_loop + 1);
}

/* Before Hello no fd is taken at all. */
static void test_fds_before_hello(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);
	int fd;

	make_fds(&fd, 1);
	send_padded(fx, 1, 10, &fd, 1, 1);
	close(fd);
	assert_protocol_error(fx, t);
	assert_int_equal(fds_count(getpid()), fx->fd_loop + 1);
}

/* ---- output ------------------------------------------------------------- */

static void send_stats_reply(struct tconn *t, int *fds, unsigned nfds,
			     int want)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__StatsReply r = DLSHARE__STATS_REPLY__INIT;

	f.id = 1;
	f.body_case = DLSHARE__FRAME__BODY_STATS_REPLY;
	f.stats_reply = &r;
	assert_int_equal(conn_send(&t->conn, &f, fds, nfds), want);
}

/* A peer that does not read is cut off at max_output, not buffered. */
static void test_output_limit(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Error e = DLSHARE__ERROR__INIT;
	char msg[2048];
	int sndbuf = 4096, err = 0, sent = 0;

	setsockopt(t->conn.fd, SOL_SOCKET, SO_SNDBUF, &sndbuf,
		   sizeof(sndbuf));
	memset(msg, 'y', sizeof(msg) - 1);
	msg[sizeof(msg) - 1] = 0;
	e.message = msg;
	f.body_case = DLSHARE__FRAME__BODY_ERROR;
	f.error = &e;
	while (!err && sent < 1000) {
		err = conn_send(&t->conn, &f, NULL, 0);
		sent++;
	}
	assert_int_equal(err, -ENOBUFS);
	assert_true(t->conn.out_bytes <= T_MAX_OUTPUT);
	assert_false(conn_open(&t->conn));
	assert_string_equal(t->conn.why,
			    "output limit reached: peer does not read");
	/* Failing, not closed: that waits for conn_reap. */
	assert_int_equal(t->closed, 0);
	assert_int_equal(conn_send(&t->conn, &f, NULL, 0), -EPIPE);
	conn_reap(&fx->set);
	assert_int_equal(t->closed, 1);
	assert_int_equal(t->queued_at_close, 0);
	pump(fx);
	assert_int_equal(fx->freed, 1);
}

/* fds wait in the queue while the peer does not read: counted against
 * max_out_fds and the user's quota, refunded when sent or dropped. */
static void test_fds_queued(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);
	struct refusal why = { 0 };
	int fds[T_MAX_OUT_FDS], sndbuf = 4096;
	int code, eof;
	uint64_t id;

	setsockopt(t->conn.fd, SOL_SOCKET, SO_SNDBUF, &sndbuf,
		   sizeof(sndbuf));
	make_fds(fds, T_MAX_OUT_FDS);
	/* Fill the socket, so that what follows stays queued. */
	while (!t->conn.out_head)
		send_stats_reply(t, NULL, 0, 0);
	send_stats_reply(t, fds, 3, 0);
	assert_int_equal(t->conn.out_fds, 3);
	assert_int_equal(t->queued, 3);

	/* The user's quota first... */
	fx->quota = 4;
	assert_int_equal(conn_may_queue_fds(&t->conn, 2, &why), -EDQUOT);
	assert_string_equal(why.why, "the test's quota");
	assert_int_equal(why.limit, METRICS_LIMIT_UID_FDS);
	assert_int_equal(conn_may_queue_fds(&t->conn, 1, &why), 0);
	/* ...and the conn's own limit. */
	fx->quota = 1000;
	why = (struct refusal){ 0 };
	assert_int_equal(conn_may_queue_fds(&t->conn, T_MAX_OUT_FDS - 2, &why),
			 -EDQUOT);
	assert_string_equal(why.why, "fds queued to one connection");
	assert_int_equal(why.limit, METRICS_LIMIT_MAX_OUT_FDS);
	assert_int_equal(conn_may_queue_fds(&t->conn, 0, &why), 0);

	/* Past them, conn_send itself cuts the peer off (a backstop). */
	send_stats_reply(t, fds, T_MAX_OUT_FDS - 2, -ENOBUFS);
	assert_false(conn_open(&t->conn));
	assert_int_equal(t->queued, 3);
	wire_close_fds(fds, T_MAX_OUT_FDS);

	/* Closing drops the queue and its fds before ops.closed. */
	conn_reap(&fx->set);
	assert_int_equal(t->closed, 1);
	assert_int_equal(t->queued_at_close, 0);
	assert_int_equal(t->queued, 0);
	pump(fx);
	assert_int_equal(fx->freed, 1);
	drain(fx, &code, &id, &eof);
	assert_true(eof);
}

/* A queue drains once the peer reads, fds and all. */
static void test_queue_drains(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);
	int fd, code, eof, n = 0, sndbuf = 4096;
	uint64_t id;

	setsockopt(t->conn.fd, SOL_SOCKET, SO_SNDBUF, &sndbuf,
		   sizeof(sndbuf));
	make_fds(&fd, 1);
	while (!t->conn.out_head) {
		send_stats_reply(t, NULL, 0, 0);
		n++;
	}
	send_stats_reply(t, &fd, 1, 0);
	close(fd);
	assert_int_equal(t->queued, 1);
	for (int i = 0; i < 100 && t->conn.out_head; i++) {
		n -= drain(fx, &code, &id, &eof);
		pump(fx);
	}
	n -= drain(fx, &code, &id, &eof);
	assert_null(t->conn.out_head);
	assert_int_equal(t->conn.out_bytes, 0);
	assert_int_equal(t->queued, 0);
	/* Every packet arrived: the one that filled the socket, and ours. */
	assert_int_equal(n, -1);
	assert_true(conn_open(&t->conn));
}

/* ---- lifecycle ---------------------------------------------------------- */

static void test_peer_hangs_up(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);

	close(fx->peer);
	fx->peer = -1;
	pump(fx);
	assert_int_equal(fx->freed, 1);
	assert_int_equal(fx->set.n, 0);
	assert_int_equal(t->closed, 1);
	assert_string_equal(t->conn.why, "peer hung up");
}

/* conn_fail only dooms; conn_reap closes once, whatever is called twice;
 * the memory goes in the loop's close callback. */
static void test_close_callbacks(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx);
	int code, eof;
	uint64_t id;

	conn_fail(&t->conn, "test says so");
	conn_fail(&t->conn, "twice");
	assert_int_equal(t->conn.state, CONN_FAILING);
	assert_string_equal(t->conn.why, "test says so");
	assert_ptr_equal(fx->set.doomed, &t->conn);
	assert_int_equal(t->closed, 0);
	conn_reap(&fx->set);
	assert_int_equal(t->conn.state, CONN_CLOSING);
	assert_int_equal(t->closed, 1);
	assert_int_equal(t->conn.fd, -1);
	assert_int_equal(fx->set.n, 0);
	conn_close(&t->conn, "again");
	conn_reap(&fx->set);
	assert_int_equal(t->closed, 1);
	assert_int_equal(fx->freed, 0);
	pump(fx);
	assert_int_equal(fx->freed, 1);
	assert_int_equal(drain(fx, &code, &id, &eof), 0);
	assert_true(eof);
}

/* A peer that never says Hello is swept once hello_timeout_ms passed. */
static void test_hello_timeout(void **state)
{
	struct fix *fx = *state;
	struct tconn *t = open_conn(fx), *known;
	int peer = fx->peer;

	known = open_conn(fx);
	known->conn.hello = 1;
	fx->lim.hello_timeout_ms = 0;
	conn_sweep(&fx->set);
	assert_int_equal(t->closed, 1);
	assert_int_equal(known->closed, 0);
	assert_int_equal(fx->set.n, 1);
	pump(fx);
	assert_int_equal(fx->freed, 1);
	close(peer);
}

int main(void)
{
	uv_loop_t once;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_frames_arrive_whole,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_packets, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_oversize_before_hello,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_oversize_after_hello,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_malformed_packet, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_fd_count_mismatch, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_fds_claimed_not_sent,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_too_many_fds, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_fds_before_hello, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_output_limit, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_fds_queued, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_queue_drains, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_peer_hangs_up, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_close_callbacks, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_hello_timeout, setup,
						teardown),
	};

	/* libuv's first loop opens a pipe for signals that stays open for
	 * the process's life: open it before any test counts fds. */
	if (uv_loop_init(&once) == 0)
		uv_loop_close(&once);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
