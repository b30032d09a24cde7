"""The NumPy primitives against naive loop implementations written here from the definitions, in float64.

The loops walk every output position and every kernel tap with an explicit bounds check (a tap outside the input
is padding), so they share no code and no indexing trick with the backend. Outputs are written into NaN-poisoned
channel slices of a wider buffer: an element the backend forgets to write stays NaN, and a write outside the
slice shows up in the guard channels around it.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from inception_engine.backends import numpy_backend, numpy_primitives
from inception_engine.backends.numpy_backend import split_work
from inception_engine.backends.numpy_primitives import (conv2d_bias_relu, fc, global_avg_pool, pool2d,
                                                        winograd_matrices, winograd_tile)


def naive_conv(x, w, b, stride, pad, relu=True):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    ho, wo = (h + 2 * pad[0] - kh) // stride + 1, (wd + 2 * pad[1] - kw) // stride + 1
    y = np.zeros((n, o, ho, wo))
    for oh in range(ho):
        for ow in range(wo):
            acc = np.tile(b.astype(np.float64), (n, 1))
            for i in range(kh):
                for j in range(kw):
                    ih, iw = oh * stride + i - pad[0], ow * stride + j - pad[1]
                    if 0 <= ih < h and 0 <= iw < wd:
                        acc += x[:, :, ih, iw].astype(np.float64) @ w[:, :, i, j].T.astype(np.float64)
            y[:, :, oh, ow] = acc
    return np.maximum(y, 0) if relu else y


def naive_pool(x, kind, k, stride, pad, count_include_pad):
    n, c, h, w = x.shape
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    y = np.zeros((n, c, ho, wo))
    for oh in range(ho):
        for ow in range(wo):
            taps = [x[:, :, ih, iw] for ih in range(oh * stride - pad, oh * stride - pad + k)
                    for iw in range(ow * stride - pad, ow * stride - pad + k) if 0 <= ih < h and 0 <= iw < w]
            if kind == "max":
                y[:, :, oh, ow] = np.max(taps, axis=0)
            else:
                y[:, :, oh, ow] = np.sum(taps, axis=0) / (k * k if count_include_pad else len(taps))
    return y


def poisoned_slice(rng, shape, dtype, guard=2):
    """A NaN-filled (N, guard + C + guard, H, W) buffer and its middle channel slice, the destination."""
    n, c, h, w = shape
    buf = np.full((n, c + 2 * guard, h, w), np.nan, dtype)
    return buf, buf[:, guard:guard + c]


def assert_guards_untouched(buf, guard=2):
    assert np.isnan(buf[:, :guard]).all() and np.isnan(buf[:, -guard:]).all(), "wrote outside its channel slice"


def rel_err(a, b):
    return np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30)


CONV_CASES = [
    # (batch, C, H, W, O, (kh, kw), stride, (ph, pw))
    (1, 5, 11, 9, 7, (1, 1), 1, (0, 0)),
    (3, 5, 11, 9, 7, (1, 1), 1, (0, 0)),
    (3, 4, 10, 13, 6, (1, 1), 2, (0, 0)),
    (1, 3, 13, 11, 8, (3, 3), 1, (0, 0)),
    (3, 3, 13, 11, 8, (3, 3), 1, (1, 1)),
    (1, 6, 12, 15, 5, (3, 3), 2, (0, 0)),
    (3, 6, 15, 12, 5, (3, 3), 2, (1, 1)),
    (1, 4, 9, 10, 6, (5, 5), 1, (2, 2)),
    (3, 4, 11, 9, 6, (5, 5), 2, (3, 3)),
    (1, 7, 9, 11, 5, (1, 7), 1, (0, 3)),
    (3, 7, 11, 9, 5, (7, 1), 1, (3, 0)),
    (3, 5, 8, 10, 4, (1, 7), 2, (0, 3)),
    (1, 6, 7, 9, 9, (1, 3), 1, (0, 1)),
    (3, 6, 9, 7, 9, (3, 1), 1, (1, 0)),
    (1, 2, 6, 6, 3, (3, 1), 2, (2, 1)),
    (3, 3, 7, 8, 4, (5, 5), 1, (0, 0)),
    # Maps of 16 and more get 4x4 Winograd tiles; sizes that are not a multiple of the tile crop the last one.
    (1, 4, 19, 17, 6, (3, 3), 1, (1, 1)),
    (2, 3, 16, 21, 5, (3, 3), 1, (0, 0)),
    (1, 3, 20, 18, 4, (5, 5), 1, (2, 2)),
    (1, 5, 17, 17, 4, (1, 7), 1, (0, 3)),
]


@pytest.mark.parametrize("winograd", [False, True], ids=["direct", "winograd"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "n{}_c{}_{}x{}_o{}_k{}x{}_s{}_p{}x{}".format(
    *c[:5], *c[5], c[6], *c[7]))
def test_conv_matches_naive_loops(case, dtype, winograd):
    n, c, h, w, o, kernel, stride, pad = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((o, c, *kernel)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    ref = naive_conv(x, wt, b, stride, pad)
    assert (ref > 0).any() and (ref == 0).any(), "test data should exercise both sides of the ReLU"
    buf, out = poisoned_slice(rng, ref.shape, dtype)
    got = conv2d_bias_relu(x, wt, b, stride, pad, out=out, winograd=winograd)
    assert got is out
    assert not np.isnan(out).any(), "some outputs were never written"
    assert_guards_untouched(buf)
    assert rel_err(out, ref) < (1e-12 if dtype == np.float64 else 1e-5)
    fresh = conv2d_bias_relu(x, wt, b, stride, pad, winograd=winograd)  # without out=: a new array, same values
    assert fresh.shape == ref.shape and fresh.dtype == dtype
    np.testing.assert_array_equal(fresh, out)


@pytest.mark.parametrize("winograd", [False, True], ids=["direct", "winograd"])
@pytest.mark.parametrize("case", [c for c in CONV_CASES if c[5] != (1, 1) or c[6] != 1][::2])
def test_conv_split_into_row_blocks(case, winograd, monkeypatch):
    """Large layers run in blocks of output rows; force small, uneven blocks (about 2 rows or 1 tile row a block)
    on small layers."""
    n, c, h, w, o, kernel, stride, pad = case
    monkeypatch.setattr(numpy_primitives, "BLOCK_ELEMS", 2 * (kernel[0] * kernel[1] * c + 1) * w)
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()) + 1)
    x, wt, b = rng.standard_normal((n, c, h, w)), rng.standard_normal((o, c, *kernel)), rng.standard_normal(o)
    ref = naive_conv(x, wt, b, stride, pad)
    buf, out = poisoned_slice(rng, ref.shape, np.float64)
    conv2d_bias_relu(x, wt, b, stride, pad, out=out, winograd=winograd)
    assert not np.isnan(out).any(), "some outputs were never written"
    assert_guards_untouched(buf)
    assert rel_err(out, ref) < 1e-12


@pytest.mark.parametrize("m,r", [(2, 3), (4, 3), (6, 3), (2, 5), (4, 5), (2, 7), (3, 7), (4, 7)])
def test_winograd_matrices_compute_the_correlation(m, r):
    at, g, bt = winograd_matrices(m, r)
    n = m + r - 1
    assert at.shape == (m, n) and g.shape == (n, r) and bt.shape == (n, n)
    rng = np.random.default_rng(m * 10 + r)
    for _ in range(3):
        filt, d = rng.standard_normal(r), rng.standard_normal(n)
        ref = [sum(filt[k] * d[i + k] for k in range(r)) for i in range(m)]
        np.testing.assert_allclose(at @ ((g @ filt) * (bt @ d)), ref, rtol=0, atol=1e-12)


def test_winograd_tiles_used_by_the_network():
    assert winograd_tile((3, 3), (35, 35)) == (4, 4)
    assert winograd_tile((3, 3), (8, 8)) == (2, 2)
    assert winograd_tile((1, 7), (17, 17)) == (1, 3) and winograd_tile((7, 1), (17, 17)) == (3, 1)
    assert winograd_tile((5, 5), (35, 35)) == (4, 4)
    assert winograd_tile((1, 3), (8, 8)) == (1, 2)


@pytest.mark.parametrize("winograd", [False, True], ids=["direct", "winograd"])
def test_conv_without_relu_keeps_negatives(winograd):
    rng = np.random.default_rng(7)
    x, wt, b = rng.standard_normal((2, 3, 6, 7)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    ref = naive_conv(x, wt, b, 1, (1, 1), relu=False)
    got = conv2d_bias_relu(x, wt, b, 1, (1, 1), relu=False, winograd=winograd)
    assert (got < 0).any()
    assert rel_err(got, ref) < 1e-12


def test_conv_input_is_a_channel_slice():
    """Inside the network a conv reads a channel slice of a concat buffer; that must not change the result."""
    rng = np.random.default_rng(8)
    big = rng.standard_normal((3, 10, 9, 8))
    x = big[:, 3:7]
    b = rng.standard_normal(5)
    for kernel_pad in [((1, 1), (0, 0)), ((3, 3), (1, 1))]:
        wk = rng.standard_normal((5, 4, *kernel_pad[0]))
        assert rel_err(conv2d_bias_relu(x, wk, b, 1, kernel_pad[1]), naive_conv(x, wk, b, 1, kernel_pad[1])) < 1e-12


def test_conv_repeated_calls_do_not_leak_state():
    """Padding scratch is reused; a second input must not see the first one's values."""
    rng = np.random.default_rng(9)
    wt, b = rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    for _ in range(2):
        x = rng.standard_normal((2, 3, 7, 7))
        assert rel_err(conv2d_bias_relu(x, wt, b, 1, (2, 2)), naive_conv(x, wt, b, 1, (2, 2))) < 1e-12


