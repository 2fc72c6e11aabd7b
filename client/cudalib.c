/* cudalib — CUDA loaded at run time; IPC memory and events. */
#include "cudalib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef DLSHARE_HAVE_CUDA

#include <cuda.h>

#include "cudaload.h"
#include "internal.h" /* errmsg_set */
#include <stdio.h>

#define CUDA_MAX_DEVICES 64
/* Imported events kept open, so a consumer that gets version after version
 * of a name opens each producer event once. Evicted entries are destroyed. */
#define CUDA_EVENT_CACHE 256
/* Interprocess events of retired versions kept for the next publish or seal
 * (so consumers find them in their caches); beyond this many they are
 * destroyed. */
#define CUDA_EVENT_POOL 64
/* Live interprocess events of ours (each live version's, and the pooled
 * ones) at most: the driver limits them (where is not documented), so
 * the library stays well below that. Beyond, a version is sealed with no
 * event: the host waits for the producer's stream first, so the data is
 * complete when a consumer sees it. DLSHARE_CUDA_IPC_EVENTS sets it. */
#define CUDA_IPC_EVENTS_DEFAULT 1024

/* The ABI asked of cuGetProcAddress: CUDA 12.0's, which every driver
 * since 525 has. For each base name the driver then hands out the newest
 * variant of 12.0 (cuIpcOpenMemHandle_v2, cuStreamGetCtx without green
 * contexts), which is the one this file's CUDA 13 header declares. */
#define CUDA_ABI 12000

/* The driver functions used, by base name: the type comes from the
 * header's prototype (its macro names the versioned symbol, e.g.
 * cuEventDestroy_v2), the function from cuGetProcAddress. */
#define CUDA_FUNCS(X)                                               \
	X(cuInit)                                                   \
	X(cuDeviceGetCount)                                         \
	X(cuDeviceGet)                                              \
	X(cuDeviceGetUuid)                                          \
	X(cuDeviceGetAttribute)                                     \
	X(cuDevicePrimaryCtxRetain)                                 \
	X(cuDevicePrimaryCtxGetState)                               \
	X(cuCtxGetCurrent)                                          \
	X(cuCtxSetCurrent)                                          \
	X(cuCtxGetDevice)                                           \
	X(cuStreamGetCtx)                                           \
	X(cuStreamCreate)                                           \
	X(cuStreamDestroy)                                          \
	X(cuStreamSynchronize)                                      \
	X(cuStreamWaitEvent)                                        \
	X(cuEventCreate)                                            \
	X(cuEventRecord)                                            \
	X(cuEventQuery)                                             \
	X(cuEventSynchronize)                                       \
	X(cuEventDestroy)                                           \
	X(cuIpcGetEventHandle)                                      \
	X(cuIpcOpenEventHandle)                                     \
	X(cuIpcGetMemHandle)                                        \
	X(cuIpcOpenMemHandle)                                       \
	X(cuIpcCloseMemHandle)                                      \
	X(cuPointerGetAttribute)                                    \
	X(cuMemGetAddressRange)                                     \
	X(cuMemcpyDtoDAsync)                                        \
	X(cuMemHostRegister)                                        \
	X(cuMemHostUnregister)                                      \
	X(cuMemImportFromShareableHandle)                           \
	X(cuMemAddressReserve)                                      \
	X(cuMemAddressFree)                                         \
	X(cuMemMap)                                                 \
	X(cuMemUnmap)                                               \
	X(cuMemSetAccess)                                           \
	X(cuMemRelease)

static struct {
#define DECLARE(fn) __typeof__(&fn) fn;
	CUDA_FUNCS(DECLARE)
#undef DECLARE
	void *drv;
	int ndev;
	CUdevice dev[CUDA_MAX_DEVICES];
	uint8_t uuids[CUDA_MAX_DEVICES][CUDA_UUID_BYTES];
	const char *why;
} cu;

/* Loading: once it succeeded, for good (loaded, then cu is read without
 * a lock); a failure is tried again by a later call, at most every
 * CUDA_LOAD_RETRY_NS (a driver that comes up after the process, a
 * DLSHARE_CUDA_DRIVER set later, a device freed by another process), never
 * cached for the life of the process. */
#define CUDA_LOAD_RETRY_NS 1000000000LL
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int loaded;
static int64_t load_tried_ns = -1;
/* Live interprocess events of ours, and their cap. */
static atomic_long ipc_events_live;
static long ipc_events_max = CUDA_IPC_EVENTS_DEFAULT;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* An event of this module: one we record for a version (interprocess,
 * pooled), a release marker, or a chain (plain). It lives in ctx, where
 * every call on it is made. */
struct cuda_event {
	CUevent ev;
	CUcontext ctx;
	int ipc;
	int ordinal;             /* ipc: the device it was recorded on */
	uint8_t handle[CUDA_IPC_HANDLE_BYTES]; /* ipc: its handle */
	struct cuda_event *next; /* a version's events per device: the next
				  * device's (cuda_event_free and
				  * cuda_event_wait take the whole group) */
};

struct event_entry {
	uint8_t handle[CUDA_IPC_HANDLE_BYTES];
	CUevent ev;
	CUcontext ctx;           /* where it was opened */
	int used;
};
static struct event_entry events[CUDA_EVENT_CACHE];
static unsigned event_next;

/* Our own events no live version names any more; each is reused only in
 * its own context (an event records only on a stream of its context). */
static struct cuda_event *pool[CUDA_EVENT_POOL];
static unsigned npool;

/* Opened memory handles: CUDA refuses to open one twice in a process, and
 * many versions (buffers) may name one allocation. */
struct mem_entry {
	uint8_t handle[CUDA_IPC_HANDLE_BYTES];
	void *base;
	int ordinal;
	int refs;
	int own;                 /* our own allocation: nothing to close */
	struct mem_entry *next;
};
static struct mem_entry *mems;
static unsigned long mems_open, mems_opened_total;

/* What this process exported itself: CUDA refuses to open our own handles,
 * so a consumer in the producer's process gets the pointer (or the event)
 * directly. */
struct own_entry {
	uint8_t handle[CUDA_IPC_HANDLE_BYTES];
	void *ptr;               /* allocation base, or the CUevent */
	int refs;
	struct own_entry *next;
};
static struct own_entry *own;

