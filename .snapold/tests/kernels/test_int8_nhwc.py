"""The int8 NHWC kernels that are not convolutions (``--precision int8``): pool_nhwc.cu's pool2d_nhwc_i8[_k3s1]
and global_avg_pool_nhwc_i8 and conv_input_nhwc.cu's conv_input_nhwc_i8 and conv_input_mma_nhwc_i8, against
backends/int8_reference.py.

- CPU, NumPy: the average pool's float32 division (i8_piece.cuh's i8q::mean) rounds every integer window sum the way
  the reference's float64 rint(sum / count) does, exhaustively; so does the reciprocal multiply (i8q::mean_small) for
  counts up to 9, but not for 14.
- CPU, g++ fiber emulator (tests/cuda_emu), and the same tests on the GPU (marked gpu):
  - pools: bit-exact against int8_reference.pool_int8 followed by requantize, on views of wider buffers, with
    padding on every side, windows whose means are half-integers (ties), and requantization ratios; the 3x3 kernels'
    runs of 4 outputs a thread on rows of 1 to 73 outputs (short last runs);
  - a moved pool (avg_pool_products_nhwc_i8): the window sums of int32 products as large as a 2048-channel 1x1
    conv's (float32 rounds their sums), the epilogue's float32 operations one by one (int8_reference.window_sums and
    moved_pool_epilogue, then each channel's reciprocal scale), into a channel slice of a wider buffer, padding
    counted or not, rows of 1 to 35 outputs (runs of 4 a thread, short last runs);
  - global average pool: float32 (S * scale) / hw, S the exact int32 sum. Against the exact mean (float64) within
    2 * 2^-24 relative (two float32 roundings, a product and a quotient); against the reference (the float32 mean
    of the dequantized values) within 1e-6 of the mean of |x|: the reference rounds each dequantized value (2^-24
    relative), sums 25 of them in float32 pairwise (~5 * 2^-24 of the sum of |x|) and divides (2^-24): together
    with the kernel's 2 * 2^-24, below 10 * 2^-24 = 6e-7 of the mean of |x|; an error of one level of one element
    would be 1/25 of a level;
  - the first conv, quantized at inv_out: exactly equal to a NumPy reference in the kernel's own arithmetic (fp32
    fmaf in (c, r, s) order, + bias, ReLU, quantize), and within one level of the reference's float32 layer (another
    summation order) on fewer than 1e-3 of the elements; on the tensor cores (fp16 operands), within one level of
    the ideal conv of the rounded operands, and of the float32 layer on fewer than FP16_STEM_OFF of the elements.
  Every int8 buffer starts as -128 (bytes 0x80), which an int8 kernel never writes (it saturates to +-127), so an
  unwritten output or a write outside the destination view fails; float32 outputs start as NaN.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from inception_engine import arch
from inception_engine.backends import int8_reference as ref
from inception_engine.backends.cuda.cost_model import ConvConfig
from inception_engine.backends.cuda.families.conv_input_nhwc import input_conv_specs, inv_scale
from inception_engine.backends.cuda.families.pool_nhwc import nhwc_gap_spec, nhwc_pool_spec, requant_ratio
from inception_engine.backends.cuda.kernels import arg_format
from inception_engine.backends.cuda.launch import LaunchSpec
from inception_engine.backends.cuda.params import direct_weights
from inception_engine.backends.cuda.tiles import INPUT_TILE, input_tile
from inception_engine.backends.numpy_primitives import conv2d_bias_relu, global_avg_pool, pool2d
from inception_engine.plan import ConvOp, GlobalAvgPoolOp, PoolOp, View

from helpers.gpu_memory import Emulated
from helpers.mma_harness import NVCC, compile_emu_lib, emu_wrapper_source, rng_for

KERNELS = ("pool2d_nhwc_i8", "pool2d_nhwc_i8_k3s1", "avg_pool_products_nhwc_i8", "global_avg_pool_nhwc_i8",
           "conv_input_nhwc_i8", "conv_input_mma_nhwc_i8")
POISON = 0x80  # int8 -128: never written by an int8 kernel


# --- CPU, NumPy ----------------------------------------------------------------------------------------------------


MEAN_SMALL_MAX = 9  # i8_piece.cuh's i8q::MEAN_SMALL_MAX: the counts whose mean multiplies by the reciprocal


def test_float32_division_rounds_every_window_mean_as_float64_does():
    """rint(float32(s) / float32(c)) == rint(s / c) in float64 for every |s| <= 127 c, c = 1..25 (the 5x5 pools'
    windows too); float32(s) * float32(1 / c) rounds all of them the same for c <= 9 (i8q::mean_small, the 3x3
    pools' counts) but misses some for c = 14, so larger counts divide."""
    wrong_by_reciprocal = {}
    for c in range(1, 26):
        s = np.arange(-127 * c, 127 * c + 1)
        want = np.rint(s / c)
        np.testing.assert_array_equal(np.rint(s.astype(np.float32) / np.float32(c)), want, err_msg=f"count {c}")
        by_reciprocal = np.rint(s.astype(np.float32) * (np.float32(1) / np.float32(c)))
        wrong_by_reciprocal[c] = int((by_reciprocal != want).sum())
    assert all(wrong_by_reciprocal[c] == 0 for c in range(1, MEAN_SMALL_MAX + 1)), wrong_by_reciprocal
    assert wrong_by_reciprocal[14] > 0


def quantized_bits(v: np.ndarray, inv: np.ndarray, lo: float) -> np.ndarray:
    """i8q::quantized_bits in float32 arithmetic: the bits of clamp(v * inv, lo, 127) + 1.5 * 2^23."""
    x = np.minimum(np.maximum(v * inv, np.float32(lo)), np.float32(127))
    return (x + np.float32(12582912)).view(np.uint32)


def test_quantized_bits_low_byte_is_quantize():
    """The low byte of i8q::quantized_bits is quantize's int8 (saturate(rint(v * inv))) for every half-integer and its
    float32 neighbours in [-300, 300], far outside the range and random values; with lo = 0 it is quantize of the
    ReLU'd value, as the epilogues use it."""
    halves = np.arange(-600, 601, dtype=np.float32) / np.float32(2)
    up, down = np.nextafter(halves, np.float32(np.inf)), np.nextafter(halves, np.float32(-np.inf))
    rng = np.random.default_rng(0)
    v = np.concatenate([halves, up, down, np.float32([0.0, -0.0, 1e30, -1e30, 3e38, -3e38]),
                        (rng.standard_normal(200_000) * 100).astype(np.float32)])
    inv = np.where(np.arange(len(v)) % 2 == 0, np.float32(1), rng.uniform(0.01, 4, len(v)).astype(np.float32))
    for lo, relu in ((-127.0, False), (0.0, True)):
        with np.errstate(over="ignore"):
            want = np.clip(np.rint((np.maximum(v, np.float32(0)) if relu else v) * inv), -127, 127).astype(np.int8)
            got = (quantized_bits(v, inv, lo) & 0xFF).astype(np.uint8).view(np.int8)
        np.testing.assert_array_equal(got, want, err_msg=f"lo {lo}")


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a * b + c rounded once (fmaf), from float32 arrays: the product is exact in float64, the sum's float64
    rounding error is recovered exactly (TwoSum), and decides the one case where rounding the float64 sum to float32
    differs from rounding the exact sum: a float64 sum exactly halfway between two float32 values."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)  # exact: p + c == s + err
    r = s.astype(np.float32)
    d = s - r.astype(np.float64)
    other = np.nextafter(r, np.where(d > 0, np.float32(np.inf), np.float32(-np.inf))).astype(np.float32)
    halfway = (d != 0) & (2 * np.abs(d) == np.abs(other.astype(np.float64) - r.astype(np.float64)))
    return np.where(halfway & (err != 0) & (np.sign(err) == np.sign(d)), other, r)


def test_fma32_rounds_once():
    """(1 + 2^-23) + 2^-24 (1 + 2^-23)(1 - 2^-23) = 1 + 3 * 2^-24 - 2^-70: its float64 rounding is the float32
    halfway point 1 + 3 * 2^-24, which ties to 1 + 2^-22; rounded once, it is 1 + 2^-23."""
    a = np.array([2.0 ** -24 * (1 + 2.0 ** -23)], np.float32)
    b = np.array([1 - 2.0 ** -23], np.float32)
    c = np.array([1 + 2.0 ** -23], np.float32)
    assert (a.astype(np.float64) * b + c).astype(np.float32)[0] == np.float32(1 + 2.0 ** -22)  # twice rounded
    assert fma32(a, b, c)[0] == np.float32(1 + 2.0 ** -23)
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(100000).astype(np.float32) for _ in range(3))
    np.testing.assert_array_equal(fma32(a, b, c), (a.astype(np.float64) * b + c).astype(np.float32))


