/* test_e2e — data published by one process is read bit for bit by another:
 * store and export mode, bundles, a large tensor, empty and 0-d tensors,
 * copies of plain and strided malloc'd memory, and a store version that
 * outlives its producer. Each test checks that the test process leaks no
 * fd. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "jobs.h"

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

/* Runs a producer and a consumer child of j; the consumer waits for the
 * version. With hold, the parent posts it once the consumer is done, so an
 * export stays published while it is read. */
static void produce_consume(const struct daemon_proc *d, struct job *j)
{
	char hold[300];
	pid_t prod, cons;

	snprintf(hold, sizeof(hold), "%s.done", j->name);
	j->hold = hold;
	j->timeout_ms = harness_ms(10000);
	cons = util_spawn(d, job_consume, j);
	prod = util_spawn(d, job_produce, j);
	assert_int_equal(util_wait(cons), 0);

	dlshare_client *c = harness_connect(d);
	assert_int_equal(util_post(c, hold, 1), 0);
	assert_int_equal(util_wait(prod), 0);
	/* Every lease went with its holder. */
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

static const struct tspec one_matrix[] = {
	{ "", DT_F32, 3, { 3, 5, 7 }, 11 },
};

static void store_roundtrip(void **state)
{
	struct fixture *fx = *state;
	struct job j = { .name = "e2e/store", .ts = one_matrix, .n = 1,
			 .mode = JOB_STORE, .want_version = 1 };

	produce_consume(&fx->d, &j);
}

static void export_roundtrip(void **state)
{
	struct fixture *fx = *state;
	struct job j = { .name = "e2e/export", .ts = one_matrix, .n = 1,
			 .mode = JOB_EXPORT, .want_version = 1 };

	produce_consume(&fx->d, &j);
}

/* Several dtypes and ranks, a 0-d scalar and an empty tensor, with keys. */
static const struct tspec bundle[] = {
	{ "weight", DT_F32, 2, { 16, 8 }, 1 },
	{ "bias", DT_F64, 1, { 8 }, 2 },
	{ "tokens", DT_I64, 3, { 2, 3, 4 }, 3 },
	{ "flag", DT_U8, 0, { 0 }, 4 },
	{ "empty", DT_I16, 2, { 0, 7 }, 5 },
	{ "layers.0.attn/q_proj", DT_I32, 4, { 2, 1, 3, 5 }, 6 },
};

static void bundle_store(void **state)
{
	struct fixture *fx = *state;
	struct job j = { .name = "e2e/bundle", .ts = bundle,
			 .n = sizeof(bundle) / sizeof(bundle[0]),
			 .mode = JOB_STORE };

	produce_consume(&fx->d, &j);
}

static void bundle_export(void **state)
{
	struct fixture *fx = *state;
	struct job j = { .name = "e2e/bundle-x", .ts = bundle,
			 .n = sizeof(bundle) / sizeof(bundle[0]),
			 .mode = JOB_EXPORT };

	produce_consume(&fx->d, &j);
}

/* Sixteen tensors with 60-byte keys: a reply longer than the daemon
 * keeps packed (GET_TAIL_MAX), where bundle's is kept. */
#define WIDE_KEY(i) "model.layers." #i ".self_attn.q_proj.weight.shard_of_sixteen"
static const struct tspec wide[] = {
	{ WIDE_KEY(00), DT_F32, 2, { 4, 8 }, 21 },
	{ WIDE_KEY(01), DT_F64, 1, { 8 }, 22 },
	{ WIDE_KEY(02), DT_I64, 3, { 2, 3, 4 }, 23 },
	{ WIDE_KEY(03), DT_U8, 0, { 0 }, 24 },
	{ WIDE_KEY(04), DT_I16, 2, { 0, 7 }, 25 },
	{ WIDE_KEY(05), DT_I32, 4, { 2, 1, 3, 5 }, 26 },
	{ WIDE_KEY(06), DT_F32, 1, { 1000 }, 27 },
	{ WIDE_KEY(07), DT_F32, 2, { 3, 3 }, 28 },
	{ WIDE_KEY(08), DT_F32, 2, { 5, 1 }, 29 },
	{ WIDE_KEY(09), DT_F64, 1, { 1 }, 30 },
	{ WIDE_KEY(10), DT_U8, 1, { 4096 }, 31 },
	{ WIDE_KEY(11), DT_I64, 1, { 9 }, 32 },
	{ WIDE_KEY(12), DT_I32, 2, { 7, 7 }, 33 },
	{ WIDE_KEY(13), DT_I16, 1, { 3 }, 34 },
	{ WIDE_KEY(14), DT_F32, 3, { 1, 2, 3 }, 35 },
	{ WIDE_KEY(15), DT_F32, 1, { 0 }, 36 },
};

/* A reader that gets the same version again (its fds sent before) gets
 * it whole, whether the daemon answers from the reply it keeps packed
 * (bundle) or encodes it again (wide, longer than it keeps), in store
 * and export mode. */
static void warm_gets(void **state)
{
	struct fixture *fx = *state;
	static const char *const names[2][2] = {
		{ "e2e/warm", "e2e/warm-x" }, { "e2e/wide", "e2e/wide-x" },
	};

	for (int set = 0; set < 2; set++) {
		for (int x = 0; x < 2; x++) {
			struct job j = {
				.name = names[set][x],
				.ts = set ? wide : bundle,
				.n = set ? sizeof(wide) / sizeof(wide[0]) :
					   sizeof(bundle) / sizeof(bundle[0]),
				.mode = x ? JOB_EXPORT : JOB_STORE,
				.gets = 4,
			};

			produce_consume(&fx->d, &j);
		}
	}
}

static const struct tspec large[] = {
	{ "big", DT_U8, 3, { 64, 1024, 1024 }, 77 }, /* 64 MiB */
};

static void large_store(void **state)
{
	struct fixture *fx = *state;
	struct job j = { .name = "e2e/large", .ts = large, .n = 1,
			 .mode = JOB_STORE };

	produce_consume(&fx->d, &j);
}

static const struct tspec large_x[] = {
	{ "big", DT_F32, 2, { 1024, 4096 }, 78 }, /* 16 MiB */
};

static void large_export(void **state)
{
	struct fixture *fx = *state;
	struct job j = { .name = "e2e/large-x", .ts = large_x, .n = 1,
			 .mode = JOB_EXPORT };

	produce_consume(&fx->d, &j);
}

static const struct tspec zero_size[] = {
	{ NULL, DT_F32, 2, { 4, 0 }, 9 },
};
static const struct tspec scalar[] = {
	{ NULL, DT_F64, 0, { 0 }, 10 },
};

static void zero_size_and_scalar(void **state)
{
	struct fixture *fx = *state;
	struct job js[] = {
		{ .name = "e2e/zero", .ts = zero_size, .n = 1, .mode = JOB_STORE },
		{ .name = "e2e/zero-x", .ts = zero_size, .n = 1, .mode = JOB_EXPORT },
		{ .name = "e2e/scalar", .ts = scalar, .n = 1, .mode = JOB_STORE },
		{ .name = "e2e/scalar-x", .ts = scalar, .n = 1, .mode = JOB_EXPORT },
	};

	for (size_t i = 0; i < sizeof(js) / sizeof(js[0]); i++)
		produce_consume(&fx->d, &js[i]);

	/* Never a NULL data pointer, also for no bytes: libtorch's
	 * at::fromDLPack does not call the deleter of a tensor whose data
	 * is NULL, and its lease would leak. */
	dlshare_client *c = harness_connect(&fx->d);
	int64_t shape[2] = { 0, 7 };
	DLManagedTensor *m;

	assert_int_equal(util_store(c, "e2e/empty", DT_I16, 2, shape, 1, NULL),
			 0);
	assert_int_equal(dlshare_get_tensor(c, "e2e/empty", NULL, &m), 0);
	assert_non_null(m->dl_tensor.data);
	m->deleter(m);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* A 0-d tensor has no dimensions, so its shape may be NULL, in a spec, in
 * dlshare_host_alloc() and in a DLTensor given to dlshare_publish(). */
static int null_shape_producer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_tensor_spec spec = { .dtype = DT_F64, .ndim = 0, .shape = NULL };
	dlshare_publish_opts nocopy = { .flags = DLSHARE_PUBLISH_NO_COPY };
	double v = 2.5;
	DLManagedTensor *t, plain = {
		.dl_tensor = { .data = &v, .device = { kDLCPU, 0 },
			       .ndim = 0, .dtype = DT_F64, .shape = NULL },
	};
	DLManagedTensor *pp = &plain;
	dlshare_writer *w;

	CHILD_OK(dlshare_create(c, "e2e/null-shape", &spec, 1, NULL, &w));
	memcpy(dlshare_writer_tensor(w, 0)->data, &v, sizeof(v));
	CHILD_OK(dlshare_seal(w, NULL, NULL));
	CHILD_OK(dlshare_host_alloc(DT_F64, 0, NULL, &t));
	memcpy(t->dl_tensor.data, &v, sizeof(v));
	CHILD_OK(dlshare_publish(c, "e2e/null-shape-x", &t, 1, &nocopy, NULL));
	CHILD_OK(dlshare_publish(c, "e2e/null-shape-c", &pp, 1, NULL, NULL));
	CHILD_OK(util_post(c, "e2e/null-shape.ready", 1));
	CHILD_CHECK(util_await(c, "e2e/null-shape.done", 0, harness_ms(20000),
			       NULL) > 0);
	dlshare_disconnect(c);
	return 0;
}

static int null_shape_consumer(const struct daemon_proc *d, void *arg)
{
	static const char *const names[] = {
		"e2e/null-shape", "e2e/null-shape-x", "e2e/null-shape-c",
	};
	dlshare_client *c = util_child_connect(d);

	for (size_t i = 0; i < 3; i++) {
		DLManagedTensor *m;
		double v;

		CHILD_OK(dlshare_get_tensor(c, names[i], NULL, &m));
		CHILD_CHECK(m->dl_tensor.ndim == 0);
		memcpy(&v, (char *)m->dl_tensor.data + m->dl_tensor.byte_offset,
		       sizeof(v));
		CHILD_CHECK(v == 2.5);
		m->deleter(m);
	}
	CHILD_OK(util_post(c, "e2e/null-shape.done", 1));
	dlshare_disconnect(c);
	return 0;
}

/* Found by the sanitizer build: dlshare_create and dlshare_host_alloc used
 * to memcpy() from a NULL shape when ndim was 0 (undefined behaviour). */
static void scalar_null_shape(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	pid_t p = util_spawn(&fx->d, null_shape_producer, NULL);
	int64_t ready = 0;
	int st;

	/* Wait for the producer, unless it dies first. */
	for (int waited = 0; ready <= 0 && waited < harness_ms(20000);
	     waited += 50) {
		ready = util_await(c, "e2e/null-shape.ready", 0, 50, NULL);
		if (ready <= 0 && util_exited(p, &st))
			fail_msg("the producer ended first, status %d", st);
	}
	assert_true(ready > 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, null_shape_consumer,
					      NULL)), 0);
	assert_int_equal(util_wait(p), 0);
	dlshare_disconnect(c);
}

