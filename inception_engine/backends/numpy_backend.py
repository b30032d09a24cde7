"""NumPy backend: the reference every other backend is checked against (float64), and the CPU path (float32).

Convolution is im2col + one BLAS matrix product per image, written straight into the destination view (a channel
slice of a concat buffer is contiguous per image, so BLAS writes the concat in place). 1x1 stride-1 convolutions
skip im2col. The backend prepares every op once at init: weights reshaped to the im2col row order, arena views,
a zero-bordered padding scratch per padded shape, one shared im2col scratch. ``forward`` then only copies and
multiplies; nothing is allocated per call.

im2col row order is (ki, kj, c): each (ki, kj) block of rows is one contiguous copy of a shifted input window,
and the weights are transposed to (O, kh, kw, C) once to match.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..plan import ConvOp, FCOp, GlobalAvgPoolOp, Plan, PoolOp, View
from ..weights import Weights


def _out_size(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def conv_weight_2d(w: np.ndarray) -> np.ndarray:
    """(O, C, kh, kw) -> (O, kh * kw * C), the row order ``_im2col`` produces."""
    o = w.shape[0]
    return np.ascontiguousarray(w.transpose(0, 2, 3, 1).reshape(o, -1))


def _im2col(xp: np.ndarray, kh: int, kw: int, stride: int, ho: int, wo: int, cols: np.ndarray) -> None:
    """xp (C, Hp, Wp), already padded -> cols (kh * kw * C, ho * wo)."""
    c = xp.shape[0]
    blocks = cols.reshape(kh, kw, c, ho, wo)
    for i in range(kh):
        for j in range(kw):
            blocks[i, j] = xp[:, i:i + stride * (ho - 1) + 1:stride, j:j + stride * (wo - 1) + 1:stride]


# im2col runs in blocks of output rows of at most this many elements (4 MB in float32), so that a block is still
# in cache when the GEMM reads it. Only the stem's matrices (up to 25 MB) are split.
COLS_BLOCK_ELEMS = 1 << 20


def _block_rows(k: int, ho: int, wo: int) -> int:
    blocks = -(-k * ho * wo // COLS_BLOCK_ELEMS)
    return -(-ho // blocks)


@dataclass
class _Conv:
    """One convolution, prepared: ``run(x, out)`` computes relu(conv(x) + b) into ``out`` (both views, NCHW).

    With im2col the bias rides in the GEMM: the weights get the bias as an extra column and the im2col block an
    extra row of ones, which saves a pass over the output.
    """

    w2d: np.ndarray  # (O, kh * kw * C), plus the bias column when im2col is used
    bias: np.ndarray  # (O, 1, 1)
    kernel: tuple[int, int]
    stride: int
    pad: tuple[int, int]
    relu: bool
    padded: np.ndarray | None  # (C, H + 2 ph, W + 2 pw) scratch, borders zero and never written
    cols: np.ndarray | None  # flat scratch for one block of (kh * kw * C + 1, block_rows * Wo); None: 1x1 conv
    block_rows: int

    def run(self, x: np.ndarray, out: np.ndarray) -> None:
        n, c, h, w = x.shape
        o, ho, wo = out.shape[1:]
        if self.cols is None:  # 1x1, stride 1, no padding: the input already is the column matrix
            np.matmul(self.w2d, x.reshape(n, c, h * w), out=out.reshape(n, o, ho * wo))
            out += self.bias
            if self.relu:
                np.maximum(out, 0, out=out)
            return
        (kh, kw), (ph, pw), s = self.kernel, self.pad, self.stride
        k = self.w2d.shape[1] - 1
        for i in range(n):
            xp = x[i]
            if self.padded is not None:
                self.padded[:, ph:ph + h, pw:pw + w] = xp
                xp = self.padded
            out2d = out[i].reshape(o, ho * wo)
            for r0 in range(0, ho, self.block_rows):
                rows = min(self.block_rows, ho - r0)
                cols = self.cols[:(k + 1) * rows * wo].reshape(k + 1, rows * wo)
                _im2col(xp[:, r0 * s:(r0 + rows - 1) * s + kh], kh, kw, s, rows, wo, cols[:k])
                cols[k] = 1
                block = out2d[:, r0 * wo:(r0 + rows) * wo]
                np.matmul(self.w2d, cols, out=block)
                if self.relu:
                    np.maximum(block, 0, out=block)


def _prepare_conv(w: np.ndarray, b: np.ndarray, in_shape: tuple[int, int, int, int], stride: int,
                  pad: tuple[int, int], relu: bool, scratch: Callable[[str, int], np.ndarray]) -> _Conv:
    """w (O, C, kh, kw) and b (O,) in the compute dtype. ``scratch(kind, elems)`` hands out flat work memory:
    kind "cols" may be shared by all convs, kind "pad:..." only by convs with the same padded shape (whose zero
    borders then stay zero)."""
    _, c, h, wd = in_shape
    o, _, kh, kw = w.shape
    ph, pw = pad
    ho, wo = _out_size(h, kh, stride, ph), _out_size(wd, kw, stride, pw)
    bias = b.reshape(o, 1, 1)
    if kh == kw == 1 and stride == 1 and ph == pw == 0:
        return _Conv(w.reshape(o, c), bias, (1, 1), 1, pad, relu, None, None, ho)
    w2d = np.concatenate([conv_weight_2d(w), b.reshape(o, 1)], axis=1)
    padded = None
    if ph or pw:
        hp, wp = h + 2 * ph, wd + 2 * pw
        padded = scratch(f"pad:{c}x{h}x{wd}+{ph}x{pw}", c * hp * wp).reshape(c, hp, wp)
    rows = _block_rows(w2d.shape[1], ho, wo)
    return _Conv(w2d, bias, (kh, kw), stride, pad, relu, padded, scratch("cols", w2d.shape[1] * rows * wo), rows)


def cols_scratch_elems(in_shape: tuple[int, int, int, int], out_ch: int, kernel: tuple[int, int], stride: int,
                       pad: tuple[int, int]) -> int:
    """Size of the im2col scratch one conv needs (0 for a 1x1 stride-1 conv)."""
    _, c, h, w = in_shape
    (kh, kw), (ph, pw) = kernel, pad
    if kh == kw == 1 and stride == 1 and ph == pw == 0:
        return 0
    k, ho, wo = kh * kw * c + 1, _out_size(h, kh, stride, ph), _out_size(w, kw, stride, pw)
    return k * _block_rows(k, ho, wo) * wo


def _fresh_scratch(dtype: np.dtype) -> Callable[[str, int], np.ndarray]:
    return lambda kind, elems: np.zeros(elems, dtype)


def conv2d_bias_relu(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int = 1,
                     pad: tuple[int, int] = (0, 0), relu: bool = True, out: np.ndarray | None = None) -> np.ndarray:
    """x (N, C, H, W), w (O, C, kh, kw), b (O,) -> (N, O, Ho, Wo), in the dtype of x. ``out`` may be a view
    (e.g. a channel slice) as long as each image of it is contiguous."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    ho, wo = _out_size(h, kh, stride, pad[0]), _out_size(wd, kw, stride, pad[1])
    if out is None:
        out = np.empty((n, o, ho, wo), x.dtype)
    conv = _prepare_conv(w.astype(x.dtype, copy=False), b.astype(x.dtype, copy=False), x.shape, stride, pad, relu,
                         _fresh_scratch(x.dtype))
    conv.run(x, out)
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
    starts = np.arange(_out_size(size, kernel, stride, pad)) * stride - pad
    return np.minimum(starts + kernel, size) - np.maximum(starts, 0)


