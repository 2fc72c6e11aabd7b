/* test_workloads — the two shapes of use DESIGN.md names first, as tests.
 *
 * data_loader: 4 forked workers each produce a sequence of batches (store
 * mode, one name per batch, a bundle of "inputs" and "labels" of a few KiB
 * up to 1 MiB), at most a few ahead of the trainer; the trainer (the test
 * process) gets each batch, checks it bit for bit, and deletes its name.
 * Worker 0 is SIGKILLed midway while it holds a half-written pending
 * version, and worker 1 at a random moment later; each is restarted and
 * resumes its sequence. The trainer must see every batch exactly once,
 * complete and exact: a killed worker's pending version never appears
 * (it dies with its connection, DESIGN.md "create ... dropped if the
 * connection closes first"), and a batch the killed worker had sealed
 * outlives it (store mode). At the end no name, version, lease or byte is
 * left and the daemon's fds are back where they were.
 *
 * weight_sync: a trainer process publishes a bundle of 6 tensors as new
 * versions of one name, in turn store and export (dlshare_host_alloc: the
 * export's deleter scribbles over the memory, so a version handed back
 * while a reader leases it shows as changed data). 3 reader processes
 * follow it with NEWER_THAN gets, each holding the version it has while
 * it gets the next (then re-checking the old one), and a fourth client
 * deletes the name now and then. Every version read must be exactly what
 * the trainer published under that number; each reader's publications
 * strictly increase, and its version numbers too while no delete begun in
 * between (a delete restarts numbers: a reader that times out looks at
 * LATEST and accepts a restart only across a delete); every reader ends
 * at the last version (the deleter stops before it). Every export deleter
 * runs exactly once.
 *
 * DLSHARE_WORKLOAD_BATCHES (default 500, 100 with the daemon under a
 * wrapper such as valgrind) and DLSHARE_WORKLOAD_VERSIONS (200, or 60)
 * size the runs; DLSHARE_WORKLOAD_SEED (default 1) seeds sizes and timing.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "content.h"
#include "util.h"

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

static int light(void)
{
	const char *w = getenv("DLSHARE_TEST_WRAPPER");

	return w && *w;
}

static int env_int(const char *name, int def)
{
	const char *s = getenv(name);

	return s && *s ? atoi(s) : def;
}

static uint64_t seed(void)
{
	const char *s = getenv("DLSHARE_WORKLOAD_SEED");

	return s && *s ? strtoull(s, NULL, 0) : 1;
}

/* Shared by the processes of one test: failures and progress. */
struct failbox {
	_Atomic int failed;
	char msg[1024];
};

static void box_fail(struct failbox *fb, const char *fmt, ...)
{
	int zero = 0;
	va_list ap;
	char msg[900];

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "pid %d: %s\n", (int)getpid(), msg);
	if (atomic_compare_exchange_strong(&fb->failed, &zero, 1))
		snprintf(fb->msg, sizeof(fb->msg), "pid %d: %s", (int)getpid(),
			 msg);
}

static void *shared_new(size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	assert_true(p != MAP_FAILED);
	memset(p, 0, size);
	return p;
}

static const char *code(int err)
{
	static __thread char buf[160];

	snprintf(buf, sizeof(buf), "%d %s [%s]", err, dlshare_strerror(err),
		 dlshare_last_error());
	return buf;
}

/* Checks tensor i of a bundle: its key, and content written by (who, seq)
 * as tensor i of n. Returns 0 with the header in *h, or -1 with why. */
static int check_tensor(const dlshare_bundle *b, size_t i, const char *key,
			uint64_t sd, uint32_t who, uint32_t seq, size_t n,
			struct content_hdr *h, char *why, size_t len)
{
	const DLTensor *t = dlshare_bundle_tensor(b, i);
	const char *k = dlshare_bundle_key(b, i);
	size_t nb;

	if (!t || !k || strcmp(k, key)) {
		snprintf(why, len, "tensor %zu has key '%s', want '%s'", i,
			 k ? k : "(none)", key);
		return -1;
	}
	if (t->device.device_type != kDLCPU || t->strides || !t->data) {
		snprintf(why, len, "tensor %s: device %d strides %p data %p",
			 key, (int)t->device.device_type, (void *)t->strides,
			 t->data);
		return -1;
	}
	nb = util_nbytes(t->dtype, t->ndim, t->shape);
	if (content_check((const char *)t->data + t->byte_offset, nb, sd, h,
			  why, len))
		return -1;
	if (h->who != who || h->seq != seq || h->index != i ||
	    h->ntensors != n) {
		snprintf(why, len, "tensor %s is writer %u write %u tensor %u of "
			 "%u, want writer %u write %u tensor %zu of %zu", key,
			 h->who, h->seq, h->index, h->ntensors, who, seq, i, n);
		return -1;
	}
	return 0;
}