/* ---- copies of memory the library cannot share ---------------------------- */

static int plain_deleted;

static void plain_deleter(DLManagedTensor *self)
{
	plain_deleted++;
	free(self->dl_tensor.data);
	free(self->dl_tensor.shape);
	free(self->dl_tensor.strides);
	free(self);
}

/* A malloc'd managed tensor of A, a rows x cols int32 matrix filled with
 * harness_fill(seed), seen through shape/strides/byte_offset. */
static DLManagedTensor *malloc_view(int rows, int cols, uint32_t seed,
				    int ndim, const int64_t *shape,
				    const int64_t *strides, uint64_t offset)
{
	DLManagedTensor *m = calloc(1, sizeof(*m));
	size_t n = (size_t)rows * cols * sizeof(int32_t);

	if (!m)
		return NULL;
	m->dl_tensor.data = malloc(n);
	m->dl_tensor.shape = calloc(4, sizeof(int64_t));
	if (strides)
		m->dl_tensor.strides = calloc(4, sizeof(int64_t));
	harness_fill(m->dl_tensor.data, n, seed);
	m->dl_tensor.device.device_type = kDLCPU;
	m->dl_tensor.dtype = DT_I32;
	m->dl_tensor.ndim = ndim;
	memcpy(m->dl_tensor.shape, shape, (size_t)ndim * sizeof(int64_t));
	if (strides)
		memcpy(m->dl_tensor.strides, strides,
		       (size_t)ndim * sizeof(int64_t));
	m->dl_tensor.byte_offset = offset;
	m->deleter = plain_deleter;
	return m;
}

