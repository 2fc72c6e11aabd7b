/* figures — dlshare measured through libdlshare, one child per figure. */
#include "figures.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

#include "wire.h"

/* Names of the scale figures: "s/" and 7 digits; at most this many of
 * them are read in a loop. */
#define SPREAD_NAMES 64
/* Bytes of a CUDA IPC memory handle (cudaIpcMemHandle_t). */
#define REGISTRY_HANDLE_BYTES 64

static void fail(const char *what, int err)
{
	fprintf(stderr, "bench: %s: %s (%s)\n", what,
		err < 0 ? dlshare_strerror(err) : strerror(errno),
		err < 0 ? dlshare_last_error() : "");
}

static dlshare_client *connect_or_die(const struct daemon_proc *d)
{
	dlshare_client *c;
	int err = dlshare_connect(d->sock, &c);

	if (err) {
		fail("connect", err);
		_exit(1);
	}
	return c;
}

/* Runs fn in a child; it fills up to max doubles and returns how many, or
 * -1. Returns that count here, or -1. */
static int in_child(int (*fn)(void *arg, double *out, int max), void *arg,
		    double *out, int max)
{
	int p[2], n = -1;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -1;
	pid = util_fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		double *v = calloc((size_t)max, sizeof(*v));
		int k;

		close(p[0]);
		k = v ? fn(arg, v, max) : -1;
		if (util_write_all(p[1], &k, sizeof(k)) < 0 ||
		    (k > 0 && util_write_all(p[1], v, (size_t)k * sizeof(*v)) < 0))
			_exit(1);
		_exit(k < 0);
	}
	close(p[1]);
	if (read(p[0], &n, sizeof(n)) != sizeof(n))
		n = -1;
	for (size_t got = 0; n > 0 && got < (size_t)n * sizeof(*out);) {
		ssize_t r = read(p[0], (char *)out + got,
				 (size_t)n * sizeof(*out) - got);

		if (r <= 0) {
			n = -1;
			break;
		}
		got += (size_t)r;
	}
	close(p[0]);
	if (child_wait(pid) != 0)
		n = -1;
	return n;
}

/* ---- packet sizes ------------------------------------------------------- */

void fig_packet_sizes(struct fig_packets *p)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;
	Dlshare__GetReply r = DLSHARE__GET_REPLY__INIT;
	Dlshare__Tensor t = DLSHARE__TENSOR__INIT, *tp = &t;
	Dlshare__DataType dt = DLSHARE__DATA_TYPE__INIT;
	Dlshare__Buffer b = DLSHARE__BUFFER__INIT, *bp = &b;
	Dlshare__Device dev = DLSHARE__DEVICE__INIT;
	Dlshare__Release rel = DLSHARE__RELEASE__INIT;
	int64_t shape = FIG_TENSOR_BYTES / 4;
	uint64_t lease = 100000;

	/* What libdlshare sends for dlshare_get(c, FIG_NAME, NULL): request
	 * ids and lease ids are a few thousand into a run. */
	f.id = 5000;
	g.name = (char *)FIG_NAME;
	g.has_select = 1;
	g.has_version = 1;
	f.body_case = DLSHARE__FRAME__BODY_GET;
	f.get = &g;
	p->get = dlshare__frame__get_packed_size(&f);

	/* What dlshared answers (dispatch.c, reply_get). */
	dt.code = kDLFloat;
	dt.bits = 32;
	dt.lanes = 1;
	t.key = (char *)"";
	t.dtype = &dt;
	t.n_shape = 1;
	t.shape = &shape;
	dev.type = kDLCPU;
	b.id = 3;
	b.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
	b.size = FIG_TENSOR_BYTES;
	b.device = &dev;
	r.version = 1;
	r.lease = lease;
	r.read_only = 1;
	r.n_tensors = 1;
	r.tensors = &tp;
	r.n_buffers = 1;
	r.buffers = &bp;
	f.body_case = DLSHARE__FRAME__BODY_GET_REPLY;
	f.get_reply = &r;
	p->reply = dlshare__frame__get_packed_size(&f);
	b.has_fd_attached = 1;
	b.fd_attached = 1;
	f.has_nfds = 1;
	f.nfds = 1;
	p->reply_fd = dlshare__frame__get_packed_size(&f);

	f = (Dlshare__Frame)DLSHARE__FRAME__INIT;
	rel.n_leases = 1;
	rel.leases = &lease;
	f.body_case = DLSHARE__FRAME__BODY_RELEASE;
	f.release = &rel;
	p->release = dlshare__frame__get_packed_size(&f);
}

/* ---- publish ----------------------------------------------------------- */

/* A new store version of name: float32[bytes / 4], filled with fill.
 * Returns 0 and *version, or a DLSHARE_E* code. */
static int publish_one(dlshare_client *c, const char *name, uint64_t bytes,
		       int fill, uint64_t *version)
{
	int64_t shape = (int64_t)(bytes / 4);
	dlshare_tensor_spec spec = { .key = "", .dtype = { kDLFloat, 32, 1 },
				     .ndim = 1, .shape = &shape };
	dlshare_writer *w;
	int err = dlshare_create(c, name, &spec, 1, NULL, &w);

	if (err)
		return err;
	if (fill >= 0)
		memset(dlshare_writer_tensor(w, 0)->data, fill, bytes);
	return dlshare_seal(w, NULL, version);
}

struct publish_arg {
	const struct daemon_proc *d;
	const char *name;
	uint64_t bytes;
};

static int publish_child(void *arg, double *out, int max)
{
	struct publish_arg *a = arg;
	dlshare_client *c = connect_or_die(a->d);
	int err = publish_one(c, a->name, a->bytes, 0x11, NULL);

	if (err)
		fail("publish", err);
	dlshare_disconnect(c);
	return err ? -1 : 0;
}