/* The primary context of each device this process used through us,
 * retained for the life of the process, and a stream of the library's on
 * it (non-blocking: it never orders anyone else's work). Under ctx_lock. */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary[CUDA_MAX_DEVICES];
static CUstream lib_stream[CUDA_MAX_DEVICES];

/* Under cache_lock. */
static struct own_entry *own_find(const uint8_t *handle)
{
	for (struct own_entry *o = own; o; o = o->next)
		if (memcmp(o->handle, handle, CUDA_IPC_HANDLE_BYTES) == 0)
			return o;
	return NULL;
}

static int own_add(const uint8_t *handle, void *ptr)
{
	struct own_entry *o;
	int err = 0;

	pthread_mutex_lock(&cache_lock);
	o = own_find(handle);
	if (o) {
		o->refs++;
	} else if ((o = calloc(1, sizeof(*o)))) {
		memcpy(o->handle, handle, CUDA_IPC_HANDLE_BYTES);
		o->ptr = ptr;
		o->refs = 1;
		o->next = own;
		own = o;
	} else {
		err = DLSHARE_ENOMEM;
	}
	pthread_mutex_unlock(&cache_lock);
	return err;
}

static void own_del(const uint8_t *handle)
{
	pthread_mutex_lock(&cache_lock);
	for (struct own_entry **pp = &own; *pp; pp = &(*pp)->next) {
		struct own_entry *o = *pp;

		if (memcmp(o->handle, handle, CUDA_IPC_HANDLE_BYTES) == 0) {
			if (--o->refs == 0) {
				*pp = o->next;
				free(o);
			}
			break;
		}
	}
	pthread_mutex_unlock(&cache_lock);
}

void cuda_unexport_alloc(const uint8_t handle[CUDA_IPC_HANDLE_BYTES])
{
	own_del(handle);
}

/* Loads the driver, and only the driver: libcuda.so.1 is the one
 * ABI-stable library every driver ships, and a process's framework brings
 * its own runtime (of any version), which must not meet a second one. Its
 * functions come from cuGetProcAddress, asked for CUDA_ABI. Touches no
 * context: device counts and UUIDs are the driver's, and cuInit creates
 * none. */
