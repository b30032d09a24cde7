"""Winograd convolutions (cuda_src/winograd.cu) and their planning in the CUDA backend.

- CPU: the cost model's choices, the packed U and transforms, workspace slices and launch arguments.
- CPU, g++: the three kernels (input transform, batched GEMM, output transform) in the fiber emulator
  (tests/cuda_emu/emu.h) on small cases: odd H and W (ragged edge tiles), padding 0 to 3, channel-slice source and
  destination views inside bigger buffers, batch > 1, Cin not a multiple of BK, Cout over several GEMM tiles, T over
  several GEMM tiles, every GEMM tile, every variant: F(2x2, 3x3), F(4x4, 3x3), F(2x2, 5x5), F(3, 7) for 1x7 and
  7x1. Each stage is checked against float64 NumPy (V, then M on the emulated V, then y against the direct
  convolution); every buffer starts as NaN, so an unwritten element fails and a write outside the destination view
  shows. Plus the backend's whole forward with winograd forced on.
- GPU (marked gpu): every Winograd-eligible layer shape of the network (3x3, 5x5, 1x7, 7x1) at batch 1 and 8 with
  each of its variants; the whole network with winograd on against float64 (rel L2 <= 1e-4, the same top 5),
  through a CUDA graph and eagerly (bit-identical: the kernels have no atomics or order-dependent sums).

Error bound per layer (fp32 against float64, rel L2): the direct kernel's is 1e-5 (measured ~2e-7). Winograd adds
the rounding of the transforms, whose entries reach 8 (A^T of F(4, 3)) and 2.1 (B^T), so intermediate values are
several times larger than the results they cancel into. Measured in the emulator (same fmaf sequence as the GPU):
F(2x2, 3x3) 3e-7 to 7e-7, F(4x4, 3x3) 1.4e-6 at Cin 96 and 2.9e-6 at Cin 448 (Mixed_7b's shape); F(2x2, 5x5)
(the same 6-point B^T as F(4, 3)) 1.1e-6 at Cin 48; F(3, 7) for 1x7 / 7x1 (8 points, up to 3: A^T entries to 27)
1.4e-6 at Cin 9 to 3.9e-6 at Cin 192 (Mixed_6e's shape); numpy_backend measured 1.0e-6 for F(4x4, 3x3) on
Inception's 3x3 layers and 2.9e-6 for F(3, 7) on Mixed_6c's 1x7. (Scaling B^T's rows to integers and G's by the
inverse, which makes B^T exact in fp32, changes this by 2% in a NumPy simulation: the error is the amplification,
not the rounding of B^T.) WINO_TOL = 1e-5 is 2.5x above the worst measured case (a rel L2 over >= 10^4 outputs
varies by a few percent between random draws, not by 2.5x) and still fails a wrong transform, index or bound by
orders of magnitude; over the network's 94 layers such errors add up to ~1e-5 on the logits, inside NET_TOL.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math

import numpy as np
import pytest

from inception_engine import cuda_build
from inception_engine.backends.cuda import selftest
from inception_engine.backends.cuda.backend import CudaBackend
from inception_engine.backends.cuda.cost_model import (WINO_MARGIN, ConvConfig, choose_configs, config_shape,
                                                       conv_config, winograd_config)
from inception_engine.backends.cuda.device import driver
from inception_engine.backends.cuda.kernels import all_kernel_names, arg_format, source_of, wino_kernel_names
from inception_engine.backends.cuda.launch import LaunchSpec, launch_specs, winograd_specs
from inception_engine.backends.cuda.params import pack_params
from inception_engine.backends.cuda.selftest import he_weights, top5_agree
from inception_engine.backends.cuda.tiles import NAN_BITS, WINO_TILES, Tile
from inception_engine.backends.cuda.winograd import (WINO_VARIANTS, o_pad, winograd_eligible, winograd_shape,
                                                     winograd_tile, winograd_transforms, winograd_weights)
from inception_engine.backends.cuda.workspace import workspace_elems, workspace_layout
from inception_engine.backends.numpy_primitives import conv2d_bias_relu, winograd_matrices
from inception_engine.plan import ALIGN, ConvOp, View, build_plan

from helpers.emulator import run_emulated as run_backend_emulated
from helpers.mma_harness import GXX, aligned_empty, compile_emu_lib, emu_wrapper_source, rel_l2, rng_for

WINO_TOL = 1e-5
NET_TOL = 1e-4


# --- CPU: planning ----------------------------------------------------------------------------------------------


def winograd_ops(configs: dict, plan) -> list[ConvOp]:
    return [op for op in plan.conv_ops if configs[op.name].wino]


ELIGIBLE = {(3, 3): 12, (5, 5): 3, (1, 7): 13, (7, 1): 13}  # stride-1 convs of the network per kernel shape


def test_cost_model_choices():
    """What the model picks on an H100 SXM / H200 (132 SMs), counts per kernel shape. 3x3: at batch 1 only the
    three big stem maps (147x147, 71x71); from batch 8 all (the 8x8 ones too, since T is padded to the GEMM tile's
    width and split-K fills the SMs), F(4x4) but on the 8x8 maps at batch 8.
    5x5 (F(2x2)) and 1x7 / 7x1 (F(3)): never at batch 1 (WINO_MIN_BATCH; the model also puts F(3, 7) at 1.3-1.5x
    the direct time there); at batch 8 every 5x5 and all 1x7 / 7x1 but the four 128 -> 128 ones of Mixed_6b
    (0.87 of direct, above WINO_MARGIN); from batch 32 all. Never a strided conv or another kernel shape."""
    expect = {1: {(3, 3): 3}, 8: {(3, 3): 12, (5, 5): 3, (1, 7): 11, (7, 1): 11}, 32: ELIGIBLE, 128: ELIGIBLE}
    for batch, counts in expect.items():
        plan = build_plan(batch)
        configs = choose_configs(plan, 132)
        chosen = winograd_ops(configs, plan)
        assert all(winograd_eligible(op) for op in chosen)
        got = {k: sum(op.kernel == k for op in chosen) for k in WINO_VARIANTS}
        assert got == {k: counts.get(k, 0) for k in WINO_VARIANTS}, (batch, got)
        # F(4x4) for 3x3 but on the 8x8 maps at batch 8 (F(2x2): 16 tiles a map instead of 4, less padding of T)
        assert all(configs[op.name].wino == {(3, 3): 2 if batch == 8 and op.src.h == 8 else 4, (5, 5): 2}.get(
            op.kernel, 3) for op in chosen)
    eligible = [op for op in build_plan(8).conv_ops if winograd_eligible(op)]
    assert {k: sum(op.kernel == k for op in eligible) for k in WINO_VARIANTS} == ELIGIBLE
    assert all(op.stride == 1 for op in eligible)


def test_batch_one_keeps_direct_for_unmeasured_shapes():
    """At batch 1 the model would put F(2x2, 5x5) at 0.63 of the direct time, but WINO_MIN_BATCH keeps it direct
    (unmeasured there); forcing still takes it, and from batch 2 the model does."""
    for batch, want in ((1, False), (2, True)):
        plan = build_plan(batch)
        configs = choose_configs(plan, 132)
        op = next(op for op in plan.conv_ops if op.kernel == (5, 5))
        cfg = winograd_config(op, 2, 132)
        assert cfg.est_us < WINO_MARGIN * conv_config(op.dst.channels, op.dst.n * op.dst.h * op.dst.w,
                                                            op.src.channels * 25, 132).est_us
        assert bool(configs[op.name].wino) == want
    assert choose_configs(build_plan(1), 132, winograd=True)[op.name].wino == 2


TILE_PREFIX = {"tf32": "conv_tf32", "fp16": "conv_f16"}


def test_forcing_and_tensor_core_precisions():
    plan = build_plan(1)
    forced = choose_configs(plan, 132, winograd=True)
    assert {op.name for op in winograd_ops(forced, plan)} == {op.name for op in plan.conv_ops
                                                              if winograd_eligible(op)}
    assert not any(c.wino for c in choose_configs(build_plan(128), 132, winograd=False).values() if c is not None)
    for precision in ("tf32", "fp16"):  # the same Winograd convs as fp32 (FFMA GEMMs), tensor cores for the rest
        fp32 = choose_configs(build_plan(128), 132)
        mixed = choose_configs(build_plan(128), 132, precision=precision)
        assert {k for k, c in mixed.items() if c and c.wino} == {k for k, c in fp32.items() if c and c.wino} != set()
        assert {c.tile.prefix for c in mixed.values() if c and not c.wino} == {TILE_PREFIX[precision]}
        assert choose_configs(plan, 132, precision=precision, winograd=True).keys() == forced.keys()


def test_u_and_transforms_are_packed_from_the_exact_matrices():
    weights = he_weights(0)
    plan = build_plan(8)
    configs = choose_configs(plan, 132, winograd=True)
    flat, offsets = pack_params(weights, plan, configs)
    assert all(off % ALIGN == 0 for off in offsets.values())
    variants = {(configs[op.name].wino, max(op.kernel)) for op in winograd_ops(configs, plan)}
    assert variants == {(2, 3), (4, 3), (2, 5), (3, 7)} or variants == {(4, 3), (2, 5), (3, 7)}, variants
    for m, k in variants:
        at, _, bt = winograd_matrices(m, k)
        n = m + k - 1
        key = f"winograd_F{m}_{k}"
        np.testing.assert_array_equal(flat[offsets[f"{key}.bt"]:][:n * n], bt.astype(np.float32).ravel())
        np.testing.assert_array_equal(flat[offsets[f"{key}.at"]:][:m * n], at.astype(np.float32).ravel())
    for op in winograd_ops(configs, plan):
        cfg = configs[op.name]
        w = weights.arrays[op.name + ".weight"].astype(np.float64)
        (kh, kw), m = op.kernel, cfg.wino
        gh = winograd_matrices(m, kh)[1] if kh > 1 else np.ones((1, 1))  # an axis with one tap: identity
        gw = winograd_matrices(m, kw)[1] if kw > 1 else np.ones((1, 1))
        opad = o_pad(op.dst.channels, cfg.tile)
        nn, cin, cout = len(gh) * len(gw), op.src.channels, op.dst.channels
        assert nn == winograd_shape(op, m).nn == {(3, 3): (m + 2) ** 2, (5, 5): 36}.get(op.kernel, m + 6)
        u = flat[offsets[op.name + ".weight"]:][:nn * cin * opad].reshape(nn, cin, opad)
        ref = np.einsum("ik,ockl,jl->ijco", gh, w, gw).reshape(nn, cin, cout)
        assert rel_l2(u[:, :, :cout], ref) < 1e-7
        assert not u[:, :, cout:].any()


@pytest.mark.parametrize("batch", [1, 8, 128])
def test_workspace_and_launch_args(batch):
    """Every Winograd conv's V and M slice lies inside the workspace and no other op of its stage overlaps it; the
    launches are the three kernels with int32 arguments within the launch limits."""
    plan = build_plan(batch, concurrent=True)
    configs = choose_configs(plan, 132, winograd=True)
    need, offsets = workspace_layout(plan, configs)
    ops = {op.name: (i, op) for i, op in enumerate(plan.ops)}
    spans = {name: (offsets[name], offsets[name] + workspace_elems(op, configs[name])) for name, (_, op)
             in ops.items() if name in offsets}
    for name, (lo, hi) in spans.items():
        assert hi <= need
        for other, (lo2, hi2) in spans.items():
            if other != name and plan.stages[ops[name][0]] == plan.stages[ops[other][0]]:
                assert hi <= lo2 or hi2 <= lo, (name, other)
    _, poffsets = pack_params(he_weights(0), plan, configs)
    specs = launch_specs(plan, configs, 1 << 40, 1 << 41, poffsets, 1 << 42)
    for op in winograd_ops(configs, plan):
        mine = [s for s in specs if s.op == op.name]
        cfg = configs[op.name]
        assert [s.kernel for s in mine] == list(wino_kernel_names(op.kernel, cfg.wino, cfg.tile, cfg.splits))
        assert mine[0].kernel == f"wino_input_{op.kernel[0]}x{op.kernel[1]}_F{cfg.wino}"
        assert mine[1].grid[2] == winograd_shape(op, cfg.wino).nn * cfg.splits
        for s in mine:
            fmt = arg_format(s.kernel)
            assert len(s.args) == len(fmt) and all(c != "i" or -2**31 <= a < 2**31 for c, a in zip(fmt, s.args))
            assert s.grid[0] < 2**31 and s.grid[1] < 2**16 and s.grid[2] < 2**16
        assert mine[0].args[2] == (1 << 42) + 4 * offsets[op.name]  # V at the op's slice


# --- CPU, g++: the kernels in the fiber emulator ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    n: int
    cin: int
    cout: int
    h: int
    w: int
    pad: tuple[int, int]
    m: int  # output tile m (winograd_tile: m x m, or 1 x m / m x 1 for 1x7 / 7x1)
    tile: str  # GEMM tile, WINO_TILES by name
    src_extra: tuple[int, int] = (0, 0)  # channels before and after the source view in its buffer
    dst_extra: tuple[int, int] = (0, 0)
    relu: bool = True
    kernel: tuple[int, int] = (3, 3)
    splits: int = 1  # split-K of the GEMM over Cin (the output transform sums the slices)

    @property
    def out_hw(self) -> tuple[int, int]:
        return tuple(s + 2 * p - k + 1 for s, p, k in zip((self.h, self.w), self.pad, self.kernel))

    def op(self, src: View, dst: View) -> ConvOp:
        return ConvOp("conv", src, dst, self.kernel, 1, self.pad)

    def config(self) -> ConvConfig:
        tile = next(t for t in WINO_TILES if t.name == self.tile)
        k_split = -(-self.cin // self.splits)
        k_split = -(-k_split // tile.bk) * tile.bk
        assert -(-self.cin // k_split) == self.splits, "choose cin so that every slice has channels"
        return ConvConfig(tile, self.splits, k_split, 0.0, self.m)

    def data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = rng_for(self)
        x = rng.standard_normal((self.n, self.cin, self.h, self.w)).astype(np.float32)
        taps = self.kernel[0] * self.kernel[1]
        wt = (rng.standard_normal((self.cout, self.cin, *self.kernel)) / np.sqrt(taps * self.cin)).astype(np.float32)
        return x, wt, (0.1 * rng.standard_normal(self.cout)).astype(np.float32)


EMU_CASES = [
    Case(2, 5, 7, 9, 11, (1, 1), 4, "32x128", (3, 2), (4, 1)),  # odd sizes, 3x3 tiles with ragged edges
    Case(3, 19, 70, 7, 10, (0, 0), 2, "64x64", (0, 4), (9, 0)),  # padding 0, Cin % BK != 0, Cout over two tiles
    Case(1, 33, 130, 13, 6, (1, 1), 4, "128x128", (1, 0), (0, 2), relu=False),  # Cout over two 128-row tiles
    Case(2, 8, 16, 17, 17, (1, 1), 2, "32x128", (0, 0), (5, 5)),  # T = 162: two GEMM tiles along T
    # 1x7 / 7x1 by F(3, 7): odd sizes with ragged edge tiles along the long axis, padding 3 (and 0 across it)
    Case(2, 9, 11, 7, 13, (0, 3), 3, "64x64", (2, 3), (1, 4), kernel=(1, 7)),
    Case(3, 17, 70, 11, 5, (3, 0), 3, "32x128", (0, 2), (3, 0), relu=False, kernel=(7, 1)),  # Cout over 3 tiles
    Case(2, 8, 16, 17, 17, (0, 3), 3, "32x128", (1, 1), (2, 2), kernel=(1, 7)),  # T = 204: two GEMM tiles
    Case(1, 6, 9, 10, 4, (1, 2), 3, "128x128", (0, 0), (0, 3), kernel=(7, 1)),  # padding below the kernel's 3
    # 5x5 by F(2x2, 5x5): odd sizes, padding 2 and 0
    Case(2, 6, 9, 9, 11, (2, 2), 2, "64x64", (1, 2), (3, 1), kernel=(5, 5)),
    Case(1, 19, 40, 8, 7, (0, 0), 2, "32x128", (0, 1), (2, 0), relu=False, kernel=(5, 5)),
    # split-K over Cin: 3 slices of 16 (the last 8 channels), 2 slices of 16 with a ragged 5x5 edge, 4 slices of 8
    Case(1, 40, 70, 8, 8, (1, 1), 2, "64x64", (2, 0), (0, 3), splits=3),
    Case(2, 21, 9, 7, 9, (2, 2), 2, "64x64", (0, 0), (1, 1), kernel=(5, 5), splits=2),
    Case(1, 29, 11, 9, 17, (0, 3), 3, "32x128", (1, 0), (0, 2), relu=False, kernel=(1, 7), splits=4),
]


@pytest.fixture(scope="module")
def wino_lib(build_cache_dir) -> ctypes.CDLL:
    names = [k for k in all_kernel_names() if source_of(k) == "winograd.cu"]
    wrapper = emu_wrapper_source("winograd.cu", [(n, arg_format(n)) for n in names])
    return compile_emu_lib(build_cache_dir, "emu_wino", wrapper, "-O2", mma=False)


def aligned_nan(elems: int) -> np.ndarray:
    """NaN float32 array starting on a 256-byte boundary, as device allocations are."""
    out = aligned_empty(elems)
    out[:] = np.nan
    return out


def put(a: np.ndarray) -> np.ndarray:
    out = aligned_nan(a.size)
    out[:] = a.ravel()
    return out


def launch(lib: ctypes.CDLL, spec: LaunchSpec) -> None:
    fn = getattr(lib, f"emu_{spec.kernel}")
    fn.argtypes = [ctypes.c_uint] * 4 + [ctypes.c_void_p if c == "P" else ctypes.c_int
                                         for c in arg_format(spec.kernel)]
    fn(*spec.grid, spec.block[0], *spec.args)


def run_case(lib: ctypes.CDLL, case: Case) -> dict[str, float]:
    """Runs the three launches one by one, checking V, M and y in turn; returns the rel L2 of each."""
    cfg = case.config()
    src_shape = (case.n, sum(case.src_extra) + case.cin, case.h, case.w)
    dst_shape = (case.n, sum(case.dst_extra) + case.cout, *case.out_hw)
    src_elems = -(-math.prod(src_shape) // ALIGN) * ALIGN
    arena = aligned_nan(src_elems + math.prod(dst_shape))
    src = View("b0", 0, src_shape, case.src_extra[0], case.cin)
    dst = View("b1", src_elems, dst_shape, case.dst_extra[0], case.cout)
    op = case.op(src, dst)
    x, wt, b = case.data()
    src_buf = arena[:math.prod(src_shape)].reshape(src_shape)
    dst_buf = arena[src_elems:].reshape(dst_shape)
    src_buf[:, case.src_extra[0]:case.src_extra[0] + case.cin] = x
    before = src_buf.copy()
    u = put(winograd_weights(wt, case.m, o_pad(case.cout, cfg.tile)))
    bt32, at32 = winograd_transforms(case.m, max(case.kernel))
    bt, at, bias = put(bt32), put(at32), put(b)
    shape = config_shape(op, cfg)
    ws = aligned_nan(workspace_elems(op, cfg))
    specs = winograd_specs(op, case.relu, cfg, arena.ctypes.data, u.ctypes.data, bias.ctypes.data,
                              bt.ctypes.data, at.ctypes.data, ws.ctypes.data)
    nn = shape.nn
    v_elems = nn * case.cin * shape.t_pad
    v = ws[:v_elems].reshape(nn, case.cin, shape.t_pad)
    mo = ws[v_elems:].reshape(cfg.splits, nn, case.cout, shape.t_pad)
    errors = {}

    # V: the nh x nw patches of every tile (zero-padded input), transformed in float64 along each axis (the 1 x 1
    # identity along an axis of one tap)
    (mh, mw), (kh, kw), (ph, pw) = winograd_tile(case.kernel, case.m), case.kernel, case.pad
    nh, nw = mh + kh - 1, mw + kw - 1
    bth = winograd_matrices(mh, kh)[2] if kh > 1 else np.ones((1, 1))
    btw = winograd_matrices(mw, kw)[2] if kw > 1 else np.ones((1, 1))
    th, tw = shape.tiles_h, shape.tiles_w
    assert nn == nh * nw and th * mh >= case.out_hw[0] > (th - 1) * mh and tw * mw >= case.out_hw[1] > (tw - 1) * mw
    xp = np.zeros((case.n, case.cin, (th - 1) * mh + nh, (tw - 1) * mw + nw))
    xp[:, :, ph:ph + case.h, pw:pw + case.w] = x
    patches = np.stack([np.stack([xp[:, :, i * mh:i * mh + nh, j * mw:j * mw + nw]
                                  for j in range(tw)], 2) for i in range(th)], 2)  # (N, C, th, tw, nh, nw)
    v_ref = np.einsum("ik,bcyxkl,jl->ijcbyx", bth, patches, btw).reshape(nn, case.cin, shape.t_total)
    launch(lib, specs[0])
    assert np.isfinite(v[:, :, :shape.t_total]).all(), "V not written everywhere"
    assert np.isnan(v[:, :, shape.t_total:]).all(), "V written beyond T"
    errors["V"] = rel_l2(v[:, :, :shape.t_total], v_ref)

    # M = U^T V per position, on the emulated V; with split-K, slice s holds the sum over its channels only
    launch(lib, specs[1])
    u3 = u.reshape(nn, case.cin, -1)[:, :, :case.cout].astype(np.float64)
    v3 = v[:, :, :shape.t_total].astype(np.float64)
    m_ref = np.stack([np.einsum("pco,pct->pot", u3[:, c0:c0 + cfg.k_split], v3[:, c0:c0 + cfg.k_split])
                      for c0 in range(0, case.cin, cfg.k_split)])
    assert len(m_ref) == cfg.splits
    assert np.isfinite(mo[:, :, :, :shape.t_total]).all(), "M not written everywhere"
    errors["M"] = rel_l2(mo[:, :, :, :shape.t_total], m_ref)

    launch(lib, specs[2])
    view = dst_buf[:, case.dst_extra[0]:case.dst_extra[0] + case.cout]
    assert np.isfinite(view).all(), f"{np.isnan(view).sum()} output elements not written"
    ref = conv2d_bias_relu(x.astype(np.float64), wt.astype(np.float64), b.astype(np.float64), 1, case.pad,
                           case.relu)
    errors["y"] = rel_l2(view, ref)
    outside = np.concatenate([dst_buf[:, :case.dst_extra[0]].ravel(),
                              dst_buf[:, case.dst_extra[0] + case.cout:].ravel()])
    assert np.isnan(outside).all(), f"{(~np.isnan(outside)).sum()} elements written outside the destination view"
    np.testing.assert_array_equal(src_buf, before)
    if not case.relu:
        assert (view < 0).any()
    return errors


@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: f"{c.kernel[0]}x{c.kernel[1]}-F{c.m}-{c.tile}-n{c.n}"
                                                          f"-{c.cin}to{c.cout}-{c.h}x{c.w}-p{c.pad[0]}{c.pad[1]}")
def test_emulated_kernels(wino_lib, case):
    errors = run_case(wino_lib, case)
    assert errors["V"] <= 1e-6 and errors["M"] <= 1e-6, errors  # one transform / one dot product in fp32
    assert errors["y"] <= WINO_TOL, errors


@pytest.mark.parametrize("case,bound", [
    (Case(1, 96, 8, 35, 35, (1, 1), 2, "32x128"), 3e-6),  # Mixed_5b.branch3x3dbl_3: measured 3.1e-7
    (Case(1, 96, 8, 35, 35, (1, 1), 4, "32x128"), 3e-6),  # 1.3e-6
    (Case(1, 48, 8, 35, 35, (2, 2), 2, "32x128", kernel=(5, 5)), 3e-6),  # Mixed_5b.branch5x5_2: 1.1e-6
    (Case(1, 192, 8, 17, 17, (0, 3), 3, "32x128", kernel=(1, 7)), 5e-6),  # Mixed_6e.branch7x7_2: 3.7e-6
    (Case(1, 192, 8, 17, 17, (3, 0), 3, "32x128", kernel=(7, 1)), 5e-6),  # Mixed_6e.branch7x7_3: 3.9e-6
], ids=lambda v: f"{v.kernel[0]}x{v.kernel[1]}-F{v.m}" if isinstance(v, Case) else None)
def test_emulated_error_level(wino_lib, case, bound):
    """The error levels WINO_TOL is set against, on layers of the network's shapes with the most input channels
    per kernel shape (8 output channels instead of all, for time: the error per output does not depend on their
    number). The bounds guard the measured levels (in the comments) against a change that loses accuracy."""
    err = run_case(wino_lib, case)["y"]
    print(f"{case.kernel[0]}x{case.kernel[1]} F{case.m}, Cin {case.cin}: rel L2 vs float64 {err:.1e}")
    assert err <= bound


@pytest.mark.skipif(GXX is None or cuda_build.find_nvcc() is None,
                    reason="needs g++ and nvcc (as test_cuda_emulated.py)")
@pytest.mark.slow
def test_backend_forward_with_winograd_on_the_emulator(backend_emu_lib):
    """The backend's self-test with every eligible conv (stride-1 3x3, 5x5, 1x7, 7x1) forced to Winograd (75x75
    images, batch 2, branches on several streams, so Winograd work buffers of one stage must not overlap) against
    float64: rel L2 <= 1e-4 and the same top 5."""
    r = run_backend_emulated(backend_emu_lib, "-m", "inception_engine.backends.cuda", "--selftest",
                             "--batch", "2", "--graph", "off", "--concurrent", "on", "--input-size", "75",
                             "--winograd", "on", "--layout", "nchw")
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    assert f", {sum(ELIGIBLE.values())} Winograd convs," in r.stdout, r.stdout[-2000:]
    print(r.stdout.strip().splitlines()[-1])


# --- GPU ----------------------------------------------------------------------------------------------------------


def network_shapes() -> list[ConvOp]:
    """One op per distinct Winograd-eligible conv shape of the network (kernel, Cin, Cout, H, W, padding): six
    3x3, one 5x5, five 1x7 and five 7x1."""
    seen: dict[tuple, ConvOp] = {}
    for op in build_plan(1).conv_ops:
        if winograd_eligible(op):
            seen.setdefault((op.kernel, op.src.channels, op.dst.channels, op.src.h, op.src.w, op.pad), op)
    return list(seen.values())


def shape_variants() -> list[tuple[ConvOp, int]]:
    """(network shape, output tile m) for every Winograd variant winograd.cu has for that shape's kernel."""
    return [(op, m) for op in network_shapes() for m in WINO_VARIANTS[op.kernel]]


