"""The exceptions of dlshare: one class per DLSHARE_E* code of libdlshare.

Each carries the library's message (the daemon's explanation when it gave
one, e.g. "get weights/x: no such name") as str(e), and the code as e.code.
Where a builtin exception means the same thing, the class derives from it
too, so `except TimeoutError` and `except dlshare.Timeout` both work.
"""

from . import _dlshare


class Error(Exception):
    """Base class of everything dlshare raises for a failed call."""

    code = None

    @property
    def strerror(self):
        """The library's short name for the code ("no such name or version")."""
        return _dlshare.strerror(self.code) if self.code is not None else None


class InvalidArgument(Error, ValueError):
    code = -1


class NotFound(Error, LookupError):
    """No such name, or no such version (and no wait was asked for)."""
    code = -2


class KeyNotFound(NotFound, KeyError):
    """A key that a bundle (a version of many tensors) does not have: both
    NotFound and the KeyError a Mapping raises. e.args[0] is the key;
    str(e) names it, the name, the version and its tensor count."""

    def __init__(self, key, message=None):
        super().__init__(key)
        self.key = key
        self.message = message or f"no tensor with key {key!r}"

    def __str__(self):
        return self.message


class Timeout(Error, TimeoutError):
    """The wait for a version ran out."""
    code = -3


class PermissionDenied(Error, PermissionError):
    code = -4


class OutOfMemory(Error, MemoryError):
    code = -5


class LimitExceeded(Error):
    """A limit or quota of the daemon was reached."""
    code = -6


class ProtocolError(Error):
    code = -7


class ConnectionFailed(Error, ConnectionError):
    """No daemon at the socket, or the connection was lost."""
    code = -8


class VersionMismatch(Error):
    """The daemon speaks another protocol major version."""
    code = -9


class NotSupported(Error):
    """The buffer kind or the device is not supported."""
    code = -10


class SystemCallFailed(Error, OSError):
    code = -11


class Busy(Error):
    """The buffer is still mapped writable somewhere."""
    code = -12


class CopyForbidden(Error):
    """Publishing would copy, and copy=False forbade it."""
    code = -13


class DeviceUnavailable(Error):
    """The tensor's device is not visible to this process."""
    code = -14


class InvalidState(Error):
    """The version (or writer) is not in the state this needs."""
    code = -15


class TooBig(Error):
    """The request does not fit in one packet."""
    code = -16


class Closed(Error):
    """The client was closed."""
    code = -17


class ForkedClient(Error):
    """The client was created in another process: this one is a fork of it
    (os.fork, a multiprocessing or data-loader worker). The connection is
    the parent's; make a new Client in the child (in a DataLoader, in
    worker_init_fn)."""
    code = -18


class TooManyOpenFiles(Error, OSError):
    """This process had no free file descriptor (RLIMIT_NOFILE, see
    resource.setrlimit): for the buffers of a version it got — nothing was
    lost, the connection stays, and the same get works again once fds are
    free (close some, or raise the limit) — or for a socket or shared
    memory of its own (a new Client, dlshare.empty)."""
    code = -19


ERRORS = (InvalidArgument, NotFound, Timeout, PermissionDenied, OutOfMemory,
          LimitExceeded, ProtocolError, ConnectionFailed, VersionMismatch,
          NotSupported, SystemCallFailed, Busy, CopyForbidden,
          DeviceUnavailable, InvalidState, TooBig, Closed, ForkedClient,
          TooManyOpenFiles)

for _cls in (Error, KeyNotFound) + ERRORS:
    _cls.__module__ = "dlshare"
del _cls

_dlshare._set_errors({cls.code: cls for cls in ERRORS})
