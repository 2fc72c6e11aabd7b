/* cudalib — CUDA loaded at run time; IPC memory and events. */
#include "cudalib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef DLSHARE_HAVE_CUDA

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cudaload.h"

/* Imported events kept open, so a consumer that gets version after version
 * of a name opens each producer event once. Evicted entries are destroyed. */
#define CUDA_EVENT_CACHE 256
/* Interprocess events of retired versions kept for the next publish or seal
 * (so consumers find them in their caches); beyond this many they are
 * destroyed. */
#define CUDA_EVENT_POOL 64

/* One entry per function: the type comes from the header's prototype, the
 * symbol from its (possibly versioned, e.g. _v2) macro name. */
#define CUDA_FUNCS(X)                                               \
	X(rt, cudaGetDeviceCount)                                   \
	X(rt, cudaGetDevice)                                        \
	X(rt, cudaSetDevice)                                        \
	X(rt, cudaPointerGetAttributes)                             \
	X(rt, cudaIpcGetMemHandle)                                  \
	X(rt, cudaIpcOpenMemHandle)                                 \
	X(rt, cudaIpcCloseMemHandle)                                \
	X(rt, cudaEventCreateWithFlags)                             \
	X(rt, cudaEventRecord)                                      \
	X(rt, cudaEventDestroy)                                     \
	X(rt, cudaIpcGetEventHandle)                                \
	X(rt, cudaIpcOpenEventHandle)                               \
	X(rt, cudaStreamWaitEvent)                                  \
	X(rt, cudaGetLastError)                                     \
	X(rt, cudaEventQuery)                                       \
	X(rt, cudaHostRegister)                                     \
	X(rt, cudaHostUnregister)                                   \
	X(rt, cudaEventSynchronize)                                 \
	X(rt, cudaMemcpyAsync)                                      \
	X(drv, cuInit)                                              \
	X(drv, cuDeviceGet)                                         \
	X(drv, cuDeviceGetUuid)                                     \
	X(drv, cuMemGetAddressRange)                                \
	X(drv, cuMemImportFromShareableHandle)                      \
	X(drv, cuMemAddressReserve)                                 \
	X(drv, cuMemAddressFree)                                    \
	X(drv, cuMemMap)                                            \
	X(drv, cuMemUnmap)                                          \
	X(drv, cuMemSetAccess)                                      \
	X(drv, cuMemRelease)

static struct {
#define DECLARE(lib, fn) __typeof__(&fn) fn;
	CUDA_FUNCS(DECLARE)
#undef DECLARE
	void *rt, *drv;
	int ndev;
	uint8_t uuids[64][CUDA_UUID_BYTES];
	const char *why;
} cu;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

struct event_entry {
	uint8_t handle[CUDA_IPC_HANDLE_BYTES];
	cudaEvent_t ev;
	int used;
};
static struct event_entry events[CUDA_EVENT_CACHE];
static unsigned event_next;

/* Our own events no live version names any more, by device. */
struct pooled_event {
	cudaEvent_t ev;
	int device;
};
static struct pooled_event pool[CUDA_EVENT_POOL];
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
	void *ptr;               /* allocation base, or the cudaEvent_t */
	int refs;
	struct own_entry *next;
};
static struct own_entry *own;

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

static void load(void)
{
	cu.rt = cudaload_runtime();
	cu.drv = cudaload_driver();
	if (!cu.rt || !cu.drv) {
		cu.why = !cu.rt ? "the CUDA runtime library cannot be loaded" :
				  "the CUDA driver library cannot be loaded";
		return;
	}
#define LOAD(lib, fn) \
	CUDALOAD_SYM(cu.lib, cu.fn, fn, "the CUDA libraries", cu.why);
	CUDA_FUNCS(LOAD)
#undef LOAD
	if (cu.cuInit(0) != CUDA_SUCCESS ||
	    cu.cudaGetDeviceCount(&cu.ndev) != cudaSuccess || cu.ndev <= 0) {
		cu.ndev = 0;
		cu.why = "no CUDA device or driver";
		return;
	}
	if (cu.ndev > 64)
		cu.ndev = 64;
	for (int i = 0; i < cu.ndev; i++) {
		CUdevice d;
		CUuuid u;

		if (cu.cuDeviceGet(&d, i) != CUDA_SUCCESS ||
		    cu.cuDeviceGetUuid(&u, d) != CUDA_SUCCESS) {
			cu.ndev = 0;
			cu.why = "cannot read the devices' UUIDs";
			return;
		}
		memcpy(cu.uuids[i], u.bytes, CUDA_UUID_BYTES);
	}
}

