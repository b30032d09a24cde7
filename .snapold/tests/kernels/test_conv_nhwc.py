"""The NHWC path (CudaBackend(nhwc=True)), fp16, tf32 and fp32 (3xFP16, wgmma tiles only): cuda_src/conv_nhwc_*.cu,
conv_input_nhwc.cu and pool_nhwc.cu against float64 NumPy, every kernel test once per element type.

- CPU, NumPy: the shared-tile swizzle (a piece per row and stage, every ldmatrix phase and every cp.async phase on 8
  distinct 16-byte bank groups), the weight layouts (direct_weights for conv_nhwc and conv_nhwc_tf32), the TF32
  rounding (round_tf32), the plan checks.
- CPU, g++ fiber emulator (tests/cuda_emu, whose ldmatrix and mma follow the PTX ISA independently of the kernel),
  and the same tests on the GPU (marked gpu): every tile on convs of every kernel shape, stride 2, padding, K tails
  shorter than a stage, Cout tails, channel-slice views of wider NHWC buffers, no ReLU, split-K with its reduction;
  the first conv from the float32 NCHW input (conv_input_nhwc.cu: window positions in the padding, a Cout tail past
  one block's 32 channels, a view of a wider buffer); the pools and the global average pool. Every buffer starts as
  NaN (fp16 and fp32 NaN alike: all bytes 0xFF), including the source buffer's channels outside the view, so an
  unwritten output, a write outside the destination view or a read outside the source view fails. Conv outputs are
  compared with the ideal conv of the element type (operands rounded to fp16 or TF32, sums in float64, output
  rounded alike): rel L2 <= 1e-3, and for fp32 (float32 operands) <= 1e-5, which one fp16 product instead of three
  would miss by 30x, also on operands far below and above 1 (fp32's low halves, scaled to stay normal fp16). tf32
  outputs must be TF32 values exactly (the next conv's mma takes them as they are, unrounded).
- The whole network on the emulator (75x75 images) and on the GPU (299x299, the issue's 256-input top-1 criterion).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from inception_engine import cuda_build
from inception_engine.backends.cuda.backend import CudaBackend
from inception_engine.backends.cuda.cost_model import ConvConfig, choose_configs
from inception_engine.backends.cuda.families.conv_nhwc import SPLIT_WEIGHTS, weight_setup_specs
from inception_engine.backends.cuda.kernels import NHWC_CONV_FORMAT, arg_format, source_of
from inception_engine.backends.cuda.launch import LaunchSpec
from inception_engine.backends.cuda.launch_nhwc import check_nhwc, nhwc_conv_specs, nhwc_pool_spec, nhwc_ptr
from inception_engine.backends.cuda.params import direct_weights, op_params, round_tf32
from inception_engine.backends.cuda.tensor_maps import MAP_BYTES
from inception_engine.backends.cuda.tiles import (HALO_THREADS, INPUT_MMA_PRECISIONS, INPUT_MMA_TILE, INPUT_TILE,
                                                  MAX_SHARED_BYTES, NHWC_ELEMS, TILES_OF, WGMMA_LO_TILES, Tile, blocks,
                                                  check_nhwc_precision, halo_smem_bytes, input_tile, is_halo,
                                                  is_pingpong, is_tma, is_ws, nhwc_cin, tile_fits, wgmma_ring_bytes,
                                                  wgmma_stages, ws_row, ws_stages, ws_tile, ws_tma_tile)
from inception_engine.backends.cuda.tuning import tuning_candidates
from inception_engine.backends.numpy_primitives import conv2d_bias_relu, pool2d
from inception_engine.errors import EngineError
from inception_engine.plan import ConvOp, FusedConvOp, PoolOp, View, build_plan
from inception_engine.weights import Weights

from helpers.emulator import run_emulated as run_backend_emulated
from helpers.gpu_memory import Emulated
from helpers.mma_harness import NVCC, Case, compile_emu_lib, emu_wrapper_source, rel_l2, rng_for
from helpers.network import assert_top1_agrees_on_256_inputs

# rel L2 against the ideal conv: fp32 sums and one more rounding of the output (~3e-4); fp32's 3xFP16 products are
# ~2^-24 off each, tf32's single ones ~2^-11 (~3e-4 over a conv)
TOL = {"fp16": 1e-3, "tf32": 1e-3, "fp32": 1e-5}
NET_TOL = {"fp16": 1e-2, "tf32": 3e-3, "fp32": 1e-4}  # the bounds
ROW_BYTES = 64  # a shared row: 32 k of fp16, 16 of tf32
PRECISIONS = tuple(p for p in NHWC_ELEMS if p != "int8")  # int8's exact integer semantics: test_conv_nhwc_i8.py
KERNELS = [f"{t.prefix}_{t.name}" for p in PRECISIONS for t in NHWC_ELEMS[p].tiles(wgmma=True)] + [
    name + NHWC_ELEMS[p].suffix for p in PRECISIONS
    for name in ("pool2d_nhwc", "global_avg_pool_nhwc", "conv_input_nhwc")] + [
    f"conv_nhwc{NHWC_ELEMS[p].suffix}_splitk_reduce" for p in PRECISIONS] + [
    f"conv_input_mma_nhwc{NHWC_ELEMS[p].suffix}" for p in INPUT_MMA_PRECISIONS] + [
    f"{t.prefix}_maxpool3_{t.name}" for p in PRECISIONS for t in NHWC_ELEMS[p].mma_tiles] + [SPLIT_WEIGHTS]
DTYPE = {"fp16": np.float16, "tf32": np.float32, "fp32": np.float32}


def as_elem(a: np.ndarray, precision: str) -> np.ndarray:
    """a rounded to the precision's element type, as that type (tf32: float32 holding TF32 values)."""
    if precision == "fp16":
        return a.astype(np.float16)
    return round_tf32(a.astype(np.float32)) if precision == "tf32" else a.astype(np.float32)


# --- CPU, NumPy ----------------------------------------------------------------------------------------------------


def swizzled_byte(row: np.ndarray, piece: np.ndarray) -> np.ndarray:
    """conv_nhwc.cuh's swizzled(): where piece `piece` of shared row `row` starts, in bytes from the tile's start."""
    return row * ROW_BYTES + ((piece ^ (row >> 1 & 3)) * 16)


def test_swizzle_is_a_permutation_of_each_rows_pieces():
    rows = np.arange(256)[:, None]
    got = np.sort(swizzled_byte(rows, np.arange(4)[None, :]), axis=1)
    np.testing.assert_array_equal(got, rows * ROW_BYTES + np.arange(4)[None, :] * 16)


