"""The TF32 tensor-core convolution kernels (cuda_src/conv_tf32.cu) against the float64 NumPy reference.

Three levels, so a fragment-layout mistake is caught without a GPU:
- CPU, NumPy: one warp's mma.m16n8k8 simulated with the kernel's own index formulas (fragment loads from the padded
  shared tiles, accumulator -> (m, n) in the epilogue) and the PTX ISA's fragment layout, against a plain matmul;
  plus the bank-conflict claim of the header and the tile table (static shared memory under 48 KB).
- CPU, g++: the kernels run in the fiber emulator (tests/cuda_emu/emu.h) with tests/cuda_emu/tf32_emu.h, which
  implements the warp-wide mma from the ISA layout independently of the kernel, on small edge cases (batch 3, odd
  sizes, channel-slice views, split-K, no ReLU, Cout not a multiple of 4) with every tile.
- CPU, g++: one whole forward of the backend with precision="tf32" (75x75 images) in the emulator, against float64.
- GPU (marked gpu): every distinct conv shape of the network at batch 1 with every tile (and split-K), and the
  edge cases of test_cuda_kernels.py, launched by the backend's own conv_specs and kernel loader.
Outputs and the split-K workspace start as NaN, so unwritten elements fail; writes outside the destination view and
changes to the source fail too. Tolerance: rel L2 <= 3e-3 per layer (TF32 keeps 10 mantissa bits; ~5e-4 expected).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from inception_engine import cuda_build
from inception_engine.backends.cuda.kernels import CONV_FORMAT, Kernels, all_kernel_names, arg_format, source_of
from inception_engine.backends.cuda.tiles import KERNEL_SIZES, TF32_TILES, Tile

from helpers import mma_harness
from helpers.emulator import run_emulated as run_backend_emulated
from helpers.gpu_buffers import check_view
from helpers.mma_harness import (EMU_CASES, GPU_EDGE_CASES, GXX, NVCC, THREADS, Case, MmaTile,
                                 assert_block_equals_matmul, assert_cubin_holds, compile_emu_lib,
                                 emu_wrapper_source, emulated_splits, network_cases, rel_l2, rng_for, run_every_tile)

TOL = 3e-3
SOURCE = cuda_build.source_dir() / "conv_tf32.cu"
PREFIX = "conv_tf32"
PAD = 8  # the kernel's shared-memory row padding (floats)


@dataclasses.dataclass(frozen=True)
class Tf32Tile(MmaTile):
    PAD = PAD

    def backend_tile(self) -> Tile:
        """The backend's Tile of this shape (TF32_TILES), so conv_specs names the kernel and sizes the grid."""
        return next(t for t in TF32_TILES if t.name == self.name)


TILES = mma_harness.source_tiles(SOURCE, "CONV_TF32_KERNEL", Tf32Tile)


def kernel_name(kernel: tuple[int, int], tile: Tf32Tile) -> str:
    return mma_harness.kernel_name(PREFIX, kernel, tile)


def all_names() -> list[str]:
    return [kernel_name(k, t) for k in KERNEL_SIZES for t in TILES]


# --- CPU: fragment layout ------------------------------------------------------------------------------------------


def test_tile_table():
    assert [t.name for t in TILES] == ["128x128", "128x64", "64x64"]
    for t in TILES:
        warps_n = THREADS // 32 // t.warps_m
        assert (t.bm // t.warps_m) % 16 == 0 and (t.bn // warps_n) % 8 == 0 and t.bk % 8 == 0
        assert t.smem_bytes <= 48 * 1024, f"{t.name}: static shared memory over 48 KB"


def test_backend_tiles_match_the_source():
    """TF32_TILES (what the cost model plans with) has the source's shapes, BK and blocks per SM, and its kernel
    names are exactly the source's entry points, loaded from conv_tf32.cu's cubin."""
    assert [(t.bm, t.bn, t.bk, t.resident) for t in TF32_TILES] == [(t.bm, t.bn, t.bk, t.min_blocks) for t in TILES]
    assert all(t.prefix == "conv_tf32" and not t.fixup for t in TF32_TILES)
    backend_names = [n for n in all_kernel_names() if source_of(n) == "conv_tf32.cu"]
    assert sorted(backend_names) == sorted(all_names())
    assert all(arg_format(n) == CONV_FORMAT for n in backend_names)


def isa_mma(a_regs: np.ndarray, b_regs: np.ndarray, c_regs: np.ndarray) -> np.ndarray:
    """D = A B + C of mma.m16n8k8 .tf32, the registers (lane, reg) placed by the PTX ISA's fragment tables:
    A: row = g (+8 for a1, a3), col = t (+4 for a2, a3); B: row = t (+4 for b1), col = g;
    C: row = g (+8 for c2, c3), col = 2t + (i & 1); g = lane >> 2, t = lane & 3."""
    A, B, C = np.zeros((16, 8)), np.zeros((8, 8)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(4):
            A[g + 8 * (i & 1), t + 4 * (i >> 1)] = a_regs[lane, i]
            C[g + 8 * (i >> 1), 2 * t + (i & 1)] = c_regs[lane, i]
        for i in range(2):
            B[t + 4 * i, g] = b_regs[lane, i]
    D = A @ B + C
    d_regs = np.empty((32, 4))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(4):
            d_regs[lane, i] = D[g + 8 * (i >> 1), 2 * t + (i & 1)]
    return d_regs


@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.name)
def test_fragment_mapping_simulated_warp_equals_matmul(tile):
    """Every warp of a block, one BK stage: the kernel's fragment loads, ISA mma, and epilogue placement give
    As^T Bs on the warp's tile, and each (m, n) is produced by exactly one (warp, lane, fragment, register)."""
    def fragments(As, Bs, kk, wm, wn, mi, nj, g, t):
        a = np.empty((mi, 32, 4))
        b = np.empty((nj, 32, 2))
        for i in range(mi):
            m = wm + i * 16 + g
            a[i] = np.stack([As[kk + t, m], As[kk + t, m + 8], As[kk + t + 4, m], As[kk + t + 4, m + 8]], 1)
        for j in range(nj):
            n = wn + j * 8 + g
            b[j] = np.stack([Bs[kk + t, n], Bs[kk + t + 4, n]], 1)
        return a, b

    assert_block_equals_matmul(tile, rng_for("frag", tile), 8, fragments, isa_mma,
                               row=lambda wm, i, g, half: wm + i * 16 + g + 8 * half,
                               col=lambda wn, j, t, e: wn + j * 8 + 2 * t + e)


@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.name)
def test_fragment_loads_and_loader_stores_are_bank_conflict_free(tile):
    lanes = np.arange(32)
    g, t = lanes // 4, lanes % 4
    for row, width in ((tile.bm + PAD, tile.bm), (tile.bn + PAD, tile.bn)):
        for k_off in (0, 4):
            for m_off in range(0, width, 8):  # every fragment base of the tile, +8 rows included
                banks = ((k_off + t) * row + m_off + g) % 32
                assert len(set(banks)) == 32, f"row {row}: fragment load hits banks {sorted(banks)}"
    # B loader: a warp stores 32 consecutive pixels of one row (BN is a multiple of 32).
    assert tile.bn % 32 == 0


