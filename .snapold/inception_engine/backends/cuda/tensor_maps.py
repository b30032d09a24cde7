"""Tensor maps for conv_nhwc_ws.cu's TMA tiles (``_ws_tma_``): what each map describes (``Im2colMap``, ``TiledMap``:
plain data, made by launch_nhwc with the launch), and its 128 bytes (``encode``). On a GPU the driver encodes them
(cuTensorMapEncodeIm2col / cuTensorMapEncodeTiled through ctypes: pycuda wraps neither); under the CPU emulator
(tests/cuda_emu, whose pycuda stand-in says EMULATED) they are the emulator's own format (``emulated``), which its
TMA copies read. The kernels read the maps from global memory: a map passed by value as a kernel parameter does not
survive pycuda's launch (docs/PERFORMANCE.md)."""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from functools import cache

import numpy as np

from ...errors import EngineError
from .device import driver

MAP_BYTES = 128  # a CUtensorMap
# CUtensorMapDataType: the element bits as they are (tf32 activations are float32 words already rounded to TF32; int8
# ones bytes, moved as UINT8: the copy engine does not convert, and its zero fill is the byte 0, int8's 0 too)
DATA_TYPE = {1: 0, 2: 6, 4: 7}  # UINT8, FLOAT16, FLOAT32
SWIZZLE = {64: 2, 128: 3}  # CUtensorMapSwizzle for rows of 64 / 128 bytes (the wgmma descriptors' layouts)
L2_PROMOTION_128B = 2


@dataclass(frozen=True)
class Im2colMap:
    """A 4-D NHWC activation view as the implicit GEMM's A rows: boxes of `pixels` window corners (W fastest, then
    H, then N; `stride` apart) x `channels` channels."""

    address: int  # the view's first channel of pixel (0, 0, 0)
    elem_bytes: int
    dims: tuple[int, int, int, int]  # C (the view's), W, H, N
    cstride: int  # elements between neighbouring pixels (the buffer's channel count)
    lower: tuple[int, int]  # the first window's corner (W, H): -pad
    upper: tuple[int, int]  # the last window's corner, from the far edge: (O - 1) stride - pad - (I - 1)
    channels: int
    pixels: int
    stride: int

    @property
    def strides(self) -> tuple[int, int, int]:
        """Bytes between neighbouring pixels along W, H and N."""
        _, w, h, _ = self.dims
        step = self.cstride * self.elem_bytes
        return step, step * w, step * w * h


@dataclass(frozen=True)
class TiledMap:
    """A row-major matrix [rows][k] (the weights) in boxes of box_rows x box_k."""

    address: int
    elem_bytes: int
    k: int
    rows: int
    box_k: int
    box_rows: int


TensorMap = Im2colMap | TiledMap


def encode(m: TensorMap) -> bytes:
    """The map's 128 bytes for this process's kernels: the driver's, or the emulator's."""
    if getattr(driver(), "EMULATED", False):
        return emulated(m)
    out = (ctypes.c_uint8 * (MAP_BYTES + 64))()  # CUtensorMap is 64-byte aligned
    at = (ctypes.addressof(out) + 63) // 64 * 64
    e = m.elem_bytes
    if isinstance(m, Im2colMap):
        rc = _libcuda().cuTensorMapEncodeIm2col(
            ctypes.c_void_p(at), DATA_TYPE[e], 4, ctypes.c_void_p(m.address), (ctypes.c_uint64 * 4)(*m.dims),
            (ctypes.c_uint64 * 3)(*m.strides), (ctypes.c_int * 2)(*m.lower), (ctypes.c_int * 2)(*m.upper),
            ctypes.c_uint32(m.channels), ctypes.c_uint32(m.pixels), (ctypes.c_uint32 * 4)(1, m.stride, m.stride, 1), 0,
            SWIZZLE[m.channels * e], L2_PROMOTION_128B, 0)
    else:
        rc = _libcuda().cuTensorMapEncodeTiled(
            ctypes.c_void_p(at), DATA_TYPE[e], 2, ctypes.c_void_p(m.address), (ctypes.c_uint64 * 2)(m.k, m.rows),
            (ctypes.c_uint64 * 1)(m.k * e), (ctypes.c_uint32 * 2)(m.box_k, m.box_rows), (ctypes.c_uint32 * 2)(1, 1),
            0, SWIZZLE[m.box_k * e], L2_PROMOTION_128B, 0)
    if rc != 0:
        raise EngineError(f"the CUDA driver refused a tensor map ({m}): CUresult {rc}")
    return bytes((ctypes.c_uint8 * MAP_BYTES).from_address(at))


def encode_all(maps: Sequence[TensorMap], encoder: Callable[[TensorMap], bytes] = encode) -> np.ndarray:
    """A launch's maps one after another (MAP_BYTES each), as the kernel reads them from its last argument."""
    return np.frombuffer(b"".join(encoder(m) for m in maps), np.uint8)


# tests/cuda_emu/wgmma_emu.h's tma::EmuMap: magic, base, kind, elem_bytes, dims[4], strides[3] (bytes), lower[2],
# upper[2], box[2], stride.
EMU_FORMAT = "<QQii4i3q2i2i2ii"
EMU_MAGIC = 0x70616D2D616D74  # "tma-map"


def emulated(m: TensorMap) -> bytes:
    """The map in the emulator's format (EMU_FORMAT), padded to MAP_BYTES."""
    e = m.elem_bytes
    if isinstance(m, Im2colMap):
        raw = struct.pack(EMU_FORMAT, EMU_MAGIC, m.address, 1, e, *m.dims, *m.strides, *m.lower, *m.upper, m.channels,
                          m.pixels, m.stride)
    else:
        raw = struct.pack(EMU_FORMAT, EMU_MAGIC, m.address, 2, e, m.k, m.rows, 0, 0, m.k * e, 0, 0, 0, 0, 0, 0,
                          m.box_k, m.box_rows, 1)
    assert len(raw) <= MAP_BYTES
    return raw.ljust(MAP_BYTES, b"\0")


@cache
def _libcuda() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    for name in ("cuTensorMapEncodeIm2col", "cuTensorMapEncodeTiled"):
        getattr(lib, name).restype = ctypes.c_int
    return lib
