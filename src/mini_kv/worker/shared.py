"""Tensors two processes share: the judge's inputs and outputs, seen by the subject at stable addresses.

A buffer is a file descriptor both processes map. On the CPU a sealed memfd (no side can shrink it
under the other's mapping, which would be a SIGBUS in the judge). On CUDA a cuMem allocation exported
as a POSIX file descriptor (`cuMemExportToShareableHandle`): legacy CUDA IPC handles name a process
by pid and do not work across the jail's PID namespace, a file descriptor passed over the socket
does. Either way a buffer travels once; later messages name it by number (`Buffer.id`).
"""

from __future__ import annotations

import collections
import ctypes
import fcntl
import functools
import gc
import mmap
import os
from dataclasses import dataclass

import numpy as np
import torch

SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class SharedMemoryError(RuntimeError):
    """A buffer that cannot be made or mapped (also one the other side sent unsealed)."""


@dataclass(frozen=True)
class SharedView:
    """Where a tensor lies in a shared buffer: what a message says instead of the bytes."""

    buf: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0  # in elements

    @classmethod
    def from_dict(cls, d: dict) -> SharedView:
        """A spec from a message, its fields of the right types (a KeyError, TypeError or ValueError if not)."""
        if not hasattr(torch, str(d["dtype"])) or not isinstance(
            getattr(torch, str(d["dtype"])), torch.dtype
        ):
            raise ValueError(f"unknown dtype {d['dtype']!r}")
        shape, stride = tuple(map(int, d["shape"])), tuple(map(int, d["stride"]))
        if len(shape) != len(stride) or any(x < 0 for x in (*shape, *stride)) or int(d["offset"]) < 0:
            raise ValueError("a shape, stride or offset out of range")
        return cls(int(d["buf"]), str(d["dtype"]), shape, stride, int(d["offset"]))

    def nbytes_needed(self) -> int:
        """Bytes of the buffer this view reaches, from its start."""
        n = span_elements(self.shape, self.stride)
        return (self.offset + n) * getattr(torch, self.dtype).itemsize if n else 0


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def span_elements(shape, stride) -> int:
    """Elements from the first to the last one a view with these strides reaches (0 when empty)."""
    if any(s == 0 for s in shape):
        return 0
    return sum((s - 1) * abs(st) for s, st in zip(shape, stride, strict=True)) + 1


