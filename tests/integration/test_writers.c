/* test_writers — a pending version belongs to the writer that created it.
 *
 * Version numbers restart at 1 after a Delete, so (name, number) does not
 * name one pending version for the daemon's life: two writers of one
 * client may both hold a pending "x" version 1 in turn. A Seal or Abort
 * names its version by the writer id of its CreateReply (protocol 1.3),
 * and lands on nothing else: a stale writer's Seal fails with ENOENT and
 * leaves the new writer's version alone; 8 threads publishing through one
 * client while another client deletes the name every 2 ms (less often
 * while no publish gets through: a slow daemon) never make a
 * reader see data its producer did not write, and each failed publish
 * says why (its Seal found its version deleted), not what the library's
 * clean-up heard. On the wire, a writer id of another connection, or one
 * that was never handed out, finds nothing and harms nothing. More
 * pending writers than the library keeps memfds for (to write-seal them
 * itself) all publish.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "util.h"

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

/* ---- one client, two writers of one name ----------------------------------------- */

static const int64_t shape16[1] = { 16 }; /* 64 bytes of float32 */

static dlshare_writer *create16(dlshare_client *c, const char *name,
				uint32_t seed)
{
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1,
				     .shape = shape16 };
	dlshare_writer *w = NULL;
	int err = dlshare_create(c, name, &spec, 1, NULL, &w);

	if (err)
		fail_msg("create %s: %s [%s]", name, dlshare_strerror(err),
			 dlshare_last_error());
	harness_fill(dlshare_writer_tensor(w, 0)->data, 64, seed);
	return w;
}

/* w1 = create("x"); another client deletes "x"; w2 = create("x") is
 * pending version 1 again. w1's Seal must not reach w2's version, nor
 * must the library's clean-up after the failed Seal. */
static void stale_writer_one_client(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *other = harness_connect(&fx->d);
	dlshare_writer *w1, *w2;
	uint64_t v = 0;
	int err;

	w1 = create16(c, "x", 1);
	assert_int_equal(dlshare_writer_version(w1), 1);
	assert_int_equal(dlshare_delete(other, "x"), 0);
	w2 = create16(c, "x", 2);
	assert_int_equal(dlshare_writer_version(w2), 1);

	/* w1's version died with the name: that is what its Seal says. */
	err = dlshare_seal(w1, NULL, &v);
	assert_int_equal(err, DLSHARE_ENOENT);
	if (strncmp(dlshare_last_error(), "seal", 4) != 0)
		fail_msg("the failed seal says \"%s\", not why the seal failed",
			 dlshare_last_error());

	/* w2 is untouched: it seals, and readers get its data. */
	err = dlshare_seal(w2, NULL, &v);
	if (err)
		fail_msg("w2's seal: %s [%s]", dlshare_strerror(err),
			 dlshare_last_error());
	assert_int_equal(v, 1);
	assert_int_equal(util_get_check(other, "x", NULL, DT_F32, 1, shape16,
					2, &v), 0);
	assert_int_equal(v, 1);

	/* The same with an abort: w1's abort leaves w2's version be. */
	w1 = create16(c, "y", 3);
	assert_int_equal(dlshare_delete(other, "y"), 0);
	w2 = create16(c, "y", 4);
	dlshare_writer_abort(w1);
	assert_int_equal(dlshare_seal(w2, NULL, &v), 0);
	assert_int_equal(util_get_check(other, "y", NULL, DT_F32, 1, shape16,
					4, NULL), 0);

	dlshare_disconnect(other);
	dlshare_disconnect(c);
}

/* ---- many writers of one client, a name deleted under them ------------------------- */

#define PUBLISHERS 8
#define READERS 2
#define ELEMS 512

struct race {
	const struct daemon_proc *d;
	dlshare_client *pub;         /* shared by the publishers */
	int64_t end_ms;
	atomic_int stop;
	atomic_long published, failed, reads, deletes;
	atomic_long bad_data, bad_cause, bad_other;
	char why[512];               /* the first problem, for the report */
	pthread_mutex_t lock;
};

