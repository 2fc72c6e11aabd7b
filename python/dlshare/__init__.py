"""dlshare: named tensors handed between processes without a copy.

A consumer (any DLPack library takes what get() returns)::

    import dlshare, torch
    with dlshare.Client() as client:            # the default socket
        w = torch.from_dlpack(client.get("model/w"))

A producer::

    with dlshare.Client() as client:
        client.publish("batch/7", images, labels, keys=["images", "labels"])

The data never passes through the socket: host tensors live in sealed memfds
that every consumer maps read-only. ``publish`` copies ordinary memory (a
NumPy array, a CPU torch tensor) once into a daemon buffer; memory from
``dlshare.empty()`` is shared without any copy. ``create``/``seal`` let a
producer write straight into the daemon's buffer.

The package needs nothing beyond the standard library: the DLPack protocol
(``__dlpack__``/``__dlpack_device__``) is the interface to NumPy, PyTorch,
JAX and CuPy. Its C side, ``dlshare._dlshare``, is a CPython extension over
libdlshare; see python/README.md for why it is C and not ctypes.
"""

import collections
import dataclasses
import enum
import math
import os
import re
import sys as _sys
from collections.abc import Mapping

from . import _dlshare
from ._errors import (Error, InvalidArgument, NotFound, KeyNotFound, Timeout,
                      PermissionDenied, OutOfMemory, LimitExceeded,
                      ProtocolError, ConnectionFailed, VersionMismatch,
                      NotSupported, SystemCallFailed, Busy, CopyForbidden,
                      DeviceUnavailable, InvalidState, TooBig, Closed,
                      ForkedClient, TooManyOpenFiles)

__version__ = _dlshare.version()

__all__ = [
    "Client", "Tensor", "Bundle", "Writer", "Array", "TensorSpec",
    "NameInfo", "TensorInfo", "QueueInfo", "Stats", "UidStats",
    "DLDeviceType", "empty", "socket_path", "WAIT_FOREVER", "load_state_dict",
    "LoadResult", "StateDictMismatch",
    "Error", "InvalidArgument", "NotFound", "KeyNotFound", "Timeout",
    "PermissionDenied",
    "OutOfMemory", "LimitExceeded", "ProtocolError", "ConnectionFailed",
    "VersionMismatch", "NotSupported", "SystemCallFailed", "Busy",
    "CopyForbidden", "DeviceUnavailable", "InvalidState", "TooBig", "Closed",
    "ForkedClient", "TooManyOpenFiles",
]

#: Pass as ``timeout`` to wait for a version without limit.
WAIT_FOREVER = math.inf

_LATEST, _EXACT, _NEWER_THAN = 0, 1, 2
_KINDS = {1: "host", 2: "cuda-ipc", 3: "cuda-vmm"}
_U64 = (1 << 64) - 1


class DLDeviceType(enum.IntEnum):
    """DLPack's device types, as ``__dlpack_device__()`` reports them."""
    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLOpenCL = 4
    kDLVulkan = 7
    kDLMetal = 8
    kDLVPI = 9
    kDLROCM = 10
    kDLROCMHost = 11
    kDLExtDev = 12
    kDLCUDAManaged = 13
    kDLOneAPI = 14
    kDLWebGPU = 15
    kDLHexagon = 16


# Devices whose DLPack exchange takes a stream (the array API's rule).
_STREAM_DEVICES = (DLDeviceType.kDLCUDA, DLDeviceType.kDLROCM,
                   DLDeviceType.kDLCUDAManaged)


def _device(dev_type, dev_id):
    try:
        dev_type = DLDeviceType(dev_type)
    except ValueError:
        pass
    return (dev_type, dev_id)


def _device_arg(device):
    """(DLDeviceType, id) of a create() device: None (host), "cpu",
    "cuda", "cuda:N", "cuda_host", a (type, id) pair, or an object with
    ``type`` and ``index`` (torch.device)."""
    if device is None:
        return (int(DLDeviceType.kDLCPU), 0)
    if hasattr(device, "type") and hasattr(device, "index"):
        device = f"{device.type}:{device.index or 0}"
    if isinstance(device, str):
        kind, _, idx = device.partition(":")
        types = {"cpu": DLDeviceType.kDLCPU, "cuda": DLDeviceType.kDLCUDA,
                 "cuda_host": DLDeviceType.kDLCUDAHost}
        if kind not in types or (idx and not idx.isdigit()):
            raise ValueError(f"unknown device {device!r}: 'cpu', 'cuda', "
                             "'cuda:N' or 'cuda_host'")
        return (int(types[kind]), int(idx or 0))
    dev_type, dev_id = device
    return (int(dev_type), int(dev_id))


def socket_path():
    """The socket that Client() uses when given none (the rule DESIGN.md
    fixes: $DLSHARE_SOCKET, /run/dlshare/dlshared.sock,
    $XDG_RUNTIME_DIR/dlshare/dlshared.sock, /tmp/dlshare-$UID/...)."""
    return _dlshare.socket_path()


# ---- argument helpers ---------------------------------------------------

_NAME_RE = re.compile(r"[A-Za-z0-9._/-]{1,255}")


def _check_name(name):
    if not isinstance(name, str):
        raise TypeError(f"a name is a str, not {type(name).__name__}")
    segs = name.split("/")
    if (not _NAME_RE.fullmatch(name) or
            any(s in ("", ".", "..") for s in segs)):
        raise InvalidArgument(
            f"invalid name {name!r}: 1-255 bytes of [A-Za-z0-9._/-], no "
            "leading or trailing '/', no empty, '.' or '..' segment")
    return name


def _dtype_name(dtype):
    """'float32' from a str, a NumPy dtype or scalar type, a torch dtype."""
    if isinstance(dtype, str):
        s = dtype
    elif isinstance(getattr(dtype, "name", None), str):
        s = dtype.name                       # numpy.dtype
    elif isinstance(dtype, type):
        s = dtype.__name__                   # numpy.float32, float, bool
    else:
        s = str(dtype)                       # torch.float32
    s = s.rsplit(".", 1)[-1]
    s = {"bool_": "bool", "float": "float64", "int": "int64",
         "complex": "complex128", "half": "float16", "double": "float64",
         "cfloat": "complex64", "cdouble": "complex128"}.get(s, s)
    return _dlshare.dtype_check(s)


