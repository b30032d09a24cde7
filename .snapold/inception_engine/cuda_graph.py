"""CUDA Graphs through the driver API (ctypes on libcuda.so.1): pycuda 2026.1 has no graph API.

A forward is ~130 small kernels; launched one by one from Python each costs ~9 us of host time, replayed from a graph
~1 us of GPU time (shared/device/README.md). ``CudaGraph(stream_handle, record)`` records whatever ``record()``
launches on that stream into a graph (stream capture: nothing executes while recording) and instantiates it;
``launch()`` replays it on the same stream. Kernel arguments are baked in at capture, so every buffer a captured
kernel touches must stay allocated at the same address for the graph's lifetime.

Driver signatures (cuda.h, CUDA 12/13): cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode),
cuStreamEndCapture(CUstream, CUgraph*), cuGraphInstantiateWithFlags(CUgraphExec*, CUgraph, unsigned long long),
cuGraphLaunch(CUgraphExec, CUstream), cuGraphExecDestroy(CUgraphExec), cuGraphDestroy(CUgraph),
cuGetErrorName(CUresult, const char**). The unsuffixed cuGraphInstantiate symbol is the old 5-argument call, and
cuStreamBeginCapture without _v2 the old call without a mode, so both are avoided.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

from .errors import BackendUnavailable

# Thread-local capture: API calls from other threads (another backend's, a profiler's) cannot invalidate it.
CAPTURE_MODE_THREAD_LOCAL = 1

_SIGNATURES = {
    "cuStreamBeginCapture_v2": (ctypes.c_void_p, ctypes.c_int),
    "cuStreamEndCapture": (ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)),
    "cuGraphInstantiateWithFlags": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_ulonglong),
    "cuGraphLaunch": (ctypes.c_void_p, ctypes.c_void_p),
    "cuGraphExecDestroy": (ctypes.c_void_p,),
    "cuGraphDestroy": (ctypes.c_void_p,),
    "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
}


@functools.cache
def libcuda() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise BackendUnavailable(f"cannot load the CUDA driver library libcuda.so.1 ({e}); install the NVIDIA "
                                 f"driver or run with graph=False") from None
    for name, argtypes in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise BackendUnavailable(f"the CUDA driver lacks {name} (too old for CUDA graphs); update the driver or "
                                     f"run with graph=False") from None
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return lib


def check(result: int, call: str) -> None:
    if result == 0:
        return
    name = ctypes.c_char_p()
    libcuda().cuGetErrorName(result, ctypes.byref(name))
    raise BackendUnavailable(f"{call} failed with {(name.value or b'CUresult').decode()} ({result}); "
                             f"run with graph=False to launch kernels one by one")


class CudaGraph:
    """The launches ``record()`` makes on stream ``stream_handle``, captured once and replayable."""

    def __init__(self, stream_handle: int, record: Callable[[], None]):
        lib = libcuda()
        self._stream = ctypes.c_void_p(stream_handle)
        self._graph = ctypes.c_void_p()
        self._exec = ctypes.c_void_p()
        check(lib.cuStreamBeginCapture_v2(self._stream, CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture")
        try:
            record()
        except BaseException:
            # End the capture anyway: a stream left capturing breaks every later call on it.
            lib.cuStreamEndCapture(self._stream, ctypes.byref(self._graph))
            self.close()
            raise
        check(lib.cuStreamEndCapture(self._stream, ctypes.byref(self._graph)), "cuStreamEndCapture")
        try:
            check(lib.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), self._graph, 0),
                  "cuGraphInstantiateWithFlags")
        except BackendUnavailable:
            self.close()
            raise

    def launch(self) -> None:
        check(libcuda().cuGraphLaunch(self._exec, self._stream), "cuGraphLaunch")

    def close(self) -> None:
        lib = libcuda()
        if self._exec.value:
            lib.cuGraphExecDestroy(self._exec)
            self._exec = ctypes.c_void_p()
        if self._graph.value:
            lib.cuGraphDestroy(self._graph)
            self._graph = ctypes.c_void_p()
