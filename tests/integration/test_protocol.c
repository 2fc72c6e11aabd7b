/* test_protocol — the daemon against peers that break the protocol, through
 * raw SOCK_SEQPACKET sockets and hand-built frames that the library would
 * never send: garbage, no Hello, a second Hello, an unknown major, fds where
 * none belong or miscounted, packets over --max-packet, and tensor
 * descriptions that reach outside their buffer, overflow, or have too many
 * dimensions. A framing error costs the peer its connection; a bad request
 * gets an Error reply and the connection stays usable. Either way the
 * daemon keeps serving everyone else, and its fd count comes back. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "util.h"

#define MAX_PACKET 16384

static int setup(void **state)
{
	static const char *const args[] = { "--max-packet", "16384", NULL };

	return util_setup_fdcheck(state, args);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

/* ---- building frames ------------------------------------------------------------- */

struct rtensor {
	Dlshare__Tensor t;
	Dlshare__DataType dt;
	int64_t shape[40];
	int64_t strides[40];
};

static Dlshare__Tensor *rtensor(struct rtensor *r, uint32_t code,
				uint32_t bits, size_t ndim,
				const int64_t *shape, const int64_t *strides,
				uint64_t offset)
{
	dlshare__tensor__init(&r->t);
	dlshare__data_type__init(&r->dt);
	r->dt.code = code;
	r->dt.bits = bits;
	r->dt.lanes = 1;
	r->t.dtype = &r->dt;
	r->t.buffer = 0;
	r->t.offset = offset;
	r->t.n_shape = ndim;
	r->t.shape = r->shape;
	memcpy(r->shape, shape, ndim * sizeof(int64_t));
	if (strides) {
		r->t.n_strides = ndim;
		r->t.strides = r->strides;
		memcpy(r->strides, strides, ndim * sizeof(int64_t));
	}
	return &r->t;
}

struct rbuf {
	Dlshare__Buffer b;
	Dlshare__Device dev;
	Dlshare__Buffer *bp;
};

static Dlshare__Buffer **rbuf(struct rbuf *r, uint64_t size, int fd_attached)
{
	dlshare__buffer__init(&r->b);
	dlshare__device__init(&r->dev);
	r->dev.type = kDLCPU;
	r->b.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
	r->b.size = size;
	r->b.device = &r->dev;
	if (fd_attached) {
		r->b.has_fd_attached = 1;
		r->b.fd_attached = 1;
	}
	r->bp = &r->b;
	return &r->bp;
}

static uint64_t next_id = 100;

/* Sends a Create (or, with fd >= 0, a Publish carrying fd) of one tensor in
 * one buffer of size bytes. Returns the Error code of the reply, 0 for a
 * success reply, or 1 for anything else. */
static int raw_version(int sock, const char *name, Dlshare__Tensor *t,
		      uint64_t size, int fd)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Create cr = DLSHARE__CREATE__INIT;
	Dlshare__Publish pu = DLSHARE__PUBLISH__INIT;
	struct rbuf b;
	struct wire_msg *m;
	int ret = 1;

	f.id = next_id++;
	if (fd < 0) {
		cr.name = (char *)name;
		cr.n_tensors = t ? 1 : 0;
		cr.tensors = &t;
		cr.n_buffers = 1;
		cr.buffers = rbuf(&b, size, 0);
		f.body_case = DLSHARE__FRAME__BODY_CREATE;
		f.create = &cr;
	} else {
		pu.name = (char *)name;
		pu.n_tensors = t ? 1 : 0;
		pu.tensors = &t;
		pu.n_buffers = 1;
		pu.buffers = rbuf(&b, size, 1);
		f.body_case = DLSHARE__FRAME__BODY_PUBLISH;
		f.publish = &pu;
	}
	if (raw_call(sock, &f, fd >= 0 ? &fd : NULL, fd >= 0, &m))
		return 1;
	if (m->frame->body_case == DLSHARE__FRAME__BODY_ERROR)
		ret = m->frame->error->code;
	else if (m->frame->body_case == DLSHARE__FRAME__BODY_CREATE_REPLY ||
		 m->frame->body_case == DLSHARE__FRAME__BODY_PUBLISH_REPLY)
		ret = 0;
	wire_msg_free(m);
	return ret;
}

/* A Stats round trip: the connection still works. Returns 0 or -1. */
static int raw_alive(int sock)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stats s = DLSHARE__STATS__INIT;
	struct wire_msg *m;
	int ok;

	f.id = next_id++;
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &s;
	if (raw_call(sock, &f, NULL, 0, &m))
		return -1;
	ok = m->frame->body_case == DLSHARE__FRAME__BODY_STATS_REPLY;
	wire_msg_free(m);
	return ok ? 0 : -1;
}

/* ---- peers that lose their connection ------------------------------------------------- */

/* Each child connects raw, misbehaves, and checks the daemon hangs up on
 * it, with an Error of code want first when want is not 0. */
struct misbehaviour {
	const char *what;
	int hello;     /* say Hello first */
	int want;      /* Error code expected before the hang-up, or 0 */
	int (*act)(int sock);
};

static int act_garbage(int sock)
{
	uint8_t junk[200];

	harness_fill(junk, sizeof(junk), 5);
	junk[0] = 0xff; /* field 31, wire type 7: never valid */
	return raw_send_bytes(sock, junk, sizeof(junk), NULL, 0);
}

static int act_stats(int sock)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stats s = DLSHARE__STATS__INIT;

	f.id = 7;
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &s;
	return raw_send(sock, &f, NULL, 0, 0);
}

static int act_hello(int sock, uint32_t major, int with_fd)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;
	int fd = with_fd ? raw_memfd(4096, 0) : -1;
	int err;

	h.major = major;
	h.minor = 0;
	f.id = 9;
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &h;
	err = raw_send(sock, &f, with_fd ? &fd : NULL, with_fd ? 1 : 0, 0);
	if (fd >= 0)
		close(fd);
	return err;
}

static int act_hello_again(int sock)
{
	return act_hello(sock, WIRE_PROTO_MAJOR, 0);
}

static int act_hello_major(int sock)
{
	return act_hello(sock, WIRE_PROTO_MAJOR + 98, 0);
}

static int act_hello_fd(int sock)
{
	return act_hello(sock, WIRE_PROTO_MAJOR, 1);
}

/* Stats is no Publish: it may carry no fd. */
static int act_stats_fd(int sock)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stats s = DLSHARE__STATS__INIT;
	int fd = raw_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
	int err;

	f.id = 8;
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &s;
	err = raw_send(sock, &f, &fd, 1, 0);
	close(fd);
	return err;
}

