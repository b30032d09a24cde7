"""Device buffers for kernel tests: NaN-poisoned arenas and parameter blocks laid out as the backend lays them,
launching a list of specs, and checking one destination view against a float64 reference."""

from __future__ import annotations

import zlib

import numpy as np

from inception_engine.backends.cuda.device import driver
from inception_engine.backends.cuda.kernels import Kernels
from inception_engine.backends.cuda.launch import Launch, LaunchSpec
from inception_engine.backends.cuda.tiles import NAN_BITS
from inception_engine.plan import ALIGN, View

TOL = 1e-5  # rel L2, fp32 accumulation against float64


def rng_for(*key: object) -> np.random.Generator:
    """Fresh data per test case, reproducible from its parameters."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


class Arena:
    """Buffers laid out one after another in one NaN-poisoned device allocation, like the backend's arena."""

    def __init__(self, *shapes: tuple[int, int, int, int]):
        self.offsets, pos = [], 0
        for s in shapes:
            self.offsets.append(pos)
            pos += -(-int(np.prod(s)) // ALIGN) * ALIGN
        self.shapes, self.elems = shapes, max(pos, 1)
        drv = driver()
        self.alloc = drv.mem_alloc(4 * self.elems)
        self.ptr = int(self.alloc)
        drv.memset_d32(self.ptr, NAN_BITS, self.elems)

    def view(self, i: int, c_offset: int = 0, channels: int | None = None) -> View:
        shape = self.shapes[i]
        return View(f"b{i}", self.offsets[i], shape, c_offset, shape[1] - c_offset if channels is None else channels)

    def put(self, v: View, data: np.ndarray) -> None:
        """Write data (the view's dims) into the view; the rest of the buffer stays NaN."""
        host = self.buffer(int(v.buffer[1:]))
        host[:, v.c_offset:v.c_offset + v.channels] = data
        driver().memcpy_htod(self.ptr + 4 * v.offset, np.ascontiguousarray(host))
        driver().Context.synchronize()

    def buffer(self, i: int) -> np.ndarray:
        out = np.empty(self.shapes[i], np.float32)
        driver().memcpy_dtoh(out, self.ptr + 4 * self.offsets[i])
        return out

    def free(self) -> None:
        self.alloc.free()


class Params:
    """Parameters in one device allocation (poisoned tail), as the backend packs them."""

    def __init__(self, *arrays: np.ndarray):
        flat = [np.ascontiguousarray(a, np.float32).ravel() for a in arrays]
        self.ptrs, pos = [], 0
        sizes = [-(-a.size // ALIGN) * ALIGN for a in flat]
        drv = driver()
        self.alloc = drv.mem_alloc(4 * max(sum(sizes), 1))
        drv.memset_d32(int(self.alloc), NAN_BITS, max(sum(sizes), 1))
        for a, size in zip(flat, sizes):
            self.ptrs.append(int(self.alloc) + 4 * pos)
            drv.memcpy_htod(self.ptrs[-1], a)
            pos += size
        drv.Context.synchronize()

    def free(self) -> None:
        self.alloc.free()


def run(kernels: Kernels, specs: list[LaunchSpec]) -> None:
    for spec in specs:
        Launch(spec, kernels[spec.kernel])(None)
    driver().Context.synchronize()


def check_view(arena: Arena, v: View, ref: np.ndarray, tol: float = TOL) -> None:
    buf = arena.buffer(int(v.buffer[1:]))
    got = buf[:, v.c_offset:v.c_offset + v.channels]
    assert np.isfinite(got).all(), f"{np.isnan(got).sum()} output elements not written"
    err = rel_l2(got, ref)
    assert err <= tol, f"rel L2 {err:.2e} > {tol:.0e}"
    outside = np.concatenate([buf[:, :v.c_offset].ravel(), buf[:, v.c_offset + v.channels:].ravel()])
    assert np.isnan(outside).all(), f"{(~np.isnan(outside)).sum()} elements written outside the destination view"
