"""int8 NHWC convs on Hopper's wgmma (conv_mma.cuh's NhwcI8: conv_nhwc_wgmma.cu's conv_nhwc_i8_wgmma_<BM>x<BN>,
conv_nhwc_ws.cu's warp-specialized conv_nhwc_i8_ws_, _ws_tma_ and _ws_tma_pp_ tiles, conv_nhwc_halo.cu's
conv_nhwc_i8_halo_ tiles) against int8_reference's integer semantics, element for element.

- CPU, NumPy: the weight rows (params.direct_weights for the int8 tiles: int8_reference.quantize_weights in (r, s, c)
  order, Cin padded to 16), the epilogue argument (int8_scales.int8_epilogue), split-K (int32 partial sums,
  conv_nhwc_i8_splitk_reduce).
- CPU, g++ fiber emulator (tests/cuda_emu, whose .s8 wgmma reads the operands through the ISA's 64- and 128-byte
  swizzles independently of the kernel, and whose TMA copies read the emulator's own tensor maps), and the same tests
  on the GPU (marked gpu): every int8 tile that fits on 1x1, 3x3 (padding 1), 1x3, 3x1 and stride-2 convs of
  channel-slice views, a fused conv whose three parts are stored at different scales with ReLU on the first two only;
  the TMA tiles (Cin a multiple of 128) and the halo tiles (stride 1, several taps; planes of 64 channels, a last one
  of 16, 32 or 48) on convs of their own; the persistent tiles with num_sms 3, so that each block takes several
  tiles and its ring wraps. Every buffer starts as -128 (0x80 bytes), a value the kernels never write
  (they saturate to +-127) and the inputs never hold: an unwritten output, a write outside the destination views or a
  read outside the source view shows. Outputs must equal int8_reference's exactly: conv_int32, then
  float32(acc) * (s_x s_w[m]) + bias[m] (two roundings), ReLU, quantize at the part's storage scale.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from inception_engine import arch
from inception_engine.backends import int8_reference as ref
from inception_engine.backends.cuda.cost_model import ConvConfig
from inception_engine.backends.cuda.kernels import arg_format
from inception_engine.backends.cuda.launch_nhwc import nhwc_conv_specs
from inception_engine.backends.cuda.int8_scales import int8_epilogue
from inception_engine.backends.cuda.params import direct_weights
from inception_engine.backends.cuda.tensor_maps import MAP_BYTES
from inception_engine.backends.cuda.tiles import (HALO_CIN_I8, MAXPOOL_PREFIXES, NHWC_ELEMS, Tile, check_nhwc_precision,
                                                  conv_kernel, halo_smem_bytes, is_halo, is_pingpong, is_tma, is_ws,
                                                  tile_fits, wgmma_ring_bytes, wgmma_stages, ws_row, ws_stages)
from inception_engine.errors import EngineError
from inception_engine.plan import ConvOp, FusedConvOp, View

from helpers.gpu_memory import Emulated, OnGpu
from helpers.mma_harness import NVCC, compile_emu_lib, emu_wrapper_source, rng_for

PRECISION = "int8"
TILES = NHWC_ELEMS[PRECISION].wgmma_tiles
WGMMA = [t for t in TILES if "_wgmma" in t.prefix]  # conv_nhwc_wgmma.cu's
WS = [t for t in TILES if is_ws(t.prefix) and not is_tma(t.prefix)]  # conv_nhwc_ws.cu's cp.async ones
TMA = [t for t in TILES if is_tma(t.prefix)]  # ... its TMA ones, ping-pong too
HALO = [t for t in TILES if is_halo(t.prefix)]
POISON = -128
MAXPOOL = [t for t in TILES if t.prefix in MAXPOOL_PREFIXES]  # the wgmma tiles' max-pool twins
KERNELS = ([f"{t.prefix}_{t.name}" for t in TILES] + [f"{t.prefix}_maxpool3_{t.name}" for t in MAXPOOL]
           + ["conv_nhwc_i8_splitk_reduce"])


@pytest.fixture(scope="module")
def emu(build_cache_dir):
    if NVCC is None:
        pytest.skip("nvcc is not installed (the emulated kernels are checked against the sources nvcc builds)")
    # the int8 tiles alone: conv_nhwc.cuh compiles only the element types asked for
    wrapper = "#define IE_NHWC_INT8\n" + emu_wrapper_source(
        "conv_nhwc_wgmma.cu", [(k, arg_format(k)) for k in KERNELS],
        ('#include "conv_nhwc_ws.cu"', '#include "conv_nhwc_halo.cu"',
         'extern "C" int emu_wgmma_ring_bytes(int split, int bm, int bn) { return wgmma_ring_bytes(split, bm, bn); }',
         'extern "C" int emu_ws_ring_bytes(int bm, int bn, int row) { return ws_ring_bytes(bm, bn, row); }',
         'extern "C" int emu_ws_stages(int bm, int bn, int row) { return ws_stages(bm, bn, row); }',
         'extern "C" int emu_halo_smem_bytes(int elem, int bm, int bn, int cin, int kh, int kw, int wg) {'
         ' return halo_smem_bytes(elem, bm, bn, cin, kh, kw, wg); }'))
    mem = Emulated(compile_emu_lib(build_cache_dir, "emu_nhwc_i8", wrapper, "-O2", True))
    yield mem
    mem.close()


@pytest.fixture(scope="module")
def gpu_mem(gpu):
    mem = OnGpu(gpu[1], gpu[0].arch)
    if not mem.wgmma:
        pytest.skip("the int8 tiles are sm_90a wgmma kernels; this GPU has none")
    yield mem
    mem.close()



# --- NumPy ----------------------------------------------------------------------------------------------------------


def test_int8_weights_are_quantized_rows_in_rsc_order_padded_to_sixteen_channels():
    rng = rng_for("i8 weights")
    w = rng.standard_normal((12, 21, 3, 2)).astype(np.float32)
    s_w = ref.weight_scales(w)
    for tile in TILES:
        rows = direct_weights(w, tile, s_w)
        assert rows.dtype == np.float32
        got = rows.view(np.int8).reshape(12, 3, 2, 32)
        np.testing.assert_array_equal(got[..., :21], ref.quantize_weights(w, s_w).transpose(0, 2, 3, 1))
        assert not got[..., 21:].any() and np.abs(got).max() == 127
    with pytest.raises(ValueError, match="per-channel scales"):
        direct_weights(w, TILES[0])


def test_int8_epilogue_is_bias_scale_inv_out():
    got = int8_epilogue(np.array([1.0, 2.0]), np.array([3.0, 4.0]), np.array([5.0, 6.0]))
    np.testing.assert_array_equal(got, np.array([1, 2, 3, 4, 5, 6], np.float32))
    with pytest.raises(ValueError, match="channels"):
        int8_epilogue(np.zeros(2), np.zeros(3), np.zeros(2))


def test_int8_needs_wgmma():
    with pytest.raises(EngineError, match="int8 runs on Hopper's wgmma tiles only"):
        check_nhwc_precision(PRECISION, False)
    check_nhwc_precision(PRECISION, True)
    assert not NHWC_ELEMS[PRECISION].mma_tiles
    assert (len(WGMMA), len(WS), len(TMA), len(HALO), len(TILES)) == (6, 4, 8, 5, 23)
    assert all(t.bk == 64 for t in WGMMA + WS + HALO)  # 64 int8 k a 64-byte row (a halo plane's)
    # TMA: 128-byte rows, 128 k a stage, and their _r64 twins of 64-byte rows; two of each ping-pong
    assert sorted(t.bk for t in TMA) == [64] * 4 + [128] * 4 and all(ws_row(t.prefix) == t.bk for t in TMA)
    assert sum(map(is_pingpong, (t.prefix for t in TMA))) == 4


def test_ring_bytes_are_the_kernels(emu):
    for t in WGMMA:
        assert wgmma_ring_bytes(f"{t.prefix}_{t.name}") == emu.lib.emu_wgmma_ring_bytes(0, t.bm, t.bn)
        assert wgmma_ring_bytes(f"{t.prefix}_{t.name}") == wgmma_stages(t.bm, t.bn) * (t.bm + t.bn) * 64
    for t in WS + TMA:  # rows of 64 bytes (64 k), the TMA tiles' of 128 (128 k)
        row = ws_row(t.prefix)
        assert row == t.bk and ws_stages(t.bm, t.bn, row) == emu.lib.emu_ws_stages(t.bm, t.bn, row) >= 3
        assert wgmma_ring_bytes(f"{t.prefix}_{t.name}") == emu.lib.emu_ws_ring_bytes(t.bm, t.bn, row) <= 227 * 1024
    for t in HALO:  # planes of 64 int8 channels, 64-byte rows: Conv2d_2b's 32 channels in one, Conv2d_4a's 80 in two
        assert t.bk == HALO_CIN_I8
        for kernel, wg, cin in (((3, 3), 149, 32), ((3, 3), 73, 80), ((5, 5), 39, 48), ((1, 7), 23, 192)):
            assert halo_smem_bytes(t, kernel, wg, cin) == emu.lib.emu_halo_smem_bytes(1, t.bm, t.bn, cin, *kernel, wg)


# --- kernels on the emulator and on the GPU -------------------------------------------------------------------------


def poisoned(mem, nbytes: int) -> int:
    """A buffer of nbytes of -128 (the memories' own poison is 0xFF bytes: -1, a value int8 outputs take)."""
    ptr = mem.alloc(nbytes)
    mem.write(ptr, np.full(nbytes, POISON, np.int8))
    return ptr


def put_i8(mem, data: np.ndarray, c_total: int, c_offset: int) -> int:
    """A -128-poisoned int8 NHWC buffer of c_total channels with data (N, C, H, W) at channel c_offset; its address."""
    n, c, h, w = data.shape
    buf = np.full((n, h, w, c_total), POISON, np.int8)
    buf[..., c_offset:c_offset + c] = data.transpose(0, 2, 3, 1)
    ptr = mem.alloc(buf.nbytes)
    mem.write(ptr, buf)
    return ptr


def reference(q: np.ndarray, w: np.ndarray, s_x: float, s_w: np.ndarray, bias: np.ndarray, stride: int,
              pad: tuple[int, int], out_scales: np.ndarray, relu_end: int) -> np.ndarray:
    """int8_reference's conv: exact int32 sums, the float32 epilogue (ReLU below relu_end), each channel quantized at
    its part's storage scale (out_scales, per channel)."""
    acc = ref.conv_int32(q, ref.quantize_weights(w, s_w), stride, pad)
    y = ref.conv_epilogue(acc, s_x, s_w, bias)  # with ReLU everywhere; the channels past relu_end without it:
    mult = (np.float32(s_x) * s_w).reshape(1, -1, 1, 1)
    raw = acc.astype(np.float32) * mult + bias.astype(np.float32).reshape(1, -1, 1, 1)
    y[:, relu_end:] = raw[:, relu_end:]
    out = np.empty(y.shape, np.int8)
    for scale in np.unique(out_scales):
        sel = out_scales == scale
        out[:, sel] = ref.quantize(y[:, sel], scale)
    return out


def conv_data(key: tuple, cin: int, cout: int, x_shape: tuple[int, ...], kernel: tuple[int, int]):
    """Random int8 input (never -128), float weights and their scales, bias, s_x."""
    rng = rng_for("i8", *key)
    q = rng.integers(-127, 128, x_shape, dtype=np.int8)
    w = (rng.standard_normal((cout, cin, *kernel)) * rng.uniform(0.2, 2.0, (cout, 1, 1, 1))).astype(np.float32)
    return q, w, ref.weight_scales(w), (0.5 * rng.standard_normal(cout)).astype(np.float32), np.float32(0.02)


def out_scales_for(y: np.ndarray, parts: list[int]) -> np.ndarray:
    """Per channel, its part's storage scale: a little below what holds the part's largest output, so that a few
    saturate (to +-127), and different from part to part."""
    scales, start = [], 0
    for i, ch in enumerate(parts):
        top = float(np.abs(y[:, start:start + ch]).max()) or 1.0
        scales += [np.float32(top / (127 * (1.4 + 0.3 * i)))] * ch
        start += ch
    return np.array(scales, np.float32)


def launch(mem, op: ConvOp, tile: Tile, q: np.ndarray, w: np.ndarray, s_w: np.ndarray, epilogue: np.ndarray,
           y: int, splits: int = 1) -> None:
    """The conv on `tile`; with splits > 1, K in that many slices (int32 partial sums in a -128-poisoned workspace,
    then conv_nhwc_i8_splitk_reduce)."""
    k_total = op.src.channels * op.kernel[0] * op.kernel[1]
    x_ptr = put_i8(mem, q, op.src.c_total, op.src.c_offset)
    w8 = direct_weights(w, tile, s_w)
    w_ptr, b_ptr = mem.alloc(w8.nbytes), mem.alloc(epilogue.nbytes)
    mem.write(w_ptr, w8)
    mem.write(b_ptr, epilogue)
    k_split = math.ceil(math.ceil(k_total / splits) / tile.bk) * tile.bk
    assert math.ceil(k_total / k_split) == splits
    ws = poisoned(mem, 4 * splits * op.dst.n * op.dst.h * op.dst.w * op.dst.channels) if splits > 1 else 0
    # num_sms 3: a persistent tile's blocks each take several tiles, so its ring (and a halo tile's two buffers) wrap
    maps = mem.alloc(2 * MAP_BYTES) if is_tma(tile.prefix) else 0
    specs = nhwc_conv_specs(op, ConvConfig(tile, splits, k_split, 0.0), x_ptr + op.src.c_offset, op.src.c_total,
                            op.src.channels, y, w_ptr, b_ptr, ws, PRECISION, num_sms=3, maps=maps)
    want = [conv_kernel(op, tile)] + ["conv_nhwc_i8_splitk_reduce"] * (splits > 1)
    assert [s.kernel for s in specs] == want
    mem.launch(specs)


# (batch, cin, cout, h, w, kernel, stride, pad, input (c_total, c_offset), output (c_total, c_offset))
CASES = [
    (2, 48, 40, 5, 7, (1, 1), 1, (0, 0), (80, 16), (52, 8)),  # a view of wider buffers on both sides
    (1, 32, 200, 6, 6, (3, 3), 1, (1, 1), (32, 0), (204, 4)),  # Cout past 192 (a tail in every channel tile)
    (2, 16, 36, 5, 9, (1, 3), 1, (0, 1), (32, 16), (36, 0)),  # K = 48 < a stage's 64
    (1, 64, 64, 9, 5, (3, 1), 1, (1, 0), (64, 0), (72, 4)),
    (2, 32, 24, 9, 9, (3, 3), 2, (0, 0), (48, 0), (24, 0)),  # stride 2; 128 pixels: a tail in the 256-pixel tiles
    (1, 160, 32, 17, 17, (1, 1), 1, (0, 0), (160, 0), (32, 0)),  # 289 pixels, K = 160: three stages, the last short
]


def case_id(c: tuple) -> str:
    return f"{c[0]}x{c[3]}x{c[4]}-{c[5][0]}x{c[5][1]}s{c[6]}c{c[1]}o{c[2]}"


def check_conv(mem, case: tuple, tiles: list[Tile]) -> None:
    """The case's conv on each of the tiles: the output view equals int8_reference's conv exactly, no -128 left in it,
    every byte outside it still -128."""
    n, cin, cout, h, wd, kernel, stride, pad, (x_total, x_off), (y_total, y_off) = case
    ho, wo = (h + 2 * pad[0] - kernel[0]) // stride + 1, (wd + 2 * pad[1] - kernel[1]) // stride + 1
    op = ConvOp("conv", View("x", 0, (n, x_total, h, wd), x_off, cin),
                View("y", 0, (n, y_total, ho, wo), y_off, cout), kernel, stride, pad)
    q, w, s_w, bias, s_x = conv_data(case, cin, cout, (n, cin, h, wd), kernel)
    y_float = ref.conv_epilogue(ref.conv_int32(q, ref.quantize_weights(w, s_w), stride, pad), s_x, s_w, bias)
    out_scales = out_scales_for(y_float, [cout])
    want = reference(q, w, s_x, s_w, bias, stride, pad, out_scales, cout)
    assert (np.abs(want) == 127).any() and (want == 0).any() and (np.abs(want) < 127).any()
    epilogue = int8_epilogue(bias, np.float32(s_x) * s_w, np.float32(1) / out_scales)
    assert tiles and all(tile_fits(op, t) for t in tiles)
    for tile in tiles:
        y = poisoned(mem, n * ho * wo * y_total)
        launch(mem, op, tile, q, w, s_w, epilogue, y + y_off)
        got = mem.read(y, (n, ho, wo, y_total), np.int8)
        outside = np.concatenate([got[..., :y_off].ravel(), got[..., y_off + cout:].ravel()])
        label = f"{tile.prefix}_{tile.name}"
        assert (outside == POISON).all(), f"{label}: {(outside != POISON).sum()} bytes written outside the view"
        inside = got[..., y_off:y_off + cout].transpose(0, 3, 1, 2)
        assert (inside != POISON).all(), f"{label}: {(inside == POISON).sum()} outputs not written"
        bad = inside != want
        assert not bad.any(), f"{label}: {bad.sum()} of {bad.size} outputs differ from int8_reference"


def fitting(case: tuple, tiles: list[Tile]) -> list[Tile]:
    n, cin, cout, h, wd, kernel, stride, pad, (x_total, x_off), (y_total, y_off) = case
    op = ConvOp("conv", View("x", 0, (n, x_total, h, wd), x_off, cin), View("y", 0, (n, y_total, 1, 1), y_off, cout),
                kernel, stride, pad)
    return [t for t in tiles if tile_fits(op, t)]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_conv_equals_int8_reference(mem, case):
    """The wgmma and cp.async warp-specialized tiles (every Cin), and the halo tiles where they fit."""
    check_conv(mem, case, WGMMA + WS + fitting(case, HALO))


TMA_CASES = [  # Cin a multiple of 128 (a TMA stage's 128 int8 channels of one tap), or of 64 (the _r64 tiles')
    # taps along W past both edges; a view at channel 16 of a wider buffer; 128-pixel boxes across rows and images
    (3, 128, 200, 9, 9, (1, 7), 1, (0, 3), (144, 16), (208, 8)),
    (2, 128, 48, 11, 13, (7, 1), 1, (3, 0), (128, 0), (48, 0)),  # taps along H
    (2, 256, 96, 9, 9, (3, 3), 2, (0, 0), (256, 0), (96, 0)),  # stride 2: the window corners two apart
    (1, 384, 200, 8, 8, (1, 1), 1, (0, 0), (416, 0), (256, 56)),  # 8x8 1x1, Cout past a channel tile
    # 9 pixel tiles on num_sms 3 and 2 channel tiles at 128x128: each ping-pong consumer takes several tiles, so the
    # turn barriers and both consumers' ring positions go through several phases
    (6, 128, 136, 12, 16, (3, 3), 1, (1, 1), (128, 0), (136, 0)),
    (2, 192, 136, 9, 9, (1, 7), 1, (0, 3), (208, 16), (136, 0)),  # 192 and 448 channels: the _r64 tiles only
    (1, 448, 64, 8, 8, (3, 3), 1, (1, 1), (448, 0), (64, 0)),
    (2, 64, 96, 11, 13, (3, 3), 2, (0, 0), (64, 0), (96, 0)),
]


@pytest.mark.parametrize("case", TMA_CASES, ids=case_id)
def test_tma_tiles_equal_int8_reference(mem, case):
    """conv_nhwc_ws.cu's TMA tiles and their ping-pong versions: the A rows as im2col boxes of 128 (_r64: 64) int8
    channels through a tensor map of 1-byte elements, the weights as tiled boxes; the cp.async tiles on the same
    convs."""
    tma = fitting(case, TMA)
    assert len(tma) == (8 if case[1] % 128 == 0 else 4)
    check_conv(mem, case, tma + WS)


HALO_CASES = [  # stride 1, several taps, Cin a multiple of 16: planes of 64 channels
    (2, 32, 64, 13, 11, (3, 3), 1, (1, 1), (32, 0), (64, 0)),  # Conv2d_2b's shape: one plane of 32 (one k32 step)
    (1, 32, 32, 12, 9, (3, 3), 1, (0, 0), (48, 16), (48, 8)),  # Conv2d_2a's; views of wider buffers
    (2, 80, 136, 11, 13, (3, 3), 1, (0, 0), (96, 16), (144, 8)),  # Conv2d_4a's: a full plane, then 16 channels
    (1, 48, 64, 9, 9, (5, 5), 1, (2, 2), (48, 0), (64, 0)),  # the 35x35 5x5: one plane of 48 (two k32 steps)
    (2, 96, 96, 8, 7, (3, 3), 1, (1, 1), (96, 0), (128, 32)),  # their 3x3s: a full plane and 32 channels
    (2, 192, 24, 6, 8, (1, 7), 1, (0, 3), (192, 0), (32, 0)),  # three full planes, 7 taps along W
    (1, 16, 48, 7, 10, (3, 1), 1, (1, 0), (16, 0), (48, 0)),  # one plane of 16
    # 3 images of several tiles of the 42-wide padded grid: with num_sms 3 each block takes several tiles, each
    # consumer warpgroup several, so both buffers' barriers go through several phases
    (3, 64, 64, 40, 40, (3, 3), 1, (1, 1), (64, 0), (64, 0)),
]


@pytest.mark.parametrize("case", HALO_CASES, ids=case_id)
def test_halo_tiles_equal_int8_reference(mem, case):
    """conv_nhwc_halo.cu's halo tiles on the convs they take: every kernel shape, padding or none, Cout below the
    tile's, views of wider buffers, last planes of 16, 32 and 48 channels."""
    assert fitting(case, HALO) == HALO
    check_conv(mem, case, HALO)


@pytest.mark.parametrize("splits", [2, 3])
def test_split_k_sums_int32_exactly_then_requantizes(mem, splits):
    """K in slices: int32 partial sums, summed exactly by the reduction, which writes what one slice would have."""
    n, cin, cout, h, wd = 1, 64, 40, 6, 6
    op = ConvOp("conv", View("x", 0, (n, cin, h, wd), 0, cin), View("y", 0, (n, 48, h, wd), 4, cout), (3, 3), 1,
                (1, 1))
    q, w, s_w, bias, s_x = conv_data(("split", splits), cin, cout, (n, cin, h, wd), (3, 3))
    y_float = ref.conv_epilogue(ref.conv_int32(q, ref.quantize_weights(w, s_w), 1, (1, 1)), s_x, s_w, bias)
    out_scales = out_scales_for(y_float, [cout])
    want = reference(q, w, s_x, s_w, bias, 1, (1, 1), out_scales, cout)
    epilogue = int8_epilogue(bias, np.float32(s_x) * s_w, np.float32(1) / out_scales)
    for tile in (TILES[1], TILES[4]):
        y = poisoned(mem, n * h * wd * 48)
        launch(mem, op, tile, q, w, s_w, epilogue, y + 4, splits)
        got = mem.read(y, (n, h, wd, 48), np.int8)
        assert (got[..., :4] == POISON).all() and (got[..., 44:] == POISON).all()
        inside = got[..., 4:44].transpose(0, 3, 1, 2)
        assert (inside == want).all(), f"{tile.name}: {(inside != want).sum()} outputs differ"


FUSED = [(24, 40, 8), (16, 16, 0), (12, 48, 0)]  # parts: (channels, buffer channels, channel offset); the last raw


def test_fused_conv_writes_each_part_at_its_scale_and_the_raw_products_as_int32(mem):
    """Three stacked 1x1 convs (plan.FusedConvOp) whose parts lie in one arena, the first two at different storage
    scales (one inv_out per channel), the last past relu_end (a moved pool's member): its raw products, the exact
    int32 sums, 4 bytes a channel (a buffer whose c_total counts bytes: plan.fuse_pointwise's product_elems). Each
    part equals int8_reference, every other byte of the arena stays -128. Every int8 tile of 1x1 convs (the TMA
    ones: Cin 128), and split-K (conv_nhwc_i8_splitk_reduce) on two of them."""
    n, cin, h, wd = 2, 128, 5, 6
    places, pos = [], 0
    for _, c_total, _ in FUSED:
        places.append(pos)
        pos += n * h * wd * c_total + 16  # a gap after each buffer, which must stay -128
    parts = tuple(View(f"part{i}", places[i], (n, c_total, h, wd), c_off, ch)
                  for i, (ch, c_total, c_off) in enumerate(FUSED))
    cout = sum(ch for ch, *_ in FUSED)
    op = FusedConvOp("fused", View("x", 0, (n, cin + 16, h, wd), 16, cin), View("fused", 0, (n, cout, h, wd), 0, cout),
                     (1, 1), 1, (0, 0), tuple(f"m{i}" for i in range(len(parts))), parts, 1)
    relu_end = cout - FUSED[-1][0]
    q, w, s_w, bias, s_x = conv_data(("fused",), cin, cout, (n, cin, h, wd), (1, 1))
    bias[relu_end:] = 0  # the pooled member's bias waits for its pool
    acc = ref.conv_int32(q, ref.quantize_weights(w, s_w), 1, (0, 0))
    y_float = ref.conv_epilogue(acc, s_x, s_w, bias)
    out_scales = out_scales_for(y_float, [ch for ch, *_ in FUSED])
    want = reference(q, w, s_x, s_w, bias, 1, (0, 0), out_scales, relu_end)
    assert (acc[:, relu_end:] < 0).any() and (np.abs(acc[:, relu_end:]) > 127).any()  # raw: no ReLU, no int8 range
    epilogue = int8_epilogue(bias, np.float32(s_x) * s_w, np.float32(1) / out_scales)
    tiles = [t for t in TILES if tile_fits(op, t)]
    assert tiles == WGMMA + WS + TMA  # a 1x1 conv of 128 channels: no halo tile
    for tile, splits in [(t, 1) for t in tiles] + [(TILES[1], 2), (WS[0], 2)]:
        arena = poisoned(mem, pos)
        launch(mem, op, tile, q, w, s_w, epilogue, arena + parts[0].offset + parts[0].c_offset, splits)
        got = mem.read(arena, (pos,), np.int8)
        written = np.zeros(pos, bool)
        start = 0
        for i, (part, place) in enumerate(zip(parts, places)):
            c_total = part.c_total
            buf = got[place:place + n * h * wd * c_total].reshape(n, h, wd, c_total)
            if i == len(parts) - 1:
                view = buf.view(np.int32).transpose(0, 3, 1, 2)
                expected = acc[:, start:start + part.channels]
                marks = written[place:place + n * h * wd * c_total]
                marks[:] = True
            else:
                view = buf[..., part.c_offset:part.c_offset + part.channels].transpose(0, 3, 1, 2)
                expected = want[:, start:start + part.channels]
                marks = written[place:place + n * h * wd * c_total].reshape(n, h, wd, c_total)
                marks[..., part.c_offset:part.c_offset + part.channels] = True
            bad = view != expected
            assert not bad.any(), f"{tile.name}/{splits} {part.buffer}: {bad.sum()} outputs differ from int8_reference"
            start += part.channels
        assert (got[~written] == POISON).all(), f"{tile.name}: {(got[~written] != POISON).sum()} stray writes"


MAXPOOL_CASES = [  # (batch, Cin, H, W, Cout, splits); the pool's input and the conv's output views of wider buffers
    (2, 32, 11, 9, 40, 1),  # 40 pixels: a part of one tile
    (3, 64, 19, 17, 80, 1),  # Conv2d_3b's channels: 216 pixels, two 128-pixel tiles
    (1, 128, 15, 15, 136, 2),  # split-K: 2 slices of 64 channels, Cout past one 128 tile
]


@pytest.mark.parametrize("case", MAXPOOL_CASES, ids=lambda c: "x".join(map(str, c)))
def test_conv_reads_through_a_max_pool(mem, case):
    """conv_nhwc_i8_wgmma_maxpool3_<BM>x<BN> (plan.fuse_max_pools; conv_nhwc.cuh's NhwcMaxPoolLoader on int8 words):
    the 1x1 conv of a 3x3 stride-2 max pool of the int8 input, exactly int8_reference's pool (exact on int8) then
    conv, on every tile that takes it."""
    n, cin, h, wd, cout, splits = case
    ho, wo = (h - 3) // 2 + 1, (wd - 3) // 2 + 1
    op = ConvOp("conv", View("x", 0, (n, cin + 16, h, wd), 16, cin), View("y", 0, (n, cout + 8, ho, wo), 4, cout),
                (1, 1), 2, (0, 0), max_pool=3)
    q, w, s_w, bias, s_x = conv_data(("maxpool",) + case, cin, cout, (n, cin, h, wd), (1, 1))
    pooled = ref.pool_int8(q, arch.Pool("pool", "x", "max", 3, 2, 0))
    y_float = ref.conv_epilogue(ref.conv_int32(pooled, ref.quantize_weights(w, s_w), 1, (0, 0)), s_x, s_w, bias)
    out_scales = out_scales_for(y_float, [cout])
    want = reference(pooled, w, s_x, s_w, bias, 1, (0, 0), out_scales, cout)
    epilogue = int8_epilogue(bias, np.float32(s_x) * s_w, np.float32(1) / out_scales)
    tiles = [t for t in TILES if tile_fits(op, t)]
    assert tiles == MAXPOOL == WGMMA
    for tile in tiles:
        y = poisoned(mem, n * ho * wo * (cout + 8))
        launch(mem, op, tile, q, w, s_w, epilogue, y + 4, splits)
        got = mem.read(y, (n, ho, wo, cout + 8), np.int8)
        assert (got[..., :4] == POISON).all() and (got[..., 4 + cout:] == POISON).all(), tile.name
        inside = got[..., 4:4 + cout].transpose(0, 3, 1, 2)
        bad = inside != want
        assert not bad.any(), f"{tile.name}: {bad.sum()} of {bad.size} outputs differ from int8_reference"


def tie_epilogue(a: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per channel m, a scale and a bias for which float32(a[m]) * scale + bias, rounded twice, is exactly a tie
    k + 0.5 (which rint takes to the even neighbour), whereas a fused multiply-add, rounding once, lands beside it and
    rounds the other way: scale[m] a[m] is not exact, and the bias is of similar size, so the product's rounding
    error survives in the fused sum."""
    scales, biases = [], []
    for am in a.astype(np.float64):
        while True:
            s = np.float32(rng.uniform(4.0, 16.0))
            p, exact = np.float32(np.float32(am) * s), am * np.float64(s)
            k = int(rng.integers(1, 120))
            b = np.float32(k + 0.5 - np.float64(p))
            fused = np.float32(exact + np.float64(b))  # exact in float64, then one rounding: fmaf
            if p > 600 and np.float32(p + b) == k + 0.5 and np.rint(fused) != np.rint(k + 0.5):
                break
        scales.append(s)
        biases.append(b)
    return np.array(scales, np.float32), np.array(biases, np.float32)


def test_epilogue_rounds_product_and_sum_apart(mem):
    """The epilogue is float32(acc) * scale, rounded, + bias, rounded (int8_reference.conv_epilogue), not a fused
    multiply-add: a 1x1 conv whose channel m at pixel m lands on a tie only without fusing (tie_epilogue)."""
    n, h, wd, cin, cout = 1, 4, 4, 16, 16
    rng = rng_for("i8 ties")
    q = rng.integers(-127, 128, (n, cin, h, wd), dtype=np.int8)
    q[0, 0] = rng.integers(64, 128, (h, wd))  # channel 0 of pixel p: acc[p, m] = q[p, 0] for every m
    a = q[0, 0].reshape(-1)
    scale, bias = tie_epilogue(a, rng)
    wq = np.zeros((cout, cin, 1, 1), np.float32)
    wq[:, 0] = 1
    w = wq * scale.reshape(-1, 1, 1, 1)  # quantize_weights(w, scale) = wq: float32(s) / s is exactly 1
    ones = np.ones(cout, np.float32)
    want = reference(q, w, np.float32(1), scale, bias, 1, (0, 0), ones, cout)
    diag = want[0].reshape(cout, -1)[np.arange(cout), np.arange(cout)]
    p = np.float32(a.astype(np.float32) * scale)
    fused = np.rint(np.float32(a.astype(np.float64) * scale.astype(np.float64) + bias.astype(np.float64)))
    assert (diag == np.rint(p + bias)).all() and (diag != fused).all()  # the test tells the two apart
    op = ConvOp("conv", View("x", 0, (n, cin, h, wd), 0, cin), View("y", 0, (n, cout, h, wd), 0, cout), (1, 1), 1,
                (0, 0))
    epilogue = int8_epilogue(bias, scale, ones)
    for tile in WGMMA[:1] + WGMMA[-1:] + WS[-1:]:
        y = poisoned(mem, n * h * wd * cout)
        launch(mem, op, tile, q, w, scale, epilogue, y)
        got = mem.read(y, (n, h, wd, cout), np.int8).transpose(0, 3, 1, 2)
        bad = got != want
        assert not bad.any(), f"{tile.name}: {bad.sum()} outputs differ from int8_reference"
