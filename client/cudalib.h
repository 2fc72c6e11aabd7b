/* cudalib — libdlshare's door to the CUDA runtime and driver.
 *
 * The library never links CUDA: it loads the runtime (libcudart) and the
 * driver (libcuda) with dlopen the first time a CUDA tensor shows up, so the
 * same binary runs where there is no toolkit, no driver or no GPU (the CUDA
 * kinds are then DLSHARE_ENOTSUP), and tests can point it at the fake
 * (DLSHARE_CUDA_RUNTIME / DLSHARE_CUDA_DRIVER name the libraries to load).
 * Function types come from the real headers, so a prototype cannot drift.
 * Any thread.
 */
#ifndef DLSHARE_CLIENT_CUDALIB_H
#define DLSHARE_CLIENT_CUDALIB_H

#include <stddef.h>
#include <stdint.h>

#include <dlshare/dlshare.h>

#define CUDA_IPC_HANDLE_BYTES 64
#define CUDA_UUID_BYTES 16

/* Where an exported device tensor lives: its allocation, exportable with
 * legacy CUDA IPC. */
struct cuda_alloc {
	uintptr_t base;
	uint64_t size;
	int ordinal;
	uint8_t uuid[CUDA_UUID_BYTES];
	uint8_t handle[CUDA_IPC_HANDLE_BYTES];
};

/* Loads CUDA once. Returns 0 or DLSHARE_ENOTSUP (no library, no driver, no
 * device), with the reason in *why when not NULL. */
int cuda_available(const char **why);

/* Finds the allocation holding device pointer p and gets its IPC handle,
 * remembering it as ours (a consumer in this process gets the pointer) until
 * cuda_unexport_alloc(). Returns 0, DLSHARE_EINVAL (not device memory),
 * DLSHARE_ECOPY (device memory that legacy IPC cannot export: pool, VMM or
 * managed memory), DLSHARE_ENOTSUP. */
int cuda_export_alloc(const void *p, struct cuda_alloc *out);
void cuda_unexport_alloc(const uint8_t handle[CUDA_IPC_HANDLE_BYTES]);

/* An interprocess event recorded on stream (DLPack stream rules: see
 * cuda_stream()); its handle goes in *handle. The event must stay alive and
 * unrecorded while a version names it: the caller keeps *ev and frees it
 * with cuda_event_free() once no version does, which pools it for a later
 * record. Returns 0 or a DLSHARE_E* code. */
int cuda_event_record(void *stream, void **ev,
		      uint8_t handle[CUDA_IPC_HANDLE_BYTES]);
void cuda_event_free(void *ev);
/* Destroys the pooled events (cuda_event_free keeps some for reuse). */
void cuda_event_pool_drain(void);

/* The local ordinal of the device with this UUID, or DLSHARE_ENODEV. */
int cuda_ordinal(const uint8_t uuid[CUDA_UUID_BYTES]);
/* The UUID of local device ordinal: 0, DLSHARE_ENODEV or DLSHARE_ENOTSUP. */
int cuda_uuid(int ordinal, uint8_t uuid[CUDA_UUID_BYTES]);

/* Opens a memory handle of another process on device ordinal, once per
 * process: a handle already open gets its base again, counted. Returns 0
 * with the base pointer, or a DLSHARE_E* code. */
int cuda_open_mem(const uint8_t handle[CUDA_IPC_HANDLE_BYTES], int ordinal,
		  void **base);
/* Drops one count of an opened base; the last closes the handle. */
void cuda_close_mem(void *base, int ordinal);
/* Maps a cuda-vmm buffer (cuMemCreate memory exported as a POSIX fd) of
 * size bytes, its whole allocation, on device ordinal, readable and
 * writable there. The caller keeps fd. Returns 0 with the device pointer,
 * or a DLSHARE_E* code. Counted with the open handles. */
int cuda_vmm_import(int fd, uint64_t size, int ordinal, void **ptr);
void cuda_vmm_unmap(void *ptr, uint64_t size);

/* Queues a device-to-device copy of n bytes on stream (DLPack stream
 * rules). Returns 0 or a DLSHARE_E* code. */
int cuda_copy_d2d(void *dst, const void *src, size_t n, void *stream);

/* Handles open now, and opened since the process started. */
void cuda_cache_stats(unsigned long *open_now, unsigned long *opened_total);

/* Opens an event handle and makes stream wait for it (host never waits).
 * Returns 0 or a DLSHARE_E* code. A stream of DLSHARE_STREAM_NONE skips the
 * wait. */
int cuda_wait_event(const uint8_t handle[CUDA_IPC_HANDLE_BYTES], int ordinal,
		    void *stream);

/* Registers host memory [p, p+n) with CUDA (pinned, device-accessible),
 * read-only when readonly. Returns 0 or a DLSHARE_E* code (DLSHARE_ENOTSUP
 * without CUDA). */
int cuda_host_register(void *p, size_t n, int readonly);
void cuda_host_unregister(void *p);

/* A plain (not interprocess) event recorded on stream on device ordinal,
 * to learn when the consumer's queued work is done. Returns 0 with *ev, or a
 * DLSHARE_E* code. */
int cuda_event_mark(void *stream, int ordinal, void **ev);
/* 1 when the event completed, 0 while pending, a DLSHARE_E* code when it
 * cannot be asked (the work is then taken as done). */
int cuda_event_done(void *ev);
/* Waits for the event on the host. */
void cuda_event_wait(void *ev);
void cuda_event_drop(void *ev);

#endif