/* ---- a data loader ----------------------------------------------------------- */

#define DL_WORKERS 4
#define DL_DEPTH 6 /* batches a worker may be ahead of the trainer */

struct dl_shm {
	struct failbox fb;
	_Atomic uint32_t sealed[DL_WORKERS];   /* batches sealed, recorded */
	_Atomic uint32_t consumed[DL_WORKERS]; /* batches the trainer took */
	_Atomic int pause_at[DL_WORKERS];      /* 1 + batch to stop in */
	_Atomic int paused[DL_WORKERS];
	_Atomic uint32_t skipped[DL_WORKERS];  /* resumes that skipped one */
};

struct dl_worker {
	struct dl_shm *sh;
	int k, batches;
	uint64_t seed;
};

static void batch_name(int k, uint32_t i, char *buf, size_t len)
{
	snprintf(buf, len, "dl/w%d/b%05u", k, i);
}

/* The shape of batch i of worker k: inputs of 8 KiB..248 KiB (every 50th
 * 1 MiB) as float32 rows of 256, and one int64 label per row. */
static int64_t batch_rows(uint64_t sd, int k, uint32_t i)
{
	uint64_t r = content_mix(sd ^ ((uint64_t)k << 40) ^ i);

	if (i % 50 == 49)
		return 1024;
	return 8 + (int64_t)(r % 248); /* labels: 64 bytes or more */
}

static int dl_produce(const struct daemon_proc *d, void *arg)
{
	struct dl_worker *w = arg;
	struct dl_shm *sh = w->sh;
	dlshare_client *c = util_child_connect(d);
	uint32_t i = atomic_load(&sh->sealed[w->k]);
	char name[64];
	int resumed = 0;

	/* Resuming: batch i may have been sealed by the killed worker after
	 * its last record, or its Seal may still be on its way. It is there,
	 * or the trainer took it (the trainer records what it took before it
	 * deletes), or it is made again: then the trainer taking the other
	 * copy first shows as our pending version dropped by its delete, or
	 * as its record, which we look at again before sealing. */
	if (i < (uint32_t)w->batches) {
		dlshare_name_info info;
		int err;

		batch_name(w->k, i, name, sizeof(name));
		err = dlshare_stat(c, name, &info, NULL);
		if (err && err != DLSHARE_ENOENT)
			CHILD_FAIL("stat %s: %s", name, code(err));
		if ((!err && info.latest) ||
		    atomic_load(&sh->consumed[w->k]) > i) {
			atomic_store(&sh->sealed[w->k], ++i);
			atomic_fetch_add(&sh->skipped[w->k], 1);
		} else {
			resumed = 1;
		}
	}
	for (; i < (uint32_t)w->batches; i++) {
		int64_t rows = batch_rows(w->seed, w->k, i);
		int64_t in_shape[2] = { rows, 256 }, lab_shape[1] = { rows };
		dlshare_tensor_spec spec[2] = {
			{ .key = "inputs", .dtype = DT_F32, .ndim = 2,
			  .shape = in_shape },
			{ .key = "labels", .dtype = DT_I64, .ndim = 1,
			  .shape = lab_shape },
		};
		struct content_hdr h[2];
		dlshare_writer *wr;
		uint64_t v;
		int64_t deadline = util_now_ms() + harness_ms(30000);

		while (i >= atomic_load(&sh->consumed[w->k]) + DL_DEPTH) {
			if (util_now_ms() > deadline)
				CHILD_FAIL("worker %d: the trainer took nothing "
					   "for 30 s (at batch %u)", w->k, i);
			util_sleep_ms(1);
		}
		batch_name(w->k, i, name, sizeof(name));
		CHILD_OK(dlshare_create(c, name, spec, 2, NULL, &wr));
		v = dlshare_writer_version(wr);
		for (int t = 0; t < 2; t++) {
			DLTensor *dt = dlshare_writer_tensor(wr, (size_t)t);

			h[t] = (struct content_hdr){
				.name = (uint32_t)w->k, .who = (uint32_t)w->k,
				.seq = i, .version = v,
				.token = content_token(w->seed, (uint32_t)w->k, i),
				.ntensors = 2, .index = (uint32_t)t,
				.nbytes = util_nbytes(dt->dtype, dt->ndim,
						      dt->shape),
				.extra = i,
			};
			content_fill(dt->data, &h[t], 0, (size_t)h[t].nbytes / 2);
		}
		if (atomic_load(&sh->pause_at[w->k]) == (int)i + 1) {
			/* Half written: wait here for the SIGKILL. */
			atomic_store(&sh->paused[w->k], 1);
			for (;;)
				pause();
		}
		for (int t = 0; t < 2; t++) {
			DLTensor *dt = dlshare_writer_tensor(wr, (size_t)t);

			content_fill(dt->data, &h[t], (size_t)h[t].nbytes / 2,
				     (size_t)h[t].nbytes);
		}
		if (resumed && atomic_load(&sh->consumed[w->k]) > i) {
			dlshare_writer_abort(wr);
			atomic_fetch_add(&sh->skipped[w->k], 1);
		} else {
			int err = dlshare_seal(wr, NULL, NULL);

			if (err == DLSHARE_ENOENT && resumed &&
			    atomic_load(&sh->consumed[w->k]) > i)
				atomic_fetch_add(&sh->skipped[w->k], 1);
			else if (err)
				CHILD_FAIL("seal %s: %s", name, code(err));
		}
		resumed = 0;
		atomic_store(&sh->sealed[w->k], i + 1);
	}
	dlshare_disconnect(c);
	return 0;
}