# --- kernels on the emulator and on the GPU ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emu(build_cache_dir):
    if NVCC is None:
        pytest.skip("nvcc is not installed (the emulated kernels are checked against the sources nvcc builds)")
    lib = compile_emu_lib(build_cache_dir, "emu_int8_nhwc", emu_wrapper_source(
        "pool_nhwc.cu", [(k, arg_format(k)) for k in KERNELS], ('#include "conv_input_nhwc.cu"',)), "-O2", True)
    return Emulated(lib)


def put_i8(mem, q: np.ndarray, c_total: int, c_offset: int) -> int:
    """A -128-poisoned int8 NHWC buffer of c_total channels with q (N, C, H, W) at channel c_offset; its address."""
    n, c, h, w = q.shape
    buf = np.full((n, h, w, c_total), -128, np.int8)
    buf[..., c_offset:c_offset + c] = q.transpose(0, 2, 3, 1)
    ptr = mem.alloc(buf.nbytes, POISON)
    mem.write(ptr, buf)
    return ptr


def get_i8(mem, ptr: int, shape: tuple[int, int, int, int], c_offset: int, channels: int) -> np.ndarray:
    """The view (N, C, H, W) as int8, after checking that every channel outside it still holds -128 and none inside
    it does."""
    n, c_total, h, w = shape
    buf = mem.read(ptr, (n, h, w, c_total), np.int8)
    outside = np.concatenate([buf[..., :c_offset].ravel(), buf[..., c_offset + channels:].ravel()])
    assert (outside == -128).all(), f"{(outside != -128).sum()} elements written outside the destination view"
    inside = buf[..., c_offset:c_offset + channels]
    assert (inside != -128).all(), f"{(inside == -128).sum()} output elements not written"
    return inside.transpose(0, 3, 1, 2)


