"""Hold the OpenBLAS that NumPy loaded at one thread while the NumPy backend runs its own threads.

The backend splits each layer across its own threads; OpenBLAS's threads on top of that would oversubscribe the
cores, and on a shared machine its per-call thread synchronisation collapses when another process holds a core
(dev/performance-log.md, "CPU path (NumPy)"). OpenBLAS reads OPENBLAS_NUM_THREADS only when it loads, so the
thread count is changed at run time through the library's own ``*_set_num_threads``, found by name in the
OpenBLAS that this process has mapped (Linux: /proc/self/maps). Where that is not possible (another BLAS, another
OS) ``openblas_threads`` returns None and the backend runs one thread of its own, leaving the BLAS alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Callable, Iterator

import numpy as np  # noqa: F401  (loads the BLAS this module looks for)

# (get, set) symbol names: NumPy >= 2 wheels (scipy-openblas, 64-bit ints), NumPy 1.x wheels, plain OpenBLAS.
SYMBOLS = (
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
    ("openblas_get_num_threads", "openblas_set_num_threads"),
)


@functools.cache
def openblas_threads() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """(get, set) for the number of threads of the loaded OpenBLAS, or None if there is none to control."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower()
                            and line.split()[-1].startswith("/")})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in SYMBOLS:
            get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                return get, set_
    return None


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """OpenBLAS at one thread inside the block, as it was afterwards."""
    control = openblas_threads()
    if control is None:
        yield
        return
    get, set_ = control
    before = get()
    if before != 1:
        set_(1)
    try:
        yield
    finally:
        if before != 1:
            set_(before)