def test_ldmatrix_and_cp_async_phases_are_bank_conflict_free():
    """An ldmatrix phase reads 8 rows r0..r0+7 (r0 a multiple of 8) at one logical piece; a cp.async phase of 8
    threads writes pieces 0-3 of rows 2q, 2q+1 (thread t: row t / 4, piece t % 4). Each must touch 8 distinct
    16-byte bank groups of the 128-byte bank window."""
    for r0 in range(0, 128, 8):
        for piece in range(4):
            groups = swizzled_byte(np.arange(r0, r0 + 8), np.full(8, piece)) // 16 % 8
            assert len(set(groups.tolist())) == 8, (r0, piece, groups)
    for first in range(0, 256, 8):
        t = np.arange(first, first + 8)
        groups = swizzled_byte(t // 4, t % 4) // 16 % 8
        assert len(set(groups.tolist())) == 8, (first, groups)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_nhwc_weights_are_rows_in_rsc_order_padded_to_eight_channels(precision):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 3, 3, 2)).astype(np.float32)
    for tile in NHWC_ELEMS[precision].tiles(wgmma=True):
        got = direct_weights(w, tile).view(DTYPE[precision]).reshape(5, 3, 2, 8)
        np.testing.assert_array_equal(got[..., :3], as_elem(w.transpose(0, 2, 3, 1), precision))
        assert not got[..., 3:].any()


def test_round_tf32_is_cvt_rna():
    """10 mantissa bits kept, to nearest, ties away from zero, in either sign; infinities and NaN unchanged."""
    one = np.float32(1.0)
    ulp = 2.0 ** -10  # of TF32 at 1
    x = np.array([1 + ulp / 2, 1 + ulp / 2 - 2.0 ** -23, 1 + 1.5 * ulp, -(1 + ulp / 2), 3e-39, np.inf, -np.inf],
                 np.float32)
    want = np.array([1 + ulp, one, 1 + 2 * ulp, -(1 + ulp), 3e-39, np.inf, -np.inf], np.float32)
    got = round_tf32(x)
    np.testing.assert_array_equal(got[:4], want[:4])
    assert got[4] != 0 and (got[4:5].view(np.uint32) & 0x1FFF == 0).all() and abs(got[4] - x[4]) <= 2.0 ** -136
    np.testing.assert_array_equal(got[5:], want[5:])
    assert np.isnan(round_tf32(np.array([np.nan], np.float32))).all()
    r = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    rel = np.abs(round_tf32(r).astype(np.float64) - r) / np.abs(r)
    assert rel.max() <= 2.0 ** -11 and (round_tf32(r).view(np.uint32) & 0x1FFF == 0).all()


@pytest.mark.parametrize("wgmma", [False, True])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_configs_put_every_conv_on_nhwc_tiles_and_tuning_times_each_tile(precision, wgmma):
    if not NHWC_ELEMS[precision].tiles(wgmma):
        with pytest.raises(EngineError, match="fp32 on the NHWC layout runs on Hopper's wgmma tiles only"):
            check_nhwc_precision(precision, wgmma)
        return
    plan = build_plan(8, concurrent=True)
    configs = choose_configs(plan, 132, False, precision, False, nhwc=True, wgmma=wgmma)
    first = plan.conv_ops[0]
    first_tile = INPUT_MMA_TILE if precision in ("fp16", "tf32") else INPUT_TILE  # fp32: FMA, its accuracy
    assert first.src.buffer == plan.input.buffer and configs[first.name] == ConvConfig(
        first_tile, 1, 27, configs[first.name].est_us)
    rest, tiles = plan.conv_ops[1:], NHWC_ELEMS[precision].tiles(wgmma)
    assert all(configs[op.name].tile in tiles and not configs[op.name].wino for op in rest)
    assert all(configs[op.name].k_split % tiles[0].bk == 0 for op in rest)
    assert configs["fc"] is None or configs["fc"].tile in TILES_OF[precision]
    assert any(configs[op.name].tile in NHWC_ELEMS[precision].wgmma_tiles for op in rest) == wgmma
    # unmeasured, the model puts halo tiles on single-plane inputs only (cost_model.model_takes): the stem's 2a, 2b
    assert {op.name for op in rest if is_halo(configs[op.name].tile.prefix)} == (
        {"Conv2d_2a_3x3", "Conv2d_2b_3x3"} if precision != "fp32" and wgmma else set())
    sets = tuning_candidates(plan, 132, False, precision, True, nhwc=True, wgmma=wgmma)
    # a set per tile: the convs that tile computes on it (a halo tile: stride-1 convs of several taps), the others
    # on tiles that compute them
    on_own_tile = [{s[op.name].tile for op in rest if tile_fits(op, t)} for s, t in zip(sets, tiles)]
    assert on_own_tile == [{t} for t in tiles]
    assert all(tile_fits(op, s[op.name].tile) for s in sets for op in rest)
    halo = [t for t in tiles if is_halo(t.prefix)]
    assert bool(halo) == (precision != "fp32" and wgmma)
    for t in halo:
        fits = {op.name for op in rest if tile_fits(op, t)}
        assert {"Conv2d_2a_3x3", "Conv2d_2b_3x3"} <= fits
        assert all(op.stride == 1 and op.kernel != (1, 1) for op in rest if op.name in fits)
        # Conv2d_4a's 80 channels in three planes: its weights and halos fit fp16's 128-position tiles of 64 channels
        # and fewer, never tf32's (twice the bytes)
        assert ("Conv2d_4a_3x3" in fits) == (precision == "fp16" and (t.bm, t.bn) in ((128, 64), (128, 32),
                                                                                        (256, 32)))
    assert all(s[first.name].tile == first_tile for s in sets)


def test_nhwc_needs_channel_counts_in_pieces_and_fp32_needs_wgmma():
    plan = build_plan(1)
    check_nhwc(plan)
    conv = next(op for op in plan.ops if isinstance(op, ConvOp) and op.src.buffer != plan.input.buffer)
    odd = dataclasses.replace(conv, src=dataclasses.replace(conv.src, channels=conv.src.channels - 4))
    bad = dataclasses.replace(plan, ops=tuple(odd if op is conv else op for op in plan.ops))
    with pytest.raises(EngineError, match=f"{conv.name}: the NHWC path needs channel counts"):
        check_nhwc(bad)
    with pytest.raises(EngineError, match=r"batch 2048 is too large for the NHWC path .* use a batch of at most 1552"):
        check_nhwc(build_plan(2048))
    first = plan.conv_ops[0]
    wide = dataclasses.replace(first, kernel=(11, 11))  # 3 x 11 x 11 = 363 weights per output > INPUT_MAX_K
    with pytest.raises(EngineError, match=f"{first.name}: the NHWC path's first convolution takes at most 256"):
        check_nhwc(dataclasses.replace(plan, ops=tuple(wide if op is first else op for op in plan.ops)))
    with pytest.raises(EngineError, match="fp32 on the NHWC layout runs on Hopper's wgmma tiles only"):
        check_nhwc_precision("fp32", False)
    for precision, wgmma in (("fp16", False), ("tf32", False), ("fp32", True)):
        check_nhwc_precision(precision, wgmma)