int fig_publish(const struct daemon_proc *d, const char *name,
		uint64_t bytes)
{
	struct publish_arg a = { d, name, bytes };
	double dummy;

	return in_child(publish_child, &a, &dummy, 1) < 0 ? -1 : 0;
}

/* ---- get latency -------------------------------------------------------- */

/* One get + release; returns 0 or a code. */
static int get_release(dlshare_client *c, const char *name)
{
	DLManagedTensor *t;
	int err = dlshare_get_tensor(c, name, NULL, &t);

	if (err)
		return err;
	t->deleter(t);
	return 0;
}

struct lat_arg {
	const struct daemon_proc *d;
	const char *name;
	long iters;
	int reuse;          /* the version board's reuse on */
};

/* Requests the daemon served, asked on c; 0 when it cannot say. */
static uint64_t served(dlshare_client *c)
{
	dlshare_stats st;

	return dlshare_stats_get(c, &st) ? 0 : st.requests;
}

static int latency_child(void *arg, double *out, int max)
{
	struct lat_arg *a = arg;
	struct samples s = { 0 };
	dlshare_client *c;
	long warm = a->iters / 10 + 100;
	uint64_t asked = 0;

	if (a->reuse)
		unsetenv("DLSHARE_NO_REUSE");
	c = connect_or_die(a->d);
	if (a->reuse)
		asked = served(c);

	for (long i = 0; i < warm + a->iters; i++) {
		uint64_t t0 = util_now_ns();
		int err = get_release(c, a->name);

		if (err) {
			fail("get", err);
			return -1;
		}
		if (i >= warm)
			samples_add(&s, (double)(util_now_ns() - t0));
	}
	if (a->reuse && (asked = served(c) - asked) * 10 > (uint64_t)a->iters) {
		fprintf(stderr, "bench: %llu requests for %ld gets that "
			"should have been reused\n", (unsigned long long)asked,
			warm + a->iters);
		return -1;
	}
	dlshare_disconnect(c);
	out[0] = samples_quantile(&s, 0.50);
	out[1] = samples_quantile(&s, 0.99);
	samples_free(&s);
	return 2;
}

static int get_latency(const struct daemon_proc *d, const char *name,
		       long iters, int reuse, double *p50, double *p99)
{
	struct lat_arg a = { d, name, iters, reuse };
	double v[2];

	if (in_child(latency_child, &a, v, 2) != 2)
		return -1;
	*p50 = v[0];
	*p99 = v[1];
	return 0;
}

int fig_get_latency_reused(const struct daemon_proc *d, const char *name,
			   long iters, double *p50, double *p99)
{
	return get_latency(d, name, iters, 1, p50, p99);
}

int fig_get_latency(const struct daemon_proc *d, const char *name,
		    long iters, double *p50, double *p99)
{
	return get_latency(d, name, iters, 0, p50, p99);
}

/* ---- first get ----------------------------------------------------------- */

static int first_child(void *arg, double *out, int max)
{
	struct lat_arg *a = arg;
	struct samples s = { 0 };
	dlshare_client *prod = connect_or_die(a->d);
	dlshare_client *cons = connect_or_die(a->d);

	for (long i = 0; i < a->iters + 10; i++) {
		DLManagedTensor *t;
		uint64_t t0;
		int err = publish_one(prod, "bench/first", FIG_TENSOR_BYTES,
				      -1, NULL);

		if (err) {
			fail("publish", err);
			return -1;
		}
		t0 = util_now_ns();
		err = dlshare_get_tensor(cons, "bench/first", NULL, &t);
		if (err) {
			fail("get", err);
			return -1;
		}
		if (i >= 10)
			samples_add(&s, (double)(util_now_ns() - t0));
		/* The version dies once superseded and released: the daemon
		 * says BufferGone and the consumer unmaps it, so the next get
		 * maps a new buffer again. */
		t->deleter(t);
	}
	dlshare_disconnect(cons);
	dlshare_disconnect(prod);
	out[0] = samples_quantile(&s, 0.50);
	out[1] = samples_quantile(&s, 0.99);
	samples_free(&s);
	return 2;
}

int fig_first_get(const struct daemon_proc *d, long iters, double *p50,
		  double *p99)
{
	struct lat_arg a = { d, NULL, iters, 0 };
	double v[2];

	if (in_child(first_child, &a, v, 2) != 2)
		return -1;
	*p50 = v[0];
	*p99 = v[1];
	return 0;
}

/* ---- throughput ------------------------------------------------------------ */

struct tp_arg {
	const struct daemon_proc *d;
	const char *name;
	int n;
	long ms;
	int names;          /* 0: name itself; else name.0 .. name.<names-1> */
	int reuse;
};

/* The name a worker reads in its i-th get. */
static const char *tp_name(const struct tp_arg *a, char (*names)[64],
			   uint64_t i)
{
	return a->names ? names[i % (uint64_t)a->names] : a->name;
}

static void tp_worker(const struct tp_arg *a, int ready, int go, int out,
		      const volatile uint64_t *deadline)
{
	dlshare_client *c;
	uint64_t ops = 0;
	char b = 'r', (*names)[64] = calloc((size_t)a->names + 1, 64);

	if (!names)
		_exit(1);
	for (int k = 0; k < a->names; k++)
		snprintf(names[k], 64, "%s.%d", a->name, k);
	if (a->reuse)
		unsetenv("DLSHARE_NO_REUSE");
	c = connect_or_die(a->d);
	/* The first gets map the buffers; the rest are the steady state. */
	for (int k = 0; k < (a->names ? a->names : 1); k++)
		if (get_release(c, tp_name(a, names, (uint64_t)k)))
			_exit(1);
	if (util_write_all(ready, &b, 1) < 0)
		_exit(1);
	while (read(go, &b, 1) < 0 && errno == EINTR)
		;
	while (util_now_ns() < *deadline) {
		int err = get_release(c, tp_name(a, names, ops));

		if (err) {
			fail("get", err);
			_exit(1);
		}
		ops++;
	}
	dlshare_disconnect(c);
	if (util_write_all(out, &ops, sizeof(ops)) < 0)
		_exit(1);
	_exit(0);
}

