/* gpu — daemon-owned GPU buffers: fd-exported cuMemCreate memory, or
 * legacy CUDA IPC where the driver cannot export it. */
#include "gpu.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef DLSHARE_HAVE_CUDA

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cudaload.h"

/* Devices the daemon keeps UUIDs of; more are not looked at. */
#define GPU_DEVICES_MAX 64

/* The type comes from the header's prototype, the symbol from its
 * (possibly versioned) macro name (CUDALOAD_SYM), as in client/cudalib.c. */
#define DRV_FUNCS(X)                                                \
	X(cuInit)                                                   \
	X(cuDeviceGetCount)                                         \
	X(cuDeviceGet)                                              \
	X(cuDeviceGetUuid)                                          \
	X(cuDeviceGetAttribute)                                     \
	X(cuMemGetAllocationGranularity)                            \
	X(cuMemCreate)                                              \
	X(cuMemExportToShareableHandle)                             \
	X(cuMemRelease)                                             \
	X(cuDevicePrimaryCtxRetain)                                 \
	X(cuCtxGetCurrent)                                          \
	X(cuCtxSetCurrent)                                          \
	X(cuStreamCreate)                                           \
	X(cuStreamDestroy)                                          \
	X(cuStreamWaitEvent)                                        \
	X(cuEventCreate)                                            \
	X(cuEventRecord)                                            \
	X(cuEventDestroy)                                           \
	X(cuIpcOpenEventHandle)                                     \
	X(cuIpcGetEventHandle)
#define RT_FUNCS(X)                                                 \
	X(cudaSetDevice)                                            \
	X(cudaMalloc)                                               \
	X(cudaFree)                                                 \
	X(cudaIpcGetMemHandle)                                      \
	X(cudaGetLastError)

static struct {
#define DECLARE(fn) __typeof__(&fn) fn;
	DRV_FUNCS(DECLARE)
	RT_FUNCS(DECLARE)
#undef DECLARE
	void *lib, *rt;
	int ndev;
	CUdevice dev[GPU_DEVICES_MAX];
	uint8_t uuid[GPU_DEVICES_MAX][GPU_UUID_LEN];
	int vmm_fd[GPU_DEVICES_MAX]; /* fd-exportable VMM memory there */
	CUcontext ctx[GPU_DEVICES_MAX]; /* primary, retained for events */
	pthread_mutex_t ctx_lock;    /* guards ctx[] */
	const char *why;             /* why there is no GPU support */
	const char *rt_why;          /* why there is no legacy-IPC fallback */
} drv = { .ctx_lock = PTHREAD_MUTEX_INITIALIZER };

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;

static void load(void)
{
	int n;

	drv.lib = cudaload_driver();
	if (!drv.lib) {
		drv.why = "the CUDA driver (libcuda.so.1) cannot be loaded";
		return;
	}
#define LOAD(fn) \
	CUDALOAD_SYM(drv.lib, drv.fn, fn, "the CUDA driver", drv.why);
	DRV_FUNCS(LOAD)
#undef LOAD
	if (drv.cuInit(0) != CUDA_SUCCESS ||
	    drv.cuDeviceGetCount(&n) != CUDA_SUCCESS || n <= 0) {
		drv.why = "no CUDA device or driver";
		return;
	}
	if (n > GPU_DEVICES_MAX)
		n = GPU_DEVICES_MAX;
	for (int i = 0; i < n; i++) {
		CUuuid u;
		int vmm = 0, fdh = 0;

		if (drv.cuDeviceGet(&drv.dev[i], i) != CUDA_SUCCESS ||
		    drv.cuDeviceGetUuid(&u, drv.dev[i]) != CUDA_SUCCESS) {
			drv.why = "cannot read the devices' UUIDs";
			return;
		}
		memcpy(drv.uuid[i], u.bytes, GPU_UUID_LEN);
		if (drv.cuDeviceGetAttribute(&vmm,
			CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
			drv.dev[i]) != CUDA_SUCCESS)
			vmm = 0;
		if (drv.cuDeviceGetAttribute(&fdh,
			CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
			drv.dev[i]) != CUDA_SUCCESS)
			fdh = 0;
		drv.vmm_fd[i] = vmm && fdh;
	}
	drv.ndev = n;
}

