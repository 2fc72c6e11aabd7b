/* cudaload_rt — the CUDA runtime, found at run time: the daemon's fallback
 * allocator only. A file of its own, so that libdlshare, which loads the
 * driver alone, does not even carry the runtime's names. */
#include "cudaload.h"

#include <stddef.h>

void *cudaload_runtime(void)
{
	static const char *const names[] = {
		"libcudart.so", "libcudart.so.13", "libcudart.so.12", NULL,
	};

	return cudaload_open("DLSHARE_CUDA_RUNTIME", names);
}
