/* roles — producer, consumer, floor and probe processes of gpubench. */
#include "roles.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <dlshare/dlshare.h>

#include "kern.h"
#include "util.h"

/* How long one side waits for the other, or for the daemon, before it
 * gives up: far beyond any figure, short enough to end a hung run. */
#define PEER_TIMEOUT_MS 60000
#define LIB_TIMEOUT_MS 10000

/* The small tensor that keeps an allocation mapped in the consumer
 * (handoff --warm): it lies past the bytes the producer rewrites. */
#define PIN_BYTES 4096u

static const struct role_args *g_a;

/* ---- failing ---------------------------------------------------------- */

__attribute__((format(printf, 3, 4), noreturn))
static void fail_at(const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "gpubench %s/%s (pid %d) %s:%d: ", g_a->role,
		g_a->figure ? g_a->figure : "-", (int)getpid(), file, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(NULL);
	_exit(ROLE_EXIT_FAILED);
}

#define FAIL(...) fail_at(__FILE__, __LINE__, __VA_ARGS__)

#define CU(expr)                                                              \
	do {                                                                  \
		cudaError_t ce_ = (expr);                                     \
		if (ce_ != cudaSuccess)                                       \
			FAIL("%s = %s (%s)", #expr, cudaGetErrorName(ce_),    \
			     cudaGetErrorString(ce_));                        \
	} while (0)

#define DL(expr)                                                              \
	do {                                                                  \
		int e_ = (expr);                                              \
		if (e_ != 0)                                                  \
			FAIL("%s = %s [%s]", #expr, dlshare_strerror(e_),     \
			     dlshare_last_error());                           \
	} while (0)

/* ---- results and the peer -------------------------------------------- */

__attribute__((format(printf, 1, 2)))
static void res(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(line) - 1)
		n = (int)strlen(line);
	line[n++] = '\n';
	/* One write per line, under PIPE_BUF: both roles share the pipe. */
	if (util_write_all(g_a->res_fd, line, (size_t)n))
		FAIL("result pipe: %s", strerror(errno));
}

static void sample(const char *key, int r, double v)
{
	if (r >= 0) /* r == -1 is the warm-up */
		res("sample %s%s%s %.9g", key, g_a->tag[0] ? "_" : "",
		    g_a->tag, v);
}

struct pmsg {
	char tag;
	int32_t r;
	uint64_t t;
};

static void peer_send(char tag, int r, uint64_t t)
{
	struct pmsg m = { tag, r, t };

	if (send(g_a->peer_fd, &m, sizeof(m), MSG_NOSIGNAL) != sizeof(m))
		FAIL("send '%c' to the peer: %s", tag, strerror(errno));
}

/* Waits for message tag of repeat r; returns its t. */
static uint64_t peer_recv(char tag, int r)
{
	struct pollfd p = { .fd = g_a->peer_fd, .events = POLLIN };
	struct pmsg m;
	ssize_t n;
	int rc;

	do
		rc = poll(&p, 1, PEER_TIMEOUT_MS);
	while (rc < 0 && errno == EINTR);
	if (rc == 0)
		FAIL("no '%c' (repeat %d) from the peer within %d ms", tag, r,
		     PEER_TIMEOUT_MS);
	n = recv(g_a->peer_fd, &m, sizeof(m), 0);
	if (n == 0)
		FAIL("the peer went away before '%c' (repeat %d)", tag, r);
	if (n != sizeof(m))
		FAIL("recv from the peer: %s", n < 0 ? strerror(errno) : "short");
	if (m.tag != tag || m.r != r)
		FAIL("peer sent '%c' (repeat %d), want '%c' (repeat %d)", m.tag,
		     m.r, tag, r);
	return m.t;
}

static double us_since(uint64_t t0, uint64_t t1)
{
	return (double)(t1 - t0) / 1e3;
}

static double ms_since(uint64_t t0, uint64_t t1)
{
	return (double)(t1 - t0) / 1e6;
}

/* ---- the device and the daemon ----------------------------------------- */

struct dev {
	cudaStream_t s;
	unsigned long long *bad;  /* device counter of kern_check */
	dlshare_client *c;
};

