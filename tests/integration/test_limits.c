/* test_limits — every named limit of the daemon, crossed: started with a
 * small value, the request past it gets DLSHARE_ELIMIT (or the peer is cut
 * off, for the framing limits), nobody else suffers, and once the cause
 * goes the same request works again. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "util.h"

static int teardown(void **state)
{
	return util_teardown(state);
}

static const int64_t shape[1] = { 1024 };

#define AWAIT(c, name) CHILD_CHECK(util_await(c, name, 0, harness_ms(20000), NULL) > 0)

/* A well-behaved client in its own process. */
static int good_client(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	int64_t sh[1] = { 100 };

	CHILD_OK(util_store(c, "lim/good", DT_F32, 1, sh, 42, NULL));
	CHILD_OK(util_get_check(c, "lim/good", NULL, DT_F32, 1, sh, 42, NULL));
	CHILD_OK(dlshare_delete(c, "lim/good"));
	dlshare_disconnect(c);
	return 0;
}

/* ---- --max-connections ---------------------------------------------------------- */

static int setup_conns(void **state)
{
	static const char *const args[] = { "--max-connections", "3", NULL };

	return util_setup_fdcheck(state, args);
}

static int refused_client(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = NULL;
	int err = dlshare_connect(d->sock, &c), code, sock;

	if (err == 0) {
		/* Connected after all? Then it must not work. */
		err = dlshare_stats_get(c, &(dlshare_stats){ 0 });
		dlshare_disconnect(c);
		CHILD_CHECK(err != 0);
	}
	CHILD_CHECK(err == DLSHARE_ELIMIT || err == DLSHARE_ECONN);
	/* On the wire: an Error saying why, then the door. */
	sock = raw_connect(d->sock);
	CHILD_CHECK(sock >= 0);
	CHILD_CHECK(raw_expect_hangup(sock, harness_ms(5000), &code) == 0);
	CHILD_CHECK(code == DLSHARE_ELIMIT);
	close(sock);
	return 0;
}

static int admitted_client(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	CHILD_OK(dlshare_stats_get(c, &(dlshare_stats){ 0 }));
	dlshare_disconnect(c);
	return 0;
}

static void max_connections(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c[3];
	int fds;

	c[0] = harness_connect(&fx->d);
	assert_int_equal(harness_wait_stats(c[0], -1, 1, NULL), 0);
	fds = harness_fd_count(fx->d.pid);
	c[1] = harness_connect(&fx->d);
	c[2] = harness_connect(&fx->d);
	assert_int_equal(harness_wait_stats(c[0], -1, 3, NULL), 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, refused_client, NULL)), 0);
	/* Those inside were not disturbed. */
	for (int i = 0; i < 3; i++)
		util_stats(c[i]);
	/* One leaves, one more may come in. */
	dlshare_disconnect(c[2]);
	assert_int_equal(harness_wait_stats(c[0], -1, 2, NULL), 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, admitted_client, NULL)), 0);
	dlshare_disconnect(c[1]);
	assert_int_equal(harness_wait_stats(c[0], -1, 1, NULL), 0);
	assert_int_equal(harness_wait_fds(fx->d.pid, fds), fds);
	dlshare_disconnect(c[0]);
}

/* ---- --max-inflight ----------------------------------------------------------------- */

static int setup_inflight(void **state)
{
	static const char *const args[] = { "--max-inflight", "2", NULL };

	return util_setup_fdcheck(state, args);
}

struct parked_get {
	dlshare_client *c;
	int err;
	uint64_t version;
};

static void *parked_get(void *arg)
{
	struct parked_get *p = arg;
	dlshare_get_opts o = { .timeout_ms = harness_ms(20000) };
	dlshare_bundle *b;

	p->err = dlshare_get(p->c, "lim/w", &o, &b);
	if (!p->err) {
		p->version = dlshare_bundle_version(b);
		dlshare_bundle_free(b);
	}
	return NULL;
}

/* Another connection has its own allowance. */
static int other_waiter(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_get_opts o = { .timeout_ms = harness_ms(20000) };
	uint64_t v;

	CHILD_OK(util_get_check(c, "lim/w", &o, DT_F32, 1, shape, 5, &v));
	CHILD_CHECK(v == 1);
	dlshare_disconnect(c);
	return 0;
}

