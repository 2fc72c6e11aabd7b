/*
 * fakecuda memory: cudaMalloc memory is a memfd (a header page, then the
 * data) mapped MAP_SHARED, so another process can map the same pages from an
 * IPC handle (exporter pid + memfd number, opened through /proc). Also copies
 * and memsets (queued on streams), host registration, pool allocations
 * (cudaMallocAsync: device memory that cannot be exported) and the pointer
 * queries. Every range CUDA knows about is in one per-process list under
 * g_fc.mu. Any thread may call the API functions.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fc_internal.h"

static _Atomic uint64_t fc_buffer_ids;

static size_t fc_round_page(size_t n)
{
    size_t page = fc_page_size();
    return (n + page - 1) / page * page;
}

/* ---- the range list ---------------------------------------------------------- */

struct fc_range *fc_range_find(uintptr_t addr)
{
    for (struct fc_range *r = g_fc.ranges; r; r = r->next)
        if (addr >= r->base && addr - r->base < (r->size ? r->size : 1))
            return r;
    return NULL;
}

static struct fc_range *fc_range_overlap(uintptr_t base, size_t size)
{
    for (struct fc_range *r = g_fc.ranges; r; r = r->next)
        if (base < r->base + r->size && r->base < base + size)
            return r;
    return NULL;
}

void fc_range_insert(struct fc_range *r)
{
    r->buffer_id = atomic_fetch_add(&fc_buffer_ids, 1) + 1;
    r->next = g_fc.ranges;
    g_fc.ranges = r;
}

void fc_range_remove(struct fc_range *r)
{
    for (struct fc_range **pp = &g_fc.ranges; *pp; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            return;
        }
    }
}

bool fc_range_is_device(const struct fc_range *r)
{
    return r->kind != FC_R_HOST;
}

static struct fc_range *fc_range_new(enum fc_range_kind kind, void *base, size_t size, int phys)
{
    struct fc_range *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->kind = kind;
    r->base = (uintptr_t)base;
    r->size = size;
    r->phys_dev = phys;
    r->fd = -1;
    return r;
}

/* Memory must not go away under queued stream work: on a GPU that is an
 * illegal-address fault, here it would be a crash in a worker. */
void fc_range_check_idle(struct fc_range *r, const char *what)
{
    int n = atomic_load(&r->pending);
    if (n > 0)
        fc_trap("%s of %p (%zu bytes) while %d queued stream operation(s) still use it; "
                "synchronise the stream (or wait on an event recorded after them) first",
                what, (void *)r->base, r->size, n);
}

/* ---- cudaMalloc / cudaFree ----------------------------------------------------- */

FC_API cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (!devPtr)
        return fc_rt_err(cudaErrorInvalidValue);
    FC_COUNT(malloc_calls);
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    size_t page = fc_page_size();
    size_t len = fc_round_page(size);
    int fd = fc_memfd_new("fakecuda-malloc", len);
    if (fd < 0)
        return fc_rt_err(cudaErrorMemoryAllocation);
    struct fc_mem_hdr *hdr = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (hdr == MAP_FAILED) {
        close(fd);
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    void *data = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)page);
    struct fc_range *r = data == MAP_FAILED ? NULL
                         : fc_range_new(FC_R_MALLOC, data, size,
                                        fc_phys_of_ordinal(fc_current_device()));
    if (!r) {
        if (data != MAP_FAILED)
            munmap(data, len);
        munmap(hdr, page);
        close(fd);
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    hdr->magic = FC_MEM_MAGIC;
    hdr->kind = FC_MEM_KIND_MALLOC;
    hdr->id = fc_new_id();
    hdr->size = size;
    hdr->owner_pid = getpid();
    hdr->phys_dev = (uint32_t)r->phys_dev;
    r->ctx = fc_ctx_current();
    r->fd = fd;
    r->hdr = hdr;
    r->map_len = len;
    r->alloc_id = hdr->id;
    pthread_mutex_lock(&g_fc.mu);
    fc_range_insert(r);
    pthread_mutex_unlock(&g_fc.mu);
    FC_COUNT(live_allocations);
    *devPtr = data;
    return cudaSuccess;
}