# --- kernels on the emulator and on the GPU ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emu(build_cache_dir):
    if NVCC is None:
        pytest.skip("nvcc is not installed (the emulated kernels are checked against the sources nvcc builds)")
    lib = compile_emu_lib(build_cache_dir, "emu_nhwc", emu_wrapper_source(
        "conv_nhwc_mma.cu", [(k, arg_format(k)) for k in KERNELS],
        ('#include "conv_nhwc_wgmma.cu"', '#include "conv_nhwc_ws.cu"', '#include "conv_nhwc_halo.cu"',
         '#include "pool_nhwc.cu"', '#include "conv_input_nhwc.cu"',
         'extern "C" int emu_wgmma_stages(int split, int bm, int bn) { return wgmma_stages(split, bm, bn); }',
         'extern "C" int emu_wgmma_ring_bytes(int split, int bm, int bn) { return wgmma_ring_bytes(split, bm, bn); }',
         'extern "C" int emu_ws_ring_bytes(int bm, int bn, int row) { return ws_ring_bytes(bm, bn, row); }',
         'extern "C" int emu_ws_stages(int bm, int bn, int row) { return ws_stages(bm, bn, row); }',
         'extern "C" int emu_ws_threads() { return WS_THREADS; }',
         'extern "C" int emu_ws_pp_threads() { return WS_PP_THREADS; }',
         'extern "C" int emu_halo_threads() { return HALO_THREADS; }',
         'extern "C" int emu_halo_smem_bytes(int elem, int bm, int bn, int cin, int kh, int kw, int wg) {'
         ' return halo_smem_bytes(elem, bm, bn, cin, kh, kw, wg); }')),
        "-O2", True)
    mem = Emulated(lib)
    yield mem
    mem.close()


def put_nhwc(mem, data: np.ndarray, c_total: int, c_offset: int, precision: str) -> int:
    """A NaN-poisoned NHWC buffer of the precision's elements, c_total channels, with data (N, C, H, W) (rounded to
    the element type) at channel c_offset; its address."""
    n, c, h, w = data.shape
    buf = np.full((n, h, w, c_total), np.nan, DTYPE[precision])
    buf[..., c_offset:c_offset + c] = as_elem(data.transpose(0, 2, 3, 1), precision)
    ptr = mem.alloc(buf.nbytes)
    mem.write(ptr, buf)
    return ptr


def get_nhwc(mem, ptr: int, shape: tuple[int, int, int, int], c_offset: int, channels: int,
             precision: str) -> np.ndarray:
    """The view (N, C, H, W) as float64, after checking every channel outside it is still NaN and, for tf32, that
    every value is a TF32 value (low 13 bits zero)."""
    n, c_total, h, w = shape
    buf = mem.read(ptr, (n, h, w, c_total), DTYPE[precision])
    outside = np.concatenate([buf[..., :c_offset].ravel(), buf[..., c_offset + channels:].ravel()])
    assert np.isnan(outside).all(), f"{(~np.isnan(outside)).sum()} elements written outside the destination view"
    inside = buf[..., c_offset:c_offset + channels]
    assert np.isfinite(inside).all(), f"{np.isnan(inside).sum()} output elements not written"
    if precision == "tf32":
        low = inside.view(np.uint32) & 0x1FFF
        assert not low.any(), f"{np.count_nonzero(low)} outputs are not rounded to TF32"
    return inside.transpose(0, 3, 1, 2).astype(np.float64)


def conv_op(case: Case) -> ConvOp:
    """The case as a conv between channel-slice views (test_cuda_kernels.py's shapes, read as NHWC buffers here)."""
    src_shape, dst_shape = case.shapes()
    return ConvOp("conv", View("x", 0, src_shape, case.src_extra[0], case.cin),
                  View("y", 0, dst_shape, case.dst_extra[0], case.cout), case.kernel, case.stride, case.pad)


CASES = [
    Case(2, 16, 40, 9, 7, (3, 3), 2, (0, 0), (8, 8), (16, 8)),
    Case(1, 24, 72, 7, 9, (5, 5), 1, (2, 2)),
    Case(3, 8, 136, 5, 6, (1, 7), 1, (0, 3), (0, 16), (8, 0)),  # Cout past one 128 tile; K = 56 < two stages
    Case(2, 32, 48, 6, 5, (7, 1), 1, (3, 0), relu=False),
    Case(3, 40, 64, 5, 7, (1, 3), 1, (0, 1), (8, 0)),
    Case(2, 48, 16, 7, 5, (3, 1), 1, (1, 0), (0, 0), (24, 8)),
    Case(3, 8, 32, 17, 15, (3, 3), 2, (0, 0)),  # the first conv's shape: 3 channels padded to 8, K = 72
    Case(2, 8, 24, 9, 9, (1, 1), 1, (0, 0)),  # K = 8: one piece in the whole reduction
    Case(1, 96, 200, 8, 8, (1, 1), 1, (0, 0), (32, 0), (0, 56)),  # 8x8 map: a 64-pixel tail per tile
    # 578 pixels, 200 channels: pixel tiles of 128 and 256, channel tiles of 192, all with tails
    Case(2, 24, 200, 17, 17, (1, 7), 1, (0, 3), (8, 0), (0, 8)),
]


def ideal_conv(case: Case, x: np.ndarray, w: np.ndarray, b: np.ndarray, precision: str) -> np.ndarray:
    """Operands of the element type, float64 sums, bias and ReLU, the output rounded as the kernel stores it."""
    elem = lambda a: as_elem(a, precision).astype(np.float64)  # noqa: E731
    y = conv2d_bias_relu(elem(x), elem(w), b.astype(np.float64), case.stride, case.pad, case.relu)
    return elem(y)


def put_weights(mem, op: ConvOp, tile: Tile, w: np.ndarray) -> int:
    """The conv's weights uploaded as the backend uploads them (params.direct_weights), then what they need once
    there (weight_setup_specs: on fp32 tiles, the split into fp16 halves); their address."""
    rows = direct_weights(w, tile)
    w_ptr = mem.alloc(rows.nbytes)
    mem.write(w_ptr, rows)
    mem.launch(weight_setup_specs(op, tile, w_ptr))
    return w_ptr


def run_conv(mem, case: Case, tile: Tile, splits: int, precision: str, x_scale: float = 1.0,
             w_scale: float = 1.0) -> None:
    rng = rng_for("nhwc", case, tile.name, splits, precision)
    size = NHWC_ELEMS[precision].bytes
    op = conv_op(case)
    x = (x_scale * rng.standard_normal(op.src.dims)).astype(np.float32)
    k_total = case.cin * case.kernel[0] * case.kernel[1]
    w = (w_scale * rng.standard_normal((case.cout, case.cin, *case.kernel)) / np.sqrt(k_total)).astype(np.float32)
    b = (0.1 * x_scale * w_scale * rng.standard_normal(case.cout)).astype(np.float32)
    x_ptr = put_nhwc(mem, x, op.src.c_total, op.src.c_offset, precision)
    before = mem.read(x_ptr, (op.src.n, op.src.h, op.src.w, op.src.c_total), DTYPE[precision])
    y_ptr = mem.alloc(size * math.prod(op.dst.shape))
    w_ptr, b_ptr = put_weights(mem, op, tile, w), mem.alloc(b.nbytes)
    mem.write(b_ptr, b)
    k_split = math.ceil(math.ceil(k_total / splits) / tile.bk) * tile.bk
    cfg = ConvConfig(tile, math.ceil(k_total / k_split), k_split, 0.0)
    ws = mem.alloc(4 * max(1, cfg.splits * case.cout * op.dst.n * op.dst.h * op.dst.w))
    # num_sms 3: a warp-specialized tile's blocks each take several tiles, so its ring wraps from tile to tile
    maps = mem.alloc(2 * MAP_BYTES) if is_tma(tile.prefix) else 0
    specs = nhwc_conv_specs(op, cfg, x_ptr + size * op.src.c_offset, op.src.c_total, case.cin,
                               y_ptr + size * op.dst.c_offset, w_ptr, b_ptr, ws, precision, num_sms=3, maps=maps)
    suffix = NHWC_ELEMS[precision].suffix
    assert [s.kernel for s in specs] == [f"{tile.prefix}_{tile.name}"] + [
        f"conv_nhwc{suffix}_splitk_reduce"] * (cfg.splits > 1)
    if not case.relu:  # the specs always ask for ReLU (every conv of the network has it); this case tests without
        spec = specs[-1]  # relu_end: the parts' last argument (a TMA tile's maps follow)
        at = len(NHWC_CONV_FORMAT) - 1 if is_tma(spec.kernel) else len(spec.args) - 1
        specs[-1] = dataclasses.replace(spec, args=spec.args[:at] + (0,) + spec.args[at + 1:])
    mem.launch(specs)
    got = get_nhwc(mem, y_ptr, op.dst.shape, op.dst.c_offset, case.cout, precision)
    err = rel_l2(got, ideal_conv(case, x, w, b, precision))
    assert err <= TOL[precision], f"rel L2 {err:.2e} against the ideal {precision} conv"
    after = mem.read(x_ptr, before.shape, DTYPE[precision])
    np.testing.assert_array_equal(after.view(f"u{size}"), before.view(f"u{size}"))


