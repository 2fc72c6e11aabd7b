/* cudaload — the CUDA driver, found at run time. */
#include "cudaload.h"

#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>

void *cudaload_open(const char *env, const char *const *names)
{
	const char *path = getenv(env);
	void *h = NULL;

	if (path && *path)
		return dlopen(path, RTLD_NOW | RTLD_LOCAL);
	for (size_t i = 0; names[i] && !h; i++)
		h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	return h;
}

void *cudaload_driver(void)
{
	static const char *const names[] = { "libcuda.so.1", NULL };

	return cudaload_open("DLSHARE_CUDA_DRIVER", names);
}