static int throughput_child(void *arg, double *out, int max)
{
	struct tp_arg *a = arg;
	volatile uint64_t *deadline;
	int ready[2], go[2], res[2], ok = 1;
	pid_t *pids = calloc((size_t)a->n, sizeof(*pids));
	uint64_t total = 0;

	deadline = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (!pids || deadline == MAP_FAILED || pipe2(ready, O_CLOEXEC) < 0 ||
	    pipe2(go, O_CLOEXEC) < 0 || pipe2(res, O_CLOEXEC) < 0)
		return -1;
	*deadline = UINT64_MAX;
	for (int i = 0; i < a->n; i++) {
		pids[i] = util_fork();
		if (pids[i] < 0)
			return -1;
		if (pids[i] == 0) {
			close(ready[0]);
			close(go[1]);
			close(res[0]);
			tp_worker(a, ready[1], go[0], res[1], deadline);
		}
	}
	close(ready[1]);
	close(go[0]);
	close(res[1]);
	for (int i = 0; i < a->n; i++) {
		char b;

		if (read(ready[0], &b, 1) != 1) {
			ok = 0;
			break;
		}
	}
	*deadline = util_now_ns() + (uint64_t)a->ms * 1000000u;
	close(go[1]);
	for (int i = 0; ok && i < a->n; i++) {
		uint64_t ops;

		if (read(res[0], &ops, sizeof(ops)) != sizeof(ops))
			ok = 0;
		else
			total += ops;
	}
	for (int i = 0; i < a->n; i++)
		if (child_wait(pids[i]) != 0)
			ok = 0;
	free(pids);
	if (!ok) {
		fprintf(stderr, "bench: a throughput client failed\n");
		return -1;
	}
	out[0] = (double)total * 1000.0 / (double)a->ms;
	return 1;
}

int fig_throughput_names(const struct daemon_proc *d, const char *name,
			 int names, int reuse, int n, long ms,
			 double *ops_per_s)
{
	struct tp_arg a = { d, name, n, ms, names, reuse };

	return in_child(throughput_child, &a, ops_per_s, 1) == 1 ? 0 : -1;
}

int fig_throughput(const struct daemon_proc *d, const char *name, int n,
		   long ms, double *ops_per_s)
{
	return fig_throughput_names(d, name, 0, 0, n, ms, ops_per_s);
}

/* ---- handoff ------------------------------------------------------------- */

struct handoff_arg {
	const struct daemon_proc *d;
	char name[64];
	uint64_t bytes;
	long iters;
	int exported;
	uint64_t evict;
};

/* The consumer: waits for each next version; reports when it holds it. */
static void handoff_consumer(const struct handoff_arg *a, int out)
{
	dlshare_client *c = connect_or_die(a->d);
	uint64_t last = 0;

	for (long i = 0; i < a->iters; i++) {
		dlshare_get_opts o = { .select = DLSHARE_NEWER_THAN,
				       .version = last, .timeout_ms = 120000 };
		dlshare_bundle *b;
		const DLTensor *t;
		uint64_t t1;
		int err = dlshare_get(c, a->name, &o, &b);

		t1 = util_now_ns();
		if (err) {
			fail("handoff get", err);
			_exit(1);
		}
		last = dlshare_bundle_version(b);
		t = dlshare_bundle_tensor(b, 0);
		/* Holding it means reading it works: one byte, untimed. */
		if (((const unsigned char *)t->data)[0] != (unsigned char)i) {
			fprintf(stderr, "bench: handoff: wrong data\n");
			_exit(1);
		}
		dlshare_bundle_free(b);
		if (util_write_all(out, &t1, sizeof(t1)) < 0)
			_exit(1);
	}
	dlshare_disconnect(c);
	_exit(0);
}

static int wait_parked(dlshare_client *c)
{
	for (int i = 0; i < 200000; i++) {
		dlshare_stats st;
		int err = dlshare_stats_get(c, &st);

		if (err) {
			fail("stats", err);
			return -1;
		}
		if (st.parked >= 1)
			return 0;
		usleep(100);
	}
	fprintf(stderr, "bench: handoff consumer never waited\n");
	return -1;
}

/* Makes the next version: written, not yet visible. Store mode: a writer
 * (*w); export mode: a tensor of dlshare_host_alloc (*t). */
static int handoff_prepare(dlshare_client *c, const struct handoff_arg *a,
			   long i, dlshare_writer **w, DLManagedTensor **t)
{
	int64_t shape = (int64_t)(a->bytes / 4);
	dlshare_tensor_spec spec = { .key = "", .dtype = { kDLFloat, 32, 1 },
				     .ndim = 1, .shape = &shape };
	int err;

	if (a->exported)
		err = dlshare_host_alloc(spec.dtype, 1, &shape, t);
	else
		err = dlshare_create(c, a->name, &spec, 1, NULL, w);
	if (err)
		return err;
	/* The producer writes every page: the mapping is populated, as it is
	 * after any real producer's writes. */
	memset(a->exported ? (*t)->dl_tensor.data :
	       dlshare_writer_tensor(*w, 0)->data, (int)i, a->bytes);
	return 0;
}