def test_ring_bytes_are_the_kernels_stages(emu):
    """The launch's dynamic shared memory (wgmma_ring_bytes, from wgmma_stages) holds the ring the kernel
    indexes (conv_nhwc_wgmma.cu's wgmma_stages(), and for fp32 its WGMMA_LO_TILES low tiles): a smaller launch would let
    the ring run past it, and the emulator's ring is a static array that would not notice."""
    for precision, elem in NHWC_ELEMS.items():
        split = precision == "fp32"
        for t in elem.wgmma_tiles:
            if is_halo(t.prefix):  # the halo tiles: shared memory by the conv's shape, one block an SM
                for kernel, wg, cin in (((3, 3), 149, 32), ((3, 3), 11, 48), ((1, 7), 23, 32), ((5, 5), 40, 80)):
                    got = emu.lib.emu_halo_smem_bytes(elem.bytes, t.bm, t.bn, cin, *kernel, wg)
                    assert halo_smem_bytes(t, kernel, wg, cin) == got
                assert halo_smem_bytes(t, (3, 3), 149, 32) <= MAX_SHARED_BYTES and t.resident == 1
                assert HALO_THREADS == emu.lib.emu_halo_threads()
                continue
            if is_ws(t.prefix):  # the warp-specialized tiles: a ring of ~200 KB and its mbarriers, one block an SM
                row = ws_row(t.prefix)  # bytes of a stage's row
                assert ws_stages(t.bm, t.bn, row) == emu.lib.emu_ws_stages(t.bm, t.bn, row) >= 3, t.name
                ring = wgmma_ring_bytes(f"{t.prefix}_{t.name}")
                assert ring == emu.lib.emu_ws_ring_bytes(t.bm, t.bn, row) <= 227 * 1024 and t.resident == 1
                # the launch's block: producers + consumers
                threads = emu.lib.emu_ws_pp_threads() if is_pingpong(t.prefix) else emu.lib.emu_ws_threads()
                assert t.threads == threads
                continue
            stages = emu.lib.emu_wgmma_stages(split, t.bm, t.bn)
            assert wgmma_stages(t.bm, t.bn, split) == stages, t.name
            ring = wgmma_ring_bytes(f"{t.prefix}_{t.name}")
            assert ring == emu.lib.emu_wgmma_ring_bytes(split, t.bm, t.bn)
            assert ring == (stages + WGMMA_LO_TILES * split) * (t.bm + t.bn) * 64
            assert ring * t.resident <= 227 * 1024  # two blocks an SM (fp32's 128x128: one)


def wgmma_tile(precision: str, name: str) -> Tile:
    return next(t for t in NHWC_ELEMS[precision].wgmma_tiles
                if t.name == name and not is_ws(t.prefix) and not is_halo(t.prefix))


def case_id(c: Case) -> str:
    return f"{c.n}x{c.cin}x{c.h}x{c.w}-{c.kernel[0]}x{c.kernel[1]}s{c.stride}-{c.cout}"


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_conv_every_tile(mem, case, precision):
    for tile in NHWC_ELEMS[precision].tiles(mem.wgmma):
        if tile_fits(conv_op(case), tile):
            run_conv(mem, case, tile, 1, precision)


@pytest.mark.parametrize("x_scale, w_scale", ((2.0 ** -12, 1.0), (1.0, 2.0 ** -10), (256.0, 2.0 ** -8)),
                         ids=("tiny-inputs", "tiny-weights", "large-inputs"))
def test_fp32_halves_keep_float32_accuracy_across_magnitudes(mem, x_scale, w_scale):
    """fp32's operands go to the tensor cores as fp16 high and low halves (conv_mma.cuh's NhwcF32): operands far
    below 1 (whose low halves, unscaled, would be fp16 subnormals of a few bits) and far above it keep float32's
    accuracy."""
    case = Case(1, 96, 200, 8, 8, (1, 1), 1, (0, 0))
    for tile in NHWC_ELEMS["fp32"].tiles(mem.wgmma):
        run_conv(mem, case, tile, 1, "fp32", x_scale, w_scale)


@pytest.mark.parametrize("scale", (1.0, 2.0 ** -10, 300.0))
def test_fp32_weights_split_on_the_gpu_into_the_kernels_halves(mem, scale):
    """conv_nhwc_f32_split_weights (weight_setup_specs, once after the upload): each 16-byte piece of an fp32 tile's
    float32 weight rows becomes, in place, its four fp16 high halves then its four low ones, hi = rn(w) and
    lo = rn((w - hi) 2^11), the split the tiles give their activations (NhwcF32::split), here in NumPy; together
    they hold the weights to 2^-22 of the row's largest (a high half that is an fp16 subnormal leaves the rest to the
    low half). Weights of 2^-10 put high halves among the subnormals; the words after the rows keep their poison."""
    if not NHWC_ELEMS["fp32"].tiles(mem.wgmma):
        pytest.skip("this GPU has no wgmma (sm_90a): no fp32 NHWC tiles")
    rng = np.random.default_rng(3)
    op = ConvOp("conv", View("x", 0, (1, 20, 5, 5), 0, 20), View("y", 0, (1, 7, 5, 5), 0, 7), (3, 1), 1, (1, 0))
    w = (scale * rng.standard_normal((7, 20, 3, 1))).astype(np.float32)
    tile = NHWC_ELEMS["fp32"].tiles(mem.wgmma)[0]
    rows = direct_weights(w, tile)
    assert rows.shape == (7, 3 * nhwc_cin(20)) and rows.dtype == np.float32
    w_ptr = mem.alloc(rows.nbytes + 64)
    mem.write(w_ptr, np.full(rows.size + 16, np.nan, np.float32))
    specs = weight_setup_specs(op, tile, w_ptr)
    assert [s.kernel for s in specs] == [SPLIT_WEIGHTS]
    mem.write(w_ptr, rows)
    mem.launch(specs)
    got = mem.read(w_ptr, (rows.size + 16,), np.float32)
    assert np.isnan(got[rows.size:]).all(), "the split wrote past the weights"
    h = got[:rows.size].view(np.float16).reshape(7, -1, 2, 4)
    hi, lo = h[:, :, 0].reshape(rows.shape), h[:, :, 1].reshape(rows.shape)
    np.testing.assert_array_equal(hi, rows.astype(np.float16))
    np.testing.assert_array_equal(lo, ((rows - hi.astype(np.float32)) * np.float32(2048)).astype(np.float16))
    value = hi.astype(np.float64) + lo.astype(np.float64) / 2048
    assert (np.abs(value - rows) / np.abs(rows).max(axis=1, keepdims=True)).max() <= 2.0 ** -22
    assert all(not weight_setup_specs(op, t, w_ptr) for p in PRECISIONS if p != "fp32"
               for t in NHWC_ELEMS[p].tiles(True))


