"""The NumPy code of the CPU backend (numpy_backend.py): convolution, pools and classifier, in the dtype of their
input (float64 for the reference every other backend is checked against, float32 for the CPU path where its C
kernels are unavailable). It convolves in two ways, both ending in BLAS matrix products that write straight into the
destination view (a channel slice of a concat buffer is contiguous per image, so the concat is written in place):

* direct: im2col + one GEMM (1x1 stride-1 convolutions skip im2col). The float64 reference always uses it.
* Winograd (float32, stride-1 convolutions with a kernel wider than 1): fewer multiplies for the same result,
  see ``_WinogradConv``. It exists because on the CI machine NumPy's OpenBLAS is pinned to its AVX2 kernels
  (dev/performance-log.md, "CPU path (NumPy)") and the direct GEMMs alone took twice onnxruntime's whole forward.

Each conv and pool is prepared once (``prepare_conv``, ``prepare_pool``: weights reshaped or transformed, work memory
sized) and then only copies and multiplies; ``conv2d_bias_relu`` and ``pool2d`` prepare and run one at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from .. import arch


# Work memory of one conv is split into blocks of output rows of at most about this many elements (4 MB in
# float32), so that what im2col or a transform writes is still in cache when the next product reads it.
BLOCK_ELEMS = 1 << 20


def out_size(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Scratch:
    """Work memory for ops that run one after another. ``take(kind, elems)`` lends the start of one flat buffer
    per kind (its contents are garbage and belong to the caller until the next take of that kind), growing it if
    needed; ``reserve`` sizes it ahead. ``zeroed(key, shape)`` lends a buffer that starts as zeros and is only ever
    shared under the same key: convs with the same padded shape write only its interior, so the border stays 0."""

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.buffers: dict[str, np.ndarray] = {}

    def reserve(self, kind: str, elems: int) -> None:
        if elems > self.buffers.get(kind, np.empty(0)).size:
            self.buffers[kind] = np.empty(elems, self.dtype)

    def take(self, kind: str, elems: int) -> np.ndarray:
        self.reserve(kind, elems)
        return self.buffers[kind][:elems]

    def zeroed(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        if key not in self.buffers:
            self.buffers[key] = np.zeros(shape, self.dtype)
        return self.buffers[key]


@dataclass
class Keyed:
    """A Scratch's zeroed buffers under a key prefix: parts of one conv that may run at once get their own."""

    scratch: Scratch
    prefix: str

    def zeroed(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        return self.scratch.zeroed(self.prefix + key, shape)


def _im2col(xp: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int], ho: int, wo: int,
            cols: np.ndarray) -> None:
    """xp (C, Hp, Wp), already padded -> cols (kh * kw * C, ho * wo), rows in (ki, kj, c) order: each kernel tap
    is one block copy of a shifted, strided input window."""
    (kh, kw), (sh, sw) = kernel, stride
    c = xp.shape[0]
    blocks = cols.reshape(kh, kw, c, ho, wo)
    for i in range(kh):
        for j in range(kw):
            blocks[i, j] = xp[:, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]


@dataclass
class _InputRows:
    """The input rows one conv (or one part of a conv) reads, in padded coordinates [start, stop), for any image.
    With padding they are copied into a private zero buffer whose padding is never written; without padding
    (and rows and columns within the image) the image is read in place."""

    buffer: np.ndarray | None  # (C, stop - start, padded width)
    start: int
    image_rows: slice  # image rows inside [start, stop)
    buffer_rows: slice  # where they go in the buffer
    pad_w: int

    def read(self, image: np.ndarray) -> tuple[np.ndarray, int]:
        """The array to take input rows from, and the padded row its row 0 stands for."""
        if self.buffer is None:
            return image, 0
        self.buffer[:, self.buffer_rows, self.pad_w:self.pad_w + image.shape[2]] = image[:, self.image_rows]
        return self.buffer, self.start