static int w_publisher(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	CHILD_OK(util_store(c, "lim/w", DT_F32, 1, shape, 5, NULL));
	dlshare_disconnect(c);
	return 0;
}

static void max_inflight(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_get_opts o = { .timeout_ms = harness_ms(20000) };
	struct parked_get pg[2] = { { .c = c }, { .c = c } };
	struct util_want w = UTIL_ANY;
	dlshare_bundle *b;
	pthread_t th[2];
	pid_t other;
	int64_t t0;

	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&th[i], NULL, parked_get, &pg[i]), 0);
	w.parked = 2;
	util_assert_want(c, &w);
	/* The third waiting get on this connection is refused, at once. */
	t0 = util_now_ms();
	assert_int_equal(dlshare_get(c, "lim/w", &o, &b), DLSHARE_ELIMIT);
	assert_true(util_now_ms() - t0 < o.timeout_ms);
	/* A get that does not wait is not in flight. */
	assert_int_equal(dlshare_get(c, "lim/w", NULL, &b), DLSHARE_ENOENT);
	other = util_spawn(&fx->d, other_waiter, NULL);
	w.parked = 3;
	util_assert_want(c, &w);

	assert_int_equal(util_wait(util_spawn(&fx->d, w_publisher, NULL)), 0);
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(pg[i].err, 0);
		assert_int_equal(pg[i].version, 1);
	}
	assert_int_equal(util_wait(other), 0);
	/* The allowance is back. */
	o.select = DLSHARE_NEWER_THAN;
	o.version = 1;
	o.timeout_ms = harness_ms(100);
	assert_int_equal(dlshare_get(c, "lim/w", &o, &b), DLSHARE_ETIMEDOUT);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- --max-leases --------------------------------------------------------------------- */

static int setup_leases(void **state)
{
	static const char *const args[] = { "--max-leases", "3", NULL };

	return util_setup_fdcheck(state, args);
}

static int lease_hog(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *b[4];
	DLManagedTensor *m;
	int err = -1;

	CHILD_OK(dlshare_get(c, "lim/l", NULL, &b[0]));
	CHILD_OK(dlshare_get(c, "lim/l", NULL, &b[1]));
	CHILD_OK(dlshare_get_tensor(c, "lim/l", NULL, &m));
	CHILD_ERR(dlshare_get(c, "lim/l", NULL, &b[3]), DLSHARE_ELIMIT);
	CHILD_ERR(dlshare_get_tensor(c, "lim/l", NULL, &m), DLSHARE_ELIMIT);
	/* Exports of a bundle share its lease: no new one needed. */
	DLManagedTensor *e;
	CHILD_OK(dlshare_bundle_export(b[0], 0, &e));
	CHILD_OK(util_post(c, "lim/l.full", 1));
	/* Waiting by get would need a lease: ask stat instead. */
	CHILD_CHECK(util_await_name(c, "lim/l.checked", harness_ms(20000)) == 0);
	/* Give one back (asynchronously): then one more fits again. */
	dlshare_bundle_free(b[1]);
	for (int waited = 0; waited < harness_ms(5000); waited += 10) {
		err = dlshare_get(c, "lim/l", NULL, &b[3]);
		if (err != DLSHARE_ELIMIT)
			break;
		util_sleep_ms(10);
	}
	CHILD_OK(err);
	CHILD_CHECK(util_check(dlshare_bundle_tensor(b[3], 0), DT_F32, 1,
			       shape, 8) == 0);
	dlshare_bundle_free(b[3]);
	dlshare_bundle_free(b[0]);
	e->deleter(e);
	m->deleter(m);
	dlshare_disconnect(c);
	return 0;
}

