/* test_export — the life of producer memory published without a copy: its
 * deleter runs when the daemon retires the version (a newer one replaced it
 * and no lease holds it), never while another process still holds a lease,
 * and at dlshare_disconnect for versions still published; a consumer's
 * lease keeps the data readable after its producer went away. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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

static const int64_t shape[2] = { 64, 33 };

#define AWAIT(c, name) CHILD_CHECK(util_await(c, name, 0, harness_ms(20000), NULL) > 0)

/* ---- retired with no lease ------------------------------------------------- */

static int retire_producer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	uint64_t v1, v2;
	int s1, s2;

	CHILD_OK(util_export(c, "x/retire", DT_F32, 2, shape, 1, &v1, &s1));
	CHILD_CHECK(v1 == 1);
	CHILD_CHECK(util_deleted(s1) == 0);
	CHILD_OK(util_export(c, "x/retire", DT_F32, 2, shape, 2, &v2, &s2));
	CHILD_CHECK(v2 == 2);
	/* Nobody holds version 1: the daemon retires it and we hear it. */
	CHILD_CHECK(util_wait_deleted(s1, 1) == 1);
	CHILD_CHECK(util_deleted(s2) == 0);
	CHILD_OK(util_post(c, "x/retire.ready", 1));
	AWAIT(c, "x/retire.done");
	CHILD_CHECK(util_deleted(s2) == 0);
	dlshare_disconnect(c);
	CHILD_CHECK(util_deleted(s2) == 1);
	CHILD_CHECK(util_deleted(s1) == 1);
	return 0;
}

static int retire_consumer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_get_opts exact1 = { .select = DLSHARE_EXACT, .version = 1 };
	dlshare_bundle *b;
	uint64_t v;

	AWAIT(c, "x/retire.ready");
	CHILD_OK(util_get_check(c, "x/retire", NULL, DT_F32, 2, shape, 2, &v));
	CHILD_CHECK(v == 2);
	CHILD_ERR(dlshare_get(c, "x/retire", &exact1, &b), DLSHARE_ENOENT);
	dlshare_disconnect(c);
	return 0;
}

static void deleter_runs_at_retire(void **state)
{
	struct fixture *fx = *state;
	pid_t p = util_spawn(&fx->d, retire_producer, NULL);
	pid_t q = util_spawn(&fx->d, retire_consumer, NULL);
	dlshare_client *c;

	assert_int_equal(util_wait(q), 0);
	c = harness_connect(&fx->d);
	assert_int_equal(util_post(c, "x/retire.done", 1), 0);
	assert_int_equal(util_wait(p), 0);
	/* The export went with its producer: once the daemon has seen its
	 * connection close (nothing orders that before our next request). */
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	assert_int_equal(dlshare_get(c, "x/retire", NULL, &(dlshare_bundle *){ NULL }),
			 DLSHARE_ENOENT);
	dlshare_disconnect(c);
}

/* ---- not retired while another process holds a lease ------------------------- */

static int leased_producer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_name_info info;
	uint64_t v;
	int s1, s2;

	CHILD_OK(util_export(c, "x/leased", DT_F32, 2, shape, 1, &v, &s1));
	CHILD_OK(util_post(c, "x/leased.v1", 1));
	AWAIT(c, "x/leased.held");
	CHILD_OK(util_export(c, "x/leased", DT_F32, 2, shape, 2, &v, &s2));
	CHILD_CHECK(v == 2);
	/* Version 1 lives on under the consumer's lease. */
	CHILD_OK(dlshare_stat(c, "x/leased", &info, NULL));
	CHILD_CHECK(info.versions == 2);
	CHILD_CHECK(info.leases == 1);
	CHILD_CHECK(info.latest == 2);
	util_sleep_ms(harness_ms(300));
	CHILD_CHECK(util_deleted(s1) == 0);
	CHILD_OK(util_post(c, "x/leased.v2", 1));
	/* The consumer releases it; now it goes back to us. */
	CHILD_CHECK(util_wait_deleted(s1, 1) == 1);
	CHILD_CHECK(util_deleted(s2) == 0);
	AWAIT(c, "x/leased.done");
	dlshare_disconnect(c);
	CHILD_CHECK(util_deleted(s2) == 1);
	return 0;
}

