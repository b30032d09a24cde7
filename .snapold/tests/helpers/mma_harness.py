"""What the tensor-core conv tests (test_cuda_tf32.py, test_cuda_fp16.py) share: the tile table read from the source,
the conv cases, the fiber-emulator build (also used by test_cuda_winograd.py), one NaN-poisoned run of a kernel in
the emulator or on the GPU, and the cubin check. Each precision's test file keeps only what differs: its source,
padding, tolerances and the references it checks against.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import re
import shutil
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from inception_engine import cuda_build
from inception_engine.backends.cuda.cost_model import ConvConfig
from inception_engine.backends.cuda.device import driver
from inception_engine.backends.cuda.kernels import CONV_FORMAT, Kernels
from inception_engine.backends.cuda.launch import LaunchSpec, conv_specs
from inception_engine.backends.cuda.params import direct_weights
from inception_engine.backends.cuda.tiles import NAN_BITS, Tile
from inception_engine.backends.numpy_primitives import conv2d_bias_relu
from inception_engine.plan import ALIGN, View, build_plan

from helpers.build_cache import shared_library
from helpers.emulator import C_PARAM, codegen_flags
from helpers.gpu_buffers import Arena, Params, run

EMU = Path(__file__).resolve().parents[1] / "cuda_emu"
GXX = shutil.which("g++")
NVCC = cuda_build.find_nvcc()
THREADS = 256
C_ARG = {"P": ctypes.c_void_p, "i": ctypes.c_int}


def rng_for(*key: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def aligned_empty(elems: int) -> np.ndarray:
    """float32 array starting on a 256-byte boundary, as device allocations and the backend's offsets do."""
    raw = np.empty(elems + 64, np.float32)
    skip = (-raw.ctypes.data % 256) // 4
    return raw[skip:skip + elems]


# --- the tile table ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MmaTile:
    """One CONV_*_KERNEL(KH, KW, BM, BN, BK, WARPS_M, STAGES, MIN_BLOCKS) instantiation; PAD is the kernel's
    shared-memory row padding (floats), set by each precision's subclass."""
    PAD: ClassVar[int]
    bm: int
    bn: int
    bk: int
    warps_m: int
    stages: int
    min_blocks: int

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}"

    @property
    def smem_bytes(self) -> int:
        return 4 * self.stages * self.bk * (self.bm + self.PAD + self.bn + self.PAD)

    def backend_tile(self) -> Tile:
        raise NotImplementedError


def source_tiles(source: Path, macro: str, tile_class: type[MmaTile]) -> list[MmaTile]:
    """The tile table as the source instantiates it: macro(KH, KW, BM, BN, BK, WARPS_M, STAGES, MIN_BLOCKS)."""
    found = re.findall(macro + r"\(KH, KW, (\d+), (\d+), (\d+), (\d+), (\d+), (\d+)\)", source.read_text())
    return [tile_class(*map(int, f)) for f in found]


def kernel_name(prefix: str, kernel: tuple[int, int], tile: MmaTile) -> str:
    return f"{prefix}_{kernel[0]}x{kernel[1]}_{tile.name}"