def _ttl_ms(ttl):
    """A TTL in seconds as the wire's milliseconds (0: none given)."""
    if ttl is None:
        return 0
    ms = round(float(ttl) * 1000)
    if ms <= 0 or ms > 0xFFFFFFFF:
        raise ValueError(f"ttl must be > 0 and at most {0xFFFFFFFF / 1000} "
                         f"seconds, not {ttl!r}")
    return ms


def _mode(mode):
    if mode is None:
        return 0
    mode = int(mode)
    if mode & ~0o666 or mode < 0:
        raise InvalidArgument(f"mode {mode:#o}: only the bits of 0666")
    return mode


def _stream_value(stream):
    """A stream argument as the C library takes it (a cudaStream_t)."""
    if stream is None:
        return 0                              # NULL: the legacy default
    if hasattr(stream, "cuda_stream"):        # torch.cuda.Stream, CuPy's
        stream = stream.cuda_stream or 1      # 0 is the legacy default
    stream = int(stream)
    if stream == 0:
        raise ValueError("stream 0 is ambiguous: pass None or 1 for the "
                         "legacy default stream, 2 for the per-thread one")
    return stream & _U64


def _queue_args(queue, wait):
    """queue=/wait= of publish() and create() as the extension takes them:
    () for an ordinary name, else (True, depth, wait_s)."""
    if queue is None or queue is False:
        if wait is not None:
            raise ValueError("wait= is for queue names (pass queue=)")
        return ()
    depth = 0 if queue is True else int(queue)
    if queue is not True and (depth <= 0 or depth > 0xFFFFFFFF):
        raise ValueError("queue must be True or a depth > 0")
    return (True, depth, _timeout_value(wait))


def _timeout_value(timeout):
    if timeout is None:
        return 0.0
    timeout = float(timeout)
    if math.isnan(timeout) or timeout < 0:
        raise ValueError("timeout must be None, >= 0 or WAIT_FOREVER")
    if math.isinf(timeout):
        return -1.0
    return timeout


def _torch_cpu_capsule(t):
    """A plain CPU torch tensor's capsule straight from torch's C exporter,
    or None. A state dict is 10^4-10^5 of them: torch's __dlpack_device__
    and __dlpack__ (twice before torch 2.3, which refuses max_version) were
    most of publish's Python time (10^4: ~100 ms of ~300). Anything
    unusual (grad, conjugate or negative bit, another layout or device,
    a dtype torch does not export) takes the general path."""
    try:
        if (t.device.type != "cpu" or t.requires_grad or t.is_conj() or
                t.is_neg() or t.layout is not _sys.modules["torch"].strided):
            return None
        return _sys.modules["torch"].utils.dlpack.to_dlpack(t)
    except (AttributeError, RuntimeError, TypeError, BufferError):
        return None


def _capsule_of(obj, stream):
    """A DLPack capsule of obj: asks for the versioned protocol first, and
    falls back on the buffer protocol (bytes, array.array, and the read-only
    arrays that NumPy < 2 refuses to export)."""
    if _dlshare.is_capsule(obj):
        return obj
    if type(obj).__module__ == "torch" or _is_torch(obj):
        cap = _torch_cpu_capsule(obj)
        if cap is not None:
            return cap
    if not hasattr(obj, "__dlpack__"):
        try:
            return _dlshare.buffer_capsule(obj)
        except TypeError:
            raise TypeError(f"{type(obj).__name__} supports neither DLPack "
                            "nor the buffer protocol") from None
    kw = {}
    if hasattr(obj, "__dlpack_device__"):
        dev = int(obj.__dlpack_device__()[0])
        if dev in _STREAM_DEVICES:
            # The producer makes this stream wait for its work; the library
            # records its event there.
            # DLPack takes an int: a stream object (torch.cuda.Stream,
            # CuPy's) gives its handle, and its 0 is the legacy default.
            if hasattr(stream, "cuda_stream"):
                stream = stream.cuda_stream or 1
            kw["stream"] = 1 if stream is None else int(stream)
    try:
        return obj.__dlpack__(max_version=(1, 0), **kw)
    except TypeError:
        pass
    except BufferError as e:
        if kw:
            raise
        return _buffer_fallback(obj, e)
    # DLPack < 1.0 producers (NumPy < 2, torch < 2.3) take no max_version.
    try:
        return obj.__dlpack__(**kw)
    except BufferError as e:
        if kw:
            raise
        return _buffer_fallback(obj, e)
    except RuntimeError:
        # torch < 2 exports no bool through DLPack ("Bool type is not
        # supported by dlpack"), and a state dict may hold a bool buffer:
        # a host one goes through NumPy's view of the same memory.
        if kw or not _is_torch(obj) or str(obj.dtype) != "torch.bool":
            raise
        return _dlshare.buffer_capsule(obj.detach().numpy())


# The dtypes DLPack gives a code to and dlshare takes (client/dtype.c).
_DTYPES = ("bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, "
           "float16, bfloat16, float32, float64, complex64, complex128")


def _buffer_fallback(obj, err):
    try:
        return _dlshare.buffer_capsule(obj)
    except (TypeError, BufferError, ValueError):
        # NumPy says BufferError (DLPack) or ValueError (buffer protocol)
        # and names no dtype: name it.
        dtype = getattr(obj, "dtype", None)
        if dtype is None:
            raise err from None
        what = f"{type(obj).__module__}.{type(obj).__qualname__}"
        try:
            _dtype_name(dtype)
        except (ValueError, TypeError):
            raise InvalidArgument(
                f"cannot publish a {what} of dtype {dtype}: DLPack has no "
                f"such dtype (dlshare takes {_DTYPES})") from None
        # A dtype DLPack has, which this exporter will not hand out
        # (NumPy and ml_dtypes' bfloat16; torch and JAX export theirs).
        raise InvalidArgument(
            f"cannot publish a {what} of dtype {dtype}: "
            f"{type(obj).__module__.split('.')[0]} exports it neither "
            f"through DLPack nor through the buffer protocol ({err})") from None


# ---- DLPack export, shared by Tensor and Array ----------------------------