POOL_CASES = [  # kind, kernel, stride, pad, count_include_pad, h, w, (s_in, s_out): the network's 3x3s and others
    ("max", 3, 2, 0, True, 9, 8, (1.0, 1.0)), ("avg", 3, 1, 1, True, 9, 8, (1.0, 1.0)),
    ("avg", 3, 1, 1, False, 9, 8, (1.0, 1.0)), ("max", 3, 1, 1, True, 9, 8, (0.05, 0.07)),
    ("max", 3, 2, 0, True, 13, 10, (0.05, 0.031)), ("avg", 3, 1, 1, False, 6, 5, (0.02, 0.05)),
    ("avg", 3, 1, 1, True, 7, 7, (0.04, 0.013)),  # ratio > 3: saturates at +-127
    ("max", 2, 2, 0, True, 9, 8, (1.0, 1.0)), ("avg", 5, 1, 2, False, 9, 8, (1.0, 1.0)),
    ("avg", 2, 2, 0, True, 8, 6, (0.1, 0.1)),  # counts of 4: many half-integer means
    # pool2d_nhwc_i8_k3s<S>'s runs of 4 outputs a thread: rows of 1, 2, 3, 5, 6, 7, 9 outputs (a short last run),
    # a 1-pixel-wide image, pads that leave whole columns outside, the network's shapes (35 -> 35, 147 -> 73)
    ("avg", 3, 1, 1, False, 3, 1, (1.0, 1.0)), ("avg", 3, 1, 1, True, 4, 2, (1.0, 1.0)),
    ("avg", 3, 1, 1, False, 5, 3, (0.05, 0.07)), ("avg", 3, 1, 1, False, 7, 6, (1.0, 1.0)),
    ("avg", 3, 1, 1, True, 5, 7, (0.02, 0.05)), ("avg", 3, 1, 1, False, 11, 9, (1.0, 1.0)),
    ("avg", 3, 1, 0, True, 6, 11, (1.0, 1.0)), ("avg", 3, 1, 2, False, 6, 7, (1.0, 1.0)),
    ("avg", 3, 1, 1, False, 35, 35, (0.05, 0.04)), ("max", 3, 2, 0, True, 17, 17, (1.0, 1.0)),
    ("max", 3, 2, 0, True, 15, 19, (0.05, 0.07)), ("max", 3, 2, 1, True, 9, 12, (1.0, 1.0)),
    ("max", 3, 1, 1, True, 5, 3, (1.0, 1.0)), ("max", 3, 2, 0, True, 3, 3, (1.0, 1.0)),
    ("avg", 3, 2, 1, False, 9, 13, (1.0, 1.0)), ("max", 3, 2, 0, True, 147, 31, (1.0, 1.0)),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: "-".join(map(str, c[:7])) + f"-r{c[7][0] / c[7][1]:.3g}")
