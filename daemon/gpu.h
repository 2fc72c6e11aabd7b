/* gpu — the daemon's GPU backend: daemon-owned device buffers.
 *
 * A daemon-owned GPU buffer is cuda-vmm memory: cuMemCreate on the device
 * with the requested UUID, exported as a POSIX fd. The fd is the buffer:
 * the daemon never maps it and holds no CUDA context for it, and closing
 * the fd frees the memory once no importer maps it any more (the memory
 * lives while any process holds the fd or a mapping, daemon included).
 *
 * The driver (libcuda) is loaded with dlopen the first time a GPU buffer is
 * asked for, so dlshared runs where there is no driver or no GPU: the GPU
 * kinds are then refused with a reason. DLSHARE_CUDA_DRIVER names another
 * library to load (the tests' fake). gpu_alloc blocks (cuInit, the
 * allocation): call it on a worker thread, never on the loop.
 */
#ifndef DLSHARE_DAEMON_GPU_H
#define DLSHARE_DAEMON_GPU_H

#include <stdint.h>

#define GPU_UUID_LEN 16

/* Allocates size bytes (rounded up to the device's granularity, given
 * back in *alloc_size) on the device with uuid, and exports them as a POSIX
 * fd (O_CLOEXEC). Returns 0 with *fd, or -ENOTSUP (no driver, no device,
 * or a driver without fd-exportable VMM memory), -ENODEV (no device with
 * that UUID), -ENOMEM (the device is full), -EIO; *why then says what
 * happened (a static string). Any thread. */
int gpu_alloc(const uint8_t uuid[GPU_UUID_LEN], uint64_t size, int *fd,
	       uint64_t *alloc_size, const char **why);

#endif
