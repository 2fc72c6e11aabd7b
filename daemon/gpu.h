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

/* Daemon-owned events (store versions sealed with a CUDA event): the
 * producer's interprocess event dies with its process, but a store
 * version outlives it. So at seal, on each of ndev devices (uuids), a
 * stream of the daemon waits for the producer's event (prod_handle) and
 * an interprocess event of the daemon is recorded after that wait; readers
 * get its handle (handles[k], for uuids[k]). The producer's event is used
 * only during this call and may be destroyed or recorded again after it.
 * Needs the device's primary context (retained on first use, and kept).
 * The host never waits for the GPU. Returns 0 with *out (freed with
 * gpu_events_free once no reply can name the events any more), or -ENOTSUP
 * (no driver or device, or no context possible), -ENODEV (no device with
 * such a UUID), -EINVAL (the producer's handle cannot be opened), -ENOMEM,
 * -EIO; *why then says what (a static string). Any thread; blocks on
 * driver calls: never on the loop. */
struct gpu_events;
int gpu_events_relay(const uint8_t (*uuids)[GPU_UUID_LEN], unsigned ndev,
		     const uint8_t prod_handle[GPU_IPC_HANDLE_LEN],
		     uint8_t (*handles)[GPU_IPC_HANDLE_LEN],
		     struct gpu_events **out, const char **why);

/* Keeps g's events for the next gpu_events_relay on their devices (a
 * bounded pool; a reader may still have one open, by its handle: it is
 * recorded again, never destroyed while pooled). Returns NULL, or g with
 * the events the pool had no room for, for gpu_events_free. No driver
 * call: any thread, the loop included. */
struct gpu_events *gpu_events_recycle(struct gpu_events *g);

/* Destroys the events (in their devices' contexts; a record not yet
 * complete finishes on its own). NULL is fine. Any thread; never on the
 * loop. */
void gpu_events_free(struct gpu_events *g);

#endif