def _input_rows(padding: Scratch | Keyed, c: int, h: int, w: int, pad: tuple[int, int], start: int, stop: int,
                padded_w: int) -> _InputRows:
    ph, pw = pad
    inside = slice(max(0, start - ph), min(h, stop - ph))
    if ph == pw == 0 and stop <= h and padded_w <= w:
        return _InputRows(None, 0, inside, inside, 0)
    key = f"pad:{c}x{h}x{w}+{ph},{pw}:{start}-{stop}x{padded_w}"  # same key, same interior: borders stay 0
    buffer = padding.zeroed(key, (c, stop - start, padded_w))
    return _InputRows(buffer, start, inside, slice(inside.start + ph - start, inside.stop + ph - start), pw)


def conv_row_units(kernel: tuple[int, int], stride: int, pad: tuple[int, int], in_hw: tuple[int, int],
                   winograd: bool) -> tuple[int, int]:
    """How a conv's output divides into rows of work: (rows, outputs per row). Output rows for im2col, rows of
    tiles for Winograd. Parts of a conv computed on separate threads take contiguous ranges of these rows."""
    ho, wo = (out_size(size, k, stride, p) for size, k, p in zip(in_hw, kernel, pad))
    if not uses_winograd(kernel, stride, winograd):
        return ho, wo
    mh, mw = winograd_tile(kernel, (ho, wo))
    return ceil_div(ho, mh), ceil_div(wo, mw)


def uses_winograd(kernel: tuple[int, int], stride: int, winograd: bool) -> bool:
    return winograd and stride == 1 and max(kernel) > 1


@dataclass
class _Span:
    """Rows ``rows`` (in conv_row_units) of image ``image``: the part of a conv's output one thread computes is a
    list of spans. ``inputs`` are the input rows they read."""

    image: int
    rows: range
    inputs: _InputRows


def _spans(padding: Scratch | Keyed, in_shape: tuple[int, ...], pad: tuple[int, int],
           spans: list[tuple[int, range]], input_rows: Callable[[range], tuple[int, int]],
           padded_w: int) -> list[_Span]:
    _, c, h, w = in_shape
    return [_Span(i, rows, _input_rows(padding, c, h, w, pad, *input_rows(rows), padded_w)) for i, rows in spans]


@dataclass
class _DirectConv:
    """relu(conv(x) + b) by im2col + GEMM over the output ``spans``. The bias rides in the
    GEMM: the weights get it as an extra column and each im2col block an extra row of ones, which saves a pass
    over the output. A 1x1 stride-1 conv needs no im2col: its input rows are the column matrix."""

    w2d: np.ndarray  # (O, C) when pointwise; else (O, kh * kw * C + 1), bias last
    bias: np.ndarray  # (O, 1), used when pointwise
    kernel: tuple[int, int]
    stride: int
    relu: bool
    pointwise: bool
    spans: list[_Span]
    block_rows: int  # output rows per im2col block
    work: dict[str, int] = field(default_factory=dict)  # scratch elements needed per kind

    def run(self, x: np.ndarray, out: np.ndarray, scratch: Scratch) -> None:
        c, h, w = x.shape[1:]
        o, ho, wo = out.shape[1:]
        kh, s = self.kernel[0], self.stride
        k = self.w2d.shape[1] - 1
        for span in self.spans:
            out2d = out[span.image].reshape(o, ho * wo)
            if self.pointwise:
                cols = slice(span.rows.start * wo, span.rows.stop * wo)
                block = out2d[:, cols]
                np.matmul(self.w2d, x[span.image].reshape(c, h * w)[:, cols], out=block)
                block += self.bias
                if self.relu:
                    np.maximum(block, 0, out=block)
                continue
            xp, base = span.inputs.read(x[span.image])
            for r0 in range(span.rows.start, span.rows.stop, self.block_rows):
                rows = min(self.block_rows, span.rows.stop - r0)
                cols = scratch.take("cols", (k + 1) * rows * wo).reshape(k + 1, rows * wo)
                top = r0 * s - base
                _im2col(xp[:, top:top + (rows - 1) * s + kh], self.kernel, (s, s), rows, wo, cols[:k])
                cols[k] = 1
                block = out2d[:, r0 * wo:(r0 + rows) * wo]
                np.matmul(self.w2d, cols, out=block)
                if self.relu:
                    np.maximum(block, 0, out=block)