HALO_CASES = [  # stride 1, several taps, Cin a multiple of 16 (planes of 32 channels: 128 bytes of tf32, 64 of fp16)
    Case(2, 32, 64, 13, 11, (3, 3), 1, (1, 1)),  # Conv2d_2b's shape
    Case(1, 32, 32, 12, 9, (3, 3), 1, (0, 0), (8, 8), (16, 8), relu=False),  # Conv2d_2a's; views of wider buffers
    Case(1, 32, 24, 9, 14, (5, 5), 1, (2, 2), (0, 16)),  # 25 taps of weights: Cout 24 of a wider channel tile
    Case(2, 32, 24, 6, 8, (1, 7), 1, (0, 3), (0, 0), (8, 0)),
    # 3 images of 7 tiles of the 42-wide padded grid: with num_sms 3 each block takes 7 tiles, each consumer warpgroup
    # several, so both buffers' barriers go through several phases
    Case(3, 32, 64, 40, 40, (3, 3), 1, (1, 1)),
    # Conv2d_4a's: 3 planes, the last half; 3 channel tiles
    Case(2, 80, 136, 11, 13, (3, 3), 1, (0, 0), (16, 0), (0, 8)),
    Case(1, 48, 64, 9, 9, (5, 5), 1, (2, 2)),  # the 35x35 modules' 5x5: a full and a half plane
    Case(2, 64, 96, 8, 7, (3, 3), 1, (1, 1), (0, 0), (0, 32)),  # their 3x3s: two full planes
    Case(1, 16, 48, 7, 10, (3, 1), 1, (1, 0)),  # one half plane
]


@pytest.mark.parametrize("precision", ("fp16", "tf32"))
@pytest.mark.parametrize("case", HALO_CASES, ids=case_id)
def test_conv_halo_tiles(mem, case, precision):
    """conv_nhwc_halo.cu's halo tiles (sm_90a) on the convs they take: every kernel shape, padding or none, Cout below
    the tile's, views of wider buffers, tiles that end past an image's grid."""
    tiles = [t for t in NHWC_ELEMS[precision].tiles(mem.wgmma) if is_halo(t.prefix)]
    if not tiles:
        pytest.skip("this GPU has no wgmma (sm_90a): no halo tiles")
    op = conv_op(case)
    # every case fits a tile but, in tf32 (rows twice as wide), Conv2d_4a's and the 5x5's: their weights and halos
    # exceed shared memory
    assert any(tile_fits(op, t) for t in tiles) == (precision == "fp16" or case.cin not in (48, 80))
    for tile in tiles:
        if tile_fits(op, tile):
            run_conv(mem, case, tile, 1, precision)


TMA_CASES = [  # Cin a multiple of a stage's k (64 fp16, 32 tf32): what the TMA tiles take
    # taps along W past both edges; a view at channel 16 of a wider buffer; 128-pixel boxes across rows and images
    Case(3, 64, 192, 9, 9, (1, 7), 1, (0, 3), (16, 0), (0, 8)),
    Case(2, 64, 48, 11, 13, (7, 1), 1, (3, 0), relu=False),  # taps along H
    Case(2, 128, 96, 9, 9, (3, 3), 2, (0, 0)),  # stride 2: the window corners two apart (Mixed_6a's, Mixed_7a's)
    Case(2, 64, 64, 11, 13, (3, 3), 1, (1, 1)),
    Case(1, 128, 200, 8, 8, (1, 1), 1, (0, 0), (32, 0), (0, 56)),  # 8x8 1x1, Cout past a channel tile
]


@pytest.mark.parametrize("precision", ("fp16", "tf32"))
@pytest.mark.parametrize("case", TMA_CASES, ids=case_id)
def test_conv_tma_tiles(mem, case, precision):
    """conv_nhwc_ws.cu's TMA tiles (sm_90a), their ping-pong versions too: the A rows as im2col boxes through a tensor
    map, the weights as tiled boxes, whole and split-K (a slice starts at a tap's channel block), against the ideal
    conv."""
    tiles = [t for t in NHWC_ELEMS[precision].tiles(mem.wgmma) if is_tma(t.prefix)]
    if not tiles:
        pytest.skip("this GPU has no wgmma (sm_90a): no TMA tiles")
    for tile in tiles:
        assert tile_fits(conv_op(case), tile)
        run_conv(mem, case, tile, 1, precision)
        run_conv(mem, case, tile, 2, precision)


@pytest.mark.parametrize("precision", ("fp16", "tf32"))
def test_conv_pingpong_tiles_take_turns(mem, precision):
    """The ping-pong tiles where each consumer warpgroup takes several tiles: 9 pixel tiles on num_sms 3 are 3 a block
    at 128x192 (consumer 1 takes one) and 6 at 128x128 (2 channel tiles: each consumer takes 3), of 9 stages (fp16;
    18 in tf32) that wrap the 5- or 6-stage ring at a different buffer each time. So the turn barriers and both
    consumers' ring positions go through several phases (without the turns, the emulated kernel deadlocks)."""
    tiles = [t for t in NHWC_ELEMS[precision].tiles(mem.wgmma) if is_pingpong(t.prefix)]
    if not tiles:
        pytest.skip("this GPU has no wgmma (sm_90a): no ping-pong tiles")
    for tile in tiles:
        run_conv(mem, Case(6, 64, 136, 12, 16, (3, 3), 1, (1, 1)), tile, 1, precision)


def test_tma_tiles_take_whole_taps_per_stage():
    """A TMA tile takes a conv only where no stage spans two taps: Cin a multiple of its k per stage (128 bytes)."""
    for precision, k in (("fp16", 64), ("tf32", 32)):
        tile = ws_tma_tile(128, 192, precision)
        assert tile.bk == k
        for cin in (k, 2 * k, 6 * k, k + 8, 80):
            op = conv_op(Case(1, cin, 64, 9, 9, (1, 7), 1, (0, 3)))
            assert tile_fits(op, tile) == (cin % k == 0)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", [c for c in CASES if c.cin * c.kernel[0] * c.kernel[1] >= 96], ids=case_id)
