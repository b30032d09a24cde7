"""pytorch-fid's resize on the GPU (resize_fid.cu) of decoded images in device memory, each read upright through its
EXIF orientation (gpu_resize.upright_views), into slots of the network's float32 (N, 3, size, size) input, scaled as
the weight file says (mean, std of x / 255; pytorch-fid's 2x - 1 is mean = std = 0.5).

The kernel's arithmetic is torch's float32 one, as the CPU path's (cpu_src/fid_resize.c); the two differ where
nvcc fuses a product and a sum, and the CPU path's Pillow fallback (a float64 interpolation) by float32 rounding
(bounded in tests/kernels/test_resize_fid.py). It runs on the CUDA kernel layer: the caller's loaded Kernels, its
context current.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backends.cuda.kernels import Kernels, launch_async, spec
from .gpu_resize import CHANNELS, QueuedResize, Staged
from .pil_resize import pillow_vertical_first_rule, vertical_first

# resize_fid.cu's RESIZE_FID_JOB: src, in_h, in_w, in_row, in_col, slot
JOB_FIELDS = 6
KERNEL = "resize_fid_bilinear"


class GpuFidResize(QueuedResize):
    """Enqueues resize_fid.cu's pytorch-fid resize of decoded device images into slots of a float32 NCHW batch:
    one launch a batch, its jobs in one pinned buffer copied once; ``wait`` blocks until the last enqueued batch no
    longer needs that buffer or its source images."""

    def __init__(self, kernels: Kernels, mean: Sequence[float], std: Sequence[float], size: int = 299):
        super().__init__()
        self.kernels, self.size = kernels, size
        self._jobs = Staged(np.int64)
        self._scaling = Staged(np.float32)
        self._mean_std = np.asarray([*mean, *std], np.float32)
        if self._mean_std.shape != (2 * CHANNELS,):
            raise ValueError(f"mean and std need {CHANNELS} values each, got {len(mean)} and {len(std)}")

    def _staged(self) -> tuple[Staged, ...]:
        return self._jobs, self._scaling

    def _enqueue_upright(self, origin: np.ndarray, h: np.ndarray, w: np.ndarray, row: np.ndarray, col: np.ndarray,
                         slots: np.ndarray, y_ptr: int, stream: Any) -> None:
        table = np.stack([origin, h, w, row, col, slots], axis=1)
        assert table.shape[1] == JOB_FIELDS
        scaling = self._scaling.upload([self._mean_std], stream)
        jobs = self._jobs.upload([np.ascontiguousarray(table)], stream)
        k = spec(KERNEL)
        plane = self.size * self.size
        launch_async(self.kernels[KERNEL], (k.blocks(plane), len(table), 1), k.block, stream, jobs, y_ptr, scaling,
                     self.size, CHANNELS * plane)
        self._record(stream)


# clean-fid's resize (resize_fid.cu's resize_clean_first / _second): Pillow's mode "F" bicubic resize of each
# channel, clipped, then the network's scaling. RESIZE_CLEAN_JOB: src, dst, start, weights, taps, out_rows, out_cols,
# in_row, in_col (in the pass input's elements), vertical, slot.
CLEAN_JOB_FIELDS = 11
BICUBIC_A = -0.5  # Resample.c's bicubic filter: Keys' cubic with a = -0.5, support 2
BICUBIC_SUPPORT = 2.0


def bicubic_coeffs(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's bicubic coefficients for in_size -> out_size (the whole input as the box), in double, as
    Resample.c's precompute_coeffs computes them: (start (out_size,) int32, weights (out_size, taps) float64), each
    output's window moved left where it would run past the input's end, its weights right by as much (leading
    zeros, which leave a sum in tap order unchanged)."""
    scale = float(np.float32(in_size)) / out_size
    filterscale = max(scale, 1.0)
    support = BICUBIC_SUPPORT * filterscale
    center = (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    xmin = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)  # C's (int) truncates
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size)
    count = xmax - xmin
    ksize = int(count.max())
    ss = 1.0 / filterscale
    w = np.zeros((out_size, ksize), np.float64)
    total = np.zeros(out_size, np.float64)
    a = BICUBIC_A
    for t in range(ksize):  # tap by tap: the sum of the weights accumulates in Pillow's order
        x = np.abs((t + xmin - center + 0.5) * ss)
        wt = np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
                      np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0))
        wt = np.where(t < count, wt, 0.0)
        w[:, t] = wt
        total += wt
    w = np.where(total[:, None] != 0.0, w / np.where(total != 0.0, total, 1.0)[:, None], w)
    start = np.minimum(xmin, in_size - ksize)
    shifted = np.zeros_like(w)
    rows = np.arange(out_size)
    for t in range(ksize):
        cols = t + xmin - start
        keep = cols < ksize
        shifted[rows[keep], cols[keep]] = w[keep, t]
    return start.astype(np.int32), shifted


