/*
 * fakecuda internals: state shared by the modules of libfakecuda (core,
 * stream, mem, vmm). Nothing here is exported from the library; only the CUDA
 * entry points (compiled against the real CUDA headers) and fakecuda_ctl.h are.
 *
 * Locking: g_fc.mu guards every per-process table (ranges, handles, VMM
 * allocations, reservations, the list of streams). A stream's own mutex is
 * taken after g_fc.mu, never before it. State shared between processes lives in
 * memfd pages and is touched with C11 atomics only.
 */
#ifndef FAKECUDA_FC_INTERNAL_H
#define FAKECUDA_FC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "fakecuda_ctl.h"

#pragma GCC visibility push(hidden)

#define FC_API __attribute__((visibility("default")))

#define FC_MAX_DEVICES 16
#define FC_VMM_GRANULARITY ((size_t)2 << 20) /* what real GPUs report */
#define FC_PEER_SLOTS 192
#define FC_DEAD_RING 256

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "shared counters must be lock-free to work across processes");

/* ---- state shared between processes (lives in memfd pages) ------------- */

/* One slot per importing process; lets an exporter see who still holds its
 * memory or event, and ignore importers that died without closing. */
struct fc_peer_slot {
    _Atomic int32_t pid;
    _Atomic int32_t count;
};

struct fc_peers {
    struct fc_peer_slot slot[FC_PEER_SLOTS];
};

#define FC_MEM_MAGIC 0x4643484du /* "FCHM" */
#define FC_EV_MAGIC 0x46434845u  /* "FCHE" */
#define FC_MEM_KIND_MALLOC 1u
#define FC_MEM_KIND_VMM 2u

/* First page of every memfd that backs "device" memory; the data follows at
 * offset fc_page_size(). */
struct fc_mem_hdr {
    uint32_t magic;
    uint32_t kind;
    uint64_t id;
    uint64_t size;
    int32_t owner_pid;
    uint32_t phys_dev;
    _Atomic uint32_t freed;
    uint32_t pad;
    struct fc_peers importers;
};

/* The whole state of an event. For interprocess events it is one memfd page,
 * mapped by the exporter and every importer; otherwise plain heap memory. */
struct fc_ev_shared {
    uint32_t magic;
    uint32_t interprocess;
    uint64_t id;
    int32_t owner_pid;
    _Atomic uint32_t owner_destroyed;
    _Atomic uint64_t issued;    /* records issued (cudaEventRecord calls) */
    _Atomic uint64_t completed; /* highest record whose stream reached it */
    _Atomic uint32_t wake;      /* futex word, bumped on every completion */
    _Atomic int32_t recorder_pid;
    _Atomic int32_t pins;       /* fakecuda_event_pin(): a live version names it */
    int32_t pad;
    struct fc_peers importers;
};

/* Layout of the 64 bytes of a cudaIpcMemHandle_t / cudaIpcEventHandle_t. */
#define FC_IPC_MEM_MAGIC 0x464d4950u /* "FMIP" */
#define FC_IPC_EV_MAGIC 0x46454950u  /* "FEIP" */
struct fc_ipc_wire {
    uint32_t magic;
    int32_t pid;      /* exporter */
    int32_t fd;       /* exporter's memfd, opened through /proc/<pid>/fd/<fd> */
    uint32_t phys_dev;
    uint64_t id;
    uint64_t size;
    uint32_t ns;      /* events: the exporter's FAKECUDA_IPC_NAMESPACE tag */
    uint8_t zero[28];
};
_Static_assert(sizeof(struct fc_ipc_wire) == 64, "IPC handle is 64 bytes");

/* ---- per-process state --------------------------------------------------- */

enum fc_range_kind {
    FC_R_MALLOC,  /* cudaMalloc: memfd, exportable with cudaIpcGetMemHandle */
    FC_R_IMPORT,  /* cudaIpcOpenMemHandle */
    FC_R_POOL,    /* cudaMallocAsync, cudaMallocManaged: device memory that is not IPC-capable */
    FC_R_VMM,     /* one cuMemMap mapping */
    FC_R_HOST,    /* cudaHostRegister'd or cudaMallocHost'd host memory */
};