static void race_note(struct race *r, atomic_long *counter, const char *fmt,
		      ...)
{
	va_list ap;

	if (atomic_fetch_add(counter, 1) != 0)
		return;
	pthread_mutex_lock(&r->lock);
	if (!r->why[0]) {
		va_start(ap, fmt);
		vsnprintf(r->why, sizeof(r->why), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&r->lock);
}

/* What a publish writes: element 0 is the tag (never 0), every element a
 * function of the tag and its index. */
static int64_t pattern(int64_t tag, size_t i)
{
	return tag ^ (int64_t)(i * UINT64_C(0x9E3779B97F4A7C15) >> 1);
}

struct pub_arg {
	struct race *r;
	int index;
};

static void *publisher(void *arg)
{
	struct pub_arg *pa = arg;
	struct race *r = pa->r;
	int64_t data[ELEMS], shape[1] = { ELEMS };
	DLManagedTensor mt = { 0 };
	DLManagedTensor *tp = &mt;

	mt.dl_tensor.data = data;
	mt.dl_tensor.device = (DLDevice){ kDLCPU, 0 };
	mt.dl_tensor.ndim = 1;
	mt.dl_tensor.dtype = DT_I64;
	mt.dl_tensor.shape = shape;
	for (int64_t seq = 1; !atomic_load(&r->stop); seq++) {
		int64_t tag = (int64_t)(pa->index + 1) << 40 | seq;
		int err;

		for (size_t i = 0; i < ELEMS; i++)
			data[i] = pattern(tag, i);
		/* Plain memory: copied into a store version (create, write,
		 * seal). No deleter: the memory is ours. */
		err = dlshare_publish(r->pub, "race/x", &tp, 1, NULL, NULL);
		if (!err) {
			atomic_fetch_add(&r->published, 1);
			continue;
		}
		atomic_fetch_add(&r->failed, 1);
		/* The one reason a publish fails here: its version was
		 * deleted before its Seal. */
		if (err != DLSHARE_ENOENT ||
		    strncmp(dlshare_last_error(), "seal", 4) != 0)
			race_note(r, &r->bad_cause,
				  "publish failed with %d (%s) saying \"%s\"",
				  err, dlshare_strerror(err),
				  dlshare_last_error());
	}
	return NULL;
}

static void *reader(void *arg)
{
	struct race *r = arg;
	dlshare_client *c = NULL;
	int err = dlshare_connect(r->d->sock, &c);

	if (err) {
		race_note(r, &r->bad_other, "reader connect: %d", err);
		return NULL;
	}
	while (!atomic_load(&r->stop)) {
		dlshare_bundle *b = NULL;
		const DLTensor *t;
		const int64_t *p;
		int64_t tag;

		err = dlshare_get(c, "race/x", NULL, &b);
		if (err == DLSHARE_ENOENT)
			continue;
		if (err) {
			race_note(r, &r->bad_other, "get: %d (%s) [%s]", err,
				  dlshare_strerror(err), dlshare_last_error());
			break;
		}
		atomic_fetch_add(&r->reads, 1);
		t = dlshare_bundle_tensor(b, 0);
		p = t ? (const int64_t *)((const char *)t->data +
					  t->byte_offset) : NULL;
		tag = p ? p[0] : 0;
		if (!p || t->ndim != 1 || t->shape[0] != ELEMS ||
		    (tag >> 40) < 1 || (tag >> 40) > PUBLISHERS ||
		    (tag & ((INT64_C(1) << 40) - 1)) == 0) {
			race_note(r, &r->bad_data,
				  "version %llu holds no publisher's data "
				  "(element 0 is %lld)",
				  (unsigned long long)dlshare_bundle_version(b),
				  (long long)tag);
		} else {
			for (size_t i = 0; i < ELEMS; i++)
				if (p[i] != pattern(tag, i)) {
					race_note(r, &r->bad_data,
						  "version %llu: element %zu "
						  "is %lld, its producer wrote "
						  "%lld",
						  (unsigned long long)
						  dlshare_bundle_version(b), i,
						  (long long)p[i],
						  (long long)pattern(tag, i));
					break;
				}
		}
		dlshare_bundle_free(b);
	}
	dlshare_disconnect(c);
	return NULL;
}

static void *deleter(void *arg)
{
	struct race *r = arg;
	dlshare_client *c = NULL;
	int err = dlshare_connect(r->d->sock, &c);

	if (err) {
		race_note(r, &r->bad_other, "deleter connect: %d", err);
		return NULL;
	}
	/* Every 2 ms while publishes get through between deletes. A daemon
	 * slow enough (valgrind on a slower CPU) that no publish completes
	 * within 2 ms would make every publish lose the race and prove
	 * nothing: the pause then doubles after each delete that no publish
	 * preceded, up to 256 ms, and falls back to 2 ms after a success.
	 * The race runs its time, and on until one publish and one delete
	 * happened (at most 20 s, scaled, more). */
	int64_t hard_end = r->end_ms + harness_ms(20000);
	long seen = 0;
	int pause_ms = 2;

	while (util_now_ms() < r->end_ms ||
	       ((atomic_load(&r->published) == 0 ||
		 atomic_load(&r->deletes) == 0) &&
		util_now_ms() < hard_end)) {
		long now_published = atomic_load(&r->published);

		err = dlshare_delete(c, "race/x");
		if (!err)
			atomic_fetch_add(&r->deletes, 1);
		else if (err != DLSHARE_ENOENT)
			race_note(r, &r->bad_other, "delete: %d", err);
		if (now_published != seen)
			pause_ms = 2;
		else if (pause_ms < 256)
			pause_ms *= 2;
		seen = now_published;
		util_sleep_ms(pause_ms);
	}
	atomic_store(&r->stop, 1);
	dlshare_disconnect(c);
	return NULL;
}

static void publish_while_deleted(void **state)
{
	struct fixture *fx = *state;
	struct race r = { .d = &fx->d };
	pthread_t pubs[PUBLISHERS], readers[READERS], del;
	struct pub_arg pa[PUBLISHERS];

	pthread_mutex_init(&r.lock, NULL);
	r.pub = harness_connect(&fx->d);
	r.end_ms = util_now_ms() + harness_ms(1500);
	for (int i = 0; i < PUBLISHERS; i++) {
		pa[i] = (struct pub_arg){ &r, i };
		assert_int_equal(pthread_create(&pubs[i], NULL, publisher,
						&pa[i]), 0);
	}
	for (int i = 0; i < READERS; i++)
		assert_int_equal(pthread_create(&readers[i], NULL, reader, &r),
				 0);
	assert_int_equal(pthread_create(&del, NULL, deleter, &r), 0);
	pthread_join(del, NULL);
	for (int i = 0; i < PUBLISHERS; i++)
		pthread_join(pubs[i], NULL);
	for (int i = 0; i < READERS; i++)
		pthread_join(readers[i], NULL);
	print_message("%ld published, %ld failed, %ld reads, %ld deletes\n",
		      atomic_load(&r.published), atomic_load(&r.failed),
		      atomic_load(&r.reads), atomic_load(&r.deletes));
	if (atomic_load(&r.bad_data) || atomic_load(&r.bad_cause) ||
	    atomic_load(&r.bad_other))
		fail_msg("%ld wrong versions read, %ld publishes failed for a "
			 "wrong reason, %ld other errors; first: %s",
			 atomic_load(&r.bad_data), atomic_load(&r.bad_cause),
			 atomic_load(&r.bad_other), r.why);
	assert_true(atomic_load(&r.published) > 0);
	assert_true(atomic_load(&r.deletes) > 0);
	/* Nothing is left pending or leased. */
	assert_int_equal(harness_wait_stats(r.pub, 0, -1, NULL), 0);
	dlshare_disconnect(r.pub);
	pthread_mutex_destroy(&r.lock);
}

/* ---- writer ids on the wire ------------------------------------------------------ */

static uint64_t next_id = 10;

/* Creates a one-tensor host version of 64 bytes; maps it and writes seed.
 * Returns the writer id (0 when the daemon sent none), *number the version
 * number. Fails the test on error. */
static uint64_t raw_create(int sock, const char *name, uint32_t seed,
			   uint64_t *number)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Create cr = DLSHARE__CREATE__INIT;
	Dlshare__Tensor t = DLSHARE__TENSOR__INIT, *tp = &t;
	Dlshare__DataType dt = DLSHARE__DATA_TYPE__INIT;
	Dlshare__Buffer b = DLSHARE__BUFFER__INIT, *bp = &b;
	Dlshare__Device dev = DLSHARE__DEVICE__INIT;
	int64_t shape[1] = { 16 };
	struct wire_msg *m;
	uint64_t writer;

	dt.code = kDLFloat;
	dt.bits = 32;
	dt.lanes = 1;
	t.dtype = &dt;
	t.n_shape = 1;
	t.shape = shape;
	dev.type = kDLCPU;
	b.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
	b.size = 64;
	b.device = &dev;
	cr.name = (char *)name;
	cr.n_tensors = 1;
	cr.tensors = &tp;
	cr.n_buffers = 1;
	cr.buffers = &bp;
	f.id = next_id++;
	f.body_case = DLSHARE__FRAME__BODY_CREATE;
	f.create = &cr;
	/* raw_call closes the fds that come: get the fd through our own
	 * receive instead. */
	assert_int_equal(raw_send(sock, &f, NULL, 0, 0), 0);
	{
		uint8_t *buf = malloc(1u << 16);
		int fds[WIRE_FDS_MAX];
		unsigned nfds = 0;
		size_t len = 0;
		void *p;

		assert_non_null(buf);
		assert_int_equal(wire_recv(sock, buf, 1u << 16, fds,
					   WIRE_FDS_MAX, &len, &nfds, 0), 0);
		assert_int_equal(wire_decode(buf, len, &m), 0);
		free(buf);
		assert_int_equal(m->frame->id, f.id);
		if (m->frame->body_case != DLSHARE__FRAME__BODY_CREATE_REPLY)
			fail_msg("create %s: %s", name,
				 m->frame->body_case ==
				 DLSHARE__FRAME__BODY_ERROR ?
				 m->frame->error->message : "not a CreateReply");
		assert_int_equal(nfds, 1);
		p = mmap(NULL, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0],
			 0);
		assert_true(p != MAP_FAILED);
		harness_fill(p, 64, seed);
		munmap(p, 64);
		close(fds[0]);
	}
	*number = m->frame->create_reply->version;
	writer = m->frame->create_reply->has_writer ?
		 m->frame->create_reply->writer : 0;
	wire_msg_free(m);
	return writer;
}