int cuda_available(const char **why)
{
	pthread_once(&once, load);
	if (why)
		*why = cu.why ? cu.why : "";
	return cu.ndev > 0 ? 0 : DLSHARE_ENOTSUP;
}

/* DLPack stream values: NULL and 1 the legacy default stream, 2 the
 * per-thread default stream, anything else a cudaStream_t. */
static cudaStream_t stream_of(void *s)
{
	if (s == NULL || s == (void *)1)
		return cudaStreamLegacy;
	if (s == (void *)2)
		return cudaStreamPerThread;
	return (cudaStream_t)s;
}

int cuda_export_alloc(const void *p, struct cuda_alloc *out)
{
	struct cudaPointerAttributes attr;
	cudaIpcMemHandle_t h;
	CUdeviceptr base;
	size_t size;
	int prev;

	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	if (cu.cudaPointerGetAttributes(&attr, p) != cudaSuccess ||
	    attr.type != cudaMemoryTypeDevice || attr.device < 0 ||
	    attr.device >= cu.ndev) {
		cu.cudaGetLastError();
		return DLSHARE_EINVAL;
	}
	if (cu.cuMemGetAddressRange(&base, &size, (CUdeviceptr)p) !=
	    CUDA_SUCCESS)
		return DLSHARE_ECOPY;
	cu.cudaGetDevice(&prev);
	cu.cudaSetDevice(attr.device);
	/* Pool and VMM allocations refuse legacy IPC: the caller copies. */
	cudaError_t e = cu.cudaIpcGetMemHandle(&h, (void *)base);
	cu.cudaSetDevice(prev);
	if (e != cudaSuccess) {
		cu.cudaGetLastError();
		return DLSHARE_ECOPY;
	}
	out->base = (uintptr_t)base;
	out->size = size;
	out->ordinal = attr.device;
	memcpy(out->uuid, cu.uuids[attr.device], CUDA_UUID_BYTES);
	memcpy(out->handle, h.reserved, CUDA_IPC_HANDLE_BYTES);
	/* Undone by cuda_unexport_alloc() when the version is retired. */
	return own_add(out->handle, (void *)base);
}

int cuda_event_record(void *stream, void **evp,
		      uint8_t handle[CUDA_IPC_HANDLE_BYTES])
{
	cudaIpcEventHandle_t h;
	cudaEvent_t ev = NULL;
	int dev = 0;

	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	/* A pooled event is named by no live version: it may be recorded
	 * again (consumers that still have it open wait on the newest
	 * record, as of their wait). */
	cu.cudaGetDevice(&dev);
	pthread_mutex_lock(&cache_lock);
	for (unsigned i = npool; i-- > 0;)
		if (pool[i].device == dev) {
			ev = pool[i].ev;
			pool[i] = pool[--npool];
			break;
		}
	pthread_mutex_unlock(&cache_lock);
	if (!ev && cu.cudaEventCreateWithFlags(&ev, cudaEventDisableTiming |
					       cudaEventInterprocess) !=
		   cudaSuccess) {
		cu.cudaGetLastError();
		return DLSHARE_ENOMEM;
	}
	if (cu.cudaEventRecord(ev, stream_of(stream)) != cudaSuccess ||
	    cu.cudaIpcGetEventHandle(&h, ev) != cudaSuccess) {
		cu.cudaGetLastError();
		cu.cudaEventDestroy(ev);
		return DLSHARE_EINVAL;
	}
	memcpy(handle, h.reserved, CUDA_IPC_HANDLE_BYTES);
	if (own_add(handle, ev)) {
		cu.cudaEventDestroy(ev);
		return DLSHARE_ENOMEM;
	}
	*evp = ev;
	return 0;
}