static void fc_range_release(struct fc_range *r)
{
    switch (r->kind) {
    case FC_R_MALLOC:
        munmap((void *)r->base, r->map_len);
        munmap(r->hdr, fc_page_size());
        close(r->fd);
        break;
    case FC_R_IMPORT:
        fc_peers_leave(&r->hdr->importers, getpid());
        munmap((void *)r->base, r->map_len);
        munmap(r->hdr, fc_page_size());
        break;
    case FC_R_POOL:
        munmap((void *)r->base, r->map_len);
        break;
    case FC_R_HOST:
        if (r->host_alloc)
            munmap((void *)r->base, r->map_len);
        break;
    case FC_R_VMM:
        break;
    }
    free(r);
}

FC_API cudaError_t cudaFree(void *devPtr)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (!devPtr)
        return cudaSuccess;
    /* cudaFree synchronises the device before it frees. */
    fc_sync_all(NULL);
    pid_t self = getpid();
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = fc_range_find((uintptr_t)devPtr);
    if (!r || r->base != (uintptr_t)devPtr || (r->kind != FC_R_MALLOC && r->kind != FC_R_POOL)) {
        pthread_mutex_unlock(&g_fc.mu);
        return fc_rt_err(cudaErrorInvalidValue);
    }
    fc_range_check_idle(r, "cudaFree");
    if (r->kind == FC_R_MALLOC) {
        /* Mark it freed first, then look for importers: an importer joins
         * first, then checks the mark, so one of the two sees the other. */
        atomic_store(&r->hdr->freed, 1);
        int others = fc_peers_others_alive(&r->hdr->importers, self);
        if (others > 0)
            fc_trap("cudaFree(%p) while %d other process(es) still have it open through "
                    "cudaIpcOpenMemHandle (undefined behaviour on CUDA)", devPtr, others);
    }
    fc_range_remove(r);
    pthread_mutex_unlock(&g_fc.mu);
    fc_range_release(r);
    FC_COUNT(free_calls);
    FC_DROP(live_allocations);
    return cudaSuccess;
}

/* ---- pool memory: cudaMallocAsync / cudaFreeAsync ------------------------------- */

FC_API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (!devPtr)
        return fc_rt_err(cudaErrorInvalidValue);
    struct CUstream_st *s;
    if ((e = fc_stream_get(hStream, &s)))
        return fc_rt_err(e);
    fc_stream_put(s);
    FC_COUNT(malloc_calls);
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    size_t len = fc_round_page(size);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return fc_rt_err(cudaErrorMemoryAllocation);
    struct fc_range *r = fc_range_new(FC_R_POOL, p, size, fc_phys_of_ordinal(fc_current_device()));
    if (!r) {
        munmap(p, len);
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    r->map_len = len;
    pthread_mutex_lock(&g_fc.mu);
    fc_range_insert(r);
    pthread_mutex_unlock(&g_fc.mu);
    FC_COUNT(live_allocations);
    *devPtr = p;
    return cudaSuccess;
}

/* ---- managed memory: cudaMallocManaged -------------------------------------------- */

/* Managed memory is device memory to the pointer queries (IS_MANAGED says
 * 1) that legacy IPC cannot export, as on CUDA; like all of the fake's
 * device memory the host can touch it too. It lives on the current
 * device, in the current context. */