static int handoff_child(void *arg, double *out, int max)
{
	struct handoff_arg *a = arg;
	dlshare_publish_opts po = { .flags = DLSHARE_PUBLISH_NO_COPY };
	dlshare_client *c;
	char *scratch = NULL;
	int p[2], n = 0;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -1;
	pid = util_fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		close(p[0]);
		handoff_consumer(a, p[1]);
	}
	close(p[1]);
	/* Private memory the producer writes besides the version (evict):
	 * only its effect on the caches matters. None of it is the
	 * consumer's: made after the fork. */
	if (a->evict) {
		scratch = mmap(NULL, a->evict, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (scratch == MAP_FAILED)
			scratch = NULL;
	}
	c = connect_or_die(a->d);
	for (long i = 0; i < a->iters && n < max; i++) {
		dlshare_writer *w = NULL;
		DLManagedTensor *t = NULL;
		uint64_t t0, t1;
		int err = handoff_prepare(c, a, i, &w, &t);

		if (err) {
			fail("handoff: make the version", err);
			break;
		}
		if (scratch)
			memset(scratch, (int)i + 1, a->evict);
		if (wait_parked(c)) {
			if (t)
				t->deleter(t);
			dlshare_writer_abort(w);
			break;
		}
		t0 = util_now_ns();
		/* Export: the library keeps t until the daemon retires it. */
		err = a->exported ? dlshare_publish(c, a->name, &t, 1, &po, NULL) :
		      dlshare_seal(w, NULL, NULL);
		if (err) {
			fail(a->exported ? "handoff publish" : "handoff seal",
			     err);
			if (t)
				t->deleter(t);
			break;
		}
		if (read(p[0], &t1, sizeof(t1)) != sizeof(t1))
			break;
		out[n++] = (double)(t1 - t0);
	}
	/* The last version would outlive us: give its memory back. */
	dlshare_delete(c, a->name);
	dlshare_disconnect(c);
	close(p[0]);
	if (scratch)
		munmap(scratch, a->evict);
	if (child_wait(pid) != 0 || n != a->iters || (a->evict && !scratch))
		return -1;
	return n;
}

int fig_handoff(const struct daemon_proc *d, uint64_t bytes, long iters,
		int exported, uint64_t evict, double *out)
{
	static unsigned calls;
	struct handoff_arg a = { .d = d, .bytes = bytes, .iters = iters,
				 .exported = exported, .evict = evict };

	/* A name of its own, so no earlier version answers the first get. */
	snprintf(a.name, sizeof(a.name), "bench/handoff/%u", ++calls);
	return in_child(handoff_child, &a, out, (int)iters) == iters ? 0 : -1;
}

/* ---- a large version freed --------------------------------------------- */

struct free_arg {
	const struct daemon_proc *d;
	uint64_t bytes;
};

/* Another client's worst get+release of a 4 KiB name over FREE_WINDOW_MS,
 * in ns; with a version of bytes bytes deleted at its start (bytes 0:
 * nothing deleted). The reader is a process of its own. */
#define FREE_WINDOW_MS 200

static int free_child(void *arg, double *out, int max)
{
	struct free_arg *a = arg;
	dlshare_client *c = connect_or_die(a->d);
	const int64_t shape[] = { (int64_t)(a->bytes / 4) }, one[] = { 1024 };
	dlshare_tensor_spec big = { .dtype = { kDLFloat, 32, 1 }, .ndim = 1,
				    .shape = shape };
	dlshare_tensor_spec small = big;
	volatile uint64_t *worst;
	dlshare_writer *w;
	int p[2], err = 0, n = -1;
	pid_t pid;

	small.shape = one;
	worst = mmap(NULL, sizeof(*worst), PROT_READ | PROT_WRITE,
		     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (max < 1 || worst == MAP_FAILED || pipe2(p, O_CLOEXEC) < 0)
		return -1;
	if (!(err = dlshare_create(c, "bench/free/small", &small, 1, NULL, &w)))
		err = dlshare_seal(w, NULL, NULL);
	if (!err && a->bytes &&
	    !(err = dlshare_create(c, "bench/free/big", &big, 1, NULL, &w))) {
		/* Written, as a batch or a weight is. */
		memset(dlshare_writer_tensor(w, 0)->data, 1, a->bytes);
		err = dlshare_seal(w, NULL, NULL);
	}
	if (err) {
		fail("free: make the versions", err);
		return -1;
	}
	pid = util_fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		/* The reader: gets until the window is over. */
		dlshare_client *r = connect_or_die(a->d);
		uint64_t end, t0, dt, most = 0;
		DLManagedTensor *t;
		char go;

		close(p[1]);
		if (read(p[0], &go, 1) != 1)
			_exit(1);
		end = util_now_ns() + FREE_WINDOW_MS * UINT64_C(1000000);
		while ((t0 = util_now_ns()) < end) {
			if (dlshare_get_tensor(r, "bench/free/small", NULL, &t))
				_exit(1);
			t->deleter(t);
			dt = util_now_ns() - t0;
			if (dt > most)
				most = dt;
			usleep(100);
		}
		*worst = most;
		dlshare_disconnect(r);
		_exit(0);
	}
	close(p[0]);
	/* The reader connects, then reads for 20 ms before the delete. */
	util_sleep_ms(50);
	if (write(p[1], "g", 1) == 1) {
		util_sleep_ms(20);
		if (a->bytes && (err = dlshare_delete(c, "bench/free/big")))
			fail("free: delete", err);
		else
			n = 0;
	}
	close(p[1]);
	if (child_wait(pid) != 0)
		n = -1;
	if (n == 0) {
		out[0] = (double)*worst;
		n = 1;
	}
	dlshare_delete(c, "bench/free/small");
	dlshare_disconnect(c);
	munmap((void *)worst, sizeof(*worst));
	return n;
}

int fig_free(const struct daemon_proc *d, uint64_t bytes, double *worst_ns)
{
	struct free_arg a = { d, bytes };

	return in_child(free_child, &a, worst_ns, 1) == 1 ? 0 : -1;
}

/* ---- publish (copy) ------------------------------------------------------ */