/* A Publish whose nfds says 2 while the packet carries 1. */
static int act_fd_miscount(int sock)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Publish pu = DLSHARE__PUBLISH__INIT;
	struct rtensor t;
	struct rbuf b;
	Dlshare__Tensor *tp;
	int64_t shape[1] = { 16 };
	int fd = raw_memfd(64, F_SEAL_SHRINK | F_SEAL_GROW);
	uint8_t *data;
	size_t len;
	int err;

	tp = rtensor(&t, kDLFloat, 32, 1, shape, NULL, 0);
	pu.name = "p/miscount";
	pu.n_tensors = 1;
	pu.tensors = &tp;
	pu.n_buffers = 1;
	pu.buffers = rbuf(&b, 64, 1);
	f.id = 10;
	f.body_case = DLSHARE__FRAME__BODY_PUBLISH;
	f.publish = &pu;
	f.has_nfds = 1;
	f.nfds = 2;
	err = wire_encode(&f, 1u << 20, &data, &len);
	if (!err) {
		err = raw_send_bytes(sock, data, len, &fd, 1);
		free(data);
	}
	close(fd);
	return err;
}

static int act_oversized(int sock)
{
	size_t n = MAX_PACKET + 4096;
	uint8_t *big = calloc(1, n);
	int err;

	/* Content does not matter: it is cut off by size first. */
	err = raw_send_bytes(sock, big, n, NULL, 0);
	free(big);
	return err;
}

/* Before Hello, a peer gets only a small packet. */
static int act_oversized_hello(int sock)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;
	char agent[2000];

	memset(agent, 'a', sizeof(agent) - 1);
	agent[sizeof(agent) - 1] = '\0';
	h.major = WIRE_PROTO_MAJOR;
	h.agent = agent;
	f.id = 1;
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &h;
	return raw_send(sock, &f, NULL, 0, 0);
}

static const struct misbehaviour misbehaviours[] = {
	{ "garbage before Hello", 0, DLSHARE_EPROTO, act_garbage },
	{ "garbage after Hello", 1, DLSHARE_EPROTO, act_garbage },
	{ "no Hello", 0, DLSHARE_EPROTO, act_stats },
	{ "Hello twice", 1, DLSHARE_EPROTO, act_hello_again },
	{ "unknown major", 0, DLSHARE_EVERSION, act_hello_major },
	{ "fd with Hello", 0, 0, act_hello_fd },
	{ "fd with Stats", 1, DLSHARE_EPROTO, act_stats_fd },
	{ "fd count lies", 1, DLSHARE_EPROTO, act_fd_miscount },
	{ "packet over --max-packet", 1, DLSHARE_EPROTO, act_oversized },
	{ "large packet before Hello", 0, DLSHARE_EPROTO, act_oversized_hello },
};
#define NMIS (sizeof(misbehaviours) / sizeof(misbehaviours[0]))

static int misbehave(const struct daemon_proc *d, void *arg)
{
	const struct misbehaviour *mb = arg;
	int sock = raw_connect(d->sock), code, err;

	CHILD_CHECK(sock >= 0);
	if (mb->hello)
		CHILD_CHECK(raw_hello(sock) == 0);
	err = mb->act(sock);
	if (err)
		CHILD_FAIL("%s: send: %s", mb->what, strerror(-err));
	if (raw_expect_hangup(sock, harness_ms(5000), &code))
		CHILD_FAIL("%s: the daemon did not hang up", mb->what);
	if (mb->want && code != mb->want)
		CHILD_FAIL("%s: error code %d, want %d", mb->what, code,
			   mb->want);
	close(sock);
	return 0;
}

/* A well-behaved client in its own process. */
static int good_client(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	int64_t shape[1] = { 100 };

	CHILD_OK(util_store(c, "p/good", DT_F32, 1, shape, 42, NULL));
	CHILD_OK(util_get_check(c, "p/good", NULL, DT_F32, 1, shape, 42, NULL));
	CHILD_OK(dlshare_delete(c, "p/good"));
	dlshare_disconnect(c);
	return 0;
}

static void misbehaving_peers(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want clean = UTIL_ANY;
	int fds;

	clean.connections = 1;
	clean.names = 0;
	clean.versions = 0;
	clean.buffers = 0;
	clean.leases = 0;
	util_assert_want(c, &clean);
	fds = harness_fd_count(fx->d.pid);
	for (size_t i = 0; i < NMIS; i++) {
		fprintf(stderr, "-- %s\n", misbehaviours[i].what);
		assert_int_equal(util_wait(util_spawn(&fx->d, misbehave,
						      (void *)&misbehaviours[i])), 0);
		/* Gone without a trace, and everyone else is served. */
		util_assert_want(c, &clean);
		assert_int_equal(harness_wait_fds(fx->d.pid, fds), fds);
		assert_int_equal(util_wait(util_spawn(&fx->d, good_client, NULL)), 0);
		util_stats(c);
	}
	dlshare_disconnect(c);
}

/* ---- bad requests: an Error, and the connection stays ------------------------------------ */