# --- the cases -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    n: int
    cin: int
    cout: int
    h: int
    w: int
    kernel: tuple[int, int]
    stride: int
    pad: tuple[int, int]
    src_extra: tuple[int, int] = (0, 0)  # channels before and after the source view in its buffer
    dst_extra: tuple[int, int] = (0, 0)
    relu: bool = True

    @property
    def out_hw(self) -> tuple[int, int]:
        return ((self.h + 2 * self.pad[0] - self.kernel[0]) // self.stride + 1,
                (self.w + 2 * self.pad[1] - self.kernel[1]) // self.stride + 1)

    @property
    def k_total(self) -> int:
        return self.cin * self.kernel[0] * self.kernel[1]

    def data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = rng_for(self)
        x = rng.standard_normal((self.n, self.cin, self.h, self.w)).astype(np.float32)
        wt = (rng.standard_normal((self.cout, self.cin, *self.kernel)) / np.sqrt(self.k_total)).astype(np.float32)
        return x, wt, (0.1 * rng.standard_normal(self.cout)).astype(np.float32)

    def reference(self, x: np.ndarray, wt: np.ndarray, b: np.ndarray) -> np.ndarray:
        return conv2d_bias_relu(x.astype(np.float64), wt.astype(np.float64), b.astype(np.float64), self.stride,
                                self.pad, self.relu)

    def shapes(self) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
        return ((self.n, sum(self.src_extra) + self.cin, self.h, self.w),
                (self.n, sum(self.dst_extra) + self.cout, *self.out_hw))


EMU_CASES = [
    Case(3, 37, 70, 17, 13, (3, 3), 2, (0, 0), (5, 8), (9, 11)),
    Case(2, 12, 33, 10, 9, (5, 5), 1, (2, 2), (7, 0), (0, 5)),
    Case(3, 24, 48, 9, 7, (1, 7), 1, (0, 3), (0, 0), (17, 1)),
    Case(1, 20, 65, 11, 6, (7, 1), 1, (3, 0), (2, 2), (3, 0), relu=False),
    Case(2, 40, 31, 5, 7, (1, 3), 1, (0, 1), (1, 0)),
    Case(3, 40, 29, 7, 5, (3, 1), 1, (1, 0), (0, 9), (4, 4)),
    Case(3, 100, 136, 5, 5, (1, 1), 1, (0, 0), (28, 0), (0, 56)),
    Case(3, 9, 135, 7, 9, (1, 1), 1, (0, 0), (2, 1), (5, 3)),  # an M tail of 7; odd Ho*Wo
]

GPU_EDGE_CASES = [
    *EMU_CASES,
    Case(1, 19, 130, 9, 11, (3, 3), 1, (1, 1), (0, 3), (64, 0)),
    Case(2, 15, 40, 12, 12, (3, 3), 2, (1, 1)),
    Case(3, 288, 384, 35, 35, (3, 3), 2, (0, 0), (0, 0), (96, 288)),  # Mixed_6a at batch 3, into its concat
    Case(5, 2048, 1000, 1, 1, (1, 1), 1, (0, 0), relu=False),  # the FC as a 1x1 GEMM
]


def emulated_splits(case: Case) -> int:
    """Split-K for test_emulated: 3 slices on the shapes the network splits most, else none."""
    return 3 if case.kernel in ((3, 3), (1, 1), (7, 1)) else 1


def run_every_tile(run: Callable, kernels: Kernels, case: Case, tiles: list[MmaTile]) -> None:
    """run(kernels, case, tile, splits) with every tile unsplit, and the last tile with 4 slices where K allows."""
    for tile in tiles:
        run(kernels, case, tile, 1)
    if case.k_total >= 4 * 64:
        run(kernels, case, tiles[-1], 4)


def network_cases() -> list[tuple[str, Case]]:
    seen: dict[tuple, tuple[str, Case]] = {}
    for op in build_plan(1).conv_ops:
        c = Case(1, op.src.channels, op.dst.channels, op.src.h, op.src.w, op.kernel, op.stride, op.pad)
        seen.setdefault((c.cin, c.cout, c.h, c.w, c.kernel, c.stride, c.pad), (op.name, c))
    return list(seen.values())


# --- launches ------------------------------------------------------------------------------------------------------


def config(tile: MmaTile, splits: int, k_total: int) -> ConvConfig:
    """This tile with about this many K slices (k_split a multiple of BK, as the backend makes it)."""
    k_split = math.ceil(math.ceil(k_total / splits) / tile.bk) * tile.bk
    return ConvConfig(tile.backend_tile(), math.ceil(k_total / k_split), k_split, 0.0)


def mma_specs(case: Case, cfg: ConvConfig, name: str, src: View, dst: View, arena: int, w: int, b: int,
              ws: int) -> list[LaunchSpec]:
    """The backend's launches for this conv (given tile counters, which the tensor-core split-K must not use)."""
    specs = conv_specs("conv", src, dst, case.kernel, case.stride, case.pad, case.relu, cfg, arena, w, b, ws,
                          counters=1 << 44)
    assert specs[0].block == (THREADS, 1, 1) and specs[0].kernel == name
    assert [s.kernel for s in specs[1:]] == (["conv_splitk_reduce"] if cfg.splits > 1 else [])
    return specs


# --- the fiber emulator --------------------------------------------------------------------------------------------


def emu_wrapper_source(source: str, kernels: list[tuple[str, str]], extra: tuple[str, ...] = ()) -> str:
    """C++ that includes the .cu source and exports emu_<name>(grid, block.x, args...) for each (name, arg format)."""
    lines = [f'#include "{source}"', *extra]
    for name, fmt in kernels:
        params = ", ".join(f"{C_PARAM[c]} a{i}" for i, c in enumerate(fmt))
        args = ", ".join(f"emu::Ptr{{a{i}}}" if c == "P" else f"a{i}" for i, c in enumerate(fmt))
        lines.append(f'extern "C" void emu_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, {params}) '
                     f'{{ emu::launch(dim3{{gx, gy, gz}}, dim3{{bx}}, [&] {{ {name}({args}); }}); }}')
    return "\n".join(lines) + "\n"


def compile_emu_lib(cache_dir: Path, stem: str, wrapper: str, opt: str, mma: bool) -> ctypes.CDLL:
    """Builds the wrapper with g++ against emu.h (and tf32_emu.h, which brings f16_emu.h, for the mma kernels), once
    into cache_dir (helpers.build_cache)."""
    if GXX is None:
        pytest.skip("g++ is not installed (the emulator compiles the kernels with it)")
    headers = ["-include", str(EMU / "emu.h"), *(["-include", str(EMU / "tf32_emu.h")] if mma else [])]
    flags = ["-std=c++20", opt, *codegen_flags(), "-shared", "-fPIC", "-fno-strict-aliasing", *headers, "-I",
             str(cuda_build.source_dir())]
    return ctypes.CDLL(str(shared_library(cache_dir, stem, GXX, flags, wrapper, [EMU, cuda_build.source_dir()])))


Data = tuple[np.ndarray, np.ndarray, np.ndarray]


def run_emulated(lib: ctypes.CDLL, case: Case, tile: MmaTile, splits: int, name: str, data: Data,
                 check: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]) -> None:
    """Runs kernel `name` on (x, wt, b) = data in a NaN-poisoned arena, split-K reduced in NumPy; every output and
    workspace element must be written, nothing outside the destination view nor in the source; check(y, x, wt, b)
    judges the values."""
    src_shape, dst_shape = case.shapes()
    src_elems = -(-int(np.prod(src_shape)) // ALIGN) * ALIGN
    arena = aligned_empty(src_elems + int(np.prod(dst_shape)))
    arena[:] = np.nan
    src = View("b0", 0, src_shape, case.src_extra[0], case.cin)
    dst = View("b1", src_elems, dst_shape, case.dst_extra[0], case.cout)
    x, wt, b = data
    src_buf = arena[:src_elems][:int(np.prod(src_shape))].reshape(src_shape)
    dst_buf = arena[src_elems:].reshape(dst_shape)
    src_buf[:, case.src_extra[0]:case.src_extra[0] + case.cin] = x
    before = src_buf.copy()
    w_host = direct_weights(wt, tile.backend_tile()).ravel()
    w_dev = aligned_empty(w_host.size)
    w_dev[:] = w_host
    b_dev = aligned_empty(case.cout)
    b_dev[:] = b
    cfg = config(tile, splits, case.k_total)
    n_total = case.n * math.prod(case.out_hw)
    ws = aligned_empty(cfg.splits * case.cout * n_total)
    ws[:] = np.nan
    spec = mma_specs(case, cfg, name, src, dst, arena.ctypes.data, w_dev.ctypes.data, b_dev.ctypes.data,
                     ws.ctypes.data)[0]
    fn = getattr(lib, f"emu_{spec.kernel}")
    fn.argtypes = [ctypes.c_uint] * 4 + [C_ARG[c] for c in CONV_FORMAT]
    fn(*spec.grid, spec.block[0], *spec.args)
    view = dst_buf[:, case.dst_extra[0]:case.dst_extra[0] + case.cout]
    if cfg.splits > 1:  # conv_splitk_reduce's arithmetic, in NumPy: every slice must have been written
        assert np.isfinite(ws).all(), f"{np.isnan(ws).sum()} workspace elements not written"
        y = ws.reshape(cfg.splits, case.cout, n_total).sum(0, dtype=np.float32) + b[:, None]
        y = np.maximum(y, 0) if case.relu else y
        view[:] = y.reshape(case.cout, case.n, *case.out_hw).transpose(1, 0, 2, 3)
    assert np.isfinite(view).all(), f"{np.isnan(view).sum()} output elements not written"
    check(view, x, wt, b)
    outside = np.concatenate([dst_buf[:, :case.dst_extra[0]].ravel(),
                              dst_buf[:, case.dst_extra[0] + case.cout:].ravel()])
    assert np.isnan(outside).all(), f"{(~np.isnan(outside)).sum()} elements written outside the destination view"
    np.testing.assert_array_equal(src_buf, before)


# --- nvcc and the GPU ----------------------------------------------------------------------------------------------


def compile_cubin(path: Path, source: Path, arch: str) -> Path:
    cmd = [NVCC, *cuda_build.target_flags(source.name, arch), *cuda_build.FLAGS, "-cubin", "-o", str(path),
           str(source)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return path


def assert_cubin_holds(cubin: Path, names: list[str]) -> None:
    found = {s.decode("latin-1") for s in cubin.read_bytes().split(b"\0")}
    missing = [n for n in names if n not in found]
    assert not missing, f"entry points missing from the cubin: {missing}"


def run_on_gpu(kernels: Kernels, case: Case, tile: MmaTile, splits: int, name: str, data: Data,
               check: Callable) -> None:
    """As run_emulated on the GPU (test_cuda_kernels.py's NaN-poisoned Arena, the real conv_splitk_reduce);
    check(arena, dst, x, wt, b) judges the destination view."""
    arena = Arena(*case.shapes())
    src, dst = arena.view(0, case.src_extra[0], case.cin), arena.view(1, case.dst_extra[0], case.cout)
    x, wt, b = data
    params = Params(direct_weights(wt, tile.backend_tile()), b)
    cfg = config(tile, splits, case.k_total)
    ws_elems = max(1, cfg.splits * case.cout * case.n * math.prod(case.out_hw))
    ws = driver().mem_alloc(4 * ws_elems)
    driver().memset_d32(int(ws), NAN_BITS, ws_elems)
    try:
        arena.put(src, x)
        before = arena.buffer(0)
        run(kernels, mma_specs(case, cfg, name, src, dst, arena.ptr, *params.ptrs, int(ws)))
        check(arena, dst, x, wt, b)
        np.testing.assert_array_equal(arena.buffer(0), before)
    finally:
        arena.free()
        params.free()
        ws.free()


# --- one block's fragments, simulated in NumPy ---------------------------------------------------------------------


def assert_block_equals_matmul(tile: MmaTile, rng: np.random.Generator, k_step: int, fragments: Callable,
                               isa_mma: Callable, row: Callable, col: Callable) -> None:
    """Every warp of a block, one BK stage of padded shared tiles As (BK, BM + PAD) and Bs (BK, BN + PAD):
    fragments(As, Bs, kk, wm, wn, mi, nj, g, t) -> the warp's A and B registers per m16 / n8 block, isa_mma places
    them by the PTX ISA, and the epilogue puts accumulator register 2 * half + e of lane (g, t) at
    (row(wm, i, g, half), col(wn, j, t, e)). The result must be As^T Bs, each (m, n) written once."""
    As = rng.standard_normal((tile.bk, tile.bm + tile.PAD))
    Bs = rng.standard_normal((tile.bk, tile.bn + tile.PAD))
    want = As[:, :tile.bm].T @ Bs[:, :tile.bn]
    warps_n = THREADS // 32 // tile.warps_m
    wm_size, wn_size = tile.bm // tile.warps_m, tile.bn // warps_n
    mi, nj = wm_size // 16, wn_size // 8
    got = np.full((tile.bm, tile.bn), np.nan)
    lanes = np.arange(32)
    g, t = lanes // 4, lanes % 4
    for warp in range(THREADS // 32):
        wm, wn = (warp % tile.warps_m) * wm_size, (warp // tile.warps_m) * wn_size
        acc = np.zeros((mi, nj, 32, 4))
        for kk in range(0, tile.bk, k_step):
            a, b = fragments(As, Bs, kk, wm, wn, mi, nj, g, t)
            for i in range(mi):
                for j in range(nj):
                    acc[i, j] = isa_mma(a[i], b[j], acc[i, j])
        for i in range(mi):
            for j in range(nj):
                for e in range(2):
                    for half in range(2):
                        n = col(wn, j, t, e)
                        m = row(wm, i, g, half)
                        assert np.isnan(got[m, n]).all(), "two lanes write the same output"
                        got[m, n] = acc[i, j, :, 2 * half + e]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