static int leased_consumer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	DLManagedTensor *m;
	dlshare_bundle *b;
	uint64_t v;

	AWAIT(c, "x/leased.v1");
	CHILD_OK(dlshare_get(c, "x/leased", NULL, &b));
	CHILD_CHECK(dlshare_bundle_version(b) == 1);
	CHILD_OK(dlshare_bundle_export(b, 0, &m));
	dlshare_bundle_free(b);
	CHILD_OK(util_post(c, "x/leased.held", 1));
	AWAIT(c, "x/leased.v2");
	/* The producer published over it, but our version is untouched. */
	CHILD_CHECK(util_check(&m->dl_tensor, DT_F32, 2, shape, 1) == 0);
	CHILD_OK(util_get_check(c, "x/leased", NULL, DT_F32, 2, shape, 2, &v));
	CHILD_CHECK(v == 2);
	m->deleter(m);
	dlshare_disconnect(c);
	return 0;
}

static void deleter_waits_for_leases(void **state)
{
	struct fixture *fx = *state;
	pid_t p = util_spawn(&fx->d, leased_producer, NULL);
	pid_t q = util_spawn(&fx->d, leased_consumer, NULL);
	dlshare_client *c;

	assert_int_equal(util_wait(q), 0);
	c = harness_connect(&fx->d);
	assert_int_equal(util_post(c, "x/leased.done", 1), 0);
	assert_int_equal(util_wait(p), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- withdrawn at disconnect, data kept by a lease ------------------------------ */

static int gone_producer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	uint64_t v;
	int s;

	CHILD_OK(util_export(c, "x/gone", DT_F32, 2, shape, 5, &v, &s));
	CHILD_OK(util_post(c, "x/gone.v1", 1));
	AWAIT(c, "x/gone.held");
	CHILD_CHECK(util_deleted(s) == 0);
	dlshare_disconnect(c);
	/* Still published: back to its deleter at disconnect, once. */
	CHILD_CHECK(util_deleted(s) == 1);
	return 0;
}

static int gone_consumer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *b, *b2;

	AWAIT(c, "x/gone.v1");
	CHILD_OK(dlshare_get(c, "x/gone", NULL, &b));
	CHILD_OK(util_post(c, "x/gone.held", 1));
	AWAIT(c, "x/gone.exited");
	/* The producer is gone and its version withdrawn... */
	CHILD_ERR(dlshare_get(c, "x/gone", NULL, &b2), DLSHARE_ENOENT);
	/* ...but what we hold stays readable and unchanged. */
	CHILD_CHECK(util_check(dlshare_bundle_tensor(b, 0), DT_F32, 2, shape,
			       5) == 0);
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
	return 0;
}

static void deleter_runs_at_disconnect(void **state)
{
	struct fixture *fx = *state;
	pid_t p = util_spawn(&fx->d, gone_producer, NULL);
	pid_t q = util_spawn(&fx->d, gone_consumer, NULL);
	dlshare_client *c;
	struct util_want empty = UTIL_ANY;

	assert_int_equal(util_wait(p), 0);
	c = harness_connect(&fx->d);
	assert_int_equal(util_post(c, "x/gone.exited", 1), 0);
	assert_int_equal(util_wait(q), 0);
	/* Once the lease went, nothing of the export is left. */
	assert_int_equal(dlshare_delete(c, "x/gone.v1"), 0);
	assert_int_equal(dlshare_delete(c, "x/gone.held"), 0);
	assert_int_equal(dlshare_delete(c, "x/gone.exited"), 0);
	empty.connections = 1;
	empty.names = 0;
	empty.versions = 0;
	empty.leases = 0;
	empty.buffers = 0;
	empty.bytes = 0;
	util_assert_want(c, &empty);
	dlshare_disconnect(c);
}

/* ---- negative strides are never shared ---------------------------------------- */

struct view {
	DLManagedTensor mt;
	int64_t shape[2], strides[2];
	int *deleted;
};

static void view_delete(DLManagedTensor *self)
{
	struct view *v = self->manager_ctx;

	(*v->deleted)++;
	free(v);
}

/* A view of the 4x6 int32 matrix m with vshape, strides (elements) and
 * byte_offset; its deleter counts into *deleted. */
static DLManagedTensor *view_of(DLManagedTensor *m, const int64_t *vshape,
				const int64_t *strides, uint64_t offset,
				int *deleted)
{
	struct view *v = calloc(1, sizeof(*v));

	assert_non_null(v);
	v->mt.dl_tensor = m->dl_tensor;
	memcpy(v->shape, vshape, sizeof(v->shape));
	memcpy(v->strides, strides, sizeof(v->strides));
	v->mt.dl_tensor.shape = v->shape;
	v->mt.dl_tensor.strides = v->strides;
	v->mt.dl_tensor.byte_offset = offset;
	v->mt.manager_ctx = v;
	v->mt.deleter = view_delete;
	v->deleted = deleted;
	return &v->mt;
}