/* Gets batch i of worker k if it is there; checks it, records it taken,
 * deletes its name. Returns 1 when taken, 0 when not there yet. The
 * previous batch's bundle, held meanwhile, is checked again and freed. */
static int dl_take(dlshare_client *c, struct dl_shm *sh, uint64_t sd, int k,
		   uint32_t i, int timeout, dlshare_bundle **prev,
		   uint32_t *prev_seq, int *prev_k)
{
	dlshare_get_opts o = { .timeout_ms = timeout };
	struct content_hdr h;
	dlshare_bundle *b;
	char name[64], why[300];
	int err;

	batch_name(k, i, name, sizeof(name));
	err = dlshare_get(c, name, &o, &b);
	if (err == DLSHARE_ENOENT || err == DLSHARE_ETIMEDOUT)
		return 0;
	if (err)
		fail_msg("get %s: %s", name, code(err));
	if (dlshare_bundle_count(b) != 2)
		fail_msg("%s v%llu: %zu tensors, want 2", name,
			 (unsigned long long)dlshare_bundle_version(b),
			 dlshare_bundle_count(b));
	for (size_t t = 0; t < 2; t++)
		if (check_tensor(b, t, t ? "labels" : "inputs", sd,
				 (uint32_t)k, i, 2, &h, why, sizeof(why)) ||
		    h.version != dlshare_bundle_version(b))
			fail_msg("%s v%llu: %s (header version %llu)", name,
				 (unsigned long long)dlshare_bundle_version(b),
				 why, (unsigned long long)h.version);
	if (*prev) {
		for (size_t t = 0; t < 2; t++)
			if (check_tensor(*prev, t, t ? "labels" : "inputs", sd,
					 (uint32_t)*prev_k, *prev_seq, 2, &h,
					 why, sizeof(why)))
				fail_msg("the held batch w%d/b%u changed after "
					 "its name was deleted: %s", *prev_k,
					 *prev_seq, why);
		dlshare_bundle_free(*prev);
	}
	*prev = b;
	*prev_seq = i;
	*prev_k = k;
	atomic_store(&sh->consumed[k], i + 1);
	err = dlshare_delete(c, name);
	if (err)
		fail_msg("delete %s: %s", name, code(err));
	return 1;
}