@functools.lru_cache(maxsize=256)
def clean_schedule(h: int, w: int, size: int) -> tuple[bool, tuple[np.ndarray, np.ndarray], tuple[np.ndarray,
                                                                                                  np.ndarray]]:
    """(vertical first, the first pass's coefficients, the second's) for an h x w image, in Pillow's pass order."""
    vertical = pillow_vertical_first_rule() and vertical_first(h, w, size, size)
    ys, xs = bicubic_coeffs(h, size), bicubic_coeffs(w, size)
    return (True, ys, xs) if vertical else (False, xs, ys)


class GpuCleanFidResize(QueuedResize):
    """Enqueues clean-fid's resize of decoded device images into slots of a float32 NCHW batch (the network's
    input, scaled by mean and std): two launches a batch, the first passes into a float32 intermediate per image,
    the second into the slots. The same interface as GpuFidResize."""

    def __init__(self, kernels: Kernels, mean: Sequence[float], std: Sequence[float], size: int = 299):
        super().__init__()
        self.kernels, self.size = kernels, size
        self._starts, self._weights = Staged(np.int32), Staged(np.float64)
        self._jobs, self._scaling = Staged(np.int64), Staged(np.float32)
        self._mean_std = np.asarray([*mean, *std], np.float32)

    def _staged(self) -> tuple[Staged, ...]:
        return self._starts, self._weights, self._jobs, self._scaling

    def _enqueue_upright(self, origin: np.ndarray, h: np.ndarray, w: np.ndarray, row: np.ndarray, col: np.ndarray,
                         slots: np.ndarray, y_ptr: int, stream: Any) -> None:
        scheds = [clean_schedule(int(a), int(b), self.size) for a, b in zip(h, w)]
        starts, weights, s_at, w_at = [], [], 0, 0
        offsets = []
        for _, first, second in scheds:
            offsets.append((s_at, w_at, s_at + len(first[0]), w_at + first[1].size))
            for st, wt in (first, second):
                starts.append(st)
                weights.append(wt)
                s_at, w_at = s_at + len(st), w_at + wt.size
        start_dev = self._starts.upload(starts, stream)
        weight_dev = self._weights.upload(weights, stream)
        size = self.size
        mid_rows = np.array([size if v else int(a) for (v, _, _), a in zip(scheds, h)], np.int64)
        mid_cols = np.array([int(b) if v else size for (v, _, _), b in zip(scheds, w)], np.int64)
        mid_bytes = mid_rows * mid_cols * CHANNELS * 4
        mid = self._scratch(int(mid_bytes.sum())) + np.cumsum(mid_bytes) - mid_bytes
        vertical = np.array([v for v, _, _ in scheds], np.int64)
        off = np.array(offsets, np.int64)
        taps1 = np.array([f[1].shape[1] for _, f, _ in scheds], np.int64)
        taps2 = np.array([s[1].shape[1] for _, _, s in scheds], np.int64)
        first = np.stack([origin, mid, start_dev + 4 * off[:, 0], weight_dev + 8 * off[:, 1], taps1, mid_rows,
                          mid_cols, row, col, vertical, slots], axis=1)
        second = np.stack([mid, np.zeros_like(mid), start_dev + 4 * off[:, 2], weight_dev + 8 * off[:, 3], taps2,
                           np.full_like(mid, size), np.full_like(mid, size), mid_cols * CHANNELS,
                           np.full_like(mid, CHANNELS), 1 - vertical, slots], axis=1)
        assert first.shape[1] == second.shape[1] == CLEAN_JOB_FIELDS
        scaling = self._scaling.upload([self._mean_std], stream)
        base = self._jobs.upload([first, second], stream)
        k1, k2 = spec("resize_clean_first"), spec("resize_clean_second")
        most = int((mid_rows * mid_cols).max())
        launch_async(self.kernels["resize_clean_first"], (k1.blocks(most), len(first), 1), k1.block, stream, base)
        launch_async(self.kernels["resize_clean_second"], (k2.blocks(size * size), len(second), 1), k2.block, stream,
                     base + first.nbytes, y_ptr, scaling, CHANNELS * size * size)
        self._record(stream)


# Each FID tool's resize on the GPU, by Preprocess.mode: the GPU decode path's, and the host decode path's where the
# cuda runner resizes (Preprocess.gpu_resize)
FID_RESIZES: dict[str, type[GpuFidResize] | type[GpuCleanFidResize]] = {
    "pytorch-fid": GpuFidResize, "clean-fid": GpuCleanFidResize}
