/* cudaload_rt — the CUDA runtime, found at run time: the daemon's fallback
 * allocator only. A file of its own, so that libdlshare, which loads the
 * driver alone, does not even carry the runtime's names. */
#include "cudaload.h"

#include <stddef.h>
#include <stdlib.h>

/* A runtime newer than the driver loads, then fails every call
 * (cudaErrorInsufficientDriver): the one kept is the first whose
 * cudaGetDeviceCount works, newest first; the unversioned name (a
 * toolkit's development link, to any version) last. One that does not
 * fit stays loaded (unloading a runtime that ran is not safe), unused. */
void *cudaload_runtime(void)
{
	static const char *const names[] = {
		"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL,
	};
	const char *path = getenv("DLSHARE_CUDA_RUNTIME");

	if (path && *path)
		return dlopen(path, RTLD_NOW | RTLD_LOCAL);
	for (size_t i = 0; names[i]; i++) {
		void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		int (*count)(int *);
		int n = 0;

		if (!h)
			continue;
		count = (int (*)(int *))dlsym(h, "cudaGetDeviceCount");
		if (count && count(&n) == 0 && n > 0)
			return h;
	}
	return NULL;
}