def _prepare_direct(w: np.ndarray, b: np.ndarray, in_shape: tuple[int, ...], stride: int, pad: tuple[int, int],
                    relu: bool, padding: Scratch | Keyed, spans: list[tuple[int, range]]) -> _DirectConv:
    _, c, h, wd = in_shape
    o, _, kh, kw = w.shape
    (ph, pw), ho, wo = pad, out_size(h, kh, stride, pad[0]), out_size(wd, kw, stride, pad[1])
    if kh == kw == 1 and stride == 1 and ph == pw == 0:
        no_copy = _InputRows(None, 0, slice(0), slice(0), 0)
        return _DirectConv(w.reshape(o, c), b.reshape(o, 1), (1, 1), 1, relu, True,
                           [_Span(i, rows, no_copy) for i, rows in spans], ho)
    # (O, C, kh, kw) -> (O, kh, kw, C): the row order of _im2col.
    w2d = np.concatenate([w.transpose(0, 2, 3, 1).reshape(o, -1), b.reshape(o, 1)], axis=1)
    k = w2d.shape[1]
    block = ceil_div(ho, ceil_div(k * ho * wo, BLOCK_ELEMS))
    parts = _spans(padding, in_shape, pad, spans, lambda r: (r.start * stride, (r.stop - 1) * stride + kh),
                   wd + 2 * pw)
    return _DirectConv(w2d, b.reshape(o, 1), (kh, kw), stride, relu, False, parts, block, {"cols": k * block * wo})


# Interpolation points for the Winograd matrices, in the order they are used. F(4, 3) takes the first five:
# 0, 1, -1, 1/2, -2 rather than Lavin & Gray's 0, +-1, +-2 (Barabasz et al. 2020, "Error analysis and improving
# the accuracy of Winograd convolution for deep neural networks", recommend mixing 2 with 1/2); measured here on
# Inception's 3x3 layers in float32: relative error 1.0e-6 against 1.5e-6 (direct im2col: 2e-7).
WINOGRAD_POINTS = (0, 1, -1, Fraction(1, 2), -2, Fraction(-1, 2), 2, 3, -3)


