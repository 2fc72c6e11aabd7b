/* gpu — daemon-owned GPU buffers as fd-exported cuMemCreate memory. */
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

/* Devices the daemon keeps UUIDs of; more are not looked at. */
#define CUDA_DEVICES_MAX 64

#define XSTR(x) #x
#define STR(x) XSTR(x)
/* The type comes from the header's prototype, the symbol from its
 * (possibly versioned) macro name, as in client/cudalib.c. */
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

static struct {
#define DECLARE(fn) __typeof__(&fn) fn;
	DRV_FUNCS(DECLARE)
#undef DECLARE
	void *lib;
	int ndev;
	CUdevice dev[CUDA_DEVICES_MAX];
	uint8_t uuid[CUDA_DEVICES_MAX][GPU_UUID_LEN];
	int vmm_fd[CUDA_DEVICES_MAX]; /* fd-exportable VMM memory there */
	const char *why;              /* why there is no GPU support */
} drv;

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void)
{
	const char *path = getenv("DLSHARE_CUDA_DRIVER");
	int n;

	drv.lib = dlopen(path && *path ? path : "libcuda.so.1",
			 RTLD_NOW | RTLD_LOCAL);
	if (!drv.lib) {
		drv.why = "the CUDA driver (libcuda.so.1) cannot be loaded";
		return;
	}
#define LOAD(fn)                                                     \
	drv.fn = (__typeof__(&fn))dlsym(drv.lib, STR(fn));           \
	if (!drv.fn) {                                               \
		drv.why = "the CUDA driver lacks " STR(fn);          \
		return;                                              \
	}
	DRV_FUNCS(LOAD)
#undef LOAD
	if (drv.cuInit(0) != CUDA_SUCCESS ||
	    drv.cuDeviceGetCount(&n) != CUDA_SUCCESS || n <= 0) {
		drv.why = "no CUDA device or driver";
		return;
	}
	if (n > CUDA_DEVICES_MAX)
		n = CUDA_DEVICES_MAX;
	for (int i = 0; i < n; i++) {
		CUuuid u;
		int vmm = 0, fdh = 0;

		if (drv.cuDeviceGet(&drv.dev[i], i) != CUDA_SUCCESS ||
		    drv.cuDeviceGetUuid(&u, drv.dev[i]) != CUDA_SUCCESS) {
			drv.why = "cannot read the devices' UUIDs";
			return;
		}
		memcpy(drv.uuid[i], u.bytes, GPU_UUID_LEN);
		drv.cuDeviceGetAttribute(&vmm,
			CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
			drv.dev[i]);
		drv.cuDeviceGetAttribute(&fdh,
			CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
			drv.dev[i]);
		drv.vmm_fd[i] = vmm && fdh;
	}
	drv.ndev = n;
}

int gpu_alloc(const uint8_t uuid[GPU_UUID_LEN], uint64_t size, int *fd,
	       uint64_t *alloc_size, const char **why)
{
	CUmemAllocationProp prop;
	CUmemGenericAllocationHandle h;
	size_t gran = 0;
	uint64_t rounded;
	CUresult rc;
	int i, out = -1;

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
	if (!drv.vmm_fd[i]) {
		/* The legacy-IPC fallback needs a context in the daemon;
		 * not there yet. */
		*why = "the GPU's driver cannot export VMM memory as an fd";
		return -ENOTSUP;
	}
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
	if (size == 0)
		size = 1;
	if (size > UINT64_MAX - gran) {
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
	*fd = out;
	*alloc_size = rounded;
	return 0;
}

#else /* !DLSHARE_HAVE_CUDA */

int gpu_alloc(const uint8_t uuid[GPU_UUID_LEN], uint64_t size, int *fd,
	       uint64_t *alloc_size, const char **why)
{
	(void)uuid;
	(void)size;
	(void)fd;
	(void)alloc_size;
	*why = "dlshared was built without CUDA";
	return -ENOTSUP;
}

#endif
