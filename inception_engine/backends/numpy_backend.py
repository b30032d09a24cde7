"""NumPy backend: the reference every other backend is checked against (float64), and the CPU path (float32).

Convolution is im2col + one BLAS matrix product per layer; 1x1 stride-1 convolutions skip im2col entirely.
"""

from __future__ import annotations

import time

import numpy as np

from ..plan import ConvOp, FCOp, GlobalAvgPoolOp, Plan, PoolOp, View
from ..weights import Weights


def conv2d_bias_relu(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int = 1,
                     pad: tuple[int, int] = (0, 0), relu: bool = True) -> np.ndarray:
    """x (N, C, H, W), w (O, C, kh, kw), b (O,) -> (N, O, Ho, Wo)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    ph, pw = pad
    ho, wo = (h + 2 * ph - kh) // stride + 1, (wd + 2 * pw - kw) // stride + 1
    if kh == kw == 1 and stride == 1 and ph == pw == 0:
        y = np.matmul(w.reshape(o, c), x.reshape(n, c, h * wd))
    else:
        xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x
        win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
        # (N, C, Ho, Wo, kh, kw) -> (N, C*kh*kw, Ho*Wo): the im2col matrix, one copy.
        cols = win.transpose(0, 1, 4, 5, 2, 3).reshape(n, c * kh * kw, ho * wo)
        y = np.matmul(w.reshape(o, c * kh * kw), cols)
    y = y.reshape(n, o, ho, wo)
    y += b.reshape(1, o, 1, 1)
    if relu:
        np.maximum(y, 0, out=y)
    return y


def pool2d(x: np.ndarray, kind: str, kernel: int, stride: int, pad: int = 0,
           count_include_pad: bool = True) -> np.ndarray:
    """Max or average pool over kernel x kernel windows. Max pads with -inf; average divides by the window size
    (count_include_pad) or by the number of in-bounds elements."""
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill) if pad else x
    win = np.lib.stride_tricks.sliding_window_view(xp, (kernel, kernel), axis=(2, 3))[:, :, ::stride, ::stride]
    if kind == "max":
        return win.max(axis=(4, 5))
    s = win.sum(axis=(4, 5))
    if count_include_pad or not pad:
        return s / (kernel * kernel)
    ones = np.pad(np.ones(x.shape[2:], x.dtype), pad)
    cnt = np.lib.stride_tricks.sliding_window_view(ones, (kernel, kernel))[::stride, ::stride].sum(axis=(2, 3))
    return s / cnt


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
        self.params = {k: v.astype(self.dtype) for k, v in weights.arrays.items()}
        self.arena = np.empty(plan.arena_elems, self.dtype)

    def _view(self, v: View) -> np.ndarray:
        n, c, h, w = v.shape
        buf = self.arena[v.offset:v.offset + n * c * h * w].reshape(n, c, h, w)
        return buf[:, v.c_offset:v.c_offset + v.channels]

    def forward(self, x: np.ndarray) -> np.ndarray:
        if x.shape != self.plan.input.dims:
            raise ValueError(f"input shape {x.shape} does not match the plan's {self.plan.input.dims}")
        self._view(self.plan.input)[...] = x
        for op in self.plan.ops:
            src, dst = self._view(op.src), self._view(op.dst)
            if isinstance(op, ConvOp):
                dst[...] = conv2d_bias_relu(src, self.params[op.name + ".weight"], self.params[op.name + ".bias"],
                                            op.stride, op.pad)
            elif isinstance(op, PoolOp):
                dst[...] = pool2d(src, op.kind, op.kernel, op.stride, op.pad, op.count_include_pad)
            elif isinstance(op, GlobalAvgPoolOp):
                dst[...] = global_avg_pool(src)
            elif isinstance(op, FCOp):
                n = src.shape[0]
                dst[...] = fc(src.reshape(n, -1), self.params[op.name + ".weight"],
                              self.params[op.name + ".bias"]).reshape(dst.shape)
        return self._view(self.plan.output).reshape(self.plan.batch, -1).copy()

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