struct pubcopy_arg {
	const struct daemon_proc *d;
	uint64_t bytes;
	int strided;
	long iters;
};

static void pubcopy_keep(DLManagedTensor *self)
{
	(void)self; /* the source is the child's buffer, freed at exit */
}

static int pubcopy_child(void *arg, double *out, int max)
{
	struct pubcopy_arg *a = arg;
	dlshare_client *c = connect_or_die(a->d);
	int64_t shape = (int64_t)(a->bytes / 4), stride = 1;
	float *src = malloc(a->bytes);
	int n = 0;

	if (!src)
		return -1;
	/* A source in memory already written, as a framework's tensor is. */
	memset(src, 0x3c, a->bytes);
	for (long i = 0; i < a->iters && n < max; i++) {
		DLManagedTensor mt = { 0 }, *tp = &mt;
		dlshare_publish_opts o = { .flags = DLSHARE_PUBLISH_COPY };
		uint64_t t0;
		int err;

		mt.dl_tensor.data = src;
		mt.dl_tensor.device.device_type = kDLCPU;
		mt.dl_tensor.ndim = 1;
		mt.dl_tensor.dtype = (DLDataType){ kDLFloat, 32, 1 };
		mt.dl_tensor.shape = &shape;
		/* torch hands out explicit strides even when compact. */
		mt.dl_tensor.strides = a->strided ? &stride : NULL;
		mt.deleter = pubcopy_keep;
		t0 = util_now_ns();
		err = dlshare_publish(c, "bench/publish", &tp, 1, &o, NULL);
		if (err) {
			fail("publish (copy)", err);
			n = -1;
			break;
		}
		out[n++] = (double)(util_now_ns() - t0);
	}
	dlshare_disconnect(c);
	free(src);
	return n;
}

int fig_publish_copy(const struct daemon_proc *d, uint64_t bytes,
		     int strided, long iters, double *out)
{
	struct pubcopy_arg a = { d, bytes, strided, iters };

	return in_child(pubcopy_child, &a, out, (int)iters) == iters ? 0 : -1;
}

/* ---- scale: many names ---------------------------------------------------- */

struct pop_arg {
	const struct daemon_proc *d;
	long n;
	int threads;
};

struct pop_thread {
	const struct pop_arg *a;
	long from, to;
	int err;
};

static void *pop_main(void *arg)
{
	struct pop_thread *t = arg;
	dlshare_client *c;
	char name[32];

	t->err = dlshare_connect(t->a->d->sock, &c);
	if (t->err)
		return NULL;
	for (long i = t->from; i < t->to && !t->err; i++) {
		snprintf(name, sizeof(name), "s/%07ld", i);
		/* Not written: an untouched page costs the daemon nothing
		 * more, and this figure is the daemon's own memory. */
		t->err = publish_one(c, name, 4, -1, NULL);
		/* The message is this thread's: say it here. */
		if (t->err)
			fprintf(stderr, "bench: populate %s: %s\n", name,
				dlshare_last_error());
	}
	dlshare_disconnect(c);
	return NULL;
}

static int populate_child(void *arg, double *out, int max)
{
	struct pop_arg *a = arg;
	struct pop_thread ts[16];
	pthread_t tids[16];
	int nt = a->threads < 16 ? a->threads : 16, err = 0;
	uint64_t t0 = util_now_ns();

	for (int i = 0; i < nt; i++) {
		ts[i].a = a;
		ts[i].from = a->n * i / nt;
		ts[i].to = a->n * (i + 1) / nt;
		ts[i].err = 0;
		if (pthread_create(&tids[i], NULL, pop_main, &ts[i]))
			return -1;
	}
	for (int i = 0; i < nt; i++) {
		pthread_join(tids[i], NULL);
		if (ts[i].err && !err)
			err = ts[i].err;
	}
	if (err) {
		fail("populate", err);
		return -1;
	}
	out[0] = (double)(util_now_ns() - t0) / 1e9;
	return 1;
}

int fig_populate(const struct daemon_proc *d, long n, int threads,
		 double *seconds)
{
	struct pop_arg a = { d, n, threads };

	return in_child(populate_child, &a, seconds, 1) == 1 ? 0 : -1;
}

struct spread_arg {
	const struct daemon_proc *d;
	long n, iters;
};

static int spread_child(void *arg, double *out, int max)
{
	struct spread_arg *a = arg;
	char names[SPREAD_NAMES][32];
	struct samples s = { 0 };
	dlshare_client *c = connect_or_die(a->d);
	int k = a->n < SPREAD_NAMES ? (int)a->n : SPREAD_NAMES;

	for (int i = 0; i < k; i++)
		snprintf(names[i], sizeof(names[i]), "s/%07ld",
			 a->n * i / k + (a->n / k) / 2);
	/* The first pass maps each buffer. */
	for (int i = 0; i < k; i++)
		if (get_release(c, names[i])) {
			fprintf(stderr, "bench: get %s failed\n", names[i]);
			return -1;
		}
	for (long i = 0; i < a->iters; i++) {
		uint64_t t0 = util_now_ns();
		int err = get_release(c, names[i % k]);

		if (err) {
			fail("get", err);
			return -1;
		}
		samples_add(&s, (double)(util_now_ns() - t0));
	}
	dlshare_disconnect(c);
	out[0] = samples_quantile(&s, 0.50);
	samples_free(&s);
	return 1;
}

int fig_get_spread(const struct daemon_proc *d, long n, long iters,
		   double *p50)
{
	struct spread_arg a = { d, n, iters };

	return in_child(spread_child, &a, p50, 1) == 1 ? 0 : -1;
}

/* ---- idle connections ----------------------------------------------------- */