class _DLPack:
    __slots__ = ()

    def __dlpack_device__(self):
        """(DLDeviceType, device id) of the tensor's memory."""
        return _device(*self._device_raw())

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None,
                   copy=None):
        """A DLPack capsule of this tensor, as the array API standard fixes:
        a versioned ``dltensor_versioned`` (flagged read-only where the
        memory is) when max_version >= (1, 0), else a ``dltensor``; a copy
        only with copy=True; BufferError for what cannot be honoured."""
        dev_type, dev_id = self._device_raw()
        self._check_stream(stream, dev_type)
        versioned = False
        if max_version is not None:
            major, _minor = max_version
            versioned = int(major) >= 1
        if dl_device is not None:
            want = (int(dl_device[0]), int(dl_device[1]))
            if want != (int(dev_type), int(dev_id)):
                raise BufferError(
                    f"the tensor is on device {(dev_type, dev_id)}, and "
                    f"dlshare does not move it to {want}")
        if copy and dev_type not in (DLDeviceType.kDLCPU,
                                     DLDeviceType.kDLCUDAHost):
            raise BufferError("copy=True is supported for host tensors only")
        return self._capsule(versioned, bool(copy))

    def _check_stream(self, stream, dev_type):
        if dev_type in _STREAM_DEVICES:
            if stream is not None and int(stream) == 0:
                raise ValueError("stream 0 is ambiguous under DLPack")
        elif stream is not None:
            raise BufferError("stream must be None for a tensor in host "
                              f"memory, not {stream!r}")


def _shape_str(dtype, shape):
    return f"{dtype}[{', '.join(str(n) for n in shape)}]"


# ---- consumer side --------------------------------------------------------

# NumPy's array-interface type strings of the dtypes NumPy has.
_TYPESTR = {"bool": "|b1", "int8": "|i1", "uint8": "|u1", "int16": "<i2",
            "uint16": "<u2", "int32": "<i4", "uint32": "<u4", "int64": "<i8",
            "uint64": "<u8", "float16": "<f2", "float32": "<f4",
            "float64": "<f8", "complex64": "<c8", "complex128": "<c16"}


class _ArrayHolder:
    """What Tensor.__array__ hands NumPy: the array interface of a tensor,
    and the capsule whose lease keeps its memory mapped."""

    __slots__ = ("_keep", "__array_interface__")

    def __init__(self, keep, interface):
        self._keep = keep
        self.__array_interface__ = interface


class Tensor(_DLPack):
    """One tensor of a version got from the daemon.

    It holds a lease: the memory stays valid and unchanged while this object,
    or any array a consumer made from it (``numpy.from_dlpack``,
    ``torch.from_dlpack``, ``jax.dlpack.from_dlpack``), lives. The memory is
    mapped read-only: with DLPack >= 1.0 consumers (NumPy >= 2.1) the arrays
    are read-only; older consumers cannot see that flag, and writing through
    their arrays crashes the process (SIGSEGV) rather than change the data.
    Ask for ``copy=True`` (``numpy.from_dlpack(t, copy=True)``) for a
    writable copy, or ``t.copy()`` / ``client.get(name, copy=True)`` for a
    private writable ``Array``. ``numpy.asarray(t)`` works too (read-only,
    through ``__array__``, for consumers without DLPack).
    """

    __slots__ = ("_b", "_i", "_info", "_owner", "_stream", "name", "key",
                 "version", "__weakref__")

    def __init__(self, bundle, index, name, key, stream, owner):
        self._b = bundle
        self._i = index
        self._info = bundle.info(index)
        self._owner = owner
        self._stream = stream
        self.name = name
        self.key = key
        self.version = bundle.version()

    # Geometry.
    @property
    def dtype(self):
        """The dtype's name ("float32", "bfloat16", ...)."""
        return self._info[0]

    @property
    def shape(self):
        return self._info[1]

    @property
    def strides(self):
        """Strides in elements, or None when compact row-major."""
        return self._info[2]

    @property
    def ndim(self):
        return len(self._info[1])

    @property
    def size(self):
        return math.prod(self._info[1])

    @property
    def itemsize(self):
        return self._info[6]

    @property
    def nbytes(self):
        return self.size * self._info[6]

    @property
    def device(self):
        return _device(self._info[3], self._info[4])

    @property
    def released(self):
        return self._b.released()

    def _device_raw(self):
        return self._info[3], self._info[4]

    def _check_stream(self, stream, dev_type):
        super()._check_stream(stream, dev_type)
        if dev_type in _STREAM_DEVICES and stream != -1:
            want = 1 if self._stream is None else self._stream
            got = 1 if stream is None else int(stream)
            if (got & _U64) != (_stream_value(want) or 1):
                # get() made its own stream wait for the producer; the
                # consumer names another one here: make that one wait too
                # (and order the release after it).
                self._b.wait(_stream_value(got))

    def _capsule(self, versioned, copy):
        return self._b.export(self._i, versioned, copy)

    def copy(self):
        """A private, writable, compact copy of this host tensor: an Array
        (buffer protocol and DLPack, both writable), made at memory speed
        without the GIL. It holds no lease and may be republished."""
        return self._b.copy_out(Array, self._i)

    def __array__(self, dtype=None, copy=None):
        """NumPy's conversion (``numpy.asarray(t)``, ``numpy.array(t)``):
        a read-only ndarray over the shared memory (no copy; it holds a
        lease of its own), or a writable copy with copy=True; dtype
        converts (a copy). For consumers without DLPack; the same with
        NumPy 1.x and 2.x (bool included, which NumPy < 2 refuses through
        DLPack)."""
        import numpy
        if int(self._info[3]) not in (DLDeviceType.kDLCPU,
                                      DLDeviceType.kDLCUDAHost):
            raise TypeError(f"{self!r} is in GPU memory: NumPy cannot read "
                            "it (copy it to the host with its framework)")
        typestr = _TYPESTR.get(self.dtype)
        if typestr is None:
            raise TypeError(f"NumPy has no dtype {self.dtype}: use a "
                            "framework that has it (torch.from_dlpack)")
        if copy:
            a = numpy.asarray(self.copy())
        elif self.size == 0:
            a = numpy.empty(self.shape, typestr)
            a.flags.writeable = False
        else:
            strides = self.strides
            if strides is not None:
                strides = tuple(s * self.itemsize for s in strides)
            # NumPy keeps the holder as the array's base, and the holder
            # keeps a capsule holding a lease of its own: the memory stays
            # while the array lives, whatever happens to this Tensor.
            a = numpy.asarray(_ArrayHolder(
                self._b.export(self._i, False, False),
                {"version": 3, "shape": self.shape, "typestr": typestr,
                 "strides": strides, "data": (self._info[5], True)}))
        if dtype is not None and numpy.dtype(dtype) != a.dtype:
            if copy is False:
                raise ValueError("converting the dtype needs a copy")
            a = a.astype(dtype)
        return a

    def release(self):
        """Drops this object's hold on the lease now (arrays made from the
        tensor keep theirs); further use raises BufferError. A tensor of a
        Bundle shares the bundle's hold: release the Bundle instead."""
        if self._owner:
            self._b.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        dev = self.device[0]
        dev = dev.name[3:].lower() if isinstance(dev, DLDeviceType) else dev
        key = f"[{self.key!r}]" if self.key else ""
        return (f"<dlshare.Tensor {self.name!r}{key} v{self.version} "
                f"{_shape_str(self.dtype, self.shape)} {dev}>")


