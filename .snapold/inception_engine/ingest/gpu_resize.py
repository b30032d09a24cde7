"""The exact PIL resize and centre crop on the GPU (resize_pil.cu) of decoded images in device memory, each read
upright through its EXIF orientation (``upright_views``: the flips and turns that Pillow's exif_transpose makes on
the CPU path, without a copy), into slots of a (N, size, size, 3) uint8 batch.

The passes reproduce Pillow's bytes exactly (pil_resize.py: same coefficients, same rounding, same pass order). They
run on the CUDA kernel layer: the caller's loaded Kernels (backends.cuda.kernels), its context current.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.cuda.device import driver
from ..backends.cuda.kernels import Kernels, launch_async, spec
from .images import Preprocess
from .pil_resize import Coeffs, plan_resize_crop

CHANNELS = 3


@dataclass(frozen=True)
class DeviceImage:
    """A decoded HWC uint8 RGB image in device memory."""

    ptr: int  # address of pixel (0, 0)
    height: int
    width: int
    pitch: int  # bytes from one row to the next


# EXIF orientation -> how its upright view O (what Pillow's exif_transpose makes) reads the stored image S of h rows
# and w columns: O[0][0] is S[(h - 1) * a][(w - 1) * b], a step down O's rows moves (dy, dx) in S, a step along a row
# (dy', dx'). Rows: (a, b, dy, dx, dy', dx'), checked against Pillow's transposes (tests/kernels/test_resize_pil.py).
ORIENTATION_STEPS = np.array([
    (0, 0, 1, 0, 0, 1),  # 0: not an EXIF value; never given (as 1)
    (0, 0, 1, 0, 0, 1),  # 1: upright
    (0, 1, 1, 0, 0, -1),  # 2: mirrored left to right
    (1, 1, -1, 0, 0, -1),  # 3: turned 180 degrees
    (1, 0, -1, 0, 0, 1),  # 4: mirrored top to bottom
    (0, 0, 0, 1, 1, 0),  # 5: transposed
    (1, 0, 0, 1, -1, 0),  # 6: turned 90 degrees clockwise to be upright (Pillow's ROTATE_270)
    (1, 1, 0, -1, -1, 0),  # 7: transversed
    (0, 1, 0, -1, 1, 0),  # 8: turned 90 degrees counter-clockwise (ROTATE_90)
], np.int64)


def upright_views(ptr: np.ndarray, height: np.ndarray, width: np.ndarray, pitch: np.ndarray,
                  orientation: np.ndarray) -> tuple[np.ndarray, ...]:
    """Stored images (address, height, width, row pitch) seen upright as their EXIF orientation says: the address of
    the upright view's first pixel, its height and width, and its row and column steps in bytes (resize_pil.cu's
    in_row, in_col), per image."""
    a, b, dy, dx, dy2, dx2 = ORIENTATION_STEPS[orientation].T
    transposed = dx != 0
    origin = ptr + a * (height - 1) * pitch + b * (width - 1) * CHANNELS
    return (origin, np.where(transposed, width, height), np.where(transposed, height, width),
            dy * pitch + dx * CHANNELS, dy2 * pitch + dx2 * CHANNELS)


@dataclass(frozen=True)
class Pass:
    """One image's pass by resize_pil_h or resize_pil_v (resize_pil.cu): its coefficients and output shape."""

    kernel: str
    coeffs: Coeffs
    out_rows: int
    out_cols: int


@dataclass(frozen=True)
class Schedule:
    """The two passes for an image of one size: the first reads source rows (or columns) lo .. lo + n - 1 into
    the intermediate (out_rows x out_cols), the second writes the crop."""

    first: Pass
    second: Pass
    lo: int
    vertical_first: bool

    @property
    def tmp_bytes(self) -> int:
        return self.first.out_rows * self.first.out_cols * CHANNELS


@functools.lru_cache(maxsize=512)
def schedule(h: int, w: int, resize: int, size: int) -> Schedule:
    """The two passes of an h x w image (cached: a data set has few distinct sizes)."""
    plan = plan_resize_crop(h, w, resize, size)
    lo, n = plan.first_span()
    if plan.vertical_first:
        return Schedule(Pass("resize_pil_v", plan.y, size, n), Pass("resize_pil_h", plan.x.shifted(lo), size, size),
                        lo, True)
    return Schedule(Pass("resize_pil_h", plan.x, n, size), Pass("resize_pil_v", plan.y.shifted(lo), size, size),
                    lo, False)