static int copy_producer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	int64_t shape[2] = { 10, 3 };
	dlshare_publish_opts nocopy = { .flags = DLSHARE_PUBLISH_NO_COPY };
	dlshare_name_info info;
	DLManagedTensor *m;
	uint64_t v = 0;

	/* Plain memory is copied, and its deleter runs once, at once. */
	m = malloc_view(10, 3, 21, 2, shape, NULL, 0);
	CHILD_CHECK(m != NULL);
	CHILD_OK(dlshare_publish(c, "copy/plain", &m, 1, NULL, &v));
	CHILD_CHECK(v == 1);
	CHILD_CHECK(plain_deleted == 1);
	CHILD_OK(dlshare_stat(c, "copy/plain", &info, NULL));
	CHILD_CHECK(info.exported == 0);

	/* No copies allowed: a clear error, and the tensor is still ours. */
	m = malloc_view(10, 3, 22, 2, shape, NULL, 0);
	CHILD_CHECK(m != NULL);
	CHILD_ERR(dlshare_publish(c, "copy/nocopy", &m, 1, &nocopy, &v),
		  DLSHARE_ECOPY);
	CHILD_CHECK(plain_deleted == 1);
	CHILD_ERR(dlshare_stat(c, "copy/nocopy", &info, NULL), DLSHARE_ENOENT);
	CHILD_CHECK(((int32_t *)m->dl_tensor.data)[0] != 0 ||
		    ((int32_t *)m->dl_tensor.data)[1] != 0);
	m->deleter(m);
	CHILD_CHECK(plain_deleted == 2);

	/* Strided views of a 4x6 matrix, copied into compact layout:
	 * its transpose, every other column from column 1, rows reversed. */
	int64_t tshape[2] = { 6, 4 }, tstrides[2] = { 1, 6 };
	int64_t sshape[2] = { 4, 3 }, sstrides[2] = { 6, 2 };
	int64_t rshape[2] = { 4, 6 }, rstrides[2] = { -6, 1 };
	DLManagedTensor *views[3] = {
		malloc_view(4, 6, 23, 2, tshape, tstrides, 0),
		malloc_view(4, 6, 23, 2, sshape, sstrides, 1 * sizeof(int32_t)),
		malloc_view(4, 6, 23, 2, rshape, rstrides,
			    3 * 6 * sizeof(int32_t)),
	};
	const char *keys[3] = { "transposed", "odd-columns", "reversed" };
	dlshare_publish_opts ko = { .keys = keys };

	CHILD_CHECK(views[0] && views[1] && views[2]);
	CHILD_OK(dlshare_publish(c, "copy/strided", views, 3, &ko, &v));
	CHILD_CHECK(plain_deleted == 5);
	dlshare_disconnect(c);
	return 0;
}

