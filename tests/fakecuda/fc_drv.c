/*
 * fakecuda driver twins of runtime calls: the events, streams, IPC handles,
 * host registration and copies of the driver API, served by the runtime's
 * code in a current context (never a lazily created one: the driver has
 * none), with CUresult codes, leaving the runtime's last error alone; and
 * cuGetProcAddress, which hands out every driver function of the fake by
 * its base name. Any thread.
 */
#include <string.h>

#include "fc_internal.h"

static CUresult fc_cu_of(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return CUDA_SUCCESS;
    case cudaErrorInvalidValue: return CUDA_ERROR_INVALID_VALUE;
    case cudaErrorInvalidMemcpyDirection: return CUDA_ERROR_INVALID_VALUE;
    case cudaErrorMemoryAllocation: return CUDA_ERROR_OUT_OF_MEMORY;
    case cudaErrorInitializationError: return CUDA_ERROR_NOT_INITIALIZED;
    case cudaErrorNoDevice: return CUDA_ERROR_NO_DEVICE;
    case cudaErrorInvalidDevice: return CUDA_ERROR_INVALID_DEVICE;
    case cudaErrorDeviceUninitialized: return CUDA_ERROR_INVALID_CONTEXT;
    case cudaErrorAlreadyMapped: return CUDA_ERROR_ALREADY_MAPPED;
    case cudaErrorInvalidResourceHandle: return CUDA_ERROR_INVALID_HANDLE;
    case cudaErrorNotReady: return CUDA_ERROR_NOT_READY;
    case cudaErrorTooManyPeers: return CUDA_ERROR_TOO_MANY_PEERS;
    case cudaErrorHostMemoryAlreadyRegistered: return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    case cudaErrorHostMemoryNotRegistered: return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    case cudaErrorNotSupported: return CUDA_ERROR_NOT_SUPPORTED;
    case cudaErrorDevicesUnavailable: return CUDA_ERROR_DEVICE_UNAVAILABLE;
    case cudaErrorContextIsDestroyed: return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    default: return CUDA_ERROR_UNKNOWN;
    }
}

/* Runs a runtime call as the driver's: a current context is required. */
#define FC_DRV(call)                                                               \
    do {                                                                           \
        CUresult r_ = fc_drv_enter_ctx(NULL);                                      \
        if (r_)                                                                    \
            return r_;                                                             \
        fc_drv_begin();                                                            \
        cudaError_t e_ = (call);                                                   \
        fc_drv_end();                                                              \
        return fc_cu_of(e_);                                                       \
    } while (0)

FC_API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    FC_DRV(cudaEventCreateWithFlags((cudaEvent_t *)phEvent, Flags));
}

FC_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    FC_DRV(cudaEventRecord(hEvent, hStream));
}

FC_API CUresult cuEventQuery(CUevent hEvent)
{
    FC_DRV(cudaEventQuery(hEvent));
}

FC_API CUresult cuEventSynchronize(CUevent hEvent)
{
    FC_DRV(cudaEventSynchronize(hEvent));
}

FC_API CUresult cuEventDestroy(CUevent hEvent)
{
    FC_DRV(cudaEventDestroy(hEvent));
}

FC_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    FC_DRV(cudaStreamCreateWithFlags((cudaStream_t *)phStream, Flags));
}

FC_API CUresult cuStreamDestroy(CUstream hStream)
{
    FC_DRV(cudaStreamDestroy(hStream));
}

FC_API CUresult cuStreamSynchronize(CUstream hStream)
{
    FC_DRV(cudaStreamSynchronize(hStream));
}

FC_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    FC_DRV(cudaStreamWaitEvent(hStream, hEvent, Flags));
}

FC_API CUresult cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                  CUstream hStream)
{
    FC_DRV(cudaMemcpyAsync((void *)(uintptr_t)dstDevice, (const void *)(uintptr_t)srcDevice,
                           ByteCount, cudaMemcpyDeviceToDevice, hStream));
}

FC_API CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    FC_DRV(cudaHostRegister(p, bytesize, Flags));
}

FC_API CUresult cuMemHostUnregister(void *p)
{
    FC_DRV(cudaHostUnregister(p));
}

FC_API CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    cudaIpcMemHandle_t h;
    CUresult r = fc_drv_enter_ctx(NULL);
    if (r)
        return r;
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    fc_drv_begin();
    cudaError_t e = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)dptr);
    fc_drv_end();
    if (!e)
        memcpy(pHandle->reserved, h.reserved, sizeof(h.reserved));
    return fc_cu_of(e);
}