FC_API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (!devPtr || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
        return fc_rt_err(cudaErrorInvalidValue);
    FC_COUNT(malloc_calls);
    if (size == 0)
        return fc_rt_err(cudaErrorInvalidValue);
    size_t len = fc_round_page(size);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return fc_rt_err(cudaErrorMemoryAllocation);
    struct fc_range *r = fc_range_new(FC_R_POOL, p, size, fc_phys_of_ordinal(fc_current_device()));
    if (!r) {
        munmap(p, len);
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    r->map_len = len;
    r->managed = true;
    r->ctx = fc_ctx_current();
    pthread_mutex_lock(&g_fc.mu);
    fc_range_insert(r);
    pthread_mutex_unlock(&g_fc.mu);
    FC_COUNT(live_allocations);
    *devPtr = p;
    return cudaSuccess;
}

void fc_pool_free_now(void *ptr)
{
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = fc_range_find((uintptr_t)ptr);
    if (!r || r->kind != FC_R_POOL || r->base != (uintptr_t)ptr)
        fc_trap("cudaFreeAsync(%p): the memory was freed before the free ran", ptr);
    fc_range_check_idle(r, "cudaFreeAsync");
    fc_range_remove(r);
    pthread_mutex_unlock(&g_fc.mu);
    fc_range_release(r);
    FC_DROP(live_allocations);
}

FC_API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (!devPtr)
        return cudaSuccess;
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = fc_range_find((uintptr_t)devPtr);
    bool ok = r && r->kind == FC_R_POOL && !r->managed && r->base == (uintptr_t)devPtr;
    pthread_mutex_unlock(&g_fc.mu);
    if (!ok)
        return fc_rt_err(cudaErrorInvalidValue);
    struct CUstream_st *s;
    if ((e = fc_stream_get(hStream, &s)))
        return fc_rt_err(e);
    struct fc_op *op = fc_op_new(FC_OP_FREE);
    if (!op) {
        fc_stream_put(s);
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    op->u.free.ptr = devPtr;
    FC_COUNT(free_calls);
    fc_stream_submit(s, op);
    fc_stream_put(s);
    return cudaSuccess;
}

/* ---- host memory ------------------------------------------------------------------ */

FC_API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (!ptr)
        return fc_rt_err(cudaErrorInvalidValue);
    if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    size_t len = fc_round_page(size);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return fc_rt_err(cudaErrorMemoryAllocation);
    struct fc_range *r = fc_range_new(FC_R_HOST, p, size, -1);
    if (!r) {
        munmap(p, len);
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    r->host_alloc = true;
    r->ctx = fc_ctx_current();
    r->map_len = len;
    pthread_mutex_lock(&g_fc.mu);
    fc_range_insert(r);
    pthread_mutex_unlock(&g_fc.mu);
    FC_COUNT(live_allocations);
    *ptr = p;
    return cudaSuccess;
}

FC_API cudaError_t cudaFreeHost(void *ptr)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (!ptr)
        return cudaSuccess;
    fc_sync_all(NULL);
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = fc_range_find((uintptr_t)ptr);
    if (!r || r->kind != FC_R_HOST || !r->host_alloc || r->base != (uintptr_t)ptr) {
        pthread_mutex_unlock(&g_fc.mu);
        return fc_rt_err(cudaErrorInvalidValue);
    }
    fc_range_check_idle(r, "cudaFreeHost");
    fc_range_remove(r);
    pthread_mutex_unlock(&g_fc.mu);
    fc_range_release(r);
    FC_DROP(live_allocations);
    return cudaSuccess;
}

FC_API cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    const unsigned known = cudaHostRegisterPortable | cudaHostRegisterMapped |
                           cudaHostRegisterIoMemory | cudaHostRegisterReadOnly;
    if (!ptr || !size || (flags & ~known))
        return fc_rt_err(cudaErrorInvalidValue);
    if (flags & cudaHostRegisterIoMemory)
        return fc_rt_err(cudaErrorNotSupported);
    /* Only where cudaDevAttrHostRegisterReadOnlySupported says 1. */
    if ((flags & cudaHostRegisterReadOnly) && !fc_host_register_readonly_supported())
        return fc_rt_err(cudaErrorNotSupported);
    struct fc_range *r = fc_range_new(FC_R_HOST, ptr, size, -1);
    if (!r)
        return fc_rt_err(cudaErrorMemoryAllocation);
    r->ctx = fc_ctx_current();
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *o = fc_range_overlap((uintptr_t)ptr, size);
    if (o) {
        pthread_mutex_unlock(&g_fc.mu);
        free(r);
        return fc_rt_err(o->kind == FC_R_HOST ? cudaErrorHostMemoryAlreadyRegistered
                                              : cudaErrorInvalidValue);
    }
    fc_range_insert(r);
    pthread_mutex_unlock(&g_fc.mu);
    return cudaSuccess;
}