static void check_queue(struct dev *d, const void *p, size_t n, uint64_t seed)
{
	CU(cudaMemsetAsync(d->bad, 0, sizeof(*d->bad), d->s));
	CU(kern_check(p, n, seed, d->bad, d->s));
}

/* After check_queue: waits for the stream and fails the run (exit 3)
 * when a word differed. */
static void check_result(struct dev *d, size_t n, const char *what, int r)
{
	unsigned long long bad = ~0ull;

	CU(cudaMemcpyAsync(&bad, d->bad, sizeof(bad), cudaMemcpyDeviceToHost,
			   d->s));
	CU(cudaStreamSynchronize(d->s));
	if (bad == 0)
		return;
	fprintf(stderr, "gpubench %s/%s: DATA MISMATCH: %s, repeat %d: %llu "
		"of %zu 8-byte words differ from what the producer wrote\n",
		g_a->role, g_a->figure, what, r, bad, n / 8);
	fflush(NULL);
	_exit(ROLE_EXIT_WRONG_DATA);
}

static void dev_init(struct dev *d, int connect)
{
	void *w;

	memset(d, 0, sizeof(*d));
	CU(cudaSetDevice(0));
	CU(kern_init(0));
	/* Non-blocking: the legacy default stream must not order our work
	 * behind anything else (nor the reverse). */
	CU(cudaStreamCreateWithFlags(&d->s, cudaStreamNonBlocking));
	CU(cudaMalloc((void **)&d->bad, sizeof(*d->bad)));
	/* First launches load the module: not part of any figure. */
	CU(cudaMalloc(&w, 1 << 20));
	CU(kern_fill(w, 1 << 20, 7, d->s));
	check_queue(d, w, 1 << 20, 7);
	check_result(d, 1 << 20, "warm-up", -1);
	CU(cudaFree(w));
	if (connect)
		DL(dlshare_connect(g_a->sock, &d->c));
}

static void dev_deinit(struct dev *d)
{
	dlshare_disconnect(d->c);
	CU(cudaStreamSynchronize(d->s));
	CU(cudaFree(d->bad));
	CU(cudaStreamDestroy(d->s));
}

/* ---- producer's tensors -------------------------------------------------- */

static atomic_int g_deleted;      /* deleters run (library's thread) */

struct owned {
	DLManagedTensor m;
	int64_t shape[1];
};

static void owned_delete(DLManagedTensor *self)
{
	free(self->manager_ctx);
	atomic_fetch_add(&g_deleted, 1);
}

/* Publishes n bytes at base + off (device memory) as a uint8 tensor of
 * name, without a copy, ordered after the work queued on d->s. */
static uint64_t publish(struct dev *d, const char *name, void *base,
			uint64_t off, uint64_t n)
{
	struct owned *o = calloc(1, sizeof(*o));
	DLManagedTensor *t = &o->m;
	dlshare_publish_opts po = { .flags = DLSHARE_PUBLISH_NO_COPY,
				    .stream = d->s };
	uint64_t v = 0;
	int e;

	if (!o)
		FAIL("out of memory");
	o->shape[0] = (int64_t)n;
	t->manager_ctx = o;
	t->deleter = owned_delete;
	t->dl_tensor.data = base;
	t->dl_tensor.byte_offset = off;
	t->dl_tensor.device = (DLDevice){ kDLCUDA, 0 };
	t->dl_tensor.ndim = 1;
	t->dl_tensor.dtype = (DLDataType){ kDLUInt, 8, 1 };
	t->dl_tensor.shape = o->shape;
	e = dlshare_publish(d->c, name, &t, 1, &po, &v);
	if (e) {
		free(o); /* still ours on failure */
		FAIL("dlshare_publish(%s) = %s [%s]", name, dlshare_strerror(e),
		     dlshare_last_error());
	}
	return v;
}

/* Deletes name and waits until the library handed back every tensor
 * published so far (want deleters in all). */