static int check_i32(const DLTensor *t, int rows, int cols,
		     const int32_t *want)
{
	if (!t || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols ||
	    t->strides || t->dtype.code != kDLInt || t->dtype.bits != 32)
		return 1;
	return memcmp((const char *)t->data + t->byte_offset, want,
		      (size_t)rows * cols * sizeof(int32_t)) != 0;
}

static int copy_consumer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	int64_t shape[2] = { 10, 3 };
	int32_t a[4][6], want[24];
	dlshare_bundle *b;
	int k;

	CHILD_CHECK(util_get_check(c, "copy/plain", NULL, DT_I32, 2, shape,
				   21, NULL) == 0);
	CHILD_ERR(dlshare_get(c, "copy/nocopy", NULL, &b), DLSHARE_ENOENT);

	harness_fill(a, sizeof(a), 23);
	CHILD_OK(dlshare_get(c, "copy/strided", NULL, &b));
	CHILD_CHECK(dlshare_bundle_count(b) == 3);

	k = 0;
	for (int i = 0; i < 6; i++)
		for (int j = 0; j < 4; j++)
			want[k++] = a[j][i];
	CHILD_CHECK(check_i32(dlshare_bundle_tensor(b, (size_t)dlshare_bundle_find(b, "transposed")),
			      6, 4, want) == 0);
	k = 0;
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 3; j++)
			want[k++] = a[i][1 + 2 * j];
	CHILD_CHECK(check_i32(dlshare_bundle_tensor(b, (size_t)dlshare_bundle_find(b, "odd-columns")),
			      4, 3, want) == 0);
	k = 0;
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 6; j++)
			want[k++] = a[3 - i][j];
	CHILD_CHECK(check_i32(dlshare_bundle_tensor(b, (size_t)dlshare_bundle_find(b, "reversed")),
			      4, 6, want) == 0);
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
	return 0;
}