void cuda_event_free(void *ev)
{
	cudaIpcEventHandle_t h;
	int dev = 0, pooled = 0;

	if (!ev || cuda_available(NULL))
		return;
	if (cu.cudaIpcGetEventHandle(&h, (cudaEvent_t)ev) == cudaSuccess)
		own_del((const uint8_t *)h.reserved);
	else
		cu.cudaGetLastError();
	/* Events belong to the device current at their creation; ours are
	 * made and recorded on the caller's current device. */
	cu.cudaGetDevice(&dev);
	pthread_mutex_lock(&cache_lock);
	if (npool < CUDA_EVENT_POOL) {
		pool[npool].ev = (cudaEvent_t)ev;
		pool[npool++].device = dev;
		pooled = 1;
	}
	pthread_mutex_unlock(&cache_lock);
	if (!pooled)
		cu.cudaEventDestroy((cudaEvent_t)ev);
}

void cuda_event_pool_drain(void)
{
	struct pooled_event out[CUDA_EVENT_POOL];
	unsigned n;

	/* Never the first CUDA call of a process: a process that forks
	 * after its first CUDA call has children that cannot use CUDA. An
	 * event in the pool means CUDA is loaded. */
	pthread_mutex_lock(&cache_lock);
	n = npool;
	memcpy(out, pool, n * sizeof(*out));
	npool = 0;
	pthread_mutex_unlock(&cache_lock);
	for (unsigned i = 0; i < n; i++)
		cu.cudaEventDestroy(out[i].ev);
}

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