FC_API cudaError_t cudaHostUnregister(void *ptr)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = ptr ? fc_range_find((uintptr_t)ptr) : NULL;
    if (!r || r->kind != FC_R_HOST || r->host_alloc || r->base != (uintptr_t)ptr) {
        pthread_mutex_unlock(&g_fc.mu);
        return fc_rt_err(cudaErrorHostMemoryNotRegistered);
    }
    fc_range_check_idle(r, "cudaHostUnregister");
    fc_range_remove(r);
    pthread_mutex_unlock(&g_fc.mu);
    fc_range_release(r);
    return cudaSuccess;
}

/* ---- copies and memsets --------------------------------------------------------- */

/* Checks that [p, p+n) lies in device range r and that the access is allowed.
 * Caller holds g_fc.mu. */
static cudaError_t fc_check_device_span(struct fc_range *r, uintptr_t p, size_t n, bool write)
{
    if (n > r->size || p - r->base > r->size - n)
        return cudaErrorInvalidValue;
    if (r->kind == FC_R_VMM) {
        int need = write ? PROT_WRITE : PROT_READ;
        if (!(r->prot & need))
            fc_trap("%s of VMM memory at %p without access (call cuMemSetAccess after cuMemMap)",
                    write ? "write" : "read", (void *)p);
    }
    return cudaSuccess;
}

static cudaError_t fc_memcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                             cudaStream_t stream, bool async)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return e;
    if ((unsigned)kind > (unsigned)cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    struct CUstream_st *s;
    /* The synchronous copy runs on the legacy default stream. */
    if ((e = fc_stream_get(async ? stream : NULL, &s)))
        return e;
    FC_COUNT(memcpy_calls);
    if (count == 0) {
        fc_stream_put(s);
        return cudaSuccess;
    }
    if (!dst || !src) {
        fc_stream_put(s);
        return cudaErrorInvalidValue;
    }
    struct fc_op *op = fc_op_new(FC_OP_COPY);
    if (!op) {
        fc_stream_put(s);
        return cudaErrorMemoryAllocation;
    }

    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *rd = fc_range_find((uintptr_t)dst);
    struct fc_range *rs = fc_range_find((uintptr_t)src);
    bool dd = rd && fc_range_is_device(rd), sd = rs && fc_range_is_device(rs);
    bool kind_ok = kind == cudaMemcpyDefault ||
                   (kind == cudaMemcpyHostToHost && !dd && !sd) ||
                   (kind == cudaMemcpyHostToDevice && dd && !sd) ||
                   (kind == cudaMemcpyDeviceToHost && !dd && sd) ||
                   (kind == cudaMemcpyDeviceToDevice && dd && sd);
    e = kind_ok ? cudaSuccess : cudaErrorInvalidValue;
    /* fault injection (FAKECUDA_FAIL_D2H, fakecuda_fail_d2h): the nth
     * device-to-host copy fails, once */
    if (!e && sd && !dd) {
        unsigned long nth = atomic_load(&g_set.fail_d2h);
        if (atomic_fetch_add(&g_set.d2h_seen, 1) + 1 == nth)
            e = cudaErrorLaunchFailure;
    }
    if (!e && dd)
        e = fc_check_device_span(rd, (uintptr_t)dst, count, true);
    if (!e && sd)
        e = fc_check_device_span(rs, (uintptr_t)src, count, false);
    if (e) {
        pthread_mutex_unlock(&g_fc.mu);
        free(op);
        fc_stream_put(s);
        return e;
    }
    if (rd) {
        atomic_fetch_add(&rd->pending, 1);
        op->touch[0] = rd;
    }
    if (rs) {
        atomic_fetch_add(&rs->pending, 1);
        op->touch[1] = rs;
    }
    pthread_mutex_unlock(&g_fc.mu);

    /* CUDA's documented host synchronisation ("API synchronization
     * behavior"): pageable sources are staged, so the call returns once the
     * source may be reused; copies into pageable memory return when done. */
    bool stage = !rs && dd;
    bool wait;
    if (async)
        wait = (!rd && sd) || (!dd && !sd);
    else
        wait = !stage && !(dd && sd);
    if (stage) {
        op->u.copy.staging = malloc(count);
        if (!op->u.copy.staging) {
            for (int i = 0; i < 2; i++)
                if (op->touch[i])
                    atomic_fetch_sub(&op->touch[i]->pending, 1);
            free(op);
            fc_stream_put(s);
            return cudaErrorMemoryAllocation;
        }
        memcpy(op->u.copy.staging, src, count);
    }
    op->u.copy.dst = dst;
    op->u.copy.src = src;
    op->u.copy.n = count;
    op->delay_us = atomic_load(&g_set.delay_us);
    uint64_t seq = fc_stream_submit(s, op);
    if (wait)
        fc_stream_wait_seq(s, seq);
    fc_stream_put(s);
    return cudaSuccess;
}

