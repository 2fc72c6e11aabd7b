/* test_list — dlshare_list pages through more names than one answer of the
 * daemon holds (--list-page 3), in byte order, filtered by prefix, and
 * stops when asked; dlshare_stat describes a name and its newest version's
 * manifest without taking a lease. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "jobs.h"

static int setup(void **state)
{
	static const char *const args[] = { "--list-page", "3", NULL };

	return util_setup_fdcheck(state, args);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

/* Ten names, out of order; byte order puts upper case and '-' before the
 * lower case letters, and "list/a" before "list/a/..." and "list/a-z". */
static const char *const names[] = {
	"list/b/2", "list/a/1", "list/a", "list/B", "list/a/0",
	"list/b/10", "list/a-z", "list/b/1", "list/a/2", "list/_x",
};
#define NNAMES (sizeof(names) / sizeof(names[0]))

static int publish_names(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	int64_t shape[1] = { 3 };

	for (size_t i = 0; i < NNAMES; i++)
		CHILD_OK(util_store(c, names[i], DT_I32, 1, shape, (uint32_t)i,
				    NULL));
	/* A second version of one name is still one name. */
	CHILD_OK(util_store(c, "list/a/1", DT_I32, 1, shape, 100, NULL));
	dlshare_disconnect(c);
	return 0;
}

struct collect {
	char names[32][256];
	uint64_t latest[32];
	int n;
	int stop_after; /* 0: never */
};