static void publish_copies(void **state)
{
	struct fixture *fx = *state;

	assert_int_equal(util_wait(util_spawn(&fx->d, copy_producer, NULL)), 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, copy_consumer, NULL)), 0);
}

/* Layouts that take each path of the copy into the daemon's buffer: one
 * pwrite (compact, with and without explicit strides), pwritev batches
 * (rows of 4,200 bytes, more of them than one call takes), and gathers
 * through the bounce buffer (a transpose, more than one buffer's worth). */
static void keep_deleter(DLManagedTensor *self)
{
	(void)self; /* the source is the test's */
}

static int runs_child(const struct daemon_proc *d, void *arg)
{
	enum { R = 1200, C = 1100 };
	static const struct {
		const char *name;
		int64_t shape[2], strides[2];
		int strided;
		int64_t first; /* element */
	} cases[] = {
		{ "runs/compact", { R, C }, { C, 1 }, 0, 0 },
		{ "runs/compact-strided", { R, C }, { C, 1 }, 1, 0 },
		{ "runs/rows", { R, 1050 }, { C, 1 }, 1, 3 },
		{ "runs/transposed", { 600, 700 }, { 1, C }, 1, 5 },
	};
	dlshare_client *c = util_child_connect(d);
	dlshare_publish_opts o = { .flags = DLSHARE_PUBLISH_COPY };
	int32_t *a = malloc((size_t)R * C * sizeof(int32_t));

	CHILD_CHECK(a != NULL);
	harness_fill(a, (size_t)R * C * sizeof(int32_t), 31);
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		DLManagedTensor mt = { 0 }, *mp = &mt;
		int64_t shape[2], strides[2];
		const DLTensor *t;
		const int32_t *got;
		dlshare_bundle *b;

		memcpy(shape, cases[k].shape, sizeof(shape));
		memcpy(strides, cases[k].strides, sizeof(strides));
		mt.dl_tensor.data = a;
		mt.dl_tensor.device.device_type = kDLCPU;
		mt.dl_tensor.dtype = DT_I32;
		mt.dl_tensor.ndim = 2;
		mt.dl_tensor.shape = shape;
		mt.dl_tensor.strides = cases[k].strided ? strides : NULL;
		mt.dl_tensor.byte_offset =
			(uint64_t)cases[k].first * sizeof(int32_t);
		mt.deleter = keep_deleter;
		CHILD_OK(dlshare_publish(c, cases[k].name, &mp, 1, &o, NULL));
		CHILD_OK(dlshare_get(c, cases[k].name, NULL, &b));
		t = dlshare_bundle_tensor(b, 0);
		CHILD_CHECK(t->ndim == 2 && t->shape[0] == shape[0] &&
			    t->shape[1] == shape[1] && !t->strides);
		got = (const int32_t *)((const char *)t->data + t->byte_offset);
		for (int64_t i = 0; i < shape[0]; i++)
			for (int64_t j = 0; j < shape[1]; j++)
				CHILD_CHECK(got[i * shape[1] + j] ==
					    a[cases[k].first + i * strides[0] +
					      j * strides[1]]);
		dlshare_bundle_free(b);
	}
	free(a);
	dlshare_disconnect(c);
	return 0;
}