FC_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return fc_rt_err(fc_memcpy(dst, src, count, kind, NULL, false));
}

FC_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                   enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return fc_rt_err(fc_memcpy(dst, src, count, kind, stream, true));
}

/* Both memsets are asynchronous with respect to the host for device memory,
 * as on CUDA. */
static cudaError_t fc_memset(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return e;
    struct CUstream_st *s;
    if ((e = fc_stream_get(stream, &s)))
        return e;
    FC_COUNT(memset_calls);
    if (count == 0) {
        fc_stream_put(s);
        return cudaSuccess;
    }
    struct fc_op *op = fc_op_new(FC_OP_SET);
    if (!op) {
        fc_stream_put(s);
        return cudaErrorMemoryAllocation;
    }
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = devPtr ? fc_range_find((uintptr_t)devPtr) : NULL;
    e = r && fc_range_is_device(r) ? fc_check_device_span(r, (uintptr_t)devPtr, count, true)
                                   : cudaErrorInvalidValue;
    if (e) {
        pthread_mutex_unlock(&g_fc.mu);
        free(op);
        fc_stream_put(s);
        return e;
    }
    atomic_fetch_add(&r->pending, 1);
    op->touch[0] = r;
    pthread_mutex_unlock(&g_fc.mu);
    op->u.set.dst = devPtr;
    op->u.set.value = value;
    op->u.set.n = count;
    op->delay_us = atomic_load(&g_set.delay_us);
    fc_stream_submit(s, op);
    fc_stream_put(s);
    return cudaSuccess;
}

FC_API cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    return fc_rt_err(fc_memset(devPtr, value, count, NULL));
}

FC_API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    return fc_rt_err(fc_memset(devPtr, value, count, stream));
}

/* ---- legacy IPC memory ---------------------------------------------------------- */

FC_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (!handle || !devPtr)
        return fc_rt_err(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = fc_range_find((uintptr_t)devPtr);
    /* Only cudaMalloc memory: not pool (cudaMallocAsync) or VMM memory, not
     * a mapping opened from another process's handle, not host memory. An
     * interior pointer names the whole allocation, as on CUDA: the importer
     * gets the base and must add the offset itself. */
    if (!r || r->kind != FC_R_MALLOC) {
        pthread_mutex_unlock(&g_fc.mu);
        return fc_rt_err(cudaErrorInvalidValue);
    }
    struct fc_ipc_wire w = {
        .magic = FC_IPC_MEM_MAGIC,
        .pid = getpid(),
        .fd = r->fd,
        .phys_dev = (uint32_t)r->phys_dev,
        .id = r->alloc_id,
        .size = r->size,
    };
    pthread_mutex_unlock(&g_fc.mu);
    memcpy(handle->reserved, &w, sizeof(w));
    FC_COUNT(ipc_get_mem_calls);
    return cudaSuccess;
}

static struct fc_range *fc_find_import(int32_t pid, uint64_t id)
{
    for (struct fc_range *r = g_fc.ranges; r; r = r->next)
        if (r->kind == FC_R_IMPORT && r->exporter_pid == pid && r->alloc_id == id)
            return r;
    return NULL;
}