int cuda_open_mem(const uint8_t handle[CUDA_IPC_HANDLE_BYTES], int ordinal,
		  void **base)
{
	cudaIpcMemHandle_t h;
	struct mem_entry *m;
	cudaError_t e;
	int prev, err = 0;

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
	cu.cudaGetDevice(&prev);
	cu.cudaSetDevice(ordinal);
	e = cu.cudaIpcOpenMemHandle(&m->base, h,
				    cudaIpcMemLazyEnablePeerAccess);
	cu.cudaSetDevice(prev);
	if (e != cudaSuccess) {
		cu.cudaGetLastError();
		free(m);
		err = DLSHARE_EINVAL;
		goto out;
	}
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
	int prev;

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
		if (!m->own) {
			cu.cudaGetDevice(&prev);
			cu.cudaSetDevice(m->ordinal);
			cu.cudaIpcCloseMemHandle(m->base);
			cu.cudaSetDevice(prev);
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

/* The open event of handle, opening (and caching) it the first time.
 * Under cache_lock. */
static int event_open(const uint8_t *handle, cudaEvent_t *out)
{
	cudaIpcEventHandle_t h;
	struct event_entry *e;
	struct own_entry *o = own_find(handle);

	if (o) {
		*out = (cudaEvent_t)o->ptr;
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
		cu.cudaEventDestroy(e->ev);
		e->used = 0;
	}
	if (cu.cudaIpcOpenEventHandle(&e->ev, h) != cudaSuccess) {
		cu.cudaGetLastError();
		return DLSHARE_EINVAL;
	}
	memcpy(e->handle, handle, CUDA_IPC_HANDLE_BYTES);
	e->used = 1;
	*out = e->ev;
	return 0;
}

int cuda_wait_event(const uint8_t handle[CUDA_IPC_HANDLE_BYTES], int ordinal,
		    void *stream)
{
	cudaEvent_t ev;
	int prev, err;

	if (stream == DLSHARE_STREAM_NONE)
		return 0;
	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	pthread_mutex_lock(&cache_lock);
	cu.cudaGetDevice(&prev);
	cu.cudaSetDevice(ordinal);
	err = event_open(handle, &ev);
	/* The wait is queued on the consumer's stream: the host goes on. */
	if (!err && cu.cudaStreamWaitEvent(stream_of(stream), ev, 0) !=
		    cudaSuccess) {
		cu.cudaGetLastError();
		err = DLSHARE_EINVAL;
	}
	cu.cudaSetDevice(prev);
	pthread_mutex_unlock(&cache_lock);
	return err;
}

int cuda_host_register(void *p, size_t n, int readonly)
{
	unsigned flags = cudaHostRegisterPortable |
			 (readonly ? cudaHostRegisterReadOnly : 0);

	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	if (cu.cudaHostRegister(p, n, flags) != cudaSuccess) {
		cu.cudaGetLastError();
		return DLSHARE_EINVAL;
	}
	return 0;
}

void cuda_host_unregister(void *p)
{
	if (cuda_available(NULL) == 0 &&
	    cu.cudaHostUnregister(p) != cudaSuccess)
		cu.cudaGetLastError();
}

int cuda_event_mark(void *stream, int ordinal, void **evp)
{
	cudaEvent_t ev;
	int prev, err = 0;

	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	cu.cudaGetDevice(&prev);
	cu.cudaSetDevice(ordinal);
	if (cu.cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) !=
	    cudaSuccess) {
		err = DLSHARE_ENOMEM;
	} else if (cu.cudaEventRecord(ev, stream_of(stream)) != cudaSuccess) {
		cu.cudaEventDestroy(ev);
		err = DLSHARE_EINVAL;
	}
	if (err)
		cu.cudaGetLastError();
	cu.cudaSetDevice(prev);
	if (!err)
		*evp = ev;
	return err;
}

int cuda_event_done(void *ev)
{
	cudaError_t e = cu.cudaEventQuery((cudaEvent_t)ev);

	if (e == cudaSuccess)
		return 1;
	if (e == cudaErrorNotReady)
		return 0;
	cu.cudaGetLastError();
	return DLSHARE_EIO;
}

void cuda_event_wait(void *ev)
{
	if (cu.cudaEventSynchronize((cudaEvent_t)ev) != cudaSuccess)
		cu.cudaGetLastError();
}

void cuda_event_drop(void *ev)
{
	if (ev)
		cu.cudaEventDestroy((cudaEvent_t)ev);
}

int cuda_vmm_import(int fd, uint64_t size, int ordinal, void **ptr)
{
	CUmemGenericAllocationHandle h;
	CUmemAccessDesc access = { 0 };
	CUdeviceptr va = 0;
	int prev, err = DLSHARE_EINVAL;

	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	if (size == 0 || size > SIZE_MAX)
		return DLSHARE_EPROTO;
	/* The driver calls want the device's context current. */
	cu.cudaGetDevice(&prev);
	if (cu.cudaSetDevice(ordinal) != cudaSuccess) {
		cu.cudaGetLastError();
		return DLSHARE_ENODEV;
	}
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
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
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
	cu.cudaSetDevice(prev);
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

int cuda_copy_d2d(void *dst, const void *src, size_t n, void *stream)
{
	if (cuda_available(NULL))
		return DLSHARE_ENOTSUP;
	if (cu.cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice,
			       stream_of(stream)) != cudaSuccess) {
		cu.cudaGetLastError();
		return DLSHARE_EINVAL;
	}
	return 0;
}

#else /* !DLSHARE_HAVE_CUDA */

int cuda_vmm_import(int fd, uint64_t size, int ordinal, void **ptr)
{
	return DLSHARE_ENOTSUP;
}

void cuda_vmm_unmap(void *ptr, uint64_t size)
{
}

int cuda_copy_d2d(void *dst, const void *src, size_t n, void *stream)
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

int cuda_event_record(void *stream, void **ev,
		      uint8_t handle[CUDA_IPC_HANDLE_BYTES])
{
	return DLSHARE_ENOTSUP;
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
		    void *stream)
{
	return stream == DLSHARE_STREAM_NONE ? 0 : DLSHARE_ENOTSUP;
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