class Buffer:
    """One shared allocation, mapped here; `raw` is its bytes as a uint8 tensor. `anchor` lives exactly
    as long as some tensor on the mapping does (a weakref.finalize on it frees the buffer)."""

    def __init__(self, id_: int, fd: int, nbytes: int, device: str):
        self.id, self.nbytes, self.device = id_, nbytes, device
        if torch.device(device).type == "cuda":
            self.anchor = _CudaMapping(fd, nbytes, device)
            self.raw = self.anchor.tensor()
        else:
            self.anchor = np.frombuffer(mmap.mmap(fd, max(1, nbytes)), dtype=np.uint8)
            self.raw = torch.from_numpy(self.anchor)[:nbytes]
        self.fd = fd  # kept until sent (the creator) or closed at once (the receiver)

    def view(self, spec: SharedView) -> torch.Tensor:
        """The tensor `spec` names, a view on this buffer (writes go to the other side)."""
        flat = self.raw.view(getattr(torch, spec.dtype))
        return flat.as_strided(spec.shape, spec.stride, spec.offset)

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def create(id_: int, nbytes: int, device: str) -> Buffer:
    """A new buffer of `nbytes` on `device`, its fd open to be sent (Buffer.close_fd once sent)."""
    if torch.device(device).type == "cuda":
        try:
            fd = _CudaMapping.create_fd(nbytes, device)
        except SharedMemoryError as exc:
            if not out_of_memory(exc):
                raise
            # the caching allocator's free blocks and the mappings let go are memory the driver cannot
            # give out: returned, once
            gc.collect()
            release_let_go()
            torch.cuda.empty_cache()
            fd = _CudaMapping.create_fd(nbytes, device)
    else:
        fd = os.memfd_create(f"mini-kv-{id_}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, max(1, nbytes))
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    return Buffer(id_, fd, nbytes, device)


def out_of_memory(exc: BaseException) -> bool:
    """The device's memory ran out (torch's allocator, or a shared buffer's cuMemCreate): a resource, not
    something a candidate does differently once timed. By name and message: the judge sees the subject's
    exceptions as classes named like them."""
    return type(exc).__name__ == "OutOfMemoryError" or "CUDA_ERROR_OUT_OF_MEMORY" in str(exc)


def receive(id_: int, fd: int, nbytes: int, device: str) -> Buffer:
    """A buffer the other side made, mapped here; the fd is closed (the mapping keeps it)."""
    try:
        if torch.device(device).type != "cuda" and not _sealed(fd, nbytes):
            raise SharedMemoryError(f"buffer {id_}: not a sealed memory file of {nbytes} bytes")
        buf = Buffer(id_, fd, nbytes, device)
    except (OSError, ValueError, RuntimeError) as exc:
        raise SharedMemoryError(f"buffer {id_}: {exc}") from None
    finally:
        os.close(fd)
    buf.fd = -1
    return buf


def _sealed(fd: int, nbytes: int) -> bool:
    """A memory file that cannot shrink under a mapping (a SIGBUS in the reader) and holds `nbytes`."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS and os.fstat(fd).st_size >= max(1, nbytes)
    except OSError:
        return False


def layout_of(t: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    """(bytes, strides) of a buffer that holds `t`'s view as it is: its strides kept (a kernel that
    handles only contiguous inputs must meet the strided ones the card made)."""
    n = span_elements(t.shape, t.stride())
    return n * t.element_size(), tuple(t.stride())


def raw_span(t: torch.Tensor) -> torch.Tensor:
    """The elements `t` reaches, first to last, as one flat view of its storage."""
    return t.as_strided((span_elements(t.shape, t.stride()),), (1,), t.storage_offset())


# ---------------------------------------------------------------------- CUDA: cuMem, POSIX fd handles

_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_LOC_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_READWRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_u64, _size, _int, _vp = ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
_P = ctypes.POINTER
# every driver entry point with its exact argument types: a 64-bit argument passed as a C int would
# leave its upper half to chance
_SIGNATURES = {
    "cuGetErrorName": (_int, _P(ctypes.c_char_p)),
    "cuMemGetAllocationGranularity": (_P(_size), _P(_AllocProp), _int),
    "cuMemCreate": (_P(_u64), _size, _P(_AllocProp), _u64),
    "cuMemExportToShareableHandle": (_vp, _u64, _int, _u64),
    "cuMemImportFromShareableHandle": (_P(_u64), _vp, _int),
    "cuMemAddressReserve": (_P(_u64), _size, _size, _u64, _u64),
    "cuMemMap": (_u64, _size, _size, _u64, _u64),
    "cuMemSetAccess": (_u64, _size, _P(_AccessDesc), _size),
    "cuMemUnmap": (_u64, _size),
    "cuMemAddressFree": (_u64, _size),
    "cuMemRelease": (_u64,),
}


@functools.cache
def _cu():
    lib = ctypes.CDLL("libcuda.so.1")
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = list(args), ctypes.c_int
    return lib


@functools.cache
def _context(device: str) -> None:
    """The device's primary context current on this thread (torch's lazy start), as the driver calls need."""
    torch.zeros(1, device=device)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        _cu().cuGetErrorName(rc, ctypes.byref(name))
        raise SharedMemoryError(f"{what} failed: {name.value.decode() if name.value else rc}")


def _prop(device: str) -> _AllocProp:
    index = torch.device(device).index
    prop = _AllocProp()
    prop.type, prop.requestedHandleTypes = _PINNED, _POSIX_FD
    prop.location = _Location(_LOC_DEVICE, torch.cuda.current_device() if index is None else index)
    return prop


def _granular(nbytes: int, prop: _AllocProp) -> int:
    gran = _size()
    _check(_cu().cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
    g = gran.value
    return max(g, -(-nbytes // g) * g)


class _CudaMapping:
    """A cuMem allocation mapped into this process's address space, readable and writable here."""

    @staticmethod
    def create_fd(nbytes: int, device: str) -> int:
        _context(device)
        prop = _prop(device)
        handle = _u64()
        _check(
            _cu().cuMemCreate(ctypes.byref(handle), _granular(nbytes, prop), ctypes.byref(prop), 0),
            "cuMemCreate",
        )
        fd = ctypes.c_int(-1)
        rc = _cu().cuMemExportToShareableHandle(ctypes.byref(fd), handle, _POSIX_FD, 0)
        _cu().cuMemRelease(handle)  # the fd holds the allocation now; each mapping holds it too
        _check(rc, "cuMemExportToShareableHandle")
        return fd.value

    def __init__(self, fd: int, nbytes: int, device: str):
        _context(device)
        prop = _prop(device)
        self.size = _granular(nbytes, prop)
        self.nbytes, self.device = nbytes, device
        self.handle, self.ptr = _u64(), _u64()
        _check(_cu().cuMemImportFromShareableHandle(ctypes.byref(self.handle), fd, _POSIX_FD), "cuMemImport")
        _check(_cu().cuMemAddressReserve(ctypes.byref(self.ptr), self.size, 0, 0, 0), "cuMemAddressReserve")
        _check(_cu().cuMemMap(self.ptr, self.size, 0, self.handle, 0), "cuMemMap")
        access = _AccessDesc(prop.location, _READWRITE)
        _check(_cu().cuMemSetAccess(self.ptr, self.size, ctypes.byref(access), 1), "cuMemSetAccess")

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr.value, False), "version": 3}

    def tensor(self) -> torch.Tensor:
        if self.nbytes == 0:
            return torch.empty(0, dtype=torch.uint8, device=self.device)
        return torch.as_tensor(self, device=self.device)  # keeps this object (and the mapping) alive

    def __del__(self) -> None:
        # Not unmapped here: a kernel queued before the last tensor on the mapping was let go may still
        # read or write it, and an unmapped range is an illegal address that breaks this process's CUDA
        # context for good (seen on an H200: the judge's reference failed while other processes kept the
        # device busy). Unmapped by release_let_go, after a device-wide synchronize.
        try:
            _LET_GO.append((self.ptr, self.size, self.handle))
        except Exception:  # noqa: BLE001, S110 - the interpreter is ending (globals gone); the driver frees it
            pass


# mappings no tensor is on any more, appended by __del__ at any moment (a gc pass included): one deque,
# only appended to and popped from
_LET_GO: collections.deque = collections.deque()


def release_let_go() -> None:
    """Unmap and release the mappings let go since the last call, once the device has finished all the
    work queued so far (which may still use them); nothing to do, no synchronize."""
    if not _LET_GO:
        return
    torch.cuda.synchronize()  # this process's device: a process maps buffers of one device only
    while True:
        try:
            ptr, size, handle = _LET_GO.popleft()
        except IndexError:
            return
        _cu().cuMemUnmap(ptr, size)
        _cu().cuMemAddressFree(ptr, size)
        _cu().cuMemRelease(handle)