/* Says Hello on a raw connection and reads the reply. Returns 0 or -1. */
static int raw_hello(int fd)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;
	uint8_t buf[1024];
	size_t len;
	ssize_t n;

	h.major = WIRE_PROTO_MAJOR;
	h.minor = WIRE_PROTO_MINOR;
	h.agent = (char *)"dlshare-bench idle";
	f.id = 1;
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &h;
	len = dlshare__frame__pack(&f, buf);
	if (send(fd, buf, len, MSG_NOSIGNAL) != (ssize_t)len)
		return -1;
	n = recv(fd, buf, sizeof(buf), 0);
	if (n <= 0)
		return -1;
	Dlshare__Frame *r = dlshare__frame__unpack(NULL, (size_t)n, buf);
	int ok = r && r->body_case == DLSHARE__FRAME__BODY_HELLO_REPLY;

	if (r)
		dlshare__frame__free_unpacked(r, NULL);
	return ok ? 0 : -1;
}

pid_t fig_idle_start(const struct daemon_proc *d, int n)
{
	int ready[2];
	pid_t pid;
	char b;

	if (pipe2(ready, O_CLOEXEC) < 0)
		return -1;
	pid = util_fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		close(ready[0]);
		for (int i = 0; i < n; i++) {
			int fd = daemon_connect_raw(d);

			if (fd < 0 || raw_hello(fd)) {
				fprintf(stderr, "bench: idle connection %d: %s\n",
					i, fd < 0 ? strerror(-fd) : "no hello");
				_exit(1);
			}
		}
		b = 'r';
		if (util_write_all(ready[1], &b, 1) < 0)
			_exit(1);
		/* Held until fig_idle_stop's SIGTERM (or our parent's death). */
		for (;;)
			pause();
	}
	close(ready[1]);
	if (read(ready[0], &b, 1) != 1) {
		close(ready[0]);
		child_wait(pid);
		return -1;
	}
	close(ready[0]);
	return pid;
}

void fig_holder_stop(pid_t holder)
{
	if (holder <= 0)
		return;
	kill(holder, SIGTERM);
	child_wait(holder);
}

/* ---- wire level: the daemon without libdlshare ----------------------------- */

/* Sends one frame. Returns 0 or -1. */
static int raw_send(int fd, const Dlshare__Frame *f)
{
	uint8_t buf[4096];
	size_t len = dlshare__frame__get_packed_size(f);

	if (len > sizeof(buf))
		return -1;
	dlshare__frame__pack(f, buf);
	return send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

/* Receives one frame (closing any fd that came with it); NULL on error.
 * Free with dlshare__frame__free_unpacked(f, NULL). */
static Dlshare__Frame *raw_recv(int fd)
{
	uint8_t buf[8192];
	union {
		char b[CMSG_SPACE(sizeof(int) * 16)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
			    .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b) };
	ssize_t n;

	do {
		n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
	} while (n < 0 && errno == EINTR);
	if (n <= 0)
		return NULL;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) /
					       sizeof(int); i++) {
				int x;

				memcpy(&x, CMSG_DATA(c) + i * sizeof(int),
				       sizeof(int));
				close(x);
			}
	return dlshare__frame__unpack(NULL, (size_t)n, buf);
}

/* A raw connection that said Hello; exits the process on failure. */
static int raw_connect_or_die(const struct daemon_proc *d)
{
	int fd = daemon_connect_raw(d);

	if (fd < 0 || raw_hello(fd)) {
		fprintf(stderr, "bench: raw connection failed\n");
		_exit(1);
	}
	return fd;
}

/* Sends the Publish of an fd-less name: one float32[1] tensor in an
 * exported cuda-ipc buffer whose handle nobody ever opens. */
static int raw_publish(int fd, uint64_t id, const char *name)
{
	static uint8_t uuid[16] = { 1 }, handle[REGISTRY_HANDLE_BYTES] = { 1 };
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Publish p = DLSHARE__PUBLISH__INIT;
	Dlshare__Tensor t = DLSHARE__TENSOR__INIT, *tp = &t;
	Dlshare__DataType dt = DLSHARE__DATA_TYPE__INIT;
	Dlshare__Buffer b = DLSHARE__BUFFER__INIT, *bp = &b;
	Dlshare__Device dev = DLSHARE__DEVICE__INIT;
	int64_t shape = 1;

	dt.code = kDLFloat;
	dt.bits = 32;
	dt.lanes = 1;
	t.dtype = &dt;
	t.n_shape = 1;
	t.shape = &shape;
	dev.type = kDLCUDA;
	dev.has_uuid = 1;
	dev.uuid.data = uuid;
	dev.uuid.len = sizeof(uuid);
	b.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
	b.size = 4;
	b.device = &dev;
	b.has_ipc_handle = 1;
	b.ipc_handle.data = handle;
	b.ipc_handle.len = sizeof(handle);
	b.has_ipc_offset = 1;
	p.name = (char *)name;
	p.n_tensors = 1;
	p.tensors = &tp;
	p.n_buffers = 1;
	p.buffers = &bp;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_PUBLISH;
	f.publish = &p;
	return raw_send(fd, &f);
}

/* Reads one reply and checks its kind. Returns 0 or -1. */
static int raw_expect(int fd, Dlshare__Frame__BodyCase want, uint64_t *lease)
{
	Dlshare__Frame *r = raw_recv(fd);
	int ok = r && r->body_case == want;

	if (r && r->body_case == DLSHARE__FRAME__BODY_ERROR)
		fprintf(stderr, "bench: daemon says: %s\n",
			r->error->message ? r->error->message : "?");
	if (ok && lease)
		*lease = r->get_reply->lease;
	if (r)
		dlshare__frame__free_unpacked(r, NULL);
	return ok ? 0 : -1;
}