/* Maps the allocation a handle names. Caller holds g_fc.mu. */
static cudaError_t fc_import_map(const struct fc_ipc_wire *w, struct fc_range **out)
{
    size_t page = fc_page_size();
    int fd = fc_open_peer_fd(w->pid, w->fd);
    if (fd < 0)
        return cudaErrorInvalidValue; /* exporter gone, or the memory freed */
    struct fc_mem_hdr head;
    if (pread(fd, &head, sizeof(head), 0) != (ssize_t)sizeof(head) ||
        head.magic != FC_MEM_MAGIC || head.kind != FC_MEM_KIND_MALLOC || head.id != w->id ||
        head.owner_pid != w->pid || head.size != w->size || atomic_load(&head.freed)) {
        close(fd);
        return cudaErrorInvalidValue;
    }
    cudaError_t e = cudaErrorMemoryAllocation;
    size_t len = fc_round_page(w->size);
    struct fc_mem_hdr *hdr = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    void *data = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)page);
    close(fd);
    struct fc_range *r = NULL;
    if (hdr == MAP_FAILED || data == MAP_FAILED)
        goto fail;
    if (fc_peers_join(&hdr->importers, getpid()) < 0) {
        e = cudaErrorTooManyPeers;
        goto fail;
    }
    if (atomic_load(&hdr->freed)) {
        fc_peers_leave(&hdr->importers, getpid());
        e = cudaErrorInvalidValue;
        goto fail;
    }
    r = fc_range_new(FC_R_IMPORT, data, w->size, (int)w->phys_dev);
    if (!r) {
        fc_peers_leave(&hdr->importers, getpid());
        goto fail;
    }
    r->hdr = hdr;
    r->map_len = len;
    r->alloc_id = w->id;
    r->exporter_pid = w->pid;
    r->ctx = fc_ctx_current();
    r->open_refs = 1;
    *out = r;
    return cudaSuccess;
fail:
    if (data != MAP_FAILED)
        munmap(data, len);
    if (hdr != MAP_FAILED)
        munmap(hdr, page);
    return e;
}

FC_API cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    FC_COUNT(ipc_open_mem_calls);
    if (!devPtr || (flags & ~(unsigned)cudaIpcMemLazyEnablePeerAccess))
        return fc_rt_err(cudaErrorInvalidValue);
    struct fc_ipc_wire w;
    memcpy(&w, handle.reserved, sizeof(w));
    if (w.magic != FC_IPC_MEM_MAGIC)
        return fc_rt_err(cudaErrorInvalidValue);
    /* CUDA refuses to open a handle in the process that exported it
     * ("invalid device context"). */
    if (w.pid == getpid())
        return fc_rt_err(cudaErrorDeviceUninitialized);

    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = fc_find_import(w.pid, w.id);
    if (r) {
        if (atomic_load(&g_set.reopen) != FAKECUDA_REOPEN_REFCOUNT) {
            pthread_mutex_unlock(&g_fc.mu);
            return fc_rt_err(cudaErrorAlreadyMapped);
        }
        r->open_refs++;
        *devPtr = (void *)r->base;
        pthread_mutex_unlock(&g_fc.mu);
        return cudaSuccess;
    }
    e = fc_import_map(&w, &r);
    if (!e)
        fc_range_insert(r);
    pthread_mutex_unlock(&g_fc.mu);
    if (e)
        return fc_rt_err(e);
    FC_COUNT(ipc_mem_open_now);
    *devPtr = (void *)r->base;
    return cudaSuccess;
}

FC_API cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = devPtr ? fc_range_find((uintptr_t)devPtr) : NULL;
    if (!r || r->kind != FC_R_IMPORT || r->base != (uintptr_t)devPtr) {
        pthread_mutex_unlock(&g_fc.mu);
        return fc_rt_err(cudaErrorInvalidValue);
    }
    FC_COUNT(ipc_close_mem_calls);
    if (--r->open_refs > 0) {
        pthread_mutex_unlock(&g_fc.mu);
        return cudaSuccess;
    }
    fc_range_check_idle(r, "cudaIpcCloseMemHandle");
    fc_range_remove(r);
    pthread_mutex_unlock(&g_fc.mu);
    fc_range_release(r);
    FC_DROP(ipc_mem_open_now);
    return cudaSuccess;
}

/* ---- pointer queries -------------------------------------------------------------- */