static void data_loader(void **state)
{
	struct fixture *fx = *state;
	struct dl_shm *sh = shared_new(sizeof(*sh));
	struct dl_worker w[DL_WORKERS];
	pid_t pid[DL_WORKERS];
	uint32_t next[DL_WORKERS] = { 0 };
	int batches = env_int("DLSHARE_WORKLOAD_BATCHES", light() ? 100 : 500);
	uint64_t sd = seed(), prng = content_mix(sd ^ 0x4c4f4144ull);
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want empty = UTIL_ANY;
	dlshare_bundle *prev = NULL;
	uint32_t prev_seq = 0, kill1_at;
	int prev_k = 0, fds0, killed0 = 0, killed1 = 0, done = 0;
	int64_t last_progress, t0 = util_now_ms();
	uint64_t taken = 0;

	/* The trainer's many takes will use its request channel. */
	util_channel_open(c);
	assert_int_equal(harness_wait_stats(c, -1, 1, NULL), 0);
	fds0 = harness_fd_count(fx->d.pid);
	/* Worker 0 stops half-way through writing batch batches/2, and
	 * worker 1 is killed at a random moment after its batch kill1_at. */
	atomic_store(&sh->pause_at[0], batches / 2 + 1);
	kill1_at = (uint32_t)(batches / 2 + (int)(prng % (uint64_t)(batches / 4 + 1)));
	for (int k = 0; k < DL_WORKERS; k++) {
		w[k] = (struct dl_worker){ sh, k, batches, sd };
		pid[k] = util_spawn(&fx->d, dl_produce, &w[k]);
	}
	last_progress = util_now_ms();
	while (!done) {
		int progress = 0;

		done = 1;
		for (int k = 0; k < DL_WORKERS; k++) {
			if (next[k] >= (uint32_t)batches)
				continue;
			done = 0;
			while (next[k] < (uint32_t)batches &&
			       dl_take(c, sh, sd, k, next[k], 0, &prev,
				       &prev_seq, &prev_k)) {
				next[k]++;
				taken++;
				progress = 1;
			}
		}
		if (!killed0 && atomic_load(&sh->paused[0])) {
			/* Its pending version must vanish; the batch is
			 * produced again by the worker that replaces it. */
			util_kill(pid[0]);
			atomic_store(&sh->pause_at[0], 0);
			pid[0] = util_spawn(&fx->d, dl_produce, &w[0]);
			killed0 = 1;
		}
		if (!killed1 && atomic_load(&sh->sealed[1]) >= kill1_at) {
			prng = content_mix(prng);
			util_sleep_ms((int)(prng % 3));
			util_kill(pid[1]);
			pid[1] = util_spawn(&fx->d, dl_produce, &w[1]);
			killed1 = 1;
		}
		if (progress) {
			last_progress = util_now_ms();
		} else if (!done) {
			int k = (int)(taken % DL_WORKERS);

			/* Nothing ready: wait a little on one of them. */
			if (next[k] < (uint32_t)batches &&
			    dl_take(c, sh, sd, k, next[k], 5, &prev, &prev_seq,
				    &prev_k)) {
				next[k]++;
				taken++;
				last_progress = util_now_ms();
			}
			if (atomic_load(&sh->fb.failed))
				fail_msg("%s", sh->fb.msg);
			if (util_now_ms() - last_progress > harness_ms(20000))
				fail_msg("no batch for 20 s: the trainer waits for "
					 "w0/b%u w1/b%u w2/b%u w3/b%u; sealed %u %u "
					 "%u %u", next[0], next[1], next[2],
					 next[3], atomic_load(&sh->sealed[0]),
					 atomic_load(&sh->sealed[1]),
					 atomic_load(&sh->sealed[2]),
					 atomic_load(&sh->sealed[3]));
		}
	}
	if (prev)
		dlshare_bundle_free(prev);
	for (int k = 0; k < DL_WORKERS; k++)
		assert_int_equal(util_wait(pid[k]), 0);
	assert_true(killed0 && killed1);
	assert_int_equal(taken, (uint64_t)batches * DL_WORKERS);
	/* Exactly once: nothing was produced again after it was taken, so
	 * with every batch taken and deleted the daemon holds nothing. */
	empty.connections = 1;
	empty.names = 0;
	empty.versions = 0;
	empty.leases = 0;
	empty.buffers = 0;
	empty.bytes = 0;
	empty.parked = 0;
	if (util_wait_want(c, &empty, NULL)) {
		dlshare_stats st = util_stats(c);

		fail_msg("after the last batch the daemon still holds %llu names "
			 "(a batch produced twice?), %llu versions, %llu leases, "
			 "%llu buffers, %llu bytes", (unsigned long long)st.names,
			 (unsigned long long)st.versions,
			 (unsigned long long)st.leases,
			 (unsigned long long)st.buffers,
			 (unsigned long long)st.bytes);
	}
	assert_int_equal(harness_wait_fds(fx->d.pid, fds0), fds0);
	fprintf(stderr, "data_loader: %d workers x %d batches in %lld ms; "
		"resumes that found their batch sealed: %u %u\n", DL_WORKERS,
		batches, (long long)(util_now_ms() - t0),
		atomic_load(&sh->skipped[0]), atomic_load(&sh->skipped[1]));
	dlshare_disconnect(c);
	munmap(sh, sizeof(*sh));
}

