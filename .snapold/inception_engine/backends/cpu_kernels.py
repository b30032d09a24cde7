"""The float32 CPU path's kernels in C (cpu_src/): compiled at first use by the system C compiler, cached on disk,
called through ctypes.

Each kernel spreads one layer over its own thread pool (cpu_src/threadpool.c) and ctypes releases the GIL for the
call, so a forward is one call per layer with no Python between the parts of a layer.

The library is ``ie_cpu-<key>.so`` in ``~/.cache/inception-engine/cpu/``, where the key hashes every file of
cpu_src, the compiler (its path and ``--version``) and the flags: an edited source or another compiler never loads
stale code. It appears atomically (compiled under a temporary name, then renamed). The compiler is $CC, else
``cc``. Where there is none, the build fails, the machine is not x86-64 or the CPU lacks AVX-512, ``library()``
returns None, ``unavailable_reason()`` says why (also logged at debug level) and the backend runs its NumPy code.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import native_build
from .numpy_primitives import winograd_matrices

log = logging.getLogger(__name__)

SOURCES = ("conv.c", "winograd.c", "pool.c", "threadpool.c")
FLAGS = ("-O3", "-std=gnu11", "-fPIC", "-shared", "-pthread")


def build() -> Path:
    """The compiled library's path, compiling it first if it is not cached. Raises OSError with the reason."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise OSError(f"the C kernels are for x86-64 CPUs with AVX-512, this is {platform.machine()}")
    return native_build.c_library("ie_cpu", SOURCES, FLAGS)


class ConvParams(ctypes.Structure):
    """cpu_src/ie_cpu.h's ie_conv, field for field."""

    _fields_ = [("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("weights", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("x_image_stride", ctypes.c_int64), ("y_image_stride", ctypes.c_int64),
                *((name, ctypes.c_int32) for name in
                  ("images", "c", "h", "w", "o", "ho", "wo", "kh", "kw", "stride", "pad_h", "pad_w", "relu"))]


class PoolParams(ctypes.Structure):
    """cpu_src/ie_cpu.h's ie_pool, field for field."""

    _fields_ = [("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("x_image_stride", ctypes.c_int64), ("y_image_stride", ctypes.c_int64),
                *((name, ctypes.c_int32) for name in ("images", "c", "h", "w", "ho", "wo", "kernel", "stride", "pad",
                                                      "is_max", "count_include_pad", "relu"))]


@functools.cache
def load() -> tuple[ctypes.CDLL | None, str | None]:
    """(the loaded kernels, None), or (None, why they are unavailable). Cached: one build and load a process."""
    try:
        lib = ctypes.CDLL(str(build()))
    except OSError as e:
        reason = str(e)
    else:
        lib.ie_cpu_supported.restype = ctypes.c_int
        if lib.ie_cpu_supported():
            lib.ie_packed_weights_floats.restype = ctypes.c_int64
            lib.ie_packed_weights_floats.argtypes = [ctypes.c_int, ctypes.c_int64]
            lib.ie_pack_weights.restype = None
            lib.ie_pack_weights.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p]
            for name, params in (("ie_conv2d", ConvParams), ("ie_conv2d_winograd", ConvParams),
                                 ("ie_pool2d", PoolParams)):
                getattr(lib, name).argtypes = [ctypes.POINTER(params), ctypes.c_int]
                getattr(lib, name).restype = None
            return lib, None
        reason = "the CPU lacks AVX-512F or FMA"
    log.debug("C kernels unavailable, the CPU path runs NumPy code: %s", reason)
    return None, reason


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where they are unavailable (unavailable_reason says why)."""
    return load()[0]


def unavailable_reason() -> str | None:
    return load()[1]


def numpy_code_note() -> str | None:
    """The line a run says where the CPU backend runs its NumPy code for want of the C kernels (a fallback the user
    should know of: ~2.2x slower where both run, docs/PERFORMANCE.md), or None where the kernels load."""
    reason = unavailable_reason()
    return None if reason is None else (f"the CPU backend's C kernels are unavailable ({reason}): it runs its NumPy "
                                        f"code, about half their speed")


def _image_stride(a: np.ndarray, name: str) -> int:
    """Floats between images of an (N, C, H, W) float32 view whose images are contiguous (a channel slice)."""
    n, c, h, w = a.shape
    if a.dtype != np.float32 or a.strides[1:] != (h * w * 4, w * 4, 4):
        raise ValueError(f"{name} must be float32 with each image contiguous, got {a.dtype} strides {a.strides}")
    return a.strides[0] // 4


def _pack_rows(rows: np.ndarray) -> np.ndarray:
    """An (M, K) matrix as ie_conv2d's micro-kernel reads it (cpu_src/conv.c: panels of MR rows, K blocks)."""
    lib = library()
    rows = np.ascontiguousarray(rows, np.float32)
    packed = np.empty(lib.ie_packed_weights_floats(rows.shape[0], rows.shape[1]), np.float32)
    lib.ie_pack_weights(rows.ctypes.data, rows.shape[0], rows.shape[1], packed.ctypes.data)
    return packed


def pack_weights(w: np.ndarray) -> np.ndarray:
    """(O, C, kh, kw) weights as ie_conv2d reads them (cpu_src/conv.c: K in (ky, kx, c) order, panels of rows)."""
    return _pack_rows(w.transpose(0, 2, 3, 1).reshape(w.shape[0], -1))


# Winograd along one axis, as cpu_src/winograd.c applies it: outputs a tile, (AT, G, BT) for a kernel of r taps.
# r = 3: Lavin & Gray's F(2, 3), whose B and A are additions only (winograd.c has them built in); r = 5, 7: F(2, r)
# of numpy_primitives.winograd_matrices; r = 1: the identity.
_LAVIN_F23 = (np.array([[1, 1, 1, 0], [0, 1, -1, -1]]),
              np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
              np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]))