static void retire(struct dev *d, const char *name, int want)
{
	uint64_t end = util_now_ns() + (uint64_t)LIB_TIMEOUT_MS * 1000000u;

	DL(dlshare_delete(d->c, name));
	while (atomic_load(&g_deleted) < want) {
		if (util_now_ns() > end)
			FAIL("%s: the library gave back %d of %d tensors within "
			     "%d ms", name, atomic_load(&g_deleted), want,
			     LIB_TIMEOUT_MS);
		usleep(100);
	}
}

/* Waits until the daemon holds a parked get (the consumer waits). */
static void wait_parked(struct dev *d)
{
	uint64_t end = util_now_ns() + (uint64_t)LIB_TIMEOUT_MS * 1000000u;
	dlshare_stats st;

	for (;;) {
		DL(dlshare_stats_get(d->c, &st));
		if (st.parked >= 1)
			return;
		if (util_now_ns() > end)
			FAIL("the consumer's get did not reach the daemon within "
			     "%d ms", LIB_TIMEOUT_MS);
		usleep(50);
	}
}

/* ---- consumer's tensors -------------------------------------------------- */

static DLManagedTensor *get(struct dev *d, const char *name, uint32_t sel,
			    uint64_t ver, int timeout_ms)
{
	dlshare_get_opts o = { .select = sel, .version = ver,
			       .timeout_ms = timeout_ms, .stream = d->s };
	DLManagedTensor *x = NULL;

	DL(dlshare_get_tensor(d->c, name, &o, &x));
	return x;
}

/* The device bytes of what get returned, after checking its shape. */
static const void *tdata(const DLManagedTensor *x, uint64_t n)
{
	const DLTensor *t = &x->dl_tensor;

	if (t->device.device_type != kDLCUDA || t->ndim != 1 ||
	    t->shape[0] != (int64_t)n || t->dtype.bits != 8)
		FAIL("got a tensor of device type %d, ndim %d, %lld bytes; want "
		     "kDLCUDA, 1, %llu", (int)t->device.device_type, t->ndim,
		     t->ndim ? (long long)t->shape[0] : -1LL,
		     (unsigned long long)n);
	return (const char *)t->data + t->byte_offset;
}

/* Waits until this process has at most want IPC allocations open (a
 * device mapping closes once the release event of its last tensor
 * completed, on the library's thread): the producer may free only then. */
static void wait_closed(unsigned long want)
{
	uint64_t end = util_now_ns() + (uint64_t)LIB_TIMEOUT_MS * 1000000u;
	unsigned long open_now, total;

	for (;;) {
		dlshare_cuda_cache_stats(&open_now, &total);
		if (open_now <= want)
			return;
		if (util_now_ns() > end)
			FAIL("%lu IPC allocations still open after %d ms, want "
			     "%lu", open_now, LIB_TIMEOUT_MS, want);
		usleep(100);
	}
}

static unsigned long opened_total(void)
{
	unsigned long open_now, total;

	dlshare_cuda_cache_stats(&open_now, &total);
	return total;
}

static uint64_t seed_of(int r)
{
	return (uint64_t)r + 2; /* the warm-up is r == -1 */
}

/* The seed the producer writes: a wrong one with --corrupt (in the last
 * repeat), to prove that the checks fail the run. */
static uint64_t seed_written(int r)
{
	return seed_of(r) + (g_a->corrupt && r == g_a->repeats - 1);
}

/* ---- figure: import ------------------------------------------------------ */

/* Cold: the first get of a new allocation (memory and event handles
 * opened). Warm: a new version on the same allocation, while the first
 * tensor still holds it open (event handle opened). Cached: the same
 * version again (nothing opened). Only the get is timed. */
static void import_producer(struct dev *d)
{
	int deleted = 0;

	for (int r = -1; r < g_a->repeats; r++) {
		char name[64];
		uint64_t v2;
		void *a;

		snprintf(name, sizeof(name), "gpu/imp/%s/%d", g_a->tag, r + 1);
		CU(cudaMalloc(&a, g_a->bytes));
		CU(kern_fill(a, g_a->bytes, seed_written(r), d->s));
		publish(d, name, a, 0, g_a->bytes);
		peer_send('1', r, 0);
		peer_recv('g', r);
		v2 = publish(d, name, a, 0, g_a->bytes);
		peer_send('2', r, v2);
		peer_recv('d', r);
		deleted += 2;
		retire(d, name, deleted);
		CU(cudaStreamSynchronize(d->s));
		CU(cudaFree(a));
	}
}