/* Sends Seal (abort 0) or Abort (abort 1) of (name, number) with writer
 * (0: none). Returns the Error code of the answer, or 0 for success. */
static int raw_end(int sock, int abort, const char *name, uint64_t number,
		   uint64_t writer)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Seal s = DLSHARE__SEAL__INIT;
	Dlshare__Abort a = DLSHARE__ABORT__INIT;
	struct wire_msg *m;
	int ret;

	f.id = next_id++;
	if (abort) {
		a.name = (char *)name;
		a.version = number;
		a.has_writer = writer != 0;
		a.writer = writer;
		f.body_case = DLSHARE__FRAME__BODY_ABORT;
		f.abort = &a;
	} else {
		s.name = (char *)name;
		s.version = number;
		s.has_writer = writer != 0;
		s.writer = writer;
		f.body_case = DLSHARE__FRAME__BODY_SEAL;
		f.seal = &s;
	}
	assert_int_equal(raw_call(sock, &f, NULL, 0, &m), 0);
	switch (m->frame->body_case) {
	case DLSHARE__FRAME__BODY_ERROR:
		ret = m->frame->error->code;
		break;
	case DLSHARE__FRAME__BODY_SEAL_REPLY:
		ret = abort ? 1 : 0;
		break;
	case DLSHARE__FRAME__BODY_OK:
		ret = abort ? 0 : 1;
		break;
	default:
		ret = 1;
	}
	wire_msg_free(m);
	return ret;
}

