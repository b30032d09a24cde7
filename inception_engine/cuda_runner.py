"""The cuda backend as the streaming pipeline's runner (pipeline.Runner): decoded images in, top-k out.

The runner joins the two sides the pipeline connects: the input side's host ring and GPU JPEG decoder (ingest) and
the backend (backends.cuda: its plan, buffers, kernels and CUDA graph), which never sees the input side.

Per batch, two streams and two sets of buffers (turn k = batch number % 2):

    host:            wait copied[k] (two batches ago) ─> gather the batch's ring slots into pinned staging[k]
                     (the ring page-locked: none; the copy below is from its slots, and waited for)
    copy stream:     wait normalized[k] ─> staging[k] -> u8[k] ─> copied[k]
    compute stream:  wait copied[k] ─> normalize_u8_nchw u8[k] -> input ─> normalized[k] ─> forward (the backend's
                     CUDA graph) ─> softmax_topk_rows logits -> top[k] ─> copy top[k] to the host ─> done[k]

so batch i + 1's bytes cross PCIe while batch i's forward runs, a quarter of the float32 input's bytes cross at
all, and only k (index, probability) pairs per image come back. With an FID tool's resize the decode workers hand
over the decoded pixels (Preprocess.gpu_resize's slots: 196 KB a 256x256 image against the resized float32 input's
1 MB, and no resize on the host's cores), and the compute stream resizes them into the forward's input with the GPU
decode path's kernels (gpu_fid_resize.py) instead of normalising; an image too large for its slot comes resized on
the host, the input itself, copied as it is. The ring is page-locked in place where the driver
allows (device.HostRegistration: cuMemHostRegister through ctypes, since pycuda 2026.1's register_host_memory fails
on it with a SystemError from Boost.Python), so the copy is DMA straight from its slots, waited for before submit
returns; elsewhere the batch is gathered into pinned staging[k] first, a memcpy on the host (a few ms a batch, on
the one thread that feeds the GPU, beside many decode workers). A partial last batch runs the full batch's forward
(the rows past it hold an earlier batch's pixels and are not read back): one more forward of a few milliseconds
instead of a second plan, tuning and graph.

With --decode gpu the files of a decode call (images.decode_call_images: whole batches) are decoded straight into a
u8 buffer of that many images on a chain's copy stream (``decode``), and the compute stream takes them a batch at a time
(``split``, ``classify``); two decode calls' batches may be outstanding there (``depth``), each turn with its own
top-k buffers, so the forward has work queued while the host hands out a call's results.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .backends.cuda.backend import CudaBackend
from .backends.cuda.device import HostRegistration, driver
from .backends.cuda.kernels import launch_async, spec
from .errors import EngineError
from .ingest import jpeg_decode
from .ingest.gpu_fid_resize import FID_RESIZES
from .ingest.images import SLOT_HEADER, SLOT_PIXELS, Preprocess, decode_call_images, decode_u8_bytes
from .ingest.ring import HostRing
from .pipeline import TopK

TOPK_N = 1024  # pipeline_io.cu's TOPK_N: the most classes softmax_topk_rows sorts



class DecodeCancelled(Exception):
    """``decode`` was waiting for a free buffer when the run ended."""


class BufferTurns:
    """Which decode call writes which u8 buffer: call c takes buffer c % n once call c - n, its last user, has given
    it back. Calls decoded on several threads so take the buffers in call order: a later call that took a buffer
    first could leave an earlier one waiting on a consumer that waits for that earlier call."""

    def __init__(self, n: int):
        self.n = n
        self._next = list(range(n))  # the call that takes each buffer next
        self._held = [False] * n
        self._cancelled = False
        self._cond = threading.Condition()

    def take(self, call: int) -> int | None:
        """Call ``call``'s buffer, once free (None: ``cancel`` was called). A call number taken before raises: two
        numberings of one runner's calls (its submit_encoded's and a caller's decode) would wait on each other."""
        b = call % self.n
        with self._cond:
            if call < self._next[b] or (call == self._next[b] and self._held[b]):
                raise RuntimeError(f"decode call {call} was numbered twice: a runner's decode calls take one "
                                   f"numbering (its decode or its submit_encoded, not both)")
            self._cond.wait_for(lambda: self._cancelled or (self._next[b] == call and not self._held[b]))
            if self._cancelled:
                return None
            self._held[b] = True
            return b

    def give(self, b: int) -> None:
        with self._cond:
            self._held[b] = False
            self._next[b] += self.n
            self._cond.notify_all()

    def cancel(self) -> None:
        """Wakes every ``take`` waiting (the run is over)."""
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()


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
    turn: int  # which set of result buffers (batch number % depth)
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
    def __init__(self, backend: CudaBackend, pre: Preprocess, gpu_decode: bool = False, decode_threads: int = 0,
                 started: Any = None, features: bool = False, decode_chains: int | None = None,
                 gpu_resize: bool = False):
        """gpu_decode: make the backend's JPEG decoders now (for submit_encoded and decode), so that a decoder that
        cannot be made stops the run before its first image rather than at its first batch; with decode_threads
        host threads each (0: one per CPU), from ``started`` (jpeg_decode.NativeStart) where given; decode_chains of
        them (None: jpeg_decode.DECODE_CHAINS), each a decode call in flight. features: copy each batch's pool
        features back beside its top-k (``features_of``). gpu_resize: host-decoded images of an FID tool's resize
        come as slots of decoded pixels (Preprocess.gpu_resize: its ``ring_pre``), resized here; the streaming
        pipeline's runner. Without it (the server's) they come as the network's input."""
        drv = driver()
        plan = backend.plan
        self.classes = plan.output.channels
        if self.classes > TOPK_N:
            raise EngineError(f"the GPU top-k handles up to {TOPK_N} classes; this model has {self.classes}")
        if plan.input.dims[1:] != (3, pre.size, pre.size):
            raise EngineError(f"the plan's input {plan.input.dims} does not take {pre.size}x{pre.size} images")
        self.backend, self.batch, self.pre = backend, plan.batch, pre
        # host-decoded images of an FID tool's resize come as decoded pixels, resized here (Preprocess.gpu_resize)
        self._host_resize = gpu_resize and not gpu_decode and pre.mode in FID_RESIZES
        self.ring_pre = replace(pre, gpu_resize=True) if self._host_resize else pre
        # files per decode call (--decode gpu); its buffers hold that many images, classified a batch at a time
        self.decode_batch = decode_call_images(self.batch) if gpu_decode else self.batch
        # batches outstanding on the GPU: with --decode gpu, two decode calls' worth, so that the forward has work
        # queued while this thread hands out a call's results; the host-decoded path stages per turn (two)
        self.depth = 2 * (self.decode_batch // self.batch) if gpu_decode else 2
        # a buffer's image: uint8 (size, size, 3) pixels, normalised on the GPU; a slot of decoded pixels, resized on
        # the GPU (ring_pre); else with an FID tool's resize the network's float32 input (3, size, size), copied
        self._fid_input = pre.pixel_dtype != np.uint8
        self._image_bytes = int(np.prod(self.ring_pre.decoded_shape)) * np.dtype(self.ring_pre.pixel_dtype).itemsize
        self._ring: np.ndarray | None = None
        self._ring_pin: HostRegistration | None = None
        self._decoders: list[Any] = []  # the backend's jpeg_decode.GpuJpegDecoders, one per decode chain
        self._decode_threads = decode_threads
        self._turn = 0
        self._serial_calls = 0  # submit_encoded's decode calls (decode's are numbered by its caller)
        self._allocs: list[Any] = []
        self._feat_host: list[np.ndarray] = []  # per turn, with ``features``
        with backend.gpu:
            kernels = backend.kernels
            self._normalize = kernels["normalize_u8_nchw"]
            # the host-decoded FID images' resize (gpu_fid_resize.py)
            self._resize = FID_RESIZES[pre.mode](kernels, pre.mean, pre.std, pre.size) if self._host_resize else None
            self._topk = kernels["softmax_topk_rows"]
            self._prob = [self._alloc(self.batch * self.classes * 4) for _ in range(self.depth)]
            self._index = [self._alloc(self.batch * self.classes * 4) for _ in range(self.depth)]
            self._mean_std = self._alloc(6 * 4)
            drv.memcpy_htod(self._mean_std, np.asarray((*pre.mean, *pre.std), np.float32))
            # pinned (batch, size, size, 3) per turn, where submit gathers ring slots: made at its first gather (a
            # page-locked ring or GPU decoding needs none)
            self._staging: list[np.ndarray] = []
            self._prob_host = [drv.pagelocked_empty(self.batch * self.classes, np.float32) for _ in range(self.depth)]
            self._index_host = [drv.pagelocked_empty(self.batch * self.classes, np.int32) for _ in range(self.depth)]
            self._done = [drv.Event(drv.event_flags.DISABLE_TIMING) for _ in range(self.depth)]
            width = backend.features_width if features else 0
            self._feat_host = [drv.pagelocked_empty((self.batch, width), np.float32)
                               for _ in range(self.depth if features else 0)]
            self._copies: list[Any] = [drv.Stream(1)]
        if gpu_decode:
            try:
                with backend.gpu:
                    self._decoders = jpeg_decode.reuse_decoders(backend.jpeg_decoders, backend.kernels, pre,
                                                                decode_threads, self.decode_batch,
                                                                decode_chains or jpeg_decode.DECODE_CHAINS, started)
                    self._copies += [drv.Stream(1) for _ in self._decoders[1:]]
            except BaseException:
                self.close()
                raise
        self._copy = self._copies[0]  # the host-decoded path's, and the first decode chain's
        # u8 buffers: the host-decoded path's two turns; decoding on the GPU, one per decode chain being decoded,
        # one decoded and waiting, one being classified (a buffer returns once its last normalize is
        # enqueued, so the copy stream's wait for its normalized event always finds that event recorded)
        buffers = len(self._decoders or [None]) + 2
        with backend.gpu:
            self._u8 = [self._alloc(self.decode_batch * self._image_bytes) for _ in range(buffers)]
            flags = drv.event_flags.DISABLE_TIMING
            self._copied = [drv.Event(flags) for _ in range(buffers)]
            self._normalized = [drv.Event(flags) for _ in range(buffers)]
        self._turns = BufferTurns(buffers)

    @property
    def decode_chains(self) -> int:
        """Decode calls this runner takes at once (``decode``'s ``call`` picks the chain): one per decoder."""
        return max(1, len(self._decoders))

    @property
    def decode_fallback(self) -> str | None:
        """Why the GPU decoder reads files through nvImageCodec's Python API instead of jpeg_batch.c (None: it
        does not, or this runner has no decoder)."""
        return getattr(self._decoders[0], "native_unavailable", None) if self._decoders else None

    def _alloc(self, nbytes: int) -> int:
        a = driver().mem_alloc(max(nbytes, 4))
        self._allocs.append(a)
        return int(a)

    def attach(self, ring: HostRing) -> None:
        """The ring whose slots ``submit`` takes, page-locked where the driver allows (HostRegistration) until
        ``close``."""
        self._ring = ring.array
        with self.backend.gpu:
            self._unpin_ring()
            pin = HostRegistration(ring.array)
            self._ring_pin = pin if pin.ok else None  # None: submit gathers into pinned staging

    def _unpin_ring(self) -> None:
        """Lets go of the ring's page-locking (the context current)."""
        if self._ring_pin is not None:
            self._ring_pin.close()
            self._ring_pin = None

    def submit(self, slots: list[int], top_k: int) -> Ticket:
        """Classify the images in these ring slots (decoded on the host). The slots are free again when it
        returns: copied straight from the page-locked ring (waited for), else gathered into pinned staging first."""
        self._check(len(slots), top_k)
        drv, k = driver(), self._next_turn()
        direct = self._ring_pin is not None
        with self.backend.gpu:
            if self._turn > 2:  # u8[k] (and staging[k]) still hold the batch before last until these are done
                if not direct:
                    self._copied[k].synchronize()
                self._copy.wait_for_event(self._normalized[k])
            heads = self._ring[slots, :SLOT_HEADER].view(np.int32) if self._host_resize else None
            if direct and heads is not None:  # each slot's bytes in use only
                used = np.where(heads[:, 0] == SLOT_PIXELS, SLOT_HEADER + heads[:, 1] * heads[:, 2] * 3,
                                self._image_bytes)
                for row, (slot, nbytes) in enumerate(zip(slots, used.tolist())):
                    drv.memcpy_htod_async(self._u8[k] + row * self._image_bytes, self._ring[slot, :nbytes], self._copy)
            elif direct:
                for first, end, row in slot_runs(slots):
                    drv.memcpy_htod_async(self._u8[k] + row * self._image_bytes, self._ring[first:end], self._copy)
            else:
                if not self._staging:
                    self._staging = [drv.pagelocked_empty((self.batch, *self.ring_pre.decoded_shape),
                                                          self.ring_pre.pixel_dtype) for _ in range(2)]
                staging = self._staging[k]
                for first, end, row in slot_runs(slots):
                    staging[row:row + end - first] = self._ring[first:end]
                drv.memcpy_htod_async(self._u8[k], staging[:len(slots)], self._copy)
            self._classify(k, len(slots), top_k, heads=heads)
            if direct:
                self._copied[k].synchronize()
        return Ticket(k, len(slots), top_k)

    def submit_encoded(self, items: list[tuple[str, bytes]], top_k: int) -> Ticket:
        """Classify these files (path, bytes), at most a batch: JPEGs decoded and resized on the GPU (jpeg_decode),
        the rest on the host; a file that cannot be decoded gets its error in the result."""
        if not 1 <= len(items) <= self.batch:
            raise ValueError(f"{len(items)} images: outside this runner's batch of {self.batch}")

        def fill(dec: Any, dst: int, cpu: Callable, stream: Any) -> list[str | None]:
            if dec.reads_files:  # jpeg_batch.c reads the files itself (again: they are in the page cache)
                return dec.decode_files([name for name, _ in items], dst, stream, cpu)
            return dec.decode_into(items, dst, stream, cpu)

        self._serial_calls += 1
        return self.classify(self._decode_with(len(items), fill, self._serial_calls - 1), top_k)

    def decode(self, paths: list[str], call: int) -> Decoded:
        """Read and decode these files (at most ``decode_batch``), the run's decode call number ``call``, into a
        free u8 buffer; a file that cannot be read or decoded gets its error in the result. Calls may run on
        ``decode_chains`` threads at once (call c on chain c % decode_chains), beside the one that calls
        ``classify`` (pipeline.classify_encoded); each blocks only until its buffer is free (``BufferTurns``), and
        raises DecodeCancelled if ``cancel_decode`` is called meanwhile."""
        if not 1 <= len(paths) <= self.decode_batch:
            raise ValueError(f"{len(paths)} images: outside this runner's decode batch of {self.decode_batch}")
        return self._decode_with(len(paths), lambda dec, dst, cpu, stream: dec.decode_files(paths, dst, stream, cpu),
                                 call)

    def _decode_with(self, n: int, fill: Callable[[Any, int, Callable, Any], list[str | None]], call: int) -> Decoded:
        """fill(decoder, buffer address, cpu fallback, stream) decodes n images into call ``call``'s buffer on its
        chain's decoder and copy stream; its errors per image."""
        if not self._decoders:  # made without gpu_decode: one decoder, made at the first call
            with self.backend.gpu:
                self._decoders = jpeg_decode.reuse_decoders(self.backend.jpeg_decoders, self.backend.kernels,
                                                            self.pre, self._decode_threads, self.decode_batch)
        i = self._turns.take(call)
        if i is None:
            raise DecodeCancelled()
        chain = call % len(self._decoders)
        copy = self._copies[chain]
        try:
            with self.backend.gpu:
                if call >= self._turns.n:  # call - n used the buffer: its last batch must be normalised first
                    copy.wait_for_event(self._normalized[i])
                errors = fill(self._decoders[chain], self._u8[i], self._cpu_path, copy)
                self._copied[i].record(copy)
        except BaseException:  # no batch of this call will give the buffer back: call i + n would wait for ever
            self._turns.give(i)
            raise
        return Decoded(i, n, errors)

    def _cpu_path(self, path: str, data: bytes) -> np.ndarray:
        """A file the GPU decoder leaves to the CPU, as a slot of the decode buffer holds it."""
        return decode_u8_bytes(data, path, self.pre)  # an FID tool's: the network's input already

    def cancel_decode(self) -> None:
        """Wakes every ``decode`` waiting for a buffer (the run is over): they raise DecodeCancelled."""
        self._turns.cancel()

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
            self._turns.give(decoded.buffer)
        return Ticket(k, decoded.images, top_k, decoded.errors)

    def _check(self, n: int, top_k: int) -> None:
        if not 1 <= n <= self.batch or not 1 <= top_k <= self.classes:
            raise ValueError(f"{n} images, top-{top_k}: outside this runner's batch or classes")

    def _next_turn(self) -> int:
        self._turn += 1
        return (self._turn - 1) % self.depth

    def _classify(self, k: int, n: int, top_k: int, buffer: int | None = None, first: int = 0,
                  heads: np.ndarray | None = None) -> None:
        """After u8[buffer]'s copy or decode was enqueued on the copy stream and its ``copied`` event recorded (by
        ``decode``; here for the host-decoded path, whose buffer is k): normalise its rows first .. first + batch - 1
        (a decode buffer holds whole batches), or resize them where they are slots of decoded FID images (``heads``:
        their SLOT_HEADERs), forward, top-k into turn k's buffers, copy back."""
        drv, b = driver(), self.backend
        hw = self.pre.size * self.pre.size
        if buffer is None:
            buffer = k
            self._copied[k].record(self._copy)
        b.stream.wait_for_event(self._copied[buffer])
        if heads is not None:
            self._resize_slots(heads, self._u8[k], b)
        elif self._fid_input:  # the network's input already (3 * hw floats an image)
            drv.memcpy_dtod_async(b.input_ptr, self._u8[buffer] + first * self._image_bytes,
                                  self.batch * self._image_bytes, b.stream)
        else:
            normalize = spec("normalize_u8_nchw")
            launch_async(self._normalize, (normalize.blocks(hw), self.batch, 1), normalize.block, b.stream,
                         self._u8[buffer] + first * self._image_bytes, b.input_ptr, self._mean_std, hw, 3 * hw)
        self._normalized[buffer].record(b.stream)
        b.replay()
        launch_async(self._topk, (n, 1, 1), spec("softmax_topk_rows").block, b.stream, b.output_ptr, self._prob[k],
                     self._index[k], self.classes, self.classes, top_k)
        drv.memcpy_dtoh_async(self._prob_host[k][:n * top_k], self._prob[k], b.stream)
        drv.memcpy_dtoh_async(self._index_host[k][:n * top_k], self._index[k], b.stream)
        if self._feat_host:
            drv.memcpy_dtoh_async(self._feat_host[k][:n], b.features_ptr, b.stream)
        self._done[k].record(b.stream)

    def _resize_slots(self, heads: np.ndarray, base: int, b: CudaBackend) -> None:
        """Slots of host-decoded FID images (Preprocess.gpu_resize) at base into the forward's input rows, on the
        compute stream: decoded pixels resized, an input resized on the host copied."""
        rows = np.arange(len(heads), dtype=np.int64)
        after_head = base + rows * self._image_bytes + SLOT_HEADER
        raw = heads[:, 0] == SLOT_PIXELS
        input_bytes = 3 * self.pre.size * self.pre.size * 4
        for row in rows[~raw].tolist():
            driver().memcpy_dtod_async(b.input_ptr + row * input_bytes, int(after_head[row]), input_bytes, b.stream)
        if raw.any():
            h, w = heads[raw, 1].astype(np.int64), heads[raw, 2].astype(np.int64)
            self._resize.enqueue_arrays(after_head[raw], h, w, w * 3, rows[raw], b.input_ptr, b.stream)

    def result(self, ticket: Ticket) -> list[TopK | str]:
        """Top-k per image, or the error message of a file submit_encoded could not decode."""
        k, n, top_k = ticket.turn, ticket.images, ticket.top_k
        with self.backend.gpu:
            self._done[k].synchronize()
        prob = self._prob_host[k][:n * top_k].reshape(n, top_k)
        index = self._index_host[k][:n * top_k].reshape(n, top_k)
        tops: list[TopK | str] = [list(zip(ri, rp)) for ri, rp in zip(index.tolist(), prob.tolist())]
        return [err or top for top, err in zip(tops, ticket.errors or [None] * n)]

    def features_of(self, ticket: Ticket) -> np.ndarray:
        """The pool features of the ticket's images (a runner made with ``features``), a row each in order; a
        file that could not be decoded has a row of whatever the slot held."""
        with self.backend.gpu:
            self._done[ticket.turn].synchronize()
        return self._feat_host[ticket.turn][:ticket.images].copy()

    def close(self) -> None:
        """Waits for the GPU, then lets go of the ring (unpinned) and of this runner's buffers; the backend stays."""
        if not self._allocs:
            return
        with self.backend.gpu:
            self.backend.stream.synchronize()
            for copy in self._copies:
                copy.synchronize()
            self._unpin_ring()
            self._ring = None
            for decoder in self._decoders:
                decoder.release()  # before the copy streams go; the backend keeps the decoders
            if self._resize is not None:
                self._resize.close()
                self._resize = None
            self._decoders = []
            for a in self._allocs:
                a.free()
            self._allocs = []
            for h in (*self._staging, *self._prob_host, *self._index_host, *self._feat_host):
                h.base.free()
            self._staging, self._prob_host, self._index_host, self._feat_host = [], [], [], []
            # events and streams destroyed while the context is current
            self._copied, self._normalized, self._done, self._copies, self._copy = [], [], [], [], None
