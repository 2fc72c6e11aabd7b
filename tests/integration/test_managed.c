/* test_managed — the DLPack side of a consumer: DLManagedTensor and
 * DLManagedTensorVersioned from dlshare_bundle_export(_versioned) and the
 * get_tensor shorthands; their deleters release the lease (asynchronously),
 * also from another thread, and a tensor outlives its bundle and even its
 * client's dlshare_disconnect. */
#include <pthread.h>
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

static const int64_t shape[3] = { 5, 6, 7 };

/* Leases held, as the daemon counts them (this child is its only holder). */
static uint64_t leases(dlshare_client *c)
{
	dlshare_stats s;

	CHILD_OK(dlshare_stats_get(c, &s));
	return s.leases;
}

#define WAIT_LEASES(c, n) CHILD_CHECK(harness_wait_stats(c, n, -1, NULL) == 0)

static void *delete_plain(void *m)
{
	((DLManagedTensor *)m)->deleter(m);
	return NULL;
}

static int managed_consumer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	DLManagedTensor *m1, *m2, *g;
	DLManagedTensorVersioned *mv, *gv;
	dlshare_bundle *b;
	pthread_t th;

	CHILD_OK(dlshare_get(c, "m/t", NULL, &b));
	CHILD_CHECK(leases(c) == 1);
	CHILD_ERR(dlshare_bundle_export(b, 1, &m1), DLSHARE_EINVAL);
	CHILD_ERR(dlshare_bundle_export_versioned(b, 1, &mv), DLSHARE_EINVAL);
	CHILD_OK(dlshare_bundle_export(b, 0, &m1));
	CHILD_OK(dlshare_bundle_export(b, 0, &m2));
	CHILD_OK(dlshare_bundle_export_versioned(b, 0, &mv));
	/* One lease for the bundle and everything made from it. */
	CHILD_CHECK(leases(c) == 1);
	CHILD_CHECK(mv->version.major == 1);
	CHILD_CHECK(mv->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
	CHILD_CHECK(mv->deleter != NULL && m1->deleter != NULL);
	CHILD_CHECK(m1->dl_tensor.data == mv->dl_tensor.data);
	dlshare_bundle_free(b);
	CHILD_CHECK(leases(c) == 1);
	CHILD_CHECK(util_check(&m1->dl_tensor, DT_F32, 3, shape, 3) == 0);
	CHILD_CHECK(util_check(&mv->dl_tensor, DT_F32, 3, shape, 3) == 0);
	m1->deleter(m1);
	mv->deleter(mv);
	CHILD_CHECK(util_check(&m2->dl_tensor, DT_F32, 3, shape, 3) == 0);
	/* The last one, deleted on another thread, releases the lease. */
	CHILD_CHECK(pthread_create(&th, NULL, delete_plain, m2) == 0);
	pthread_join(th, NULL);
	WAIT_LEASES(c, 0);

	/* The shorthands hold a lease each, released by their deleters. */
	CHILD_OK(dlshare_get_tensor(c, "m/t", NULL, &g));
	CHILD_OK(dlshare_get_tensor_versioned(c, "m/t", NULL, &gv));
	CHILD_CHECK(leases(c) == 2);
	CHILD_CHECK(gv->version.major == 1);
	CHILD_CHECK(gv->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
	CHILD_CHECK(util_check(&g->dl_tensor, DT_F32, 3, shape, 3) == 0);
	CHILD_CHECK(util_check(&gv->dl_tensor, DT_F32, 3, shape, 3) == 0);
	g->deleter(g);
	WAIT_LEASES(c, 1);
	gv->deleter(gv);
	WAIT_LEASES(c, 0);
	dlshare_disconnect(c);
	return 0;
}

static void deleters_release_leases(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);

	assert_int_equal(util_store(c, "m/t", DT_F32, 3, shape, 3, NULL), 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, managed_consumer, NULL)), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- outliving the bundle and the client ---------------------------------------- */