class Bundle:
    """A version holding several tensors (or get_bundle()'s answer): a
    sequence of Tensor, also indexable by key. One lease holds them all; it
    goes once the bundle, its Tensors and the arrays made from them are
    gone, or at release()."""

    __slots__ = ("_b", "_n", "_keys", "_tensors", "_stream", "name",
                 "version")

    # A state dict has 10^3-10^5 tensors: nothing per tensor is built up
    # front. A key is found in O(1) by the library's index; Tensors and the
    # key list are made when first asked for.
    def __init__(self, bundle, name, stream):
        self._b = bundle
        self._n = bundle.count()
        self._keys = None
        self._tensors = {}
        self._stream = stream
        self.name = name
        self.version = bundle.version()

    def __len__(self):
        return self._n

    def _key(self, i):
        if self._keys is not None:
            return self._keys[i]
        return self._b.key(i)

    def _at(self, i):
        t = self._tensors.get(i)
        if t is None:
            t = Tensor(self._b, i, self.name, self._key(i), self._stream,
                       False)
            self._tensors[i] = t
        return t

    def _find(self, key):
        if self._keys is not None and self._b.released():
            try:
                return self._keys.index(key)
            except ValueError:
                return -1
        return self._b.find(key)

    def __getitem__(self, k):
        if isinstance(k, str):
            i = self._find(k)
            if i < 0:
                raise KeyNotFound(k, f"no tensor with key {k!r} in "
                                  f"{self.name} version {self.version} "
                                  f"({self._n} tensors)")
            return self._at(i)
        if isinstance(k, slice):
            return [self._at(i) for i in range(len(self))[k]]
        i = range(len(self))[k]            # IndexError, negative indices
        return self._at(i)

    def __iter__(self):
        return (self._at(i) for i in range(len(self)))

    def __contains__(self, key):
        return isinstance(key, str) and self._find(key) >= 0

    def keys(self):
        if self._keys is None:
            self._keys = self._b.keys()
        return list(self._keys)

    def values(self):
        return list(self)

    def items(self):
        return list(zip(self.keys(), self))

    def get(self, key, default=None):
        return self[key] if key in self else default

    def copy_into(self, state_dict, strict=True, stream=None):
        """Copies this version into existing tensors in place:
        ``load_state_dict(state_dict, self, strict, stream)``."""
        return load_state_dict(state_dict, self, strict=strict,
                               stream=stream)

    def release(self):
        """Drops the lease now, for every Tensor of this bundle (arrays made
        from them keep theirs)."""
        if self._keys is None and not self._b.released():
            self._keys = self._b.keys()    # they go with the lease
        self._b.release()

    @property
    def released(self):
        return self._b.released()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        keys = self.keys()
        shown = keys if len(keys) <= 8 else keys[:8] + ["..."]
        return (f"<dlshare.Bundle {self.name!r} v{self.version} "
                f"{len(keys)} tensors keys={shown!r}>")


# ---- producer side --------------------------------------------------------

class Array(_dlshare.Array, _DLPack):
    """Writable host memory that dlshare shares: ``dlshare.empty()`` (then
    ``publish`` hands it out without a copy) or a tensor of a Writer (store
    mode). Supports the buffer protocol (``numpy.asarray(a)``,
    ``memoryview(a)``) and DLPack (``numpy.from_dlpack(a)``,
    ``torch.from_dlpack(a)``), both writable.

    After publishing an ``empty()`` array, do not write it again: consumers
    read it in place. Allocate a new one for the next version; the memory
    goes once the daemon retired the version and no reference is left.
    """

    __slots__ = ()

    @property
    def dtype(self):
        return self._info()[0]

    @property
    def shape(self):
        return self._info()[1]

    @property
    def ndim(self):
        return len(self._info()[1])

    @property
    def size(self):
        return math.prod(self._info()[1])

    @property
    def itemsize(self):
        return self._info()[5]

    @property
    def nbytes(self):
        return self.size * self._info()[5]

    @property
    def device(self):
        return _device(*self._info()[2:4])

    def _device_raw(self):
        return self._info()[2:4]

    def _capsule(self, versioned, copy):
        return self._export(versioned, copy)

    def copy_from(self, src):
        """Copies src (any DLPack host tensor of the same dtype and shape,
        any strides) into this memory."""
        cap = _capsule_of(src, None)
        self._copy_from(cap)

    def __repr__(self):
        if not self._usable():
            return "<dlshare.Array (gone: writer sealed or aborted)>"
        return f"<dlshare.Array {_shape_str(self.dtype, self.shape)}>"


def empty(shape, dtype="float32"):
    """A new Array in shareable memory (a sealed memfd), zero-filled.
    Publishing it, or any DLPack view of it, needs no copy."""
    if isinstance(shape, int):
        shape = (shape,)
    return _dlshare.host_alloc(Array, _dtype_name(dtype), tuple(shape))


TensorSpec = collections.namedtuple("TensorSpec", "key dtype shape")
TensorSpec.__doc__ = ("One tensor for Client.create(): its key (or None), "
                      "dtype and shape.")