POOL_CASES = [
    # (kind, kernel, stride, pad, count_include_pad, batch, C, H, W)
    ("max", 3, 2, 0, True, 1, 4, 11, 9),
    ("max", 3, 2, 0, True, 3, 4, 10, 13),
    ("max", 3, 1, 1, True, 3, 5, 7, 8),
    ("max", 2, 2, 0, True, 1, 3, 8, 9),
    ("avg", 3, 1, 1, True, 1, 5, 9, 11),
    ("avg", 3, 1, 1, False, 1, 5, 9, 11),
    ("avg", 3, 1, 1, True, 3, 4, 8, 7),
    ("avg", 3, 1, 1, False, 3, 4, 8, 7),
    ("avg", 3, 2, 1, False, 3, 4, 9, 10),
    ("avg", 5, 2, 2, False, 1, 2, 11, 9),
    ("avg", 3, 2, 0, True, 1, 3, 9, 9),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: "{}{}_s{}_p{}_cip{}_n{}_c{}_{}x{}".format(*c))
def test_pool_matches_naive_loops(case, dtype):
    kind, k, stride, pad, cip, n, c, h, w = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    ref = naive_pool(x, kind, k, stride, pad, cip)
    buf, out = poisoned_slice(rng, ref.shape, dtype)
    got = pool2d(x, kind, k, stride, pad, cip, out=out)
    assert got is out
    assert not np.isnan(out).any(), "some outputs were never written"
    assert_guards_untouched(buf)
    assert rel_err(out, ref) < (1e-12 if dtype == np.float64 else 1e-6)
    np.testing.assert_array_equal(pool2d(x, kind, k, stride, pad, cip), out)