def test_pool_i8(mem, case):
    """pool2d_nhwc_i8 on views of wider buffers, bit-exact against pool_int8 then requantize (int8_reference)."""
    kind, kernel, stride, pad, include, h, w, (s_in, s_out) = case
    n, c, before, after = 2, 32, 16, 16
    rng = rng_for("pool i8", *case)
    # small values make many window means half-integers (ties to even); the large ones reach the saturation
    q = np.where(rng.random((n, c, h, w)) < 0.5, rng.integers(-3, 4, (n, c, h, w)),
                 rng.integers(-127, 128, (n, c, h, w))).astype(np.int8)
    ho, wo = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    src = View("x", 0, (n, before + c + after, h, w), before, c)
    dst = View("y", 0, (n, c + 32, ho, wo), 16, c)
    op = PoolOp("pool", src, dst, kind, kernel, stride, pad, include)
    x_ptr = put_i8(mem, q, src.c_total, src.c_offset)
    y_ptr = mem.alloc(math.prod(dst.shape), POISON)
    spec = nhwc_pool_spec(op, 0, "int8", ratio=requant_ratio(s_in, s_out))
    want_kernel = "pool2d_nhwc_i8_k3s1" if kernel == 3 and stride == 1 else "pool2d_nhwc_i8"
    assert spec.kernel == want_kernel and spec.args[0] == src.c_offset and spec.args[1] == dst.c_offset
    mem.launch([LaunchSpec(spec.op, spec.kernel, spec.grid, spec.block,
                           (x_ptr + src.c_offset, y_ptr + dst.c_offset) + spec.args[2:])])
    got = get_i8(mem, y_ptr, dst.shape, dst.c_offset, c)
    layer = arch.Pool("pool", "x", kind, kernel, stride, pad, include)
    pooled = ref.pool_int8(q, layer)
    want = ref.requantize(pooled, s_in, s_out)
    np.testing.assert_array_equal(got, want)
    if kind == "avg" and (kernel % 2 == 0 or (pad and not include)):  # even counts: ties, which round to even
        means = pool2d(q.astype(np.float64), "avg", kernel, stride, pad, include)
        assert (np.abs(means % 1 - 0.5) < 1e-9).any()
    if s_in / s_out > 3:
        assert (np.abs(got) == 127).any()


