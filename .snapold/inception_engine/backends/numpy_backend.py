"""NumPy backend: the reference every other backend is checked against (float64), and the CPU path (float32).

The float32 CPU path runs its convolutions and pools in C kernels of its own where they can be built
(cpu_kernels.py, cpu_src/: an implicit-GEMM convolution with an AVX-512 micro-kernel, Winograd on it for the
stride-1 convs wider than 1x1, one call a layer on the kernels' thread pool), with each average pool moved behind
the 1x1 conv it feeds. Everywhere else (float64, no C compiler, no AVX-512) it runs the NumPy code of
numpy_primitives.py (im2col + GEMM, or Winograd).

The backend prepares every op once at init: weights reshaped, transformed or packed, arena views, zero-bordered
padding buffers, shared work memory, and how each layer is split over its threads (``split_work``). ``forward``
then only copies and multiplies; nothing is allocated per call.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..plan import (ConvOp, FCOp, GlobalAvgPoolOp, Plan, PointwiseGroup, PoolOp, View, movable_avg_pools,
                    pointwise_groups)
from ..weights import Weights
from ..errors import BackendUnavailable
from . import cpu_kernels, host_timed_ms
from .blas_threads import openblas_threads, single_threaded_blas
from .numpy_primitives import (Keyed, Scratch, ceil_div, conv_row_units, out_size, prepare_conv, prepare_pool,
                               uses_winograd, winograd_tile)


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# Default cap on NumpyBackend's threads: pieces of a layer get thin on many cores.
MAX_THREADS = 4
MIN_PART_CHANNELS = 16
MIN_PART_OUTPUTS = 32
# Elementwise steps (pools, bias + ReLU) on fewer elements than this a part are not worth a thread hand-off.
MIN_PART_ELEMS = 1 << 16
# Parts per thread for work that splits without repeating anything (rows, images, channels of a pool or a 1x1
# GEMM): threads take parts as they finish, so a thread slowed down by another process takes fewer.
PARTS_PER_THREAD = 2


def split_channels(total: int, parts: int) -> list[slice]:
    """``total`` channels in at most ``parts`` nearly equal contiguous slices of at least MIN_PART_CHANNELS."""
    parts = max(1, min(parts, total // MIN_PART_CHANNELS))
    bounds = [total * k // parts for k in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def split_work(images: int, rows: int, per_row: int, channels: int, parts: int, channel_parts: int,
               weights: int = 0, inputs: int = 1) -> list[tuple[slice, list[tuple[int, range]]]]:
    """A conv's output in pieces of nearly equal work, as (output channels, spans) pairs.

    Cut along images and rows, a piece reads only the input rows it needs but BLAS packs all the ``weights``
    (elements) again for it; cut along output channels, a piece repeats the whole input side (``inputs``
    elements: padding, im2col, Winograd's input transform). So: ``parts`` row pieces where their repeated
    weights cost at most a quarter of the input side; else ``channel_parts`` row pieces where the weights they
    repeat are fewer than the input elements channel pieces would repeat; else ``channel_parts`` channel
    pieces. Row pieces must keep MIN_PART_OUTPUTS outputs per channel."""
    total = images * rows
    for n, cheap in ((parts, 4 * (parts - 1) * weights <= inputs), (channel_parts, weights <= inputs)):
        if cheap and n > 1 and total >= n and total * per_row >= n * MIN_PART_OUTPUTS:
            pieces = []
            for k in range(n):
                lo, hi = total * k // n, total * (k + 1) // n  # in units of (image, row), image-major
                spans = [(i, range(max(lo - i * rows, 0), min(hi - i * rows, rows)))
                         for i in range(lo // rows, ceil_div(hi, rows))]
                pieces.append((slice(0, channels), spans))
            return pieces
    return [(sl, [(i, range(rows)) for i in range(images)]) for sl in split_channels(channels, channel_parts)]


def conv_repeats(kernel: tuple[int, int], stride: int, pad: tuple[int, int], in_shape: tuple[int, ...],
                 out_ch: int, winograd: bool) -> tuple[int, int]:
    """For split_work: (weight elements BLAS packs per piece, input-side elements a channel piece repeats)."""
    n, c = in_shape[:2]
    rows, per_row = conv_row_units(kernel, stride, pad, in_shape[2:], winograd)
    if uses_winograd(kernel, stride, winograd):
        out_hw = (out_size(size, k, 1, p) for size, k, p in zip(in_shape[2:], kernel, pad))
        mh, mw = winograd_tile(kernel, tuple(out_hw))
        nn = (mh + kernel[0] - 1) * (mw + kernel[1] - 1)
        return nn * out_ch * c, 2 * nn * c * n * rows * per_row
    k = kernel[0] * kernel[1] * c
    return out_ch * k, k * n * rows * per_row


class NumpyBackend:
    """``dtype`` float32 (the CPU path) or float64 (the reference).

    ``native`` (float32 only; default: where they are available): every convolution and pool runs in the C kernels
    of cpu_kernels.py, one call a layer, each spread over ``threads`` threads of the kernels' own pool. Without
    them (float64, no C compiler, no AVX-512, ``native=False``) the backend runs the NumPy code below; ``native=True``
    where the kernels are unavailable raises BackendUnavailable with the reason.

    ``fast`` (NumPy code only; default: on for float32, off for float64, so that the reference computes every
    layer as written) turns on Winograd convolutions and the fused 1x1 groups with their average pools moved
    behind the conv (``PointwiseGroup``).

    ``threads``: the NumPy code splits each convolution (by images and rows, or by output channels:
    ``split_work``), pool and fused GEMM (by channels) into up to this many parts that run at once on the
    backend's own threads, with OpenBLAS held at one thread meanwhile (blas_threads.py says why). Default: the
    usable CPUs, at most MAX_THREADS, or for the NumPy code 1 (and OpenBLAS's own threading untouched) where the
    OpenBLAS thread count cannot be controlled."""

    name = "cpu"
    FEATURES = True  # forward(x, features=True)

    @classmethod
    def check_available(cls) -> None:
        pass

    def __init__(self, weights: Weights, plan: Plan, dtype: type = np.float32, fast: bool | None = None,
                 threads: int | None = None, native: bool | None = None):
        self.plan = plan
        self.dtype = np.dtype(dtype)
        self.fast = self.dtype == np.float32 if fast is None else fast
        self.native = self._native_wanted(native)
        if threads is None:
            threads = min(usable_cpus(), MAX_THREADS) if self.native or openblas_threads() else 1
        self.threads = max(1, threads)
        self.parts = self.threads * PARTS_PER_THREAD if self.threads > 1 else 1
        self.arena = np.empty(plan.arena_elems, self.dtype)
        self.scratches = [Scratch(self.dtype) for _ in range(self.threads)]  # work memory, one per thread
        self.padding = Scratch(self.dtype)  # zero-bordered input buffers, keyed by part
        self._pool = None
        if self.threads > 1 and not self.native:
            self._pool = ThreadPoolExecutor(self.threads - 1, "numpy-backend")
        steps: list[list[Callable[[], None]]] = [[] for _ in plan.ops]
        replaced: set[int] = set()
        for conv, pool in movable_avg_pools(plan).items() if self.native else []:
            steps[pool].append(self._prepare_native_pooled_conv(plan.ops[pool], plan.ops[conv], weights))
            replaced |= {conv, pool}
        for group in pointwise_groups(plan) if self.fast and not self.native else []:
            for i, actions in self._prepare_group(group, weights).items():
                steps[i] += actions
                replaced.add(i)
        for i, op in enumerate(plan.ops):
            if i not in replaced:
                steps[i].append(self._prepare_native(op, weights) if self.native else self._prepare(op, weights))
        self._steps = [action for actions in steps for action in actions]
        self._input = self._view(plan.input)
        self._output = self._view(plan.output).reshape(plan.batch, -1)
        gap = next(op for op in plan.ops if isinstance(op, GlobalAvgPoolOp))
        self._features = self._view(gap.dst).reshape(plan.batch, -1)  # the FC's input, still in the arena after it

    def _native_wanted(self, native: bool | None) -> bool:
        if native is False or (native is None and self.dtype != np.float32):
            return False
        if self.dtype != np.float32:
            raise BackendUnavailable(f"the C kernels compute in float32, not {self.dtype}; use native=False")
        if cpu_kernels.library() is None:
            if native:
                raise BackendUnavailable(f"the C kernels are unavailable: {cpu_kernels.unavailable_reason()}")
            return False
        return True

    def _view(self, v: View) -> np.ndarray:
        n, c, h, w = v.shape
        buf = self.arena[v.offset:v.offset + n * c * h * w].reshape(n, c, h, w)
        return buf[:, v.c_offset:v.c_offset + v.channels]

    def _together(self, parts: list[Callable[[Scratch], None]]) -> Callable[[], None]:
        """One step that runs ``parts``, each given the work memory of the thread that runs it: the calling
        thread and the pool's take the next part as they finish one (a list iterator hands each out once)."""
        if len(parts) == 1:
            return functools.partial(parts[0], self.scratches[0])

        def run() -> None:
            todo = iter(parts)

            def drain(scratch: Scratch) -> None:
                for part in todo:
                    part(scratch)
            futures = [self._pool.submit(drain, scratch) for scratch in self.scratches[1:]]
            drain(self.scratches[0])
            for f in futures:
                f.result()
        return run

    def _elementwise_parts(self, dst: np.ndarray) -> list[slice]:
        """Channel slices for an elementwise step writing ``dst``: as many as self.parts, if they are large."""
        return split_channels(dst.shape[1], min(self.parts, dst.size // MIN_PART_ELEMS))

    def _pool_parts(self, in_shape: tuple[int, ...], dst: np.ndarray, kind: str, kernel: int, stride: int,
                    pad: int, count_include_pad: bool) -> list[Callable[[np.ndarray], None]]:
        """Channel parts of a pool into ``dst``, each a function of the input (``in_shape``) it reads."""
        parts = []
        for sl in self._elementwise_parts(dst):
            pool = prepare_pool((in_shape[0], sl.stop - sl.start, *in_shape[2:]), kind, kernel, stride, pad,
                                count_include_pad, self.dtype)
            parts.append(lambda x, pool=pool, sl=sl: pool.run(x[:, sl], dst[:, sl]))
        return parts

    def _prepare(self, op, weights: Weights) -> Callable[[], None]:
        src, dst = self._view(op.src), self._view(op.dst)
        if isinstance(op, ConvOp):
            w, b = (a.astype(self.dtype) for a in weights.conv(op.name))
            rows, per_row = conv_row_units(op.kernel, op.stride, op.pad, src.shape[2:], self.fast)
            parts = []
            repeats = conv_repeats(op.kernel, op.stride, op.pad, src.shape, w.shape[0], self.fast)
            pieces = split_work(src.shape[0], rows, per_row, w.shape[0], self.parts, self.threads, *repeats)
            for k, (sl, spans) in enumerate(pieces):
                conv = prepare_conv(w[sl], b[sl], src.shape, op.stride, op.pad, True, self.fast,
                                    Keyed(self.padding, f"part{k}/"), spans)
                for kind, elems in conv.work.items():
                    for scratch in self.scratches:
                        scratch.reserve(kind, elems)
                parts.append(functools.partial(conv.run, src, dst[:, sl]))
            return self._together(parts)
        if isinstance(op, PoolOp):
            pools = self._pool_parts(src.shape, dst, op.kind, op.kernel, op.stride, op.pad, op.count_include_pad)
            return self._together([lambda _, pool=pool: pool(src) for pool in pools])
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

    def _prepare_native(self, op, weights: Weights) -> Callable[[], None]:
        src, dst = self._view(op.src), self._view(op.dst)
        if isinstance(op, ConvOp):
            w, b = weights.conv(op.name)
            return cpu_kernels.prepare_conv(src, dst, w, b, op.stride, op.pad, True, self.threads)
        if isinstance(op, PoolOp):
            return cpu_kernels.prepare_pool(src, dst, op.kind, op.kernel, op.stride, op.pad, op.count_include_pad,
                                            self.threads)
        return self._prepare(op, weights)

    def _prepare_native_pooled_conv(self, pool: PoolOp, conv: ConvOp, weights: Weights) -> Callable[[], None]:
        """An average pool and the 1x1 conv it feeds, swapped: the conv (without bias) into work memory of its
        own, then the pool, bias and ReLU into the conv's destination. The pool then reads the conv's few output
        channels instead of the module's many input channels (32-192 instead of 192-2048)."""
        src, dst = self._view(pool.src), self._view(conv.dst)
        w, b = weights.conv(conv.name)
        product = np.empty((src.shape[0], w.shape[0], *src.shape[2:]), np.float32)
        run_conv = cpu_kernels.prepare_conv(src, product, w, np.zeros_like(b), 1, (0, 0), False, self.threads)
        run_pool = cpu_kernels.prepare_pool(product, dst, "avg", pool.kernel, 1, pool.pad, pool.count_include_pad,
                                            self.threads, bias=b, relu=True)

        def run() -> None:
            run_conv()
            run_pool()
        return run

    def _prepare_group(self, group: PointwiseGroup, weights: Weights) -> dict[int, list[Callable[[], None]]]:
        """Actions by op index: the shared GEMM first, at the group's first op; each member's bias + ReLU (or
        pool + bias + ReLU) at its own op or at its pool's; nothing at a member whose pool ran for it."""
        ops = self.plan.ops
        src = self._view(group.src)
        n, c, h, w = src.shape
        params = [weights.conv(ops[i].name) for i in group.convs]
        stacked = np.concatenate([wt.reshape(wt.shape[0], c) for wt, _ in params]).astype(self.dtype)
        total = stacked.shape[0]
        scratch = self.scratches[0]
        scratch.reserve("fused", n * total * h * w)

        def product() -> np.ndarray:
            return scratch.take("fused", n * total * h * w).reshape(n, total, h, w)

        def gemm(rows: slice, _: Scratch) -> None:
            np.matmul(stacked[rows], src.reshape(n, c, h * w), out=product().reshape(n, total, h * w)[:, rows])

        actions = {group.first: [self._together([functools.partial(gemm, sl)
                                                 for sl in split_channels(total, self.parts)])]}
        row = 0
        for i, (wt, b) in zip(group.convs, params):
            rows, dst = slice(row, row + wt.shape[0]), self._view(ops[i].dst)
            row += wt.shape[0]
            bias = b.astype(self.dtype).reshape(-1, 1, 1)
            if i in group.pools:
                p = ops[group.pools[i]]
                pools = self._pool_parts((n, dst.shape[1], h, w), dst, "avg", p.kernel, 1, p.pad, p.count_include_pad)
                parts = []
                for pool, sl in zip(pools, self._elementwise_parts(dst)):
                    def pooled(_: Scratch, pool=pool, rows=rows, out=dst[:, sl], bias=bias[sl]) -> None:
                        pool(product()[:, rows])
                        out += bias
                        np.maximum(out, 0, out=out)
                    parts.append(pooled)
                actions.setdefault(group.pools[i], []).append(self._together(parts))
                actions.setdefault(i, [])
            else:
                parts = []
                for sl in self._elementwise_parts(dst):
                    def finish(_: Scratch, rows=slice(rows.start + sl.start, rows.start + sl.stop), out=dst[:, sl],
                               bias=bias[sl]) -> None:
                        np.add(product()[:, rows], bias, out=out)
                        np.maximum(out, 0, out=out)
                    parts.append(finish)
                actions.setdefault(i, []).append(self._together(parts))
        return actions

    def forward(self, x: np.ndarray, features: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """The logits; with ``features``, (logits, the global average pool's output (batch, 2048)) of the same
        forward."""
        if x.shape != self.plan.input.dims:
            raise ValueError(f"input shape {x.shape} does not match the plan's {self.plan.input.dims}")
        self._input[...] = x
        with single_threaded_blas() if self.threads > 1 or self.native else contextlib.nullcontext():
            for step in self._steps:
                step()
        if features:
            return self._output.copy(), self._features.copy()
        return self._output.copy()

    def time_forward(self, x: np.ndarray, iters: int, warmup: int) -> list[float]:
        return host_timed_ms(lambda: self.forward(x), iters, warmup)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self.arena = np.empty(0, self.dtype)
        self.scratches.clear()
        self.padding.buffers.clear()
        self._steps.clear()