static void load(void)
{
	__typeof__(&cuGetProcAddress) getproc;
	CUdriverProcAddressQueryResult found;

	const char *cap = getenv("DLSHARE_CUDA_IPC_EVENTS");

	if (cap && *cap) {
		char *end;
		long v = strtol(cap, &end, 10);

		if (*end == '\0' && v > 0)
			ipc_events_max = v;
	}
	cu.drv = cudaload_driver();
	if (!cu.drv) {
		cu.why = "the CUDA driver library (libcuda.so.1) cannot be "
			 "loaded";
		return;
	}
	CUDALOAD_SYM(cu.drv, getproc, cuGetProcAddress, "the CUDA driver",
		     cu.why);
	/* #fn is the base name, before the header's macro makes it the
	 * versioned symbol. */
#define LOAD(fn)                                                        \
	if (getproc(#fn, (void **)&cu.fn, CUDA_ABI,                     \
		    CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found) !=       \
	    CUDA_SUCCESS || !cu.fn) {                                   \
		cu.why = "the CUDA driver lacks " #fn " (CUDA 12.0 or "  \
			 "newer is needed)";                            \
		return;                                                 \
	}
	CUDA_FUNCS(LOAD)
#undef LOAD
	if (cu.cuInit(0) != CUDA_SUCCESS ||
	    cu.cuDeviceGetCount(&cu.ndev) != CUDA_SUCCESS || cu.ndev <= 0) {
		cu.ndev = 0;
		cu.why = "no CUDA device or driver";
		return;
	}
	if (cu.ndev > CUDA_MAX_DEVICES)
		cu.ndev = CUDA_MAX_DEVICES;
	for (int i = 0; i < cu.ndev; i++) {
		CUuuid u;

		if (cu.cuDeviceGet(&cu.dev[i], i) != CUDA_SUCCESS ||
		    cu.cuDeviceGetUuid(&u, cu.dev[i]) != CUDA_SUCCESS) {
			cu.ndev = 0;
			cu.why = "cannot read the devices' UUIDs";
			return;
		}
		memcpy(cu.uuids[i], u.bytes, CUDA_UUID_BYTES);
	}
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int cuda_available(const char **why)
{
	const char *w;
	int64_t now;

	if (atomic_load_explicit(&loaded, memory_order_acquire)) {
		if (why)
			*why = "";
		return 0;
	}
	pthread_mutex_lock(&load_lock);
	now = now_ns();
	if (!atomic_load_explicit(&loaded, memory_order_relaxed) &&
	    (load_tried_ns < 0 || now - load_tried_ns >= CUDA_LOAD_RETRY_NS)) {
		load_tried_ns = now;
		/* A failed try's library stays open (closing a driver that
		 * ran cuInit is not safe); dlopen hands it back counted. */
		memset(&cu, 0, sizeof(cu));
		load();
		if (cu.ndev > 0)
			atomic_store_explicit(&loaded, 1, memory_order_release);
	}
	w = cu.why;
	pthread_mutex_unlock(&load_lock);
	if (atomic_load_explicit(&loaded, memory_order_acquire)) {
		if (why)
			*why = "";
		return 0;
	}
	if (why)
		*why = w ? w : "";
	return DLSHARE_ENOTSUP;
}

/* ---- contexts ------------------------------------------------------------ */

/* The primary context of device ordinal, retained the first time (which
 * creates it when the process has none there yet: only ever for a device
 * the caller named). Returns 0, or DLSHARE_ENODEV (no such device, or one
 * that takes no context of ours: compute mode). */
static int primary_ctx(int ordinal, CUcontext *out)
{
	CUcontext c;

	if (ordinal < 0 || ordinal >= cu.ndev)
		return DLSHARE_ENODEV;
	pthread_mutex_lock(&ctx_lock);
	c = primary[ordinal];
	if (!c && cu.cuDevicePrimaryCtxRetain(&c, cu.dev[ordinal]) ==
	    CUDA_SUCCESS)
		primary[ordinal] = c;
	pthread_mutex_unlock(&ctx_lock);
	if (!c)
		return DLSHARE_ENODEV;
	*out = c;
	return 0;
}

static int is_primary(CUcontext c)
{
	int yes = 0;

	pthread_mutex_lock(&ctx_lock);
	for (int i = 0; i < cu.ndev && !yes; i++)
		yes = c && primary[i] == c;
	pthread_mutex_unlock(&ctx_lock);
	return yes;
}

/* What was current before ctx_enter, to put back exactly. */
struct ctx_saved {
	CUcontext prev;
	int switched;
};

/* Makes ctx current on this thread, remembering what was (NULL
 * included). Returns 0 or DLSHARE_EIO. */
static int ctx_enter(CUcontext ctx, struct ctx_saved *sv)
{
	sv->switched = 0;
	if (cu.cuCtxGetCurrent(&sv->prev) != CUDA_SUCCESS)
		return DLSHARE_EIO;
	if (sv->prev == ctx)
		return 0;
	if (cu.cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
		return DLSHARE_EIO;
	sv->switched = 1;
	return 0;
}

static void ctx_leave(struct ctx_saved *sv)
{
	if (sv->switched)
		cu.cuCtxSetCurrent(sv->prev);
	sv->switched = 0;
}

/* Device ordinal of context c, or -1. */
static int ctx_ordinal(CUcontext c)
{
	struct ctx_saved sv;
	CUdevice d;
	int ord = -1;

	if (ctx_enter(c, &sv))
		return -1;
	if (cu.cuCtxGetDevice(&d) == CUDA_SUCCESS)
		for (int i = 0; i < cu.ndev; i++)
			if (cu.dev[i] == d)
				ord = i;
	ctx_leave(&sv);
	return ord;
}

/* Notes c as a primary context of ours when it is its device's, already
 * created (retaining it then creates nothing), so that its events pool. */
static void note_primary(CUcontext c)
{
	int ord = ctx_ordinal(c);
	unsigned flags;
	int active;
	CUcontext p;

	if (ord < 0)
		return;
	pthread_mutex_lock(&ctx_lock);
	p = primary[ord];
	pthread_mutex_unlock(&ctx_lock);
	if (!p && cu.cuDevicePrimaryCtxGetState(cu.dev[ord], &flags, &active) ==
	    CUDA_SUCCESS && active)
		primary_ctx(ord, &p);
}

/* Enters device ordinal's primary context. */
static int dev_enter(int ordinal, struct ctx_saved *sv)
{
	CUcontext c;
	int err = primary_ctx(ordinal, &c);

	return err ? err : ctx_enter(c, sv);
}

/* DLPack stream values: NULL and 1 the legacy default stream, 2 the
 * per-thread default stream, anything else a CUstream (what a
 * cudaStream_t is). */
static int special_stream(void *s)
{
	return s == NULL || s == (void *)1 || s == (void *)2;
}

static CUstream stream_of(void *s)
{
	if (s == NULL || s == (void *)1)
		return CU_STREAM_LEGACY;
	if (s == (void *)2)
		return CU_STREAM_PER_THREAD;
	return (CUstream)s;
}

/* The context stream lives in: a created stream's own; for the legacy and
 * per-thread streams, device ordinal's (the current context when it is on
 * that device, which is whose default stream the caller means; else the
 * primary one). Returns 0 or a DLSHARE_E* code. */
static int stream_ctx(void *stream, int ordinal, CUcontext *out)
{
	CUcontext cur = NULL;
	CUdevice d;

	if (stream == DLSHARE_STREAM_NONE)
		return DLSHARE_EINVAL;
	if (!special_stream(stream)) {
		if (cu.cuStreamGetCtx((CUstream)stream, out) != CUDA_SUCCESS)
			return DLSHARE_EINVAL;
		note_primary(*out);
		return 0;
	}
	if (cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur &&
	    cu.cuCtxGetDevice(&d) == CUDA_SUCCESS && ordinal >= 0 &&
	    ordinal < cu.ndev && d == cu.dev[ordinal]) {
		note_primary(cur);
		*out = cur;
		return 0;
	}
	return primary_ctx(ordinal, out);
}

/* The library's stream on device ordinal, made in its primary context
 * (which the caller entered). Returns it or NULL. */
static CUstream lib_stream_get(int ordinal)
{
	CUstream s;

	pthread_mutex_lock(&ctx_lock);
	s = lib_stream[ordinal];
	if (!s) {
		if (cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) !=
		    CUDA_SUCCESS)
			s = NULL;
		lib_stream[ordinal] = s;
	}
	pthread_mutex_unlock(&ctx_lock);
	return s;
}

/* ---- our events ------------------------------------------------------------ */

/* A new event in the current context, which is ctx. */
static struct cuda_event *event_new(CUcontext ctx, int ipc)
{
	struct cuda_event *e = calloc(1, sizeof(*e));
	unsigned flags = CU_EVENT_DISABLE_TIMING |
			 (ipc ? CU_EVENT_INTERPROCESS : 0);

	if (!e)
		return NULL;
	if (cu.cuEventCreate(&e->ev, flags) != CUDA_SUCCESS) {
		free(e);
		return NULL;
	}
	e->ctx = ctx;
	e->ipc = ipc;
	return e;
}

/* Destroys e in its context. A context that cannot be entered any more
 * was destroyed, and its events with it. */
static void event_destroy(struct cuda_event *e)
{
	struct ctx_saved sv;

	if (!e)
		return;
	if (ctx_enter(e->ctx, &sv) == 0) {
		cu.cuEventDestroy(e->ev);
		ctx_leave(&sv);
	}
	if (e->ipc)
		atomic_fetch_sub(&ipc_events_live, 1);
	free(e);
}

/* A new interprocess event in ctx (current), within the cap: at the cap a
 * pooled event of another context makes room. NULL beyond the cap, or
 * when the driver refuses one (its own limit). */
static struct cuda_event *ipc_event_new(CUcontext ctx)
{
	struct cuda_event *e, *victim = NULL;

	if (atomic_fetch_add(&ipc_events_live, 1) >= ipc_events_max) {
		pthread_mutex_lock(&cache_lock);
		if (npool)
			victim = pool[--npool];
		pthread_mutex_unlock(&cache_lock);
		/* Counted until destroyed: the count stays ours. */
		if (victim) {
			event_destroy(victim);
		} else {
			atomic_fetch_sub(&ipc_events_live, 1);
			return NULL;
		}
	}
	e = event_new(ctx, 1);
	if (!e)
		atomic_fetch_sub(&ipc_events_live, 1);
	return e;
}

/* Joins the legacy (or per-thread) streams of devices ordinals[1..n-1]
 * into js, a stream of ordinals[0]'s primary context, which is current:
 * js then waits for what each device's stream queued so far. Returns 0 or
 * a DLSHARE_E* code. */
static int join_devices(void *stream, const int *ordinals, size_t n,
			CUstream js)
{
	for (size_t i = 0; i < n; i++) {
		struct ctx_saved sv;
		struct cuda_event *m = NULL;
		CUcontext c;
		int err;

		if ((err = stream_ctx(stream, ordinals[i], &c)) ||
		    (err = ctx_enter(c, &sv)))
			return err;
		m = event_new(c, 0);
		if (m && cu.cuEventRecord(m->ev, stream_of(stream)) !=
		    CUDA_SUCCESS)
			err = DLSHARE_EINVAL;
		ctx_leave(&sv);
		if (!m)
			return DLSHARE_ENOMEM;
		/* Waits cross devices: from js's context, which is current. */
		if (!err && cu.cuStreamWaitEvent(js, m->ev, 0) != CUDA_SUCCESS)
			err = DLSHARE_EINVAL;
		/* Destroying an event whose record is queued is allowed: it
		 * goes once the record completed. */
		event_destroy(m);
		if (err)
			return err;
	}
	return 0;
}

/* A pooled interprocess event of ctx, or NULL. */
static struct cuda_event *pool_take(CUcontext ctx)
{
	struct cuda_event *e = NULL;

	pthread_mutex_lock(&cache_lock);
	for (unsigned i = npool; i-- > 0;)
		if (pool[i]->ctx == ctx) {
			e = pool[i];
			pool[i] = pool[--npool];
			break;
		}
	pthread_mutex_unlock(&cache_lock);
	return e;
}

/* One interprocess event per device, each recorded on that device's
 * default stream (stream is the legacy or per-thread one): a group, as
 * one *evp. With no event to be had for one of them, none: the host waits
 * for every device's stream instead (*evp NULL). */
static int record_each(void *stream, const int *ordinals, size_t n,
		       void **evp)
{
	struct cuda_event *head = NULL, **tail = &head;
	CUipcEventHandle h;
	int err = 0, none = 0;

	for (size_t i = 0; i < n && !err && !none; i++) {
		struct cuda_event *e;
		struct ctx_saved sv;
		CUcontext ctx;

		if ((err = stream_ctx(stream, ordinals[i], &ctx)) ||
		    (err = ctx_enter(ctx, &sv)))
			break;
		e = pool_take(ctx);
		if (!e)
			e = ipc_event_new(ctx);
		if (!e) {
			none = 1;
		} else if (cu.cuEventRecord(e->ev, stream_of(stream)) !=
			   CUDA_SUCCESS ||
			   cu.cuIpcGetEventHandle(&h, e->ev) != CUDA_SUCCESS) {
			err = DLSHARE_EINVAL;
			event_destroy(e);
		} else {
			memcpy(e->handle, h.reserved, CUDA_IPC_HANDLE_BYTES);
			e->ordinal = ordinals[i];
			if ((err = own_add(e->handle, e->ev))) {
				event_destroy(e);
			} else {
				*tail = e;
				tail = &e->next;
			}
		}
		ctx_leave(&sv);
	}
	if (err || none) {
		cuda_event_free(head);
		head = NULL;
	}
	/* Late, never early: the host waits for every device's stream. */
	for (size_t i = 0; i < n && none && !err; i++) {
		struct ctx_saved sv;
		CUcontext ctx;

		if ((err = stream_ctx(stream, ordinals[i], &ctx)) ||
		    (err = ctx_enter(ctx, &sv)))
			break;
		if (cu.cuStreamSynchronize(stream_of(stream)) != CUDA_SUCCESS)
			err = DLSHARE_EIO;
		ctx_leave(&sv);
	}
	*evp = head;
	return err;
}

size_t cuda_event_handles(void *ev, int *ordinals,
			  uint8_t (*handles)[CUDA_IPC_HANDLE_BYTES], size_t max)
{
	size_t n = 0;

	for (struct cuda_event *e = ev; e && n < max; e = e->next, n++) {
		ordinals[n] = e->ordinal;
		memcpy(handles[n], e->handle, CUDA_IPC_HANDLE_BYTES);
	}
	return n;
}

int cuda_event_record(void *stream, const int *ordinals, size_t n,
		      int per_device, void **evp,
		      uint8_t handle[CUDA_IPC_HANDLE_BYTES])
{
	struct cuda_event *e = NULL;
	CUstream on = stream_of(stream);
	CUipcEventHandle h;
	struct ctx_saved sv;
	CUcontext ctx;
	int err;

	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	if (n == 0)
		return DLSHARE_EINVAL;
	*evp = NULL;
	/* Several devices behind the default streams, and a daemon that
	 * relays an event per device (1.4): one on each device's stream. */
	if (n > 1 && special_stream(stream) && per_device) {
		err = record_each(stream, ordinals, n, evp);
		if (!err && *evp)
			memcpy(handle, ((struct cuda_event *)*evp)->handle,
			       CUDA_IPC_HANDLE_BYTES);
		return err;
	}
	/* Else the event goes on the
	 * library's stream of the first device, made to wait for every
	 * device's default stream. One explicit stream names where all the
	 * writes were queued. */
	if (n > 1 && special_stream(stream))
		err = primary_ctx(ordinals[0], &ctx);
	else
		err = stream_ctx(stream, ordinals[0], &ctx);
	if (err || (err = ctx_enter(ctx, &sv)))
		return err;
	if (n > 1 && special_stream(stream)) {
		on = lib_stream_get(ordinals[0]);
		err = on ? join_devices(stream, ordinals, n, on) : DLSHARE_ENOMEM;
		if (err)
			goto out;
	}
	/* A pooled event is named by no live version: it may be recorded
	 * again (consumers that still have it open wait on the newest
	 * record, as of their wait). Only one of this context will do. */
	e = pool_take(ctx);
	if (!e && !(e = ipc_event_new(ctx))) {
		/* No event to be had (the cap, ours or the driver's): the
		 * host waits for the writes instead, and the version goes
		 * without one. Late, never early. */
		if (cu.cuStreamSynchronize(on) != CUDA_SUCCESS)
			err = DLSHARE_EIO;
		*evp = NULL;
		goto out;
	}
	if (cu.cuEventRecord(e->ev, on) != CUDA_SUCCESS ||
	    cu.cuIpcGetEventHandle(&h, e->ev) != CUDA_SUCCESS) {
		err = DLSHARE_EINVAL;
		goto out;
	}
	memcpy(e->handle, h.reserved, CUDA_IPC_HANDLE_BYTES);
	memcpy(handle, h.reserved, CUDA_IPC_HANDLE_BYTES);
	e->ordinal = ordinals[0];
	if ((err = own_add(handle, e->ev)))
		goto out;
	*evp = e;
	e = NULL;
out:
	ctx_leave(&sv);
	event_destroy(e);
	return err;
}

void cuda_event_free(void *ev)
{
	struct cuda_event *e = ev, *next;
	int pooled = 0;

	if (!e || cuda_available(NULL))
		return;
	/* A group: each device's event goes its own way. */
	next = e->next;
	e->next = NULL;
	if (next)
		cuda_event_free(next);
	own_del(e->handle);
	/* Pooled only in a primary context of ours: those live as long as
	 * the process, while an application's own context may be destroyed
	 * with its events. */
	if (is_primary(e->ctx)) {
		pthread_mutex_lock(&cache_lock);
		if (npool < CUDA_EVENT_POOL) {
			pool[npool++] = e;
			pooled = 1;
		}
		pthread_mutex_unlock(&cache_lock);
	}
	if (!pooled)
		event_destroy(e);
}

void cuda_event_pool_drain(void)
{
	struct cuda_event *out[CUDA_EVENT_POOL];
	CUstream ls[CUDA_MAX_DEVICES];
	unsigned n;

	/* Never the first CUDA call of a process: a process that forks
	 * after its first CUDA call has children that cannot use CUDA. An
	 * event in the pool, or a stream of ours, means CUDA is loaded. */
	pthread_mutex_lock(&cache_lock);
	n = npool;
	memcpy(out, pool, n * sizeof(*out));
	npool = 0;
	pthread_mutex_unlock(&cache_lock);
	for (unsigned i = 0; i < n; i++)
		event_destroy(out[i]);
	pthread_mutex_lock(&ctx_lock);
	memcpy(ls, lib_stream, sizeof(ls));
	memset(lib_stream, 0, sizeof(lib_stream));
	pthread_mutex_unlock(&ctx_lock);
	for (int i = 0; i < CUDA_MAX_DEVICES; i++) {
		struct ctx_saved sv;

		/* Like an event, a stream may be destroyed with work queued. */
		if (ls[i] && dev_enter(i, &sv) == 0) {
			cu.cuStreamDestroy(ls[i]);
			ctx_leave(&sv);
		}
	}
}

/* ---- devices and memory ------------------------------------------------------- */

int cuda_ordinal(const uint8_t uuid[CUDA_UUID_BYTES])
{
	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	for (int i = 0; i < cu.ndev; i++)
		if (memcmp(cu.uuids[i], uuid, CUDA_UUID_BYTES) == 0)
			return i;
	return DLSHARE_ENODEV;
}

int cuda_uuid(int ordinal, uint8_t uuid[CUDA_UUID_BYTES])
{
	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	if (ordinal < 0 || ordinal >= cu.ndev)
		return DLSHARE_ENODEV;
	memcpy(uuid, cu.uuids[ordinal], CUDA_UUID_BYTES);
	return 0;
}

int cuda_export_alloc(const void *p, struct cuda_alloc *out)
{
	CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)p, base;
	unsigned int type = 0;
	int ordinal = -1, managed = 0, err = 0;
	CUipcMemHandle h;
	struct ctx_saved sv;
	CUresult e;
	size_t size;

	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	/* Pointer attributes need no context: a unified address says where
	 * it lives. Managed memory is not legacy-IPC memory: the caller
	 * copies it. */
	if (cu.cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED,
				     ptr) == CUDA_SUCCESS && managed)
		return DLSHARE_ECOPY;
	if (cu.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
				     ptr) != CUDA_SUCCESS ||
	    type != CU_MEMORYTYPE_DEVICE ||
	    cu.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
				     ptr) != CUDA_SUCCESS ||
	    ordinal < 0 || ordinal >= cu.ndev)
		return DLSHARE_EINVAL;
	if ((err = dev_enter(ordinal, &sv)))
		return err;
	if (cu.cuMemGetAddressRange(&base, &size, ptr) != CUDA_SUCCESS) {
		ctx_leave(&sv);
		return DLSHARE_ECOPY;
	}
	/* Pool and VMM allocations refuse legacy IPC: the caller copies. */
	e = cu.cuIpcGetMemHandle(&h, base);
	ctx_leave(&sv);
	if (e != CUDA_SUCCESS)
		return DLSHARE_ECOPY;
	out->base = (uintptr_t)base;
	out->size = size;
	out->ordinal = ordinal;
	memcpy(out->uuid, cu.uuids[ordinal], CUDA_UUID_BYTES);
	memcpy(out->handle, h.reserved, CUDA_IPC_HANDLE_BYTES);
	/* Undone by cuda_unexport_alloc() when the version is retired. */
	return own_add(out->handle, (void *)(uintptr_t)base);
}