static void max_leases(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	pid_t p;

	assert_int_equal(util_store(c, "lim/l", DT_F32, 1, shape, 8, NULL), 0);
	p = util_spawn(&fx->d, lease_hog, NULL);
	assert_true(util_await(c, "lim/l.full", 0, harness_ms(20000), NULL) > 0);
	/* The limit is per connection: ours still gets. */
	assert_int_equal(util_get_check(c, "lim/l", NULL, DT_F32, 1, shape, 8,
					NULL), 0);
	assert_int_equal(util_post(c, "lim/l.checked", 1), 0);
	assert_int_equal(util_wait(p), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- --max-tensors and --max-buffers --------------------------------------------------------- */

static int setup_tensors(void **state)
{
	static const char *const args[] = {
		"--max-tensors", "4", "--max-buffers", "2", NULL,
	};

	return util_setup_fdcheck(state, args);
}

static int deleted;

static void counted_free(DLManagedTensor *self)
{
	deleted++;
	free(self->dl_tensor.data);
	free(self);
}

static int tensor_hog(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	int64_t sh[1] = { 16 };
	dlshare_tensor_spec specs[5];
	DLManagedTensor *ts[5];
	dlshare_publish_opts nocopy = { .flags = DLSHARE_PUBLISH_NO_COPY };
	dlshare_writer *w;
	uint64_t v;
	int slots[3];

	for (int i = 0; i < 5; i++)
		specs[i] = (dlshare_tensor_spec){ .dtype = DT_F32, .ndim = 1,
						  .shape = sh };
	/* Store: five tensors are one too many, four fit. */
	CHILD_ERR(dlshare_create(c, "lim/t", specs, 5, NULL, &w), DLSHARE_ELIMIT);
	CHILD_OK(dlshare_create(c, "lim/t", specs, 4, NULL, &w));
	for (int i = 0; i < 4; i++)
		harness_fill(dlshare_writer_tensor(w, (size_t)i)->data, 64,
			     (uint32_t)i);
	CHILD_OK(dlshare_seal(w, NULL, &v));

	/* A copied publish of five: refused, and still ours. */
	for (int i = 0; i < 5; i++) {
		ts[i] = calloc(1, sizeof(*ts[i]));
		ts[i]->dl_tensor.data = calloc(16, sizeof(float));
		ts[i]->dl_tensor.device.device_type = kDLCPU;
		ts[i]->dl_tensor.dtype = DT_F32;
		ts[i]->dl_tensor.ndim = 1;
		ts[i]->dl_tensor.shape = sh;
		ts[i]->deleter = counted_free;
	}
	CHILD_ERR(dlshare_publish(c, "lim/t5", ts, 5, NULL, NULL), DLSHARE_ELIMIT);
	CHILD_CHECK(deleted == 0);
	for (int i = 0; i < 5; i++)
		ts[i]->deleter(ts[i]);

	/* Exports in three separate allocations: three buffers, one too
	 * many; refused, and still ours. Two fit. */
	for (int i = 0; i < 3; i++) {
		CHILD_OK(dlshare_host_alloc(DT_F32, 1, sh, &ts[i]));
		harness_fill(ts[i]->dl_tensor.data, 64, 10 + (uint32_t)i);
		slots[i] = util_track(ts[i]);
	}
	CHILD_ERR(dlshare_publish(c, "lim/b", ts, 3, &nocopy, NULL),
		  DLSHARE_ELIMIT);
	CHILD_CHECK(util_deleted(slots[0]) == 0);
	CHILD_OK(dlshare_publish(c, "lim/b", ts, 2, &nocopy, NULL));
	ts[2]->deleter(ts[2]);
	CHILD_OK(util_post(c, "lim/t.done", 1));
	AWAIT(c, "lim/t.read");
	dlshare_disconnect(c);
	CHILD_CHECK(util_deleted(slots[0]) == 1 && util_deleted(slots[1]) == 1);
	return 0;
}

static void max_tensors_and_buffers(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int64_t sh[1] = { 16 };
	dlshare_bundle *b;
	dlshare_name_info info;
	pid_t p = util_spawn(&fx->d, tensor_hog, NULL);

	assert_true(util_await(c, "lim/t.done", 0, harness_ms(20000), NULL) > 0);
	assert_int_equal(dlshare_get(c, "lim/t", NULL, &b), 0);
	assert_int_equal(dlshare_bundle_count(b), 4);
	for (size_t i = 0; i < 4; i++)
		assert_int_equal(util_check(dlshare_bundle_tensor(b, i), DT_F32,
					    1, sh, (uint32_t)i), 0);
	dlshare_bundle_free(b);
	assert_int_equal(dlshare_stat(c, "lim/t5", &info, NULL), DLSHARE_ENOENT);
	assert_int_equal(dlshare_get(c, "lim/b", NULL, &b), 0);
	assert_int_equal(dlshare_bundle_count(b), 2);
	for (size_t i = 0; i < 2; i++)
		assert_int_equal(util_check(dlshare_bundle_tensor(b, i), DT_F32,
					    1, sh, 10 + (uint32_t)i), 0);
	dlshare_bundle_free(b);
	assert_int_equal(util_post(c, "lim/t.read", 1), 0);
	assert_int_equal(util_wait(p), 0);
	dlshare_disconnect(c);
}

/* ---- --max-bytes -------------------------------------------------------------------------------- */

static int setup_bytes(void **state)
{
	static const char *const args[] = { "--max-bytes", "1048576", NULL };

	return util_setup_fdcheck(state, args);
}

static const int64_t chunk[1] = { 600 * 1024 }; /* bytes, as uint8 */

static int bytes_holder(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *b;

	CHILD_OK(dlshare_get(c, "lim/a", NULL, &b));
	CHILD_OK(util_post(c, "lim/a.held", 1));
	AWAIT(c, "lim/a.release");
	CHILD_CHECK(util_check(dlshare_bundle_tensor(b, 0), DT_U8, 1, chunk,
			       1) == 0);
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
	return 0;
}

static void max_bytes(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_tensor_spec spec = { .dtype = DT_U8, .ndim = 1, .shape = chunk };
	int64_t big[1] = { 2 * 1024 * 1024 };
	DLManagedTensor *t;
	dlshare_writer *w;
	pid_t p;

	assert_int_equal(util_store(c, "lim/a", DT_U8, 1, chunk, 1, NULL), 0);
	/* 600 KiB more does not fit under 1 MiB, store or copy. */
	assert_int_equal(dlshare_create(c, "lim/b", &spec, 1, NULL, &w),
			 DLSHARE_ELIMIT);
	t = calloc(1, sizeof(*t));
	t->dl_tensor.data = calloc(1, (size_t)chunk[0]);
	t->dl_tensor.device.device_type = kDLCPU;
	t->dl_tensor.dtype = DT_U8;
	t->dl_tensor.ndim = 1;
	t->dl_tensor.shape = (int64_t *)chunk;
	t->deleter = counted_free;
	deleted = 0;
	assert_int_equal(dlshare_publish(c, "lim/b", &t, 1, NULL, NULL),
			 DLSHARE_ELIMIT);
	assert_int_equal(deleted, 0);
	t->deleter(t);
	/* Producer memory is not the daemon's: an export of 2 MiB is fine. */
	assert_int_equal(util_export(c, "lim/x", DT_U8, 1, big, 3, NULL, NULL), 0);

	/* Deleted but leased by another process: the bytes are still used. */
	p = util_spawn(&fx->d, bytes_holder, NULL);
	assert_true(util_await(c, "lim/a.held", 0, harness_ms(20000), NULL) > 0);
	assert_int_equal(dlshare_delete(c, "lim/a"), 0);
	assert_int_equal(dlshare_create(c, "lim/b", &spec, 1, NULL, &w),
			 DLSHARE_ELIMIT);
	assert_int_equal(util_post(c, "lim/a.release", 1), 0);
	assert_int_equal(util_wait(p), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	/* Freed: it fits now. A pending version counts too, until aborted. */
	assert_int_equal(dlshare_create(c, "lim/b", &spec, 1, NULL, &w), 0);
	dlshare_writer *w2;
	assert_int_equal(dlshare_create(c, "lim/c", &spec, 1, NULL, &w2),
			 DLSHARE_ELIMIT);
	dlshare_writer_abort(w);
	assert_int_equal(util_store(c, "lim/c", DT_U8, 1, chunk, 2, NULL), 0);
	assert_int_equal(util_get_check(c, "lim/c", NULL, DT_U8, 1, chunk, 2,
					NULL), 0);
	dlshare_disconnect(c);
}

/* ---- --max-output ----------------------------------------------------------------------------------- */

static int setup_output(void **state)
{
	static const char *const args[] = { "--max-output", "65536", NULL };

	return util_setup_fdcheck(state, args);
}

/* Sends Stats requests as fast as the daemon takes them and reads nothing;
 * then waits to be killed. */
static int non_reader(const struct daemon_proc *d, void *arg)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stats s = DLSHARE__STATS__INIT;
	int sock = raw_connect(d->sock), stalls = 0;

	CHILD_CHECK(sock >= 0);
	CHILD_CHECK(raw_hello(sock) == 0);
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &s;
	for (uint64_t id = 2; stalls < 200 && id < 1000000; id++) {
		int err;

		f.id = id;
		err = raw_send(sock, &f, NULL, 0, MSG_DONTWAIT);
		if (err == -EAGAIN) {
			stalls++;
			id--;
			util_sleep_ms(5);
			continue;
		}
		if (err)
			break; /* cut off already */
		stalls = 0;
	}
	for (;;)
		pause();
}

static void max_output(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int fds, cut;
	pid_t p;

	assert_int_equal(harness_wait_stats(c, -1, 1, NULL), 0);
	fds = harness_fd_count(fx->d.pid);
	p = util_spawn(&fx->d, non_reader, NULL);
	/* Its replies pile up in the daemon until --max-output cuts it off.
	 * The wait is generous, to allow a soft limit with a grace period. */
	struct util_want one = UTIL_ANY;
	dlshare_stats last;
	one.connections = 2;
	util_assert_want(c, &one);
	one.connections = 1;
	cut = util_wait_want(c, &one, &last);
	if (cut) {
		util_sleep_ms(harness_ms(10000));
		cut = util_wait_want(c, &one, &last);
	}
	/* Everyone else is served meanwhile. */
	util_stats(c);
	assert_int_equal(util_wait(util_spawn(&fx->d, good_client, NULL)), 0);
	util_kill(p);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	assert_int_equal(harness_wait_fds(fx->d.pid, fds), fds);
	dlshare_disconnect(c);
	if (cut)
		fail_msg("a peer that never reads was not disconnected "
			 "(connections %llu)",
			 (unsigned long long)last.connections);
}

/* ---- --max-fds ---------------------------------------------------------------------------------------- */

static int setup_fds(void **state)
{
	static const char *const args[] = {
		"--max-fds", "2", "--max-buffers", "2", NULL,
	};

	return util_setup_fdcheck(state, args);
}

static int setup_fds_odd(void **state)
{
	static const char *const args[] = {
		"--max-fds", "3", "--max-buffers", "3", NULL,
	};

	return util_setup_fdcheck(state, args);
}

/* Publishes one tensor per buffer, nbuf buffers, with nfds memfds attached
 * and the frame saying claimed. Returns the reply's Error code, 0 for a
 * PublishReply, 1 when the daemon hung up. */
static int raw_publish(int sock, unsigned nbuf, unsigned nfds,
		       unsigned claimed)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Publish pu = DLSHARE__PUBLISH__INIT;
	Dlshare__Tensor t[8], *tp[8];
	Dlshare__DataType dt = DLSHARE__DATA_TYPE__INIT;
	Dlshare__Buffer b[8], *bp[8];
	Dlshare__Device dev = DLSHARE__DEVICE__INIT;
	int64_t sh[1] = { 16 };
	int fds[8];
	uint8_t *data;
	size_t len;
	struct wire_msg *m;
	int ret, err;

	dt.code = kDLFloat;
	dt.bits = 32;
	dt.lanes = 1;
	dev.type = kDLCPU;
	for (unsigned i = 0; i < 8; i++) {
		dlshare__tensor__init(&t[i]);
		t[i].dtype = &dt;
		t[i].buffer = i;
		t[i].n_shape = 1;
		t[i].shape = sh;
		tp[i] = &t[i];
		dlshare__buffer__init(&b[i]);
		b[i].kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
		b[i].size = 64;
		b[i].device = &dev;
		b[i].has_fd_attached = 1;
		b[i].fd_attached = 1;
		bp[i] = &b[i];
		fds[i] = raw_memfd(64, F_SEAL_SHRINK | F_SEAL_GROW);
	}
	pu.name = "lim/fds";
	pu.n_tensors = nbuf;
	pu.tensors = tp;
	pu.n_buffers = nbuf;
	pu.buffers = bp;
	f.id = 77;
	f.body_case = DLSHARE__FRAME__BODY_PUBLISH;
	f.publish = &pu;
	f.has_nfds = 1;
	f.nfds = claimed;
	err = wire_encode(&f, 1u << 20, &data, &len);
	if (!err) {
		err = raw_send_bytes(sock, data, len, fds, nfds);
		free(data);
	}
	wire_close_fds(fds, 8);
	if (err)
		return 1;
	for (;;) {
		err = raw_recv(sock, harness_ms(5000), &m);
		if (err)
			return 1;
		if (m->frame->id == 77)
			break;
		wire_msg_free(m);
	}
	ret = m->frame->body_case == DLSHARE__FRAME__BODY_ERROR ?
	      m->frame->error->code :
	      m->frame->body_case == DLSHARE__FRAME__BODY_PUBLISH_REPLY ? 0 : 2;
	wire_msg_free(m);
	return ret;
}

struct fds_case {
	unsigned nbuf, nfds, claimed;
	int hangup; /* else: the reply code */
	int code;
};

static int fds_sender(const struct daemon_proc *d, void *arg)
{
	const struct fds_case *fc = arg;
	int sock = raw_connect(d->sock), ret, code;

	CHILD_CHECK(sock >= 0);
	CHILD_CHECK(raw_hello(sock) == 0);
	ret = raw_publish(sock, fc->nbuf, fc->nfds, fc->claimed);
	if (fc->hangup) {
		if (ret == 0)
			CHILD_FAIL("a packet with %u fds whose frame says %u "
				   "was accepted", fc->nfds, fc->claimed);
		if (ret != 1)
			CHILD_CHECK(raw_expect_hangup(sock, harness_ms(5000),
						      &code) == 0);
	} else {
		if (ret != fc->code)
			CHILD_FAIL("publish of %u buffers with %u fds: %d, "
				   "want %d", fc->nbuf, fc->nfds, ret, fc->code);
	}
	close(sock);
	return 0;
}

static void run_fds_cases(struct fixture *fx, const struct fds_case *cases,
			  size_t n)
{
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want clean = UTIL_ANY;
	int fds;

	assert_int_equal(harness_wait_stats(c, -1, 1, NULL), 0);
	fds = harness_fd_count(fx->d.pid);
	clean.connections = 1;
	clean.names = 0;
	clean.buffers = 0;
	for (size_t i = 0; i < n; i++) {
		fprintf(stderr, "-- %u buffers, %u fds, nfds %u\n",
			cases[i].nbuf, cases[i].nfds, cases[i].claimed);
		assert_int_equal(util_wait(util_spawn(&fx->d, fds_sender,
						      (void *)&cases[i])), 0);
		/* Every fd it sent is closed again in the daemon. */
		util_assert_want(c, &clean);
		assert_int_equal(harness_wait_fds(fx->d.pid, fds), fds);
		assert_int_equal(util_wait(util_spawn(&fx->d, good_client, NULL)), 0);
	}
	dlshare_disconnect(c);
}

static void max_fds(void **state)
{
	static const struct fds_case cases[] = {
		{ 2, 2, 2, 0, 0 },              /* at the limit: fine */
		{ 3, 3, 3, 1, 0 },              /* one fd too many: cut off */
		{ 2, 8, 2, 1, 0 },              /* many too many */
		{ 2, 1, 2, 1, 0 },              /* nfds lies */
	};

	run_fds_cases(*state, cases, sizeof(cases) / sizeof(cases[0]));
}

static void max_fds_odd(void **state)
{
	static const struct fds_case cases[] = {
		{ 3, 3, 3, 0, 0 },              /* at the limit: fine */
		/* With an odd --max-fds the control buffer has room for one
		 * more fd (CMSG_SPACE rounds up to 8 bytes): the kernel does
		 * not truncate, yet the packet carries more than allowed
		 * (and more than its frame says). */
		{ 3, 4, 3, 1, 0 },
		{ 3, 4, 4, 1, 0 },
	};

	run_fds_cases(*state, cases, sizeof(cases) / sizeof(cases[0]));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(max_connections, setup_conns, teardown),
		cmocka_unit_test_setup_teardown(max_inflight, setup_inflight, teardown),
		cmocka_unit_test_setup_teardown(max_leases, setup_leases, teardown),
		cmocka_unit_test_setup_teardown(max_tensors_and_buffers, setup_tensors, teardown),
		cmocka_unit_test_setup_teardown(max_bytes, setup_bytes, teardown),
		cmocka_unit_test_setup_teardown(max_output, setup_output, teardown),
		cmocka_unit_test_setup_teardown(max_fds, setup_fds, teardown),
		cmocka_unit_test_setup_teardown(max_fds_odd, setup_fds_odd, teardown),
	};

	return cmocka_run_group_tests_name("limits", tests, NULL, NULL);
}