FC_API CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    cudaIpcMemHandle_t h;
    void *p = NULL;
    CUresult r = fc_drv_enter_ctx(NULL);
    if (r)
        return r;
    if (!pdptr)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(h.reserved, handle.reserved, sizeof(h.reserved));
    fc_drv_begin();
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, Flags);
    fc_drv_end();
    if (!e)
        *pdptr = (CUdeviceptr)(uintptr_t)p;
    return fc_cu_of(e);
}

FC_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    FC_DRV(cudaIpcCloseMemHandle((void *)(uintptr_t)dptr));
}

FC_API CUresult cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event)
{
    cudaIpcEventHandle_t h;
    CUresult r = fc_drv_enter_ctx(NULL);
    if (r)
        return r;
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    fc_drv_begin();
    cudaError_t e = cudaIpcGetEventHandle(&h, event);
    fc_drv_end();
    if (!e)
        memcpy(pHandle->reserved, h.reserved, sizeof(h.reserved));
    return fc_cu_of(e);
}

FC_API CUresult cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle)
{
    cudaIpcEventHandle_t h;
    memcpy(h.reserved, handle.reserved, sizeof(h.reserved));
    FC_DRV(cudaIpcOpenEventHandle((cudaEvent_t *)phEvent, h));
}

/* ---- cuGetProcAddress ------------------------------------------------------ */

/* Every driver function of the fake, by base name: X(name) gives the
 * string before macro expansion (the base name cuGetProcAddress is asked
 * for) and the function after it (the versioned symbol CUDA 13's header
 * names, e.g. cuIpcOpenMemHandle_v2). */
#define FC_DRV_FUNCS(X)                                                            \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet)             \
    X(cuDeviceGetUuid) X(cuDeviceGetName) X(cuDeviceGetAttribute)                  \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                       \
    X(cuDevicePrimaryCtxGetState) X(cuCtxCreate) X(cuCtxDestroy)                   \
    X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuStreamGetCtx)      \
    X(cuGetErrorString) X(cuGetErrorName) X(cuPointerGetAttribute)                 \
    X(cuMemGetAddressRange) X(cuMemGetAllocationGranularity) X(cuMemCreate)        \
    X(cuMemRelease) X(cuMemExportToShareableHandle)                                \
    X(cuMemImportFromShareableHandle) X(cuMemAddressReserve) X(cuMemAddressFree)   \
    X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuEventCreate) X(cuEventRecord)  \
    X(cuEventQuery) X(cuEventSynchronize) X(cuEventDestroy) X(cuStreamCreate)      \
    X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamWaitEvent)                 \
    X(cuMemcpyDtoDAsync) X(cuMemHostRegister) X(cuMemHostUnregister)              \
    X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)              \
    X(cuIpcGetEventHandle) X(cuIpcOpenEventHandle) X(cuGetProcAddress)

struct fc_proc {
    const char *name;
    void *fn;
    int max_version; /* newer requests get another ABI, which the fake lacks */
};

#define FC_PROC(f) { #f, (void *)(f), 0 },
static const struct fc_proc fc_procs[] = { FC_DRV_FUNCS(FC_PROC) };
#undef FC_PROC

/* Base names whose ABI changed after the variant the fake has: a caller
 * that asks for a newer CUDA version would get a function of another
 * signature from a real driver, so the fake gives it none. */
static const struct fc_proc fc_newer_abi[] = {
    /* _v2 variants (green contexts, an explicit context) came after 12.0;
     * the fake has only the first. */
    { "cuStreamGetCtx", NULL, 12000 },
    { "cuCtxGetDevice", NULL, 12000 },
};

FC_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *symbolStatus)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (symbolStatus)
        *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    /* The driver's own version bounds what may be asked for. */
    if (cudaVersion > CUDA_VERSION)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof(fc_newer_abi) / sizeof(fc_newer_abi[0]); i++)
        if (!strcmp(symbol, fc_newer_abi[i].name) && cudaVersion > fc_newer_abi[i].max_version)
            return CUDA_SUCCESS;
    for (size_t i = 0; i < sizeof(fc_procs) / sizeof(fc_procs[0]); i++) {
        if (strcmp(symbol, fc_procs[i].name) == 0) {
            *pfn = fc_procs[i].fn;
            if (symbolStatus)
                *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_SUCCESS;
}