int cuda_open_mem(const uint8_t handle[CUDA_IPC_HANDLE_BYTES], int ordinal,
		  void **base)
{
	CUipcMemHandle h;
	struct mem_entry *m;
	struct ctx_saved sv;
	CUdeviceptr dp = 0;
	CUresult e;
	int err = 0;

	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	pthread_mutex_lock(&cache_lock);
	for (m = mems; m; m = m->next)
		if (memcmp(m->handle, handle, CUDA_IPC_HANDLE_BYTES) == 0)
			break;
	if (m) {
		m->refs++;
		*base = m->base;
		goto out;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		err = DLSHARE_ENOMEM;
		goto out;
	}
	struct own_entry *o = own_find(handle);
	if (o) {
		m->own = 1;
		m->base = o->ptr;
		goto opened;
	}
	memcpy(h.reserved, handle, CUDA_IPC_HANDLE_BYTES);
	if ((err = dev_enter(ordinal, &sv))) {
		free(m);
		goto out;
	}
	e = cu.cuIpcOpenMemHandle(&dp, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	ctx_leave(&sv);
	if (e != CUDA_SUCCESS) {
		char why[256];

		/* A legacy handle names its exporter by pid and shares through
		 * /dev/shm: the usual cause is a container boundary, which the
		 * bare CUDA error does not tell (docs/containers.md). */
		snprintf(why, sizeof(why), "cuIpcOpenMemHandle failed (CUDA "
			 "error %d): is the consumer in another PID/IPC "
			 "namespace than the producer? legacy CUDA IPC needs a "
			 "shared PID namespace (docker --pid=host --ipc=host); "
			 "use cuda-vmm", (int)e);
		errmsg_set(why);
		free(m);
		err = DLSHARE_EINVAL;
		goto out;
	}
	m->base = (void *)(uintptr_t)dp;
opened:
	memcpy(m->handle, handle, CUDA_IPC_HANDLE_BYTES);
	m->ordinal = ordinal;
	m->refs = 1;
	m->next = mems;
	mems = m;
	mems_open++;
	mems_opened_total++;
	*base = m->base;
out:
	pthread_mutex_unlock(&cache_lock);
	return err;
}

void cuda_close_mem(void *base, int ordinal)
{
	struct mem_entry **pp, *m = NULL;
	struct ctx_saved sv;

	if (cuda_available(NULL))
		return;
	pthread_mutex_lock(&cache_lock);
	for (pp = &mems; *pp; pp = &(*pp)->next)
		if ((*pp)->base == base) {
			m = *pp;
			break;
		}
	if (m && --m->refs == 0) {
		*pp = m->next;
		mems_open--;
		if (!m->own && dev_enter(m->ordinal, &sv) == 0) {
			cu.cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)m->base);
			ctx_leave(&sv);
		}
		free(m);
	}
	pthread_mutex_unlock(&cache_lock);
	(void)ordinal;
}

