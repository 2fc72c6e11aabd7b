/* gpu — the daemon's GPU backend: daemon-owned device buffers.
 *
 * A daemon-owned GPU buffer is cuda-vmm memory where the driver can export
 * it as a POSIX fd: cuMemCreate on the device with the requested UUID,
 * exported as an fd. The fd is the buffer: the daemon never maps it and
 * holds no CUDA context for it, and closing the fd frees the memory once no
 * importer maps it any more (the memory lives while any process holds the
 * fd or a mapping, daemon included).
 *
 * Where the driver cannot (GPU_CUDA_IPC), the daemon falls back to legacy
 * CUDA IPC: cudaMalloc in the daemon (which then holds a CUDA context on
 * that device) and cudaIpcGetMemHandle. Such memory dies with the daemon,
 * and must be freed (gpu_free_ipc) only once no process has it open.
 *
 * CUDA is loaded with dlopen the first time a GPU buffer is asked for (the
 * driver; the runtime only for the fallback), so dlshared runs where there
 * is no driver or no GPU: the GPU kinds are then refused with a reason.
 * DLSHARE_CUDA_DRIVER and DLSHARE_CUDA_RUNTIME name other libraries to load
 * (the tests' fake). gpu_alloc and gpu_free_ipc block: call them on a
 * worker thread, never on the loop.
 */
#ifndef DLSHARE_DAEMON_GPU_H
#define DLSHARE_DAEMON_GPU_H

#include <stdint.h>

#define GPU_UUID_LEN 16
#define GPU_IPC_HANDLE_LEN 64

enum gpu_kind { GPU_CUDA_VMM, GPU_CUDA_IPC };

/* A daemon-owned device allocation. */
struct gpu_mem {
	enum gpu_kind kind;
	uint64_t size;           /* as allocated: rounded up */
	int fd;                  /* cuda-vmm: the memory (O_CLOEXEC); else -1 */
	void *ptr;               /* cuda-ipc: the daemon's pointer */
	int ordinal;             /* cuda-ipc: the daemon's device */
	uint8_t handle[GPU_IPC_HANDLE_LEN]; /* cuda-ipc: its IPC handle */
};

/* Allocates size bytes on the device with uuid: cuda-vmm where the driver
 * can export it as an fd, else cuda-ipc. Returns 0 with *m, or -ENOTSUP (no
 * driver, no device, neither kind possible), -ENODEV (no device with that
 * UUID), -ENOMEM (the device is full), -EIO; *why then says what happened
 * (a static string). Any thread; blocks. */
int gpu_alloc(const uint8_t uuid[GPU_UUID_LEN], uint64_t size,
	      struct gpu_mem *m, const char **why);

/* Frees a cuda-ipc allocation (cudaFree: waits for the device). Any
 * thread; blocks. */
void gpu_free_ipc(void *ptr, int ordinal);

#endif
