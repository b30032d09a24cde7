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

import ctypes
import dataclasses
import math
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from inception_engine import cuda_build
from inception_engine.backends import cuda_backend as cb
from inception_engine.backends.numpy_backend import conv2d_bias_relu
from inception_engine.plan import ALIGN, View, build_plan
from test_cuda_emulated import emu_lib as backend_emu_lib  # noqa: F401 (a fixture: the backend's kernels, emulated)
from test_cuda_emulated import run_emulated as run_backend_emulated
from test_cuda_kernels import Arena, Params, check_view, run  # the GPU helpers (NaN-poisoned arena, params)

TOL = 3e-3
SOURCE = cuda_build.source_dir() / "conv_tf32.cu"
EMU = Path(__file__).resolve().parent / "cuda_emu"
GXX = shutil.which("g++")
NVCC = cuda_build.find_nvcc()
PAD = 8  # the kernel's shared-memory row padding (floats)
THREADS = 256


@dataclasses.dataclass(frozen=True)
class Tf32Tile:
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
        return 4 * self.stages * self.bk * (self.bm + PAD + self.bn + PAD)

    def backend_tile(self) -> cb.Tile:
        """The backend's Tile of this shape (cb.TF32_TILES), so cb.conv_specs names the kernel and sizes the grid."""
        return next(t for t in cb.TF32_TILES if t.name == self.name)


def source_tiles() -> list[Tf32Tile]:
    """The tile table as conv_tf32.cu instantiates it:
    CONV_TF32_KERNEL(KH, KW, BM, BN, BK, WARPS_M, STAGES, MIN_BLOCKS)."""
    found = re.findall(r"CONV_TF32_KERNEL\(KH, KW, (\d+), (\d+), (\d+), (\d+), (\d+), (\d+)\)", SOURCE.read_text())
    return [Tf32Tile(*map(int, f)) for f in found]


TILES = source_tiles()


def kernel_name(kernel: tuple[int, int], tile: Tf32Tile) -> str:
    return f"conv_tf32_{kernel[0]}x{kernel[1]}_{tile.name}"


def all_names() -> list[str]:
    return [kernel_name(k, t) for k in cb.KERNEL_SIZES for t in TILES]