void cuda_cache_stats(unsigned long *open_now, unsigned long *opened_total)
{
	pthread_mutex_lock(&cache_lock);
	*open_now = mems_open;
	*opened_total = mems_opened_total;
	pthread_mutex_unlock(&cache_lock);
}

/* ---- consumers' waits ----------------------------------------------------------- */

/* The open event of handle, opening (and caching) it the first time, in
 * ctx, which is current. Under cache_lock. */
static int event_open(const uint8_t *handle, CUcontext ctx, CUevent *out)
{
	CUipcEventHandle h;
	struct event_entry *e;
	struct own_entry *o = own_find(handle);

	if (o) {
		*out = (CUevent)o->ptr;
		return 0;
	}
	for (unsigned i = 0; i < CUDA_EVENT_CACHE; i++)
		if (events[i].used &&
		    memcmp(events[i].handle, handle, CUDA_IPC_HANDLE_BYTES) == 0) {
			*out = events[i].ev;
			return 0;
		}
	memcpy(h.reserved, handle, CUDA_IPC_HANDLE_BYTES);
	e = &events[event_next++ % CUDA_EVENT_CACHE];
	if (e->used) {
		struct ctx_saved sv;

		if (ctx_enter(e->ctx, &sv) == 0) {
			cu.cuEventDestroy(e->ev);
			ctx_leave(&sv);
		}
		e->used = 0;
	}
	if (cu.cuIpcOpenEventHandle(&e->ev, h) != CUDA_SUCCESS) {
		/* Its exporter destroyed it, or exited, after the daemon
		 * handed it out. */
		errmsg_set("cannot open the producer's CUDA IPC event (the "
			   "producer may have exited since the daemon "
			   "answered)");
		return DLSHARE_EINVAL;
	}
	memcpy(e->handle, handle, CUDA_IPC_HANDLE_BYTES);
	e->ctx = ctx;
	e->used = 1;
	*out = e->ev;
	return 0;
}

