/* cudaload — finding the CUDA libraries at run time, the same way in the
 * daemon and in libdlshare: neither links CUDA, so one binary runs where
 * there is no toolkit, driver or GPU. DLSHARE_CUDA_DRIVER and
 * DLSHARE_CUDA_RUNTIME name the file to load instead (the tests' fake).
 */
#ifndef DLSHARE_CUDALOAD_H
#define DLSHARE_CUDALOAD_H

/* A dlopen(RTLD_NOW | RTLD_LOCAL) handle of the driver (libcuda.so.1) or
 * the runtime (libcudart), or NULL. Any thread; each call opens again (a
 * counted reference, as dlopen does). */
void *cudaload_driver(void);
void *cudaload_runtime(void);

#endif