class Writer:
    """A pending version from Client.create(): write into ``w[i]`` or
    ``w["key"]`` (Arrays), then ``seal()``. As a context manager it seals on
    success and aborts on an exception.

    Sealing unmaps the writable memory, so every view made from the writer's
    Arrays (``numpy.asarray``, ``from_dlpack``, ``memoryview``) must be gone
    by then; seal() raises BufferError otherwise.
    """

    __slots__ = ("_w", "_arrays", "_index", "client", "name", "keys")

    def __init__(self, client, name, w, keys):
        self._w = w
        self._arrays = {}
        self._index = None      # key -> index, made at the first w["key"]
        self.client = client
        self.name = name
        self.keys = keys

    @property
    def version(self):
        """The version number sealing will publish."""
        return self._w.version()

    @property
    def done(self):
        return self._w.done()

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, k):
        if isinstance(k, str):
            # A state dict has 10^5 keys: a lookup by key is O(1), the
            # first unnamed-or-not occurrence of a key wins, as in a Bundle.
            if self._index is None:
                self._index = {}
                for j, key in enumerate(self.keys):
                    self._index.setdefault(key, j)
            try:
                i = self._index[k]
            except KeyError:
                raise KeyError(k) from None
        else:
            i = range(len(self.keys))[k]
        a = self._arrays.get(i)
        if a is None:
            a = self._arrays[i] = self._w.array(Array, i)
        return a

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def seal(self, stream=None):
        """Makes the version immutable and visible; returns its number."""
        return self._w.seal(_stream_value(stream))

    def abort(self):
        """Drops the pending version (a no-op once sealed or aborted)."""
        self._w.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._w.done():
            return
        if exc_type is None:
            self.seal()
        else:
            try:
                self.abort()
            except BufferError:
                pass  # views alive: the version goes with the connection

    def __repr__(self):
        state = " done" if self.done else ""
        return (f"<dlshare.Writer {self.name!r} v{self.version}{state} "
                f"keys={self.keys!r}>")


# ---- looking inside ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """A tensor of a version's manifest (no data)."""
    key: str
    dtype: str
    shape: tuple
    strides: tuple
    offset: int


@dataclasses.dataclass(frozen=True)
class QueueInfo:
    """What fills a queue name: at most ``depth`` versions are pending,
    queued or taken (and not released) at once."""
    depth: int           # the queue's depth
    queued: int          # sealed, waiting to be taken
    taken: int           # taken, not yet released
    pending: int         # created, not yet sealed
    waiting: int         # producers waiting for room (queue_info() only)


@dataclasses.dataclass(frozen=True)
class NameInfo:
    """What list() and stat() tell about a name."""
    name: str
    latest: int          # newest sealed version, 0 when none yet
    versions: int        # live versions (the newest and those leased)
    tensors: int         # tensors in the newest version
    bytes: int           # buffer bytes of the newest version
    leases: int          # leases on all its versions
    owner_uid: int
    mode: int
    kind: str            # "host", "cuda-ipc", "cuda-vmm"; None when unsealed
    exported: bool       # the newest version is a producer's own memory
    manifest: tuple = ()  # stat() only: TensorInfo of the newest version
    owned: bool = False  # goes when its owner's connection closes
    owner_pid: int = 0   # owned: the process of that connection
    ttl_ms: int = 0      # its TTL, 0 when none
    expires_in_ms: int = 0  # with a TTL: left until it is deleted
    queue: QueueInfo = None  # list() only: a queue name's QueueInfo
    # Where a relay mirrored the newest version from (protocol 1.5): the
    # node's name and the version's number there; None and 0: made here.
    origin_node: str = None
    origin_version: int = 0

    @classmethod
    def _of(cls, t, manifest=(), queue=None):
        return cls(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7],
                   _KINDS.get(t[8]), bool(t[9]),
                   tuple(TensorInfo(*m) for m in manifest),
                   bool(t[10]), t[11], t[12], t[13],
                   None if queue is None else QueueInfo(*queue),
                   t[14], t[15])


@dataclasses.dataclass(frozen=True)
class Stats:
    """The daemon's counters."""
    connections: int
    names: int
    versions: int
    leases: int
    buffers: int
    bytes: int
    parked: int
    requests: int
    uptime_ms: int
    expired: int = 0     # names deleted by their TTL since start
    orphaned: int = 0    # owned names deleted with their connection
    nuids: int = 0       # uids holding anything
    uids: tuple = ()     # UidStats of the top uids by bytes


@dataclasses.dataclass(frozen=True)
class UidStats:
    """What one uid holds (Stats.uids)."""
    uid: int
    connections: int
    names: int           # names it created
    versions: int        # versions charged to it as their producer
    bytes: int           # daemon-owned bytes of those
    leases: int          # leases its connections hold


# ---- the client ---------------------------------------------------------------