FC_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                            const void *ptr)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (!attributes)
        return fc_rt_err(cudaErrorInvalidValue);
    memset(attributes, 0, sizeof(*attributes));
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = ptr ? fc_range_find((uintptr_t)ptr) : NULL;
    if (!r) {
        /* CUDA >= 11: unregistered host memory is not an error. */
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->device = cudaInvalidDeviceId;
    } else if (r->kind == FC_R_HOST) {
        attributes->type = cudaMemoryTypeHost;
        attributes->device = fc_current_device();
        attributes->devicePointer = (void *)ptr;
        attributes->hostPointer = (void *)ptr;
    } else {
        attributes->type = r->managed ? cudaMemoryTypeManaged : cudaMemoryTypeDevice;
        attributes->device = fc_ordinal_of_phys(r->phys_dev);
        attributes->devicePointer = (void *)ptr;
        attributes->hostPointer = NULL;
    }
    pthread_mutex_unlock(&g_fc.mu);
    return cudaSuccess;
}

/* Wants a current context (any: the pointer says where it lives). */
FC_API CUresult cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    CUresult rc = fc_drv_enter_ctx(NULL);
    if (rc)
        return rc;
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = fc_range_find((uintptr_t)dptr);
    if (!r || !fc_range_is_device(r)) {
        pthread_mutex_unlock(&g_fc.mu);
        return CUDA_ERROR_NOT_FOUND;
    }
    if (pbase)
        *pbase = (CUdeviceptr)r->base;
    if (psize)
        *psize = r->size;
    pthread_mutex_unlock(&g_fc.mu);
    return CUDA_SUCCESS;
}

/* Needs no current context: a unified address says where it lives (threads
 * with none, as in kvikio's pool, ask exactly this). */
FC_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    CUresult rc = fc_drv_enter();
    if (rc)
        return rc;
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = fc_range_find((uintptr_t)ptr);
    if (!r) {
        pthread_mutex_unlock(&g_fc.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    bool dev = fc_range_is_device(r);
    int ordinal = dev ? fc_ordinal_of_phys(r->phys_dev) : fc_current_device();
    rc = CUDA_SUCCESS;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        /* Pool and VMM memory belong to no context. */
        *(CUcontext *)data = r->ctx;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (dev)
            rc = CUDA_ERROR_INVALID_VALUE;
        else
            *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        *(unsigned long long *)data = r->buffer_id;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(int *)data = r->managed;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = ordinal;
        break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(int *)data = r->kind == FC_R_MALLOC;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = r->kind == FC_R_VMM ? r->resv->base : r->base;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = r->kind == FC_R_VMM ? r->resv->size : r->size;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        *(CUdeviceptr *)data = r->base;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        *(size_t *)data = r->size;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = 1;
        break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        *(unsigned long long *)data = r->kind == FC_R_VMM ? r->vmm->handle_types : 0;
        break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        if (r->kind == FC_R_VMM)
            *(unsigned int *)data = (r->prot & PROT_WRITE) ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
                                    : (r->prot & PROT_READ) ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
                                                            : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
        else
            *(unsigned int *)data = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
        break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *(void **)data = NULL;
        break;
    default:
        rc = CUDA_ERROR_INVALID_VALUE;
        break;
    }
    pthread_mutex_unlock(&g_fc.mu);
    return rc;
}

/* ---- fakecuda_ctl.h ------------------------------------------------------------ */

FC_API int fakecuda_mem_importers(const void *dev_ptr)
{
    if (g_fc.forked || !dev_ptr)
        return -EINVAL;
    pthread_mutex_lock(&g_fc.mu);
    struct fc_range *r = fc_range_find((uintptr_t)dev_ptr);
    int n = r && r->kind == FC_R_MALLOC ? fc_peers_others_alive(&r->hdr->importers, getpid())
                                        : -EINVAL;
    pthread_mutex_unlock(&g_fc.mu);
    return n;
}

FC_API int fakecuda_ipc_mem_handle_pid(const cudaIpcMemHandle_t *handle)
{
    if (!handle)
        return -EINVAL;
    struct fc_ipc_wire w;
    memcpy(&w, handle->reserved, sizeof(w));
    return w.magic == FC_IPC_MEM_MAGIC && w.pid > 0 ? w.pid : -EINVAL;
}