def test_conv_split_k(mem, case, precision):
    for tile in split_k_tiles(precision, mem.wgmma):
        run_conv(mem, case, tile, 3, precision)


def split_k_tiles(precision: str, wgmma: bool) -> list[Tile]:
    """One mma.sync tile and, with wgmma, 128x64, 256x32 (two blocks of 64 rows per warpgroup), 128x192
    (m64n192) and the warp-specialized 256x128, or fp32's three."""
    elem = NHWC_ELEMS[precision]
    names = ("128x64", "256x32", "128x192") if precision != "fp32" else ("128x128", "128x64", "128x32")
    ws = [ws_tile(256, 128, precision)] if precision != "fp32" else []
    return list(elem.mma_tiles[1:2]) + ([wgmma_tile(precision, n) for n in names] + ws if wgmma else [])


FUSED_PARTS = [  # (member channels, buffer channels, channel offset, buffer's place in the arena): plan.FusedConvOp
    (24, 64, 16, 1),  # part 0: a slice of a wider (concat) buffer
    (16, 16, 0, 2),  # buffers of their own
    (40, 40, 0, 3),
    (8, 8, 0, 0),  # the pooled member's raw product, below part 0 in the arena: a negative offset
]


def fused_case(precision: str, n: int = 2, cin: int = 72, h: int = 6, w: int = 7):
    """A FusedConvOp of four 1x1 convs in one arena (FUSED_PARTS) reading a slice of a wider buffer; its weights."""
    places, pos = {}, 0
    for i, (_, c_total, _, place) in sorted(enumerate(FUSED_PARTS), key=lambda x: x[1][3]):
        places[i] = pos
        pos += n * h * w * c_total + 8 * (place + 1)  # a gap after each buffer, which must stay NaN
    x_view = View("x", 0, (n, cin + 16, h, w), 8, cin)
    parts = tuple(View(f"part{i}", places[i], (n, c_total, h, w), c_off, ch)
                  for i, (ch, c_total, c_off, _) in enumerate(FUSED_PARTS))
    cout = sum(p[0] for p in FUSED_PARTS)
    op = FusedConvOp("fused", x_view, View("fused", 0, (n, cout, h, w), 0, cout), (1, 1), 1, (0, 0),
                     tuple(f"m{i}" for i in range(len(parts))), parts, 1)
    rng = rng_for("fused", precision)
    arrays = {}
    for i, (ch, *_) in enumerate(FUSED_PARTS):
        arrays[f"m{i}.weight"] = (rng.standard_normal((ch, cin, 1, 1)) / np.sqrt(cin)).astype(np.float32)
        arrays[f"m{i}.bias"] = (0.3 * rng.standard_normal(ch)).astype(np.float32)
    return op, Weights(arrays, {}), pos


@pytest.mark.parametrize("precision", PRECISIONS)
def test_fused_conv_writes_each_part(mem, precision):
    """One GEMM of stacked 1x1 convs whose channel ranges go to four views of one arena (a slice of a wider buffer,
    buffers of their own, one below part 0): each part holds its member's ideal conv (the pooled member's without
    bias and ReLU), and every other element of the arena is still NaN. Every tile, and split-K with its reduction."""
    op, members, arena_elems = fused_case(precision)
    size = NHWC_ELEMS[precision].bytes
    rng = rng_for("fused x", precision)
    x = rng.standard_normal(op.src.dims).astype(np.float32)
    x_ptr = put_nhwc(mem, x, op.src.c_total, op.src.c_offset, precision)
    w, b = op_params(members, op)
    assert not b[-FUSED_PARTS[-1][0]:].any() and b[:-FUSED_PARTS[-1][0]].all()  # the pooled member's bias waits
    b_ptr = mem.alloc(b.nbytes)
    mem.write(b_ptr, b)
    elem = NHWC_ELEMS[precision]
    k_total = op.src.channels
    runs = [(t, 1) for t in elem.tiles(mem.wgmma) if tile_fits(op, t)] + [
        (t, 3) for t in split_k_tiles(precision, mem.wgmma)[:2]]
    for tile, splits in runs:
        w_ptr = put_weights(mem, op, tile, w)
        arena = mem.alloc(size * arena_elems)
        k_split = math.ceil(math.ceil(k_total / splits) / tile.bk) * tile.bk
        cfg = ConvConfig(tile, math.ceil(k_total / k_split), k_split, 0.0)
        assert (cfg.splits > 1) == (splits > 1)
        ws = mem.alloc(4 * max(1, cfg.splits * op.dst.channels * op.dst.n * op.dst.h * op.dst.w))
        mem.launch(nhwc_conv_specs(op, cfg, x_ptr + size * op.src.c_offset, op.src.c_total, k_total,
                                      nhwc_ptr(arena, op.parts[0], precision), w_ptr, b_ptr, ws, precision))
        got = mem.read(arena, (arena_elems,), DTYPE[precision])
        written = np.zeros(arena_elems, bool)
        row = 0
        for i, part in enumerate(op.parts):
            pooled = i >= len(op.parts) - op.pooled
            wi, bi = members.conv(op.members[i])
            ref = as_elem(conv2d_bias_relu(as_elem(x, precision).astype(np.float64),
                                           as_elem(wi, precision).astype(np.float64),
                                           0 * bi if pooled else bi.astype(np.float64), 1, (0, 0), not pooled),
                          precision).astype(np.float64)
            n, c_total, h, wd = part.shape
            idx = (part.offset + np.arange(n * h * wd)[:, None] * c_total + part.c_offset
                   + np.arange(part.channels)[None, :])
            written[idx.ravel()] = True
            part_got = got[idx].reshape(n, h, wd, part.channels).transpose(0, 3, 1, 2).astype(np.float64)
            where = f"{tile.prefix}_{tile.name}, {splits} slice(s), part {i}"
            assert np.isfinite(part_got).all(), f"{where}: {np.isnan(part_got).sum()} elements not written"
            err = rel_l2(part_got, ref)
            assert err <= TOL[precision], f"{where}: rel L2 {err:.2e} against the ideal {precision} conv"
            row += part.channels
        assert np.isnan(got[~written]).all(), f"{(~np.isnan(got[~written])).sum()} elements written outside the parts"


MAXPOOL_CASES = [  # (batch, Cin, H, W, Cout, splits); the pool's input and the conv's output views of wider buffers
    (2, 24, 11, 9, 40, 1),  # 40 pixels: a part of one tile
    (3, 64, 19, 17, 80, 1),  # Conv2d_3b's channels: 216 pixels, two 128-pixel tiles
    (1, 96, 15, 15, 136, 3),  # split-K: 3 slices of 32 channels, Cout past one 128 tile
]