class Client:
    """A connection to dlshared.

    ``Client()`` finds the daemon by the default rule (see socket_path());
    ``Client("/path/to.sock")`` names the socket. Use it as a context
    manager, or call close(). One Client may be shared by threads: calls
    release the GIL, and a get() waiting for a version blocks only its
    caller.

    Tensors and bundles got from a client stay valid after it is closed.

    A Client belongs to the process that made it: in a forked child (a
    data-loader worker) every call on an inherited one raises ForkedClient,
    and closing or dropping it there leaves the parent's connection alone.
    Make the child's own Client in the child (worker_init_fn).

    ``timeout`` (seconds) bounds connecting: the socket's listener must take
    the connection and the daemon answer its Hello within it, else
    ``dlshare.Timeout`` (whose message names the socket). ``None``: 5 seconds (the
    library's DLSHARE_CONNECT_TIMEOUT_MS); a negative value waits forever.
    """

    def __init__(self, socket=None, timeout=None):
        path = None if socket is None else os.fsdecode(os.fspath(socket))
        if timeout is None:
            ms = 0
        elif timeout < 0:
            ms = -1
        else:
            # At least 1 ms: 0 would mean the default.
            ms = max(1, min(int(math.ceil(timeout * 1000)), 2**31 - 1))
        self._c = _dlshare.Client(path, ms)
        #: The socket path this client connected to.
        self.socket = path if path is not None else _dlshare.socket_path()

    def close(self):
        """Disconnects. Versions this client published by export without
        a reader are withdrawn; store versions stay."""
        self._c.close()

    @property
    def closed(self):
        return self._c.closed()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return f"<dlshare.Client {self.socket!r} {state}>"

    # Producing.
    def publish(self, name, *tensors, keys=None, mode=None, copy=None,
                stream=None, owned=False, ttl=None, queue=None, wait=None):
        """Publishes tensors as a new version of name; returns its number.

        tensors: objects with ``__dlpack__`` (NumPy, PyTorch, JAX, CuPy
        arrays, dlshare Arrays) or bare ``dltensor`` capsules (renamed
        ``used_dltensor`` once taken); a single dict publishes its values
        under its keys. Several tensors make a bundle; keys names them.

        Memory from dlshare.empty() is shared without a copy. Other host
        memory is copied once into a daemon buffer, unless copy=False, which
        raises CopyForbidden instead; copy=True always copies. mode: the
        permission bits (0o644 style) of a new name. stream: the producer's
        CUDA stream for device tensors (None: the legacy default stream).

        owned=True: the name belongs to this Client's connection and is
        deleted when it closes (also when the process dies); readers keep
        what they hold. ttl: seconds; the name is deleted when no version
        was sealed for that long (None: the name's TTL stays; a new name
        gets the daemon's --default-ttl). Needs a daemon of protocol 1.4.
        queue: publish into a queue name (see take()): True for the
        daemon's default depth, or the depth N (> 0); None publishes to an
        ordinary name. A name's kind and depth are fixed when it is first
        created; asking for another raises InvalidArgument. wait: when the
        queue is full, None raises LimitExceeded at once, a number of
        seconds waits for room (Timeout when none came), WAIT_FOREVER
        waits without limit. A shared dlshare.empty() array never waits.
        """
        _check_name(name)
        qargs = _queue_args(queue, wait)
        if len(tensors) == 1 and isinstance(tensors[0], Mapping):
            if keys is not None:
                raise TypeError("pass keys or a dict, not both")
            keys = list(tensors[0].keys())
            tensors = tuple(tensors[0].values())
        if not tensors:
            raise ValueError("publish needs at least one tensor")
        if keys is not None:
            keys = tuple(str(k) for k in keys)
            if len(keys) != len(tensors):
                raise ValueError(f"{len(keys)} keys for {len(tensors)} "
                                 "tensors")
        mode = _mode(mode)
        sv = _stream_value(stream)
        caps = tuple(_capsule_of(t, stream) for t in tensors)
        return self._c.publish(name, caps, keys, mode, copy is False,
                               copy is True, sv, bool(owned), _ttl_ms(ttl),
                               *qargs)

    def create(self, name, *specs, mode=None, device=None, owned=False,
               ttl=None, queue=None, wait=None, origin=None):
        """Creates a pending store-mode version of name in a daemon buffer
        and returns its Writer. specs: TensorSpec(key, dtype, shape),
        (key, dtype, shape) or (dtype, shape) tuples, or one dict
        {key: (dtype, shape)}. dtype: "float32", a NumPy dtype, a torch
        dtype. device: None (host memory), "cuda:N" (GPU memory the daemon
        allocates on this process's GPU N; seal(stream) then orders the
        consumers after the writes queued on stream), "cuda_host", a
        (DLDeviceType, id) pair or a torch.device. owned, ttl: the name's
        lifetime, as for publish().

        queue, wait: as publish()'s: the version goes into a queue name
        once sealed, and a full queue makes this wait for room (the
        pending version counts toward the depth from here on).

        origin: (node, version) when this version mirrors version of the
        same name on another node (what dlshare-relay does); stat() and
        list() show it. node: 1-64 printable ASCII bytes, no space."""
        qargs = _queue_args(queue, wait)
        if origin is not None:
            node, over = origin
            qargs = (qargs or (False, 0, 0.0)) + (str(node), int(over))
        dev_type, dev_id = _device_arg(device)
        _check_name(name)
        if len(specs) == 1 and isinstance(specs[0], Mapping):
            specs = tuple((k, d, s) for k, (d, s) in specs[0].items())
        norm = []
        for s in specs:
            s = tuple(s)
            if len(s) == 2:
                s = (None,) + s
            if len(s) != 3:
                raise TypeError("a spec is (key, dtype, shape) or "
                                "(dtype, shape)")
            key, dtype, shape = s
            if isinstance(shape, int):
                shape = (shape,)
            norm.append((None if key is None else str(key),
                         _dtype_name(dtype), tuple(int(n) for n in shape)))
        w = self._c.create(name, tuple(norm), _mode(mode), dev_type, dev_id,
                           bool(owned), _ttl_ms(ttl), *qargs)
        return Writer(self, name, w, tuple(k or "" for k, _, _ in norm))

    def seal(self, writer, stream=None):
        """writer.seal(stream): the version becomes immutable and visible."""
        return writer.seal(stream)

    # Consuming.
    def _get(self, name, version, newer_than, timeout, stream):
        _check_name(name)
        if version is not None and newer_than is not None:
            raise ValueError("pass version or newer_than, not both")
        if version is not None:
            select, v = _EXACT, int(version)
        elif newer_than is not None:
            select, v = _NEWER_THAN, int(newer_than)
        else:
            select, v = _LATEST, 0
        if v < 0:
            raise ValueError("versions are >= 0")
        return self._c.get(name, select, v, _timeout_value(timeout),
                           _stream_value(stream))

    def get(self, name, version=None, newer_than=None, timeout=None,
            stream=None, copy=False):
        """Gets a version of name: the newest, exactly ``version``, or the
        newest one newer than ``newer_than``. Returns a Tensor, or a Bundle
        when the version holds several tensors: read-only memory shared
        with every reader (writing through an older consumer's array, as
        torch 1.13's in-place ops, crashes the process).

        copy=True returns private, writable copies instead, made at memory
        speed and holding no lease: an Array (buffer protocol and DLPack:
        ``torch.from_dlpack(a)``, ``numpy.asarray(a)``), or for several
        tensors a dict of Arrays by key (a list when the version has no
        keys). Host tensors only.

        timeout: None fails at once (NotFound) when there is no such
        version; a number of seconds waits for one to be published (Timeout
        when none came); WAIT_FOREVER waits without limit. stream: the
        consumer's CUDA stream for device tensors (None: the legacy default
        stream, 1 the same, 2 per-thread, -1 no synchronisation, or a
        cudaStream_t / torch.cuda.Stream)."""
        b = self._get(name, version, newer_than, timeout, stream)
        if copy:
            return _copies(b)
        if b.count() == 1:
            return Tensor(b, 0, name, b.keys()[0], stream, True)
        return Bundle(b, name, stream)

    def get_bundle(self, name, version=None, newer_than=None, timeout=None,
                   stream=None):
        """As get(), but always a Bundle, also for one tensor."""
        return Bundle(self._get(name, version, newer_than, timeout, stream),
                      name, stream)

    def load_state_dict(self, name, state_dict, strict=True, newer_than=None,
                        timeout=None, stream=None):
        """Gets a version of name (the newest, or the newest newer than
        ``newer_than``, waiting up to timeout) and copies it into
        state_dict's tensors in place: ``dlshare.load_state_dict``. Returns
        the version's number (the next ``newer_than``)."""
        b = self.get_bundle(name, newer_than=newer_than, timeout=timeout,
                            stream=stream)
        with b:
            load_state_dict(state_dict, b, strict=strict, stream=stream)
        return b.version

    def take(self, name, timeout=None, stream=None):
        """Takes the oldest queued version of a queue name: this client
        alone gets it. Returns a Tensor, or a Bundle when it holds several
        tensors. Releasing it (release(), a with block, or dropping every
        reference, arrays made from it included) consumes the version and
        frees its room in the queue; if this process dies or the client
        closes first, the version goes back to the head of the queue for
        the next taker.

        timeout: None raises NotFound at once when nothing is queued; a
        number of seconds waits (Timeout when nothing came); WAIT_FOREVER
        waits without limit. A name that does not exist yet is waited for
        too. Takers waiting on one name are served in the order they came.
        get() on a queue name raises InvalidArgument."""
        b = self._take(name, timeout, stream)
        if b.count() == 1:
            return Tensor(b, 0, name, b.keys()[0], stream, True)
        return Bundle(b, name, stream)

    def take_bundle(self, name, timeout=None, stream=None):
        """As take(), but always a Bundle, also for one tensor."""
        return Bundle(self._take(name, timeout, stream), name, stream)

    def _take(self, name, timeout, stream):
        _check_name(name)
        return self._c.take(name, _timeout_value(timeout),
                            _stream_value(stream))

    def queue_info(self, name):
        """QueueInfo of a queue name (depth 0: name is no queue)."""
        return QueueInfo(*self._c.queue_stat(_check_name(name)))

    # Looking inside.
    def delete(self, name=None, *, prefix=None):
        """Removes name; leased data stays valid for its readers.

        delete(prefix="fg/") removes every name that starts with the prefix
        and that this uid may write (others are left alone), and returns
        how many it removed. Needs a daemon of protocol 1.4."""
        if (name is None) == (prefix is None):
            raise TypeError("pass a name or prefix=, not both or neither")
        if prefix is not None:
            if not isinstance(prefix, str) or not prefix:
                raise ValueError("prefix must be a non-empty str (an empty "
                                 "one would delete every name)")
            return self._c.delete_prefix(prefix)[0]
        if isinstance(name, str) and name.endswith("/"):
            raise ValueError(f"{name!r} is not a name (names never end in "
                             f"'/'); to delete the names under it: "
                             f"delete(prefix={name!r})")
        self._c.delete(_check_name(name))

    def list(self, prefix=""):
        """NameInfo of every name starting with prefix, in byte order."""
        return [NameInfo._of(t, queue=q)
                for t, q in self._c.list(prefix or "")]

    def stat(self, name):
        """NameInfo of name, with the newest version's manifest."""
        info, manifest = self._c.stat(_check_name(name))
        return NameInfo._of(info, manifest)

    def metrics(self):
        """The daemon's gauges and counters as Prometheus text (exposition
        format 0.0.4, a str): what `dlsharectl metrics` prints, for an
        exporter of one's own. dlsharectl(1) lists the families."""
        return self._c.metrics()

    def stats(self):
        """The daemon's counters (a Stats)."""
        d = self._c.stats()
        d["uids"] = tuple(UidStats(**u) for u in d["uids"])
        return Stats(**d)