WINOGRAD_MAX_N = 8  # input tile along an axis (winograd.c's MAX_N)
WINOGRAD_HEADER = 256  # floats of transforms before U in the packed weights (winograd.c's HEADER)


def winograd_axis(r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if r == 1:
        return (np.ones((1, 1)),) * 3
    if r == 3:
        return _LAVIN_F23
    return winograd_matrices(2, r)


def uses_winograd(kernel: tuple[int, int], stride: int) -> bool:
    """Convolutions ie_conv2d_winograd computes: stride 1, odd kernels up to 5 along each axis, or 7 along one (1x7,
    7x1), not 1x1. F(2, 7) along both axes of a 7x7 loses more than the 2e-6 (relative L2, one layer) that the
    others keep."""
    kh, kw = kernel
    return (stride == 1 and max(kh, kw) > 1 and kh in (1, 3, 5, 7) and kw in (1, 3, 5, 7)
            and (max(kh, kw) < 7 or min(kh, kw) == 1))


def pack_winograd_weights(w: np.ndarray) -> np.ndarray:
    """(O, C, kh, kw) weights as ie_conv2d_winograd reads them: a header of WINOGRAD_HEADER floats (B^T along H
    and W, each MAX_N x MAX_N, then A^T along H and W, each 2 x MAX_N, zero-padded), then U = G g G^T (in
    float64) as one (O, C) matrix for each position of the input tile, each packed as pack_weights packs a 1x1
    conv's, one after the other."""
    (at_h, g_h, bt_h), (at_w, g_w, bt_w) = winograd_axis(w.shape[2]), winograd_axis(w.shape[3])
    header = np.zeros(WINOGRAD_HEADER)
    n = WINOGRAD_MAX_N
    for offset, rows, m in ((0, n, bt_h), (n * n, n, bt_w), (2 * n * n, 2, at_h), (2 * n * n + 2 * n, 2, at_w)):
        block = np.zeros((rows, n))
        block[:m.shape[0], :m.shape[1]] = m
        header[offset:offset + rows * n] = block.ravel()
    u = np.einsum("ui,ocij,vj->uvoc", g_h, w.astype(np.float64), g_w)
    return np.concatenate([header.astype(np.float32),
                           *(_pack_rows(u_xi) for u_xi in u.reshape(-1, *w.shape[:2]))])


@dataclass
class Call:
    """One prepared kernel call, ``fn(params, threads)``, made by calling this. Keeps the arrays that ``params``
    points into alive, and the library that ``fn`` lives in."""

    fn: Callable[..., None]
    params: ctypes.Structure
    threads: int
    keep: tuple

    def __call__(self) -> None:
        self.fn(ctypes.byref(self.params), self.threads)


def prepare_conv(x: np.ndarray, y: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, pad: tuple[int, int],
                 relu: bool, threads: int, winograd: bool = True) -> Call:
    """y = relu(conv(x, w) + b) (or without the ReLU) into the view ``y``, on ``threads`` threads. x (N, C, H, W)
    and y are float32 views whose images are contiguous (channel slices of a buffer); w (O, C, kh, kw), b (O,).
    Stride-1 convolutions wider than 1x1 run by Winograd's F(2, r) along each axis (``uses_winograd``) unless
    ``winograd`` is off."""
    o, c, kh, kw = w.shape
    if y.shape[2] * y.shape[3] >= 1 << 22 or x.shape[2] * x.shape[3] >= 1 << 31:
        raise ValueError(f"images of {x.shape[2:]} -> {y.shape[2:]} pixels are beyond the C kernels (2^22 outputs)")
    winograd = winograd and uses_winograd((kh, kw), stride)
    packed = pack_winograd_weights(w) if winograd else pack_weights(w)
    bias = np.ascontiguousarray(b, np.float32)
    params = ConvParams(x.ctypes.data, y.ctypes.data, packed.ctypes.data, bias.ctypes.data,
                        _image_stride(x, "x"), _image_stride(y, "y"), x.shape[0], c, x.shape[2], x.shape[3], o,
                        y.shape[2], y.shape[3], kh, kw, stride, pad[0], pad[1], int(relu))
    fn = library().ie_conv2d_winograd if winograd else library().ie_conv2d
    return Call(fn, params, threads, (x, y, packed, bias))


def prepare_pool(x: np.ndarray, y: np.ndarray, kind: str, kernel: int, stride: int, pad: int,
                 count_include_pad: bool, threads: int, bias: np.ndarray | None = None, relu: bool = False) -> Call:
    """y = max or average pool of x (cpu_src/ie_cpu.h's ie_pool), + bias per channel and the ReLU if asked, on
    ``threads`` threads; views as prepare_conv."""
    if bias is not None:
        bias = np.ascontiguousarray(bias, np.float32)
    params = PoolParams(x.ctypes.data, y.ctypes.data, None if bias is None else bias.ctypes.data,
                        _image_stride(x, "x"), _image_stride(y, "y"), *x.shape, *y.shape[2:], kernel, stride, pad,
                        int(kind == "max"), int(count_include_pad), int(relu))
    return Call(library().ie_pool2d, params, threads, (x, y, bias))