def test_avg_pool_count_include_pad_differs_at_borders_only():
    """Guards against the two divisors being swapped or equal: they must differ on the border, agree inside."""
    x = np.random.default_rng(10).random((1, 2, 6, 6)) + 1.0
    inc, exc = pool2d(x, "avg", 3, 1, 1, True), pool2d(x, "avg", 3, 1, 1, False)
    np.testing.assert_allclose(inc[..., 1:-1, 1:-1], exc[..., 1:-1, 1:-1], rtol=1e-14)
    assert (inc[..., 0, :] < exc[..., 0, :]).all() and (inc[..., :, -1] < exc[..., :, -1]).all()


def test_pool_rejects_unknown_kind():
    with pytest.raises(ValueError, match="max' or 'avg"):
        pool2d(np.zeros((1, 1, 4, 4)), "min", 3, 1)


@pytest.mark.parametrize("shape", [(1, 7, 5, 3), (3, 11, 8, 8), (2, 4, 1, 1)])
def test_global_avg_pool_matches_loops(shape):
    x = np.random.default_rng(11).standard_normal(shape)
    ref = np.zeros((shape[0], shape[1], 1, 1))
    for n in range(shape[0]):
        for c in range(shape[1]):
            ref[n, c, 0, 0] = sum(x[n, c, i, j] for i in range(shape[2]) for j in range(shape[3])) / (
                shape[2] * shape[3])
    got = global_avg_pool(x)
    assert got.shape == ref.shape
    assert rel_err(got, ref) < 1e-13