def _poly_mul(a: list[Fraction], b: list[Fraction]) -> list[Fraction]:
    out = [Fraction(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


@functools.cache
def winograd_matrices(m: int, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """F(m, r): AT (m, n), G (n, r), BT (n, n), n = m + r - 1, with ``AT @ ((G @ g) * (BT @ d))`` equal to the
    correlation ``y[i] = sum_k g[k] * d[i + k]`` for i < m. Exact (rational) construction, returned as float64.

    Toom-Cook: a product of polynomials of degrees r - 1 and m - 1 is fixed by its values at n - 1 points plus
    its leading coefficient (the point at infinity). For the polynomial product s = C @ ((Vr @ g) * (Vm @ e)),
    with Vk the (n, k) evaluation matrices and C the interpolation matrix; correlation is the transpose of that
    product, so AT = Vm.T, G = Vr, BT = C.T (Lavin & Gray 2016, section 4 and its reference to Winograd 1980).
    """
    n = m + r - 1
    pts = [Fraction(p) for p in WINOGRAD_POINTS[:n - 1]]
    if len(pts) != n - 1:
        raise ValueError(f"F({m}, {r}) needs {n - 1} interpolation points, only {len(WINOGRAD_POINTS)} are defined")

    def evaluation(k: int) -> list[list[Fraction]]:
        return [[p ** j for j in range(k)] for p in pts] + [[Fraction(int(j == k - 1)) for j in range(k)]]

    interp = [[Fraction(0)] * n for _ in range(n)]  # column j: coefficients of the j-th basis polynomial
    for j, a in enumerate(pts):  # Lagrange basis on the finite points
        poly = [Fraction(1)]
        for q in pts:
            if q != a:
                poly = _poly_mul(poly, [-q / (a - q), 1 / (a - q)])
        for i, coef in enumerate(poly):
            interp[i][j] = coef
    poly = [Fraction(1)]
    for q in pts:  # the leading coefficient multiplies prod(x - a_j), which vanishes at every finite point
        poly = _poly_mul(poly, [-q, Fraction(1)])
    for i, coef in enumerate(poly):
        interp[i][n - 1] = coef
    as_array = lambda rows: np.array([[float(v) for v in row] for row in rows])  # noqa: E731
    return as_array(evaluation(m)).T.copy(), as_array(evaluation(r)), as_array(interp).T.copy()


def winograd_tile(kernel: tuple[int, int], out_hw: tuple[int, int]) -> tuple[int, int]:
    """Output tile (mh, mw) Winograd uses for a stride-1 conv: 1 along an axis the kernel does not extend in.

    4 outputs a tile for 3 and 5 wide kernels (2 on maps under 16 wide, where 4x4 tiles leave the GEMMs too few
    columns), 3 for 7 wide ones (17 = 6 tiles of 3, less one). Larger tiles cost float32 accuracy: on a 1x7 layer
    of Mixed_6c's shape the relative error is 2.1e-7 direct, 9.4e-7 with F(2, 7), 2.9e-6 with F(3, 7), 5.6e-6
    with F(4, 7); on the synthetic model's logits (four images, worst) 4.4e-5 with F(2, 7), 5.1e-5 with F(3, 7),
    7.4e-5 with F(4, 7), against a limit of 1e-4. F(3, 7) is 4.5 ms faster than F(2, 7) on one core, F(4, 7) no
    faster than F(3, 7)."""
    def axis(r: int, size: int) -> int:
        if r == 1:
            return 1
        if r == 7:
            return 3
        return 2 if size < 16 else 4
    return axis(kernel[0], out_hw[0]), axis(kernel[1], out_hw[1])


@dataclass
class _WinogradConv:
    """relu(conv(x) + b) for stride 1 by Winograd's minimal filtering, F(mh x mw, kh x kw), for images ``images``
    and rows of tiles ``rows``.

    The input is cut into overlapping n x n tiles (n = m + k - 1) at stride m, each giving an m x m output
    tile. Per tile: V = B d, M = U (.) V elementwise over the n x n positions and summed over input channels, so
    for each position one GEMM over channels, Y = A M. With the tiles of all channels side by side every step is
    one BLAS call: im2col at stride m gathers the tiles, B (as its two 1-D factors) and A (the Kronecker product
    of the 1-D transforms, plus a column that adds the bias) multiply all of them at once, and the nn
    position-wise GEMMs are one batched matmul. U (the weights
    transformed by G) is computed once, in float64. The GEMMs do (m + k - 1)^2 / (m^2 k^2) of the direct
    multiplies: 0.44x for F(4x4, 3x3), 0.57x for F(2, 7).
    """

    u: np.ndarray  # (nn, O, C)
    bt_h: np.ndarray | None  # (nh, nh) input transform along H, None for a 1-wide kernel there
    bt_w: np.ndarray | None  # (nw, nw) along W
    a_t: np.ndarray  # (mm, nn + 1): the output transform, and a column of ones that adds the bias row
    bias: np.ndarray  # (O, 1)
    kernel: tuple[int, int]
    tile: tuple[int, int]
    relu: bool
    spans: list[_Span]  # in rows of tiles
    block_rows: int  # rows of tiles per block
    work: dict[str, int] = field(default_factory=dict)

    def run(self, x: np.ndarray, out: np.ndarray, scratch: Scratch) -> None:
        c = x.shape[1]
        o, ho, wo = out.shape[1:]
        (kh, kw), (mh, mw) = self.kernel, self.tile
        nh, nw = mh + kh - 1, mw + kw - 1
        nn, mm = nh * nw, mh * mw
        tw = ceil_div(wo, mw)
        for span in self.spans:
            i = span.image
            xp, base = span.inputs.read(x[i])
            for t0 in range(span.rows.start, span.rows.stop, self.block_rows):
                rows = min(self.block_rows, span.rows.stop - t0)
                tiles = rows * tw
                cols = scratch.take("cols", nn * c * tiles).reshape(nn, c * tiles)
                v = scratch.take("wino_v", nn * c * tiles).reshape(nn, c * tiles)
                prod = scratch.take("wino_m", (nn + 1) * o * tiles).reshape(nn + 1, o * tiles)
                top = t0 * mh - base
                _im2col(xp[:, top:top + (rows - 1) * mh + nh], (nh, nw), (mh, mw), rows, tw, cols)
                v = self._input_transform(cols, v, nh, nw)
                np.matmul(self.u, v.reshape(nn, c, tiles), out=prod[:nn].reshape(nn, o, tiles))
                prod[nn].reshape(o, tiles)[...] = self.bias  # the bias rides in the output transform
                y = scratch.take("cols", mm * o * tiles).reshape(mm, o * tiles)  # cols is dead by now
                np.matmul(self.a_t, prod, out=y)
                y5 = y.reshape(mh, mw, o, rows, tw)
                block = out[i][:, t0 * mh:min((t0 + rows) * mh, ho)]
                for a in range(mh):
                    for b in range(mw):
                        dst = block[:, a::mh, b::mw]
                        tile = y5[a, b, :, :dst.shape[1], :dst.shape[2]]
                        if self.relu:
                            np.maximum(tile, 0, out=dst)
                        else:
                            dst[...] = tile


    def _input_transform(self, cols: np.ndarray, spare: np.ndarray, nh: int, nw: int) -> np.ndarray:
        """B applied to every tile, as its two 1-D factors (B = BT_h kron BT_w): along W as nh products of
        (nw, nw) by (nw, C * tiles), then along H as one (nh, nh) by (nh, nw * C * tiles) product; a third of
        the multiplies of the (nn, nn) product for 6x6 tiles. Returns the buffer holding the result."""
        if self.bt_w is not None:
            np.matmul(self.bt_w, cols.reshape(nh, nw, -1), out=spare.reshape(nh, nw, -1))
            cols, spare = spare, cols
        if self.bt_h is not None:
            np.matmul(self.bt_h, cols.reshape(nh, -1), out=spare.reshape(nh, -1))
            cols = spare
        return cols


def _prepare_winograd(w: np.ndarray, b: np.ndarray, in_shape: tuple[int, ...], pad: tuple[int, int], relu: bool,
                      padding: Scratch | Keyed, spans: list[tuple[int, range]]) -> _WinogradConv:
    _, c, h, wd = in_shape
    o, _, kh, kw = w.shape
    ho, wo = out_size(h, kh, 1, pad[0]), out_size(wd, kw, 1, pad[1])
    mh, mw = winograd_tile((kh, kw), (ho, wo))
    at_h, g_h, bt_h = winograd_matrices(mh, kh) if kh > 1 else (np.ones((1, 1)),) * 3
    at_w, g_w, bt_w = winograd_matrices(mw, kw) if kw > 1 else (np.ones((1, 1)),) * 3
    nn, mm = (mh + kh - 1) * (mw + kw - 1), mh * mw
    g = np.kron(g_h, g_w)  # (nn, kh * kw)
    u = np.einsum("tk,ock->toc", g, w.reshape(o, c, kh * kw).astype(np.float64))
    th, tw = ceil_div(ho, mh), ceil_div(wo, mw)
    per_row = tw * (max(nn * c, mm * o) + nn * c + (nn + 1) * o)
    block = ceil_div(th, ceil_div(th * per_row, BLOCK_ELEMS))
    tiles = block * tw
    work = {"cols": max(nn * c, mm * o) * tiles, "wino_v": nn * c * tiles, "wino_m": (nn + 1) * o * tiles}
    parts = _spans(padding, in_shape, pad, spans, lambda r: (r.start * mh, r.stop * mh + kh - 1), tw * mw + kw - 1)
    return _WinogradConv(np.ascontiguousarray(u, w.dtype), bt_h.astype(w.dtype) if kh > 1 else None,
                         bt_w.astype(w.dtype) if kw > 1 else None,
                         np.hstack([np.kron(at_h, at_w), np.ones((mm, 1))]).astype(w.dtype), b.reshape(o, 1),
                         (kh, kw), (mh, mw), relu, parts, block, work)


def prepare_conv(w: np.ndarray, b: np.ndarray, in_shape: tuple[int, ...], stride: int, pad: tuple[int, int],
                 relu: bool, winograd: bool, padding: Scratch | Keyed,
                 spans: list[tuple[int, range]] | None = None) -> _DirectConv | _WinogradConv:
    """w (O, C, kh, kw) and b (O,) already in the compute dtype. ``padding`` lends the zero-bordered input
    buffers; ``spans``, (image, rows in conv_row_units) pairs, restrict the conv to part of its output (default:
    all of it). ``run`` takes the work memory (``work`` says how much of each kind)."""
    kernel = w.shape[2:]
    if spans is None:
        rows = range(conv_row_units(kernel, stride, pad, in_shape[2:], winograd)[0])
        spans = [(i, rows) for i in range(in_shape[0])]
    if uses_winograd(kernel, stride, winograd):
        return _prepare_winograd(w, b, in_shape, pad, relu, padding, spans)
    return _prepare_direct(w, b, in_shape, stride, pad, relu, padding, spans)


def conv2d_bias_relu(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int = 1, pad: tuple[int, int] = (0, 0),
                     relu: bool = True, out: np.ndarray | None = None, winograd: bool = False) -> np.ndarray:
    """x (N, C, H, W), w (O, C, kh, kw), b (O,) -> (N, O, Ho, Wo), in the dtype of x. ``out`` may be a view
    (a channel slice, say) as long as each image of it is contiguous. ``winograd`` uses Winograd's algorithm where
    it applies (stride 1, kernel wider than 1), as the float32 backend does."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    if out is None:
        out = np.empty((n, o, out_size(h, kh, stride, pad[0]), out_size(wd, kw, stride, pad[1])), x.dtype)
    scratch = Scratch(x.dtype)
    conv = prepare_conv(w.astype(x.dtype, copy=False), b.astype(x.dtype, copy=False), x.shape, stride, pad, relu,
                        winograd, scratch)
    conv.run(x, out, scratch)
    return out


@dataclass
class _Pool:
    """One max or average pool, prepared. Separable: reduce along W into ``rows``, then along H into the output
    (a 3x3 window costs 4 elementwise passes instead of 8)."""

    kind: str
    kernel: int
    stride: int
    pad: int
    padded: np.ndarray | None  # (N, C, H + 2p, W + 2p), borders -inf (max) or 0 (avg), never written
    rows: np.ndarray  # (N, C, Hp, Wo)
    scale: np.ndarray | float  # 1 / number of elements each average window divides by, (Ho, Wo) or scalar

    def run(self, x: np.ndarray, out: np.ndarray) -> None:
        k, s, p = self.kernel, self.stride, self.pad
        ho, wo = out.shape[2:]
        if self.padded is not None:
            self.padded[:, :, p:p + x.shape[2], p:p + x.shape[3]] = x
            x = self.padded
        reduce = np.maximum if self.kind == "max" else np.add
        rows = self.rows
        rows[...] = x[..., 0:s * (wo - 1) + 1:s]
        for j in range(1, k):
            reduce(rows, x[..., j:j + s * (wo - 1) + 1:s], out=rows)
        out[...] = rows[:, :, 0:s * (ho - 1) + 1:s]
        for i in range(1, k):
            reduce(out, rows[:, :, i:i + s * (ho - 1) + 1:s], out=out)
        if self.kind == "avg":
            out *= self.scale


def _window_counts(size: int, kernel: int, stride: int, pad: int) -> np.ndarray:
    """How many in-bounds elements each output position's window covers, along one axis."""
    starts = np.arange(out_size(size, kernel, stride, pad)) * stride - pad
    return np.minimum(starts + kernel, size) - np.maximum(starts, 0)


def prepare_pool(in_shape: tuple[int, ...], kind: str, kernel: int, stride: int, pad: int,
                 count_include_pad: bool, dtype: np.dtype) -> _Pool:
    if kind not in ("max", "avg"):
        raise ValueError(f"pool kind must be 'max' or 'avg', got {kind!r}")
    n, c, h, w = in_shape
    wo = out_size(w, kernel, stride, pad)
    padded = None
    if pad:
        padded = np.full((n, c, h + 2 * pad, w + 2 * pad), -np.inf if kind == "max" else 0, dtype)
    rows = np.empty((n, c, h + 2 * pad, wo), dtype)
    if count_include_pad or not pad:
        scale: np.ndarray | float = 1.0 / (kernel * kernel)
    else:
        counts = np.outer(_window_counts(h, kernel, stride, pad), _window_counts(w, kernel, stride, pad))
        scale = (1.0 / counts).astype(dtype)
    return _Pool(kind, kernel, stride, pad, padded, rows, scale)


def pool2d(x: np.ndarray, kind: str, kernel: int, stride: int, pad: int = 0,
           count_include_pad: bool = True, out: np.ndarray | None = None) -> np.ndarray:
    """Max or average pool over kernel x kernel windows. Max pads with -inf; average divides by the window size
    (count_include_pad) or by the number of in-bounds elements."""
    n, c, h, w = x.shape
    if out is None:
        out = np.empty((n, c, out_size(h, kernel, stride, pad), out_size(w, kernel, stride, pad)), x.dtype)
    prepare_pool(x.shape, kind, kernel, stride, pad, count_include_pad, x.dtype).run(x, out)
    return out


def global_avg_pool(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=(2, 3), keepdims=True)


def fc(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x (N, in), w (out, in), b (out,) -> (N, out)."""
    return x @ w.T + b


def walk_layers(layers: list, x: np.ndarray, conv: Callable[[Any, np.ndarray], np.ndarray],
                fc: Callable[[Any, np.ndarray], np.ndarray],
                visit: Callable[[str, np.ndarray], None] | None = None) -> np.ndarray:
    """Runs ``layers`` (arch's list) on ``x`` layer by layer with ``conv(layer, input)`` and ``fc(layer, features)``
    supplied by the caller (pools and concats done here), freeing each activation after its last reader;
    ``visit(name, tensor)`` sees every conv, pool and concat output. Returns the last layer's output (the logits).
    The plain walk the NumPy paths outside a plan share (the synthetic model's statistics, the 8-bit reference)."""
    srcs = {l.name: (l.srcs if isinstance(l, arch.Concat) else (l.src,)) for l in layers}
    last_read = {s: i for i, l in enumerate(layers) for s in srcs[l.name]}
    acts = {arch.INPUT: x}
    y = x
    for i, l in enumerate(layers):
        if isinstance(l, arch.Conv):
            y = conv(l, acts[l.src])
        elif isinstance(l, arch.Pool):
            y = pool2d(acts[l.src], l.kind, l.kernel, l.stride, l.pad, l.count_include_pad)
        elif isinstance(l, arch.Concat):
            y = np.concatenate([acts[s] for s in l.srcs], axis=1)
        elif isinstance(l, arch.GlobalAvgPool):
            y = global_avg_pool(acts[l.src]).reshape(x.shape[0], -1)
        else:
            y = fc(l, acts[l.src])
        if visit is not None and isinstance(l, arch.Conv | arch.Pool | arch.Concat):
            visit(l.name, y)
        acts[l.name] = y
        for s in srcs[l.name]:
            if last_read[s] == i:
                del acts[s]
    return y