def _prepare_pool(in_shape: tuple[int, int, int, int], kind: str, kernel: int, stride: int, pad: int,
                  count_include_pad: bool, dtype: np.dtype) -> _Pool:
    if kind not in ("max", "avg"):
        raise ValueError(f"pool kind must be 'max' or 'avg', got {kind!r}")
    n, c, h, w = in_shape
    ho, wo = _out_size(h, kernel, stride, pad), _out_size(w, kernel, stride, pad)
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
        out = np.empty((n, c, _out_size(h, kernel, stride, pad), _out_size(w, kernel, stride, pad)), x.dtype)
    _prepare_pool(x.shape, kind, kernel, stride, pad, count_include_pad, x.dtype).run(x, out)
    return out


def global_avg_pool(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=(2, 3), keepdims=True)


def fc(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x (N, in), w (out, in), b (out,) -> (N, out)."""
    return x @ w.T + b


class NumpyBackend:
    name = "cpu"

    @classmethod
    def check_available(cls) -> None:
        pass

    def __init__(self, weights: Weights, plan: Plan, dtype: type = np.float32):
        self.plan = plan
        self.dtype = np.dtype(dtype)
        self.arena = np.empty(plan.arena_elems, self.dtype)
        self._scratch: dict[str, np.ndarray] = {}
        cols_elems = max([cols_scratch_elems(op.src.dims, op.dst.channels, op.kernel, op.stride, op.pad)
                          for op in plan.conv_ops], default=0)
        self._scratch["cols"] = np.empty(cols_elems, self.dtype)
        self._steps = [self._prepare(op, weights) for op in plan.ops]
        self._input = self._view(plan.input)
        self._output = self._view(plan.output).reshape(plan.batch, -1)

    def _scratch_for(self, kind: str, elems: int) -> np.ndarray:
        if kind not in self._scratch:
            self._scratch[kind] = np.zeros(elems, self.dtype)
        return self._scratch[kind][:elems]

    def _view(self, v: View) -> np.ndarray:
        n, c, h, w = v.shape
        buf = self.arena[v.offset:v.offset + n * c * h * w].reshape(n, c, h, w)
        return buf[:, v.c_offset:v.c_offset + v.channels]

    def _prepare(self, op, weights: Weights) -> Callable[[], None]:
        src, dst = self._view(op.src), self._view(op.dst)
        if isinstance(op, ConvOp):
            w, b = (a.astype(self.dtype) for a in weights.conv(op.name))
            conv = _prepare_conv(w, b, src.shape, op.stride, op.pad, True, self._scratch_for)
            return lambda: conv.run(src, dst)
        if isinstance(op, PoolOp):
            pool = _prepare_pool(src.shape, op.kind, op.kernel, op.stride, op.pad, op.count_include_pad, self.dtype)
            return lambda: pool.run(src, dst)
        if isinstance(op, GlobalAvgPoolOp):
            n, c, h, w = src.shape
            return lambda: np.mean(src.reshape(n, c, h * w), axis=2, out=dst.reshape(n, c))
        if isinstance(op, FCOp):
            n = src.shape[0]
            w_t = weights.arrays[op.name + ".weight"].astype(self.dtype).T
            b = weights.arrays[op.name + ".bias"].astype(self.dtype)
            x2d, y2d = src.reshape(n, -1), dst.reshape(n, -1)

            def run_fc() -> None:
                np.matmul(x2d, w_t, out=y2d)
                np.add(y2d, b, out=y2d)
            return run_fc
        raise TypeError(f"unknown op {op!r}")

    def forward(self, x: np.ndarray) -> np.ndarray:
        if x.shape != self.plan.input.dims:
            raise ValueError(f"input shape {x.shape} does not match the plan's {self.plan.input.dims}")
        self._input[...] = x
        for step in self._steps:
            step()
        return self._output.copy()

    def time_forward(self, x: np.ndarray, iters: int, warmup: int) -> list[float]:
        for _ in range(warmup):
            self.forward(x)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            self.forward(x)
            times.append((time.perf_counter() - t0) * 1e3)
        return times

    def close(self) -> None:
        self.arena = np.empty(0, self.dtype)
        self._scratch.clear()
        self._steps.clear()