/* ---- weight sync ------------------------------------------------------------- */

#define WS_READERS 3
#define WS_TENSORS 6
#define WS_MAX 4096
#define WS_WHO 100
#define WS_NAME "ws/weights"

struct ws_shm {
	struct failbox fb;
	_Atomic uint64_t version[WS_MAX + 1]; /* publication -> version */
	_Atomic uint64_t del_begin, del_end;
	_Atomic int final_phase, deleter_stopped, readers_done;
	_Atomic uint64_t deletes, republished;
	_Atomic uint64_t restarts[WS_READERS], seen[WS_READERS];
};

struct ws_arg {
	struct ws_shm *sh;
	int id, versions;
	uint64_t seed;
};

static const char *const ws_keys[WS_TENSORS] = {
	"layer.0.weight", "layer.0.bias", "layer.1.weight", "layer.1.bias",
	"layer.2.weight", "embed.weight",
};

static int64_t ws_elems(uint64_t sd, uint32_t p, int t)
{
	/* float32, 16..64 KiB */
	return 4096 + (int64_t)(content_mix(sd ^ ((uint64_t)p << 8) ^ (uint64_t)t) %
				12288);
}

/* Export deleters: scribble, count. */
static struct {
	pthread_mutex_t lock;
	DLManagedTensor *t[WS_MAX * WS_TENSORS / 8];
	void (*orig[WS_MAX * WS_TENSORS / 8])(DLManagedTensor *);
	int n;
	atomic_int wrapped, ran, unknown, leaving;
} wx = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void ws_deleter(DLManagedTensor *t)
{
	void (*orig)(DLManagedTensor *) = NULL;

	pthread_mutex_lock(&wx.lock);
	for (int i = 0; i < wx.n; i++)
		if (wx.t[i] == t) {
			orig = wx.orig[i];
			wx.t[i] = wx.t[wx.n - 1];
			wx.orig[i] = wx.orig[wx.n - 1];
			wx.n--;
			break;
		}
	pthread_mutex_unlock(&wx.lock);
	if (!orig) {
		atomic_fetch_add(&wx.unknown, 1);
		return;
	}
	/* Retired: the producer may reuse it, and does. */
	if (!atomic_load(&wx.leaving))
		memset(t->dl_tensor.data, 0xEE,
		       util_nbytes(t->dl_tensor.dtype, t->dl_tensor.ndim,
				   t->dl_tensor.shape));
	atomic_fetch_add(&wx.ran, 1);
	orig(t);
}