static int outliving_consumer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_client *watch = util_child_connect(d);
	DLManagedTensor *m;
	DLManagedTensorVersioned *mv;
	dlshare_bundle *b;
	pthread_t th;

	CHILD_OK(dlshare_get(c, "m/t", NULL, &b));
	CHILD_OK(dlshare_bundle_export(b, 0, &m));
	CHILD_OK(dlshare_bundle_export_versioned(b, 0, &mv));
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
	/* The lease went with the connection... */
	CHILD_CHECK(harness_wait_stats(watch, 0, -1, NULL) == 0);
	/* ...the memory did not. */
	CHILD_CHECK(util_check(&m->dl_tensor, DT_F32, 3, shape, 3) == 0);
	CHILD_CHECK(util_check(&mv->dl_tensor, DT_F32, 3, shape, 3) == 0);
	/* Deleters after the client is gone: no crash, no leak (ASan). */
	CHILD_CHECK(pthread_create(&th, NULL, delete_plain, m) == 0);
	pthread_join(th, NULL);
	mv->deleter(mv);
	CHILD_CHECK(harness_wait_stats(watch, 0, -1, NULL) == 0);
	dlshare_disconnect(watch);
	return 0;
}

static void tensor_outlives_client(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);

	assert_int_equal(util_store(c, "m/t", DT_F32, 3, shape, 3, NULL), 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, outliving_consumer, NULL)), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* The same in this process, where the fd check sees every mapping and
 * descriptor the client opened. */
static void tensor_outlives_client_here(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *p = harness_connect(&fx->d);
	DLManagedTensorVersioned *mv;

	assert_int_equal(util_store(p, "m/t", DT_F32, 3, shape, 3, NULL), 0);
	assert_int_equal(dlshare_get_tensor_versioned(c, "m/t", NULL, &mv), 0);
	dlshare_disconnect(c);
	assert_int_equal(harness_wait_stats(p, 0, 1, NULL), 0);
	assert_int_equal(util_check(&mv->dl_tensor, DT_F32, 3, shape, 3), 0);
	mv->deleter(mv);
	dlshare_disconnect(p);
}

/* ---- the shorthands on a version of several tensors ------------------------ */

/* dlshare_get_tensor takes a version's first tensor, also from a bundle
 * (which it reads through a bundle of its own; one tensor it reads
 * without one): the same tensor, the same lease accounting. */
static void get_tensor_of_a_bundle(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *p = harness_connect(&fx->d);
	static const int64_t two[1] = { 3 }, three[2] = { 2, 2 };
	const dlshare_tensor_spec specs[3] = {
		{ "first", DT_F32, 3, shape },
		{ "second", DT_I32, 1, two },
		{ "third", DT_F32, 2, three },
	};
	DLManagedTensorVersioned *gv;
	DLManagedTensor *g;
	dlshare_writer *w;
	DLTensor *t;

	assert_int_equal(dlshare_create(p, "m/b", specs, 3, NULL, &w), 0);
	t = dlshare_writer_tensor(w, 0);
	harness_fill(t->data, util_nbytes(DT_F32, 3, shape), 3);
	assert_int_equal(dlshare_seal(w, NULL, NULL), 0);

	assert_int_equal(dlshare_get_tensor(c, "m/b", NULL, &g), 0);
	assert_int_equal(dlshare_get_tensor_versioned(c, "m/b", NULL, &gv), 0);
	assert_int_equal(harness_wait_stats(p, 2, -1, NULL), 0);
	assert_int_equal(util_check(&g->dl_tensor, DT_F32, 3, shape, 3), 0);
	assert_int_equal(util_check(&gv->dl_tensor, DT_F32, 3, shape, 3), 0);
	assert_true(gv->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
	g->deleter(g);
	gv->deleter(gv);
	assert_int_equal(harness_wait_stats(p, 0, -1, NULL), 0);
	dlshare_disconnect(c);
	dlshare_disconnect(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(deleters_release_leases, setup, teardown),
		cmocka_unit_test_setup_teardown(tensor_outlives_client, setup, teardown),
		cmocka_unit_test_setup_teardown(tensor_outlives_client_here, setup, teardown),
		cmocka_unit_test_setup_teardown(get_tensor_of_a_bundle, setup, teardown),
	};

	return cmocka_run_group_tests_name("managed", tests, NULL, NULL);
}