/* A view with a negative stride of shareable memory is copied compact (a
 * torch 1.13 consumer aborts on a negative stride); with copies forbidden
 * it fails and says why. A positive-strided view of the same memory is
 * still shared as it is. */
static void negative_strides_copied(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	static const int64_t mshape[2] = { 4, 6 };
	int64_t rshape[2] = { 4, 6 }, rstrides[2] = { -6, 1 };
	int64_t cshape[2] = { 4, 3 }, cstrides[2] = { 6, 2 };
	dlshare_publish_opts nocopy = { .flags = DLSHARE_PUBLISH_NO_COPY };
	int32_t a[4][6], want[4][6];
	DLManagedTensor *m, *v, *g;
	dlshare_name_info info;
	const DLTensor *t;
	dlshare_bundle *b;
	int deleted = 0;

	assert_int_equal(dlshare_host_alloc(DT_I32, 2, mshape, &m), 0);
	harness_fill(m->dl_tensor.data, sizeof(a), 31);
	memcpy(a, m->dl_tensor.data, sizeof(a));
	/* Rows reversed: data + byte_offset is the last row. */
	v = view_of(m, rshape, rstrides, 3 * 6 * sizeof(int32_t), &deleted);
	assert_int_equal(dlshare_publish(c, "x/neg", &v, 1, &nocopy, NULL),
			 DLSHARE_ECOPY);
	assert_non_null(strstr(dlshare_last_error(), "negative stride"));
	assert_int_equal(dlshare_publish(c, "x/neg", &v, 1, NULL, NULL), 0);
	assert_int_equal(deleted, 1); /* copied: given back at once */
	assert_int_equal(dlshare_stat(c, "x/neg", &info, NULL), 0);
	assert_int_equal(info.exported, 0);
	assert_int_equal(dlshare_get(c, "x/neg", NULL, &b), 0);
	t = dlshare_bundle_tensor(b, 0);
	assert_null(t->strides);
	assert_int_equal(t->byte_offset, 0);
	for (int i = 0; i < 4; i++)
		memcpy(want[i], a[3 - i], sizeof(want[i]));
	assert_memory_equal(t->data, want, sizeof(want));
	dlshare_bundle_free(b);

	/* Every other column: shared, strides and all. */
	v = view_of(m, cshape, cstrides, sizeof(int32_t), &deleted);
	assert_int_equal(dlshare_publish(c, "x/cols", &v, 1, &nocopy, NULL), 0);
	assert_int_equal(dlshare_stat(c, "x/cols", &info, NULL), 0);
	assert_int_equal(info.exported, 1);
	assert_int_equal(dlshare_get(c, "x/cols", NULL, &b), 0);
	t = dlshare_bundle_tensor(b, 0);
	assert_non_null(t->strides);
	assert_int_equal(t->strides[0], 6);
	assert_int_equal(t->strides[1], 2);
	assert_int_equal(t->byte_offset, 0);
	assert_int_equal(((const int32_t *)t->data)[0], a[0][1]);
	dlshare_bundle_free(b);
	/* The same through dlshare_get_tensor, which makes no bundle for a
	 * version of one tensor: its strides come over too. */
	assert_int_equal(dlshare_get_tensor(c, "x/cols", NULL, &g), 0);
	assert_non_null(g->dl_tensor.strides);
	assert_int_equal(g->dl_tensor.ndim, 2);
	assert_int_equal(g->dl_tensor.strides[0], 6);
	assert_int_equal(g->dl_tensor.strides[1], 2);
	assert_int_equal(g->dl_tensor.shape[0], cshape[0]);
	assert_int_equal(g->dl_tensor.shape[1], cshape[1]);
	assert_int_equal(g->dl_tensor.byte_offset, 0);
	assert_int_equal(((const int32_t *)g->dl_tensor.data)[0], a[0][1]);
	g->deleter(g);
	dlshare_disconnect(c); /* gives the shared view back */
	assert_int_equal(deleted, 2);
	m->deleter(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(deleter_runs_at_retire, setup, teardown),
		cmocka_unit_test_setup_teardown(deleter_waits_for_leases, setup, teardown),
		cmocka_unit_test_setup_teardown(deleter_runs_at_disconnect, setup, teardown),
		cmocka_unit_test_setup_teardown(negative_strides_copied, setup, teardown),
	};

	return cmocka_run_group_tests_name("export", tests, NULL, NULL);
}