@pytest.mark.parametrize("precision", ("fp16", "tf32"))
@pytest.mark.parametrize("case", MAXPOOL_CASES, ids=lambda c: "x".join(map(str, c)))
def test_conv_reads_through_a_max_pool(mem, case, precision):
    """conv_nhwc_mma.cu's <tile>_maxpool3 kernels (plan.fuse_max_pools): relu(conv1x1(max_pool3x3s2(x)) + b), on every
    tile that takes it, against the pool and the conv in float64 (the max is exact in the element type)."""
    n, cin, h, w, cout, splits = case
    ho, wo = (h - 3) // 2 + 1, (w - 3) // 2 + 1
    src, dst = View("x", 0, (n, cin + 16, h, w), 8, cin), View("y", 0, (n, cout + 8, ho, wo), 0, cout)
    op = ConvOp("conv", src, dst, (1, 1), 2, (0, 0), max_pool=3)
    rng = rng_for("maxpool conv", *case, precision)
    x = rng.standard_normal(src.dims).astype(np.float32)
    wt = (rng.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype(np.float32)
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    elem = lambda a: as_elem(a, precision).astype(np.float64)  # noqa: E731
    pooled = pool2d(elem(x), "max", 3, 2, 0, True)
    ref = elem(conv2d_bias_relu(pooled, elem(wt), b.astype(np.float64), 1, (0, 0), True))
    size = NHWC_ELEMS[precision].bytes
    x_ptr = put_nhwc(mem, x, src.c_total, src.c_offset, precision)
    b_ptr = mem.alloc(b.nbytes)
    mem.write(b_ptr, b)
    tiles = [t for t in NHWC_ELEMS[precision].tiles(mem.wgmma) if tile_fits(op, t)]
    assert tiles == list(NHWC_ELEMS[precision].mma_tiles)
    for tile in tiles:
        w16 = direct_weights(wt, tile)
        w_ptr, y_ptr = mem.alloc(w16.nbytes), mem.alloc(size * math.prod(dst.shape))
        mem.write(w_ptr, w16)
        k_split = math.ceil(math.ceil(cin / splits) / tile.bk) * tile.bk
        cfg = ConvConfig(tile, math.ceil(cin / k_split), k_split, 0.0)
        ws = mem.alloc(4 * max(1, cfg.splits * cout * n * ho * wo))
        specs = nhwc_conv_specs(op, cfg, x_ptr + size * src.c_offset, src.c_total, cin, y_ptr, w_ptr, b_ptr, ws,
                                   precision)
        assert specs[0].kernel == f"{tile.prefix}_maxpool3_{tile.name}" and len(specs) == 1 + (splits > 1)
        mem.launch(specs)
        got = get_nhwc(mem, y_ptr, dst.shape, dst.c_offset, cout, precision)
        err = rel_l2(got, ref)
        assert err <= TOL[precision], f"{tile.prefix}_maxpool3_{tile.name}: rel L2 {err:.2e}"


@pytest.mark.parametrize("precision", PRECISIONS)
def test_moved_pool_adds_bias_and_relu(mem, precision):
    """pool2d_nhwc with a bias: relu(avg_pool(x) + bias), the pool that fuse_pointwise moved behind its conv, from a
    product buffer into a slice of a wider (concat) buffer."""
    n, c, h, w = 2, 24, 7, 6
    x = as_elem(rng_for("moved pool").standard_normal((n, c, h, w)), precision).astype(np.float32)
    bias = (0.5 * rng_for("moved pool bias").standard_normal(c)).astype(np.float32)
    src, dst = View("x", 0, (n, c, h, w), 0, c), View("y", 0, (n, c + 16, h, w), 8, c)
    op = PoolOp("pool", src, dst, "avg", 3, 1, 1, True, bias="conv")
    size = NHWC_ELEMS[precision].bytes
    x_ptr, y_ptr, b_ptr = put_nhwc(mem, x, c, 0, precision), mem.alloc(size * math.prod(dst.shape)), mem.alloc(4 * c)
    mem.write(b_ptr, bias)
    spec = nhwc_pool_spec(op, 0, precision, b_ptr)
    mem.launch([dataclasses.replace(spec, args=(x_ptr, y_ptr + size * dst.c_offset) + spec.args[2:])])
    got = get_nhwc(mem, y_ptr, dst.shape, dst.c_offset, c, precision)
    pooled = pool2d(x.astype(np.float64), "avg", 3, 1, 1, True) + bias.astype(np.float64)[None, :, None, None]
    np.testing.assert_allclose(got, as_elem(np.maximum(pooled, 0), precision).astype(np.float64), rtol=1e-3,
                               atol=1e-3)
    assert (got == 0).any() and (got > 0).any()  # the ReLU clipped some, not all


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("kind,kernel,stride,pad,include,h,w", [
    ("max", 3, 2, 0, True, 9, 8), ("avg", 3, 1, 1, True, 9, 8), ("avg", 3, 1, 1, False, 9, 8),
    ("max", 3, 1, 1, True, 9, 8),
    ("max", 3, 2, 0, True, 13, 10), ("avg", 3, 1, 1, False, 6, 5), ("max", 2, 2, 0, True, 9, 8),
    ("avg", 5, 1, 2, False, 9, 8)])
def test_pool(mem, kind, kernel, stride, pad, include, h, w, precision):
    """pool2d_nhwc on views of wider buffers: the network's 3x3 pools and other shapes, padding on every side."""
    n, c, before, after = 2, 24, 8, 16
    x = as_elem(rng_for("pool", kind, pad, include).standard_normal((n, c, h, w)), precision).astype(np.float32)
    ho, wo = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    src = View("x", 0, (n, before + c + after, h, w), before, c)
    dst = View("y", 0, (n, c + 16, ho, wo), 16, c)
    op = PoolOp("pool", src, dst, kind, kernel, stride, pad, include)
    size = NHWC_ELEMS[precision].bytes
    x_ptr = put_nhwc(mem, x, src.c_total, src.c_offset, precision)
    y_ptr = mem.alloc(size * math.prod(dst.shape))
    spec = nhwc_pool_spec(op, 0, precision)
    spec = dataclasses.replace(spec, args=(x_ptr + size * src.c_offset, y_ptr + size * dst.c_offset) + spec.args[2:])
    mem.launch([spec])
    got = get_nhwc(mem, y_ptr, dst.shape, dst.c_offset, c, precision)
    ref = as_elem(pool2d(x.astype(np.float64), kind, kernel, stride, pad, include), precision).astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_global_avg_pool_writes_float32_features(mem, precision):
    n, c, hw, before = 3, 40, 5, 8
    x = as_elem(rng_for("gap").standard_normal((n, c, hw, hw)), precision).astype(np.float32)
    x_ptr = put_nhwc(mem, x, before + c, before, precision)
    y_ptr = mem.alloc(4 * n * (c + 8))
    elem = NHWC_ELEMS[precision]
    mem.launch([LaunchSpec("gap", f"global_avg_pool_nhwc{elem.suffix}", (1, 1, 1), (256, 1, 1),
                              (x_ptr + elem.bytes * before, y_ptr, n, c, hw * hw, before + c, c + 8))])
    got = mem.read(y_ptr, (n, c + 8), np.float32)
    assert np.isnan(got[:, c:]).all(), "wrote past each row's features"
    np.testing.assert_allclose(got[:, :c], x.astype(np.float64).mean(axis=(2, 3)), rtol=1e-5, atol=1e-6)


INPUT_CASES = [  # (n, cin, h, w, cout, kernel, stride, pad, y channels before, y channels after)
    (2, 3, 17, 15, 32, (3, 3), 2, (0, 0), 0, 0),  # the network's first conv: tf32 stages its output in shared memory
    (1, 3, 41, 37, 32, (3, 3), 2, (0, 0), 0, 0),  # ... over two blocks, the second partly past the last pixel
    (1, 3, 9, 11, 48, (5, 5), 1, (2, 2), 8, 16),  # windows in the padding; a second block of 16 channels
    (3, 4, 6, 7, 8, (1, 3), 1, (0, 1), 0, 8),  # fewer channels than one block
    (1, 3, 13, 21, 48, (3, 3), 1, (1, 1), 8, 16),  # K = 27 with padding, two m tiles, 16 channels in the second block
]


def input_op(n, cin, h, w, cout, kernel, stride, pad, before, after) -> ConvOp:
    ho, wo = (h + 2 * pad[0] - kernel[0]) // stride + 1, (w + 2 * pad[1] - kernel[1]) // stride + 1
    return ConvOp("first", View("x", 0, (n, cin, h, w), 0, cin),
                  View("y", 0, (n, before + cout + after, ho, wo), before, cout), kernel, stride, pad)


# Every case on the FMA kernel in every precision, and on the tensor-core kernel where input_tile picks it (fp16 and
# tf32, K <= 32). In a fixed order (not a set's): pytest-xdist's workers must collect the same list.
INPUT_RUNS = [(case, p, tile) for case in INPUT_CASES for p in PRECISIONS
              for tile in dict.fromkeys((INPUT_TILE, input_tile(input_op(*case), p)))]


@pytest.mark.parametrize("case,precision,tile", INPUT_RUNS,
                         ids=[f"{c[0]}x{c[1]}x{c[2]}x{c[3]}-{c[4]}-{c[5][0]}x{c[5][1]}-{p}-{t.prefix}"
                              for c, p, t in INPUT_RUNS])
def test_conv_input_reads_the_float32_nchw_input(mem, case, precision, tile):
    """conv_input_nhwc[_tf32|_f32] (FMA): float32 input, weights and sums, one rounding to fp16 or TF32 (both keep 11
    significant bits) or none: within one step of float64's. conv_input_mma_nhwc[_tf32] (tensor cores): the input and
    weights rounded to the element type as they enter the mma, fp32 sums, one rounding of the output: within one step
    of the ideal conv of the rounded operands (sums in float64)."""
    n, cin, h, w, cout, kernel, stride, pad, before, after = case
    rng = rng_for("input", n, cin, cout, kernel)
    op = input_op(*case)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    w_ = (rng.standard_normal((cout, cin, *kernel)) / np.sqrt(cin * kernel[0] * kernel[1])).astype(np.float32)
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    wt = direct_weights(w_, tile)
    ptrs = [mem.alloc(a.nbytes) for a in (x, wt, b)]
    for ptr, a in zip(ptrs, (x, wt, b)):
        mem.write(ptr, a)
    size = NHWC_ELEMS[precision].bytes
    y_ptr = mem.alloc(size * math.prod(op.dst.shape))
    cfg = ConvConfig(tile, 1, cin * kernel[0] * kernel[1], 0.0)
    # one SM: the tensor-core kernel's blocks take several output rows each (at most 8), as at batch 128 on the GPU
    specs = nhwc_conv_specs(op, cfg, ptrs[0], cin, cin, y_ptr + size * before, ptrs[1], ptrs[2], 0, precision, 1)
    if tile == INPUT_MMA_TILE:
        rows = n * op.dst.h  # 4 blocks an SM, up to 8 rows a block
        assert specs[0].grid[0] == blocks(rows, min(8, rows // 4)) < rows
    suffix = NHWC_ELEMS[precision].suffix
    assert [s.kernel for s in specs] == [("conv_input_nhwc" if tile == INPUT_TILE else "conv_input_mma_nhwc")
                                         + suffix]
    mem.launch(specs)
    got = get_nhwc(mem, y_ptr, op.dst.shape, before, cout, precision)
    operands = (x, w_) if tile == INPUT_TILE else (as_elem(x, precision), as_elem(w_, precision))
    ref = conv2d_bias_relu(*(a.astype(np.float64) for a in operands), b.astype(np.float64), stride, pad, True)
    np.testing.assert_allclose(got, ref, rtol=1e-5 if precision == "fp32" else 2.0 ** -10, atol=1e-6)
    np.testing.assert_array_equal(mem.read(ptrs[0], x.shape, np.float32), x)


# --- the whole network ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("precision,fuse", [("fp16", "on"), ("tf32", "on"), ("tf32", "off"), ("fp32", "on")])
def test_backend_nhwc_forward_on_the_emulator(backend_emu_lib, precision, fuse):
    """One NHWC forward (75x75 images, batch 2, branches on several streams) against float64, with each module's
    1x1 convs fused (the default: 10 groups) and MaxPool_3a folded into Conv2d_3b (fp16 and tf32; fp32 has no
    kernel for it), and without."""
    r = run_backend_emulated(backend_emu_lib, "-m", "inception_engine.backends.cuda", "--selftest",
                             "--batch", "2", "--graph", "off", "--concurrent", "on", "--input-size", "75",
                             "--precision", precision, "--layout", "nhwc", "--fuse", fuse)
    out = r.stdout[-2000:] + r.stderr[-3000:]
    assert r.returncode == 0 and "PASS" in r.stdout and f"({precision}, nhwc)" in r.stdout, out
    assert f"{10 if fuse == 'on' else 0} fused 1x1 groups" in r.stdout, out
    assert f"{1 if fuse == 'on' and precision != 'fp32' else 0} max pools folded" in r.stdout, out


@pytest.mark.gpu
@pytest.mark.parametrize("precision", PRECISIONS)
def test_gpu_nhwc_network_top1_agrees_with_float64_on_256_inputs(weights, precision):
    """The issue's criterion with NHWC activations: rel L2 of the logits <= 1e-2 (fp16), 3e-3 (tf32) or 1e-4 (fp32)
    per batch of 32 and the top class float64's on >= 99% of 256 inputs; every conv on conv_nhwc_*.cu, in a CUDA
    graph (the default layout on sm_90a, in fp32 too)."""
    plan = build_plan(32, weights.layers())
    with CudaBackend(weights, plan, precision=precision) as backend:  # the default layout
        assert backend.nhwc
        suffix = NHWC_ELEMS[precision].suffix
        convs = {s.kernel for s in backend.specs if s.kernel.startswith("conv_")} - {"conv_splitk_reduce"}
        fc_prefix = TILES_OF[precision][0].prefix + "_"
        first = "conv_input_nhwc_f32" if precision == "fp32" else f"conv_input_mma_nhwc{suffix}"
        assert convs and all(k.startswith((f"conv_nhwc{suffix}_", fc_prefix)) or k == first
                             for k in convs), convs
        assert_top1_agrees_on_256_inputs(backend, weights, plan, NET_TOL[precision])


@pytest.mark.slow
def test_cubin_has_every_entry_point(tmp_path):
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    from helpers.mma_harness import assert_cubin_holds, compile_cubin

    for source in (*cuda_build.PER_ELEMENT, "pool_nhwc.cu"):
        cubin = compile_cubin(tmp_path / f"{source}.cubin", cuda_build.source_dir() / source, "sm_90")
        assert_cubin_holds(cubin, [k for k in KERNELS if source_of(k) == source])