class Staged:
    """A pinned host array and its device copy, both grown to fit (by the caller's leave: after the last use)."""

    def __init__(self, dtype: type):
        self.dtype = np.dtype(dtype)
        self.host = np.empty(0, self.dtype)
        self.dev: Any = None

    def upload(self, parts: Sequence[np.ndarray], stream: Any) -> int:
        """The parts, concatenated, copied to the device on stream (one copy); their device address."""
        drv = driver()
        n = sum(p.size for p in parts)
        if n > self.host.size:
            self.free()
            self.host = drv.pagelocked_empty((2 * n,), self.dtype)
            self.dev = drv.mem_alloc(self.dtype.itemsize * 2 * n)
        np.concatenate([p.ravel() for p in parts], out=self.host[:n])
        drv.memcpy_htod_async(int(self.dev), self.host[:n], stream)
        return int(self.dev)

    def free(self) -> None:
        if self.dev is not None:
            self.dev.free()
            self.host.base.free()  # pagelocked_empty's array base is its host allocation
            self.dev, self.host = None, np.empty(0, self.dtype)


# resize_pil.cu's RESIZE_PIL_JOB: src, dst, start, weights, taps, out_rows, out_cols, the source's row and column steps,
# the destination's row pitch
JOB_FIELDS = 10


class QueuedResize:
    """What the GPU resizes (GpuResizeCrop; ingest.gpu_fid_resize's) share: ``enqueue`` of (image, slot, EXIF
    orientation) jobs as the arrays the subclass's ``enqueue_arrays`` takes, the event after a batch's last launch
    that ``wait`` blocks on, an intermediate device buffer that grows when a batch needs more (``_scratch``), and
    ``close``, which frees it and the staged buffers ``_staged`` names."""

    def __init__(self) -> None:
        self._done: Any = None  # event after the last batch's last launch
        self._tmp: Any = None
        self._tmp_bytes = 0

    def enqueue(self, jobs: Sequence[tuple[DeviceImage, int, int]], dst_ptr: int, stream: Any) -> None:
        """For each (image, slot, EXIF orientation): the image as it stands upright into slot `slot` of the batch at
        dst_ptr."""
        self.enqueue_arrays(*(np.array([getattr(img, f) for img, _, _ in jobs], np.int64)
                              for f in ("ptr", "height", "width", "pitch")),
                            np.array([slot for _, slot, _ in jobs], np.int64), dst_ptr, stream,
                            np.array([o for _, _, o in jobs], np.int64))

    def enqueue_arrays(self, ptr: np.ndarray, height: np.ndarray, width: np.ndarray, pitch: np.ndarray,
                       slots: np.ndarray, dst_ptr: int, stream: Any, orientation: np.ndarray | None = None) -> None:
        """``enqueue`` with the images as arrays (address, height, width, row pitch as stored, slot, EXIF orientation:
        all 1 where None), once the last batch no longer needs the buffers: the subclass's ``_enqueue_upright`` of
        the images seen upright (upright_views)."""
        self.wait()
        if len(ptr) == 0:
            return
        if orientation is None:
            orientation = np.ones(len(ptr), np.int64)
        origin, h, w, row, col = upright_views(ptr.astype(np.int64), height.astype(np.int64),
                                               width.astype(np.int64), pitch.astype(np.int64), orientation)
        self._enqueue_upright(origin, h, w, row, col, slots.astype(np.int64), dst_ptr, stream)

    def _enqueue_upright(self, origin: np.ndarray, height: np.ndarray, width: np.ndarray, row: np.ndarray,
                         col: np.ndarray, slots: np.ndarray, dst_ptr: int, stream: Any) -> None:
        """The batch's launches for upright images (upright_views' address, height, width, row and column steps)."""
        raise NotImplementedError

    def _staged(self) -> tuple[Staged, ...]:
        raise NotImplementedError

    def _scratch(self, need: int) -> int:
        """The intermediate buffer's address, grown to ``need`` bytes (after ``wait``: nothing still reads it)."""
        if need > self._tmp_bytes:
            if self._tmp is not None:
                self._tmp.free()
            self._tmp, self._tmp_bytes = driver().mem_alloc(need), need
        return int(self._tmp)

    def _record(self, stream: Any) -> None:
        drv = driver()
        self._done = drv.Event(drv.event_flags.DISABLE_TIMING)
        self._done.record(stream)

    def wait(self) -> None:
        if self._done is not None:
            self._done.synchronize()
            self._done = None

    def close(self) -> None:
        self.wait()
        for staged in self._staged():
            staged.free()
        if self._tmp is not None:
            self._tmp.free()
            self._tmp = None