static void import_consumer(struct dev *d)
{
	for (int r = -1; r < g_a->repeats; r++) {
		DLManagedTensor *x1, *x2, *x3;
		unsigned long opened0 = opened_total(), opened;
		uint64_t t0, t1, t2, t3, t4, v2;
		char name[64];

		snprintf(name, sizeof(name), "gpu/imp/%s/%d", g_a->tag, r + 1);
		peer_recv('1', r);
		t0 = util_now_ns();
		x1 = get(d, name, DLSHARE_LATEST, 0, 0);
		t1 = util_now_ns();
		check_queue(d, tdata(x1, g_a->bytes), g_a->bytes, seed_of(r));
		check_result(d, g_a->bytes, "import, first version", r);
		peer_send('g', r, 0);
		v2 = peer_recv('2', r);
		t2 = util_now_ns();
		x2 = get(d, name, DLSHARE_EXACT, v2, 0);
		t3 = util_now_ns();
		x3 = get(d, name, DLSHARE_EXACT, v2, 0);
		t4 = util_now_ns();
		check_queue(d, tdata(x2, g_a->bytes), g_a->bytes, seed_of(r));
		check_result(d, g_a->bytes, "import, second version", r);
		check_queue(d, tdata(x3, g_a->bytes), g_a->bytes, seed_of(r));
		check_result(d, g_a->bytes, "import, second version again", r);
		sample("import_cold", r, us_since(t0, t1));
		sample("import_warm", r, us_since(t2, t3));
		sample("import_cached", r, us_since(t3, t4));
		opened = opened_total() - opened0;
		if (opened != 1)
			res("info import %s: %lu IPC opens for one allocation "
			    "(want 1: the warm and cached gets should reuse it)",
			    g_a->tag, opened);
		x3->deleter(x3);
		x2->deleter(x2);
		x1->deleter(x1);
		wait_closed(0);
		peer_send('d', r, 0);
	}
}

/* ---- figure: spin ------------------------------------------------------------ */

/* The producer's stream runs a spin of spin_ms, then writes the tensor,
 * and the producer publishes right away; the consumer gets as soon as it
 * is told, queues a check and synchronises its stream. */
static void spin_producer(struct dev *d)
{
	uint64_t ns = (uint64_t)g_a->spin_ms * 1000000u;
	int deleted = 0;
	void *a;

	CU(cudaMalloc(&a, g_a->bytes));
	for (int r = -1; r < g_a->repeats; r++) {
		uint64_t t0 = util_now_ns();

		CU(kern_spin(ns, d->s));
		CU(cudaStreamSynchronize(d->s));
		sample("spin_alone", r, ms_since(t0, util_now_ns()));
	}
	for (int r = -1; r < g_a->repeats; r++) {
		uint64_t t0, t1, t2;
		char name[64];

		snprintf(name, sizeof(name), "gpu/spin/%d", r + 1);
		peer_recv('r', r);
		t0 = util_now_ns();
		CU(kern_spin(ns, d->s));
		CU(kern_fill(a, g_a->bytes, seed_written(r), d->s));
		t1 = util_now_ns();
		publish(d, name, a, 0, g_a->bytes);
		t2 = util_now_ns();
		peer_send('P', r, t0);
		sample("spin_publish", r, us_since(t1, t2));
		peer_recv('d', r);
		retire(d, name, ++deleted);
	}
	CU(cudaStreamSynchronize(d->s));
	CU(cudaFree(a));
}

