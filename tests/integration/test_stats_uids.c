/* test_stats_uids — more uids than a StatsReply has rows for, all real:
 * UIDS (past STATS_UIDS_MAX, 64) children each become a uid of their own
 * and leave a name of a size of their own behind. A Stats that asks for
 * every row then gets the count of all of them (nuids), and at most 64
 * rows of each table: the uids holding the most bytes, biggest first, and
 * the uids nearest a quota, nearest first. Through the library,
 * dlshare_stats_get and dlshare_metrics say the same within their own caps
 * (DLSHARE_STATS_UIDS, DLSHARE_METRICS_UIDS).
 *
 * Needs root (children of other uids); skipped (77) otherwise.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../skip.h"
#include "util.h"

#define UIDS 70
#define ROWS_MAX 64     /* daemon/stats.h: STATS_UIDS_MAX */
#define UID_BASE 23500u /* clear of UTIL_UID_A and B */

/* uid UID_BASE + i holds (i + 8) KiB: distinct sizes, and each its
 * largest share of a quota (uid-host-bytes below). */
static uint64_t bytes_of(unsigned i)
{
	return (uint64_t)(i + 8) * 1024;
}

static int holder(const struct daemon_proc *d, void *arg)
{
	unsigned i = (unsigned)(uintptr_t)arg;
	dlshare_client *c = util_child_connect(d);
	int64_t shape[1] = { (int64_t)bytes_of(i) / 4 };
	char name[32];

	snprintf(name, sizeof(name), "uids/%u", i);
	CHILD_OK(util_store(c, name, DT_F32, 1, shape, i, NULL));
	dlshare_disconnect(c);
	return 0;
}

static int setup(void **state)
{
	/* Host bytes are each uid's nearest quota: 8..77 KiB of 128 KiB
	 * outweighs one name of 1000, or a connection of 1000. */
	static const char *const args[] = {
		"--uid-host-bytes", "131072", "--uid-names", "1000",
		"--uid-connections", "1000", NULL
	};

	*state = NULL;
	if (!util_can_switch_uids())
		return 0; /* the test skips */
	return util_setup_open(state, args);
}

static int teardown(void **state)
{
	return *state ? util_teardown(state) : 0;
}

/* The value of the unlabelled sample name in metrics text, or -1. */
static long long sample(const char *text, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = text; (p = strstr(p, name)); p += n)
		if ((p == text || p[-1] == '\n') && p[n] == ' ')
			return strtoll(p + n + 1, NULL, 10);
	return -1;
}

static void many_uids(void **state)
{
	struct fixture *fx = *state;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stats s = DLSHARE__STATS__INIT;
	Dlshare__StatsReply *r;
	struct wire_msg *m = NULL;
	dlshare_client *c;
	dlshare_stats st;
	char *text;
	size_t len;
	int fd;

	if (!fx) {
		test_skip("needs root, to run children as %d other uids",
			  UIDS);
		return;
	}
	for (unsigned i = 0; i < UIDS; i++)
		assert_int_equal(util_wait(util_spawn_as(&fx->d, UID_BASE + i,
							 UID_BASE + i, holder,
							 (void *)(uintptr_t)i)),
				 0);

	/* Every row the daemon will give. */
	fd = raw_connect(fx->d.sock);
	assert_true(fd >= 0);
	assert_int_equal(raw_hello(fd), 0);
	s.has_max_uids = 1;
	s.max_uids = 1000;
	s.has_counters = 1;
	s.counters = 1;
	s.has_usage_uids = 1;
	s.usage_uids = 1000;
	f.id = 2;
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &s;
	assert_int_equal(raw_call(fd, &f, NULL, 0, &m), 0);
	assert_int_equal(m->frame->body_case,
			 DLSHARE__FRAME__BODY_STATS_REPLY);
	r = m->frame->stats_reply;
	/* The holders, and this test's uid (its connection). */
	assert_true(r->has_nuids);
	assert_int_equal(r->nuids, UIDS + 1);
	assert_int_equal(r->names, UIDS);
	/* The top 64 by bytes, biggest first: the uids with i = 69 .. 6. */
	assert_int_equal(r->n_uids, ROWS_MAX);
	for (size_t k = 0; k < r->n_uids; k++) {
		unsigned i = UIDS - 1 - (unsigned)k;

		assert_int_equal(r->uids[k]->uid, UID_BASE + i);
		assert_int_equal(r->uids[k]->bytes, bytes_of(i));
		assert_int_equal(r->uids[k]->names, 1);
	}
	/* The 64 nearest a quota, nearest first: the same uids. */
	assert_int_equal(r->n_usage, ROWS_MAX);
	for (size_t k = 0; k < r->n_usage; k++) {
		unsigned i = UIDS - 1 - (unsigned)k;

		assert_int_equal(r->usage[k]->uid, UID_BASE + i);
		assert_int_equal(r->usage[k]->host_bytes, bytes_of(i));
	}
	wire_msg_free(m);
	close(fd);

	/* The library's view, under its own caps. */
	c = harness_connect(&fx->d);
	assert_int_equal(dlshare_stats_get(c, &st), 0);
	assert_int_equal(st.nuids, UIDS + 1);
	assert_int_equal(st.nuid_rows, DLSHARE_STATS_UIDS);
	for (unsigned k = 0; k < st.nuid_rows; k++)
		assert_int_equal(st.uids[k].uid, UID_BASE + UIDS - 1 - k);
	assert_int_equal(dlshare_metrics(c, &text, &len), 0);
	assert_int_equal(sample(text, "dlshare_uids"), UIDS + 1);
	assert_int_equal(sample(text, "dlshare_uid_rows"),
			 DLSHARE_METRICS_UIDS);
	free(text);
	dlshare_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(many_uids, setup, teardown),
	};

	return test_run_group("stats_uids", tests, NULL, NULL);
}
