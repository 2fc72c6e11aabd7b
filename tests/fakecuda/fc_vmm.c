/*
 * fakecuda virtual memory management (cuMemCreate and friends). An
 * allocation is a memfd (header page + data); exporting it gives a dup of the
 * memfd, which another process imports after receiving it with SCM_RIGHTS,
 * so the memory lives while any process holds a handle or a mapping.
 * Reservations are PROT_NONE anonymous mappings; cuMemMap maps the memfd over
 * them with no access, and cuMemSetAccess opens it, as on CUDA. VMM memory is
 * never accepted by cudaIpcGetMemHandle. Tables live under g_fc.mu.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fc_internal.h"

static struct fc_vmm *g_vmms;
static struct fc_resv *g_resvs;

/* Caller holds g_fc.mu. */
static struct fc_vmm *fc_vmm_find(CUmemGenericAllocationHandle h)
{
    for (struct fc_vmm *v = g_vmms; v; v = v->next)
        if ((CUmemGenericAllocationHandle)(uintptr_t)v == h && !v->released)
            return v;
    return NULL;
}

/* Frees the allocation once its handle is released and nothing maps it.
 * Caller holds g_fc.mu. */
static void fc_vmm_maybe_free(struct fc_vmm *v)
{
    if (!v->released || v->maps > 0)
        return;
    for (struct fc_vmm **pp = &g_vmms; *pp; pp = &(*pp)->next) {
        if (*pp == v) {
            *pp = v->next;
            break;
        }
    }
    close(v->fd);
    free(v);
}

static CUresult fc_check_prop(const CUmemAllocationProp *prop, int *phys)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    *phys = fc_phys_of_ordinal(prop->location.id);
    return *phys < 0 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

FC_API CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option)
{
    CUresult rc = fc_drv_enter();
    if (rc)
        return rc;
    int phys;
    if (!granularity)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = fc_check_prop(prop, &phys)))
        return rc;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = FC_VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