static int ws_trainer(const struct daemon_proc *d, void *arg)
{
	struct ws_arg *a = arg;
	struct ws_shm *sh = a->sh;
	dlshare_client *c = util_child_connect(d);
	int64_t deadline;

	for (uint32_t p = 1; p <= (uint32_t)a->versions; p++) {
		int64_t shapes[WS_TENSORS][1];
		struct content_hdr h[WS_TENSORS];
		uint64_t v = 0;

		if (p == (uint32_t)a->versions - 10) {
			/* The last versions come with no delete racing. */
			atomic_store(&sh->final_phase, 1);
			deadline = util_now_ms() + harness_ms(20000);
			while (!atomic_load(&sh->deleter_stopped))
				if (util_now_ms() > deadline)
					CHILD_FAIL("the deleter does not stop");
				else
					util_sleep_ms(1);
		}
		for (int t = 0; t < WS_TENSORS; t++) {
			shapes[t][0] = ws_elems(a->seed, p, t);
			h[t] = (struct content_hdr){
				.name = 0, .who = WS_WHO, .seq = p,
				.token = content_token(a->seed, WS_WHO, p),
				.ntensors = WS_TENSORS, .index = (uint32_t)t,
				.nbytes = (uint64_t)shapes[t][0] * 4, .extra = p,
			};
		}
		if (p % 2) {
			dlshare_tensor_spec spec[WS_TENSORS];
			dlshare_writer *w;

			for (int t = 0; t < WS_TENSORS; t++)
				spec[t] = (dlshare_tensor_spec){
					.key = ws_keys[t], .dtype = DT_F32,
					.ndim = 1, .shape = shapes[t],
				};
			uint64_t e0 = atomic_load(&sh->del_end);
			int err;

			CHILD_OK(dlshare_create(c, WS_NAME, spec, WS_TENSORS,
						NULL, &w));
			for (int t = 0; t < WS_TENSORS; t++) {
				h[t].version = dlshare_writer_version(w);
				content_fill(dlshare_writer_tensor(w, (size_t)t)->data,
					     &h[t], 0, (size_t)h[t].nbytes);
			}
			err = dlshare_seal(w, NULL, &v);
			if (err == DLSHARE_ENOENT &&
			    atomic_load(&sh->del_begin) != e0) {
				/* A delete dropped the pending version: publish
				 * it again. */
				atomic_fetch_add(&sh->republished, 1);
				p--;
				continue;
			}
			if (err)
				CHILD_FAIL("seal of publication %u: %s%s", p,
					   code(err),
					   atomic_load(&sh->del_begin) == e0 ?
					   ", no delete begun since the create" :
					   "");
		} else {
			DLManagedTensor *m[WS_TENSORS];
			dlshare_publish_opts o = {
				.keys = ws_keys, .flags = DLSHARE_PUBLISH_NO_COPY,
			};

			for (int t = 0; t < WS_TENSORS; t++) {
				CHILD_OK(dlshare_host_alloc(DT_F32, 1, shapes[t],
							    &m[t]));
				content_fill(m[t]->dl_tensor.data, &h[t], 0,
					     (size_t)h[t].nbytes);
				pthread_mutex_lock(&wx.lock);
				if (wx.n == (int)(sizeof(wx.t) / sizeof(wx.t[0])))
					CHILD_FAIL("more than %d exports live",
						   wx.n);
				wx.t[wx.n] = m[t];
				wx.orig[wx.n] = m[t]->deleter;
				wx.n++;
				pthread_mutex_unlock(&wx.lock);
				m[t]->deleter = ws_deleter;
				atomic_fetch_add(&wx.wrapped, 1);
			}
			CHILD_OK(dlshare_publish(c, WS_NAME, m, WS_TENSORS, &o,
						 &v));
		}
		atomic_store(&sh->version[p], v);
		util_sleep_ms(1 + (int)(content_mix(a->seed ^ p) % 3));
	}
	/* Exports stay valid while the readers finish. */
	deadline = util_now_ms() + harness_ms(60000);
	while (atomic_load(&sh->readers_done) < WS_READERS &&
	       !atomic_load(&sh->fb.failed))
		if (util_now_ms() > deadline)
			CHILD_FAIL("the readers do not finish");
		else
			util_sleep_ms(2);
	atomic_store(&wx.leaving, 1);
	dlshare_disconnect(c);
	CHILD_CHECK(atomic_load(&wx.unknown) == 0);
	if (atomic_load(&wx.ran) != atomic_load(&wx.wrapped))
		CHILD_FAIL("%d export deleters ran for %d exported tensors",
			   atomic_load(&wx.ran), atomic_load(&wx.wrapped));
	return 0;
}

static int ws_deleter_main(const struct daemon_proc *d, void *arg)
{
	struct ws_arg *a = arg;
	struct ws_shm *sh = a->sh;
	dlshare_client *c = util_child_connect(d);
	uint64_t r = content_mix(a->seed ^ 0xde1e7eull);

	while (!atomic_load(&sh->final_phase)) {
		int err;

		r = content_mix(r);
		util_sleep_ms(3 + (int)(r % 25));
		if (atomic_load(&sh->final_phase))
			break;
		atomic_fetch_add(&sh->del_begin, 1);
		err = dlshare_delete(c, WS_NAME);
		atomic_fetch_add(&sh->del_end, 1);
		if (err && err != DLSHARE_ENOENT)
			CHILD_FAIL("delete: %s", code(err));
		if (!err)
			atomic_fetch_add(&sh->deletes, 1);
	}
	atomic_store(&sh->deleter_stopped, 1);
	dlshare_disconnect(c);
	return 0;
}

/* Checks a version of the weights: publication p's content. Returns p,
 * or 0 after a failure report. */
