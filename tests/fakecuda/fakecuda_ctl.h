/*
 * fakecuda_ctl.h — test controls of libfakecuda, the CUDA test double in
 * tests/fakecuda. Not part of CUDA: only tests include it, and only when they
 * link libfakecuda instead of libcudart/libcuda (check fakecuda_present()).
 *
 * Every function is thread-safe and acts on the calling process only, unless
 * its comment says otherwise. None of them initialises the fake CUDA, so a
 * test may call them before fork() without tripping the fork rule (a child
 * forked after the first CUDA call cannot use CUDA, as with real CUDA).
 * Functions that can fail return 0 or a negative errno.
 */
#ifndef FAKECUDA_CTL_H
#define FAKECUDA_CTL_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Always 1 in libfakecuda. A test that may also run on a real GPU can declare
 * it weak and check it before using the rest of this header. */
int fakecuda_present(void);

/* Delay, in microseconds, that a stream worker sleeps before each copy,
 * memset or host function it runs (records and waits are not delayed). The
 * value is captured when the operation is queued. Default: FAKECUDA_DELAY_US,
 * else 2000. */
void fakecuda_set_delay_us(unsigned us);
unsigned fakecuda_get_delay_us(void);

/* Makes every cudaEventDestroy (and cuEventDestroy) of this process sleep
 * us microseconds first, so a test can hold another thread inside the
 * call deterministically. Default 0; fakecuda_reset() clears it. */
void fakecuda_set_event_destroy_delay_us(unsigned us);

/* What cudaIpcOpenMemHandle does with a handle this process already has open.
 * FAIL (default, also FAKECUDA_IPC_REOPEN=fail): cudaErrorAlreadyMapped, as
 * drivers have long answered ("resource already mapped").
 * REFCOUNT (FAKECUDA_IPC_REOPEN=refcount): the same pointer again with a
 * reference count, as the CUDA 13 documentation describes; every open then
 * needs its own cudaIpcCloseMemHandle. */
enum fakecuda_reopen {
    FAKECUDA_REOPEN_FAIL = 0,
    FAKECUDA_REOPEN_REFCOUNT = 1,
};
void fakecuda_set_ipc_reopen(enum fakecuda_reopen policy);

/* Call counters and live-object counts of this process. */
struct fakecuda_stats {
    unsigned long malloc_calls;          /* cudaMalloc, cudaMallocAsync */
    unsigned long free_calls;            /* cudaFree, cudaFreeAsync */
    unsigned long ipc_get_mem_calls;     /* successful cudaIpcGetMemHandle */
    unsigned long ipc_open_mem_calls;    /* every cudaIpcOpenMemHandle call */
    unsigned long ipc_close_mem_calls;   /* successful cudaIpcCloseMemHandle */
    long ipc_mem_open_now;               /* imported allocations mapped now */
    unsigned long ipc_get_event_calls;   /* successful cudaIpcGetEventHandle */
    unsigned long ipc_open_event_calls;  /* every cudaIpcOpenEventHandle call */
    long ipc_events_open_now;            /* imported events not yet destroyed */
    unsigned long event_record_calls;
    unsigned long stream_wait_event_calls;
    unsigned long event_sync_calls;      /* cudaEventSynchronize */
    unsigned long stream_sync_calls;     /* cudaStreamSynchronize */
    unsigned long device_sync_calls;     /* cudaDeviceSynchronize */
    unsigned long memcpy_calls;          /* cudaMemcpy + cudaMemcpyAsync */
    unsigned long memset_calls;          /* cudaMemset + cudaMemsetAsync */
    unsigned long host_func_calls;       /* cudaLaunchHostFunc */
    unsigned long vmm_create_calls;      /* cuMemCreate */
    unsigned long vmm_export_calls;      /* cuMemExportToShareableHandle */
    unsigned long vmm_import_calls;      /* cuMemImportFromShareableHandle */
    long live_allocations;               /* cudaMalloc/Async/Host not freed */
    long live_streams;                   /* created, not destroyed */
    long live_events;                    /* created or opened, not destroyed */
    long live_vmm_handles;               /* cuMemCreate/Import, not released */
    long live_ipc_events;                /* cudaEventInterprocess events created
                                          * here, not destroyed (see
                                          * fakecuda_set_ipc_event_limit) */
};
void fakecuda_get_stats(struct fakecuda_stats *out);

/* Contexts created on visible device ordinal in this process since it
 * started (primary contexts each time one is created, cudaSetDevice or the
 * first runtime call of a thread with no context doing it lazily, and
 * cuCtxCreate'd ones), never reset: a test asserts with it that a process
 * never touched a device. Returns the count, or -EINVAL for an ordinal out
 * of 0..15. */
long fakecuda_contexts_created(int ordinal);

/* Live interprocess events this process may have created: beyond it
 * cudaEventCreateWithFlags(cudaEventInterprocess) fails with
 * cudaErrorMemoryAllocation. 0: no limit. Default: FAKECUDA_IPC_EVENTS_MAX,
 * else 4096. */
void fakecuda_set_ipc_event_limit(long max);

/* Fault injection: the nth device-to-host copy (cudaMemcpy or
 * cudaMemcpyAsync from device memory into host memory, counted from 1 from
 * this call, or from the first CUDA call for FAKECUDA_FAIL_D2H=n) fails with
 * cudaErrorLaunchFailure, once; 0 turns it off. Unlike a real launch
 * failure, the error is not sticky: later calls succeed. */
void fakecuda_fail_d2h(unsigned long nth);

/* Zeroes the call counters (the live counts stay: they describe objects that
 * still exist). */
void fakecuda_reset_stats(void);

/* Resets the run-time settings to what the environment says and zeroes the
 * call counters. Allocations, streams and events are left alone. */
void fakecuda_reset(void);

/* Marks an event as named by a live version (a counter in the event's shared
 * state, so any process holding the event, exporter or importer, may pin and
 * unpin). Re-recording a pinned event while another live process has it open
 * through IPC aborts: on real CUDA the consumer could wait on the wrong
 * record. Returns 0, -EINVAL for an unknown event, or -ERANGE when unpinning
 * an event that is not pinned. */
int fakecuda_event_pin(cudaEvent_t event);
int fakecuda_event_unpin(cudaEvent_t event);

/* The same through an IPC handle, from any process (even one that never used
 * CUDA), while the exporter is alive and has not destroyed the event.
 * Returns 0, -EINVAL (not a fakecuda event handle, or stale), -ERANGE, or the
 * errno of opening the exporter's memfd. */
int fakecuda_ipc_event_pin(const cudaIpcEventHandle_t *handle);
int fakecuda_ipc_event_unpin(const cudaIpcEventHandle_t *handle);

/* Number of other live processes that have the allocation holding dev_ptr
 * (from cudaMalloc in this process) open through IPC, or -EINVAL. */
int fakecuda_mem_importers(const void *dev_ptr);

/* Number of other live processes that have this interprocess event open,
 * or -EINVAL. */
int fakecuda_event_importers(cudaEvent_t event);

/* Pid of the process that exported an IPC handle, or -EINVAL. */
int fakecuda_ipc_mem_handle_pid(const cudaIpcMemHandle_t *handle);

#ifdef __cplusplus
}
#endif

#endif