def test_pool_i8_poison_catches_an_unwritten_piece(mem):
    """The -128 poison finds a launch one block short (a test that cannot fail is a defect)."""
    n, c, h, w = 1, 16, 16, 16
    src, dst = View("x", 0, (n, c, h, w), 0, c), View("y", 0, (n, c, h, w), 0, c)
    op = PoolOp("pool", src, dst, "max", 3, 1, 1, True)
    x_ptr = put_i8(mem, np.zeros((n, c, h, w), np.int8), c, 0)
    y_ptr = mem.alloc(math.prod(dst.shape), POISON)
    spec = nhwc_pool_spec(op, 0, "int8")
    # 16 rows of 4 runs of 4 pixels, a thread a run: 64 threads, one block; launch none of it but half (8 rows)
    assert spec.kernel == "pool2d_nhwc_i8_k3s1" and spec.grid[0] == 1
    mem.launch([LaunchSpec(spec.op, spec.kernel, spec.grid, (32, 1, 1), (x_ptr, y_ptr) + spec.args[2:])])
    with pytest.raises(AssertionError, match="2048 output elements not written"):
        get_i8(mem, y_ptr, dst.shape, 0, c)


@pytest.mark.parametrize("include,h,w", [(True, 9, 8), (False, 9, 8), (False, 1, 3), (True, 17, 17),
                                         (False, 8, 8), (False, 5, 6), (True, 35, 35)])
def test_avg_pool_products_i8_is_the_moved_pools_reference(mem, include, h, w):
    n, c, before = 2, 32, 16
    rng = rng_for("moved pool i8", include, h, w)
    acc = rng.integers(-127 * 127 * 2048, 127 * 127 * 2048, (n, c, h, w)).astype(np.int32)
    acc[:, :8] //= 4096  # small sums too, whose outputs are not all saturated
    scale = (rng.uniform(0.5, 2.0, c) * 1e-4).astype(np.float32)
    bias = rng.normal(0, 0.3, c).astype(np.float32)
    inv = (1 / rng.uniform(0.01, 0.05, c)).astype(np.float32)
    src = View("x", 0, (n, 4 * c, h, w), 0, c)  # a raw product: int32s, 4 bytes a channel
    dst = View("y", 0, (n, before + c + 16, h, w), before, c)
    op = PoolOp("pool", src, dst, "avg", 3, 1, 1, include, bias="conv")
    x_ptr = mem.alloc(acc.nbytes, POISON)
    mem.write(x_ptr, np.ascontiguousarray(acc.transpose(0, 2, 3, 1)))
    y_ptr = mem.alloc(math.prod(dst.shape), POISON)
    epi_ptr = mem.alloc(3 * c * 4, POISON)
    mem.write(epi_ptr, np.concatenate([bias, scale, inv]))
    spec = nhwc_pool_spec(op, 0, "int8", epi_ptr)
    assert spec.kernel == "avg_pool_products_nhwc_i8"
    mem.launch([LaunchSpec(spec.op, spec.kernel, spec.grid, spec.block,
                           (x_ptr, y_ptr + dst.c_offset) + spec.args[2:])])
    got = get_i8(mem, y_ptr, dst.shape, dst.c_offset, c)
    sums, counts = ref.window_sums(acc, arch.Pool("pool", "x", "avg", 3, 1, 1, include))
    y = ref.moved_pool_epilogue(sums, counts, 1.0, scale, bias)
    want = np.clip(np.rint(y * inv.reshape(1, -1, 1, 1)), -127, 127).astype(np.int8)
    np.testing.assert_array_equal(got, want)
    assert (np.abs(sums) > 2**24).any() and (np.abs(got[:, :8]) < 127).any() and (got != 0).any()


