/* cudalib — libdlshare's door to CUDA: the driver API only.
 *
 * Every CUDA call runs in the context of the device it concerns (the
 * stream's, the memory's, the event's), made current for the call and then
 * restored exactly as it was, also when nothing was current: no thread of
 * the process, the library's own included, ever gets a context on a device
 * it did not name (on an 8-GPU node that costs GPU 0 hundreds of MiB per
 * process). The library keeps the primary context of each device it used
 * retained for the life of the process.
 *
 * The library never links CUDA: it loads the driver (libcuda.so.1, the one
 * ABI-stable library every driver ships) with dlopen the first time a CUDA
 * tensor shows up, and its functions through cuGetProcAddress, so the same
 * binary runs where there is no toolkit, no driver or no GPU (the CUDA
 * kinds are then DLSHARE_ENOTSUP), and never meets a second CUDA runtime
 * beside the framework's (it loads none). Tests point it at the fake
 * (DLSHARE_CUDA_DRIVER names the library to load). Streams and events are
 * the driver's CUstream/CUevent, which is what a cudaStream_t/cudaEvent_t
 * is. Function types come from the real header, so a prototype cannot
 * drift. Any thread.
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

/* An interprocess event recorded on stream (DLPack stream rules: NULL or
 * 1 the legacy default stream, 2 the per-thread one, else a cudaStream_t)
 * for the writes of a version whose device tensors are on the n local
 * devices ordinals[] (n >= 1). It is made and recorded in the stream's
 * context: an explicit stream's own, for the legacy and per-thread streams
 * that of ordinals[0] (the current context when it is on that device, else
 * its primary one). With those and several devices, it stands for every
 * device's stream: each one's is joined into the first device's on a
 * stream of the library's. Its handle goes in *handle. The event must stay
 * alive and unrecorded while a version names it: the caller keeps *ev and
 * frees it with cuda_event_free() once no version does, which pools it
 * (by context) for a later record. Beyond DLSHARE_CUDA_IPC_EVENTS live
 * interprocess events (default 1024), or when the driver makes no more,
 * the host waits for the stream instead: 0 with *ev NULL and no handle,
 * and the version needs no event. Returns 0 or a DLSHARE_E* code. */
int cuda_event_record(void *stream, const int *ordinals, size_t n,
		      int per_device, void **ev,
		      uint8_t handle[CUDA_IPC_HANDLE_BYTES]);
/* With per_device (the daemon relays events per device: protocol 1.4),
 * several devices and the legacy or per-thread stream, cuda_event_record
 * records instead one event on each device's stream, in its context (no
 * join), and *ev stands for the group (handle is the first's). This lists
 * a group's devices and handles, at most max; 1 for a single event. */
size_t cuda_event_handles(void *ev, int *ordinals,
			  uint8_t (*handles)[CUDA_IPC_HANDLE_BYTES], size_t max);
void cuda_event_free(void *ev);
/* Destroys the pooled events and the library's streams (cuda_event_free
 * keeps some events for reuse). */
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
 * size bytes, its whole allocation, on device ordinal: readable there, and
 * writable when writable is set (a writer's; a reader's is read-only). The caller keeps fd. Returns 0 with the device pointer,
 * or a DLSHARE_E* code. Counted with the open handles. */
int cuda_vmm_import(int fd, uint64_t size, int ordinal, int writable,
		    void **ptr);
void cuda_vmm_unmap(void *ptr, uint64_t size);

/* Queues a device-to-device copy of n bytes, between buffers of device
 * ordinal, on stream (DLPack stream rules; the legacy and per-thread
 * streams are that device's). Returns 0 or a DLSHARE_E* code. */
int cuda_copy_d2d(void *dst, const void *src, size_t n, int ordinal,
		  void *stream);

/* Handles open now, and opened since the process started. */
void cuda_cache_stats(unsigned long *open_now, unsigned long *opened_total);

/* Opens a producer's event handle (cached) and makes stream wait for it
 * (the host never waits); DLSHARE_STREAM_NONE waits on a stream of the
 * library's. Then records *chain, an event of our own on that stream:
 * later waits for the same version use it, through cuda_wait_chain(), and
 * never the producer's event again (its exporter may be gone by then,
 * and using its event would be undefined). ordinal is the local device of
 * the version's tensors. Returns 0 or a DLSHARE_E* code; the caller drops
 * *chain with cuda_event_drop(). */
int cuda_wait_event(const uint8_t handle[CUDA_IPC_HANDLE_BYTES], int ordinal,
		    void *stream, void **chain);
/* Makes stream wait for chain (a no-op for DLSHARE_STREAM_NONE). Returns
 * 0 or a DLSHARE_E* code. A group of chains (cuda_chain_add, one per
 * device of a version with events per device) is waited for whole: the
 * legacy and per-thread streams of each chain's own device. */
int cuda_wait_chain(void *chain, int ordinal, void *stream);
/* Appends chain more to chain (either may be NULL); returns the group,
 * which cuda_event_drop() drops whole. */
void *cuda_chain_add(void *chain, void *more);

/* Registers host memory [p, p+n) with CUDA (pinned, device-accessible),
 * read-only when readonly. Returns 0 or a DLSHARE_E* code: DLSHARE_ENOTSUP
 * without CUDA, and for readonly where the device cannot register host
 * memory read-only (CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED
 * says 0): the caller then uses the pages as plain host memory. */
int cuda_host_register(void *p, size_t n, int readonly);
void cuda_host_unregister(void *p);

/* The local device ordinal of stream's context (DLPack stream rules; the
 * legacy and per-thread streams: the current context's), or -1 (none
 * current, DLSHARE_STREAM_NONE, no CUDA). Creates no context. */
int cuda_stream_ordinal(void *stream);

/* A plain (not interprocess) event recorded on stream, in the stream's
 * context (the legacy and per-thread streams: device ordinal's), to learn
 * when the consumer's queued work is done. Returns 0 with *ev, or a
 * DLSHARE_E* code. */
int cuda_event_mark(void *stream, int ordinal, void **ev);
/* 1 when the event (each of a group: cuda_chain_add) completed, 0 while
 * pending. Asked in the event's own
 * context; when the question fails, this waits for the event on the host
 * before it says 1, so that no work is ever taken as done early. */
int cuda_event_done(void *ev);
/* Waits for the event on the host, in its context. Any event of this
 * module (marks, chains, recorded ones). */
void cuda_event_wait(void *ev);
void cuda_event_drop(void *ev);
/* Waits on the host for the work queued so far on stream (as
 * cuda_event_mark, then cuda_event_wait; or, when no event can be
 * recorded, for the whole stream). The fallback of a stream-ordered
 * release that cannot be: late, never early. */
void cuda_stream_wait_host(void *stream, int ordinal);

#endif