@pytest.mark.parametrize("n", [1, 3])
def test_fc_matches_loops(n):
    rng = np.random.default_rng(12)
    x, w, b = rng.standard_normal((n, 13)), rng.standard_normal((6, 13)), rng.standard_normal(6)
    ref = np.array([[b[o] + sum(x[i, k] * w[o, k] for k in range(13)) for o in range(6)] for i in range(n)])
    assert rel_err(fc(x, w, b), ref) < 1e-13


@pytest.mark.parametrize("images,rows,per_row,channels,parts", [
    (1, 147, 147, 64, 2), (3, 17, 17, 192, 2), (3, 9, 9, 96, 4), (8, 4, 4, 384, 3), (1, 4, 4, 384, 2),
    (1, 17, 17, 20, 2), (2, 1, 1, 1000, 3), (1, 35, 35, 64, 1)])
def test_split_work_covers_every_output_once(images, rows, per_row, channels, parts):
    pieces = split_work(images, rows, per_row, channels, parts, parts)
    assert 1 <= len(pieces) <= parts
    covered = np.zeros((channels, images, rows), int)
    for channel_slice, spans in pieces:
        for image, span_rows in spans:
            covered[channel_slice, image, span_rows.start:span_rows.stop] += 1
    assert (covered == 1).all()
    if len(pieces) > 1 and pieces[0][0] == slice(0, channels):  # cut along images and rows: balanced
        sizes = [sum(len(r) for _, r in spans) for _, spans in pieces]
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("winograd", [False, True], ids=["direct", "winograd"])
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("case", [c for c in CONV_CASES if c[5] != (1, 1)][1::2] + [CONV_CASES[1]])
def test_conv_parts_as_the_backend_splits_them(case, parts, winograd, monkeypatch):
    """Each part reads only its own input rows (into its own padding buffer); together they write every output."""
    n, c, h, w, o, kernel, stride, pad = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()) + parts)
    x, wt, b = rng.standard_normal((n, c, h, w)), rng.standard_normal((o, c, *kernel)), rng.standard_normal(o)
    ref = naive_conv(x, wt, b, stride, pad)
    buf, out = poisoned_slice(rng, ref.shape, np.float64)
    rows, per_row = numpy_primitives.conv_row_units(kernel, stride, pad, (h, w), winograd)
    monkeypatch.setattr(numpy_backend, "MIN_PART_OUTPUTS", 1)  # small test layers: still cut along rows
    for channels, spans in split_work(n, rows, per_row, o, parts, parts):
        scratch = numpy_primitives.Scratch(np.dtype(np.float64))
        conv = numpy_primitives.prepare_conv(wt[channels], b[channels], x.shape, stride, pad, True, winograd,
                                             scratch, spans)
        conv.run(x, out[:, channels], scratch)
    assert not np.isnan(out).any(), "some outputs were never written"
    assert_guards_untouched(buf)
    assert rel_err(out, ref) < 1e-12


def test_split_work_weighs_repeated_weights_against_repeated_input():
    def kind(pieces):
        return ("rows" if pieces[0][0] == slice(0, 64) and len(pieces) > 1 else "channels", len(pieces))
    assert kind(split_work(1, 40, 40, 64, 4, 2, weights=10, inputs=10_000)) == ("rows", 4)  # weights cheap
    assert kind(split_work(1, 40, 40, 64, 4, 2, weights=5_000, inputs=10_000)) == ("rows", 2)
    assert kind(split_work(1, 40, 40, 64, 4, 2, weights=50_000, inputs=10_000)) == ("channels", 2)
    assert kind(split_work(1, 4, 4, 64, 4, 2, weights=10, inputs=10_000)) == ("channels", 2)  # pieces too small