def _copies(b):
    """Private copies of every tensor of the _dlshare.Bundle b (see
    Client.get(copy=True)); releases b."""
    try:
        n = b.count()
        arrays = [b.copy_out(Array, i) for i in range(n)]
        if n == 1:
            return arrays[0]
        keys = b.keys()
        if not any(keys):
            return arrays
        return dict(zip(keys, arrays))
    finally:
        b.release()


# ---- weight sync: a version into existing tensors --------------------------

LoadResult = collections.namedtuple("LoadResult",
                                    "missing_keys unexpected_keys")
LoadResult.__doc__ = ("What load_state_dict(strict=False) left out: keys "
                      "of the destination that the version lacks, and keys "
                      "of the version that the destination lacks.")


class StateDictMismatch(InvalidArgument):
    """load_state_dict found the version and the destination disagreeing
    (keys, shapes, dtypes); nothing was copied. ``missing_keys``,
    ``unexpected_keys`` and ``mismatched`` ({key: (want, got)}) say how."""

    def __init__(self, msg, missing=(), unexpected=(), mismatched=None):
        super().__init__(msg)
        self.missing_keys = list(missing)
        self.unexpected_keys = list(unexpected)
        self.mismatched = dict(mismatched or {})


def _source_items(src):
    """(key, tensor) pairs of a Bundle, a Tensor or a mapping."""
    if isinstance(src, Bundle):
        return list(zip(src.keys(), src))
    if isinstance(src, Tensor):
        return [(src.key, src)]
    if isinstance(src, Mapping):
        return list(src.items())
    raise TypeError("the source is a dlshare Bundle, a Tensor or a mapping "
                    f"of key to tensor, not {type(src).__name__}")


def _geometry(x, key, what):
    """(dtype name, shape) of a tensor of any kind."""
    try:
        return _dtype_name(x.dtype), tuple(int(n) for n in x.shape)
    except (AttributeError, TypeError, ValueError):
        raise TypeError(f"{what} {key!r} is a {type(x).__name__}, not a "
                        "tensor with a dtype and a shape") from None


def _copyable_into(dst):
    return (isinstance(dst, Array) or _is_torch(dst) or
            type(dst).__module__ == "numpy")


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _torch_source(src):
    """A torch view of a received tensor (no copy)."""
    import torch
    try:
        return torch.from_dlpack(src)
    except (RuntimeError, BufferError, TypeError):
        # torch 1.13 refuses DLPack's bool (kDLBool): through NumPy.
        if getattr(src, "dtype", None) != "bool":
            raise
    import numpy
    import warnings
    with warnings.catch_warnings():
        # Read-only memory: nothing writes through this view.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(numpy.asarray(src))


def _copy_one(dst, src, stream):
    """dst[...] = src for one pair whose geometry was checked."""
    if isinstance(dst, Array):
        dst.copy_from(src)
    elif _is_torch(dst):
        import torch
        s = src if _is_torch(src) else _torch_source(src)
        with torch.no_grad():
            dst.copy_(s)
    elif type(dst).__module__ == "numpy":
        import numpy
        # numpy.asarray: __array__ (bool too, which NumPy < 2 refuses
        # through DLPack).
        numpy.copyto(dst, numpy.asarray(src), casting="no")
    else:
        raise TypeError(f"cannot copy into a {type(dst).__name__}: "
                        "destinations are torch tensors, NumPy arrays and "
                        "dlshare Arrays")


