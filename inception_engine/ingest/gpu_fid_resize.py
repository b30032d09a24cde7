"""pytorch-fid's resize on the GPU (resize_fid.cu) of decoded images in device memory, each read upright through its
EXIF orientation (gpu_resize.upright_views), into slots of the network's float32 (N, 3, size, size) input, scaled as
the weight file says (mean, std of x / 255; pytorch-fid's 2x - 1 is mean = std = 0.5).

The CPU path's pixels (ingest/fid_resize.py's pytorch_fid_resize, normalised on the host) come from a float64
interpolation; the kernel's arithmetic is torch's float32 one, so the two differ by float32 rounding (bounded in
tests/kernels/test_resize_fid.py). It runs on the CUDA kernel layer: the caller's loaded Kernels, its context current.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backends.cuda.device import driver
from ..backends.cuda.kernels import Kernels, launch_async, spec
from .gpu_resize import CHANNELS, DeviceImage, Staged, upright_views

# resize_fid.cu's RESIZE_FID_JOB: src, in_h, in_w, in_row, in_col, slot
JOB_FIELDS = 6
KERNEL = "resize_fid_bilinear"


class GpuFidResize:
    """Enqueues resize_fid.cu's pytorch-fid resize of decoded device images into slots of a float32 NCHW batch:
    one launch a batch, its jobs in one pinned buffer copied once; ``wait`` blocks until the last enqueued batch no
    longer needs that buffer or its source images."""

    def __init__(self, kernels: Kernels, mean: Sequence[float], std: Sequence[float], size: int = 299):
        self.kernels, self.size = kernels, size
        self._jobs = Staged(np.int64)
        self._scaling = Staged(np.float32)
        self._mean_std = np.asarray([*mean, *std], np.float32)
        if self._mean_std.shape != (2 * CHANNELS,):
            raise ValueError(f"mean and std need {CHANNELS} values each, got {len(mean)} and {len(std)}")
        self._done: Any = None

    def enqueue(self, jobs: Sequence[tuple[DeviceImage, int, int]], y_ptr: int, stream: Any) -> None:
        """For each (image, slot, EXIF orientation): the image as it stands upright, resized, into slot ``slot`` of
        the (N, 3, size, size) float32 batch at y_ptr."""
        self.enqueue_arrays(*(np.array([getattr(img, f) for img, _, _ in jobs], np.int64)
                              for f in ("ptr", "height", "width", "pitch")),
                            np.array([slot for _, slot, _ in jobs], np.int64), y_ptr, stream,
                            np.array([o for _, _, o in jobs], np.int64))

    def enqueue_arrays(self, ptr: np.ndarray, height: np.ndarray, width: np.ndarray, pitch: np.ndarray,
                       slots: np.ndarray, y_ptr: int, stream: Any, orientation: np.ndarray | None = None) -> None:
        """``enqueue`` with the images as arrays (address, height, width, row pitch as stored, slot, EXIF orientation:
        all 1 where None)."""
        self.wait()
        if len(ptr) == 0:
            return
        if orientation is None:
            orientation = np.ones(len(ptr), np.int64)
        origin, h, w, row, col = upright_views(ptr.astype(np.int64), height.astype(np.int64),
                                               width.astype(np.int64), pitch.astype(np.int64), orientation)
        table = np.stack([origin, h, w, row, col, slots.astype(np.int64)], axis=1)
        assert table.shape[1] == JOB_FIELDS
        scaling = self._scaling.upload([self._mean_std], stream)
        jobs = self._jobs.upload([np.ascontiguousarray(table)], stream)
        k = spec(KERNEL)
        plane = self.size * self.size
        launch_async(self.kernels[KERNEL], (k.blocks(plane), len(table), 1), k.block, stream, jobs, y_ptr, scaling,
                     self.size, CHANNELS * plane)
        drv = driver()
        self._done = drv.Event(drv.event_flags.DISABLE_TIMING)
        self._done.record(stream)

    def wait(self) -> None:
        if self._done is not None:
            self._done.synchronize()
            self._done = None

    def close(self) -> None:
        self.wait()
        self._jobs.free()
        self._scaling.free()