static uint32_t ws_check(struct ws_shm *sh, uint64_t sd,
			 const dlshare_bundle *b, const char *what)
{
	struct content_hdr h0, h;
	char why[300];
	uint64_t v = dlshare_bundle_version(b);

	if (dlshare_bundle_count(b) != WS_TENSORS) {
		box_fail(&sh->fb, "%s v%llu: %zu tensors", what,
			 (unsigned long long)v, dlshare_bundle_count(b));
		return 0;
	}
	{
		const DLTensor *t = dlshare_bundle_tensor(b, 0);

		if (!t || t->ndim != 1 || t->shape[0] < 16) {
			box_fail(&sh->fb, "%s v%llu: a bad first tensor", what,
				 (unsigned long long)v);
			return 0;
		}
		memcpy(&h0, t->data, sizeof(h0));
	}
	for (size_t t = 0; t < WS_TENSORS; t++)
		if (check_tensor(b, t, ws_keys[t], sd, WS_WHO, h0.seq,
				 WS_TENSORS, &h, why, sizeof(why)) ||
		    (h.version && h.version != v) || h.seq < 1 ||
		    h.seq > WS_MAX) {
			box_fail(&sh->fb, "%s v%llu: %s (header: publication %u "
				 "version %llu)", what, (unsigned long long)v,
				 why, h.seq, (unsigned long long)h.version);
			return 0;
		}
	return h0.seq;
}

static int ws_reader(const struct daemon_proc *d, void *arg)
{
	struct ws_arg *a = arg;
	struct ws_shm *sh = a->sh;
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *held = NULL;
	uint64_t last_v = 0, last_e0 = 0;
	uint32_t last_p = 0, held_p = 0;
	uint64_t r = content_mix(a->seed ^ (uint64_t)a->id);
	static uint64_t got_v[WS_MAX + 1];
	int64_t deadline = util_now_ms() + harness_ms(60000);

	while (last_p < (uint32_t)a->versions) {
		dlshare_get_opts o = { .select = DLSHARE_NEWER_THAN,
				       .version = last_v,
				       .timeout_ms = harness_ms(30) };
		dlshare_bundle *b = NULL;
		uint64_t e0 = atomic_load(&sh->del_end), v;
		uint32_t p;
		int err, quiet;

		if (util_now_ms() > deadline || atomic_load(&sh->fb.failed))
			CHILD_FAIL("reader %d: at publication %u (v%llu) after "
				   "60 s", a->id, last_p,
				   (unsigned long long)last_v);
		err = dlshare_get(c, WS_NAME, &o, &b);
		if (err == DLSHARE_ETIMEDOUT || err == DLSHARE_ENOENT) {
			/* Perhaps a delete restarted the numbers. */
			o.select = DLSHARE_LATEST;
			o.timeout_ms = 0;
			err = dlshare_get(c, WS_NAME, &o, &b);
			if (err == DLSHARE_ENOENT)
				continue;
		}
		if (err)
			CHILD_FAIL("reader %d: get: %s", a->id, code(err));
		quiet = atomic_load(&sh->del_begin) == last_e0;
		v = dlshare_bundle_version(b);
		p = ws_check(sh, a->seed, b, "read");
		if (!p)
			CHILD_FAIL("reader %d: %s", a->id, sh->fb.msg);
		if (p < last_p || (p == last_p && v != last_v)) {
			box_fail(&sh->fb, "reader %d: publication %u (v%llu) "
				 "after %u (v%llu)", a->id, p,
				 (unsigned long long)v, last_p,
				 (unsigned long long)last_v);
			CHILD_FAIL("%s", sh->fb.msg);
		}
		if (p == last_p) {
			dlshare_bundle_free(b);
			continue;
		}
		if (v <= last_v) {
			if (quiet) {
				box_fail(&sh->fb, "reader %d: v%llu (publication "
					 "%u) after v%llu (publication %u), and "
					 "no delete begun in between", a->id,
					 (unsigned long long)v, p,
					 (unsigned long long)last_v, last_p);
				CHILD_FAIL("%s", sh->fb.msg);
			}
			atomic_fetch_add(&sh->restarts[a->id], 1);
		}
		got_v[p] = v;
		atomic_fetch_add(&sh->seen[a->id], 1);
		/* The old weights are still in use while the new ones come:
		 * they must not have changed. */
		if (held && ws_check(sh, a->seed, held, "held") != held_p)
			CHILD_FAIL("reader %d: the held publication %u changed: "
				   "%s", a->id, held_p, sh->fb.msg);
		dlshare_bundle_free(held);
		/* Half the time the new weights replace the old at once:
		 * a delete while no reader leases a version restarts the
		 * numbers (a leased, deleted version keeps them going). */
		r = content_mix(r);
		if (r % 2) {
			dlshare_bundle_free(b);
			b = NULL;
		}
		held = b;
		held_p = p;
		last_p = p;
		last_v = v;
		last_e0 = e0;
	}
	dlshare_bundle_free(held);
	atomic_fetch_add(&sh->readers_done, 1);
	/* Every version read is the one the trainer published under that
	 * number. */
	for (uint32_t p = 1; p <= (uint32_t)a->versions; p++) {
		uint64_t want = atomic_load(&sh->version[p]);

		for (int i = 0; got_v[p] && !want && i < harness_ms(5000); i++) {
			util_sleep_ms(1);
			want = atomic_load(&sh->version[p]);
		}
		if (got_v[p] && got_v[p] != want)
			CHILD_FAIL("reader %d: publication %u read as v%llu, "
				   "published as v%llu", a->id, p,
				   (unsigned long long)got_v[p],
				   (unsigned long long)want);
	}
	dlshare_disconnect(c);
	return 0;
}

