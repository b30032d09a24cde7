"""Kernel launches with programmatic dependent launch (PDL), through the driver API (ctypes on libcuda.so.1).

On sm_90 a kernel launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may be launched, and its
blocks placed on the SMs, while the kernel before it on its stream is still running; the kernel itself waits for
that one's results (cuda_src/common.cuh, ``grid_dependency_sync``: every kernel of cuda_src calls it first). So the
launch latency between two dependent kernels overlaps the first one instead of following it. Captured into a CUDA
graph, such a launch becomes a programmatic edge and keeps that property on every replay (CUDA Programming Guide,
"Programmatic Dependent Launch and Synchronization").

pycuda 2026.1 can neither pass launch attributes nor hand out its CUfunction handles, so ``DriverKernels`` loads the
same cubins a second time with cuModuleLoad and ``DriverLaunch`` calls cuLaunchKernelEx. The caller decides per
launch whether it may overlap its predecessor: only a kernel whose sole dependency is the previous kernel on the same
stream (cuda_backend: not the first kernel after an event wait).

Driver signatures and structs (cuda.h, CUDA 12/13): cuModuleLoad(CUmodule*, const char*), cuModuleGetFunction(
CUfunction*, CUmodule, const char*), cuModuleUnload(CUmodule), cuLaunchKernelEx(const CUlaunchConfig*, CUfunction,
void** kernelParams, void** extra); CUlaunchConfig = 7 unsigned ints (grid, block, dynamic shared bytes), CUstream,
CUlaunchAttribute*, unsigned int; CUlaunchAttribute = CUlaunchAttributeID (int), 4 bytes of padding, a 64-byte union
whose first int is programmaticStreamSerializationAllowed for attribute 6.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from .cuda_graph import check, libcuda
from .errors import BackendUnavailable

REMEDY = "run with pdl=False (inception-bench: the cuda-nopdl variant) to launch through pycuda"
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6

_SIGNATURES = {
    "cuModuleLoad": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p),
    "cuModuleGetFunction": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p),
    "cuModuleUnload": (ctypes.c_void_p,),
    "cuLaunchKernelEx": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p),
}

# pycuda struct format letter -> the ctypes type a kernel parameter of that kind is passed as.
_PARAM_TYPES = {"P": ctypes.c_uint64, "i": ctypes.c_int32, "q": ctypes.c_int64}


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint64 * 8)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


assert ctypes.sizeof(LaunchAttribute) == 72 and LaunchConfig.stream.offset == 32, "cuda.h struct layout"


@functools.cache
def driver_api() -> ctypes.CDLL:
    """libcuda with the module and launch calls typed; BackendUnavailable if the driver lacks them."""
    lib = libcuda()
    for name, argtypes in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise BackendUnavailable(f"the CUDA driver lacks {name} (too old for programmatic dependent launch); "
                                     f"update the driver or run with pdl=False") from None
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return lib


def _programmatic() -> LaunchAttribute:
    attr = LaunchAttribute()
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value[0] = 1  # programmaticStreamSerializationAllowed, the union's first int (little-endian)
    return attr


class DriverKernels:
    """The cubins loaded into the current context through the driver API; entry points looked up on first use.
    ``close()`` (with the same context current) unloads them."""

    def __init__(self, cubins: dict[str, Path]):
        lib = driver_api()
        self._modules: dict[str, ctypes.c_void_p] = {}
        self._funcs: dict[str, ctypes.c_void_p] = {}
        try:
            for src, path in cubins.items():
                module = ctypes.c_void_p()
                check(lib.cuModuleLoad(ctypes.byref(module), str(path).encode()), f"cuModuleLoad({path.name})", REMEDY)
                self._modules[src] = module
        except BaseException:
            self.close()
            raise

    def function(self, src: str, kernel: str) -> ctypes.c_void_p:
        if kernel not in self._funcs:
            fn = ctypes.c_void_p()
            check(driver_api().cuModuleGetFunction(ctypes.byref(fn), self._modules[src], kernel.encode()),
                  f"cuModuleGetFunction({kernel})", REMEDY)
            self._funcs[kernel] = fn
        return self._funcs[kernel]

    def close(self) -> None:
        lib = driver_api()
        for module in self._modules.values():
            lib.cuModuleUnload(module)
        self._modules, self._funcs = {}, {}


class DriverLaunch:
    """One kernel launch with its arguments packed once (``fmt``: pycuda struct letters, P/i/q)."""

    def __init__(self, func: ctypes.c_void_p, grid: tuple[int, int, int], block: tuple[int, int, int],
                 fmt: str, args: tuple[int, ...]):
        if len(fmt) != len(args):
            raise ValueError(f"{len(args)} arguments for parameter format {fmt!r}")
        self._func = func
        self._values = [_PARAM_TYPES[c](a) for c, a in zip(fmt, args)]
        self._params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(v) for v in self._values])
        self._attr = _programmatic()
        self._config = LaunchConfig(*grid, *block, 0, None, None, 0)

    def __call__(self, stream_handle: int, programmatic: bool) -> None:
        self._config.stream = stream_handle
        if programmatic:
            self._config.attrs, self._config.num_attrs = ctypes.pointer(self._attr), 1
        else:
            self._config.attrs, self._config.num_attrs = None, 0
        check(driver_api().cuLaunchKernelEx(ctypes.byref(self._config), self._func, self._params, None),
              "cuLaunchKernelEx", REMEDY)