static void spin_consumer(struct dev *d)
{
	uint64_t ns = (uint64_t)g_a->spin_ms * 1000000u;

	for (int r = -1; r < g_a->repeats; r++) {
		uint64_t t0, t1, t2, t3, t4;
		DLManagedTensor *x;
		cudaError_t q;
		char name[64];

		snprintf(name, sizeof(name), "gpu/spin/%d", r + 1);
		peer_send('r', r, 0);
		t0 = peer_recv('P', r);
		t1 = util_now_ns();
		x = get(d, name, DLSHARE_LATEST, 0, 0);
		t2 = util_now_ns();
		check_queue(d, tdata(x, g_a->bytes), g_a->bytes, seed_of(r));
		t3 = util_now_ns();
		q = cudaStreamQuery(d->s);
		if (q != cudaSuccess && q != cudaErrorNotReady)
			CU(q);
		cudaGetLastError(); /* cudaErrorNotReady is no error */
		CU(cudaStreamSynchronize(d->s));
		t4 = util_now_ns();
		check_result(d, g_a->bytes, "after the spin", r);
		sample("spin_get", r, us_since(t1, t2));
		sample("spin_sync", r, ms_since(t3, t4));
		sample("spin_done", r, ms_since(t0, t4));
		if (r >= 0 && t2 - t0 >= ns)
			res("info spin, repeat %d: get returned %.1f ms after the "
			    "producer queued its %d ms of work: the host waited",
			    r, ms_since(t0, t2), g_a->spin_ms);
		else if (r >= 0 && q == cudaSuccess)
			res("info spin, repeat %d: the consumer's stream was idle "
			    "right after get: it did not wait for the producer",
			    r);
		x->deleter(x);
		wait_closed(0);
		peer_send('d', r, 0);
	}
}

/* ---- figure: handoff ----------------------------------------------------------- */

/* The consumer waits in a get (parked in the daemon); the clock starts
 * when the producer queues its write of the whole tensor, and stops when
 * the consumer's stream has run its read of it. With --warm the consumer
 * holds a small tensor on the same allocation all along, so the
 * allocation stays mapped between repeats. */
static void handoff_producer(struct dev *d)
{
	const char *mode = g_a->warm ? "warm" : "cold";
	int deleted = 0;
	char *a;

	CU(cudaMalloc((void **)&a, g_a->bytes + PIN_BYTES));
	if (g_a->warm) {
		CU(kern_fill(a + g_a->bytes, PIN_BYTES, 1, d->s));
		publish(d, "gpu/pin", a, g_a->bytes, PIN_BYTES);
		peer_send('p', 0, 0);
	}
	for (int r = -1; r < g_a->repeats; r++) {
		uint64_t t0, t1, t2;
		char name[64];

		snprintf(name, sizeof(name), "gpu/h/%s/%d", mode, r + 1);
		peer_recv('r', r);
		wait_parked(d);
		t0 = util_now_ns();
		CU(kern_fill(a, g_a->bytes, seed_written(r), d->s));
		t1 = util_now_ns();
		publish(d, name, a, 0, g_a->bytes);
		t2 = util_now_ns();
		peer_send('P', r, t0);
		sample(g_a->warm ? "handoff_warm_publish" :
				   "handoff_cold_publish", r, us_since(t1, t2));
		peer_recv('d', r);
		retire(d, name, ++deleted);
	}
	if (g_a->warm) {
		peer_recv('u', 0);
		retire(d, "gpu/pin", ++deleted);
	}
	CU(cudaStreamSynchronize(d->s));
	CU(cudaFree(a));
}

