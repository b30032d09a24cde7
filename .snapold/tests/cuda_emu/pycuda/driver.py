"""Stand-in for ``pycuda.driver`` that runs kernels on the CPU (tests only; see tests/kernels/test_cuda_emulated.py).

Device memory is host memory (a device pointer is a host address), kernels run in the fiber emulator compiled
from cuda_src with tests/cuda_emu/emu.h into the library named by $INCEPTION_EMU_LIB, whose ``emu_<kernel>``
entry points take (grid x, y, z, block x, kernel arguments...). Everything runs synchronously in call order;
launches from several threads take turns (the fiber emulator is not reentrant), and each thread has its own
context stack, as the real driver's.
Checks what the real driver would reject: calls outside a pushed context, async copies from pageable memory,
argument lists that do not match the prepared format, grid limits. gpu_sleep (inline PTX) is a no-op.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

import numpy as np

_lib = ctypes.CDLL(os.environ["INCEPTION_EMU_LIB"])
_live: dict[int, DeviceAllocation] = {}
_C_TYPES = {"P": ctypes.c_void_p, "i": ctypes.c_int, "q": ctypes.c_longlong, "f": ctypes.c_float}
_launching = threading.Lock()  # one emulated kernel at a time, whichever thread launches it
_contexts = threading.local()  # each thread's context stack


class Error(Exception):
    pass


class MemoryError(Error):  # noqa: A001 (pycuda's name)
    pass


class device_attribute:  # noqa: N801 (pycuda's name)
    MULTIPROCESSOR_COUNT = "MULTIPROCESSOR_COUNT"


class function_attribute:  # noqa: N801 (pycuda's name)
    MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


# Dynamic shared memory a launch may ask for without the function's MAX_DYNAMIC_SHARED_SIZE_BYTES (the driver's rule).
EMULATED = True  # cuda.tensor_maps writes the emulator's own map format for this stand-in
DEFAULT_DYNAMIC_SHARED = 48 * 1024
OPT_IN_SHARED = 227 * 1024  # the most an sm_90 block may opt in to


class event_flags:  # noqa: N801 (pycuda's name)
    DISABLE_TIMING = 2


def init() -> None:
    pass


def _stack() -> list[Context]:
    if not hasattr(_contexts, "stack"):
        _contexts.stack = []
    return _contexts.stack


def _need_context() -> None:
    if not _stack():
        raise Error("no current context")


class Context:
    def push(self) -> None:
        _stack().append(self)

    @staticmethod
    def pop() -> None:
        if not _stack():
            raise Error("cannot pop context from empty stack")
        _stack().pop()

    @staticmethod
    def synchronize() -> None:
        _need_context()

    def detach(self) -> None:
        pass


class Device:
    def __init__(self, index: int):
        self.index = index

    @staticmethod
    def count() -> int:
        return 1

    def name(self) -> str:
        return "CPU emulation"

    def compute_capability(self) -> tuple[int, int]:
        return (9, 0)

    def get_attribute(self, attr: str) -> int:
        return 132

    def retain_primary_context(self) -> Context:
        return Context()


class DeviceAllocation:
    def __init__(self, nbytes: int):
        self._buf = np.empty(nbytes // 4 + 64, np.float32)
        self._addr = (self._buf.ctypes.data + 255) // 256 * 256
        _live[self._addr] = self

    def __int__(self) -> int:
        return self._addr

    def free(self) -> None:
        _need_context()
        _live.pop(self._addr, None)


def mem_alloc(nbytes: int) -> DeviceAllocation:
    _need_context()
    return DeviceAllocation(nbytes)


def _at(ptr: int, count: int, dtype: type = np.float32) -> np.ndarray:
    nbytes = count * np.dtype(dtype).itemsize
    return np.frombuffer((ctypes.c_char * nbytes).from_address(int(ptr)), dtype)


def memset_d32(ptr: int, value: int, count: int) -> None:
    _need_context()
    _at(ptr, count, np.uint32)[:] = value


def memset_d8(ptr: int, value: int, count: int) -> None:
    _need_context()
    _at(ptr, count, np.uint8)[:] = value


def memcpy_htod(ptr: int, src: np.ndarray) -> None:
    _need_context()
    src = np.ascontiguousarray(src)
    _at(ptr, src.nbytes, np.uint8)[:] = src.reshape(-1).view(np.uint8)  # the bytes, as the driver copies them


def memcpy_dtoh(dst: np.ndarray, ptr: int) -> None:
    _need_context()
    if not dst.flags.c_contiguous:
        raise Error("memcpy_dtoh needs a contiguous destination")
    dst.reshape(-1).view(np.uint8)[:] = _at(ptr, dst.nbytes, np.uint8)


class PagelockedHostAllocation(bytearray):
    def free(self) -> None:
        pass


def pagelocked_empty(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    _need_context()
    return np.ndarray(shape, dtype, buffer=PagelockedHostAllocation(int(np.prod(shape)) * np.dtype(dtype).itemsize))


_registered: dict[int, int] = {}  # host memory page-locked in place (cuMemHostRegister): start -> bytes


def host_register(ptr: int, nbytes: int) -> int:
    """cuMemHostRegister's emulation (the driver's own is reached through ctypes, which the emulator has not):
    0, or 712 (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) for memory that overlaps a registered range."""
    _need_context()
    if any(ptr < start + n and start < ptr + nbytes for start, n in _registered.items()):
        return 712
    _registered[ptr] = nbytes
    return 0


def host_unregister(ptr: int) -> int:
    """cuMemHostUnregister's: 0, or 713 (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)."""
    _need_context()
    return 0 if _registered.pop(ptr, None) is not None else 713


