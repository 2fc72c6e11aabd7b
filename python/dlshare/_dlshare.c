/* _dlshare — the CPython extension under the dlshare package: connections,
 * DLPack capsules and their deleters, over libdlshare.
 *
 * Why C and not ctypes: a DLPack deleter may run on libdlshare's receiver
 * thread at any time, also while the interpreter shuts down. A ctypes
 * callback needs the GIL just to start, so such a deleter would hang or be
 * killed at exit; here the deleters that need no Python (ours) never touch
 * it, and those that do (a producer's, such as NumPy's) run only while
 * Python is alive (py_enter). Capsule renaming and "call the deleter only if
 * nobody took the capsule" are also simplest to get exactly right in C.
 *
 * Threads: every call that may wait for the daemon runs with the GIL
 * released, so a deleter that waits for the GIL on the library's thread never
 * deadlocks with a caller. A struct cguard keeps dlshare_disconnect() from
 * running while another thread is inside a call on the same client. The
 * Python layer (__init__.py) checks arguments and implements the DLPack
 * protocol's rules; this file does what needs C.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlshare/dlshare.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define NDIM_MAX 32
#define DL_BOOL 6 /* kDLBool; Debian's dlpack 0.6 header lacks it */

static const char CAP_PLAIN[] = "dltensor";
static const char CAP_USED[] = "used_dltensor";
static const char CAP_VERSIONED[] = "dltensor_versioned";
static const char CAP_VERSIONED_USED[] = "used_dltensor_versioned";

/* ---- Python's life ----------------------------------------------------- */

/* Set by the atexit hook, before the interpreter starts to finalize. From
 * then on no deleter running outside Python may enter it: taking the GIL
 * during finalization hangs or ends the calling thread. py_inflight counts
 * the deleters inside Python, so the hook can wait for them to leave. */
static atomic_int py_dying;
static atomic_int py_inflight;

static int py_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
	return Py_IsFinalizing();
#else
	return _Py_IsFinalizing();
#endif
}

/* Returns 1 when the caller may take the GIL (then call py_leave()), 0 when
 * Python is going away and the caller must leave it alone. */
static int py_enter(void)
{
	atomic_fetch_add(&py_inflight, 1);
	if (atomic_load(&py_dying) || !Py_IsInitialized() || py_finalizing()) {
		atomic_fetch_sub(&py_inflight, 1);
		return 0;
	}
	return 1;
}

static void py_leave(void)
{
	atomic_fetch_sub(&py_inflight, 1);
}

/* Set while this thread runs a producer's deleter for the library, maybe on
 * the library's receiver thread. Python code run from there (a DECREF that
 * frees a Client or a Writer) must not wait for the daemon or for that
 * thread: such work goes to a thread of its own (run_detached). */
static _Thread_local int in_deleter;

struct detached {
	void (*fn)(void *arg);
	void *arg;
};

static void *detached_main(void *p)
{
	struct detached d = *(struct detached *)p;

	free(p);
	d.fn(d.arg);
	return NULL;
}

/* Runs fn(arg) on a new detached thread (inline if none can start). */
static void run_detached(void (*fn)(void *arg), void *arg)
{
	struct detached *d = malloc(sizeof(*d));
	pthread_attr_t attr;
	pthread_t t;
	int err = -1;

	if (d && !pthread_attr_init(&attr)) {
		d->fn = fn;
		d->arg = arg;
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		err = pthread_create(&t, &attr, detached_main, d);
		pthread_attr_destroy(&attr);
	}
	if (err) {
		free(d);
		fn(arg);
	}
}

/* Whether this thread holds the GIL (a deleter may be called either way). */
static int gil_held(void)
{
	return Py_IsInitialized() && PyGILState_Check();
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static PyObject *at_exit(PyObject *mod, PyObject *unused)
{
	atomic_store(&py_dying, 1);
	/* Let deleters already inside Python finish (they may be waiting for
	 * the GIL we hold), for at most two seconds. */
	Py_BEGIN_ALLOW_THREADS
	for (int i = 0; i < 2000 && atomic_load(&py_inflight) > 0; i++)
		sleep_ms(1);
	Py_END_ALLOW_THREADS
	Py_RETURN_NONE;
}

/* ---- errors ------------------------------------------------------------- */

static PyObject *error_classes; /* dict: code -> exception class */

/* Raises the exception for a DLSHARE_E* code, with msg or else the
 * library's explanation of this thread's last error. Returns NULL. */
static PyObject *raise_msg(int code, const char *msg)
{
	PyObject *cls = NULL, *key, *exc;

	if (!msg || !*msg)
		msg = dlshare_last_error();
	if (!msg || !*msg)
		msg = dlshare_strerror(code);
	if (error_classes && (key = PyLong_FromLong(code))) {
		cls = PyDict_GetItemWithError(error_classes, key);
		Py_DECREF(key);
		if (!cls && PyErr_Occurred())
			return NULL;
	}
	if (!cls) {
		PyErr_Format(PyExc_RuntimeError, "%s (dlshare error %d)", msg,
			     code);
		return NULL;
	}
	/* One argument: OSError subclasses read two as (errno, strerror). */
	exc = PyObject_CallFunction(cls, "(s)", msg);
	if (exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		Py_DECREF(exc);
	}
	return NULL;
}

/* What a call on a closed Client returns, before reaching the library
 * (whose last-error message would be some earlier call's). */
#define ERR_CLOSED_HERE (-1000)

static PyObject *raise_code(int code)
{
	if (code == ERR_CLOSED_HERE)
		return raise_msg(DLSHARE_ECLOSED, "the client was closed");
	return raise_msg(code, NULL);
}

/* A wait that ran out after slices (wait_slice): the library's message
 * names the last slice; say the whole wait too. */
static PyObject *raise_waited(int code, double wait)
{
	char msg[1024];

	if (code != DLSHARE_ETIMEDOUT || wait <= 1.0)
		return raise_code(code);
	snprintf(msg, sizeof(msg), "%s; waited %.3g s in all",
		 dlshare_last_error()[0] ? dlshare_last_error() :
		 dlshare_strerror(code), wait);
	return raise_msg(code, msg);
}

/* ---- the client guard ---------------------------------------------------- */

/* A client and who is inside it. dlshare_disconnect() must not run while
 * another thread is inside a call on the client, so close waits for them,
 * and later calls fail with DLSHARE_ECLOSED. Refcounted: the Python Client
 * and every writer hold one; freed by the last, after close.
 *
 * In a forked child (os.fork, a data-loader worker) the guard is a copy:
 * its lock may have been held, and its busy count raised, by parent
 * threads that the child does not have. There it is neither locked nor
 * waited for nor freed; the library refuses every call on the inherited
 * client (DLSHARE_EFORK), and closing it returns at once. */
enum { G_OPEN, G_CLOSING, G_CLOSED };

struct cguard {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	long refs;
	long busy;
	int state;
	pid_t pid;               /* the process that made it */
	dlshare_client *c;
};

static struct cguard *guard_new(dlshare_client *c)
{
	struct cguard *g = calloc(1, sizeof(*g));

	if (!g)
		return NULL;
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	g->refs = 1;
	g->pid = getpid();
	g->c = c;
	return g;
}

/* Whether g was inherited from the process that made it. */
static int guard_foreign(const struct cguard *g)
{
	return g->pid != getpid();
}

static void guard_ref(struct cguard *g)
{
	if (guard_foreign(g))
		return;
	pthread_mutex_lock(&g->lock);
	g->refs++;
	pthread_mutex_unlock(&g->lock);
}

/* Call without the GIL: closing may wait for other threads' calls. */
static void guard_close(struct cguard *g)
{
	dlshare_client *c;

	if (guard_foreign(g)) {
		/* Closes only this process's copies of its fds; from now on
		 * it reads as closed here. No lock: see above. */
		if (__atomic_exchange_n(&g->state, G_CLOSED,
					__ATOMIC_RELAXED) == G_OPEN && g->c)
			dlshare_disconnect(g->c);
		return;
	}
	pthread_mutex_lock(&g->lock);
	if (g->state != G_OPEN) {
		while (g->state == G_CLOSING)
			pthread_cond_wait(&g->cond, &g->lock);
		pthread_mutex_unlock(&g->lock);
		return;
	}
	g->state = G_CLOSING;
	while (g->busy > 0)
		pthread_cond_wait(&g->cond, &g->lock);
	c = g->c;
	g->c = NULL;
	pthread_mutex_unlock(&g->lock);
	dlshare_disconnect(c);
	pthread_mutex_lock(&g->lock);
	g->state = G_CLOSED;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
}

static void guard_unref(struct cguard *g)
{
	long left;

	if (!g || guard_foreign(g))
		return;
	pthread_mutex_lock(&g->lock);
	left = --g->refs;
	pthread_mutex_unlock(&g->lock);
	if (left)
		return;
	guard_close(g);
	pthread_cond_destroy(&g->cond);
	pthread_mutex_destroy(&g->lock);
	free(g);
}

/* Enters a call on the client. Returns the client, or NULL once it is
 * closing or closed. With wait, waits for a close in progress to end first
 * (a writer must not be freed while dlshare_disconnect() runs). */
static dlshare_client *guard_enter(struct cguard *g, int wait)
{
	dlshare_client *c = NULL;

	/* The library answers DLSHARE_EFORK without touching c's locks. */
	if (guard_foreign(g))
		return __atomic_load_n(&g->state, __ATOMIC_RELAXED) == G_OPEN ?
		       g->c : NULL;
	pthread_mutex_lock(&g->lock);
	while (wait && g->state == G_CLOSING)
		pthread_cond_wait(&g->cond, &g->lock);
	if (g->state == G_OPEN) {
		g->busy++;
		c = g->c;
	}
	pthread_mutex_unlock(&g->lock);
	return c;
}

static void guard_leave(struct cguard *g)
{
	if (guard_foreign(g))
		return;
	pthread_mutex_lock(&g->lock);
	if (--g->busy == 0)
		pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
}

/* ---- dtypes and geometry --------------------------------------------------- */

/* The UTF-8 of a str that goes to the daemon as a C string: one with a
 * NUL inside raises ValueError instead of being cut at it (Python before
 * 3.13 gives such a str from PyUnicode_AsUTF8 as is). what names it in
 * the message. Returns the bytes (the str keeps them) or NULL. */
static const char *str_arg(PyObject *o, const char *what)
{
	Py_ssize_t len;
	const char *s = PyUnicode_AsUTF8AndSize(o, &len);

	if (s && strlen(s) != (size_t)len) {
		PyErr_Format(PyExc_ValueError, "embedded null character in %s",
			     what);
		return NULL;
	}
	return s;
}

/* Elements of t (dlshare_tensor_nbytes' rule), or -1 when it refuses t. */
static int64_t numel(const DLTensor *t)
{
	size_t elem = dlshare_dtype_size(t->dtype);
	uint64_t bytes;

	if (!elem || dlshare_tensor_nbytes(t, &bytes))
		return -1;
	return (int64_t)(bytes / elem);
}

static PyObject *dtype_str(DLDataType d)
{
	char buf[32];

	if (dlshare_dtype_format(d, buf, sizeof(buf)))
		snprintf(buf, sizeof(buf), "%u:%u:%u", d.code, d.bits, d.lanes);
	return PyUnicode_FromString(buf);
}

static int dtype_parse(const char *s, DLDataType *out)
{
	if (dlshare_dtype_parse(s, out)) {
		PyErr_Format(PyExc_ValueError, "unknown dtype '%s'", s);
		return -1;
	}
	return 0;
}

static PyObject *int64_tuple(const int64_t *v, int32_t n)
{
	PyObject *t = PyTuple_New(n);

	for (int32_t i = 0; t && i < n; i++) {
		PyObject *x = PyLong_FromLongLong(v[i]);

		if (!x) {
			Py_CLEAR(t);
			break;
		}
		PyTuple_SET_ITEM(t, i, x);
	}
	return t;
}

/* Reads a shape (a sequence of ints >= 0) into out; returns ndim or -1. */
static int shape_parse(PyObject *seq, int64_t *out)
{
	PyObject *fast = PySequence_Fast(seq, "shape must be a sequence of ints");
	Py_ssize_t n;

	if (!fast)
		return -1;
	n = PySequence_Fast_GET_SIZE(fast);
	if (n > NDIM_MAX) {
		Py_DECREF(fast);
		PyErr_Format(PyExc_ValueError, "at most %d dimensions", NDIM_MAX);
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));

		if (v == -1 && PyErr_Occurred()) {
			Py_DECREF(fast);
			return -1;
		}
		if (v < 0) {
			Py_DECREF(fast);
			PyErr_SetString(PyExc_ValueError,
					"shape entries must be >= 0");
			return -1;
		}
		out[i] = v;
	}
	Py_DECREF(fast);
	return (int)n;
}