int cuda_wait_event(const uint8_t handle[CUDA_IPC_HANDLE_BYTES], int ordinal,
		    void *stream, void **chain)
{
	struct cuda_event *mark = NULL;
	struct ctx_saved sv, sv2;
	CUstream on;
	CUcontext pc, sc;
	CUevent ev;
	int err;

	*chain = NULL;
	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	/* Opened in the device's primary context (ours for the life of the
	 * process, like the cache); waited on from any. */
	if ((err = primary_ctx(ordinal, &pc)))
		return err;
	if (stream == DLSHARE_STREAM_NONE)
		sc = pc;
	else if ((err = stream_ctx(stream, ordinal, &sc)))
		return err;
	if ((err = ctx_enter(pc, &sv)))
		return err;
	pthread_mutex_lock(&cache_lock);
	err = event_open(handle, pc, &ev);
	pthread_mutex_unlock(&cache_lock);
	if (!err && stream == DLSHARE_STREAM_NONE) {
		on = lib_stream_get(ordinal);
		if (!on)
			err = DLSHARE_ENOMEM;
	} else {
		on = stream_of(stream);
	}
	if (!err && (err = ctx_enter(sc, &sv2)) == 0) {
		/* The wait is queued on the stream: the host goes on. The
		 * mark after it completes only once the producer's record
		 * did: later waits chain to it. */
		if (cu.cuStreamWaitEvent(on, ev, 0) != CUDA_SUCCESS)
			err = DLSHARE_EINVAL;
		else if (!(mark = event_new(sc, 0)))
			err = DLSHARE_ENOMEM;
		else if (cu.cuEventRecord(mark->ev, on) != CUDA_SUCCESS)
			err = DLSHARE_EINVAL;
		ctx_leave(&sv2);
	}
	ctx_leave(&sv);
	if (err) {
		event_destroy(mark);
		return err;
	}
	mark->ordinal = ordinal;
	*chain = mark;
	return 0;
}

void *cuda_chain_add(void *chain, void *more)
{
	struct cuda_event *e = chain;

	if (!e)
		return more;
	while (e->next)
		e = e->next;
	e->next = more;
	return chain;
}