static void publish_copy_runs(void **state)
{
	struct fixture *fx = *state;

	assert_int_equal(util_wait(util_spawn(&fx->d, runs_child, NULL)), 0);
}

/* ---- a store version outlives its producer ----------------------------------- */

static void store_outlives_producer(void **state)
{
	struct fixture *fx = *state;
	struct job j = { .name = "e2e/orphan", .ts = bundle,
			 .n = sizeof(bundle) / sizeof(bundle[0]),
			 .mode = JOB_STORE };
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want gone = UTIL_ANY;

	assert_int_equal(util_wait(util_spawn(&fx->d, job_produce, &j)), 0);
	/* The producer is gone (only we are connected); its version stays. */
	gone.connections = 1;
	gone.names = 1;
	gone.versions = 1;
	gone.buffers = 1;
	util_assert_want(c, &gone);

	j.want_version = 1;
	assert_int_equal(util_wait(util_spawn(&fx->d, job_consume, &j)), 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, job_consume, &j)), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- huge pages (--huge-page-min) ------------------------------------------------ */

static const char *const huge_args[] = { "--huge-page-min", "2M", NULL };

static int setup_huge(void **state)
{
	return util_setup_fdcheck(state, huge_args);
}

/* Free 2 MiB pages in the kernel's pool, or -1 when it cannot be read. */
static long huge_free(void)
{
	FILE *f = fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
			"r");
	long n = -1;

	if (f) {
		if (fscanf(f, "%ld", &n) != 1)
			n = -1;
		fclose(f);
	}
	return n;
}

static uint64_t stored_bytes(dlshare_client *c, const char *name)
{
	dlshare_name_info info;

	assert_int_equal(dlshare_stat(c, name, &info, NULL), 0);
	return info.bytes;
}

/* From 2 MiB on, a store buffer is made of huge pages (its size rounded
 * up) when the pool has two free ones, and of normal pages otherwise; the
 * data is the same either way. The pool is the operator's: the test uses
 * what it finds (none on most machines, so the fallback). */