def gpu_case(kernels, n: int, like: ConvOp, m: int, tile: Tile | None = None, extra: int = 0) -> float:
    """``like``'s shape at batch n through the three kernels on the GPU (source and destination views with
    ``extra`` channels around them; the GEMM tile the model picks unless given). Returns the rel L2 vs float64."""
    from helpers.gpu_buffers import Arena, Params, check_view, run

    cin, cout, h, w, pad = like.src.channels, like.dst.channels, like.src.h, like.src.w, like.pad
    ho, wo = like.dst.h, like.dst.w
    arena = Arena((n, cin + 2 * extra, h, w), (n, cout + 2 * extra, ho, wo))
    src, dst = arena.view(0, extra, cin), arena.view(1, extra, cout)
    op = ConvOp(like.name, src, dst, like.kernel, 1, pad)
    cfg = winograd_config(op, m, 132)
    if tile is not None:
        cfg = dataclasses.replace(cfg, tile=tile)
    rng = rng_for("gpu", like.name, n, m, cfg.tile.name, extra)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    taps = like.kernel[0] * like.kernel[1]
    wt = (rng.standard_normal((cout, cin, *like.kernel)) / np.sqrt(taps * cin)).astype(np.float32)
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    params = Params(winograd_weights(wt, m, o_pad(cout, cfg.tile)), b,
                    *winograd_transforms(m, max(like.kernel)))
    elems = workspace_elems(op, cfg)
    ws = driver().mem_alloc(4 * elems)
    driver().memset_d32(int(ws), NAN_BITS, elems)
    try:
        arena.put(src, x)
        before = arena.buffer(0)
        run(kernels, winograd_specs(op, True, cfg, arena.ptr, *params.ptrs, int(ws)))
        ref = conv2d_bias_relu(x.astype(np.float64), wt.astype(np.float64), b.astype(np.float64), 1, pad, True)
        check_view(arena, dst, ref, tol=WINO_TOL)  # NaN-free, within WINO_TOL, nothing written outside the view
        np.testing.assert_array_equal(arena.buffer(0), before)
        got = arena.buffer(1)[:, extra:extra + cout]
        return rel_l2(got, ref)
    finally:
        arena.free()
        params.free()
        ws.free()


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("like,m", shape_variants(), ids=lambda v: v.name if isinstance(v, ConvOp) else f"F{v}")
def test_gpu_every_network_shape(gpu, like, m, batch):
    err = gpu_case(gpu[1], batch, like, m, extra=3 if batch == 8 else 0)
    print(f"{like.name} {like.kernel[0]}x{like.kernel[1]} batch {batch} F{m}: rel L2 {err:.1e}")