/* A cuMemCreate / cuMemImportFromShareableHandle allocation. Its memory lives
 * while the handle is not released or a mapping uses it. */
struct fc_vmm {
    uint64_t id;
    int fd;                 /* memfd: header page + data */
    size_t size;
    int phys_dev;
    unsigned handle_types;  /* CUmemAllocationHandleType bits */
    bool released;
    int maps;
    struct fc_vmm *next;
};

/* A cuMemAddressReserve range. */
struct fc_resv {
    uintptr_t base;
    size_t size;
    struct fc_resv *next;
};

/* A range of the address space that CUDA knows about. */
struct fc_range {
    enum fc_range_kind kind;
    uintptr_t base;
    size_t size;
    int phys_dev;           /* -1 for host ranges */
    CUcontext ctx;          /* MALLOC / IMPORT / HOST: where it was made; else NULL */
    uint64_t buffer_id;     /* process-unique, never reused */
    _Atomic int pending;    /* queued stream operations that touch it */
    struct fc_range *next;

    /* MALLOC / IMPORT */
    int fd;                 /* MALLOC: the memfd; -1 otherwise */
    struct fc_mem_hdr *hdr; /* MALLOC / IMPORT: mapped header page */
    size_t map_len;         /* MALLOC / IMPORT / POOL / HOST(alloc): mapping length */
    uint64_t alloc_id;      /* MALLOC / IMPORT */
    int32_t exporter_pid;   /* IMPORT */
    int open_refs;          /* IMPORT: opens of the same handle (refcount policy) */

    /* VMM */
    struct fc_vmm *vmm;
    struct fc_resv *resv;
    int prot;               /* PROT_* set by cuMemSetAccess */

    /* POOL */
    bool managed;           /* cudaMallocManaged (freed by cudaFree only) */

    /* HOST */
    bool host_alloc;        /* cudaMallocHost (else cudaHostRegister) */
};

/* The global state of this process. */
struct fc_global {
    pthread_mutex_t mu;
    bool initialized;       /* first CUDA call done */
    bool forked;            /* we are a child of a process that had initialized */
    _Atomic bool driver_initialized;
    int init_error;         /* cudaError_t of the lazy init, or 0 */

    int nphys;              /* FAKECUDA_DEVICES */
    int nvisible;
    int visible[FC_MAX_DEVICES]; /* ordinal -> physical index */
    unsigned char uuid[FC_MAX_DEVICES][16]; /* by physical index */

    struct fc_range *ranges;
    _Atomic uint64_t next_id; /* allocation / event / buffer ids */
    uint64_t id_salt;

    int compute_mode[FC_MAX_DEVICES]; /* CUcomputemode, by physical index */
    struct CUstream_st *streams; /* every stream whose worker still runs */
};

/* A context: the primary context of a device (one per visible ordinal,
 * created lazily, never freed) or one made with cuCtxCreate (freed never
 * either: a destroyed context stays known so that its use is an error).
 * Fields are under g_fc.mu. */
struct CUctx_st {
    int ordinal;            /* visible ordinal of its device */
    bool primary;
    _Atomic bool active;    /* primary: created and not released; other: not destroyed */
    int retains;            /* primary: cuDevicePrimaryCtxRetain count */
    _Atomic bool rt_held;   /* primary: the runtime initialised it (holds it for life) */
    struct CUstream_st *legacy; /* its legacy default stream, once used */
    struct CUctx_st *next;  /* list of cuCtxCreate contexts */
};

extern struct fc_global g_fc;

/* FAKECUDA_VMM_FD (default 1): 0 plays a driver that cannot export VMM
 * memory as a POSIX fd. */
bool fc_vmm_fd_supported(void);
/* FAKECUDA_HOST_REGISTER_READONLY (default 1): 0 plays a device without
 * cudaDevAttrHostRegisterReadOnlySupported (cudaHostRegisterReadOnly then
 * fails with cudaErrorNotSupported). */
bool fc_host_register_readonly_supported(void);