static void handoff_consumer(struct dev *d)
{
	DLManagedTensor *pin = NULL;
	unsigned long opened0;

	if (g_a->warm) {
		peer_recv('p', 0);
		pin = get(d, "gpu/pin", DLSHARE_LATEST, 0, 0);
		check_queue(d, tdata(pin, PIN_BYTES), PIN_BYTES, 1);
		check_result(d, PIN_BYTES, "pin", 0);
	}
	opened0 = opened_total();
	for (int r = -1; r < g_a->repeats; r++) {
		DLManagedTensor *x;
		uint64_t t0, t1, t2;
		char name[64];

		snprintf(name, sizeof(name), "gpu/h/%s/%d",
			 g_a->warm ? "warm" : "cold", r + 1);
		peer_send('r', r, 0);
		x = get(d, name, DLSHARE_LATEST, 0, PEER_TIMEOUT_MS);
		t1 = util_now_ns();
		check_queue(d, tdata(x, g_a->bytes), g_a->bytes, seed_of(r));
		CU(cudaStreamSynchronize(d->s));
		t2 = util_now_ns();
		t0 = peer_recv('P', r);
		check_result(d, g_a->bytes, "handoff", r);
		if (g_a->warm) {
			sample("handoff_warm", r, ms_since(t0, t2));
			sample("handoff_warm_get", r, us_since(t0, t1));
		} else {
			sample("handoff_cold", r, ms_since(t0, t2));
			sample("handoff_cold_get", r, us_since(t0, t1));
		}
		x->deleter(x);
		wait_closed(g_a->warm ? 1 : 0);
		peer_send('d', r, 0);
	}
	{
		unsigned long opened = opened_total() - opened0;
		unsigned long want = g_a->warm ? 0 : (unsigned long)g_a->repeats + 1;

		if (opened != want)
			res("info handoff %s: %lu IPC opens in %d repeats (want "
			    "%lu)", g_a->warm ? "warm" : "cold", opened,
			    g_a->repeats + 1, want);
	}
	if (pin) {
		pin->deleter(pin);
		wait_closed(0);
		peer_send('u', 0, 0);
	}
}

/* ---- the floor and the probe ------------------------------------------------------ */

/* The same write and read of the whole tensor in one process, one stream:
 * what the handoff would cost with nothing between the two kernels. */
static void floor_run(struct dev *d)
{
	void *a;

	CU(cudaMalloc(&a, g_a->bytes));
	for (int r = -1; r < g_a->repeats; r++) {
		uint64_t t0 = util_now_ns(), t1;

		CU(kern_fill(a, g_a->bytes, seed_of(r), d->s));
		check_queue(d, a, g_a->bytes, seed_of(r));
		CU(cudaStreamSynchronize(d->s));
		t1 = util_now_ns();
		check_result(d, g_a->bytes, "floor", r);
		sample("floor", r, ms_since(t0, t1));
	}
	CU(cudaFree(a));
}

static int probe(void)
{
	struct cudaDeviceProp p;
	int n = 0, drv = 0, rt = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess || n <= 0) {
		res("nogpu %s", e != cudaSuccess ? cudaGetErrorString(e) :
			"no CUDA device");
		return ROLE_EXIT_NO_GPU;
	}
	CU(cudaGetDeviceProperties(&p, 0));
	cudaDriverGetVersion(&drv);
	cudaRuntimeGetVersion(&rt);
	res("device %s, %.1f GiB, compute capability %d.%d, %d SMs; driver "
	    "%d.%d, runtime %d.%d; %d device(s) visible, using 0; work by %s",
	    p.name, (double)p.totalGlobalMem / (1 << 30), p.major, p.minor,
	    p.multiProcessorCount, drv / 1000, drv % 1000 / 10, rt / 1000,
	    rt % 1000 / 10, n, kern_kind());
	return 0;
}

int role_main(const struct role_args *a)
{
	struct dev d;
	int producer;

	g_a = a;
	if (strcmp(a->role, "probe") == 0)
		return probe();
	if (a->bytes == 0 || a->bytes % 8)
		FAIL("--bytes must be a positive multiple of 8");
	if (strcmp(a->role, "floor") == 0) {
		dev_init(&d, 0);
		floor_run(&d);
		dev_deinit(&d);
		return 0;
	}
	producer = strcmp(a->role, "producer") == 0;
	if (!producer && strcmp(a->role, "consumer") != 0)
		FAIL("unknown role");
	if (!a->sock || a->peer_fd < 0)
		FAIL("--socket and --peer-fd are needed");
	dev_init(&d, 1);
	if (strcmp(a->figure, "import") == 0)
		producer ? import_producer(&d) : import_consumer(&d);
	else if (strcmp(a->figure, "spin") == 0)
		producer ? spin_producer(&d) : spin_consumer(&d);
	else if (strcmp(a->figure, "handoff") == 0)
		producer ? handoff_producer(&d) : handoff_consumer(&d);
	else
		FAIL("unknown figure");
	dev_deinit(&d);
	return 0;
}