/* Copies src's elements (any strides, byte_offset) compact into dst: the
 * innermost dims whose strides make them one block are copied as one run
 * (one memcpy for a compact tensor, with or without explicit strides, one
 * per row of a row-contiguous view), the rest walked; runs of one small
 * element get a constant-size copy. */
static void copy_compact(char *dst, const DLTensor *src)
{
	size_t elem = dlshare_dtype_size(src->dtype);
	const char *p = (const char *)src->data + src->byte_offset;
	int64_t shape[NDIM_MAX], stride[NDIM_MAX], idx[NDIM_MAX] = { 0 };
	int64_t n = numel(src), run = 1, inner, step;
	int32_t k = src->ndim - 1, nd = 0;

	if (n <= 0 || !elem)
		return;
	if (src->strides)
		while (k >= 0 && (src->shape[k] == 1 || src->strides[k] == run))
			run *= src->shape[k--];
	else
		run = n, k = -1;
	for (int32_t i = 0; i <= k; i++)
		if (src->shape[i] != 1) {
			shape[nd] = src->shape[i];
			stride[nd++] = src->strides[i] * (int64_t)elem;
		}
	run *= (int64_t)elem;
	if (nd == 0) {
		memcpy(dst, p, (size_t)run);
		return;
	}
	/* The innermost walked dim in a loop of its own, the outer ones as
	 * an odometer. */
	inner = shape[nd - 1];
	step = stride[nd - 1];
	for (;;) {
		const char *q = p;

#define COPY_ROW(sz)                                                    \
		for (int64_t j = 0; j < inner; j++, q += step, dst += (sz)) \
			memcpy(dst, q, (size_t)(sz))
		switch (run) {
		case 1: COPY_ROW(1); break;
		case 2: COPY_ROW(2); break;
		case 4: COPY_ROW(4); break;
		case 8: COPY_ROW(8); break;
		case 16: COPY_ROW(16); break;
		default: COPY_ROW(run); break;
		}
#undef COPY_ROW
		for (k = nd - 2; k >= 0; k--) {
			p += stride[k];
			if (++idx[k] < shape[k])
				break;
			p -= shape[k] * stride[k];
			idx[k] = 0;
		}
		if (k < 0)
			return;
	}
}

/* ---- private memory for copies ------------------------------------------- */

/* Memory of a writable copy: transparent huge pages where the kernel gives
 * them on request (a 256 MiB copy then faults 128 times, not 65,536), from
 * malloc below 2 MiB. pmem_free takes the same len. */
#define PMEM_HUGE ((size_t)2 << 20)