int cuda_wait_chain(void *chain, int ordinal, void *stream)
{
	struct ctx_saved sv;
	CUcontext sc;
	int err = 0;

	if (stream == DLSHARE_STREAM_NONE || !chain)
		return 0;
	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	/* A group (events per device): each on the default stream of its
	 * own device (a chain knows it: cuda_wait_event's ordinal), or all
	 * on the one explicit stream. */
	(void)ordinal;
	for (struct cuda_event *e = chain; e && !err; e = e->next) {
		if ((err = stream_ctx(stream, e->ordinal, &sc)) ||
		    (err = ctx_enter(sc, &sv)))
			return err;
		if (cu.cuStreamWaitEvent(stream_of(stream), e->ev, 0) !=
		    CUDA_SUCCESS)
			err = DLSHARE_EINVAL;
		ctx_leave(&sv);
	}
	return err;
}

/* ---- host memory ---------------------------------------------------------------- */

/* A context to register host memory in (portable registrations are seen
 * by every context): the current one, else the primary context of a
 * device this process already has one on; device 0's only when it has
 * none at all. */
static int host_enter(struct ctx_saved *sv)
{
	CUcontext cur = NULL;
	unsigned flags;
	int active;

	if (cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur)
		return ctx_enter(cur, sv);
	for (int i = 0; i < cu.ndev; i++)
		if (cu.cuDevicePrimaryCtxGetState(cu.dev[i], &flags, &active) ==
		    CUDA_SUCCESS && active)
			return dev_enter(i, sv);
	return dev_enter(0, sv);
}

int cuda_host_register(void *p, size_t n, int readonly)
{
	unsigned flags = CU_MEMHOSTREGISTER_PORTABLE |
			 (readonly ? CU_MEMHOSTREGISTER_READ_ONLY : 0);
	struct ctx_saved sv;
	int err;

	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	if ((err = host_enter(&sv)))
		return err;
	/* Read-only registration is a device capability: where it is
	 * missing the reader gets the pages as plain host memory. */
	if (readonly) {
		CUdevice d;
		int ok = 0;

		if (cu.cuCtxGetDevice(&d) != CUDA_SUCCESS ||
		    cu.cuDeviceGetAttribute(&ok,
			CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
			d) != CUDA_SUCCESS || !ok) {
			ctx_leave(&sv);
			return DLSHARE_ENOTSUP;
		}
	}
	if (cu.cuMemHostRegister(p, n, flags) != CUDA_SUCCESS)
		err = DLSHARE_EINVAL;
	ctx_leave(&sv);
	return err;
}

void cuda_host_unregister(void *p)
{
	struct ctx_saved sv;

	if (cuda_available(NULL) || host_enter(&sv))
		return;
	cu.cuMemHostUnregister(p);
	ctx_leave(&sv);
}

int cuda_stream_ordinal(void *stream)
{
	CUcontext c = NULL;

	if (stream == DLSHARE_STREAM_NONE || cuda_available(NULL))
		return -1;
	if (!special_stream(stream)) {
		if (cu.cuStreamGetCtx((CUstream)stream, &c) != CUDA_SUCCESS)
			return -1;
	} else if (cu.cuCtxGetCurrent(&c) != CUDA_SUCCESS || !c) {
		/* No context current: this thread queued nothing on a
		 * default stream. */
		return -1;
	}
	return ctx_ordinal(c);
}

/* ---- release markers -------------------------------------------------------- */

int cuda_event_mark(void *stream, int ordinal, void **evp)
{
	struct cuda_event *e = NULL;
	struct ctx_saved sv;
	CUcontext sc;
	int err;

	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	if ((err = stream_ctx(stream, ordinal, &sc)) ||
	    (err = ctx_enter(sc, &sv)))
		return err;
	if (!(e = event_new(sc, 0)))
		err = DLSHARE_ENOMEM;
	else if (cu.cuEventRecord(e->ev, stream_of(stream)) != CUDA_SUCCESS)
		err = DLSHARE_EINVAL;
	ctx_leave(&sv);
	if (err) {
		event_destroy(e);
		return err;
	}
	*evp = e;
	return 0;
}

int cuda_event_done(void *ev)
{
	struct cuda_event *e = ev;
	struct ctx_saved sv;
	CUresult r;

	/* A group (marks on several devices): done when each is. */
	if (e->next && !cuda_event_done(e->next))
		return 0;
	/* Its context is gone (destroyed by the application), and the work
	 * queued in it with it. */
	if (ctx_enter(e->ctx, &sv))
		return 1;
	r = cu.cuEventQuery(e->ev);
	if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) {
		/* Not knowing is not done: wait until it is, or until the
		 * context is broken for good (then nothing runs any more). */
		cu.cuEventSynchronize(e->ev);
		r = CUDA_SUCCESS;
	}
	ctx_leave(&sv);
	return r == CUDA_SUCCESS;
}

void cuda_event_wait(void *ev)
{
	struct ctx_saved sv;

	for (struct cuda_event *e = ev; e; e = e->next) {
		if (ctx_enter(e->ctx, &sv))
			continue;
		cu.cuEventSynchronize(e->ev);
		ctx_leave(&sv);
	}
}

void cuda_event_drop(void *ev)
{
	for (struct cuda_event *e = ev, *next; e; e = next) {
		next = e->next;
		event_destroy(e);
	}
}

void cuda_stream_wait_host(void *stream, int ordinal)
{
	struct ctx_saved sv;
	void *mark;
	CUcontext sc;

	if (stream == DLSHARE_STREAM_NONE || cuda_available(NULL))
		return;
	if (cuda_event_mark(stream, ordinal, &mark) == 0) {
		cuda_event_wait(mark);
		cuda_event_drop(mark);
		return;
	}
	if (stream_ctx(stream, ordinal, &sc) || ctx_enter(sc, &sv))
		return;
	cu.cuStreamSynchronize(stream_of(stream));
	ctx_leave(&sv);
}

/* ---- VMM and copies ------------------------------------------------------------ */