def load_state_dict(state_dict, source, strict=True, stream=None):
    """Copies a received version into existing tensors in place, as an
    inference process updating its model does: ``state_dict`` maps keys to
    the destination tensors (``model.state_dict()``: torch tensors sharing
    the parameters' memory; NumPy arrays; dlshare Arrays), ``source`` is
    the Bundle (or Tensor, or a mapping) got from the daemon.

    Every key, shape and dtype is checked first, as torch's
    ``load_state_dict(strict=True)`` does: keys of the destination missing
    from the version and keys of the version the destination lacks are
    errors under strict (both named), a shape or dtype that differs always
    is; then StateDictMismatch is raised and nothing is copied. Returns a
    LoadResult (missing_keys, unexpected_keys).

    GPU destinations: torch copies on its current stream, or on ``stream``
    (a torch.cuda.Stream) when given; the version's tensors made that
    stream wait for the producer's event (DLPack's stream exchange, the
    library's stream-ordered wait), so the copy runs after the producer's
    writes and the host does not wait.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError("state_dict is a mapping of key to tensor, not "
                        f"{type(state_dict).__name__}")
    if isinstance(source, Bundle) and not source.released:
        return _load_bundle(state_dict, source, strict, stream)
    items = _source_items(source)
    src = dict(items)
    missing = [k for k in state_dict if k not in src]
    unexpected = [k for k, _ in items if k not in state_dict]
    mismatched = _mismatches(state_dict, src, state_dict.keys())
    _refuse_mismatch(source, strict, missing, unexpected, mismatched)
    pairs = [(state_dict[k], src[k]) for k, _ in items if k in state_dict]
    _copy_pairs(pairs, stream)
    return LoadResult(missing, unexpected)


def _mismatches(state_dict, src, keys):
    """{key: (want, got)} of the keys (of both) whose geometry differs."""
    mismatched = {}
    for k in keys:
        if k in src:
            dst = state_dict[k]
            if not _copyable_into(dst):
                raise TypeError(f"cannot copy into {k!r}, a "
                                f"{type(dst).__name__}: destinations are "
                                "torch tensors, NumPy arrays and dlshare "
                                "Arrays")
            # Refused before anything is copied, not halfway.
            if (type(dst).__module__ == "numpy" and
                    not dst.flags.writeable):
                raise ValueError(f"cannot copy into {k!r}: a read-only "
                                 "NumPy array")
            want = _geometry(dst, k, "the destination")
            got = _geometry(src[k], k, "the source")
            if want != got:
                mismatched[k] = (want, got)
    return mismatched


def _refuse_mismatch(source, strict, missing, unexpected, mismatched):
    if mismatched or (strict and (missing or unexpected)):
        what = []
        if strict and missing:
            what.append("missing key(s) in the version: " +
                        ", ".join(repr(k) for k in missing))
        if strict and unexpected:
            what.append("unexpected key(s) in the version: " +
                        ", ".join(repr(k) for k in unexpected))
        for k, (want, got) in mismatched.items():
            what.append(f"{k!r}: the version has {_shape_str(*got)}, the "
                        f"destination {_shape_str(*want)}")
        name = getattr(source, "name", None)
        ver = getattr(source, "version", None)
        head = f"{name} v{ver}" if name else "the version"
        raise StateDictMismatch(
            f"cannot load {head} into the state dict (nothing copied): " +
            "; ".join(what), missing, unexpected, mismatched)


def _copy_pairs(pairs, stream):
    if stream is not None and any(_is_torch(d) and d.is_cuda
                                  for d, _ in pairs):
        import torch
        with torch.cuda.stream(stream):
            for dst, s in pairs:
                _copy_one(dst, s, stream)
    else:
        for dst, s in pairs:
            _copy_one(dst, s, stream)


def _host_view(dst):
    """A NumPy array over dst's memory when dst is host memory the library
    may copy into directly (NumPy arrays, CPU torch tensors); else None."""
    if type(dst).__module__ == "numpy":
        return dst
    if _is_torch(dst) and dst.device.type == "cpu":
        try:
            return dst.detach().numpy()
        except (TypeError, RuntimeError):   # bfloat16, conjugate views
            return None
    return None


class _BundleKeys(Mapping):
    """A Bundle's tensors by key, made only for the keys asked for."""

    def __init__(self, bundle, index):
        self._bundle, self._index = bundle, index

    def __getitem__(self, k):
        return self._bundle._at(self._index[k])

    def __contains__(self, k):
        return k in self._index

    def __iter__(self):
        return iter(self._index)

    def __len__(self):
        return len(self._index)


def _load_bundle(state_dict, b, strict, stream):
    """load_state_dict from a Bundle: a state dict has 10^5 tensors, so no
    Tensor object is made for a host destination of the version's dtype and
    shape (the library checks and copies those in one call, in C); the
    rest take the general path, which names what is wrong."""
    keys = b._b.keys()
    index = dict(zip(keys, range(len(keys))))   # the last of a key wins
    missing = [k for k in state_dict if k not in index]
    unexpected = [k for k in keys if k not in state_dict]
    fast_i, fast_d, fast_k, slow = [], [], [], []
    for k, dst in state_dict.items():
        j = index.get(k)
        if j is None:
            continue
        view = _host_view(dst)
        if view is None:
            slow.append(k)
        else:
            fast_i.append(j)
            fast_d.append(view)
            fast_k.append(k)
    bad = b._b.host_copy(fast_i, fast_d, False)
    if bad:
        drop = set(bad)
        slow += [fast_k[p] for p in bad]
        keep = [p for p in range(len(fast_i)) if p not in drop]
        fast_i = [fast_i[p] for p in keep]
        fast_d = [fast_d[p] for p in keep]
    src = _BundleKeys(b, index)
    mismatched = _mismatches(state_dict, src, slow)
    _refuse_mismatch(b, strict, missing, unexpected, mismatched)
    b._b.host_copy(fast_i, fast_d, True)
    _copy_pairs([(state_dict[k], src[k]) for k in slow], stream)
    return LoadResult(missing, unexpected)
