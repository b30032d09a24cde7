"""The cuda backend as the streaming pipeline's runner (pipeline.Runner): uint8 pixels in, top-k out.

Per batch, two streams and two sets of buffers (turn k = batch number % 2):

    host:            wait copied[k] (two batches ago) ─> gather the batch's ring slots into pinned staging[k]
    copy stream:     wait normalized[k] ─> staging[k] -> u8[k] ─> copied[k]
    compute stream:  wait copied[k] ─> normalize_u8_nchw u8[k] -> input ─> normalized[k] ─> forward (the backend's
                     CUDA graph) ─> softmax_topk_rows logits -> top[k] ─> copy top[k] to the host ─> done[k]

so batch i + 1's bytes cross PCIe while batch i's forward runs, a quarter of the float32 input's bytes cross at
all, and only k (index, probability) pairs per image come back. The gather into page-locked memory is one memcpy of
the batch on the host (a few ms for 128 images, against the decode workers' seconds); page-locking the ring itself
in place would save it, but pycuda 2026.1's register_host_memory failed on it on the H100 machine (SystemError from
Boost.Python, 2026-11-25). A partial last batch
runs the full batch's forward (the rows past it hold an earlier batch's pixels and are not read back): one more
forward of a few milliseconds instead of a second plan, tuning and graph.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import EngineError
from ...images import Preprocess, decode_u8_bytes
from ...pipeline import HostRing, TopK
from .backend import CudaBackend
from .device import driver
from .kernels import spec

TOPK_N = 1024  # pipeline_io.cu's TOPK_N: the most classes softmax_topk_rows sorts


DECODE_BUFFERS = 3  # u8 buffers for --decode gpu: two in the forward's hands (depth) and one being decoded
# --decode gpu hands nvImageCodec at least this many files a call (a whole number of batches): its call has a fixed
# cost of a few milliseconds, which a batch of 64 does not amortise.
DECODE_IMAGES = 256


class DecodeCancelled(Exception):
    """``decode`` was waiting for a free buffer when the run ended."""


@dataclass(frozen=True)
class Decoded:
    """Images decoded into rows first .. first + images - 1 of u8 buffer ``buffer`` on the copy stream (``copied``
    recorded after them). ``releases``: the buffer is free once these are classified (its last part)."""

    buffer: int
    images: int
    errors: list[str | None]
    first: int = 0
    releases: bool = True


@dataclass(frozen=True)
class Ticket:
    turn: int  # which set of buffers (batch number % 2)
    images: int
    top_k: int
    errors: list[str | None] | None = None  # submit_encoded's per-file decode errors


def slot_runs(slots: list[int]) -> list[tuple[int, int, int]]:
    """(first slot, end slot, first batch row) of each run of consecutive slots: one copy each."""
    runs: list[tuple[int, int, int]] = []
    for row, slot in enumerate(slots):
        if runs and runs[-1][1] == slot:
            first, _, at = runs[-1]
            runs[-1] = (first, slot + 1, at)
        else:
            runs.append((slot, slot + 1, row))
    return runs


class CudaRunner:
    depth = 2

    def __init__(self, backend: CudaBackend, pre: Preprocess, gpu_decode: bool = False, decode_threads: int = 0,
                 started: Any = None):
        """gpu_decode: make the backend's JPEG decoder now (for submit_encoded), so that a decoder that cannot be
        made stops the run before its first image rather than at its first batch; with decode_threads host threads
        (0: one per CPU), from ``started`` (jpeg_decode.start_decoder's) where given."""
        drv = driver()
        plan = backend.plan
        self.classes = plan.output.channels
        if self.classes > TOPK_N:
            raise EngineError(f"the GPU top-k handles up to {TOPK_N} classes; this model has {self.classes}")
        if plan.input.dims[1:] != (3, pre.size, pre.size):
            raise EngineError(f"the plan's input {plan.input.dims} does not take {pre.size}x{pre.size} images")
        self.backend, self.batch, self.pre = backend, plan.batch, pre
        # files per decode call (--decode gpu); its buffers hold that many images, classified a batch at a time
        self.decode_batch = self.batch * max(1, -(-DECODE_IMAGES // self.batch)) if gpu_decode else self.batch
        self._image_bytes = pre.size * pre.size * 3
        self._ring: np.ndarray | None = None
        self._decoder: Any = None  # the backend's jpeg_decode.GpuJpegDecoder, from the first submit_encoded
        self._decode_threads = decode_threads
        self._turn = 0
        self._allocs: list[Any] = []
        with backend.gpu:
            kernels = backend.kernels
            self._normalize = kernels["normalize_u8_nchw"]
            self._topk = kernels["softmax_topk_rows"]
            self._u8 = [self._alloc(self.decode_batch * self._image_bytes) for _ in range(DECODE_BUFFERS)]
            self._prob = [self._alloc(self.batch * self.classes * 4) for _ in range(2)]
            self._index = [self._alloc(self.batch * self.classes * 4) for _ in range(2)]
            self._mean_std = self._alloc(6 * 4)
            drv.memcpy_htod(self._mean_std, np.asarray((*pre.mean, *pre.std), np.float32))
            self._staging = [drv.pagelocked_empty((self.batch, pre.size, pre.size, 3), np.uint8) for _ in range(2)]
            self._prob_host = [drv.pagelocked_empty(self.batch * self.classes, np.float32) for _ in range(2)]
            self._index_host = [drv.pagelocked_empty(self.batch * self.classes, np.int32) for _ in range(2)]
            self._copy = drv.Stream(1)
            flags = drv.event_flags.DISABLE_TIMING
            self._copied = [drv.Event(flags) for _ in range(DECODE_BUFFERS)]
            self._normalized = [drv.Event(flags) for _ in range(DECODE_BUFFERS)]
            self._done = [drv.Event(flags) for _ in range(2)]
            # --decode gpu: buffers free for the next decode; a buffer returns once its normalize is enqueued, so
            # the copy stream's wait for its normalized event always finds that event recorded
            self._free_buffers: queue.Queue[int | None] = queue.Queue()
            for i in range(DECODE_BUFFERS):
                self._free_buffers.put(i)
            self._used_buffers: set[int] = set()
        if gpu_decode:
            try:
                with backend.gpu:
                    self._decoder = backend.jpeg_decoder(pre, decode_threads, self.decode_batch, started)
            except BaseException:
                self.close()
                raise

    @property
    def decode_fallback(self) -> str | None:
        """Why the GPU decoder reads files through nvImageCodec's Python API instead of jpeg_batch.c (None: it
        does not, or this runner has no decoder yet)."""
        return getattr(self._decoder, "native_unavailable", None)

    def _alloc(self, nbytes: int) -> int:
        a = driver().mem_alloc(max(nbytes, 4))
        self._allocs.append(a)
        return int(a)

    def attach(self, ring: HostRing) -> None:
        self._ring = ring.array

    def submit(self, slots: list[int], top_k: int) -> Ticket:
        """Classify the images in these ring slots (decoded on the host)."""
        self._check(len(slots), top_k)
        drv, k = driver(), self._next_turn()
        with self.backend.gpu:
            if self._turn > 2:  # staging[k] and u8[k] still hold the batch before last until these are done
                self._copied[k].synchronize()
                self._copy.wait_for_event(self._normalized[k])
            staging = self._staging[k]
            for first, end, row in slot_runs(slots):
                staging[row:row + end - first] = self._ring[first:end]
            drv.memcpy_htod_async(self._u8[k], staging[:len(slots)], self._copy)
            self._classify(k, len(slots), top_k)
        return Ticket(k, len(slots), top_k)

    def submit_encoded(self, items: list[tuple[str, bytes]], top_k: int) -> Ticket:
        """Classify these files (path, bytes), at most a batch: JPEGs decoded and resized on the GPU (jpeg_decode),
        the rest on the host; a file that cannot be decoded gets its error in the result."""
        if not 1 <= len(items) <= self.batch:
            raise ValueError(f"{len(items)} images: outside this runner's batch of {self.batch}")

        def fill(dec: Any, dst: int, cpu: Callable) -> list[str | None]:
            if dec.reads_files:  # jpeg_batch.c reads the files itself (again: they are in the page cache)
                return dec.decode_files([name for name, _ in items], dst, self._copy, cpu)
            return dec.decode_into(items, dst, self._copy, cpu)

        return self.classify(self._decode_with(len(items), fill), top_k)

    def decode(self, paths: list[str]) -> Decoded:
        """Read and decode these files (at most ``decode_batch``) into a free u8 buffer on the copy stream; a file
        that cannot be read or decoded gets its error in the result. May run on a thread of its own beside the one
        that calls ``classify`` (pipeline.classify_encoded): it blocks only while every buffer is in use, and raises
        DecodeCancelled if ``cancel_decode`` is called meanwhile."""
        if not 1 <= len(paths) <= self.decode_batch:
            raise ValueError(f"{len(paths)} images: outside this runner's decode batch of {self.decode_batch}")
        return self._decode_with(len(paths), lambda dec, dst, cpu: dec.decode_files(paths, dst, self._copy, cpu))

    def _decode_with(self, n: int, fill: Callable[[Any, int, Callable], list[str | None]]) -> Decoded:
        """fill(decoder, buffer address, cpu fallback) decodes n images into a free buffer; its errors per image."""
        i = self._free_buffers.get()
        if i is None:
            raise DecodeCancelled()
        with self.backend.gpu:
            if self._decoder is None:
                self._decoder = self.backend.jpeg_decoder(self.pre, self._decode_threads, self.decode_batch)
            if i in self._used_buffers:  # the buffer's last batch must be normalised before it is overwritten
                self._copy.wait_for_event(self._normalized[i])
            self._used_buffers.add(i)
            errors = fill(self._decoder, self._u8[i], lambda path, data: decode_u8_bytes(data, path, self.pre))
            self._copied[i].record(self._copy)
        return Decoded(i, n, errors)

    def cancel_decode(self) -> None:
        """Wakes a ``decode`` waiting for a buffer (the run is over): it raises DecodeCancelled."""
        self._free_buffers.put(None)

    def split(self, decoded: Decoded) -> list[Decoded]:
        """A decode's images as batches for ``classify``, in order; the last one frees the buffer."""
        starts = range(0, decoded.images, self.batch)
        return [Decoded(decoded.buffer, min(self.batch, decoded.images - a), decoded.errors[a:a + self.batch], a,
                        a == starts[-1]) for a in starts]

    def classify(self, decoded: Decoded, top_k: int) -> Ticket:
        """Normalise, forward and top-k a decoded batch (one of ``split``'s parts), on the compute stream; its buffer
        is free again after its last part."""
        self._check(decoded.images, top_k)
        k = self._next_turn()
        with self.backend.gpu:
            self._classify(k, decoded.images, top_k, decoded.buffer, decoded.first)
        if decoded.releases:
            self._free_buffers.put(decoded.buffer)
        return Ticket(k, decoded.images, top_k, decoded.errors)

    def _check(self, n: int, top_k: int) -> None:
        if not 1 <= n <= self.batch or not 1 <= top_k <= self.classes:
            raise ValueError(f"{n} images, top-{top_k}: outside this runner's batch or classes")

    def _next_turn(self) -> int:
        self._turn += 1
        return (self._turn - 1) % 2

    def _classify(self, k: int, n: int, top_k: int, buffer: int | None = None, first: int = 0) -> None:
        """After u8[buffer]'s copy or decode was enqueued on the copy stream and its ``copied`` event recorded (by
        ``decode``; here for the host-decoded path, whose buffer is k): normalise its rows first .. first + batch - 1
        (a decode buffer holds whole batches), forward, top-k into turn k's buffers, copy back."""
        drv, b = driver(), self.backend
        hw = self.pre.size * self.pre.size
        if buffer is None:
            buffer = k
            self._copied[k].record(self._copy)
        b.stream.wait_for_event(self._copied[buffer])
        normalize = spec("normalize_u8_nchw")
        self._normalize.prepared_async_call((normalize.blocks(hw), self.batch, 1), normalize.block, b.stream,
                                            self._u8[buffer] + first * self._image_bytes, b.input_ptr,
                                            self._mean_std, hw, 3 * hw)
        self._normalized[buffer].record(b.stream)
        b.replay()
        self._topk.prepared_async_call((n, 1, 1), spec("softmax_topk_rows").block, b.stream, b.output_ptr,
                                       self._prob[k], self._index[k], self.classes, self.classes, top_k)
        drv.memcpy_dtoh_async(self._prob_host[k][:n * top_k], self._prob[k], b.stream)
        drv.memcpy_dtoh_async(self._index_host[k][:n * top_k], self._index[k], b.stream)
        self._done[k].record(b.stream)

    def result(self, ticket: Ticket) -> list[TopK | str]:
        """Top-k per image, or the error message of a file submit_encoded could not decode."""
        k, n, top_k = ticket.turn, ticket.images, ticket.top_k
        with self.backend.gpu:
            self._done[k].synchronize()
        prob = self._prob_host[k][:n * top_k].reshape(n, top_k)
        index = self._index_host[k][:n * top_k].reshape(n, top_k)
        tops: list[TopK | str] = [[(int(i), float(p)) for i, p in zip(ri, rp)] for ri, rp in zip(index, prob)]
        return [err or top for top, err in zip(tops, ticket.errors or [None] * n)]

    def close(self) -> None:
        """Waits for the GPU, then lets go of the ring (unpinned) and of this runner's buffers; the backend stays."""
        if not self._allocs:
            return
        with self.backend.gpu:
            self.backend.stream.synchronize()
            self._copy.synchronize()
            self._ring = None
            if self._decoder is not None:
                self._decoder.release()  # before the copy stream goes; the backend keeps the decoder
                self._decoder = None
            for a in self._allocs:
                a.free()
            self._allocs = []
            for h in (*self._staging, *self._prob_host, *self._index_host):
                h.base.free()
            self._staging, self._prob_host, self._index_host = [], [], []
            del self._copied, self._normalized, self._done  # destroyed while the context is current