int cuda_vmm_import(int fd, uint64_t size, int ordinal, int writable,
		    void **ptr)
{
	CUmemGenericAllocationHandle h;
	CUmemAccessDesc access = { 0 };
	CUdeviceptr va = 0;
	struct ctx_saved sv;
	int err;

	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	if (size == 0 || size > SIZE_MAX)
		return DLSHARE_EPROTO;
	/* The driver calls want the device's context current. */
	if ((err = dev_enter(ordinal, &sv)))
		return err;
	err = DLSHARE_EINVAL;
	if (cu.cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
			CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS)
		goto out;
	if (cu.cuMemAddressReserve(&va, (size_t)size, 0, 0, 0) != CUDA_SUCCESS) {
		err = DLSHARE_ENOMEM;
		goto release;
	}
	if (cu.cuMemMap(va, (size_t)size, 0, h, 0) != CUDA_SUCCESS)
		goto free_va;
	access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	access.location.id = ordinal;
	/* A reader's mapping is read-only: its kernels cannot write the
	 * version that every other reader sees. */
	access.flags = writable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE :
				  CU_MEM_ACCESS_FLAGS_PROT_READ;
	if (cu.cuMemSetAccess(va, (size_t)size, &access, 1) != CUDA_SUCCESS) {
		cu.cuMemUnmap(va, (size_t)size);
		goto free_va;
	}
	/* The mapping holds the memory now; the handle is not needed. */
	cu.cuMemRelease(h);
	*ptr = (void *)(uintptr_t)va;
	pthread_mutex_lock(&cache_lock);
	mems_open++;
	mems_opened_total++;
	pthread_mutex_unlock(&cache_lock);
	err = 0;
	goto out;
free_va:
	cu.cuMemAddressFree(va, (size_t)size);
release:
	cu.cuMemRelease(h);
out:
	ctx_leave(&sv);
	return err;
}

void cuda_vmm_unmap(void *ptr, uint64_t size)
{
	CUdeviceptr va = (CUdeviceptr)(uintptr_t)ptr;

	if (cuda_available(NULL) || !ptr)
		return;
	cu.cuMemUnmap(va, (size_t)size);
	cu.cuMemAddressFree(va, (size_t)size);
	pthread_mutex_lock(&cache_lock);
	mems_open--;
	pthread_mutex_unlock(&cache_lock);
}

int cuda_copy_d2d(void *dst, const void *src, size_t n, int ordinal,
		  void *stream)
{
	struct ctx_saved sv;
	CUcontext sc;
	int err;

	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	/* On the device's default stream when that is the one named: the
	 * copy is ordered after the writes queued there. */
	if ((err = stream_ctx(stream, ordinal, &sc)) ||
	    (err = ctx_enter(sc, &sv)))
		return err;
	if (cu.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst,
				 (CUdeviceptr)(uintptr_t)src, n,
				 stream_of(stream)) != CUDA_SUCCESS)
		err = DLSHARE_EINVAL;
	ctx_leave(&sv);
	return err;
}

#else /* !DLSHARE_HAVE_CUDA */

int cuda_vmm_import(int fd, uint64_t size, int ordinal, int writable,
		    void **ptr)
{
	return DLSHARE_ENOTSUP;
}

void cuda_vmm_unmap(void *ptr, uint64_t size)
{
}

int cuda_copy_d2d(void *dst, const void *src, size_t n, int ordinal,
		  void *stream)
{
	return DLSHARE_ENOTSUP;
}

int cuda_host_register(void *p, size_t n, int readonly)
{
	return DLSHARE_ENOTSUP;
}

void cuda_host_unregister(void *p)
{
}

int cuda_event_mark(void *stream, int ordinal, void **ev)
{
	return DLSHARE_ENOTSUP;
}

int cuda_event_done(void *ev)
{
	return 1;
}

void cuda_event_wait(void *ev)
{
}

void cuda_event_drop(void *ev)
{
}

void cuda_stream_wait_host(void *stream, int ordinal)
{
}

int cuda_stream_ordinal(void *stream)
{
	return -1;
}


int cuda_available(const char **why)
{
	if (why)
		*why = "libdlshare was built without CUDA";
	return DLSHARE_ENOTSUP;
}

int cuda_export_alloc(const void *p, struct cuda_alloc *out)
{
	return DLSHARE_ENOTSUP;
}

int cuda_event_record(void *stream, const int *ordinals, size_t n,
		      int per_device, void **ev,
		      uint8_t handle[CUDA_IPC_HANDLE_BYTES])
{
	return DLSHARE_ENOTSUP;
}

size_t cuda_event_handles(void *ev, int *ordinals,
			  uint8_t (*handles)[CUDA_IPC_HANDLE_BYTES], size_t max)
{
	return 0;
}

void cuda_event_free(void *ev)
{
}

void cuda_event_pool_drain(void)
{
}

int cuda_ordinal(const uint8_t uuid[CUDA_UUID_BYTES])
{
	return DLSHARE_ENOTSUP;
}

int cuda_uuid(int ordinal, uint8_t uuid[CUDA_UUID_BYTES])
{
	return DLSHARE_ENOTSUP;
}

int cuda_open_mem(const uint8_t handle[CUDA_IPC_HANDLE_BYTES], int ordinal,
		  void **base)
{
	return DLSHARE_ENOTSUP;
}

void cuda_close_mem(void *base, int ordinal)
{
}

void cuda_cache_stats(unsigned long *open_now, unsigned long *opened_total)
{
	*open_now = 0;
	*opened_total = 0;
}

void cuda_unexport_alloc(const uint8_t handle[CUDA_IPC_HANDLE_BYTES])
{
}

int cuda_wait_event(const uint8_t handle[CUDA_IPC_HANDLE_BYTES], int ordinal,
		    void *stream, void **chain)
{
	*chain = NULL;
	return DLSHARE_ENOTSUP;
}

int cuda_wait_chain(void *chain, int ordinal, void *stream)
{
	return stream == DLSHARE_STREAM_NONE ? 0 : DLSHARE_ENOTSUP;
}

void *cuda_chain_add(void *chain, void *more)
{
	return chain ? chain : more;
}

#endif

void dlshare_cuda_cache_stats(unsigned long *open_now,
			      unsigned long *opened_total)
{
	unsigned long a, b;

	cuda_cache_stats(&a, &b);
	if (open_now)
		*open_now = a;
	if (opened_total)
		*opened_total = b;
}