static int collect(const dlshare_name_info *info, void *arg)
{
	struct collect *col = arg;

	if (col->n < 32) {
		snprintf(col->names[col->n], 256, "%s", info->name);
		col->latest[col->n] = info->latest;
	}
	col->n++;
	return col->stop_after && col->n >= col->stop_after;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Lists prefix and compares with the expected names in byte order. */
static void check_list(dlshare_client *c, const char *prefix)
{
	const char *want[NNAMES];
	struct collect col = { .n = 0 };
	size_t n = 0;

	for (size_t i = 0; i < NNAMES; i++)
		if (strncmp(names[i], prefix, strlen(prefix)) == 0)
			want[n++] = names[i];
	qsort(want, n, sizeof(want[0]), cmp_str);
	assert_int_equal(dlshare_list(c, prefix, collect, &col), 0);
	assert_int_equal(col.n, n);
	for (size_t i = 0; i < n; i++) {
		assert_string_equal(col.names[i], want[i]);
		assert_int_equal(col.latest[i],
				 strcmp(want[i], "list/a/1") == 0 ? 2 : 1);
	}
}

static void list_pages(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c;
	struct collect col = { .n = 0 };

	assert_int_equal(util_wait(util_spawn(&fx->d, publish_names, NULL)), 0);
	c = harness_connect(&fx->d);
	check_list(c, "");
	check_list(c, "list/");
	check_list(c, "list/a");   /* 5 names: two pages */
	check_list(c, "list/a/");
	check_list(c, "list/b/1");
	check_list(c, "list/c");   /* none */
	/* NULL is "everything". */
	assert_int_equal(dlshare_list(c, NULL, collect, &col), 0);
	assert_int_equal(col.n, NNAMES);
	/* Stopping early, in the middle of a page, is not an error. */
	memset(&col, 0, sizeof(col));
	col.stop_after = 4;
	assert_int_equal(dlshare_list(c, "", collect, &col), 0);
	assert_int_equal(col.n, 4);
	assert_string_equal(col.names[3], "list/a-z");
	/* A prefix no name could start with. */
	assert_int_equal(dlshare_list(c, "/list", collect, &col),
			 DLSHARE_EINVAL);
	assert_int_equal(dlshare_list(c, "list//", collect, &col),
			 DLSHARE_EINVAL);
	dlshare_disconnect(c);
}

/* ---- stat -------------------------------------------------------------------- */

static const struct tspec weights[] = {
	{ "embed", DT_F32, 2, { 100, 16 }, 1 },
	{ "norm", DT_F64, 1, { 16 }, 2 },
	{ "step", DT_I64, 0, { 0 }, 3 },
};

static int stat_leaser(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *b;

	CHILD_OK(dlshare_get(c, "stat/w", NULL, &b));
	CHILD_OK(util_post(c, "stat/w.held", 1));
	CHILD_CHECK(util_await(c, "stat/w.done", 0, harness_ms(20000), NULL) > 0);
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
	return 0;
}

static void stat_manifest(void **state)
{
	struct fixture *fx = *state;
	struct job j = { .name = "stat/w", .ts = weights, .n = 3,
			 .mode = JOB_STORE };
	dlshare_name_info info;
	dlshare_manifest *m;
	dlshare_client *c;
	uint64_t end = 0;
	pid_t p;

	assert_int_equal(util_wait(util_spawn(&fx->d, job_produce, &j)), 0);
	c = harness_connect(&fx->d);
	assert_int_equal(dlshare_stat(c, "stat/w", &info, &m), 0);
	assert_string_equal(info.name, "stat/w");
	assert_int_equal(info.latest, 1);
	assert_int_equal(info.versions, 1);
	assert_int_equal(info.tensors, 3);
	assert_int_equal(info.leases, 0);
	assert_int_equal(info.owner_uid, getuid());
	assert_int_equal(info.mode, 0644); /* the daemon's default */
	assert_int_equal(info.kind, DLSHARE_KIND_HOST);
	assert_int_equal(info.exported, 0);
	assert_non_null(m);
	assert_int_equal(dlshare_manifest_count(m), 3);
	assert_null(dlshare_manifest_tensor(m, 3));
	assert_null(dlshare_manifest_key(m, 3));
	for (size_t i = 0; i < 3; i++) {
		const DLTensor *t = dlshare_manifest_tensor(m, i);
		size_t nb = util_nbytes(weights[i].dt, weights[i].ndim,
					weights[i].shape);

		assert_non_null(t);
		assert_string_equal(dlshare_manifest_key(m, i), weights[i].key);
		assert_null(t->data);
		assert_null(t->strides);
		assert_int_equal(t->ndim, weights[i].ndim);
		assert_int_equal(t->dtype.code, weights[i].dt.code);
		assert_int_equal(t->dtype.bits, weights[i].dt.bits);
		assert_int_equal(t->dtype.lanes, 1);
		for (int k = 0; k < t->ndim; k++)
			assert_int_equal(t->shape[k], weights[i].shape[k]);
		/* Laid out in order, aligned, inside the buffer. */
		assert_int_equal(t->byte_offset % 64, 0);
		assert_true(t->byte_offset >= end);
		end = t->byte_offset + nb;
	}
	assert_true(info.bytes >= end);
	dlshare_manifest_free(m);

	/* Without a manifest; and it counts another process's lease. */
	p = util_spawn(&fx->d, stat_leaser, NULL);
	assert_true(util_await(c, "stat/w.held", 0, harness_ms(20000), NULL) > 0);
	assert_int_equal(dlshare_stat(c, "stat/w", &info, NULL), 0);
	assert_int_equal(info.leases, 1);
	assert_int_equal(util_post(c, "stat/w.done", 1), 0);
	assert_int_equal(util_wait(p), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	assert_int_equal(dlshare_stat(c, "stat/w", &info, NULL), 0);
	assert_int_equal(info.leases, 0);

	/* An export, with its own mode. */
	DLManagedTensor *t;
	int64_t shape[1] = { 10 };
	dlshare_publish_opts o = { .mode = 0600, .flags = DLSHARE_PUBLISH_NO_COPY };

	assert_int_equal(dlshare_host_alloc(DT_F32, 1, shape, &t), 0);
	assert_int_equal(dlshare_publish(c, "stat/x", &t, 1, &o, NULL), 0);
	assert_int_equal(dlshare_stat(c, "stat/x", &info, &m), 0);
	assert_int_equal(info.exported, 1);
	assert_int_equal(info.mode, 0600);
	assert_int_equal(info.tensors, 1);
	assert_int_equal(dlshare_manifest_count(m), 1);
	assert_string_equal(dlshare_manifest_key(m, 0), "");
	dlshare_manifest_free(m);

	assert_int_equal(dlshare_stat(c, "stat/none", &info, &m), DLSHARE_ENOENT);
	assert_null(m);
	assert_int_equal(dlshare_stat(c, "bad//name", &info, NULL), DLSHARE_EINVAL);
	dlshare_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(list_pages, setup, teardown),
		cmocka_unit_test_setup_teardown(stat_manifest, setup, teardown),
	};

	return cmocka_run_group_tests_name("list", tests, NULL, NULL);
}
