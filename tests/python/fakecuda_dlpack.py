"""ctypes views of DLPack's C structures and of the CUDA test double, for
test_cuda_fake and the producer processes it starts."""

import ctypes

c_int64_p = ctypes.POINTER(ctypes.c_int64)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice),
                ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", c_int64_p), ("strides", c_int64_p),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


capi = ctypes.pythonapi
capi.PyCapsule_New.restype = ctypes.py_object
capi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                               ctypes.c_void_p]
capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
DLTENSOR = b"dltensor"   # a capsule's name must outlive it


def cuda(path):
    """The CUDA test double's runtime API (the calls the tests make)."""
    fc = ctypes.CDLL(path)
    fc.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    fc.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_size_t, ctypes.c_int]
    return fc