def test_global_avg_pool_i8_writes_float32_features(mem):
    n, c, hw, before = 3, 48, 5, 16
    rng = rng_for("gap i8")
    q = rng.integers(-127, 128, (n, c, hw, hw)).astype(np.int8)
    q[0, :16] = np.abs(q[0, :16])  # the network's case: ReLU outputs, no cancellation
    scale = 0.0137
    x_ptr = put_i8(mem, q, before + c, before)
    y_ptr = mem.alloc(4 * n * (c + 16), 0xFF)
    src = View("x", 0, (n, before + c, hw, hw), before, c)
    spec = nhwc_gap_spec(GlobalAvgPoolOp("gap", src, View("f", 0, (n, c, 1, 1), 0, c)), 0, 0, "int8", scale)
    args = dict(zip(("x", "y", "batch", "channels", "hw", "x_cstride", "y_bstride", "scale"), spec.args))
    assert args["x"] == before and args["hw"] == hw * hw and args["x_cstride"] == before + c
    mem.launch([LaunchSpec(spec.op, spec.kernel, spec.grid, spec.block,
                           (x_ptr + before, y_ptr, n, c, hw * hw, before + c, c + 16, args["scale"]))])
    got = mem.read(y_ptr, (n, c + 16), np.float32)
    assert np.isnan(got[:, c:]).all(), "wrote past each row's features"
    got = got[:, :c].astype(np.float64)
    exact = q.astype(np.float64).sum(axis=(2, 3)) * np.float64(np.float32(scale)) / (hw * hw)
    np.testing.assert_allclose(got, exact, rtol=2.001 * 2.0 ** -24, atol=0)  # two float32 roundings
    want = global_avg_pool(ref.dequantize(q, scale)).reshape(n, c).astype(np.float64)
    mean_abs = np.abs(ref.dequantize(q, scale)).astype(np.float64).mean(axis=(2, 3))
    assert (np.abs(got - want) <= 1e-6 * mean_abs).all()


INPUT_CASES = [  # (n, cin, h, w, cout, kernel, stride, pad, y channels before, y channels after)
    (2, 3, 17, 15, 32, (3, 3), 2, (0, 0), 0, 0),  # the network's first conv, y a buffer of its own
    (1, 3, 41, 37, 32, (3, 3), 2, (0, 0), 0, 0),  # two blocks, the second partly past the last pixel
    (1, 3, 9, 11, 48, (5, 5), 1, (2, 2), 16, 16),  # windows in the padding; a second block of 16 channels
    (3, 4, 6, 7, 16, (1, 3), 1, (0, 1), 0, 16),  # fewer channels than one block
]


def kernel_order_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, pad: tuple[int, int],
                           inv_out: float) -> np.ndarray:
    """conv_input_nhwc_i8's arithmetic in NumPy: acc = fmaf(x, w, acc) over k = (c, r, s) in order (0 for a tap in
    the padding), acc + bias, ReLU, quantize at inv_out: (N, Cout, Ho, Wo) int8."""
    n, cin, h, wd = x.shape
    cout, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    ho, wo = win.shape[2:4]
    cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, cin * kh * kw)  # k = (c*KH + r)*KW + s
    wk = w.reshape(cout, -1).T
    acc = np.zeros((n * ho * wo, cout), np.float32)
    for k in range(cols.shape[1]):
        acc = fma32(np.broadcast_to(cols[:, k:k + 1], acc.shape), np.broadcast_to(wk[k], acc.shape), acc)
    v = np.maximum(acc + b, np.float32(0))
    q = np.clip(np.rint(v * np.float32(inv_out)), -127, 127).astype(np.int8)
    return q.reshape(n, ho, wo, cout).transpose(0, 3, 1, 2)


def input_op(n, cin, h, w, cout, kernel, stride, pad, before, after) -> ConvOp:
    ho, wo = (h + 2 * pad[0] - kernel[0]) // stride + 1, (w + 2 * pad[1] - kernel[1]) // stride + 1
    return ConvOp("first", View("x", 0, (n, cin, h, w), 0, cin),
                  View("y", 0, (n, before + cout + after, ho, wo), before, cout), kernel, stride, pad)