class GpuResizeCrop(QueuedResize):
    """Enqueues resize_pil.cu's passes for decoded device images into slots of a (N, size, size, 3) uint8 batch.

    A batch is at most four launches, whatever its size: the first passes taken horizontally, those taken
    vertically, then the second passes likewise, each launch running one job (an image's pass) per grid row. The
    coefficient tables and the jobs of a batch travel in two pinned buffers, one copy each; each image has its own
    part of the intermediate buffer. Buffers grow when a batch needs more (after the previous batch's work is done);
    ``wait`` blocks until the last enqueued batch no longer needs them (its tables copied, its source images read)."""

    def __init__(self, kernels: Kernels, pre: Preprocess):
        super().__init__()
        self.kernels, self.pre = kernels, pre
        self._tables = Staged(np.int32)
        self._jobs = Staged(np.int64)

    def _staged(self) -> tuple[Staged, ...]:
        return self._tables, self._jobs

    def _enqueue_upright(self, ptr: np.ndarray, height: np.ndarray, width: np.ndarray, row: np.ndarray,
                         col: np.ndarray, slots: np.ndarray, dst_ptr: int, stream: Any) -> None:
        """Python work per distinct image size, not per image."""
        size = self.pre.size
        sizes, image_size = np.unique(height << 32 | width, return_inverse=True)
        scheds = [schedule(int(k >> 32), int(k & 0xFFFFFFFF), self.pre.resize, size) for k in sizes]
        pieces, offsets, pos = [], [], 0  # each size's coefficient tables, once
        for s in scheds:
            for p in (s.first, s.second):
                offsets.append((pos, pos + len(p.coeffs.start)))
                pieces += [p.coeffs.start, p.coeffs.weights]
                pos += len(p.coeffs.start) + p.coeffs.weights.size
        tables = self._tables.upload(pieces, stream)
        per_size = np.array([(s.lo, s.vertical_first, s.tmp_bytes, *(x for p in (s.first, s.second) for x in (
            p.coeffs.taps, p.out_rows, p.out_cols))) for s in scheds], np.int64)[image_size]
        table_at = tables + 4 * np.array(offsets, np.int64).reshape(len(scheds), 4)[image_size]
        lo, vertical, tmp_bytes = per_size[:, 0], per_size[:, 1].astype(bool), per_size[:, 2]
        # each image has its part of the intermediate buffer; the first pass reads the upright view from its row (or
        # column) lo
        mid = self._scratch(int(tmp_bytes.sum())) + np.cumsum(tmp_bytes) - tmp_bytes
        mid_pitch = per_size[:, 5] * CHANNELS
        first = np.stack([ptr + np.where(vertical, lo * col, lo * row), mid, table_at[:, 0], table_at[:, 1],
                          per_size[:, 3], per_size[:, 4], per_size[:, 5], row, col, mid_pitch], axis=1)
        second = np.stack([mid, dst_ptr + slots * (size * size * CHANNELS), table_at[:, 2], table_at[:, 3],
                           per_size[:, 6], per_size[:, 7], per_size[:, 8], mid_pitch, np.full_like(mid, CHANNELS),
                           np.full_like(mid, size * CHANNELS)], axis=1)
        assert first.shape[1] == second.shape[1] == JOB_FIELDS
        # every first pass before any second pass (one stream: in this order), each pass by its kernel
        launches = [(name, table) for name, table in (
            ("resize_pil_h", first[~vertical]), ("resize_pil_v", first[vertical]),
            ("resize_pil_h", second[vertical]), ("resize_pil_v", second[~vertical])) if len(table)]
        base = self._jobs.upload([np.ascontiguousarray(t) for _, t in launches], stream)
        for kernel, table in launches:
            most = int((table[:, 5] * table[:, 6]).max()) * CHANNELS
            k = spec(kernel)
            launch_async(self.kernels[kernel], (k.blocks(most), len(table), 1), k.block, stream, base)
            base += table.nbytes
        self._record(stream)
