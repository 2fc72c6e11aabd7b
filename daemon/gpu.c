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
	X(cuMemRelease)
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
	const char *why;             /* why there is no GPU support */
	const char *rt_why;          /* why there is no legacy-IPC fallback */
} drv;

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

#else /* !DLSHARE_HAVE_CUDA */

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
