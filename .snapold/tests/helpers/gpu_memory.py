"""Device memory for the kernel tests that run one kernel on either the CPU emulator or the GPU (tests/kernels'
``mem`` fixture): alloc with a poison byte, write, read, launch a list of specs (their TMA tensor maps written
first), close."""

from __future__ import annotations

import ctypes

import numpy as np

from inception_engine import cuda_build
from inception_engine.backends.cuda.device import driver
from inception_engine.backends.cuda.kernels import Kernels, arg_format
from inception_engine.backends.cuda.launch import Launch, LaunchSpec
from inception_engine.backends.cuda.tensor_maps import emulated, encode_all

# kernel argument formats (kernels.arg_format) as ctypes types, for the emulator's entry points
C_TYPE = {"P": ctypes.c_void_p, "i": ctypes.c_int, "f": ctypes.c_float}


class Emulated:
    """Device memory is host memory; launches go to the emulator library's emu_<kernel> entry points."""

    wgmma = True  # the emulator runs conv_nhwc_wgmma.cu's wgmma tiles too (tests/cuda_emu/wgmma_emu.h)

    def __init__(self, lib: ctypes.CDLL):
        self.lib, self.keep = lib, []

    def alloc(self, nbytes: int, poison: int = 0xFF) -> int:
        raw = np.full(nbytes + 256, poison, np.uint8)
        self.keep.append(raw)
        return raw.ctypes.data + (-raw.ctypes.data % 256)

    def write(self, ptr: int, a: np.ndarray) -> None:
        ctypes.memmove(ptr, np.ascontiguousarray(a).ctypes.data, a.nbytes)

    def read(self, ptr: int, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        out = np.empty(shape, dtype)
        ctypes.memmove(out.ctypes.data, ptr, out.nbytes)
        return out

    def launch(self, specs: list[LaunchSpec]) -> None:
        for spec in specs:
            if spec.maps:  # the TMA tiles' tensor maps, in the emulator's own format
                self.write(spec.args[-1], encode_all(spec.maps, emulated))
            fn = getattr(self.lib, f"emu_{spec.kernel}")
            fn.argtypes = [ctypes.c_uint] * 4 + [C_TYPE[c] for c in arg_format(spec.kernel)]
            fn(*spec.grid, spec.block[0], *spec.args)

    def close(self) -> None:
        self.keep = []


class OnGpu:
    def __init__(self, kernels: Kernels, arch: str):
        self.kernels, self.allocs, self.wgmma = kernels, [], cuda_build.has_wgmma(arch)

    def alloc(self, nbytes: int, poison: int = 0xFF) -> int:
        a = driver().mem_alloc(max(nbytes, 1))
        driver().memset_d8(int(a), poison, max(nbytes, 1))
        self.allocs.append(a)
        return int(a)

    def write(self, ptr: int, a: np.ndarray) -> None:
        driver().memcpy_htod(ptr, np.ascontiguousarray(a))

    def read(self, ptr: int, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        out = np.empty(shape, dtype)
        driver().Context.synchronize()
        driver().memcpy_dtoh(out, ptr)
        return out

    def launch(self, specs: list[LaunchSpec]) -> None:
        for spec in specs:
            if spec.maps:  # the TMA tiles' tensor maps, as the driver encodes them
                self.write(spec.args[-1], encode_all(spec.maps))
            Launch(spec, self.kernels[spec.kernel])(None)
        driver().Context.synchronize()

    def close(self) -> None:
        for a in self.allocs:
            a.free()
        self.allocs = []