# Every case on the FMA kernel, and on the tensor-core one where input_tile picks it (K <= 32: the first three).
INPUT_RUNS = [(case, tile) for case in INPUT_CASES for tile in dict.fromkeys((INPUT_TILE,
                                                                              input_tile(input_op(*case), "int8")))]
# The tensor-core kernel's fp16 operands against the float32 reference: one level on up to this fraction of the
# outputs. Measured with fp16 operands (float64 sums, as exact as the kernel's fp32 ones here) on image-like inputs
# (synthetic.image_like_batch) and calibrated weights: 2.0e-3 at 75x75 (16 images; 3.8e-3 the worst single image of
# 57), 2.1e-3 at 299x299 (8 images), never more than one level; random normal inputs here: bound with room.
FP16_STEM_OFF = 1e-2


@pytest.mark.parametrize("case,tile", INPUT_RUNS,
                         ids=[f"{'x'.join(map(str, c[:5]))}-{t.prefix}" for c, t in INPUT_RUNS])
def test_input_conv_i8(mem, case, tile):
    """conv_input_nhwc_i8 (FMA): exactly its own sum order's arithmetic, within one level of the float32 reference
    on < 1e-3 of the outputs. conv_input_mma_nhwc_i8 (fp16 operands, fp32 sums): within one level of the quantized
    ideal conv of the fp16-rounded operands (sums in float64) on < 1e-3 of the outputs (fp32 sums in another
    order), and within one level of the float32 reference on < FP16_STEM_OFF."""
    n, cin, h, w, cout, kernel, stride, pad, before, after = case
    rng = rng_for("input i8", *case)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    w_ = (rng.standard_normal((cout, cin, *kernel)) / np.sqrt(cin * kernel[0] * kernel[1])).astype(np.float32)
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    float_out = conv2d_bias_relu(x, w_, b, stride, pad)  # the reference's float32 layer
    scale = float(np.float32(0.8 * float_out.max() / 127))  # some outputs saturate
    ho, wo = float_out.shape[2:]
    op = input_op(*case)
    assert op.dst.dims[2:] == (ho, wo)
    wt = direct_weights(w_, tile)
    ptrs = []
    for a in (x, wt, b):
        ptrs.append(mem.alloc(a.nbytes, 0xFF))
        mem.write(ptrs[-1], a)
    y_ptr = mem.alloc(math.prod(op.dst.shape), POISON)
    cfg = ConvConfig(tile, 1, cin * kernel[0] * kernel[1], 0.0)
    specs = input_conv_specs(op, cfg, ptrs[0], cin, y_ptr + before, ptrs[1], ptrs[2], "int8", 1, inv_scale(scale))
    assert [s.kernel for s in specs] == ["conv_input_nhwc_i8" if tile == INPUT_TILE else "conv_input_mma_nhwc_i8"]
    mem.launch([specs[0]])
    got = get_i8(mem, y_ptr, op.dst.shape, before, cout)
    diff = np.abs(got.astype(np.int32) - ref.quantize(float_out, scale))
    if tile == INPUT_TILE:
        np.testing.assert_array_equal(got, kernel_order_reference(x, w_, b, stride, pad, inv_scale(scale)))
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (diff.max(), (diff > 0).sum())
    else:
        f16 = [a.astype(np.float16).astype(np.float64) for a in (x, w_)]
        ideal = conv2d_bias_relu(*f16, b.astype(np.float64), stride, pad).astype(np.float32)
        own = np.abs(got.astype(np.int32) - np.clip(np.rint(ideal * np.float32(inv_scale(scale))), -127, 127))
        assert own.max() <= 1 and (own > 0).mean() < 1e-3, (own.max(), (own > 0).sum())
        assert diff.max() <= 1 and (diff > 0).mean() < FP16_STEM_OFF, (diff.max(), (diff > 0).mean())
    assert (got == 127).any() and (got == 0).any() and ((got > 0) & (got < 127)).mean() > 0.2