static void *pmem_alloc(size_t len)
{
	size_t map;
	char *p, *a;

	if (len < PMEM_HUGE) {
		void *m = NULL;

		return posix_memalign(&m, 64, len ? len : 64) ? NULL : m;
	}
	/* 2 MiB aligned, so that every 2 MiB of it may be one huge page. */
	map = (len + PMEM_HUGE - 1) / PMEM_HUGE * PMEM_HUGE;
	p = mmap(NULL, map + PMEM_HUGE, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	a = (char *)(((uintptr_t)p + PMEM_HUGE - 1) & ~(uintptr_t)(PMEM_HUGE - 1));
	if (a > p)
		munmap(p, (size_t)(a - p));
	munmap(a + map, (size_t)(p + PMEM_HUGE - a));
	madvise(a, map, MADV_HUGEPAGE);
	return a;
}

static void pmem_free(void *p, size_t len)
{
	if (!p)
		return;
	if (len < PMEM_HUGE)
		free(p);
	else
		munmap(p, (len + PMEM_HUGE - 1) / PMEM_HUGE * PMEM_HUGE);
}

/* A zero-element tensor may come with data NULL; consumers want a pointer. */
static _Alignas(64) char empty_data[64];

/* ---- capsules ------------------------------------------------------------ */

/* The destructor of every capsule we make: a consumer that took the tensor
 * renamed the capsule and owns the tensor; otherwise it is still ours. Our
 * deleters need no Python, and this runs with the GIL. */
static void capsule_free(PyObject *cap)
{
	PyObject *et, *ev, *tb;

	if (PyCapsule_IsValid(cap, CAP_USED) ||
	    PyCapsule_IsValid(cap, CAP_VERSIONED_USED))
		return;
	PyErr_Fetch(&et, &ev, &tb);
	if (PyCapsule_IsValid(cap, CAP_PLAIN)) {
		DLManagedTensor *m = PyCapsule_GetPointer(cap, CAP_PLAIN);

		if (m && m->deleter)
			m->deleter(m);
	} else if (PyCapsule_IsValid(cap, CAP_VERSIONED)) {
		DLManagedTensorVersioned *m =
			PyCapsule_GetPointer(cap, CAP_VERSIONED);

		if (m && m->deleter)
			m->deleter(m);
	} else {
		PyErr_WriteUnraisable(cap);
	}
	PyErr_Restore(et, ev, tb);
}

/* Wraps a managed tensor in a capsule. On failure the tensor is deleted. */
static PyObject *capsule_new(void *mt, int versioned)
{
	PyObject *cap = PyCapsule_New(mt, versioned ? CAP_VERSIONED : CAP_PLAIN,
				      capsule_free);

	if (!cap) {
		if (versioned) {
			DLManagedTensorVersioned *m = mt;

			m->deleter(m);
		} else {
			DLManagedTensor *m = mt;

			m->deleter(m);
		}
	}
	return cap;
}

union managed {
	DLManagedTensor plain;
	DLManagedTensorVersioned versioned;
};

/* Fills u around t (whose shape/strides the caller keeps alive). */
static void *managed_fill(union managed *u, const DLTensor *t, void *ctx,
			  void (*del)(DLManagedTensor *),
			  void (*del_v)(DLManagedTensorVersioned *),
			  int versioned, uint64_t flags)
{
	if (versioned) {
		u->versioned.version.major = DLPACK_MAJOR_VERSION;
		u->versioned.version.minor = DLPACK_MINOR_VERSION;
		u->versioned.manager_ctx = ctx;
		u->versioned.deleter = del_v;
		u->versioned.flags = flags;
		u->versioned.dl_tensor = *t;
		return &u->versioned;
	}
	u->plain.manager_ctx = ctx;
	u->plain.deleter = del;
	u->plain.dl_tensor = *t;
	return &u->plain;
}

/* A compact copy of a tensor, for __dlpack__(copy=True). */
struct tcopy {
	union managed m;
	int64_t shape[NDIM_MAX];
	void *data;
	size_t len;
};

static void tcopy_free(struct tcopy *c)
{
	pmem_free(c->data, c->len);
	free(c);
}

static void tcopy_delete(DLManagedTensor *self)
{
	tcopy_free(self->manager_ctx);
}

static void tcopy_delete_v(DLManagedTensorVersioned *self)
{
	tcopy_free(self->manager_ctx);
}

/* Returns a capsule holding a writable compact copy of src (CPU memory). */
static PyObject *copy_capsule(const DLTensor *src, int versioned)
{
	size_t elem = dlshare_dtype_size(src->dtype);
	int64_t n = numel(src);
	struct tcopy *c;
	DLTensor t;
	void *mt;

	if (!elem || n < 0 || (uint64_t)n > SIZE_MAX / elem) {
		PyErr_SetString(PyExc_BufferError, "cannot copy this tensor");
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (c) {
		c->len = (size_t)n * elem;
		c->data = pmem_alloc(c->len);
	}
	if (!c || !c->data) {
		free(c);
		return PyErr_NoMemory();
	}
	/* With the GIL: another thread could otherwise release the memory
	 * under the copy. */
	copy_compact(c->data, src);
	t = *src;
	memcpy(c->shape, src->shape, (size_t)src->ndim * sizeof(int64_t));
	t.shape = c->shape;
	t.strides = NULL;
	t.byte_offset = 0;
	t.data = c->data;
	t.device.device_type = kDLCPU;
	t.device.device_id = 0;
	mt = managed_fill(&c->m, &t, c, tcopy_delete, tcopy_delete_v, versioned,
			  DLPACK_FLAG_BITMASK_IS_COPIED);
	return capsule_new(mt, versioned);
}

/* ---- the buffer protocol as a DLPack producer ------------------------------ */

/* A DLPack tensor over a Py_buffer, for objects that cannot export DLPack
 * themselves (bytes, array.array, NumPy 1.x read-only arrays). Its deleter
 * releases the buffer, which needs Python. */
struct bufwrap {
	DLManagedTensor mt;
	Py_buffer view;
	int64_t shape[NDIM_MAX];
	int64_t strides[NDIM_MAX];
};

static void bufwrap_delete(DLManagedTensor *self)
{
	struct bufwrap *b = self->manager_ctx;

	/* Leak the buffer at interpreter shutdown rather than hang there. */
	if (py_enter()) {
		PyGILState_STATE st = PyGILState_Ensure();
		int was = in_deleter;

		in_deleter = 1;
		PyBuffer_Release(&b->view);
		in_deleter = was;
		PyGILState_Release(st);
		py_leave();
	}
	free(b);
}

/* The DLPack dtype of a struct-module format, or -1. */
static int format_dtype(const char *f, Py_ssize_t itemsize, DLDataType *d)
{
	if (!f)
		f = "B";
	if (*f == '@' || *f == '=' || *f == '<')
		f++;
	d->lanes = 1;
	d->bits = (uint8_t)(itemsize * 8);
	if (itemsize <= 0 || itemsize > 16)
		return -1;
	if (f[0] == 'Z' && (f[1] == 'f' || f[1] == 'd') && !f[2]) {
		d->code = kDLComplex;
		return 0;
	}
	if (f[0] && f[1])
		return -1;
	switch (f[0]) {
	case 'b': case 'h': case 'i': case 'l': case 'q': case 'n':
		d->code = kDLInt;
		return 0;
	case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N':
		d->code = kDLUInt;
		return 0;
	case 'e': case 'f': case 'd':
		d->code = kDLFloat;
		return 0;
	case '?':
		d->code = DL_BOOL;
		return 0;
	default:
		return -1;
	}
}

/* buffer_capsule(obj) -> a "dltensor" capsule over obj's buffer */
static PyObject *mod_buffer_capsule(PyObject *mod, PyObject *obj)
{
	struct bufwrap *b = calloc(1, sizeof(*b));
	DLTensor *t;

	if (!b)
		return PyErr_NoMemory();
	if (PyObject_GetBuffer(obj, &b->view, PyBUF_RECORDS_RO)) {
		free(b);
		return NULL;
	}
	t = &b->mt.dl_tensor;
	if (b->view.ndim > NDIM_MAX || b->view.suboffsets ||
	    format_dtype(b->view.format, b->view.itemsize, &t->dtype)) {
		if (b->view.ndim > NDIM_MAX || b->view.suboffsets)
			PyErr_Format(PyExc_BufferError, "a buffer of %d "
				     "dimensions, or with suboffsets, is no "
				     "DLPack tensor", b->view.ndim);
		else
			PyErr_Format(PyExc_BufferError, "the buffer's format "
				     "'%.40s' (%zd bytes per item) has no DLPack "
				     "dtype", b->view.format ? b->view.format : "B",
				     b->view.itemsize);
		PyBuffer_Release(&b->view);
		free(b);
		return NULL;
	}
	for (int k = 0; k < b->view.ndim; k++) {
		b->shape[k] = b->view.shape[k];
		if (b->view.strides[k] % b->view.itemsize) {
			PyBuffer_Release(&b->view);
			free(b);
			PyErr_SetString(PyExc_BufferError,
					"strides not a multiple of the item size");
			return NULL;
		}
		b->strides[k] = b->view.strides[k] / b->view.itemsize;
	}
	t->data = b->view.buf ? b->view.buf : empty_data;
	t->device.device_type = kDLCPU;
	t->ndim = b->view.ndim;
	t->shape = b->shape;
	t->strides = b->strides;
	b->mt.manager_ctx = b;
	b->mt.deleter = bufwrap_delete;
	return capsule_new(&b->mt, 0);
}

/* ---- owners of writable memory ------------------------------------------- */

/* What keeps the memory of an Array alive: a store writer or a
 * dlshare_host_alloc() tensor. Refcounted by Arrays and their DLPack views,
 * which may die on any thread, without the GIL. */
struct owner {
	atomic_long refs;
	atomic_long views;       /* buffer and DLPack views alive */
	void (*destroy)(struct owner *o);
};

static void owner_ref(struct owner *o)
{
	atomic_fetch_add(&o->refs, 1);
}

static void owner_unref(struct owner *o)
{
	if (o && atomic_fetch_sub(&o->refs, 1) == 1)
		o->destroy(o);
}

struct hstate {
	struct owner o;
	DLManagedTensor *mt;     /* from dlshare_host_alloc() */
};

static void hstate_destroy(struct owner *o)
{
	struct hstate *h = (struct hstate *)o;

	h->mt->deleter(h->mt); /* munmap and close: no Python, no daemon */
	free(h);
}

/* Private memory holding a copy (get(copy=True)): the process's own,
 * writable, shared with nobody. */
struct pstate {
	struct owner o;
	void *mem;
	size_t len;
};

static void pstate_destroy(struct owner *o)
{
	struct pstate *p = (struct pstate *)o;

	pmem_free(p->mem, p->len);
	free(p);
}

/* A store-mode writer. done is set (with the GIL) when seal or abort
 * begins: from then on no new view of its memory may be made. */
struct wstate {
	struct owner o;
	struct cguard *g;
	dlshare_writer *w;
	uint64_t version;        /* the number seal publishes */
	int done;
};

/* Aborts w: waits for a close in progress, so that this never runs
 * alongside dlshare_disconnect(). Call without the GIL. */
static void writer_abort_nogil(struct cguard *g, dlshare_writer *w)
{
	if (guard_enter(g, 1)) {
		dlshare_writer_abort(w);
		guard_leave(g);
	} else {
		dlshare_writer_abort(w); /* closed: only frees */
	}
}

static void wstate_free(void *arg)
{
	struct wstate *ws = arg;

	if (ws->w)
		writer_abort_nogil(ws->g, ws->w);
	guard_unref(ws->g);
	free(ws);
}

static void wstate_destroy(struct owner *o)
{
	struct wstate *ws = (struct wstate *)o;

	/* Aborting waits for the daemon: never inside a deleter the library
	 * runs, and never with the GIL held, or a deleter waiting for it on
	 * the library's thread would wait for us while we wait for that
	 * thread. */
	if (in_deleter) {
		run_detached(wstate_free, ws);
	} else if (gil_held()) {
		Py_BEGIN_ALLOW_THREADS
		wstate_free(ws);
		Py_END_ALLOW_THREADS
	} else {
		wstate_free(ws);
	}
}

/* A DLPack view of an Array's memory. */
struct aview {
	union managed m;
	struct owner *o;
	int64_t shape[NDIM_MAX];
};

static void aview_free(struct aview *v)
{
	atomic_fetch_sub(&v->o->views, 1);
	owner_unref(v->o);
	free(v);
}

static void aview_delete(DLManagedTensor *self)
{
	aview_free(self->manager_ctx);
}

static void aview_delete_v(DLManagedTensorVersioned *self)
{
	aview_free(self->manager_ctx);
}

/* ---- Array: writable shared memory ---------------------------------------- */

typedef struct {
	PyObject_HEAD
	struct owner *o;
	struct wstate *ws;       /* the writer when o is one, else NULL */
	DLTensor t;
	int64_t shape[NDIM_MAX];
	Py_ssize_t bshape[NDIM_MAX];
	Py_ssize_t bstrides[NDIM_MAX];
} ArrayObject;

static PyTypeObject *Array_Type;

static int array_usable(ArrayObject *a)
{
	if (!a->o) {
		PyErr_SetString(PyExc_BufferError, "uninitialized array");
		return 0;
	}
	if (a->ws && a->ws->done) {
		PyErr_SetString(PyExc_BufferError,
				"the writer was sealed or aborted: this memory "
				"is no longer mapped writable");
		return 0;
	}
	if (a->ws && guard_foreign(a->ws->g)) {
		PyErr_SetString(PyExc_BufferError,
				"this Array is the memory of a writer created "
				"in another process (this one is a fork of it), "
				"which is not mapped here");
		return 0;
	}
	return 1;
}

/* A new instance of cls (Array or a subclass) over t, holding o. */
static PyObject *array_new_of(PyObject *cls, struct owner *o,
			      struct wstate *ws, const DLTensor *t)
{
	ArrayObject *a;

	if (!PyType_Check(cls) ||
	    !PyType_IsSubtype((PyTypeObject *)cls, Array_Type)) {
		PyErr_SetString(PyExc_TypeError, "cls must subclass Array");
		return NULL;
	}
	a = (ArrayObject *)((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
	if (!a)
		return NULL;
	a->t = *t;
	memcpy(a->shape, t->shape, (size_t)t->ndim * sizeof(int64_t));
	a->t.shape = a->shape;
	a->t.strides = NULL;
	if (!a->t.data)
		a->t.data = empty_data;
	owner_ref(o);
	a->o = o;
	a->ws = ws;
	return (PyObject *)a;
}

static void Array_dealloc(ArrayObject *a)
{
	PyTypeObject *tp = Py_TYPE(a);

	owner_unref(a->o);
	tp->tp_free((PyObject *)a);
	Py_DECREF(tp);
}

static PyObject *Array_new(PyTypeObject *tp, PyObject *a, PyObject *k)
{
	PyErr_SetString(PyExc_TypeError,
			"use dlshare.empty() or a Writer to get an Array");
	return NULL;
}

static const char *buffer_format(DLDataType d)
{
	if (d.lanes != 1)
		return NULL;
	switch (d.code) {
	case kDLInt:
		return d.bits == 8 ? "b" : d.bits == 16 ? "h" :
		       d.bits == 32 ? "i" : d.bits == 64 ? "q" : NULL;
	case kDLUInt:
		return d.bits == 8 ? "B" : d.bits == 16 ? "H" :
		       d.bits == 32 ? "I" : d.bits == 64 ? "Q" : NULL;
	case kDLFloat:
		return d.bits == 16 ? "e" : d.bits == 32 ? "f" :
		       d.bits == 64 ? "d" : NULL;
	case kDLComplex:
		return d.bits == 64 ? "Zf" : d.bits == 128 ? "Zd" : NULL;
	case DL_BOOL:
		return d.bits == 8 ? "?" : NULL;
	default:
		return NULL;
	}
}

static int Array_getbuffer(ArrayObject *a, Py_buffer *view, int flags)
{
	const char *fmt = buffer_format(a->t.dtype);
	size_t elem = dlshare_dtype_size(a->t.dtype);
	int64_t n = numel(&a->t);
	Py_ssize_t stride = (Py_ssize_t)elem;

	if (!array_usable(a))
		return -1;
	if (!fmt) {
		PyErr_SetString(PyExc_BufferError,
				"this dtype has no buffer-protocol format; use "
				"DLPack (from_dlpack)");
		return -1;
	}
	for (int32_t k = a->t.ndim - 1; k >= 0; k--) {
		a->bshape[k] = (Py_ssize_t)a->shape[k];
		a->bstrides[k] = stride;
		stride *= (Py_ssize_t)a->shape[k];
	}
	view->buf = a->t.data;
	view->obj = Py_NewRef(a);
	view->len = (Py_ssize_t)n * (Py_ssize_t)elem;
	view->readonly = 0;
	view->itemsize = (Py_ssize_t)elem;
	view->format = (flags & PyBUF_FORMAT) ? (char *)fmt : NULL;
	view->ndim = a->t.ndim;
	view->shape = (flags & PyBUF_ND) ? a->bshape : NULL;
	view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? a->bstrides :
			NULL;
	view->suboffsets = NULL;
	view->internal = NULL;
	atomic_fetch_add(&a->o->views, 1);
	return 0;
}

static void Array_releasebuffer(ArrayObject *a, Py_buffer *view)
{
	atomic_fetch_sub(&a->o->views, 1);
}

/* _export(versioned, copy) -> a capsule; writable, so never flagged
 * read-only. */
static PyObject *Array_export(ArrayObject *a, PyObject *args)
{
	int versioned, copy;
	struct aview *v;
	DLTensor t;
	void *mt;

	if (!PyArg_ParseTuple(args, "pp", &versioned, &copy))
		return NULL;
	if (!array_usable(a))
		return NULL;
	if (copy)
		return copy_capsule(&a->t, versioned);
	v = calloc(1, sizeof(*v));
	if (!v)
		return PyErr_NoMemory();
	t = a->t;
	memcpy(v->shape, a->shape, (size_t)t.ndim * sizeof(int64_t));
	t.shape = v->shape;
	owner_ref(a->o);
	atomic_fetch_add(&a->o->views, 1);
	v->o = a->o;
	mt = managed_fill(&v->m, &t, v, aview_delete, aview_delete_v, versioned,
			  0);
	return capsule_new(mt, versioned);
}

/* _info() -> (dtype, shape, device_type, device_id, data pointer, bytes per
 * element) */
static PyObject *Array_info(ArrayObject *a, PyObject *unused)
{
	if (!a->o) {
		PyErr_SetString(PyExc_BufferError, "uninitialized array");
		return NULL;
	}
	return Py_BuildValue("(NNiinn)", dtype_str(a->t.dtype),
			     int64_tuple(a->shape, a->t.ndim),
			     (int)a->t.device.device_type,
			     (int)a->t.device.device_id,
			     (Py_ssize_t)(uintptr_t)a->t.data,
			     (Py_ssize_t)dlshare_dtype_size(a->t.dtype));
}

/* _copy_from(capsule): copies a host tensor of the same dtype and shape
 * (any strides) into this memory. The capsule stays its owner's. */
static PyObject *Array_copy_from(ArrayObject *a, PyObject *cap)
{
	const DLTensor *src;

	if (!array_usable(a))
		return NULL;
	if (PyCapsule_IsValid(cap, CAP_PLAIN)) {
		DLManagedTensor *m = PyCapsule_GetPointer(cap, CAP_PLAIN);

		src = &m->dl_tensor;
	} else if (PyCapsule_IsValid(cap, CAP_VERSIONED)) {
		DLManagedTensorVersioned *m =
			PyCapsule_GetPointer(cap, CAP_VERSIONED);

		if (m->version.major != 1) {
			PyErr_SetString(PyExc_BufferError,
					"unsupported DLPack major version");
			return NULL;
		}
		src = &m->dl_tensor;
	} else {
		PyErr_SetString(PyExc_BufferError,
				"expected an unused dltensor capsule");
		return NULL;
	}
	if (src->device.device_type != kDLCPU &&
	    src->device.device_type != kDLCUDAHost) {
		PyErr_SetString(PyExc_BufferError,
				"copy_from takes host tensors only");
		return NULL;
	}
	if (src->dtype.code != a->t.dtype.code ||
	    src->dtype.bits != a->t.dtype.bits ||
	    src->dtype.lanes != a->t.dtype.lanes || src->ndim != a->t.ndim ||
	    (src->ndim &&
	     memcmp(src->shape, a->shape, (size_t)src->ndim * sizeof(int64_t)))) {
		PyErr_SetString(PyExc_ValueError,
				"copy_from needs the same dtype and shape");
		return NULL;
	}
	copy_compact(a->t.data, src);
	Py_RETURN_NONE;
}

static PyObject *Array_usable(ArrayObject *a, PyObject *unused)
{
	return PyBool_FromLong(a->o && !(a->ws && (a->ws->done ||
						  guard_foreign(a->ws->g))));
}

static PyMethodDef Array_methods[] = {
	{ "_export", (PyCFunction)Array_export, METH_VARARGS,
	  "_export(versioned, copy) -> a DLPack capsule of this memory" },
	{ "_info", (PyCFunction)Array_info, METH_NOARGS,
	  "_info() -> (dtype, shape, device_type, device_id, address)" },
	{ "_copy_from", (PyCFunction)Array_copy_from, METH_O,
	  "_copy_from(capsule): copies a host tensor into this memory" },
	{ "_usable", (PyCFunction)Array_usable, METH_NOARGS,
	  "_usable() -> whether the memory is still there to use" },
	{ NULL },
};

static PyType_Slot Array_slots[] = {
	{ Py_tp_doc, "Writable host memory that dlshare can share: from "
		     "dlshare.empty() (published without a copy) or a Writer "
		     "(store mode)." },
	{ Py_tp_dealloc, Array_dealloc },
	{ Py_tp_new, Array_new },
	{ Py_tp_methods, Array_methods },
	{ Py_bf_getbuffer, Array_getbuffer },
	{ Py_bf_releasebuffer, Array_releasebuffer },
	{ 0, NULL },
};

static PyType_Spec Array_spec = {
	"dlshare._dlshare.Array", sizeof(ArrayObject), 0,
	Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, Array_slots,
};

/* ---- Bundle: a version got from the daemon ---------------------------------- */

typedef struct {
	PyObject_HEAD
	dlshare_bundle *b;
} BundleObject;

static PyTypeObject *Bundle_Type;

static int bundle_index(BundleObject *s, Py_ssize_t i)
{
	if (!s->b) {
		PyErr_SetString(PyExc_BufferError, "the tensor was released");
		return -1;
	}
	if (i < 0 || (size_t)i >= dlshare_bundle_count(s->b)) {
		PyErr_SetString(PyExc_IndexError, "tensor index out of range");
		return -1;
	}
	return 0;
}

static void Bundle_dealloc(BundleObject *s)
{
	PyTypeObject *tp = Py_TYPE(s);

	/* Never waits: the Release is queued for the library's thread. */
	dlshare_bundle_free(s->b);
	tp->tp_free((PyObject *)s);
	Py_DECREF(tp);
}

static PyObject *Bundle_version(BundleObject *s, PyObject *unused)
{
	return PyLong_FromUnsignedLongLong(dlshare_bundle_version(s->b));
}

static PyObject *Bundle_count(BundleObject *s, PyObject *unused)
{
	return PyLong_FromSize_t(dlshare_bundle_count(s->b));
}

static PyObject *Bundle_keys(BundleObject *s, PyObject *unused)
{
	size_t n = dlshare_bundle_count(s->b);
	PyObject *t = PyTuple_New((Py_ssize_t)n);

	for (size_t i = 0; t && i < n; i++) {
		PyObject *k = PyUnicode_FromString(dlshare_bundle_key(s->b, i));

		if (!k) {
			Py_CLEAR(t);
			break;
		}
		PyTuple_SET_ITEM(t, (Py_ssize_t)i, k);
	}
	return t;
}

/* find(key) -> the index of the tensor with that key, or -1: O(1), the
 * library indexes a bundle's keys. */
static PyObject *Bundle_find(BundleObject *s, PyObject *arg)
{
	Py_ssize_t len;
	const char *k = PyUnicode_AsUTF8AndSize(arg, &len);
	int i;

	if (!k)
		return NULL;
	if (strlen(k) != (size_t)len)  /* a NUL inside: no key has one */
		return PyLong_FromLong(-1);
	i = dlshare_bundle_find(s->b, k);
	return PyLong_FromLong(i >= 0 ? i : -1);
}

/* key(i) -> the key of tensor i. */
static PyObject *Bundle_key(BundleObject *s, PyObject *arg)
{
	Py_ssize_t i = PyLong_AsSsize_t(arg);

	if ((i == -1 && PyErr_Occurred()) || bundle_index(s, i))
		return NULL;
	return PyUnicode_FromString(dlshare_bundle_key(s->b, (size_t)i));
}

/* info(i) -> (dtype, shape, strides or None, device_type, device_id,
 *             data pointer, bytes per element) */
static PyObject *Bundle_info(BundleObject *s, PyObject *arg)
{
	Py_ssize_t i = PyLong_AsSsize_t(arg);
	const DLTensor *t;

	if ((i == -1 && PyErr_Occurred()) || bundle_index(s, i))
		return NULL;
	t = dlshare_bundle_tensor(s->b, (size_t)i);
	return Py_BuildValue("(NNNiinn)", dtype_str(t->dtype),
			     int64_tuple(t->shape, t->ndim),
			     t->strides ? int64_tuple(t->strides, t->ndim) :
					  Py_NewRef(Py_None),
			     (int)t->device.device_type,
			     (int)t->device.device_id,
			     (Py_ssize_t)(uintptr_t)t->data +
				     (Py_ssize_t)t->byte_offset,
			     (Py_ssize_t)dlshare_dtype_size(t->dtype));
}

/* export(i, versioned, copy) -> a capsule. The tensor holds the lease on
 * its own, so it outlives this bundle. */
static PyObject *Bundle_export(BundleObject *s, PyObject *args)
{
	Py_ssize_t i;
	int versioned, copy, err;

	if (!PyArg_ParseTuple(args, "npp", &i, &versioned, &copy))
		return NULL;
	if (bundle_index(s, i))
		return NULL;
	if (copy)
		return copy_capsule(dlshare_bundle_tensor(s->b, (size_t)i),
				    versioned);
	if (versioned) {
		DLManagedTensorVersioned *m;

		err = dlshare_bundle_export_versioned(s->b, (size_t)i, &m);
		if (err)
			return raise_code(err);
		if (!m->dl_tensor.data)
			m->dl_tensor.data = empty_data;
		return capsule_new(m, 1);
	} else {
		DLManagedTensor *m;

		err = dlshare_bundle_export(s->b, (size_t)i, &m);
		if (err)
			return raise_code(err);
		if (!m->dl_tensor.data)
			m->dl_tensor.data = empty_data;
		return capsule_new(m, 0);
	}
}

/* copy_out(cls, i) -> an Array of cls holding a private, writable,
 * compact copy of tensor i (host tensors). The copy runs without the GIL,
 * from a tensor that holds a lease of its own, so a release() in another
 * thread cannot unmap the memory under it. */
static PyObject *Bundle_copy_out(BundleObject *s, PyObject *args)
{
	int64_t shape[NDIM_MAX];
	struct pstate *ps;
	DLManagedTensor *m;
	PyObject *cls, *ret;
	Py_ssize_t i;
	DLTensor t;
	size_t elem;
	int64_t n;
	int err;

	if (!PyArg_ParseTuple(args, "On", &cls, &i) || bundle_index(s, i))
		return NULL;
	t = *dlshare_bundle_tensor(s->b, (size_t)i);
	if (t.device.device_type != kDLCPU &&
	    t.device.device_type != kDLCUDAHost) {
		PyErr_SetString(PyExc_BufferError, "copy=True makes host copies "
				"of host tensors only; this one is on a GPU "
				"(copy it with its framework: "
				"torch.from_dlpack(t).clone())");
		return NULL;
	}
	elem = dlshare_dtype_size(t.dtype);
	n = numel(&t);
	if (!elem || n < 0 || (uint64_t)n > SIZE_MAX / elem) {
		PyErr_SetString(PyExc_BufferError, "cannot copy this tensor");
		return NULL;
	}
	err = dlshare_bundle_export(s->b, (size_t)i, &m);
	if (err)
		return raise_code(err);
	ps = calloc(1, sizeof(*ps));
	if (ps) {
		ps->len = (size_t)n * elem;
		ps->mem = pmem_alloc(ps->len);
	}
	if (!ps || !ps->mem) {
		free(ps);
		m->deleter(m);
		return PyErr_NoMemory();
	}
	Py_BEGIN_ALLOW_THREADS
	copy_compact(ps->mem, &m->dl_tensor);
	Py_END_ALLOW_THREADS
	atomic_init(&ps->o.refs, 1);
	atomic_init(&ps->o.views, 0);
	ps->o.destroy = pstate_destroy;
	memcpy(shape, m->dl_tensor.shape, (size_t)t.ndim * sizeof(int64_t));
	m->deleter(m); /* never waits: the Release is queued */
	t.shape = shape;
	t.strides = NULL;
	t.byte_offset = 0;
	t.data = ps->mem;
	t.device.device_type = kDLCPU;
	t.device.device_id = 0;
	ret = array_new_of(cls, &ps->o, NULL, &t);
	owner_unref(&ps->o); /* the Array holds it now, or nobody */
	return ret;
}

/* wait(stream): makes a CUDA stream wait for the producer's work (the
 * stream a consumer names in __dlpack__). */
static PyObject *Bundle_wait(BundleObject *s, PyObject *arg)
{
	unsigned long long v = PyLong_AsUnsignedLongLongMask(arg);
	int err;

	if (PyErr_Occurred())
		return NULL;
	if (!s->b) {
		PyErr_SetString(PyExc_ValueError, "the tensor was released");
		return NULL;
	}
	err = dlshare_bundle_wait(s->b, (void *)(uintptr_t)v);
	if (err)
		return raise_code(err);
	Py_RETURN_NONE;
}

/* release(): drops this object's hold on the lease now. */
static PyObject *Bundle_release(BundleObject *s, PyObject *unused)
{
	dlshare_bundle *b = s->b;

	s->b = NULL;
	dlshare_bundle_free(b);
	Py_RETURN_NONE;
}

static PyObject *Bundle_released(BundleObject *s, PyObject *unused)
{
	return PyBool_FromLong(s->b == NULL);
}

/* Whether a buffer's element format (struct syntax, native or
 * little-endian) is the DLPack dtype dt. */
static int format_is(const char *f, Py_ssize_t itemsize, DLDataType dt)
{
	int code;

	if (!f)
		f = "B";
	if (*f == '@' || *f == '=' || *f == '<')
		f++;
	if (!f[0] || f[1] || dt.lanes != 1 || itemsize * 8 != dt.bits)
		return 0;
	if (strchr("efd", *f))
		code = kDLFloat;
	else if (strchr("bhilqn", *f))
		code = kDLInt;
	else if (strchr("BHILQN", *f))
		code = kDLUInt;
	else if (*f == '?')
		code = 6; /* kDLBool */
	else
		return 0;
	return code == dt.code;
}

/* Whether t is compact row-major (strides NULL or as its shape makes). */
static int dl_compact(const DLTensor *t)
{
	int64_t want = 1;

	if (!t->strides)
		return 1;
	for (int32_t d = t->ndim - 1; d >= 0; d--) {
		if (t->shape[d] != 1 && t->strides[d] != want)
			return 0;
		want *= t->shape[d];
	}
	return 1;
}

/* host_copy(indices, dsts, go) -> the positions it cannot do. A fast path
 * of load_state_dict for 10^5 tensors: tensor indices[k] of this bundle
 * into dsts[k], an object with a writable C-contiguous buffer (a NumPy
 * array) of the same dtype and shape, on the host. Positions whose pair is
 * anything else are listed for the general path (which names what is
 * wrong). With go false nothing is copied: the caller checks every pair
 * before copying any. */
static PyObject *Bundle_host_copy(BundleObject *s, PyObject *args)
{
	PyObject *idx, *dsts, *slow = NULL;
	int go;
	Py_ssize_t n;

	if (!PyArg_ParseTuple(args, "O!O!p", &PyList_Type, &idx, &PyList_Type,
			      &dsts, &go))
		return NULL;
	if (!s->b) {
		PyErr_SetString(PyExc_BufferError, "the tensor was released");
		return NULL;
	}
	n = PyList_GET_SIZE(idx);
	if (PyList_GET_SIZE(dsts) != n) {
		PyErr_SetString(PyExc_ValueError, "indices and dsts differ in "
				"length");
		return NULL;
	}
	if (!(slow = PyList_New(0)))
		return NULL;
	for (Py_ssize_t k = 0; k < n; k++) {
		Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(idx, k));
		const DLTensor *t;
		Py_buffer v;
		int ok;

		if ((i == -1 && PyErr_Occurred()) || bundle_index(s, i))
			goto fail;
		t = dlshare_bundle_tensor(s->b, (size_t)i);
		if (t->device.device_type != kDLCPU || !dl_compact(t)) {
			ok = 0;
		} else if (PyObject_GetBuffer(PyList_GET_ITEM(dsts, k), &v,
					      PyBUF_WRITABLE | PyBUF_FORMAT |
					      PyBUF_ND) != 0) {
			PyErr_Clear(); /* not a plain writable array */
			ok = 0;
		} else {
			ok = v.ndim == t->ndim &&
			     format_is(v.format, v.itemsize, t->dtype);
			for (int d = 0; ok && d < v.ndim; d++)
				ok = v.shape[d] == t->shape[d];
			if (ok && go && v.len)
				memcpy(v.buf, (const char *)t->data +
				       t->byte_offset, (size_t)v.len);
			PyBuffer_Release(&v);
		}
		if (!ok) {
			PyObject *pos = PyLong_FromSsize_t(k);

			if (!pos || PyList_Append(slow, pos)) {
				Py_XDECREF(pos);
				goto fail;
			}
			Py_DECREF(pos);
		}
	}
	return slow;
fail:
	Py_XDECREF(slow);
	return NULL;
}

static PyMethodDef Bundle_methods[] = {
	{ "version", (PyCFunction)Bundle_version, METH_NOARGS, NULL },
	{ "count", (PyCFunction)Bundle_count, METH_NOARGS, NULL },
	{ "keys", (PyCFunction)Bundle_keys, METH_NOARGS, NULL },
	{ "find", (PyCFunction)Bundle_find, METH_O, NULL },
	{ "key", (PyCFunction)Bundle_key, METH_O, NULL },
	{ "info", (PyCFunction)Bundle_info, METH_O, NULL },
	{ "export", (PyCFunction)Bundle_export, METH_VARARGS, NULL },
	{ "copy_out", (PyCFunction)Bundle_copy_out, METH_VARARGS, NULL },
	{ "host_copy", (PyCFunction)Bundle_host_copy, METH_VARARGS, NULL },
	{ "wait", (PyCFunction)Bundle_wait, METH_O, NULL },
	{ "release", (PyCFunction)Bundle_release, METH_NOARGS, NULL },
	{ "released", (PyCFunction)Bundle_released, METH_NOARGS, NULL },
	{ NULL },
};

static PyType_Slot Bundle_slots[] = {
	{ Py_tp_doc, "A version got from the daemon, holding its lease." },
	{ Py_tp_dealloc, Bundle_dealloc },
	{ Py_tp_methods, Bundle_methods },
	{ 0, NULL },
};

static PyType_Spec Bundle_spec = {
	"dlshare._dlshare.Bundle", sizeof(BundleObject), 0,
	Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Bundle_slots,
};

/* ---- Writer: a pending store-mode version ----------------------------------- */

typedef struct {
	PyObject_HEAD
	struct wstate *ws;
} WriterObject;

static PyTypeObject *Writer_Type;

static void Writer_dealloc(WriterObject *s)
{
	PyTypeObject *tp = Py_TYPE(s);

	/* Unsealed and no view left: the last unref aborts the version. */
	if (s->ws)
		owner_unref(&s->ws->o);
	tp->tp_free((PyObject *)s);
	Py_DECREF(tp);
}

static int writer_live(WriterObject *s)
{
	if (s->ws->done) {
		raise_msg(DLSHARE_ESTATE, "the writer was already sealed or "
					  "aborted");
		return 0;
	}
	return 1;
}

/* writer_live, and the writer's memory is mapped in this process. */
static int writer_mapped(WriterObject *s)
{
	if (!writer_live(s))
		return 0;
	if (guard_foreign(s->ws->g)) {
		raise_msg(DLSHARE_EFORK, "the writer was created in another "
			  "process (this one is a fork of it): its memory is "
			  "not mapped here");
		return 0;
	}
	return 1;
}

static PyObject *Writer_version(WriterObject *s, PyObject *unused)
{
	return PyLong_FromUnsignedLongLong(s->ws->version);
}

/* array(cls, i) -> an Array of cls over tensor i */
static PyObject *Writer_array(WriterObject *s, PyObject *args)
{
	PyObject *cls;
	Py_ssize_t i;
	DLTensor *t;

	if (!PyArg_ParseTuple(args, "On", &cls, &i) || !writer_mapped(s))
		return NULL;
	if (i < 0 || (size_t)i >= dlshare_writer_count(s->ws->w)) {
		PyErr_SetString(PyExc_IndexError, "tensor index out of range");
		return NULL;
	}
	t = dlshare_writer_tensor(s->ws->w, (size_t)i);
	return array_new_of(cls, &s->ws->o, s->ws, t);
}

/* Marks the writer done and takes its dlshare_writer, once no view of its
 * memory is left (seal unmaps it, so a live view would point at nothing). */
static dlshare_writer *writer_take(WriterObject *s, int for_seal)
{
	long views = atomic_load(&s->ws->o.views);
	dlshare_writer *w;

	if (!writer_live(s))
		return NULL;
	if (views > 0) {
		PyErr_Format(PyExc_BufferError,
			     "%ld view%s of the writer's tensors %s still "
			     "alive (arrays made from them with from_dlpack, "
			     "asarray or memoryview): delete them before %s",
			     views, views == 1 ? "" : "s",
			     views == 1 ? "is" : "are",
			     for_seal ? "sealing" : "aborting");
		return NULL;
	}
	s->ws->done = 1;
	w = s->ws->w;
	s->ws->w = NULL;
	return w;
}

static PyObject *Writer_seal(WriterObject *s, PyObject *args)
{
	unsigned long long stream;
	uint64_t version = 0;
	dlshare_writer *w;
	int err = 0;

	if (!PyArg_ParseTuple(args, "K", &stream))
		return NULL;
	/* A child's copy of the parent's writer stays as it is. */
	if (!writer_mapped(s) || !(w = writer_take(s, 1)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	if (guard_enter(s->ws->g, 1)) {
		err = dlshare_seal(w, (void *)(uintptr_t)stream, &version);
		guard_leave(s->ws->g);
	} else {
		dlshare_writer_abort(w);
		err = ERR_CLOSED_HERE;
	}
	Py_END_ALLOW_THREADS
	if (err)
		return raise_code(err);
	return PyLong_FromUnsignedLongLong(version);
}

static PyObject *Writer_abort(WriterObject *s, PyObject *unused)
{
	dlshare_writer *w;

	if (s->ws->done)
		Py_RETURN_NONE;
	if (!(w = writer_take(s, 0)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	writer_abort_nogil(s->ws->g, w);
	Py_END_ALLOW_THREADS
	Py_RETURN_NONE;
}

static PyObject *Writer_done(WriterObject *s, PyObject *unused)
{
	return PyBool_FromLong(s->ws->done);
}

static PyObject *Writer_views(WriterObject *s, PyObject *unused)
{
	return PyLong_FromLong(atomic_load(&s->ws->o.views));
}

static PyMethodDef Writer_methods[] = {
	{ "version", (PyCFunction)Writer_version, METH_NOARGS, NULL },
	{ "array", (PyCFunction)Writer_array, METH_VARARGS, NULL },
	{ "seal", (PyCFunction)Writer_seal, METH_VARARGS, NULL },
	{ "abort", (PyCFunction)Writer_abort, METH_NOARGS, NULL },
	{ "done", (PyCFunction)Writer_done, METH_NOARGS, NULL },
	{ "views", (PyCFunction)Writer_views, METH_NOARGS, NULL },
	{ NULL },
};

static PyType_Slot Writer_slots[] = {
	{ Py_tp_doc, "A pending store-mode version." },
	{ Py_tp_dealloc, Writer_dealloc },
	{ Py_tp_methods, Writer_methods },
	{ 0, NULL },
};

static PyType_Spec Writer_spec = {
	"dlshare._dlshare.Writer", sizeof(WriterObject), 0,
	Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Writer_slots,
};

/* ---- Client ----------------------------------------------------------------- */

typedef struct {
	PyObject_HEAD
	struct cguard *g;
} ClientObject;

static PyTypeObject *Client_Type;

static PyObject *Client_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "path", "timeout_ms", NULL };
	dlshare_connect_opts o = { .size = sizeof(o) };
	const char *path = NULL;
	dlshare_client *c = NULL;
	ClientObject *s;
	int err;

	/* timeout_ms: 0 the library's default, -1 forever. */
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|zi", kwlist, &path,
					 &o.timeout_ms))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	err = dlshare_connect_ex(path, &o, &c);
	Py_END_ALLOW_THREADS
	if (err)
		return raise_code(err);
	s = (ClientObject *)tp->tp_alloc(tp, 0);
	if (s)
		s->g = guard_new(c);
	if (!s || !s->g) {
		Py_BEGIN_ALLOW_THREADS
		dlshare_disconnect(c);
		Py_END_ALLOW_THREADS
		Py_XDECREF(s);
		return PyErr_NoMemory();
	}
	return (PyObject *)s;
}

static void guard_close_unref(void *g)
{
	guard_close(g);
	guard_unref(g);
}

static void client_close(ClientObject *s)
{
	if (!s->g)
		return;
	/* Disconnecting joins the library's thread: never from a deleter
	 * that may run on it, and never with the GIL, which that thread may
	 * be waiting for in a producer's deleter. */
	if (in_deleter) {
		guard_ref(s->g);
		run_detached(guard_close_unref, s->g);
		return;
	}
	Py_BEGIN_ALLOW_THREADS
	guard_close(s->g);
	Py_END_ALLOW_THREADS
}

static void Client_dealloc(ClientObject *s)
{
	PyTypeObject *tp = Py_TYPE(s);

	client_close(s);
	guard_unref(s->g);
	tp->tp_free((PyObject *)s);
	Py_DECREF(tp);
}

static PyObject *Client_close(ClientObject *s, PyObject *unused)
{
	client_close(s);
	Py_RETURN_NONE;
}

static PyObject *Client_closed(ClientObject *s, PyObject *unused)
{
	int closed;

	if (guard_foreign(s->g))
		return PyBool_FromLong(__atomic_load_n(&s->g->state,
						       __ATOMIC_RELAXED) != G_OPEN);
	pthread_mutex_lock(&s->g->lock);
	closed = s->g->state != G_OPEN;
	pthread_mutex_unlock(&s->g->lock);
	return PyBool_FromLong(closed);
}

/* Runs call(c, arg) without the GIL, inside the guard. */
#define GUARDED(s, err, call)                                           \
	do {                                                            \
		dlshare_client *c_;                                     \
		Py_BEGIN_ALLOW_THREADS                                  \
		if ((c_ = guard_enter((s)->g, 0))) {                    \
			(err) = call;                                   \
			guard_leave((s)->g);                            \
		} else {                                                \
			(err) = ERR_CLOSED_HERE;                        \
		}                                                       \
		Py_END_ALLOW_THREADS                                    \
	} while (0)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* How long one slice of a waiting call lasts: Ctrl-C (and a close from
 * another thread) is seen between slices, so within about this long. A
 * slice costs one request; ten a second is nothing to the daemon. */
#define WAIT_SLICE_MS 100

/* One slice of a waiting call: call(c, arg, timeout_ms) runs without the
 * GIL, inside the guard; returns 0, DLSHARE_ETIMEDOUT, or another code. */
typedef int (*slice_fn)(dlshare_client *c, void *arg, int32_t timeout_ms);

/* Runs call in slices of at most WAIT_SLICE_MS until it stops timing out
 * or timeout_s passes (0: once, without waiting; < 0: forever), checking
 * for signals between slices in the main thread. Returns the last code, or
 * ERR_SIGNALLED with the exception (KeyboardInterrupt) set. */
#define ERR_SIGNALLED 1
static int wait_sliced(ClientObject *s, double timeout_s, slice_fn call,
		       void *arg)
{
	double deadline = timeout_s > 0 ? now_s() + timeout_s : 0;
	int err;

	for (;;) {
		int32_t ms = 0;

		if (timeout_s != 0) {
			double left = timeout_s < 0 ? 1.0 : deadline - now_s();

			if (left <= 0)
				return DLSHARE_ETIMEDOUT;
			ms = left * 1000.0 >= WAIT_SLICE_MS ? WAIT_SLICE_MS :
			     (int32_t)ceil(left * 1000.0);
		}
		GUARDED(s, err, call(c_, arg, ms));
		if (err != DLSHARE_ETIMEDOUT || timeout_s == 0)
			return err;
		if (timeout_s > 0 && now_s() >= deadline)
			return err;
		if (PyErr_CheckSignals())
			return ERR_SIGNALLED;
	}
}

/* A publish or create into a full queue name, one slice at a time. */
struct publish_call {
	const char *name;
	DLManagedTensor **ts;
	size_t n;
	dlshare_publish_opts *o;
	dlshare_queue_opts *q;
	uint64_t version;
};

static int publish_slice(dlshare_client *c, void *arg, int32_t timeout_ms)
{
	struct publish_call *p = arg;

	p->q->wait_ms = timeout_ms;
	return dlshare_publish_queued(c, p->name, p->ts, p->n, p->o, p->q,
				      &p->version);
}

struct create_call {
	const char *name;
	dlshare_tensor_spec *sp;
	size_t n;
	dlshare_create_opts *o;
	dlshare_queue_opts *q;
	dlshare_writer *w;
};

static int create_slice(dlshare_client *c, void *arg, int32_t timeout_ms)
{
	struct create_call *k = arg;

	k->q->wait_ms = timeout_ms;
	return dlshare_create_queued(c, k->name, k->sp, k->n, k->o, k->q,
				     &k->w);
}

/* --- publish --- */

/* Our wrapper around a producer's tensor: the library owns it and calls its
 * deleter on any thread, maybe the library's receiver thread when the
 * daemon retires the version. */
struct pubwrap {
	DLManagedTensor mt;
	DLManagedTensor *plain;
	DLManagedTensorVersioned *versioned;
};

static void pubwrap_delete(DLManagedTensor *self)
{
	struct pubwrap *p = self->manager_ctx;

	/* The producer's deleter may need Python (NumPy's does); run it with
	 * the GIL, and never while the interpreter goes away: then the
	 * producer's memory is left for the process exit to reclaim. */
	if (py_enter()) {
		PyGILState_STATE st = PyGILState_Ensure();
		int was = in_deleter;

		in_deleter = 1;
		if (p->plain && p->plain->deleter)
			p->plain->deleter(p->plain);
		if (p->versioned && p->versioned->deleter)
			p->versioned->deleter(p->versioned);
		in_deleter = was;
		PyGILState_Release(st);
		py_leave();
	}
	free(p);
}

/* Takes the tensor out of a capsule: renames it used_* so that neither its
 * destructor nor another consumer touches it. Returns 0, or -1 with an
 * exception. */
static int capsule_take(PyObject *cap, struct pubwrap *p)
{
	if (!PyCapsule_CheckExact(cap)) {
		PyErr_SetString(PyExc_TypeError, "expected a DLPack capsule");
		return -1;
	}
	if (PyCapsule_IsValid(cap, CAP_PLAIN)) {
		p->plain = PyCapsule_GetPointer(cap, CAP_PLAIN);
		p->mt.dl_tensor = p->plain->dl_tensor;
		return PyCapsule_SetName(cap, CAP_USED);
	}
	if (PyCapsule_IsValid(cap, CAP_VERSIONED)) {
		p->versioned = PyCapsule_GetPointer(cap, CAP_VERSIONED);
		if (p->versioned->version.major != 1) {
			p->versioned = NULL;
			PyErr_SetString(PyExc_BufferError,
					"unsupported DLPack major version");
			return -1;
		}
		p->mt.dl_tensor = p->versioned->dl_tensor;
		return PyCapsule_SetName(cap, CAP_VERSIONED_USED);
	}
	PyErr_SetString(PyExc_BufferError,
			"the capsule is not a dltensor, or was consumed already");
	return -1;
}

/* Gives a taken capsule back to its owner (publishing failed). */
static void capsule_untake(PyObject *cap, struct pubwrap *p)
{
	if (p->plain)
		PyCapsule_SetName(cap, CAP_PLAIN);
	else if (p->versioned)
		PyCapsule_SetName(cap, CAP_VERSIONED);
}

/* publish(name, capsules, keys, mode, no_copy, force_copy, stream) ->
 * version */
static PyObject *Client_publish(ClientObject *s, PyObject *args)
{
	const char *name;
	PyObject *caps, *keys;
	unsigned int mode;
	int no_copy, force_copy, owned = 0;
	unsigned int ttl_ms = 0;
	unsigned long long stream;
	dlshare_publish_opts o = { 0 };
	struct pubwrap **pw = NULL;
	DLManagedTensor **ts = NULL;
	const char **ckeys = NULL;
	uint64_t version = 0;
	Py_ssize_t n, taken = 0;
	PyObject *ret = NULL;
	int err;

	int queue = 0;
	unsigned int depth = 0;
	double wait = 0;
	dlshare_queue_opts q = { 0 };

	if (!PyArg_ParseTuple(args, "sO!OIppK|pIpId", &name, &PyTuple_Type,
			      &caps, &keys, &mode, &no_copy, &force_copy,
			      &stream, &owned, &ttl_ms, &queue, &depth, &wait))
		return NULL;
	q.depth = depth;
	n = PyTuple_GET_SIZE(caps);
	if (n == 0) {
		PyErr_SetString(PyExc_ValueError, "nothing to publish");
		return NULL;
	}
	if (keys != Py_None &&
	    (!PyTuple_Check(keys) || PyTuple_GET_SIZE(keys) != n)) {
		PyErr_SetString(PyExc_ValueError,
				"keys must be a tuple with one key per tensor");
		return NULL;
	}
	pw = PyMem_Calloc((size_t)n, sizeof(*pw));
	ts = PyMem_Calloc((size_t)n, sizeof(*ts));
	ckeys = keys != Py_None ? PyMem_Calloc((size_t)n, sizeof(*ckeys)) : NULL;
	if (!pw || !ts || (keys != Py_None && !ckeys)) {
		PyErr_NoMemory();
		goto out;
	}
	for (Py_ssize_t i = 0; keys != Py_None && i < n; i++) {
		/* The tuple keeps the str, and so its UTF-8, alive. */
		ckeys[i] = str_arg(PyTuple_GET_ITEM(keys, i), "a key");
		if (!ckeys[i])
			goto out;
	}
	for (; taken < n; taken++) {
		pw[taken] = calloc(1, sizeof(**pw));
		if (!pw[taken]) {
			PyErr_NoMemory();
			goto out;
		}
		if (capsule_take(PyTuple_GET_ITEM(caps, taken), pw[taken])) {
			free(pw[taken]);
			pw[taken] = NULL;
			goto out;
		}
		pw[taken]->mt.manager_ctx = pw[taken];
		pw[taken]->mt.deleter = pubwrap_delete;
		ts[taken] = &pw[taken]->mt;
	}
	o.keys = ckeys;
	o.mode = mode;
	o.ttl_ms = ttl_ms;
	o.flags = (owned ? DLSHARE_NAME_OWNED : 0) |
		  (no_copy ? DLSHARE_PUBLISH_NO_COPY :
		   force_copy ? DLSHARE_PUBLISH_COPY : 0);
	o.stream = (void *)(uintptr_t)stream;
	if (!queue) {
		GUARDED(s, err, dlshare_publish(c_, name, ts, (size_t)n, &o,
						&version));
	} else {
		/* A long wait for room goes in slices, as a get's. */
		struct publish_call pc = {
			.name = name, .ts = ts, .n = (size_t)n, .o = &o, .q = &q,
		};

		err = wait_sliced(s, wait, publish_slice, &pc);
		if (err == ERR_SIGNALLED)
			goto out;
		version = pc.version;
	}
	if (err) {
		raise_waited(err, queue ? wait : 0);
		goto out;
	}
	/* The library owns the wrappers, and they the producers' tensors. */
	taken = 0;
	ret = PyLong_FromUnsignedLongLong(version);
out:
	for (Py_ssize_t i = 0; i < taken; i++) {
		capsule_untake(PyTuple_GET_ITEM(caps, i), pw[i]);
		free(pw[i]);
	}
	PyMem_Free(pw);
	PyMem_Free(ts);
	PyMem_Free(ckeys);
	return ret;
}

/* --- create --- */

/* create(name, specs, mode[, device_type, device_id, owned, ttl_ms, queue,
 * depth, wait_s, origin_node, origin_version]) -> Writer; specs: tuple of
 * (key or None, dtype, shape). With queue, into a queue name of depth (0:
 * default), waiting up to wait_s (0: no wait, < 0: forever) for room.
 * origin_node (str or None) and origin_version: where the version was
 * mirrored from (protocol 1.5). */
static PyObject *Client_create(ClientObject *s, PyObject *args)
{
	const char *name;
	PyObject *specs;
	unsigned int mode, dev_type = kDLCPU, dev_id = 0, ttl_ms = 0;
	int owned = 0;
	dlshare_tensor_spec *sp = NULL;
	int64_t (*shapes)[NDIM_MAX] = NULL;
	dlshare_create_opts o = { .device = { kDLCPU, 0 } };
	dlshare_writer *w = NULL;
	WriterObject *wo = NULL;
	Py_ssize_t n;
	int err;

	int queue = 0;
	unsigned int depth = 0;
	double wait = 0;
	dlshare_queue_opts q = { 0 };
	const char *origin_node = NULL;
	unsigned long long origin_version = 0;

	if (!PyArg_ParseTuple(args, "sO!I|IIpIpIdzK", &name, &PyTuple_Type,
			      &specs, &mode, &dev_type, &dev_id, &owned,
			      &ttl_ms, &queue, &depth, &wait, &origin_node,
			      &origin_version))
		return NULL;
	o.origin_node = origin_node;
	o.origin_version = origin_version;
	q.depth = depth;
	n = PyTuple_GET_SIZE(specs);
	if (n == 0) {
		PyErr_SetString(PyExc_ValueError, "no tensor to create");
		return NULL;
	}
	sp = PyMem_Calloc((size_t)n, sizeof(*sp));
	shapes = PyMem_Calloc((size_t)n, sizeof(*shapes));
	if (!sp || !shapes) {
		PyErr_NoMemory();
		goto out;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *key, *shape;
		const char *dtype;
		int nd;

		if (!PyArg_ParseTuple(PyTuple_GET_ITEM(specs, i), "OsO", &key,
				      &dtype, &shape))
			goto out;
		if (key != Py_None && !(sp[i].key = str_arg(key, "a key")))
			goto out;
		if (dtype_parse(dtype, &sp[i].dtype))
			goto out;
		if ((nd = shape_parse(shape, shapes[i])) < 0)
			goto out;
		sp[i].ndim = nd;
		sp[i].shape = shapes[i];
	}
	o.mode = mode;
	o.flags = owned ? DLSHARE_NAME_OWNED : 0;
	o.ttl_ms = ttl_ms;
	o.device.device_type = (DLDeviceType)dev_type;
	o.device.device_id = (int32_t)dev_id;
	if (!queue) {
		GUARDED(s, err, dlshare_create(c_, name, sp, (size_t)n, &o,
					       &w));
	} else {
		struct create_call cc = {
			.name = name, .sp = sp, .n = (size_t)n, .o = &o, .q = &q,
		};

		err = wait_sliced(s, wait, create_slice, &cc);
		if (err == ERR_SIGNALLED)
			goto out;
		w = cc.w;
	}
	if (err) {
		raise_waited(err, queue ? wait : 0);
		goto out;
	}
	wo = PyObject_New(WriterObject, Writer_Type);
	if (wo)
		wo->ws = calloc(1, sizeof(*wo->ws));
	if (!wo || !wo->ws) {
		if (wo) {
			/* Writer_dealloc must not see a half-made one. */
			PyTypeObject *tp = Py_TYPE(wo);

			PyObject_Free(wo);
			Py_DECREF(tp);
			wo = NULL;
		}
		Py_BEGIN_ALLOW_THREADS
		writer_abort_nogil(s->g, w);
		Py_END_ALLOW_THREADS
		PyErr_NoMemory();
		goto out;
	}
	atomic_init(&wo->ws->o.refs, 1);
	atomic_init(&wo->ws->o.views, 0);
	wo->ws->o.destroy = wstate_destroy;
	wo->ws->w = w;
	wo->ws->version = dlshare_writer_version(w);
	guard_ref(s->g);
	wo->ws->g = s->g;
out:
	PyMem_Free(sp);
	PyMem_Free(shapes);
	return (PyObject *)wo;
}

/* --- get --- */


struct get_call {
	const char *name;
	dlshare_get_opts o;
	dlshare_bundle *b;
};

static int get_slice(dlshare_client *c, void *arg, int32_t timeout_ms)
{
	struct get_call *g = arg;

	g->o.timeout_ms = timeout_ms;
	return dlshare_get(c, g->name, &g->o, &g->b);
}

/* get(name, select, version, timeout_s, stream) -> Bundle. timeout_s: 0
 * no wait, < 0 forever. A wait goes in slices (wait_sliced) so that
 * Ctrl-C interrupts it at once. */
static PyObject *Client_get(ClientObject *s, PyObject *args)
{
	unsigned int select;
	unsigned long long version, stream;
	struct get_call g = { 0 };
	double timeout;
	BundleObject *bo;
	int err;

	if (!PyArg_ParseTuple(args, "sIKdK", &g.name, &select, &version,
			      &timeout, &stream))
		return NULL;
	g.o.select = select;
	g.o.version = version;
	g.o.stream = (void *)(uintptr_t)stream;
	err = wait_sliced(s, timeout, get_slice, &g);
	if (err == ERR_SIGNALLED)
		return NULL;
	if (err)
		return raise_waited(err, timeout);
	bo = PyObject_New(BundleObject, Bundle_Type);
	if (!bo) {
		dlshare_bundle_free(g.b);
		return NULL;
	}
	bo->b = g.b;
	return (PyObject *)bo;
}

struct take_call {
	const char *name;
	void *stream;
	dlshare_bundle *b;
};

static int take_slice(dlshare_client *c, void *arg, int32_t timeout_ms)
{
	struct take_call *t = arg;

	return dlshare_take(c, t->name, timeout_ms, t->stream, &t->b);
}

/* take(name, timeout_s, stream) -> Bundle: the oldest queued version of
 * a queue name, for this client alone. Waits in slices, as get. */
static PyObject *Client_take(ClientObject *s, PyObject *args)
{
	unsigned long long stream;
	struct take_call t = { 0 };
	double timeout;
	BundleObject *bo;
	int err;

	if (!PyArg_ParseTuple(args, "sdK", &t.name, &timeout, &stream))
		return NULL;
	t.stream = (void *)(uintptr_t)stream;
	err = wait_sliced(s, timeout, take_slice, &t);
	if (err == ERR_SIGNALLED)
		return NULL;
	if (err)
		return raise_waited(err, timeout);
	bo = PyObject_New(BundleObject, Bundle_Type);
	if (!bo) {
		dlshare_bundle_free(t.b);
		return NULL;
	}
	bo->b = t.b;
	return (PyObject *)bo;
}

static PyObject *queue_tuple(const dlshare_queue_info *q)
{
	return Py_BuildValue("(IIIII)", q->depth, q->queued, q->taken,
			     q->pending, q->waiting);
}

/* queue_stat(name) -> (depth, queued, taken, pending, waiting) */
static PyObject *Client_queue_stat(ClientObject *s, PyObject *args)
{
	const char *name;
	dlshare_queue_info q;
	int err;

	if (!PyArg_ParseTuple(args, "s", &name))
		return NULL;
	GUARDED(s, err, dlshare_queue_stat(c_, name, &q));
	if (err)
		return raise_code(err);
	return queue_tuple(&q);
}

/* --- delete, list, stat, stats --- */

static PyObject *Client_delete(ClientObject *s, PyObject *args)
{
	const char *name;
	int err;

	if (!PyArg_ParseTuple(args, "s", &name))
		return NULL;
	GUARDED(s, err, dlshare_delete(c_, name));
	if (err)
		return raise_code(err);
	Py_RETURN_NONE;
}

/* delete_prefix(prefix) -> (deleted, skipped) */
static PyObject *Client_delete_prefix(ClientObject *s, PyObject *args)
{
	const char *prefix;
	uint64_t deleted = 0, skipped = 0;
	int err;

	if (!PyArg_ParseTuple(args, "s", &prefix))
		return NULL;
	GUARDED(s, err, dlshare_delete_prefix(c_, prefix, &deleted, &skipped));
	if (err)
		return raise_code(err);
	return Py_BuildValue("(KK)", (unsigned long long)deleted,
			     (unsigned long long)skipped);
}

static PyObject *info_tuple(const dlshare_name_info *i)
{
	/* The origin (1.5): None for a name made here. */
	return Py_BuildValue("(sKIIKIIIiOOIIKzK)", i->name,
			     (unsigned long long)i->latest, i->versions,
			     i->tensors, (unsigned long long)i->bytes,
			     i->leases, i->owner_uid, i->mode, i->kind,
			     i->exported ? Py_True : Py_False,
			     i->owned ? Py_True : Py_False, i->owner_pid,
			     i->ttl_ms, (unsigned long long)i->expires_in_ms,
			     i->origin_node[0] ? i->origin_node : NULL,
			     (unsigned long long)i->origin_version);
}

struct infos {
	dlshare_name_info *v;
	dlshare_queue_info *q;    /* depth 0: not a queue */
	size_t n, cap;
	int nomem;
};

static int infos_add(const dlshare_name_info *info,
		     const dlshare_queue_info *queue, void *arg)
{
	struct infos *a = arg;

	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 64;
		dlshare_name_info *v = realloc(a->v, cap * sizeof(*v));
		dlshare_queue_info *q;

		if (!v) {
			a->nomem = 1;
			return 1;
		}
		a->v = v;
		q = realloc(a->q, cap * sizeof(*q));
		if (!q) {
			a->nomem = 1;
			return 1;
		}
		a->q = q;
		a->cap = cap;
	}
	if (queue)
		a->q[a->n] = *queue;
	else
		memset(&a->q[a->n], 0, sizeof(a->q[a->n]));
	a->v[a->n++] = *info;
	return 0;
}

/* list(prefix) -> [(info tuple, queue tuple or None)] */
static PyObject *Client_list(ClientObject *s, PyObject *args)
{
	const char *prefix;
	struct infos a = { 0 };
	PyObject *l = NULL;
	int err;

	if (!PyArg_ParseTuple(args, "s", &prefix))
		return NULL;
	/* The callback runs without the GIL: collect first, convert after. */
	GUARDED(s, err, dlshare_list_ex(c_, prefix, infos_add, &a));
	if (!err && a.nomem)
		err = DLSHARE_ENOMEM;
	if (err) {
		raise_code(err);
		goto out;
	}
	if (!(l = PyList_New((Py_ssize_t)a.n)))
		goto out;
	for (size_t i = 0; i < a.n; i++) {
		PyObject *t = a.q[i].depth ?
			Py_BuildValue("(NN)", info_tuple(&a.v[i]),
				      queue_tuple(&a.q[i])) :
			Py_BuildValue("(NO)", info_tuple(&a.v[i]), Py_None);

		if (!t) {
			Py_CLEAR(l);
			break;
		}
		PyList_SET_ITEM(l, (Py_ssize_t)i, t);
	}
out:
	free(a.v);
	free(a.q);
	return l;
}

/* stat(name) -> (info tuple, [(key, dtype, shape, strides, offset)]) */
static PyObject *Client_stat(ClientObject *s, PyObject *args)
{
	const char *name;
	dlshare_name_info info;
	dlshare_manifest *m = NULL;
	PyObject *l = NULL, *ret = NULL;
	size_t n;
	int err;

	if (!PyArg_ParseTuple(args, "s", &name))
		return NULL;
	GUARDED(s, err, dlshare_stat(c_, name, &info, &m));
	if (err)
		return raise_code(err);
	n = dlshare_manifest_count(m);
	if (!(l = PyList_New((Py_ssize_t)n)))
		goto out;
	for (size_t i = 0; i < n; i++) {
		const DLTensor *t = dlshare_manifest_tensor(m, i);
		PyObject *e = Py_BuildValue(
			"(sNNNK)", dlshare_manifest_key(m, i),
			dtype_str(t->dtype), int64_tuple(t->shape, t->ndim),
			t->strides ? int64_tuple(t->strides, t->ndim) :
				     Py_NewRef(Py_None),
			(unsigned long long)t->byte_offset);

		if (!e)
			goto out;
		PyList_SET_ITEM(l, (Py_ssize_t)i, e);
	}
	ret = Py_BuildValue("(NO)", info_tuple(&info), l);
out:
	Py_XDECREF(l);
	dlshare_manifest_free(m);
	return ret;
}

/* The daemon's metrics in the Prometheus text format (a str). */
static PyObject *Client_metrics(ClientObject *s, PyObject *unused)
{
	char *text = NULL;
	size_t len = 0;
	PyObject *ret;
	int err;

	GUARDED(s, err, dlshare_metrics(c_, &text, &len));
	if (err)
		return raise_code(err);
	ret = PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "strict");
	free(text);
	return ret;
}

static PyObject *Client_stats(ClientObject *s, PyObject *unused)
{
	dlshare_stats st;
	int err;

	PyObject *uids;

	GUARDED(s, err, dlshare_stats_get(c_, &st));
	if (err)
		return raise_code(err);
	if (!(uids = PyList_New(st.nuid_rows)))
		return NULL;
	for (uint32_t i = 0; i < st.nuid_rows; i++) {
		const struct dlshare_uid_stats *u = &st.uids[i];
		PyObject *d = Py_BuildValue(
			"{sIsIsKsKsKsK}", "uid", u->uid,
			"connections", u->connections,
			"names", (unsigned long long)u->names,
			"versions", (unsigned long long)u->versions,
			"bytes", (unsigned long long)u->bytes,
			"leases", (unsigned long long)u->leases);

		if (!d) {
			Py_DECREF(uids);
			return NULL;
		}
		PyList_SET_ITEM(uids, (Py_ssize_t)i, d);
	}
	return Py_BuildValue(
		"{sKsKsKsKsKsKsKsKsKsKsKsIsN}",
		"connections", (unsigned long long)st.connections,
		"names", (unsigned long long)st.names,
		"versions", (unsigned long long)st.versions,
		"leases", (unsigned long long)st.leases,
		"buffers", (unsigned long long)st.buffers,
		"bytes", (unsigned long long)st.bytes,
		"parked", (unsigned long long)st.parked,
		"requests", (unsigned long long)st.requests,
		"uptime_ms", (unsigned long long)st.uptime_ms,
		"expired", (unsigned long long)st.expired,
		"orphaned", (unsigned long long)st.orphaned,
		"nuids", st.nuids, "uids", uids);
}

static PyMethodDef Client_methods[] = {
	{ "publish", (PyCFunction)Client_publish, METH_VARARGS, NULL },
	{ "create", (PyCFunction)Client_create, METH_VARARGS, NULL },
	{ "get", (PyCFunction)Client_get, METH_VARARGS, NULL },
	{ "take", (PyCFunction)Client_take, METH_VARARGS, NULL },
	{ "queue_stat", (PyCFunction)Client_queue_stat, METH_VARARGS, NULL },
	{ "delete", (PyCFunction)Client_delete, METH_VARARGS, NULL },
	{ "delete_prefix", (PyCFunction)Client_delete_prefix, METH_VARARGS,
	  NULL },
	{ "list", (PyCFunction)Client_list, METH_VARARGS, NULL },
	{ "stat", (PyCFunction)Client_stat, METH_VARARGS, NULL },
	{ "stats", (PyCFunction)Client_stats, METH_NOARGS, NULL },
	{ "metrics", (PyCFunction)Client_metrics, METH_NOARGS, NULL },
	{ "close", (PyCFunction)Client_close, METH_NOARGS, NULL },
	{ "closed", (PyCFunction)Client_closed, METH_NOARGS, NULL },
	{ NULL },
};

static PyType_Slot Client_slots[] = {
	{ Py_tp_doc, "Client(path=None): a connection to dlshared." },
	{ Py_tp_new, Client_new },
	{ Py_tp_dealloc, Client_dealloc },
	{ Py_tp_methods, Client_methods },
	{ 0, NULL },
};

static PyType_Spec Client_spec = {
	"dlshare._dlshare.Client", sizeof(ClientObject), 0, Py_TPFLAGS_DEFAULT,
	Client_slots,
};

/* ---- module functions ----------------------------------------------------- */

/* host_alloc(cls, dtype, shape) -> an Array of cls in shareable memory */
static PyObject *mod_host_alloc(PyObject *mod, PyObject *args)
{
	PyObject *cls, *shape, *ret;
	const char *dtype;
	int64_t sh[NDIM_MAX];
	DLManagedTensor *mt;
	DLDataType dt;
	struct hstate *h;
	int nd, err;

	if (!PyArg_ParseTuple(args, "OsO", &cls, &dtype, &shape))
		return NULL;
	if (dtype_parse(dtype, &dt) || (nd = shape_parse(shape, sh)) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	err = dlshare_host_alloc(dt, nd, sh, &mt);
	Py_END_ALLOW_THREADS
	if (err)
		return raise_code(err);
	h = calloc(1, sizeof(*h));
	if (!h) {
		mt->deleter(mt);
		return PyErr_NoMemory();
	}
	atomic_init(&h->o.refs, 1);
	atomic_init(&h->o.views, 0);
	h->o.destroy = hstate_destroy;
	h->mt = mt;
	ret = array_new_of(cls, &h->o, NULL, &mt->dl_tensor);
	owner_unref(&h->o); /* the Array holds it now, or nobody */
	return ret;
}

static PyObject *mod_version(PyObject *mod, PyObject *unused)
{
	return PyUnicode_FromString(dlshare_version());
}

static PyObject *mod_socket_path(PyObject *mod, PyObject *unused)
{
	char buf[4096];

	if (dlshare_socket_path(buf, sizeof(buf)))
		return raise_code(DLSHARE_E2BIG);
	return PyUnicode_DecodeFSDefault(buf);
}

static PyObject *mod_strerror(PyObject *mod, PyObject *arg)
{
	long code = PyLong_AsLong(arg);

	if (code == -1 && PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(dlshare_strerror((int)code));
}

static PyObject *mod_is_capsule(PyObject *mod, PyObject *arg)
{
	return PyBool_FromLong(PyCapsule_CheckExact(arg));
}

static PyObject *mod_set_errors(PyObject *mod, PyObject *arg)
{
	if (!PyDict_Check(arg)) {
		PyErr_SetString(PyExc_TypeError, "expected a dict");
		return NULL;
	}
	Py_XSETREF(error_classes, Py_NewRef(arg));
	Py_RETURN_NONE;
}

static PyObject *mod_dtype_check(PyObject *mod, PyObject *arg)
{
	const char *s = str_arg(arg, "a dtype");
	DLDataType d;

	if (!s || dtype_parse(s, &d))
		return NULL;
	return dtype_str(d);
}

static PyMethodDef mod_methods[] = {
	{ "host_alloc", mod_host_alloc, METH_VARARGS,
	  "host_alloc(cls, dtype, shape) -> Array in shareable memory" },
	{ "version", mod_version, METH_NOARGS, "libdlshare's version" },
	{ "socket_path", mod_socket_path, METH_NOARGS,
	  "the default socket path" },
	{ "strerror", mod_strerror, METH_O, "the message of an error code" },
	{ "is_capsule", mod_is_capsule, METH_O, "whether arg is a PyCapsule" },
	{ "buffer_capsule", mod_buffer_capsule, METH_O,
	  "a dltensor capsule over an object's buffer (protocol)" },
	{ "dtype_check", mod_dtype_check, METH_O,
	  "the canonical name of a dtype, or ValueError" },
	{ "_set_errors", mod_set_errors, METH_O,
	  "sets the exception classes by error code" },
	{ "_at_exit", at_exit, METH_NOARGS,
	  "stops deleters from entering Python (registered with atexit)" },
	{ NULL },
};

static struct PyModuleDef moddef = {
	PyModuleDef_HEAD_INIT,
	.m_name = "_dlshare",
	.m_doc = "The C side of dlshare; use the dlshare package instead.",
	.m_size = -1,
	.m_methods = mod_methods,
};

static PyTypeObject *add_type(PyObject *m, PyType_Spec *spec, const char *name)
{
	PyObject *t = PyType_FromSpec(spec);

	if (!t || PyModule_AddObjectRef(m, name, t)) {
		Py_XDECREF(t);
		return NULL;
	}
	return (PyTypeObject *)t; /* the static pointer keeps this ref */
}

PyMODINIT_FUNC PyInit__dlshare(void);

PyMODINIT_FUNC PyInit__dlshare(void)
{
	PyObject *m = PyModule_Create(&moddef), *atexit, *r, *fn;

	if (!m)
		return NULL;
	if (!(Array_Type = add_type(m, &Array_spec, "Array")) ||
	    !(Bundle_Type = add_type(m, &Bundle_spec, "Bundle")) ||
	    !(Writer_Type = add_type(m, &Writer_spec, "Writer")) ||
	    !(Client_Type = add_type(m, &Client_spec, "Client")))
		goto fail;
	if (PyModule_AddIntConstant(m, "DLPACK_MAJOR", DLPACK_MAJOR_VERSION) ||
	    PyModule_AddIntConstant(m, "DLPACK_MINOR", DLPACK_MINOR_VERSION))
		goto fail;
	/* Deleters must stop entering Python before it finalizes. */
	if (!(atexit = PyImport_ImportModule("atexit")))
		goto fail;
	fn = PyObject_GetAttrString(m, "_at_exit");
	r = fn ? PyObject_CallMethod(atexit, "register", "O", fn) : NULL;
	Py_XDECREF(fn);
	Py_DECREF(atexit);
	if (!r)
		goto fail;
	Py_DECREF(r);
	return m;
fail:
	Py_DECREF(m);
	return NULL;
}