# --- CPU: the kernels in the fiber emulator -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def emu_lib(build_cache_dir):
    wrapper = emu_wrapper_source("conv_tf32.cu", [(n, CONV_FORMAT) for n in all_names()])
    return compile_emu_lib(build_cache_dir, "emu_tf32", wrapper, "-O1", mma=True)


def check_against_float64(case: Case):
    def check(got: np.ndarray, x: np.ndarray, wt: np.ndarray, b: np.ndarray) -> None:
        err = rel_l2(got, case.reference(x, wt, b))
        assert err <= TOL, f"rel L2 {err:.2e} > {TOL:.0e}"
    return check


def run_emulated(lib, case: Case, tile: Tf32Tile, splits: int) -> None:
    mma_harness.run_emulated(lib, case, tile, splits, kernel_name(case.kernel, tile), case.data(),
                             check_against_float64(case))


@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.name)
@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: f"{c.kernel[0]}x{c.kernel[1]}-n{c.n}-{c.h}x{c.w}")
def test_emulated(emu_lib, case, tile):
    run_emulated(emu_lib, case, tile, emulated_splits(case))


@pytest.mark.skipif(GXX is None or NVCC is None, reason="needs g++ and nvcc (as test_cuda_emulated.py)")
@pytest.mark.slow
def test_backend_tf32_forward_on_the_emulator(backend_emu_lib):
    """The backend's self-test in tf32 on NCHW tensors (test_conv_nhwc.py runs the NHWC layout): the whole network
    (75x75, batch 1, ~200 launches, split-K by conv_splitk_reduce) against float64, rel L2 <= 3e-3 and the same top
    class. About 20 seconds on one core."""
    r = run_backend_emulated(backend_emu_lib, "-m", "inception_engine.backends.cuda", "--selftest",
                             "--batch", "1", "--graph", "off", "--concurrent", "off", "--input-size", "75",
                             "--precision", "tf32", "--layout", "nchw")
    out = r.stdout[-2000:] + r.stderr[-3000:]
    assert r.returncode == 0 and "selftest (tf32)" in r.stdout and "PASS" in r.stdout, out


# --- nvcc: every entry point is there ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cubin(kernel_cubins) -> Path:
    """conv_tf32.cu's cubin for sm_90 as the backend builds it (its own compile unit, no defines)."""
    return kernel_cubins[SOURCE.name]


def test_cubin_holds_every_entry_point(cubin):
    assert_cubin_holds(cubin, all_names())


# --- GPU -----------------------------------------------------------------------------------------------------------


def run_on_gpu(kernels: Kernels, case: Case, tile: Tf32Tile, splits: int) -> None:
    def check(arena, dst, x, wt, b):
        check_view(arena, dst, case.reference(x, wt, b), tol=TOL)
    mma_harness.run_on_gpu(kernels, case, tile, splits, kernel_name(case.kernel, tile), case.data(), check)


@pytest.mark.gpu
@pytest.mark.parametrize("named", network_cases(), ids=lambda nc: nc[0])
def test_gpu_every_network_shape_batch1(gpu, named):
    run_every_tile(run_on_gpu, gpu[1], named[1], TILES)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.name)
@pytest.mark.parametrize("case", GPU_EDGE_CASES,
                         ids=lambda c: f"{c.kernel[0]}x{c.kernel[1]}-n{c.n}-c{c.cin}-{c.h}x{c.w}")
def test_gpu_edge_cases_every_tile(gpu, case, tile, splits):
    run_on_gpu(gpu[1], case, tile, splits)