/* The runtime, for the legacy-IPC fallback only: it makes a context. */
static void load_rt(void)
{
	drv.rt = cudaload_runtime();
	if (!drv.rt) {
		drv.rt_why = "the driver cannot export VMM memory as an fd, and "
			     "the CUDA runtime (libcudart) cannot be loaded";
		return;
	}
#define LOAD(fn) \
	CUDALOAD_SYM(drv.rt, drv.fn, fn, "the CUDA runtime", drv.rt_why);
	RT_FUNCS(LOAD)
#undef LOAD
}

static int alloc_vmm(int i, uint64_t size, struct gpu_mem *m,
		     const char **why)
{
	CUmemAllocationProp prop;
	CUmemGenericAllocationHandle h;
	size_t gran = 0;
	uint64_t rounded;
	CUresult rc;
	int out = -1;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = drv.dev[i];
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	if (drv.cuMemGetAllocationGranularity(&gran, &prop,
			CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS ||
	    gran == 0) {
		*why = "the driver gives no allocation granularity";
		return -EIO;
	}
	if (size > UINT64_MAX - gran || size > SIZE_MAX - gran) {
		*why = "too large for the device";
		return -ENOMEM;
	}
	rounded = (size + gran - 1) / gran * gran;
	rc = drv.cuMemCreate(&h, (size_t)rounded, &prop, 0);
	if (rc != CUDA_SUCCESS) {
		*why = rc == CUDA_ERROR_OUT_OF_MEMORY ?
		       "the GPU is out of memory" : "cuMemCreate failed";
		return rc == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
	}
	rc = drv.cuMemExportToShareableHandle(&out, h,
			CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	/* The exported fd holds the memory from here; the handle goes. */
	drv.cuMemRelease(h);
	if (rc != CUDA_SUCCESS || out < 0) {
		*why = "cuMemExportToShareableHandle failed";
		return -EIO;
	}
	/* Not every driver sets close-on-exec on the fd it makes. */
	(void)fcntl(out, F_SETFD, FD_CLOEXEC);
	m->kind = GPU_CUDA_VMM;
	m->fd = out;
	m->size = rounded;
	return 0;
}

static int alloc_ipc(int i, uint64_t size, struct gpu_mem *m,
		     const char **why)
{
	cudaIpcMemHandle_t h;
	cudaError_t e;
	void *p = NULL;

	pthread_once(&rt_once, load_rt);
	if (drv.rt_why) {
		*why = drv.rt_why;
		return -ENOTSUP;
	}
	if (size > SIZE_MAX) {
		*why = "too large for the device";
		return -ENOMEM;
	}
	/* The runtime's ordinals are the driver's, in one process. The
	 * current device is per thread: set it on every call. */
	if (drv.cudaSetDevice(i) != cudaSuccess) {
		drv.cudaGetLastError();
		*why = "cudaSetDevice failed";
		return -EIO;
	}
	e = drv.cudaMalloc(&p, size ? (size_t)size : 1);
	if (e != cudaSuccess) {
		drv.cudaGetLastError();
		*why = e == cudaErrorMemoryAllocation ?
		       "the GPU is out of memory" : "cudaMalloc failed";
		return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
	}
	if (drv.cudaIpcGetMemHandle(&h, p) != cudaSuccess) {
		drv.cudaGetLastError();
		drv.cudaFree(p);
		*why = "cudaIpcGetMemHandle failed";
		return -EIO;
	}
	m->kind = GPU_CUDA_IPC;
	m->fd = -1;
	m->ptr = p;
	m->ordinal = i;
	m->size = size;
	memcpy(m->handle, h.reserved, GPU_IPC_HANDLE_LEN);
	return 0;
}

int gpu_alloc(const uint8_t uuid[GPU_UUID_LEN], uint64_t size,
	      struct gpu_mem *m, const char **why)
{
	int i;

	memset(m, 0, sizeof(*m));
	m->fd = -1;
	pthread_once(&once, load);
	if (!drv.ndev) {
		*why = drv.why;
		return -ENOTSUP;
	}
	for (i = 0; i < drv.ndev; i++)
		if (memcmp(drv.uuid[i], uuid, GPU_UUID_LEN) == 0)
			break;
	if (i == drv.ndev) {
		*why = "no GPU with that UUID on the daemon's machine";
		return -ENODEV;
	}
	return drv.vmm_fd[i] ? alloc_vmm(i, size ? size : 1, m, why) :
			       alloc_ipc(i, size, m, why);
}

void gpu_free_ipc(void *ptr, int ordinal)
{
	if (!drv.rt || drv.rt_why || !ptr)
		return;
	if (drv.cudaSetDevice(ordinal) != cudaSuccess ||
	    drv.cudaFree(ptr) != cudaSuccess)
		drv.cudaGetLastError();
}

/* ---- daemon-owned events ------------------------------------------------

 * What CUDA's reference allows (the runtime's words; the driver calls used
 * here say the same):
 * - cudaIpcOpenEventHandle / cudaIpcGetEventHandle: "Performing operations
 *   on the imported event after the exported event has been freed with
 *   cudaEventDestroy will result in undefined behavior." So the producer's
 *   event is opened and used only here, during the Seal, while its exporter
 *   still holds it (the library keeps it until the daemon says Retired, or
 *   until it disconnects, and the Seal is not answered yet).
 * - cudaStreamWaitEvent: "Makes all future work submitted to stream wait for
 *   all work captured in event ... event may be from a different device
 *   than stream." And cudaEventRecord: "Other APIs such as
 *   cudaStreamWaitEvent use the most recently captured state at the time of
 *   the API call, and are not affected by later calls to cudaEventRecord."
 *   So once our wait is queued, the producer may record its event again or
 *   destroy it: the daemon sends Retired for it right after the seal.
 * - cudaEventDestroy: "An event may be destroyed before it is complete ...
 *   the call does not block on completion of the event, and any associated
 *   resources will automatically be released asynchronously at
 *   completion." So the imported event and our stream (cuStreamDestroy
 *   says the same of a stream with work left) go at once, and the wait
 *   stays queued.
 * - cudaEventRecord: "event and stream must be on the same CUDA context":
 *   each device's event is made and recorded in that device's primary
 *   context, on a stream of that context.
 */
struct gpu_events {
	unsigned n;
	struct {
		int dev;         /* index into drv.dev */
		CUevent event;   /* ours, interprocess */
		uint8_t handle[GPU_IPC_HANDLE_LEN];
	} e[];
};

/* Events of versions that went, per device, for the next seals, as the
 * library pools its own: a reader keeps the events it opened, by handle
 * (client/cudalib.c), so an event it may still have open is recorded
 * again (its next wait sees the new record) rather than destroyed, which
 * could let a new event come with the same handle bytes. Beyond the pool
 * they are destroyed. Under drv.ctx_lock. */
#define GPU_EVENT_POOL 64
static struct {
	unsigned n;
	CUevent ev[GPU_EVENT_POOL];
	uint8_t handle[GPU_EVENT_POOL][GPU_IPC_HANDLE_LEN];
} pool[GPU_DEVICES_MAX];

static int dev_index(const uint8_t uuid[GPU_UUID_LEN])
{
	for (int i = 0; i < drv.ndev; i++)
		if (memcmp(drv.uuid[i], uuid, GPU_UUID_LEN) == 0)
			return i;
	return -1;
}

/* Device i's primary context, retained on first use and kept: retaining
 * and releasing it per version would make and tear down a context (a
 * costly driver call) at every seal of a queue of depth 1. */
static CUcontext dev_ctx(int i, const char **why)
{
	CUcontext c;

	pthread_mutex_lock(&drv.ctx_lock);
	c = drv.ctx[i];
	if (!c && drv.cuDevicePrimaryCtxRetain(&c, drv.dev[i]) != CUDA_SUCCESS)
		c = NULL;
	drv.ctx[i] = c;
	pthread_mutex_unlock(&drv.ctx_lock);
	if (!c)
		*why = "the daemon cannot make a CUDA context on the version's "
		       "device (its compute mode may forbid a second process)";
	return c;
}

/* Makes device i's event: a stream of its context waits for prod, our
 * event is recorded after that wait. Context i is current. */
static int relay_one(int i, CUevent prod, CUevent *out,
		     uint8_t handle[GPU_IPC_HANDLE_LEN], const char **why)
{
	CUstream s = NULL;
	CUevent ev = NULL;
	CUipcEventHandle h;
	int from_pool = 0;

	if (drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
		*why = "cannot create a CUDA stream";
		return -EIO;
	}
	if (drv.cuStreamWaitEvent(s, prod, 0) != CUDA_SUCCESS) {
		*why = "cannot wait for the producer's CUDA event";
		goto fail;
	}
	pthread_mutex_lock(&drv.ctx_lock);
	if (pool[i].n) {
		pool[i].n--;
		ev = pool[i].ev[pool[i].n];
		memcpy(handle, pool[i].handle[pool[i].n], GPU_IPC_HANDLE_LEN);
		from_pool = 1;
	}
	pthread_mutex_unlock(&drv.ctx_lock);
	if (!ev && drv.cuEventCreate(&ev, CU_EVENT_INTERPROCESS |
				     CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
		ev = NULL;
		*why = "cannot create an interprocess CUDA event (the "
		       "driver's limit of them, or out of memory)";
		goto fail;
	}
	if (drv.cuEventRecord(ev, s) != CUDA_SUCCESS) {
		*why = "cannot record the daemon's CUDA event";
		goto fail;
	}
	if (!from_pool) {
		if (drv.cuIpcGetEventHandle(&h, ev) != CUDA_SUCCESS) {
			*why = "cannot export the daemon's CUDA event";
			goto fail;
		}
		memcpy(handle, h.reserved, GPU_IPC_HANDLE_LEN);
	}
	drv.cuStreamDestroy(s); /* the wait and the record stay queued */
	*out = ev;
	return 0;
fail:
	if (ev)
		drv.cuEventDestroy(ev);
	drv.cuStreamDestroy(s);
	return -EIO;
}

struct gpu_events *gpu_events_recycle(struct gpu_events *g)
{
	unsigned left = 0;

	if (!g)
		return NULL;
	pthread_mutex_lock(&drv.ctx_lock);
	for (unsigned k = 0; k < g->n; k++) {
		int i = g->e[k].dev;

		if (pool[i].n < GPU_EVENT_POOL) {
			pool[i].ev[pool[i].n] = g->e[k].event;
			memcpy(pool[i].handle[pool[i].n], g->e[k].handle,
			       GPU_IPC_HANDLE_LEN);
			pool[i].n++;
		} else {
			g->e[left++] = g->e[k];
		}
	}
	pthread_mutex_unlock(&drv.ctx_lock);
	g->n = left;
	if (!left) {
		free(g);
		return NULL;
	}
	return g;
}

void gpu_events_free(struct gpu_events *g)
{
	CUcontext prev = NULL;

	if (!g)
		return;
	if (drv.cuCtxGetCurrent(&prev) != CUDA_SUCCESS)
		prev = NULL;
	for (unsigned k = 0; k < g->n; k++) {
		/* Its context was retained when it was made, and is kept. */
		if (drv.cuCtxSetCurrent(drv.ctx[g->e[k].dev]) == CUDA_SUCCESS)
			drv.cuEventDestroy(g->e[k].event);
	}
	drv.cuCtxSetCurrent(prev);
	free(g);
}

int gpu_events_relay(const uint8_t (*uuids)[GPU_UUID_LEN], unsigned ndev,
		     const uint8_t prod_handle[GPU_IPC_HANDLE_LEN],
		     uint8_t (*handles)[GPU_IPC_HANDLE_LEN],
		     struct gpu_events **out, const char **why)
{
	struct gpu_events *g;
	CUcontext prev = NULL, c;
	CUipcEventHandle ph;
	CUevent prod = NULL;
	int idx[GPU_DEVICES_MAX];
	int err = 0;

	*out = NULL;
	pthread_once(&once, load);
	if (!drv.ndev) {
		*why = drv.why;
		return -ENOTSUP;
	}
	if (!ndev || ndev > GPU_DEVICES_MAX) {
		*why = "no device, or too many, to make events on";
		return -EINVAL;
	}
	for (unsigned k = 0; k < ndev; k++)
		if ((idx[k] = dev_index(uuids[k])) < 0) {
			*why = "no GPU with that UUID on the daemon's machine";
			return -ENODEV;
		}
	for (unsigned k = 0; k < ndev; k++)
		if (!dev_ctx(idx[k], why))
			return -ENOTSUP;
	g = calloc(1, sizeof(*g) + ndev * sizeof(g->e[0]));
	if (!g) {
		*why = "out of memory";
		return -ENOMEM;
	}
	if (drv.cuCtxGetCurrent(&prev) != CUDA_SUCCESS)
		prev = NULL;
	/* The producer recorded its event on the first device's stream: it
	 * is opened there (each device's stream may wait on it). */
	c = drv.ctx[idx[0]];
	memcpy(ph.reserved, prod_handle, GPU_IPC_HANDLE_LEN);
	if (drv.cuCtxSetCurrent(c) != CUDA_SUCCESS) {
		*why = "cannot make the device's CUDA context current";
		err = -EIO;
	} else if (drv.cuIpcOpenEventHandle(&prod, ph) != CUDA_SUCCESS) {
		prod = NULL;
		*why = "cannot open the producer's CUDA IPC event (not an "
		       "event handle, or its process destroyed it or is "
		       "gone, or it is in another IPC namespace)";
		err = -EINVAL;
	}
	for (unsigned k = 0; k < ndev && !err; k++) {
		if (drv.cuCtxSetCurrent(drv.ctx[idx[k]]) != CUDA_SUCCESS) {
			*why = "cannot make the device's CUDA context current";
			err = -EIO;
			break;
		}
		err = relay_one(idx[k], prod, &g->e[k].event, handles[k], why);
		if (!err) {
			g->e[k].dev = idx[k];
			memcpy(g->e[k].handle, handles[k], GPU_IPC_HANDLE_LEN);
			g->n++;
		}
	}
	if (prod && drv.cuCtxSetCurrent(c) == CUDA_SUCCESS)
		drv.cuEventDestroy(prod);
	drv.cuCtxSetCurrent(prev);
	if (err) {
		gpu_events_free(g);
		return err;
	}
	*out = g;
	return 0;
}

#else /* !DLSHARE_HAVE_CUDA */

int gpu_events_relay(const uint8_t (*uuids)[GPU_UUID_LEN], unsigned ndev,
		     const uint8_t prod_handle[GPU_IPC_HANDLE_LEN],
		     uint8_t (*handles)[GPU_IPC_HANDLE_LEN],
		     struct gpu_events **out, const char **why)
{
	(void)uuids;
	(void)ndev;
	(void)prod_handle;
	(void)handles;
	*out = NULL;
	*why = "dlshared was built without CUDA";
	return -ENOTSUP;
}

struct gpu_events *gpu_events_recycle(struct gpu_events *g)
{
	return g;
}

void gpu_events_free(struct gpu_events *g)
{
	(void)g;
}

int gpu_alloc(const uint8_t uuid[GPU_UUID_LEN], uint64_t size,
	      struct gpu_mem *m, const char **why)
{
	(void)uuid;
	(void)size;
	memset(m, 0, sizeof(*m));
	m->fd = -1;
	*why = "dlshared was built without CUDA";
	return -ENOTSUP;
}

void gpu_free_ipc(void *ptr, int ordinal)
{
	(void)ptr;
	(void)ordinal;
}

#endif