static int bad_requests(const struct daemon_proc *d, void *arg)
{
	int sock = raw_connect(d->sock);
	struct rtensor t;
	int64_t sh2[2] = { 4, 4 }, sh1[1] = { 2 }, big[2] = { 1LL << 40, 1LL << 40 };
	int64_t huge[1] = { INT64_MAX }, neg[2] = { 4, -1 };
	int64_t st_out[2] = { 8, 1 }, st_neg[1] = { -1 }, st_ok[2] = { 1, 4 };
	int64_t st_big[2] = { INT64_MAX / 2, 1 };
	int64_t dims33[33];
	int fd;

	for (int i = 0; i < 33; i++)
		dims33[i] = 1;
	CHILD_CHECK(sock >= 0);
	CHILD_CHECK(raw_hello(sock) == 0);

	/* The positive controls: these frames are right. */
	CHILD_CHECK(raw_version(sock, "p/ok", rtensor(&t, kDLFloat, 32, 2, sh2,
						       NULL, 0), 64, -1) == 0);
	CHILD_CHECK(raw_version(sock, "p/ok2", rtensor(&t, kDLFloat, 32, 2, sh2,
							st_ok, 0), 64, -1) == 0);
	fd = raw_memfd(64, F_SEAL_SHRINK | F_SEAL_GROW);
	CHILD_CHECK(raw_version(sock, "p/okx", rtensor(&t, kDLFloat, 32, 2, sh2,
							NULL, 0), 64, fd) == 0);
	close(fd);

#define BAD(name, tensor, size, fd_, want)                                       \
	do {                                                                      \
		int code_ = raw_version(sock, name, tensor, size, fd_);           \
		if (code_ != (want))                                              \
			CHILD_FAIL("%s: reply %d, want %d", name, code_, want);   \
		CHILD_CHECK(raw_alive(sock) == 0);                                \
	} while (0)

	/* Strides that reach outside the buffer, after or before it. */
	BAD("p/strides-out", rtensor(&t, kDLFloat, 32, 2, sh2, st_out, 0), 64,
	    -1, DLSHARE_EINVAL);
	BAD("p/strides-neg", rtensor(&t, kDLFloat, 32, 1, sh1, st_neg, 0), 64,
	    -1, DLSHARE_EINVAL);
	BAD("p/strides-huge", rtensor(&t, kDLFloat, 32, 2, sh2, st_big, 0), 64,
	    -1, DLSHARE_EINVAL);
	/* Compact, but larger than the buffer; at an offset past its end. */
	BAD("p/too-large", rtensor(&t, kDLFloat, 32, 2, sh2, NULL, 0), 63, -1,
	    DLSHARE_EINVAL);
	BAD("p/offset", rtensor(&t, kDLFloat, 32, 1, sh1, NULL, 60), 64, -1,
	    DLSHARE_EINVAL);
	/* Shapes whose product overflows. */
	BAD("p/overflow", rtensor(&t, kDLFloat, 32, 2, big, NULL, 0), 64, -1,
	    DLSHARE_EINVAL);
	BAD("p/overflow1", rtensor(&t, kDLFloat, 64, 1, huge, NULL, 0), 64, -1,
	    DLSHARE_EINVAL);
	BAD("p/negative", rtensor(&t, kDLFloat, 32, 2, neg, NULL, 0), 64, -1,
	    DLSHARE_EINVAL);
	/* 33 dimensions. */
	BAD("p/ndim33", rtensor(&t, kDLFloat, 32, 33, dims33, NULL, 0), 64, -1,
	    DLSHARE_EINVAL);
	/* dtypes nobody knows. */
	BAD("p/dtype-code", rtensor(&t, 42, 32, 2, sh2, NULL, 0), 64, -1,
	    DLSHARE_EINVAL);
	BAD("p/dtype-bits", rtensor(&t, kDLFloat, 12, 2, sh2, NULL, 0), 64, -1,
	    DLSHARE_EINVAL);
	rtensor(&t, kDLFloat, 32, 2, sh2, NULL, 0);
	t.dt.lanes = 0;
	BAD("p/dtype-lanes", &t.t, 64, -1, DLSHARE_EINVAL);
	/* A tensor in a buffer that does not exist; no tensor at all. */
	rtensor(&t, kDLFloat, 32, 2, sh2, NULL, 0);
	t.t.buffer = 1;
	BAD("p/buffer-index", &t.t, 64, -1, DLSHARE_EINVAL);
	BAD("p/no-tensors", NULL, 64, -1, DLSHARE_EINVAL);
	/* Strides given for some dimensions only. */
	rtensor(&t, kDLFloat, 32, 2, sh2, st_ok, 0);
	t.t.n_strides = 1;
	BAD("p/strides-some", &t.t, 64, -1, DLSHARE_EINVAL);
	/* Names the library would refuse. */
	BAD("p//x", rtensor(&t, kDLFloat, 32, 2, sh2, NULL, 0), 64, -1,
	    DLSHARE_EINVAL);
	BAD("../x", rtensor(&t, kDLFloat, 32, 2, sh2, NULL, 0), 64, -1,
	    DLSHARE_EINVAL);

	/* Exports: the fd must be a memfd with the size seals and as large
	 * as claimed, and the tensors must fit it too. */
	fd = raw_memfd(64, 0);
	BAD("p/x-unsealed", rtensor(&t, kDLFloat, 32, 2, sh2, NULL, 0), 64, fd,
	    DLSHARE_EINVAL);
	close(fd);
	fd = raw_memfd(32, F_SEAL_SHRINK | F_SEAL_GROW);
	BAD("p/x-short", rtensor(&t, kDLFloat, 32, 2, sh2, NULL, 0), 64, fd,
	    DLSHARE_EINVAL);
	close(fd);
	fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	BAD("p/x-devnull", rtensor(&t, kDLFloat, 32, 2, sh2, NULL, 0), 64, fd,
	    DLSHARE_EINVAL);
	close(fd);
	fd = raw_memfd(64, F_SEAL_SHRINK | F_SEAL_GROW);
	BAD("p/x-strides-out", rtensor(&t, kDLFloat, 32, 2, sh2, st_out, 0), 64,
	    fd, DLSHARE_EINVAL);
	BAD("p/x-ndim33", rtensor(&t, kDLFloat, 32, 33, dims33, NULL, 0), 64,
	    fd, DLSHARE_EINVAL);
	BAD("p/x-overflow", rtensor(&t, kDLFloat, 32, 2, big, NULL, 0), 64, fd,
	    DLSHARE_EINVAL);
	close(fd);
#undef BAD

	/* Requests that make no sense. */
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;
	Dlshare__Release rel = DLSHARE__RELEASE__INIT;
	Dlshare__Seal seal = DLSHARE__SEAL__INIT;
	Dlshare__Ok ok = DLSHARE__OK__INIT;
	uint64_t lease = 123456;
	struct wire_msg *m;

	f.id = next_id++;
	g.name = "p/ok";
	g.has_select = 1;
	g.select = 9;
	f.body_case = DLSHARE__FRAME__BODY_GET;
	f.get = &g;
	CHILD_CHECK(raw_call(sock, &f, NULL, 0, &m) == 0);
	CHILD_CHECK(m->frame->body_case == DLSHARE__FRAME__BODY_ERROR);
	CHILD_CHECK(m->frame->error->code == DLSHARE_EINVAL);
	wire_msg_free(m);

	f.id = next_id++;
	rel.n_leases = 1;
	rel.leases = &lease;
	f.body_case = DLSHARE__FRAME__BODY_RELEASE;
	f.release = &rel;
	CHILD_CHECK(raw_call(sock, &f, NULL, 0, &m) == 0);
	CHILD_CHECK(m->frame->body_case == DLSHARE__FRAME__BODY_ERROR);
	CHILD_CHECK(m->frame->error->code == DLSHARE_EINVAL);
	wire_msg_free(m);

	/* Sealing a version that is not pending for us. */
	f.id = next_id++;
	seal.name = "p/okx";
	seal.version = 1;
	f.body_case = DLSHARE__FRAME__BODY_SEAL;
	f.seal = &seal;
	CHILD_CHECK(raw_call(sock, &f, NULL, 0, &m) == 0);
	CHILD_CHECK(m->frame->body_case == DLSHARE__FRAME__BODY_ERROR);
	CHILD_CHECK(m->frame->error->code == DLSHARE_ESTATE);
	wire_msg_free(m);
	f.id = next_id++;
	seal.name = "p/none";
	CHILD_CHECK(raw_call(sock, &f, NULL, 0, &m) == 0);
	CHILD_CHECK(m->frame->body_case == DLSHARE__FRAME__BODY_ERROR);
	CHILD_CHECK(m->frame->error->code == DLSHARE_ENOENT);
	wire_msg_free(m);

	/* A reply sent as a request. */
	f.id = next_id++;
	f.body_case = DLSHARE__FRAME__BODY_OK;
	f.ok = &ok;
	CHILD_CHECK(raw_call(sock, &f, NULL, 0, &m) == 0);
	CHILD_CHECK(m->frame->body_case == DLSHARE__FRAME__BODY_ERROR);
	CHILD_CHECK(m->frame->error->code == DLSHARE_EINVAL);
	wire_msg_free(m);

	CHILD_CHECK(raw_alive(sock) == 0);
	close(sock);
	return 0;
}