static void weight_sync(void **state)
{
	struct fixture *fx = *state;
	struct ws_shm *sh = shared_new(sizeof(*sh));
	int versions = env_int("DLSHARE_WORKLOAD_VERSIONS", light() ? 60 : 200);
	struct ws_arg args[WS_READERS + 2];
	pid_t pids[WS_READERS + 2];
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want empty = UTIL_ANY;
	int fds0, st;
	int64_t t0 = util_now_ms();

	if (versions < 20)
		versions = 20;
	if (versions > WS_MAX)
		versions = WS_MAX;
	assert_int_equal(harness_wait_stats(c, -1, 1, NULL), 0);
	fds0 = harness_fd_count(fx->d.pid);
	for (int i = 0; i < WS_READERS + 2; i++)
		args[i] = (struct ws_arg){ sh, i, versions, seed() };
	for (int i = 0; i < WS_READERS; i++)
		pids[i] = util_spawn(&fx->d, ws_reader, &args[i]);
	pids[WS_READERS] = util_spawn(&fx->d, ws_deleter_main,
				      &args[WS_READERS]);
	pids[WS_READERS + 1] = util_spawn(&fx->d, ws_trainer,
					  &args[WS_READERS + 1]);
	for (int i = 0; i < WS_READERS + 2; i++) {
		st = util_wait(pids[i]);
		if (st)
			fail_msg("%s %d exited with %d: %s",
				 i < WS_READERS ? "reader" :
				 i == WS_READERS ? "deleter" : "trainer", i, st,
				 sh->fb.msg);
	}
	fprintf(stderr, "weight_sync: %d versions (%llu published again after "
		"a delete dropped them pending), %llu deletes, readers saw "
		"%llu/%llu/%llu versions with %llu/%llu/%llu restarts, %lld ms\n",
		versions, (unsigned long long)atomic_load(&sh->republished),
		(unsigned long long)atomic_load(&sh->deletes),
		(unsigned long long)sh->seen[0], (unsigned long long)sh->seen[1],
		(unsigned long long)sh->seen[2],
		(unsigned long long)sh->restarts[0],
		(unsigned long long)sh->restarts[1],
		(unsigned long long)sh->restarts[2],
		(long long)(util_now_ms() - t0));
	assert_int_equal(atomic_load(&sh->fb.failed), 0);
	/* The last version is store mode (odd) or went with its exporter. */
	(void)dlshare_delete(c, WS_NAME);
	empty.connections = 1;
	empty.names = 0;
	empty.versions = 0;
	empty.leases = 0;
	empty.buffers = 0;
	empty.bytes = 0;
	empty.parked = 0;
	util_assert_want(c, &empty);
	assert_int_equal(harness_wait_fds(fx->d.pid, fds0), fds0);
	dlshare_disconnect(c);
	munmap(sh, sizeof(*sh));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(data_loader, setup, teardown),
		cmocka_unit_test_setup_teardown(weight_sync, setup, teardown),
	};

	return cmocka_run_group_tests_name("workloads", tests, NULL, NULL);
}