def rng_for(*key: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


# --- CPU: fragment layout ------------------------------------------------------------------------------------------


def test_tile_table():
    assert [t.name for t in TILES] == ["128x128", "128x64", "64x64"]
    for t in TILES:
        warps_n = THREADS // 32 // t.warps_m
        assert (t.bm // t.warps_m) % 16 == 0 and (t.bn // warps_n) % 8 == 0 and t.bk % 8 == 0
        assert t.smem_bytes <= 48 * 1024, f"{t.name}: static shared memory over 48 KB"


def test_backend_tiles_match_the_source():
    """cb.TF32_TILES (what the cost model plans with) has the source's shapes, BK and blocks per SM, and its kernel
    names are exactly the source's entry points, loaded from conv_tf32.cu's cubin."""
    assert [(t.bm, t.bn, t.bk, t.resident) for t in cb.TF32_TILES] == [(t.bm, t.bn, t.bk, t.min_blocks) for t in TILES]
    assert all(t.prefix == "conv_tf32" and not t.fixup for t in cb.TF32_TILES)
    backend_names = [n for n in cb.all_kernel_names() if cb.source_of(n) == "conv_tf32.cu"]
    assert sorted(backend_names) == sorted(all_names())
    assert all(cb.arg_format(n) == cb.CONV_FORMAT for n in backend_names)


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
    rng = rng_for("frag", tile)
    As = rng.standard_normal((tile.bk, tile.bm + PAD))
    Bs = rng.standard_normal((tile.bk, tile.bn + PAD))
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
        for kk in range(0, tile.bk, 8):
            a = np.empty((mi, 32, 4))
            b = np.empty((nj, 32, 2))
            for i in range(mi):
                m = wm + i * 16 + g
                a[i] = np.stack([As[kk + t, m], As[kk + t, m + 8], As[kk + t + 4, m], As[kk + t + 4, m + 8]], 1)
            for j in range(nj):
                n = wn + j * 8 + g
                b[j] = np.stack([Bs[kk + t, n], Bs[kk + t + 4, n]], 1)
            for i in range(mi):
                for j in range(nj):
                    acc[i, j] = isa_mma(a[i], b[j], acc[i, j])
        for i in range(mi):
            for j in range(nj):
                for e in range(2):
                    for half in range(2):
                        n = wn + j * 8 + 2 * t + e
                        m = wm + i * 16 + g + 8 * half
                        assert np.isnan(got[m, n]).all(), "two lanes write the same output"
                        got[m, n] = acc[i, j, :, 2 * half + e]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


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

C_ARG = {"P": ctypes.c_void_p, "i": ctypes.c_int}


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


def config(tile: Tf32Tile, splits: int, k_total: int) -> cb.ConvConfig:
    """This tile with about this many K slices (k_split a multiple of BK, as the backend makes it)."""
    k_split = math.ceil(math.ceil(k_total / splits) / tile.bk) * tile.bk
    return cb.ConvConfig(tile.backend_tile(), math.ceil(k_total / k_split), k_split, 0.0)


def tf32_specs(case: Case, cfg: cb.ConvConfig, name: str, src: View, dst: View, arena: int, w: int, b: int,
               ws: int) -> list[cb.LaunchSpec]:
    """The backend's launches for this conv (given tile counters, which tf32 split-K must not use)."""
    specs = cb.conv_specs("conv", src, dst, case.kernel, case.stride, case.pad, case.relu, cfg, arena, w, b, ws,
                          counters=1 << 44)
    assert specs[0].block == (THREADS, 1, 1) and specs[0].kernel == name
    assert [s.kernel for s in specs[1:]] == (["conv_splitk_reduce"] if cfg.splits > 1 else [])
    return specs


def emu_wrapper_source() -> str:
    fmt = cb.CONV_FORMAT
    params = ", ".join(f"{'void*' if c == 'P' else 'int'} a{i}" for i, c in enumerate(fmt))
    args = ", ".join(f"emu::Ptr{{a{i}}}" if c == "P" else f"a{i}" for i, c in enumerate(fmt))
    lines = ['#include "conv_tf32.cu"']
    for name in all_names():
        lines.append(f'extern "C" void emu_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, {params}) '
                     f'{{ emu::launch(dim3{{gx, gy, gz}}, dim3{{bx}}, [&] {{ {name}({args}); }}); }}')
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def emu_lib(tmp_path_factory) -> ctypes.CDLL:
    if GXX is None:
        pytest.skip("g++ is not installed (the emulator compiles the kernels with it)")
    out = tmp_path_factory.mktemp("emu_tf32")
    (out / "emu_tf32.cpp").write_text(emu_wrapper_source())
    lib = out / "libemu_tf32.so"
    cmd = [GXX, "-std=c++20", "-O1", "-shared", "-fPIC", "-fno-strict-aliasing", "-include", str(EMU / "emu.h"),
           "-include", str(EMU / "tf32_emu.h"), "-I", str(cuda_build.source_dir()), str(out / "emu_tf32.cpp"),
           "-o", str(lib)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return ctypes.CDLL(str(lib))


def aligned_empty(elems: int) -> np.ndarray:
    """float32 array starting on a 256-byte boundary, as device allocations and the backend's offsets do."""
    raw = np.empty(elems + 64, np.float32)
    skip = (-raw.ctypes.data % 256) // 4
    return raw[skip:skip + elems]


def run_emulated(lib: ctypes.CDLL, case: Case, tile: Tf32Tile, splits: int) -> None:
    src_shape, dst_shape = case.shapes()
    src_elems = -(-int(np.prod(src_shape)) // ALIGN) * ALIGN
    arena = aligned_empty(src_elems + int(np.prod(dst_shape)))
    arena[:] = np.nan
    src = View("b0", 0, src_shape, case.src_extra[0], case.cin)
    dst = View("b1", src_elems, dst_shape, case.dst_extra[0], case.cout)
    x, wt, b = case.data()
    src_buf = arena[:src_elems][:int(np.prod(src_shape))].reshape(src_shape)
    dst_buf = arena[src_elems:].reshape(dst_shape)
    src_buf[:, case.src_extra[0]:case.src_extra[0] + case.cin] = x
    before = src_buf.copy()
    w_dev = aligned_empty(wt.size)
    w_dev[:] = wt.reshape(case.cout, -1).T.ravel()
    b_dev = aligned_empty(case.cout)
    b_dev[:] = b
    cfg = config(tile, splits, case.k_total)
    n_total = case.n * math.prod(case.out_hw)
    ws = aligned_empty(cfg.splits * case.cout * n_total)
    ws[:] = np.nan
    spec = tf32_specs(case, cfg, kernel_name(case.kernel, tile), src, dst, arena.ctypes.data, w_dev.ctypes.data,
                      b_dev.ctypes.data, ws.ctypes.data)[0]
    fn = getattr(lib, f"emu_{spec.kernel}")
    fn.argtypes = [ctypes.c_uint] * 4 + [C_ARG[c] for c in cb.CONV_FORMAT]
    fn(*spec.grid, spec.block[0], *spec.args)
    view = dst_buf[:, case.dst_extra[0]:case.dst_extra[0] + case.cout]
    if cfg.splits > 1:  # conv_splitk_reduce's arithmetic, in NumPy: every slice must have been written
        assert np.isfinite(ws).all(), f"{np.isnan(ws).sum()} workspace elements not written"
        y = ws.reshape(cfg.splits, case.cout, n_total).sum(0, dtype=np.float32) + b[:, None]
        y = np.maximum(y, 0) if case.relu else y
        view[:] = y.reshape(case.cout, case.n, *case.out_hw).transpose(1, 0, 2, 3)
    assert np.isfinite(view).all(), f"{np.isnan(view).sum()} output elements not written"
    err = rel_l2(view, case.reference(x, wt, b))
    assert err <= TOL, f"rel L2 {err:.2e} > {TOL:.0e}"
    outside = np.concatenate([dst_buf[:, :case.dst_extra[0]].ravel(),
                              dst_buf[:, case.dst_extra[0] + case.cout:].ravel()])
    assert np.isnan(outside).all(), f"{(~np.isnan(outside)).sum()} elements written outside the destination view"
    np.testing.assert_array_equal(src_buf, before)


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


@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.name)
@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: f"{c.kernel[0]}x{c.kernel[1]}-n{c.n}-{c.h}x{c.w}")
def test_emulated(emu_lib, case, tile):
    splits = 3 if case.kernel in ((3, 3), (1, 1), (7, 1)) else 1
    run_emulated(emu_lib, case, tile, splits)


@pytest.mark.skipif(GXX is None or NVCC is None, reason="needs g++ and nvcc (as test_cuda_emulated.py)")
def test_backend_tf32_forward_on_the_emulator(backend_emu_lib):
    """The backend's self-test in tf32: the whole network (75x75, batch 1, ~200 launches, split-K by
    conv_splitk_reduce) against float64, rel L2 <= 3e-3 and the same top class. About a minute on one core."""
    r = run_backend_emulated(backend_emu_lib, "-m", "inception_engine.backends.cuda_backend", "--selftest",
                             "--batch", "1", "--graph", "off", "--concurrent", "off", "--input-size", "75",
                             "--precision", "tf32")
    out = r.stdout[-2000:] + r.stderr[-3000:]
    assert r.returncode == 0 and "selftest (tf32)" in r.stdout and "PASS" in r.stdout, out


# --- nvcc: every entry point is there ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cubin(tmp_path_factory) -> Path:
    if NVCC is None:
        pytest.skip("nvcc (CUDA toolkit) is not on PATH")
    return compile_cubin(tmp_path_factory.mktemp("tf32"), "sm_90")


def compile_cubin(out: Path, arch: str) -> Path:
    path = out / f"conv_tf32-{arch}.cubin"
    cmd = [NVCC, f"-arch={arch}", *cuda_build.FLAGS, "-cubin", "-o", str(path), str(SOURCE)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return path


def test_cubin_holds_every_entry_point(cubin):
    names = {s.decode("latin-1") for s in cubin.read_bytes().split(b"\0")}
    missing = [n for n in all_names() if n not in names]
    assert not missing, f"entry points missing from the cubin: {missing}"


# --- GPU -----------------------------------------------------------------------------------------------------------


def run_on_gpu(kernels: cb.Kernels, case: Case, tile: Tf32Tile, splits: int) -> None:
    arena = Arena(*case.shapes())
    src, dst = arena.view(0, case.src_extra[0], case.cin), arena.view(1, case.dst_extra[0], case.cout)
    x, wt, b = case.data()
    params = Params(wt.reshape(case.cout, -1).T, b)
    cfg = config(tile, splits, case.k_total)
    ws_elems = max(1, cfg.splits * case.cout * case.n * math.prod(case.out_hw))
    ws = cb.driver().mem_alloc(4 * ws_elems)
    cb.driver().memset_d32(int(ws), cb.NAN_BITS, ws_elems)
    try:
        arena.put(src, x)
        before = arena.buffer(0)
        run(kernels, tf32_specs(case, cfg, kernel_name(case.kernel, tile), src, dst, arena.ptr, *params.ptrs,
                                int(ws)))
        check_view(arena, dst, case.reference(x, wt, b), tol=TOL)
        np.testing.assert_array_equal(arena.buffer(0), before)
    finally:
        arena.free()
        params.free()
        ws.free()


def network_cases() -> list[tuple[str, Case]]:
    seen: dict[tuple, tuple[str, Case]] = {}
    for op in build_plan(1).conv_ops:
        c = Case(1, op.src.channels, op.dst.channels, op.src.h, op.src.w, op.kernel, op.stride, op.pad)
        seen.setdefault((c.cin, c.cout, c.h, c.w, c.kernel, c.stride, c.pad), (op.name, c))
    return list(seen.values())


@pytest.mark.gpu
@pytest.mark.parametrize("named", network_cases(), ids=lambda nc: nc[0])
def test_gpu_every_network_shape_batch1(gpu, named):
    _, case = named
    for tile in TILES:
        run_on_gpu(gpu[1], case, tile, 1)
    if case.k_total >= 4 * 64:
        run_on_gpu(gpu[1], case, TILES[-1], 4)


GPU_EDGE_CASES = [
    *EMU_CASES,
    Case(1, 19, 130, 9, 11, (3, 3), 1, (1, 1), (0, 3), (64, 0)),
    Case(2, 15, 40, 12, 12, (3, 3), 2, (1, 1)),
    Case(3, 288, 384, 35, 35, (3, 3), 2, (0, 0), (0, 0), (96, 288)),  # Mixed_6a at batch 3, into its concat
    Case(5, 2048, 1000, 1, 1, (1, 1), 1, (0, 0), relu=False),  # the FC as a 1x1 GEMM
]


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.name)
@pytest.mark.parametrize("case", GPU_EDGE_CASES, ids=lambda c: f"{c.kernel[0]}x{c.kernel[1]}-n{c.n}-c{c.cin}-{c.h}x{c.w}")
def test_gpu_edge_cases_every_tile(gpu, case, tile, splits):
    run_on_gpu(gpu[1], case, tile, splits)