static void bad_requests_keep_connection(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want clean = UTIL_ANY;
	int fds;

	clean.connections = 1;
	clean.names = 0;
	clean.versions = 0;
	clean.buffers = 0;
	clean.bytes = 0;
	util_assert_want(c, &clean);
	fds = harness_fd_count(fx->d.pid);
	assert_int_equal(util_wait(util_spawn(&fx->d, bad_requests, NULL)), 0);
	/* The pending controls went with the connection, the export too, and
	 * every fd sent with a refused Publish was closed. */
	util_assert_want(c, &clean);
	assert_int_equal(harness_wait_fds(fx->d.pid, fds), fds);
	assert_int_equal(util_wait(util_spawn(&fx->d, good_client, NULL)), 0);
	dlshare_disconnect(c);
}

/* ---- BufferGone reaches exactly the peers that have the buffer ---------------- */

static int raw_get_buffer(int fd, const char *name, uint64_t id,
			  uint64_t *lease, uint64_t *buf)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;
	struct wire_msg *m;
	int ok;

	g.name = (char *)name;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_GET;
	f.get = &g;
	if (raw_call(fd, &f, NULL, 0, &m))
		return -1;
	ok = m->frame->body_case == DLSHARE__FRAME__BODY_GET_REPLY &&
	     m->frame->get_reply->n_buffers == 1;
	if (ok) {
		*lease = m->frame->get_reply->lease;
		*buf = m->frame->get_reply->buffers[0]->id;
	}
	wire_msg_free(m);
	return ok ? 0 : -1;
}

/* The next packet after a Stats request: a BufferGone (returns its first
 * id), or the StatsReply itself (returns 0). */
static uint64_t raw_next_gone(int fd)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stats st = DLSHARE__STATS__INIT;
	struct wire_msg *m;
	uint64_t id = 0;

	f.id = 77;
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &st;
	assert_int_equal(raw_send(fd, &f, NULL, 0, 0), 0);
	assert_int_equal(raw_recv(fd, harness_ms(5000), &m), 0);
	if (m->frame->body_case == DLSHARE__FRAME__BODY_BUFFER_GONE) {
		assert_true(m->frame->buffer_gone->n_ids >= 1);
		id = m->frame->buffer_gone->ids[0];
		wire_msg_free(m);
		/* Then the answer to our Stats. */
		assert_int_equal(raw_recv(fd, harness_ms(5000), &m), 0);
	}
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_STATS_REPLY);
	wire_msg_free(m);
	return id;
}

static void buffer_gone_to_holders(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int64_t shape[1] = { 64 };
	int holder = raw_connect(fx->d.sock), other = raw_connect(fx->d.sock);
	uint64_t lease, buf, lease2, buf2;

	assert_true(holder >= 0 && other >= 0);
	assert_int_equal(raw_hello(holder), 0);
	assert_int_equal(raw_hello(other), 0);
	assert_int_equal(util_store(c, "bg/x", DT_F32, 1, shape, 1, NULL), 0);
	assert_int_equal(util_store(c, "bg/y", DT_F32, 1, shape, 2, NULL), 0);
	/* holder gets bg/x's buffer, other only bg/y's. */
	assert_int_equal(raw_get_buffer(holder, "bg/x", 10, &lease, &buf), 0);
	assert_int_equal(raw_get_buffer(other, "bg/y", 11, &lease2, &buf2), 0);
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Release r = DLSHARE__RELEASE__INIT;

		r.n_leases = 1;
		r.leases = &lease;
		f.body_case = DLSHARE__FRAME__BODY_RELEASE;
		f.release = &r;
		assert_int_equal(raw_send(holder, &f, NULL, 0, 0), 0);
	}
	/* The release is in before the Stats answer; a new version then
	 * frees bg/x's unleased buffer. */
	assert_int_equal(raw_next_gone(holder), 0);
	assert_int_equal(util_store(c, "bg/x", DT_F32, 1, shape, 3, NULL), 0);
	assert_int_equal(raw_next_gone(holder), buf);
	assert_int_equal(raw_next_gone(other), 0);
	close(holder);
	close(other);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* A parked get is answered before the version it waited past dies: the
 * GetReply for the new version comes ahead of the old buffer's BufferGone
 * (docs/protocol.md, Publish). */