static void huge_pages_when_the_pool_has_them(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int64_t big[1] = { 3 << 20 }, small[1] = { 1 << 20 };
	long free_pages = huge_free();

	assert_int_equal(util_store(c, "e2e/huge", DT_U8, 1, big, 91, NULL), 0);
	if (free_pages >= 2)
		assert_int_equal(stored_bytes(c, "e2e/huge"), 4 << 20);
	else
		assert_int_equal(stored_bytes(c, "e2e/huge"), 3 << 20);
	fprintf(stderr, "-- %ld free 2 MiB pages: %s\n", free_pages,
		free_pages >= 2 ? "huge pages" : "the fallback");
	assert_int_equal(util_get_check(c, "e2e/huge", NULL, DT_U8, 1, big, 91,
					NULL), 0);
	/* Below the threshold: normal pages, the exact size. */
	assert_int_equal(util_store(c, "e2e/small", DT_U8, 1, small, 92, NULL),
			 0);
	assert_int_equal(stored_bytes(c, "e2e/small"), 1 << 20);
	assert_int_equal(util_get_check(c, "e2e/small", NULL, DT_U8, 1, small,
					92, NULL), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- a state dict: many tensors, long keys, in one version ------------- */

#define SD_N 1000

/* Key i: 60 bytes, as a real model's are ("model.layers.17.mlp..."). */
static void sd_key(char *k, size_t i)
{
	char full[128];

	snprintf(full, sizeof(full),
		 "model.layers.%03zu.mlp.down_proj.weight.scale.of.the.quantized.block",
		 i);
	assert_true(strlen(full) >= 60);
	memcpy(k, full, 60);
	k[60] = '\0';
}

/* Tensor i holds four floats, i * 4 + j. */
static void sd_check(dlshare_client *c, const char *name, uint64_t version)
{
	dlshare_bundle *b;
	char key[61];

	assert_int_equal(dlshare_get(c, name, NULL, &b), 0);
	assert_int_equal(dlshare_bundle_version(b), version);
	assert_int_equal(dlshare_bundle_count(b), SD_N);
	for (size_t i = 0; i < SD_N; i++) {
		const DLTensor *t;
		int k;

		sd_key(key, i);
		k = dlshare_bundle_find(b, key);
		assert_true(k >= 0);
		assert_string_equal(dlshare_bundle_key(b, (size_t)k), key);
		t = dlshare_bundle_tensor(b, (size_t)k);
		assert_non_null(t);
		assert_int_equal(t->ndim, 1);
		assert_int_equal(t->shape[0], 4);
		for (int j = 0; j < 4; j++)
			assert_true(((const float *)((const char *)t->data +
						     t->byte_offset))[j] ==
				    (float)(i * 4 + (size_t)j));
	}
	dlshare_bundle_free(b);
}

/* A state dict of 1000 tensors with 60-byte keys is one request well past
 * the 512 bytes of a Hello: created and sealed, then published from plain
 * memory (copied), and read back by key. */
static void state_dict_one_version(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	static char keys[SD_N][61];
	static dlshare_tensor_spec specs[SD_N];
	static DLManagedTensor *ts[SD_N];
	static const char *kp[SD_N];
	int64_t shape[1] = { 4 };
	dlshare_publish_opts po = { .keys = kp };
	dlshare_writer *w;
	uint64_t v;

	for (size_t i = 0; i < SD_N; i++) {
		sd_key(keys[i], i);
		kp[i] = keys[i];
		specs[i] = (dlshare_tensor_spec){ .key = keys[i], .dtype = DT_F32,
						  .ndim = 1, .shape = shape };
	}
	assert_int_equal(dlshare_create(c, "e2e/sd", specs, SD_N, NULL, &w), 0);
	assert_int_equal(dlshare_writer_count(w), SD_N);
	for (size_t i = 0; i < SD_N; i++)
		for (int j = 0; j < 4; j++)
			((float *)dlshare_writer_tensor(w, i)->data)[j] =
				(float)(i * 4 + (size_t)j);
	assert_int_equal(dlshare_seal(w, NULL, &v), 0);
	assert_int_equal(v, 1);
	sd_check(c, "e2e/sd", 1);

	for (size_t i = 0; i < SD_N; i++) {
		DLManagedTensor *m = calloc(1, sizeof(*m));
		float *data = malloc(4 * sizeof(float));

		assert_true(m && data);
		for (int j = 0; j < 4; j++)
			data[j] = (float)(i * 4 + (size_t)j);
		m->dl_tensor.data = data;
		m->dl_tensor.shape = calloc(1, sizeof(int64_t));
		assert_non_null(m->dl_tensor.shape);
		m->dl_tensor.shape[0] = 4;
		m->dl_tensor.ndim = 1;
		m->dl_tensor.dtype = DT_F32;
		m->dl_tensor.device.device_type = kDLCPU;
		m->deleter = plain_deleter;
		ts[i] = m;
	}
	assert_int_equal(dlshare_publish(c, "e2e/sd", ts, SD_N, &po, &v), 0);
	assert_int_equal(v, 2);
	sd_check(c, "e2e/sd", 2);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(store_roundtrip, setup, teardown),
		cmocka_unit_test_setup_teardown(export_roundtrip, setup, teardown),
		cmocka_unit_test_setup_teardown(bundle_store, setup, teardown),
		cmocka_unit_test_setup_teardown(bundle_export, setup, teardown),
		cmocka_unit_test_setup_teardown(warm_gets, setup, teardown),
		cmocka_unit_test_setup_teardown(large_store, setup, teardown),
		cmocka_unit_test_setup_teardown(large_export, setup, teardown),
		cmocka_unit_test_setup_teardown(zero_size_and_scalar, setup, teardown),
		cmocka_unit_test_setup_teardown(scalar_null_shape, setup, teardown),
		cmocka_unit_test_setup_teardown(publish_copies, setup, teardown),
		cmocka_unit_test_setup_teardown(publish_copy_runs, setup,
						teardown),
		cmocka_unit_test_setup_teardown(store_outlives_producer, setup, teardown),
		cmocka_unit_test_setup_teardown(state_dict_one_version, setup, teardown),
		cmocka_unit_test_setup_teardown(huge_pages_when_the_pool_has_them,
						setup_huge, teardown),
	};

	return cmocka_run_group_tests_name("e2e", tests, NULL, NULL);
}