def _pinned(a: np.ndarray) -> None:
    ptr, nbytes = a.ctypes.data, a.nbytes
    if any(start <= ptr and ptr + nbytes <= start + n for start, n in _registered.items()):
        return
    while isinstance(a, np.ndarray):  # a view of a page-locked array is page-locked memory too
        a = a.base
    if not isinstance(a, PagelockedHostAllocation):
        raise Error("async copy needs page-locked host memory")


def memcpy_htod_async(ptr: int, src: np.ndarray, stream: Stream | None = None) -> None:
    _pinned(src)
    memcpy_htod(ptr, src)


def memcpy_dtoh_async(dst: np.ndarray, ptr: int, stream: Stream | None = None) -> None:
    _pinned(dst)
    memcpy_dtoh(dst, ptr)


def memcpy_dtod_async(dst: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
    _need_context()
    _at(dst, nbytes, np.uint8)[:] = _at(src, nbytes, np.uint8).copy()  # the bytes, overlapping or not


class Stream:
    def __init__(self, flags: int = 0):
        _need_context()
        self.handle = id(self)

    def synchronize(self) -> None:
        _need_context()

    def wait_for_event(self, event: Event) -> None:
        _need_context()
        if not hasattr(event, "t"):
            raise Error("waiting for an event never recorded")


class Event:
    def __init__(self, flags: int = 0):
        self.flags = flags

    def record(self, stream: Stream | None = None) -> None:
        _need_context()
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def time_since(self, start: Event) -> float:
        if (self.flags | start.flags) & event_flags.DISABLE_TIMING:
            raise Error("timing an event created with DISABLE_TIMING")
        return (self.t - start.t) * 1e3


class Function:
    def __init__(self, name: str):
        self.name = name
        self.max_dynamic_shared = DEFAULT_DYNAMIC_SHARED

    def set_attribute(self, attribute: int, value: int) -> None:
        if attribute != function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES or not 0 <= value <= OPT_IN_SHARED:
            raise Error(f"{self.name}: cannot set attribute {attribute} to {value}")
        self.max_dynamic_shared = value

    def prepare(self, fmt: str) -> Function:
        self.fmt = self.arg_format = fmt
        if self.name != "gpu_sleep":
            self.fn = getattr(_lib, "emu_" + self.name)
            self.fn.argtypes = [ctypes.c_uint] * 4 + [_C_TYPES[c] for c in fmt]
        return self

    def _launch_kernel(self, grid: tuple, block: tuple, args: tuple, shared_size: int, stream: Stream | None) -> None:
        """pycuda's launch of packed arguments (kernels.launch_async): _pvt_struct.pack here keeps them a tuple."""
        self.prepared_async_call(grid, block, stream, *args, shared_size=shared_size)

    def prepared_async_call(self, grid: tuple, block: tuple, stream: Stream | None, *args: int,
                            shared_size: int = 0) -> None:
        _need_context()
        if shared_size > self.max_dynamic_shared:
            raise Error(f"{self.name}: {shared_size} bytes of dynamic shared memory, above its limit "
                        f"{self.max_dynamic_shared} (set MAX_DYNAMIC_SHARED_SIZE_BYTES)")
        if len(args) != len(self.fmt) or len(grid) != 3 or block[1:] != (1, 1):
            raise Error(f"{self.name}: bad launch {grid} {block} with {len(args)} args for format {self.fmt}")
        if not (grid[0] < 2**31 and grid[1] < 2**16 and grid[2] < 2**16 and block[0] <= 1024):
            raise Error(f"{self.name}: grid {grid} block {block} beyond the launch limits")
        if self.name != "gpu_sleep":
            with _launching:
                self.fn(*grid, block[0], *args)


class Module:
    def get_function(self, name: str) -> Function:
        return Function(name)


def module_from_file(path: str) -> Module:
    _need_context()
    return Module()