static void parked_reply_before_gone(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int64_t shape[1] = { 64 };
	int holder = raw_connect(fx->d.sock);
	uint64_t lease, buf, v1;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;
	struct util_want w = UTIL_ANY;
	struct wire_msg *m;

	assert_true(holder >= 0);
	assert_int_equal(raw_hello(holder), 0);
	assert_int_equal(util_store(c, "bg/p", DT_F32, 1, shape, 1, &v1), 0);
	assert_int_equal(raw_get_buffer(holder, "bg/p", 10, &lease, &buf), 0);
	/* The lease goes with the parked get: nothing holds v1 then. */
	g.name = "bg/p";
	g.has_select = 1;
	g.select = DLSHARE__SELECT__SELECT_NEWER_THAN;
	g.has_version = 1;
	g.version = v1;
	g.has_timeout_ms = 1;
	g.timeout_ms = 60000;
	f.id = 11;
	f.n_releases = 1;
	f.releases = &lease;
	f.body_case = DLSHARE__FRAME__BODY_GET;
	f.get = &g;
	assert_int_equal(raw_send(holder, &f, NULL, 0, 0), 0);
	w.parked = 1;
	w.leases = 0;
	util_assert_want(c, &w);
	assert_int_equal(util_store(c, "bg/p", DT_F32, 1, shape, 2, NULL), 0);
	assert_int_equal(raw_recv(holder, harness_ms(5000), &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_GET_REPLY);
	assert_int_equal(m->frame->id, 11);
	wire_msg_free(m);
	assert_int_equal(raw_recv(holder, harness_ms(5000), &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_BUFFER_GONE);
	assert_int_equal(m->frame->buffer_gone->ids[0], buf);
	wire_msg_free(m);
	close(holder);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- Releases riding on a request (Frame.releases, protocol 1.1) ------------- */

/* Stats carrying releases; returns the leases the StatsReply counts. */
static uint64_t raw_stats_releasing(int fd, uint64_t *ids, size_t n)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stats st = DLSHARE__STATS__INIT;
	struct wire_msg *m;
	uint64_t leases;

	f.id = 78;
	f.n_releases = n;
	f.releases = ids;
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &st;
	assert_int_equal(raw_call(fd, &f, NULL, 0, &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_STATS_REPLY);
	leases = m->frame->stats_reply->leases;
	wire_msg_free(m);
	return leases;
}

static void releases_ride_on_requests(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int64_t shape[1] = { 16 };
	int fd = raw_connect(fx->d.sock);
	uint64_t l[3], buf, bogus[2];

	assert_true(fd >= 0);
	assert_int_equal(raw_hello(fd), 0);
	assert_int_equal(util_store(c, "ride/x", DT_F32, 1, shape, 1, NULL), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(raw_get_buffer(fd, "ride/x", 20 + i, &l[i],
						&buf), 0);
	assert_int_equal(raw_stats_releasing(fd, NULL, 0), 3);
	/* Released before the request is handled: its answer counts them
	 * gone. */
	assert_int_equal(raw_stats_releasing(fd, l, 2), 1);
	/* Unknown or already released ones do not cost the request. */
	bogus[0] = l[0];
	bogus[1] = 999999;
	assert_int_equal(raw_stats_releasing(fd, bogus, 2), 1);
	assert_int_equal(raw_stats_releasing(fd, &l[2], 1), 0);
	assert_int_equal(raw_alive(fd), 0);
	close(fd);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* libdlshare puts a tensor's release on its next request: a get+release
 * loop costs the daemon one packet per get, not two. (The receiver thread
 * sends what waited 20 ms on its own, so a slow machine sends a few.)
 * Releases beyond what one request carries are not lost. */
static void library_releases_ride(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int64_t shape[1] = { 16 };
	dlshare_stats before, after;
	DLManagedTensor *held[100];
	const int n = 50;

	assert_int_equal(util_store(c, "ride/lib", DT_F32, 1, shape, 3, NULL),
			 0);
	assert_int_equal(dlshare_stats_get(c, &before), 0);
	for (int i = 0; i < n; i++) {
		DLManagedTensor *m;

		assert_int_equal(dlshare_get_tensor(c, "ride/lib", NULL, &m), 0);
		m->deleter(m);
	}
	assert_int_equal(dlshare_stats_get(c, &after), 0);
	/* n gets and the second Stats; with a Release packet per get it
	 * would be 2n + 1. */
	assert_true(after.requests - before.requests <= (uint64_t)(n + n / 2));

	/* More than a request carries (CLIENT_RELEASE_RIDE, 64): the rest
	 * follow, and none is lost. */
	for (int i = 0; i < 100; i++)
		assert_int_equal(dlshare_get_tensor(c, "ride/lib", NULL,
						    &held[i]), 0);
	for (int i = 0; i < 100; i++)
		held[i]->deleter(held[i]);
	util_stats(c);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- many releases at once ---------------------------------------------------- */

/* A process drops ten thousand tensors at once (a state dict's): the
 * releases go in frames that each fit the daemon's packet (16 KiB here),
 * none is lost, and the connection lives. */
static void ten_thousand_releases(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	const char *w = getenv("DLSHARE_TEST_WRAPPER");
	size_t n = w && strstr(w, "valgrind") ? 2000 : 10000;
	int64_t shape[1] = { 4 };
	DLManagedTensor **held = calloc(n, sizeof(*held));

	assert_non_null(held);
	assert_int_equal(util_store(c, "many/x", DT_F32, 1, shape, 1, NULL), 0);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(dlshare_get_tensor(c, "many/x", NULL,
						    &held[i]), 0);
	assert_int_equal(util_stats(c).leases, n);
	for (size_t i = 0; i < n; i++)
		held[i]->deleter(held[i]);
	free(held);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	assert_int_equal(util_store(c, "many/x", DT_F32, 1, shape, 2, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- a Release just before a close that the kernel calls a reset ------------ */

/* A peer that closes its socket with a packet of the daemon's still unread
 * in it (a late reply, a push) is reported to the daemon as a reset
 * (ECONNRESET, POLLERR), ahead of the packets the peer sent last. Those
 * are still read: a Release sent just before the close counts, so a
 * released take is consumed, not put back for another taker. The daemon
 * is stopped while the peer sends and closes, so that it finds both at
 * once, as a busy daemon would. */
static void release_before_reset(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	const int64_t shape[1] = { 16 };
	dlshare_tensor_spec s = { .dtype = DT_F32, .ndim = 1, .shape = shape };
	dlshare_queue_opts q = { .depth = 2 };
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Take tk = DLSHARE__TAKE__INIT;
	Dlshare__Stats st = DLSHARE__STATS__INIT;
	Dlshare__Release rel = DLSHARE__RELEASE__INIT;
	dlshare_queue_info qi;
	dlshare_writer *w;
	dlshare_bundle *b;
	struct wire_msg *m;
	struct pollfd pfd;
	uint64_t lease;
	int sock;

	assert_int_equal(dlshare_create_queued(c, "reset/q", &s, 1, NULL, &q,
					       &w), 0);
	assert_int_equal(dlshare_seal(w, NULL, NULL), 0);
	sock = raw_connect(fx->d.sock);
	assert_true(sock >= 0);
	assert_int_equal(raw_hello(sock), 0);
	tk.name = "reset/q";
	f.id = next_id++;
	f.body_case = DLSHARE__FRAME__BODY_TAKE;
	f.take = &tk;
	assert_int_equal(raw_call(sock, &f, NULL, 0, &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_GET_REPLY);
	lease = m->frame->get_reply->lease;
	wire_msg_free(m);
	/* A reply left unread in our socket. */
	f.id = next_id++;
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &st;
	assert_int_equal(raw_send(sock, &f, NULL, 0, 0), 0);
	pfd = (struct pollfd){ .fd = sock, .events = POLLIN };
	assert_int_equal(poll(&pfd, 1, harness_ms(10000)), 1);
	assert_int_equal(kill(fx->d.pid, SIGSTOP), 0);
	f = (Dlshare__Frame)DLSHARE__FRAME__INIT;
	rel.n_leases = 1;
	rel.leases = &lease;
	f.body_case = DLSHARE__FRAME__BODY_RELEASE;
	f.release = &rel;
	assert_int_equal(raw_send(sock, &f, NULL, 0, 0), 0);
	close(sock);
	assert_int_equal(kill(fx->d.pid, SIGCONT), 0);
	struct util_want one = UTIL_ANY;
	one.connections = 1;
	util_assert_want(c, &one);
	/* Consumed: nothing queued, nothing taken, nothing to take. */
	assert_int_equal(dlshare_queue_stat(c, "reset/q", &qi), 0);
	assert_int_equal(qi.queued, 0);
	assert_int_equal(qi.taken, 0);
	assert_int_equal(dlshare_take(c, "reset/q", 0, NULL, &b),
			 DLSHARE_ENOENT);
	assert_int_equal(dlshare_delete(c, "reset/q"), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- releases that find the socket full at disconnect ------------------------ */

/* The highest fd that is a socket, or -1: a client's, just after it
 * connected. */
static int last_socket(void)
{
	for (int fd = 1023; fd >= 0; fd--) {
		struct stat st;

		if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode))
			return fd;
	}
	return -1;
}

static void *disconnect_run(void *arg)
{
	dlshare_disconnect(arg);
	return NULL;
}

/* Thousands of tensors dropped while the daemon does not read (stopped
 * here; busy in life) fill the socket, and the releases that do not fit
 * wait in the library. dlshare_disconnect then waits for room to send them
 * (up to the connect timeout) rather than drop them: the released take
 * among them is consumed, not put back in its queue. */
static void releases_wait_for_room(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int before = last_socket();
	dlshare_client *taker = harness_connect(&fx->d);
	int sock = last_socket(), small = 4096;
	const char *wrap = getenv("DLSHARE_TEST_WRAPPER");
	size_t n = wrap && strstr(wrap, "valgrind") ? 1000 : 3000;
	const int64_t shape[1] = { 4 };
	dlshare_tensor_spec s = { .dtype = DT_F32, .ndim = 1, .shape = shape };
	dlshare_queue_opts q = { .depth = 2 };
	DLManagedTensor **held = calloc(n, sizeof(*held));
	dlshare_queue_info qi;
	dlshare_writer *w;
	dlshare_bundle *b;
	pthread_t th;

	assert_non_null(held);
	/* The taker's socket: a small send buffer, full after a few
	 * frames of releases. */
	assert_true(sock > before);
	assert_int_equal(setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &small,
				    sizeof(small)), 0);
	assert_int_equal(util_store(c, "room/x", DT_F32, 1, shape, 1, NULL), 0);
	assert_int_equal(dlshare_create_queued(c, "room/q", &s, 1, NULL, &q,
					       &w), 0);
	assert_int_equal(dlshare_seal(w, NULL, NULL), 0);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(dlshare_get_tensor(taker, "room/x", NULL,
						    &held[i]), 0);
	assert_int_equal(dlshare_take(taker, "room/q", 0, NULL, &b), 0);
	assert_int_equal(kill(fx->d.pid, SIGSTOP), 0);
	for (size_t i = 0; i < n; i++)
		held[i]->deleter(held[i]);
	dlshare_bundle_free(b);
	assert_int_equal(pthread_create(&th, NULL, disconnect_run, taker), 0);
	usleep(200 * 1000); /* the disconnect meets the full socket */
	assert_int_equal(kill(fx->d.pid, SIGCONT), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	free(held);
	struct util_want one = UTIL_ANY;
	one.connections = 1;
	util_assert_want(c, &one);
	assert_int_equal(dlshare_queue_stat(c, "room/q", &qi), 0);
	assert_int_equal(qi.queued, 0);
	assert_int_equal(qi.taken, 0);
	assert_int_equal(dlshare_delete(c, "room/q"), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- Goodbye: a producer's events are forgotten before it goes (1.2) ----------- */

/* Seals version 1 of name, created on sock, with a (made-up) event handle. */
static void raw_create_seal_event(int sock, const char *name)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Seal se = DLSHARE__SEAL__INIT;
	const int64_t shape[1] = { 16 };
	struct rtensor t;
	uint8_t ev[64];
	struct wire_msg *m;

	assert_int_equal(raw_version(sock, name,
				     rtensor(&t, kDLFloat, 32, 1, shape, NULL, 0),
				     64, -1), 0);
	memset(ev, 0xe7, sizeof(ev));
	se.name = (char *)name;
	se.version = 1;
	se.has_event_handle = 1;
	se.event_handle.data = ev;
	se.event_handle.len = sizeof(ev);
	f.id = next_id++;
	f.body_case = DLSHARE__FRAME__BODY_SEAL;
	f.seal = &se;
	assert_int_equal(raw_call(sock, &f, NULL, 0, &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_SEAL_REPLY);
	wire_msg_free(m);
}

/* A Get of name's newest version on sock: whether it carried an event;
 * -1 when the answer was an Error. */
static int raw_get_has_event(int sock, const char *name)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;
	struct wire_msg *m;
	int has;

	g.name = (char *)name;
	f.id = next_id++;
	f.body_case = DLSHARE__FRAME__BODY_GET;
	f.get = &g;
	assert_int_equal(raw_call(sock, &f, NULL, 0, &m), 0);
	if (m->frame->body_case == DLSHARE__FRAME__BODY_ERROR) {
		wire_msg_free(m);
		return -1;
	}
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_GET_REPLY);
	has = m->frame->get_reply->has_event_handle;
	wire_msg_free(m);
	return has;
}

/* A Get of name on sock: 0 for a GetReply (its lease released), else the
 * Error's code. */
static int raw_get_code(int sock, const char *name)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;
	struct wire_msg *m;
	int code = 0;

	g.name = (char *)name;
	f.id = next_id++;
	f.body_case = DLSHARE__FRAME__BODY_GET;
	f.get = &g;
	assert_int_equal(raw_call(sock, &f, NULL, 0, &m), 0);
	if (m->frame->body_case == DLSHARE__FRAME__BODY_ERROR)
		code = m->frame->error->code;
	else
		assert_int_equal(m->frame->body_case,
				 DLSHARE__FRAME__BODY_GET_REPLY);
	wire_msg_free(m);
	return code;
}

/* The daemon checks a Get's name only when it finds no such name (every
 * registered name passed the check): an invalid one still says
 * EINVAL, a valid missing one ENOENT, a registered one is answered. */
static void get_name_checked(void **state)
{
	struct fixture *fx = *state;
	static const char *const bad[] = { "", "../x", "a//b", "/a", "a/",
					   "a/./b", "a b", "x/..", "\x01" };
	int prod = raw_connect(fx->d.sock), reader = raw_connect(fx->d.sock);

	assert_true(prod >= 0 && reader >= 0);
	assert_int_equal(raw_hello(prod), 0);
	assert_int_equal(raw_hello(reader), 0);
	raw_create_seal_event(prod, "checked/x");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(raw_get_code(reader, bad[i]), DLSHARE_EINVAL);
	assert_int_equal(raw_get_code(reader, "checked/y"), DLSHARE_ENOENT);
	assert_int_equal(raw_get_code(reader, "checked/x"), 0);
	assert_int_equal(raw_get_code(reader, "checked/x"), 0);
	close(prod);
	close(reader);
}

/* The library says Goodbye before its process may exit: when the answer
 * comes, no reader is handed the events or the exported memory of that
 * process any more, whether or not the daemon has yet seen the socket
 * close. The connection stays usable, and store versions live on. A store
 * version with no device buffer keeps no event at all (1.6: a device
 * version's readers get the daemon's own, test_cuda_fake's
 * take_reply_outlives_producer). */
static void goodbye_forgets_events(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int prod = raw_connect(fx->d.sock), reader = raw_connect(fx->d.sock);
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Goodbye gb = DLSHARE__GOODBYE__INIT;
	const int64_t shape[1] = { 16 };
	struct rtensor t;
	struct wire_msg *m;
	int efd;

	assert_true(prod >= 0 && reader >= 0);
	assert_int_equal(raw_hello(prod), 0);
	assert_int_equal(raw_hello(reader), 0);
	raw_create_seal_event(prod, "bye/x");
	assert_int_equal(raw_get_has_event(reader, "bye/x"), 0);
	efd = raw_memfd(64, F_SEAL_SHRINK | F_SEAL_GROW);
	assert_true(efd >= 0);
	assert_int_equal(raw_version(prod, "bye/e",
				     rtensor(&t, kDLFloat, 32, 1, shape, NULL,
					     0), 64, efd), 0);
	close(efd);
	assert_int_equal(raw_get_has_event(reader, "bye/e"), 0);
	f.id = next_id++;
	f.body_case = DLSHARE__FRAME__BODY_GOODBYE;
	f.goodbye = &gb;
	assert_int_equal(raw_call(prod, &f, NULL, 0, &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_OK);
	wire_msg_free(m);
	assert_int_equal(raw_get_has_event(reader, "bye/x"), 0);
	/* The export is withdrawn: its memory dies with the producer. */
	assert_int_equal(raw_get_has_event(reader, "bye/e"), -1);
	assert_int_equal(raw_alive(prod), 0);
	close(prod);
	assert_int_equal(raw_get_has_event(reader, "bye/x"), 0);
	close(reader);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- strings with a NUL inside, and keys given twice ---------------------------------- */

/* In the frames below, "@NUL@" stands for a NUL byte and four more bytes:
 * protobuf-c packs a C string, so the NUL goes in after packing. */
#define NUL_MARK "@NUL@"

/* Packs f, puts a NUL where NUL_MARK is (at least once), sends it with
 * fds, and returns the answer to f's id: the Error's code, 0 for any
 * other reply; *msg gets the Error's message (or ""). */
static int send_nul(int sock, Dlshare__Frame *f, const int *fds,
		    unsigned nfds, char *msg, size_t msglen)
{
	size_t len, marks = 0;
	struct wire_msg *m;
	uint8_t *buf;
	int ret = 0;

	f->nfds = nfds;
	f->has_nfds = nfds > 0;
	len = dlshare__frame__get_packed_size(f);
	buf = malloc(len);
	assert_non_null(buf);
	len = dlshare__frame__pack(f, buf);
	for (size_t i = 0; i + 5 <= len; i++)
		if (memcmp(buf + i, NUL_MARK, 5) == 0) {
			buf[i] = 0;
			marks++;
		}
	assert_true(marks > 0);
	assert_int_equal(raw_send_bytes(sock, buf, len, fds, nfds), 0);
	free(buf);
	msg[0] = 0;
	for (;;) {
		assert_int_equal(raw_recv(sock, harness_ms(5000), &m), 0);
		if (m->frame->id == f->id)
			break;
		wire_msg_free(m);
	}
	if (m->frame->body_case == DLSHARE__FRAME__BODY_ERROR) {
		ret = m->frame->error->code;
		snprintf(msg, msglen, "%s", m->frame->error->message ?
			 m->frame->error->message : "");
	}
	wire_msg_free(m);
	return ret;
}

/* A Create (fd < 0) or Publish (with fd) of n float32[4] tensors in one
 * 64-byte buffer, tensor i with keys[i] (NULL: none). */
struct kversion {
	Dlshare__Frame f;
	Dlshare__Create cr;
	Dlshare__Publish pu;
	struct rtensor t[4];
	Dlshare__Tensor *tp[4];
	struct rbuf b;
};

static Dlshare__Frame *kversion(struct kversion *k, const char *name,
				const char *const *keys, size_t n, int fd)
{
	int64_t sh[1] = { 4 };

	memset(k, 0, sizeof(*k));
	dlshare__frame__init(&k->f);
	for (size_t i = 0; i < n; i++) {
		k->tp[i] = rtensor(&k->t[i], kDLFloat, 32, 1, sh, NULL, 0);
		k->t[i].t.key = (char *)keys[i];
	}
	k->f.id = next_id++;
	if (fd < 0) {
		dlshare__create__init(&k->cr);
		k->cr.name = (char *)name;
		k->cr.n_tensors = n;
		k->cr.tensors = k->tp;
		k->cr.n_buffers = 1;
		k->cr.buffers = rbuf(&k->b, 64, 0);
		k->f.body_case = DLSHARE__FRAME__BODY_CREATE;
		k->f.create = &k->cr;
	} else {
		dlshare__publish__init(&k->pu);
		k->pu.name = (char *)name;
		k->pu.n_tensors = n;
		k->pu.tensors = k->tp;
		k->pu.n_buffers = 1;
		k->pu.buffers = rbuf(&k->b, 64, 1);
		k->f.body_case = DLSHARE__FRAME__BODY_PUBLISH;
		k->f.publish = &k->pu;
	}
	return &k->f;
}

/* Expects EINVAL for f (sent with fd when >= 0) with a message that
 * contains want, and a connection that still works. */
static void expect_refused(int sock, Dlshare__Frame *f, int fd,
			   const char *want, int nul)
{
	char msg[256];
	int code;

	if (nul) {
		code = send_nul(sock, f, fd >= 0 ? &fd : NULL, fd >= 0, msg,
				sizeof(msg));
	} else {
		struct wire_msg *m;

		assert_int_equal(raw_call(sock, f, fd >= 0 ? &fd : NULL,
					  fd >= 0, &m), 0);
		code = m->frame->body_case == DLSHARE__FRAME__BODY_ERROR ?
		       m->frame->error->code : 0;
		snprintf(msg, sizeof(msg), "%s",
			 code && m->frame->error->message ?
			 m->frame->error->message : "");
		wire_msg_free(m);
	}
	if (code != DLSHARE_EINVAL || !strstr(msg, want))
		fail_msg("body %d: answer %d \"%s\", want EINVAL with \"%s\"",
			 (int)f->body_case, code, msg, want);
	assert_int_equal(raw_alive(sock), 0);
}

static void strings_and_keys(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int dfds = harness_fd_count(fx->d.pid), fd;
	int sock = raw_connect(fx->d.sock);
	const char *none[2] = { NULL, NULL };
	const char *nulkey[2] = { "k" NUL_MARK "x", NULL };
	const char *twice[3] = { "a", "b", "a" };
	const char *empty[3] = { "", NULL, "" };
	struct util_want clean = UTIL_ANY;
	dlshare_name_info info;
	struct kversion k;

	assert_true(sock >= 0);
	assert_int_equal(raw_hello(sock), 0);
	clean.names = 0;
	clean.versions = 0;

	/* "ok\0../../x" is not "ok", in any request that names something. */
	expect_refused(sock, kversion(&k, "ok" NUL_MARK "../../x", none, 1, -1),
		       -1, "Create.name holds a NUL", 1);
	expect_refused(sock, kversion(&k, "ok", nulkey, 2, -1), -1,
		       "Tensor.key holds a NUL", 1);
	fd = raw_memfd(64, F_SEAL_SHRINK | F_SEAL_GROW);
	expect_refused(sock, kversion(&k, "ok" NUL_MARK "x", none, 1, fd), fd,
		       "Publish.name", 1);
	expect_refused(sock, kversion(&k, "ok", nulkey, 1, fd), fd,
		       "Tensor.key", 1);
	close(fd);
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Get g = DLSHARE__GET__INIT;
		Dlshare__Stat st = DLSHARE__STAT__INIT;
		Dlshare__Delete del = DLSHARE__DELETE__INIT;
		Dlshare__Seal se = DLSHARE__SEAL__INIT;
		Dlshare__Abort ab = DLSHARE__ABORT__INIT;
		Dlshare__List li = DLSHARE__LIST__INIT;
		char *bad = "ok" NUL_MARK "x";

		g.name = st.name = del.name = se.name = ab.name = bad;
		f.id = next_id++;
		f.body_case = DLSHARE__FRAME__BODY_GET;
		f.get = &g;
		expect_refused(sock, &f, -1, "get: the string Get.name", 1);
		f.id = next_id++;
		f.body_case = DLSHARE__FRAME__BODY_STAT;
		f.stat = &st;
		expect_refused(sock, &f, -1, "Stat.name", 1);
		f.id = next_id++;
		f.body_case = DLSHARE__FRAME__BODY_DELETE;
		f.delete_ = &del;
		expect_refused(sock, &f, -1, "Delete.name", 1);
		f.id = next_id++;
		f.body_case = DLSHARE__FRAME__BODY_SEAL;
		f.seal = &se;
		expect_refused(sock, &f, -1, "Seal.name", 1);
		f.id = next_id++;
		f.body_case = DLSHARE__FRAME__BODY_ABORT;
		f.abort = &ab;
		expect_refused(sock, &f, -1, "Abort.name", 1);
		f.id = next_id++;
		f.body_case = DLSHARE__FRAME__BODY_LIST;
		f.list = &li;
		li.prefix = bad;
		expect_refused(sock, &f, -1, "List.prefix", 1);
		f.id = next_id++;
		li.prefix = NULL;
		li.after = bad;
		expect_refused(sock, &f, -1, "List.after", 1);
	}
	/* None of it made "ok". */
	assert_int_equal(dlshare_stat(c, "ok", &info, NULL), DLSHARE_ENOENT);
	util_assert_want(c, &clean);

	/* A key given twice: the second tensor could only be found by its
	 * index. Unnamed tensors may be many. */
	expect_refused(sock, kversion(&k, "kk", twice, 3, -1), -1,
		       "tensors 0 and 2 have the same key \"a\"", 0);
	fd = raw_memfd(64, F_SEAL_SHRINK | F_SEAL_GROW);
	expect_refused(sock, kversion(&k, "kk", twice, 3, fd), fd,
		       "the same key \"a\"", 0);
	util_assert_want(c, &clean);
	{
		struct wire_msg *m;

		kversion(&k, "kk", empty, 3, fd);
		assert_int_equal(raw_call(sock, &k.f, &fd, 1, &m), 0);
		assert_int_equal(m->frame->body_case,
				 DLSHARE__FRAME__BODY_PUBLISH_REPLY);
		wire_msg_free(m);
	}
	close(fd);

	/* A Publish over the daemon's hard limit of buffers (64): its fd is
	 * closed too. */
	{
		struct rbuf bufs[65];
		Dlshare__Buffer *bp[65];
		struct wire_msg *m;

		kversion(&k, "many", none, 1, 0);
		for (size_t i = 0; i < 65; i++)
			bp[i] = *rbuf(&bufs[i], 64, i == 0);
		k.pu.n_buffers = 65;
		k.pu.buffers = bp;
		fd = raw_memfd(64, F_SEAL_SHRINK | F_SEAL_GROW);
		assert_int_equal(raw_call(sock, &k.f, &fd, 1, &m), 0);
		assert_int_equal(m->frame->body_case,
				 DLSHARE__FRAME__BODY_ERROR);
		assert_int_equal(m->frame->error->code, DLSHARE_ELIMIT);
		wire_msg_free(m);
		close(fd);
	}
	close(sock);
	/* The export went with its connection; every fd of a refused
	 * request was closed. */
	util_assert_want(c, &clean);
	assert_int_equal(harness_wait_fds(fx->d.pid, dfds), dfds);
	dlshare_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(misbehaving_peers, setup, teardown),
		cmocka_unit_test_setup_teardown(bad_requests_keep_connection, setup, teardown),
		cmocka_unit_test_setup_teardown(buffer_gone_to_holders, setup, teardown),
		cmocka_unit_test_setup_teardown(parked_reply_before_gone, setup, teardown),
		cmocka_unit_test_setup_teardown(releases_ride_on_requests, setup, teardown),
		cmocka_unit_test_setup_teardown(library_releases_ride, setup, teardown),
		cmocka_unit_test_setup_teardown(goodbye_forgets_events, setup, teardown),
		cmocka_unit_test_setup_teardown(get_name_checked, setup, teardown),
		cmocka_unit_test_setup_teardown(ten_thousand_releases, setup, teardown),
		cmocka_unit_test_setup_teardown(release_before_reset, setup, teardown),
		cmocka_unit_test_setup_teardown(releases_wait_for_room, setup, teardown),
		cmocka_unit_test_setup_teardown(strings_and_keys, setup, teardown),
	};

	return cmocka_run_group_tests_name("protocol", tests, NULL, NULL);
}
