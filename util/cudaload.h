/* cudaload — finding the CUDA libraries at run time, the same way in the
 * daemon and in libdlshare: neither links CUDA, so one binary runs where
 * there is no toolkit, driver or GPU. DLSHARE_CUDA_DRIVER and
 * DLSHARE_CUDA_RUNTIME name the file to load instead (the tests' fake).
 * libdlshare loads the driver only; the runtime is the daemon's fallback
 * allocator's (cudaload_rt.c).
 */
#ifndef DLSHARE_CUDALOAD_H
#define DLSHARE_CUDALOAD_H

#include <dlfcn.h>

/* A dlopen(RTLD_NOW | RTLD_LOCAL) handle of the driver (libcuda.so.1) or
 * the runtime (libcudart: the newest whose cudaGetDeviceCount works with
 * this driver), or NULL. Any thread; each call opens again (a counted
 * reference, as dlopen does). */
void *cudaload_driver(void);
void *cudaload_runtime(void);
/* The library $env names, else the first of names that dlopen finds. */
void *cudaload_open(const char *env, const char *const *names);

#define CUDALOAD_STR_(x) #x
#define CUDALOAD_STR(x) CUDALOAD_STR_(x)

/* In a loader function returning void: resolves CUDA function fn (by its
 * header's symbol name, e.g. cuMemGetAddressRange_v2) in lib into dst, the
 * type taken from the header's prototype; when lib lacks it, sets why to
 * "<what> lacks <symbol>" and returns. */
#define CUDALOAD_SYM(lib, dst, fn, what, why)                            \
	do {                                                             \
		(dst) = (__typeof__(&fn))dlsym((lib), CUDALOAD_STR(fn)); \
		if (!(dst)) {                                            \
			(why) = what " lacks " CUDALOAD_STR(fn);         \
			return;                                          \
		}                                                        \
	} while (0)

#endif