pid_t fig_raw_register(const struct daemon_proc *d, const char *prefix,
		       long n, double *seconds)
{
	int ready[2];
	pid_t pid;

	if (pipe2(ready, O_CLOEXEC) < 0)
		return -1;
	pid = util_fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int fd = raw_connect_or_die(d);
		uint64_t t0 = util_now_ns();
		long sent = 0, got = 0;
		char name[64];
		double secs;

		close(ready[0]);
		/* Up to 32 in flight: the daemon answers in order. */
		while (got < n) {
			while (sent < n && sent - got < 32) {
				snprintf(name, sizeof(name), "%s%07ld", prefix,
					 sent);
				if (raw_publish(fd, (uint64_t)sent + 2, name))
					_exit(1);
				sent++;
			}
			if (raw_expect(fd, DLSHARE__FRAME__BODY_PUBLISH_REPLY,
				       NULL))
				_exit(1);
			got++;
		}
		secs = (double)(util_now_ns() - t0) / 1e9;
		if (util_write_all(ready[1], &secs, sizeof(secs)) < 0)
			_exit(1);
		/* An export lives while its producer's connection does. */
		for (;;)
			pause();
	}
	close(ready[1]);
	if (read(ready[0], seconds, sizeof(*seconds)) != sizeof(*seconds)) {
		close(ready[0]);
		child_wait(pid);
		return -1;
	}
	close(ready[0]);
	return pid;
}

struct raw_get_arg {
	const struct daemon_proc *d;
	const char *prefix;
	long n, iters;
};

static int raw_get_child(void *arg, double *out, int max)
{
	struct raw_get_arg *a = arg;
	char names[SPREAD_NAMES][64];
	struct samples s = { 0 };
	int fd = raw_connect_or_die(a->d);
	int k = a->n == 0 ? 1 : a->n < SPREAD_NAMES ? (int)a->n : SPREAD_NAMES;
	uint64_t id = 2, lease = 0;
	int held = 0;

	for (int i = 0; i < k; i++) {
		if (a->n == 0)
			snprintf(names[i], sizeof(names[i]), "%s", a->prefix);
		else
			snprintf(names[i], sizeof(names[i]), "%s%07ld",
				 a->prefix, a->n * i / k + (a->n / k) / 2);
	}
	/* Each lease rides out on the next Get, as libdlshare sends it: one
	 * packet each way per get+release, the daemon's whole cost. */
	for (long i = 0; i < a->iters + k; i++) {
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Get g = DLSHARE__GET__INIT;
		uint64_t t0 = util_now_ns();

		g.name = names[i % k];
		g.has_select = 1;
		g.has_version = 1;
		f.id = id++;
		f.n_releases = held ? 1 : 0;
		f.releases = &lease;
		f.body_case = DLSHARE__FRAME__BODY_GET;
		f.get = &g;
		if (raw_send(fd, &f) ||
		    raw_expect(fd, DLSHARE__FRAME__BODY_GET_REPLY, &lease))
			return -1;
		held = 1;
		/* The first round maps nothing here, but it is the first
		 * touch of each name: left out, as in fig_get_spread. */
		if (i >= k)
			samples_add(&s, (double)(util_now_ns() - t0));
	}
	close(fd);
	out[0] = samples_quantile(&s, 0.5);
	samples_free(&s);
	return 1;
}

int fig_raw_get(const struct daemon_proc *d, const char *prefix, long n,
		long iters, double *p50)
{
	struct raw_get_arg a = { d, prefix, n, iters };

	return in_child(raw_get_child, &a, p50, 1) == 1 ? 0 : -1;
}

/* ---- kill storm ------------------------------------------------------------ */

struct storm_arg {
	const struct daemon_proc *d;
	int n, leases;
};

static void storm_client(const struct storm_arg *a, int ready, int hold)
{
	dlshare_client *c = connect_or_die(a->d);
	char b = 'r';

	for (int i = 0; i < a->leases; i++) {
		DLManagedTensor *t;
		int err = dlshare_get_tensor(c, FIG_NAME, NULL, &t);

		/* Held until the kill: never released. */
		if (err) {
			fail("storm get", err);
			_exit(1);
		}
	}
	if (util_write_all(ready, &b, 1) < 0)
		_exit(1);
	while (read(hold, &b, 1) < 0 && errno == EINTR)
		;
	_exit(0);
}

static int storm_child(void *arg, double *out, int max)
{
	struct storm_arg *a = arg;
	pid_t *pids = calloc((size_t)a->n, sizeof(*pids));
	int ready[2], hold[2], ok = 1;
	uint64_t want = (uint64_t)a->n * (uint64_t)a->leases, t0;
	dlshare_client *c;
	dlshare_stats st;
	double lms = -1, cms = -1, cpu = NAN;
	uint64_t cpu0;

	if (!pids || pipe2(ready, O_CLOEXEC) < 0 || pipe2(hold, O_CLOEXEC) < 0)
		return -1;
	for (int i = 0; i < a->n; i++) {
		pids[i] = util_fork();
		if (pids[i] < 0) {
			fprintf(stderr, "bench: storm: fork: %s\n",
				strerror(errno));
			return -1;
		}
		if (pids[i] == 0) {
			close(ready[0]);
			close(hold[1]);
			storm_client(a, ready[1], hold[0]);
		}
	}
	close(ready[1]);
	close(hold[0]);
	for (int i = 0; i < a->n; i++) {
		char b;

		if (read(ready[0], &b, 1) != 1) {
			fprintf(stderr, "bench: storm: a client failed\n");
			ok = 0;
			break;
		}
	}
	/* Forks are done: this process may have threads now. */
	c = connect_or_die(a->d);
	if (ok && (dlshare_stats_get(c, &st) || st.leases != want)) {
		fprintf(stderr, "bench: storm: %llu leases, want %llu\n",
			(unsigned long long)st.leases, (unsigned long long)want);
		ok = 0;
	}
	cpu0 = util_cpu_ns(a->d->pid);
	t0 = util_now_ns();
	for (int i = 0; i < a->n; i++)
		kill(pids[i], SIGKILL);
	while (ok) {
		double ms = (double)(util_now_ns() - t0) / 1e6;

		if (dlshare_stats_get(c, &st)) {
			ok = 0;
			break;
		}
		if (lms < 0 && st.leases == 0) {
			uint64_t cpu1 = util_cpu_ns(a->d->pid);

			lms = ms;
			if (cpu0 && cpu1)
				cpu = (double)(cpu1 - cpu0) / 1e6;
		}
		if (cms < 0 && st.connections == 1)
			cms = ms;
		if (lms >= 0 && cms >= 0)
			break;
		if (ms > 120000) {
			fprintf(stderr, "bench: storm: leases not reclaimed "
				"after 120 s (%llu left)\n",
				(unsigned long long)st.leases);
			ok = 0;
		}
		usleep(200);
	}
	dlshare_disconnect(c);
	close(hold[1]);
	for (int i = 0; i < a->n; i++)
		child_wait(pids[i]);
	close(ready[0]);
	free(pids);
	if (!ok)
		return -1;
	out[0] = lms;
	out[1] = cms;
	out[2] = cpu;
	return 3;
}