@pytest.mark.gpu
@pytest.mark.parametrize("tile", WINO_TILES, ids=lambda t: t.name)
def test_gpu_every_gemm_tile(gpu, tile):
    for like, m in shape_variants():
        if like.src.h == 35 or like.kernel == (1, 7):  # 35x35 and 17x17: ragged T tiles; Cout 96, 64: ragged Cout
            gpu_case(gpu[1], 3, like, m, tile, extra=5)


@functools.cache
def network_reference(batch: int):
    """(weights, plan, input, float64 logits) of He-initialised weights at this batch size, computed once."""
    from inception_engine.backends.numpy_backend import NumpyBackend

    weights = he_weights(0)
    plan = build_plan(batch, weights.layers())
    x = np.random.default_rng(batch).standard_normal(plan.input.dims).astype(np.float32)
    return weights, plan, x, NumpyBackend(weights, plan, dtype=np.float64).forward(x.astype(np.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("batch,winograd", [(1, True), (8, True), (8, None)])
def test_gpu_network_with_winograd(batch, winograd):
    """The whole forward with Winograd (forced on every eligible conv, or the cost model's choice) against
    float64: rel L2 <= 1e-4 and the same top 5; the CUDA graph (concurrent streams) and eager serial launches give
    the same bits."""
    weights, plan, x, ref = network_reference(batch)
    with CudaBackend(weights, plan, graph=True, winograd=winograd, nhwc=False) as backend:
        assert backend._graph is not None
        wino = [name for name, c in backend.configs.items() if c is not None and c.wino]
        graph_out = backend.forward(x)
    with CudaBackend(weights, plan, graph=False, concurrent=False, winograd=winograd, nhwc=False) as backend:
        eager_out = backend.forward(x)
    assert len(wino) == sum(ELIGIBLE.values()) if winograd else wino  # forced: all eligible; the model: some
    err = selftest.rel_l2(graph_out, ref)
    print(f"batch {batch}, {len(wino)} Winograd convs: rel L2 {err:.1e}")
    assert np.isfinite(graph_out).all() and err <= NET_TOL, err
    assert all(top5_agree(g, r) for g, r in zip(graph_out, ref))
    np.testing.assert_array_equal(eager_out, graph_out)