static void writer_ids_on_the_wire(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int a = raw_connect(fx->d.sock), b = raw_connect(fx->d.sock);
	uint64_t wa, wb, wa2, na, nb, na2;
	dlshare_bundle *bundle = NULL;

	assert_true(a >= 0 && b >= 0);
	assert_int_equal(raw_hello(a), 0);
	assert_int_equal(raw_hello(b), 0);
	wa = raw_create(a, "wire/a", 11, &na);
	wb = raw_create(b, "wire/b", 12, &nb);
	assert_true(wa != 0 && wb != 0 && wa != wb);
	assert_int_equal(na, 1);
	assert_int_equal(nb, 1);

	/* Another connection's writer id: not found, whatever the name. */
	assert_int_equal(raw_end(b, 0, "wire/a", na, wa), DLSHARE_ENOENT);
	assert_int_equal(raw_end(b, 1, "wire/a", na, wa), DLSHARE_ENOENT);
	assert_int_equal(raw_end(b, 0, "wire/b", nb, wa), DLSHARE_ENOENT);
	/* Nor by name and number alone (no writer id). */
	assert_int_equal(raw_end(b, 0, "wire/a", na, 0), DLSHARE_ENOENT);
	assert_int_equal(raw_end(b, 1, "wire/a", na, 0), DLSHARE_ENOENT);
	/* Ids never handed out, and one that names a version of another
	 * name of our own. */
	assert_int_equal(raw_end(a, 0, "wire/a", na, wa + wb + 1000),
			 DLSHARE_ENOENT);
	assert_int_equal(raw_end(a, 1, "wire/a", na, wa + wb + 1000),
			 DLSHARE_ENOENT);
	assert_int_equal(raw_end(a, 0, "wire/a", na, wb), DLSHARE_ENOENT);
	wa2 = raw_create(a, "wire/a2", 13, &na2);
	assert_int_equal(raw_end(a, 1, "wire/a", na, wa2), DLSHARE_ENOENT);
	assert_int_equal(raw_end(a, 0, "wire/a2", na2, wa), DLSHARE_ENOENT);

	/* Nothing was harmed: every version is still pending, and seals
	 * with its own id. */
	assert_int_equal(dlshare_get(c, "wire/a", NULL, &bundle),
			 DLSHARE_ENOENT);
	assert_int_equal(raw_end(a, 0, "wire/a", na, wa), 0);
	assert_int_equal(raw_end(b, 0, "wire/b", nb, wb), 0);
	assert_int_equal(raw_end(a, 1, "wire/a2", na2, wa2), 0);
	assert_int_equal(util_get_check(c, "wire/a", NULL, DT_F32, 1, shape16,
					11, NULL), 0);
	assert_int_equal(util_get_check(c, "wire/b", NULL, DT_F32, 1, shape16,
					12, NULL), 0);
	/* A sealed writer is gone: its id finds nothing any more. */
	assert_int_equal(raw_end(a, 0, "wire/a", na, wa), DLSHARE_ENOENT);
	assert_int_equal(raw_end(a, 1, "wire/a", na, wa), DLSHARE_ENOENT);
	assert_int_equal(util_get_check(c, "wire/a", NULL, DT_F32, 1, shape16,
					11, NULL), 0);

	/* A writer id never comes back: not after a Delete and Create of the
	 * same name and number. */
	assert_int_equal(dlshare_delete(c, "wire/a"), 0);
	wa2 = raw_create(a, "wire/a", 14, &na2);
	assert_int_equal(na2, 1);
	assert_true(wa2 > wa && wa2 > wb);
	assert_int_equal(raw_end(a, 0, "wire/a", 1, wa), DLSHARE_ENOENT);
	assert_int_equal(raw_end(a, 0, "wire/a", 1, wa2), 0);
	assert_int_equal(util_get_check(c, "wire/a", NULL, DT_F32, 1, shape16,
					14, NULL), 0);

	close(a);
	close(b);
	dlshare_disconnect(c);
}