/* Settings that fakecuda_ctl.h changes at run time. */
struct fc_settings {
    _Atomic unsigned delay_us;
    _Atomic int reopen;          /* enum fakecuda_reopen */
    _Atomic int delay_set;       /* set through the ctl API, beats the env */
    _Atomic int reopen_set;
    _Atomic long ipc_events_max; /* 0: no limit */
    _Atomic int ipc_events_max_set;
    _Atomic unsigned destroy_delay_us; /* fakecuda_set_event_destroy_delay_us */
    _Atomic unsigned long fail_d2h;    /* FAKECUDA_FAIL_D2H: that device-to-host
                                        * copy fails (1-based; 0: none) */
    _Atomic unsigned long d2h_seen;    /* device-to-host copies asked so far */
};
extern struct fc_settings g_set;

/* Call counters, one per fakecuda_stats field. */
extern struct fc_counters {
    _Atomic unsigned long malloc_calls, free_calls;
    _Atomic unsigned long ipc_get_mem_calls, ipc_open_mem_calls, ipc_close_mem_calls;
    _Atomic long ipc_mem_open_now;
    _Atomic unsigned long ipc_get_event_calls, ipc_open_event_calls;
    _Atomic long ipc_events_open_now;
    _Atomic unsigned long event_record_calls, stream_wait_event_calls;
    _Atomic unsigned long event_sync_calls, stream_sync_calls, device_sync_calls;
    _Atomic unsigned long memcpy_calls, memset_calls, host_func_calls;
    _Atomic unsigned long vmm_create_calls, vmm_export_calls, vmm_import_calls;
    _Atomic long live_allocations, live_streams, live_events, live_vmm_handles;
    _Atomic long live_ipc_events;
    _Atomic unsigned long ctx_created[FC_MAX_DEVICES]; /* by visible ordinal, never reset */
} g_cnt;

#define FC_COUNT(field) atomic_fetch_add(&g_cnt.field, 1)
#define FC_DROP(field) atomic_fetch_sub(&g_cnt.field, 1)

/* ---- core (fc_core.c) ---------------------------------------------------- */

/* Entry of every runtime call that works in a context (most of them): lazy
 * init on the first runtime call (which also initialises the driver, like
 * the real runtime), then, when no context is current on this thread, the
 * primary context of the thread's runtime device is created if need be and
 * made current, as the real runtime does. Returns cudaSuccess,
 * cudaErrorInitializationError in a child forked after initialisation,
 * cudaErrorNoDevice, cudaErrorDevicesUnavailable (compute mode) or
 * cudaErrorContextIsDestroyed (the current context was destroyed). */
cudaError_t fc_rt_enter(void);
/* Entry of the runtime calls that need no context (device count,
 * properties, attributes, cudaGetDevice): never creates one. */
cudaError_t fc_rt_enter_noctx(void);
/* Records a runtime error as the thread's last error; returns it. */
cudaError_t fc_rt_err(cudaError_t e);
/* Entry check of driver calls: CUDA_ERROR_NOT_INITIALIZED before cuInit (or
 * any runtime call), and in a forked child. */
CUresult fc_drv_enter(void);