static CUresult fc_vmm_add(int fd, uint64_t id, size_t size, int phys, unsigned types,
                           CUmemGenericAllocationHandle *handle)
{
    struct fc_vmm *v = calloc(1, sizeof(*v));
    if (!v)
        return CUDA_ERROR_OUT_OF_MEMORY;
    v->id = id;
    v->fd = fd;
    v->size = size;
    v->phys_dev = phys;
    v->handle_types = types;
    pthread_mutex_lock(&g_fc.mu);
    v->next = g_vmms;
    g_vmms = v;
    pthread_mutex_unlock(&g_fc.mu);
    FC_COUNT(live_vmm_handles);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    CUresult rc = fc_drv_enter();
    if (rc)
        return rc;
    int phys;
    if (!handle || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = fc_check_prop(prop, &phys)))
        return rc;
    if (size == 0 || size % FC_VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    if ((prop->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ||
        (prop->requestedHandleTypes && !fc_vmm_fd_supported()))
        return CUDA_ERROR_NOT_SUPPORTED;
    FC_COUNT(vmm_create_calls);
    int fd = fc_memfd_new("fakecuda-vmm", size);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fc_mem_hdr hdr;
    memset(&hdr, 0, sizeof(hdr));
    hdr.magic = FC_MEM_MAGIC;
    hdr.kind = FC_MEM_KIND_VMM;
    hdr.id = fc_new_id();
    hdr.size = size;
    hdr.owner_pid = getpid();
    hdr.phys_dev = (uint32_t)phys;
    if (pwrite(fd, &hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr)) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rc = fc_vmm_add(fd, hdr.id, size, phys, (unsigned)prop->requestedHandleTypes, handle);
    if (rc)
        close(fd);
    return rc;
}

FC_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult rc = fc_drv_enter();
    if (rc)
        return rc;
    pthread_mutex_lock(&g_fc.mu);
    struct fc_vmm *v = fc_vmm_find(handle);
    if (!v) {
        pthread_mutex_unlock(&g_fc.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    v->released = true;
    fc_vmm_maybe_free(v);
    pthread_mutex_unlock(&g_fc.mu);
    FC_DROP(live_vmm_handles);
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType handleType,
                                             unsigned long long flags)
{
    CUresult rc = fc_drv_enter();
    if (rc)
        return rc;
    if (!shareableHandle || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_fc.mu);
    struct fc_vmm *v = fc_vmm_find(handle);
    /* Only what cuMemCreate was asked to make exportable. */
    if (!v || !(v->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        pthread_mutex_unlock(&g_fc.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
    pthread_mutex_unlock(&g_fc.mu);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    FC_COUNT(vmm_export_calls);
    *(int *)shareableHandle = fd; /* the caller owns it */
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                               CUmemAllocationHandleType shHandleType)
{
    CUresult rc = fc_drv_enter();
    if (rc)
        return rc;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int in = (int)(intptr_t)osHandle;
    struct fc_mem_hdr hdr;
    struct stat st;
    if (in < 0 || fstat(in, &st) < 0 ||
        pread(in, &hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr) || hdr.magic != FC_MEM_MAGIC ||
        hdr.kind != FC_MEM_KIND_VMM ||
        (uint64_t)st.st_size < fc_page_size() + hdr.size)
        return CUDA_ERROR_INVALID_VALUE;
    /* CUDA does not take the caller's fd: keep our own. */
    int fd = fcntl(in, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    FC_COUNT(vmm_import_calls);
    rc = fc_vmm_add(fd, hdr.id, hdr.size, (int)hdr.phys_dev,
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, handle);
    if (rc)
        close(fd);
    return rc;
}

FC_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags)
{
    CUresult rc = fc_drv_enter();
    if (rc)
        return rc;
    (void)addr; /* a hint; the fake always picks the address */
    if (!ptr || flags != 0 || size == 0 || size % FC_VMM_GRANULARITY ||
        (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment < FC_VMM_GRANULARITY)
        alignment = FC_VMM_GRANULARITY;
    struct fc_resv *rv = calloc(1, sizeof(*rv));
    if (!rv)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t len = size + alignment;
    char *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        free(rv);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uintptr_t base = ((uintptr_t)p + alignment - 1) & ~(uintptr_t)(alignment - 1);
    if (base > (uintptr_t)p)
        munmap(p, base - (uintptr_t)p);
    if ((uintptr_t)p + len > base + size)
        munmap((void *)(base + size), (uintptr_t)p + len - (base + size));
    rv->base = base;
    rv->size = size;
    pthread_mutex_lock(&g_fc.mu);
    rv->next = g_resvs;
    g_resvs = rv;
    pthread_mutex_unlock(&g_fc.mu);
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult rc = fc_drv_enter();
    if (rc)
        return rc;
    pthread_mutex_lock(&g_fc.mu);
    struct fc_resv **pp = &g_resvs;
    while (*pp && ((*pp)->base != (uintptr_t)ptr || (*pp)->size != size))
        pp = &(*pp)->next;
    struct fc_resv *rv = *pp;
    bool mapped = false;
    for (struct fc_range *r = g_fc.ranges; rv && r; r = r->next)
        mapped = mapped || (r->kind == FC_R_VMM && r->resv == rv);
    if (!rv || mapped) {
        pthread_mutex_unlock(&g_fc.mu);
        return CUDA_ERROR_INVALID_VALUE; /* unknown, or still mapped */
    }
    *pp = rv->next;
    pthread_mutex_unlock(&g_fc.mu);
    munmap((void *)rv->base, rv->size);
    free(rv);
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags)
{
    CUresult rc = fc_drv_enter();
    if (rc)
        return rc;
    uintptr_t p = (uintptr_t)ptr;
    /* CUDA 13: offset "currently must be zero". */
    if (flags != 0 || offset != 0 || size == 0 || size % FC_VMM_GRANULARITY ||
        p % FC_VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_range *r = calloc(1, sizeof(*r));
    if (!r)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_fc.mu);
    struct fc_vmm *v = fc_vmm_find(handle);
    struct fc_resv *rv = g_resvs;
    while (rv && !(p >= rv->base && p - rv->base <= rv->size && size <= rv->size - (p - rv->base)))
        rv = rv->next;
    bool busy = false;
    for (struct fc_range *o = g_fc.ranges; o; o = o->next)
        busy = busy || (p < o->base + o->size && o->base < p + size);
    if (!v || !rv || busy || size > v->size) {
        pthread_mutex_unlock(&g_fc.mu);
        free(r);
        return CUDA_ERROR_INVALID_VALUE;
    }
    void *m = mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, v->fd, (off_t)fc_page_size());
    if (m == MAP_FAILED) {
        pthread_mutex_unlock(&g_fc.mu);
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->kind = FC_R_VMM;
    r->base = p;
    r->size = size;
    r->phys_dev = v->phys_dev;
    r->fd = -1;
    r->vmm = v;
    r->resv = rv;
    r->prot = PROT_NONE; /* until cuMemSetAccess */
    v->maps++;
    fc_range_insert(r);
    pthread_mutex_unlock(&g_fc.mu);
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult rc = fc_drv_enter();
    if (rc)
        return rc;
    uintptr_t p = (uintptr_t)ptr;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_fc.mu);
    int whole = 0;
    for (struct fc_range *r = g_fc.ranges; r; r = r->next) {
        if (r->kind != FC_R_VMM || !(p < r->base + r->size && r->base < p + size))
            continue;
        if (r->base < p || r->base + r->size > p + size) {
            pthread_mutex_unlock(&g_fc.mu);
            return CUDA_ERROR_INVALID_VALUE; /* would split a mapping */
        }
        whole++;
    }
    if (!whole) {
        pthread_mutex_unlock(&g_fc.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (struct fc_range *r = g_fc.ranges, *next; r; r = next) {
        next = r->next;
        if (r->kind != FC_R_VMM || r->base < p || r->base + r->size > p + size)
            continue;
        fc_range_check_idle(r, "cuMemUnmap");
        fc_range_remove(r);
        /* Give the address range back to the reservation. */
        mmap((void *)r->base, r->size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        r->vmm->maps--;
        fc_vmm_maybe_free(r->vmm);
        free(r);
    }
    pthread_mutex_unlock(&g_fc.mu);
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    CUresult rc = fc_drv_enter();
    if (rc)
        return rc;
    if (!desc || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* Every device sees the same host pages: the widest access wins. */
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            return CUDA_ERROR_INVALID_VALUE;
        if (fc_phys_of_ordinal(desc[i].location.id) < 0)
            return CUDA_ERROR_INVALID_DEVICE;
        switch (desc[i].flags) {
        case CU_MEM_ACCESS_FLAGS_PROT_NONE: break;
        case CU_MEM_ACCESS_FLAGS_PROT_READ: prot |= PROT_READ; break;
        case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: prot |= PROT_READ | PROT_WRITE; break;
        default: return CUDA_ERROR_INVALID_VALUE;
        }
    }
    uintptr_t p = (uintptr_t)ptr, end = p + size;
    pthread_mutex_lock(&g_fc.mu);
    /* The range must be made of whole mappings, back to back. */
    for (uintptr_t cur = p; cur < end;) {
        struct fc_range *r = fc_range_find(cur);
        if (!r || r->kind != FC_R_VMM || r->base != cur || r->base + r->size > end) {
            pthread_mutex_unlock(&g_fc.mu);
            return CUDA_ERROR_INVALID_VALUE;
        }
        cur = r->base + r->size;
    }
    for (uintptr_t cur = p; cur < end;) {
        struct fc_range *r = fc_range_find(cur);
        mprotect((void *)r->base, r->size, prot);
        r->prot = prot;
        cur = r->base + r->size;
    }
    pthread_mutex_unlock(&g_fc.mu);
    return CUDA_SUCCESS;
}