/* ---- more pending writers than the library keeps fds for ------------------------- */

/* The library keeps the memfd of at most 64 pending store writers of a
 * client (CLIENT_SEAL_FDS_MAX, client/internal.h) to write-seal them
 * itself at dlshare_seal; the daemon seals the others on its thread pool.
 * 80 writers at once: the process holds 64 more fds, not 80, and every
 * version, kept fd or not, is published whole and reads back. */
#define KEPT_FDS 64
#define MANY_WRITERS 80

static void more_writers_than_kept_fds(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_writer *w[MANY_WRITERS];
	char name[32];
	int before, after;

	before = harness_fd_count(getpid());
	for (int i = 0; i < MANY_WRITERS; i++) {
		snprintf(name, sizeof(name), "many/%d", i);
		w[i] = create16(c, name, (uint32_t)i + 1);
	}
	after = harness_fd_count(getpid());
	assert_int_equal(after - before, KEPT_FDS);
	/* Sealed in reverse: the writers without a kept fd go first. */
	for (int i = MANY_WRITERS - 1; i >= 0; i--)
		assert_int_equal(dlshare_seal(w[i], NULL, NULL), 0);
	assert_int_equal(harness_fd_count(getpid()), before);
	for (int i = 0; i < MANY_WRITERS; i++) {
		snprintf(name, sizeof(name), "many/%d", i);
		assert_int_equal(util_get_check(c, name, NULL, DT_F32, 1,
						shape16, (uint32_t)i + 1, NULL),
				 0);
		assert_int_equal(dlshare_delete(c, name), 0);
	}
	dlshare_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(stale_writer_one_client, setup, teardown),
		cmocka_unit_test_setup_teardown(publish_while_deleted, setup, teardown),
		cmocka_unit_test_setup_teardown(writer_ids_on_the_wire, setup, teardown),
		cmocka_unit_test_setup_teardown(more_writers_than_kept_fds, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