/* Aborts with a message on stderr: undefined behaviour on real CUDA. */
_Noreturn void fc_trap(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fc_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Visible ordinal of this thread's device: its current context's, else the
 * runtime's per-thread device (0 until cudaSetDevice). */
int fc_current_device(void);
int fc_phys_of_ordinal(int ordinal);       /* -1 when out of range */
int fc_ordinal_of_phys(int phys);          /* cudaInvalidDeviceId when not visible */
CUcontext fc_ctx_of_ordinal(int ordinal);  /* primary context (maybe inactive), or NULL */
CUcontext fc_ctx_current(void);            /* this thread's current context, or NULL */
/* Entry check of driver calls that need a current context: as
 * fc_drv_enter, then CUDA_ERROR_INVALID_CONTEXT when none is current (or
 * CUDA_ERROR_CONTEXT_IS_DESTROYED). */
CUresult fc_drv_enter_ctx(CUcontext *out);
/* Brackets a driver call that runs the runtime's code (fc_drv.c): inside,
 * fc_rt_enter creates no context (one must be current) and fc_rt_err
 * leaves the runtime's last error alone. */
void fc_drv_begin(void);
void fc_drv_end(void);
uint64_t fc_new_id(void);                  /* unique across processes */
size_t fc_page_size(void);
bool fc_pid_alive(pid_t pid);

/* Peer slots (see struct fc_peers). */
int fc_peers_join(struct fc_peers *p, pid_t self);   /* 0 or -ENOSPC */
void fc_peers_leave(struct fc_peers *p, pid_t self);
int fc_peers_others_alive(struct fc_peers *p, pid_t self);

/* Futex helpers on a word that may live in shared memory. */
void fc_futex_wait(_Atomic uint32_t *word, uint32_t expected, long timeout_ns);
void fc_futex_wake_all(_Atomic uint32_t *word);

/* Opens the fakecuda memfd that process pid has as fd, through
 * /proc/<pid>/fd/<fd>. Returns the new fd, -EINVAL when that fd is not a
 * fakecuda memfd (any more), or -errno. */
int fc_open_peer_fd(int32_t pid, int32_t fd);
/* Creates a sealed-size memfd of a header page plus data_len bytes. Returns
 * the fd, or -errno. */
int fc_memfd_new(const char *name, size_t data_len);

/* ---- ranges (fc_mem.c) ---------------------------------------------------- */

/* Range holding addr, or NULL. Caller holds g_fc.mu. */
struct fc_range *fc_range_find(uintptr_t addr);
void fc_range_insert(struct fc_range *r);   /* caller holds g_fc.mu */
void fc_range_remove(struct fc_range *r);   /* caller holds g_fc.mu */
bool fc_range_is_device(const struct fc_range *r);
/* Traps when queued stream work still touches r (it is about to go away). */
void fc_range_check_idle(struct fc_range *r, const char *what);

/* ---- streams and events (fc_stream.c) ------------------------------------ */

enum fc_op_kind {
    FC_OP_COPY,
    FC_OP_SET,
    FC_OP_HOSTFN,
    FC_OP_RECORD,
    FC_OP_WAIT_EVENT,
    FC_OP_WAIT_STREAM,
    FC_OP_FREE,
};

struct fc_op {
    struct fc_op *next;
    enum fc_op_kind kind;
    uint64_t seq;
    unsigned delay_us;
    struct fc_range *touch[2]; /* ranges whose pending count this op holds */
    union {
        struct { void *dst; const void *src; size_t n; void *staging; } copy;
        struct { void *dst; int value; size_t n; } set;
        struct { cudaHostFn_t fn; void *arg; } host;
        struct { struct CUevent_st *ev; uint64_t target; } ev;
        struct { struct CUstream_st *s; uint64_t seq; } dep;
        struct { void *ptr; } free;
    } u;
};

struct fc_op *fc_op_new(enum fc_op_kind kind);
/* Resolves a stream handle and takes a reference: 0 and cudaStreamLegacy
 * name the legacy stream of the current context, cudaStreamPerThread this
 * thread's stream of the current context (the caller made one current with
 * fc_rt_enter), anything else a created stream. Traps on a destroyed
 * stream. Returns cudaSuccess, cudaErrorInvalidResourceHandle, or
 * cudaErrorMemoryAllocation. */
cudaError_t fc_stream_get(cudaStream_t h, struct CUstream_st **out);
void fc_stream_put(struct CUstream_st *s);
/* The context a stream belongs to. */
CUcontext fc_stream_ctx(const struct CUstream_st *s);
/* Queues op (taking ownership) behind the implicit dependencies of the
 * legacy default stream; returns its sequence number. */
uint64_t fc_stream_submit(struct CUstream_st *s, struct fc_op *op);
void fc_stream_wait_seq(struct CUstream_st *s, uint64_t seq);
/* Waits until every stream of the process (of ctx only, when not NULL)
 * has drained what was queued. */
void fc_sync_all(CUcontext ctx);
/* Frees a cudaMallocAsync range (executes a FREE op). */
void fc_pool_free_now(void *ptr);
/* Live interprocess events this process may create (FAKECUDA_IPC_EVENTS_MAX,
 * fakecuda_set_ipc_event_limit); 0: no limit. */
long fc_ipc_event_limit(void);

#pragma GCC visibility pop

#endif