int fig_storm(const struct daemon_proc *d, int n, int leases,
	      double *leases_ms, double *conns_ms, double *cpu_ms)
{
	struct storm_arg a = { d, n, leases };
	double v[3];

	if (in_child(storm_child, &a, v, 3) != 3)
		return -1;
	*leases_ms = v[0];
	*conns_ms = v[1];
	*cpu_ms = v[2];
	return 0;
}

/* ---- a state dict in one version --------------------------------------- */

struct bundle_arg {
	const struct daemon_proc *d;
	long n;
	int gets;
};

/* CPU time (user + system, all threads) of pid so far, in ms. */
static double cpu_ms(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long ut, st;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return NAN;
	p = fgets(buf, sizeof(buf), f);
	fclose(f);
	if (!p || !(p = strrchr(buf, ')')) ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
		   &ut, &st) != 2)
		return NAN;
	return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

/* Publishes n float32[16] tensors with 60-byte keys from plain memory
 * (copied into one daemon buffer, described by a manifest memfd), then
 * gets it gets times, warm, each until every tensor is reachable by key.
 * out: publish ms, daemon CPU ms of the publish, then the gets' ms. */
static int bundle_child(void *arg, double *out, int max)
{
	struct bundle_arg *a = arg;
	dlshare_client *c = connect_or_die(a->d);
	size_t n = (size_t)a->n;
	char (*keys)[96] = calloc(n, sizeof(*keys));
	const char **kp = calloc(n, sizeof(*kp));
	DLManagedTensor **ts = calloc(n, sizeof(*ts));
	DLManagedTensor *mt = calloc(n, sizeof(*mt));
	float *data = calloc(n * 16, sizeof(float));
	int64_t shape[1] = { 16 };
	dlshare_publish_opts po = { 0 };
	double t0, c0;
	int k = 0, err;

	if (!keys || !kp || !ts || !mt || !data || max < 2 + a->gets)
		return -1;
	for (size_t i = 0; i < n; i++) {
		/* 60 bytes, as a mixture-of-experts model's are. */
		snprintf(keys[i], sizeof(keys[i]),
			 "model.layers.%02d.mlp.experts.%03d.down_proj.weight_scale_%05d",
			 (int)(i / 4096 % 100), (int)(i / 16 % 256),
			 (int)(i % 100000));
		kp[i] = keys[i];
		mt[i].dl_tensor.data = data + i * 16;
		mt[i].dl_tensor.device.device_type = kDLCPU;
		mt[i].dl_tensor.ndim = 1;
		mt[i].dl_tensor.dtype = (DLDataType){ kDLFloat, 32, 1 };
		mt[i].dl_tensor.shape = shape;
		ts[i] = &mt[i];
	}
	po.keys = kp;
	c0 = cpu_ms(a->d->pid);
	t0 = util_now_ns();
	err = dlshare_publish(c, "bench/sd", ts, n, &po, NULL);
	out[k++] = (util_now_ns() - t0) / 1e6;
	if (err) {
		fail("publish of a state dict", err);
		return -1;
	}
	/* The daemon checks the manifest on its thread pool: its CPU time
	 * is all in once the PublishReply came. */
	out[k++] = cpu_ms(a->d->pid) - c0;
	for (int r = -1; r < a->gets; r++) {
		dlshare_bundle *b;

		t0 = util_now_ns();
		err = dlshare_get(c, "bench/sd", NULL, &b);
		if (err) {
			fail("get of a state dict", err);
			return -1;
		}
		for (size_t i = 0; i < n; i += 1)
			if (!dlshare_bundle_tensor(b, i))
				return -1;
		if (r >= 0)
			out[k++] = (util_now_ns() - t0) / 1e6;
		dlshare_bundle_free(b); /* the first, cold one is not counted */
	}
	dlshare_delete(c, "bench/sd");
	dlshare_disconnect(c);
	free(keys);
	free(kp);
	free(ts);
	free(mt);
	free(data);
	return k;
}

int fig_bundle(const struct daemon_proc *d, long n, int gets,
	       double *publish_ms, double *daemon_cpu_ms, double *get_ms)
{
	struct bundle_arg a = { d, n, gets };
	double out[64];
	int k;

	if (gets > 60)
		return -1;
	k = in_child(bundle_child, &a, out, 2 + gets);
	if (k != 2 + gets)
		return -1;
	*publish_ms = out[0];
	*daemon_cpu_ms = out[1];
	for (int i = 0; i < gets; i++)
		get_ms[i] = out[2 + i];
	return 0;
}
