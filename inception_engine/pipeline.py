"""Streaming classification: images in, predictions out in input order, decode overlapped with the forward.

    decode workers ──> host ring of uint8 slots ──> runner (GPU or CPU) ──> top-k ──> Prediction, in order
    (threads or          (size x size x 3 bytes       submit(slots) copies a batch out and starts it,
     processes)           per image)                  result(ticket) waits for it

This module joins the input side (``ingest``: the decode workers, the ring, reading files) to a runner, which holds
a backend (``HostRunner`` here for any backend's forward; ``cuda_runner.CudaRunner`` for the cuda backend, where the
GPU decoder joins it too). Decoding (Pillow: read, EXIF orientation, RGB, Resize, CenterCrop) runs in a pool of
workers (ingest.workers.DecodePool), which write each image's uint8 pixels straight into a slot of a ring of host
memory (ingest.ring.HostRing): image number ``seq`` goes to slot ``seq % slots``. Processes decode 2.7x faster than
threads on the H100 machine's 16 cores; threads start instantly, so short runs use them. The main thread keeps the
pool ``slots`` images ahead of the oldest slot still in use, gathers decoded images into batches and hands each
batch's slots to the runner, which copies them out (the cuda runner into pinned memory, then over PCIe on a copy
stream while the previous batch's forward runs) and frees them for the next images. Host memory is ``slots`` images
whatever the number of inputs. An image that cannot be decoded gets its error Prediction in its place in the output
and the rest goes on.

``classify_encoded`` is the same stream for --decode gpu: this thread reads the files, the runner decodes.
"""

from __future__ import annotations

import functools
import os
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import BrokenExecutor, Future
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from PIL import Image

from .errors import EngineError, first_line
from .ingest.files import ImageSource, read_batch, source_name
from .ingest.images import Preprocess, network_input
from .ingest.ring import HostRing
from .ingest.workers import DecodePool, default_workers
from .labels import Labels, imagenet_labels
from .results import ComputedBy, Prediction, TopK, labelled, make_predictions

# auto: processes for runs of at least this many images (2,841 against threads' 1,040 images/s of decode on the H100
# machine's 16 cores: the GIL serialises Pillow's Python parts, docs/PERFORMANCE.md), threads below (no start-up).
PROCESS_MIN_IMAGES = 256


# Called as each batch finishes, before its results are handed out: the input indices of the images it classified
# and their pool features, a row each (Engine.predict_iter's ``on_features``; the runner made with features=True)
OnFeatures = Callable[[list[int], np.ndarray], None]
# What a stream hands out for a batch of results, in order: from each image's name and its top-k, or its error
# message (None: a Prediction each; Engine.predict_iter's ``render``: each one's line of an output file)
Finish = Callable[[list[str], list[TopK | str]], list[Any]]


def predictions_by(computed_by: ComputedBy, labels: Labels | None = None) -> Finish:
    """A stream's Finish of Predictions: make_predictions recording ``computed_by``, naming classes by ``labels``
    (None: ImageNet's, the classifier's; Engine passes its network's)."""
    return functools.partial(make_predictions, computed_by=computed_by,
                             labels=imagenet_labels() if labels is None else labels)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (max subtracted, so large logits do not overflow)."""
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


def top_k_rows(probs: np.ndarray, k: int) -> list[TopK]:
    """The k most likely classes of each probability row; ties broken by the lower index."""
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    return [[(int(i), float(p[i])) for i in row] for p, row in zip(probs, order)]


def top_classes(probs: np.ndarray, k: int, labels: Labels | None = None) -> list[tuple[int, str, float]]:
    """The k most likely classes of one probability row, with their names in ``labels`` (None: ImageNet's)."""
    return labelled(top_k_rows(probs[None], k)[0], imagenet_labels() if labels is None else labels)


# ------------------------------------------------------------------------------------------------------ runners

class Runner(Protocol):
    """Classifies batches of ring slots; ``submit`` copies the slots' images out and may return before the work is
    done, ``result`` waits for it. At most ``depth`` submitted batches are outstanding (the pipeline collects the
    oldest first)."""

    batch: int
    depth: int
    ring_pre: Preprocess  # how the decode workers write the images it takes from its ring

    def attach(self, ring: HostRing) -> None: ...

    def submit(self, slots: list[int], top_k: int) -> Any:
        """Start classifying the images in these ring slots; the slots are free again when it returns."""

    def result(self, ticket: Any) -> list[TopK]: ...

    def close(self) -> None: ...


class HostRunner:
    """Any backend's ``forward``: normalise the slots' bytes on the host and run a forward of exactly that many
    images (``forward`` is the engine's, which builds a plan per batch size). The cpu backend's runner."""

    depth = 1

    def __init__(self, forward: Callable[..., Any], batch: int, pre: Preprocess, features: bool = False):
        """features: ``forward(x, features=True)`` gives (logits, features), kept for ``features_of``."""
        self.forward, self.batch, self.pre, self.features = forward, batch, pre, features
        self.ring_pre = pre
        self.ring: HostRing | None = None

    def attach(self, ring: HostRing) -> None:
        self.ring = ring

    def submit(self, slots: list[int], top_k: int) -> tuple[list[TopK], np.ndarray | None]:
        assert self.ring is not None
        first = slots[0]
        consecutive = slots == list(range(first, first + len(slots)))
        x = network_input(self.ring.array[first:first + len(slots)] if consecutive else self.ring.array[slots],
                          self.pre)  # a consecutive batch's FID input is used in place, not copied
        logits, feats = self.forward(x, features=True) if self.features else (self.forward(x), None)
        return top_k_rows(softmax(logits), top_k), feats

    def result(self, ticket: tuple[list[TopK], np.ndarray | None]) -> list[TopK]:
        return ticket[0]

    def features_of(self, ticket: tuple[list[TopK], np.ndarray | None]) -> np.ndarray:
        assert ticket[1] is not None, "a runner made without features"
        return ticket[1]

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------------------------- pipeline

@dataclass
class PipelineOptions:
    workers: int | None = None  # decode workers (default: the CPUs this process may use)
    worker_kind: str = "auto"
    ring_batches: int = 4  # ring slots = this many batches (in flight on the runner + being decoded)


def decode_plan(images: int, batch: int, options: PipelineOptions) -> tuple[int, int, str]:
    """(ring slots, decode workers, their kind: "thread" or "process") of a run of ``images`` in batches of
    ``batch``."""
    slots = max(batch, min(images, batch * options.ring_batches))
    workers = min(options.workers or default_workers(), slots)
    kind = options.worker_kind
    if kind == "auto":
        kind = "process" if images >= PROCESS_MIN_IMAGES and workers > 1 else "thread"
    if kind == "process" and not hasattr(os, "memfd_create"):  # not Linux: the ring cannot be shared
        kind = "thread"
    return slots, workers, kind


def classify(sources: Sequence[ImageSource], runner: Runner, top_k: int, options: PipelineOptions | None = None,
             computed_by: ComputedBy = (None, None, None), finish: Finish | None = None,
             on_features: OnFeatures | None = None) -> Iterator[Any]:
    """Predictions for ``sources`` in their order, streamed as batches finish (errors per image), decoded as the
    runner takes them (its ``ring_pre``); ``computed_by``:
    the backend and precision each result records; ``finish``: what to hand out instead of a classified image's
    Prediction, made a batch at a time (an image that could not be decoded stays a Prediction with its error);
    ``on_features``: given each batch's pool features (a runner made with features)."""
    options = options or PipelineOptions()
    if not sources:
        return
    slots, workers, kind = decode_plan(len(sources), runner.batch, options)
    pre = runner.ring_pre
    ring = HostRing(slots, pre, shared=kind == "process")
    pool = None
    try:
        runner.attach(ring)
        pool = DecodePool(ring, pre, workers, kind)
        yield from _stream(sources, runner, pool, slots, top_k, finish or predictions_by(computed_by), on_features)
    finally:
        if pool is not None:
            pool.close()
        runner.close()
        ring.close()


def _stream(sources: Sequence[ImageSource], runner: Runner, pool: DecodePool, slots: int,
            top_k: int, finish: Finish, on_features: OnFeatures | None = None) -> Iterator[Any]:
    n, batch = len(sources), runner.batch
    decoding: deque[tuple[int, Future]] = deque()  # (seq, future), in seq order
    ready: list[int] = []  # decoded seqs waiting for a batch
    results = _Results(sources, runner, finish, on_features)
    released = [False] * slots  # per slot: its current image is finished with (by seq % slots)
    next_submit = 0
    oldest_held = 0  # every seq below it has released its slot

    def release(seq: int) -> None:
        released[seq % slots] = True

    while results.next_yield < n:
        # keep the decoders busy as far as the ring allows: seq may start once seq - slots has released its slot
        while oldest_held < next_submit and released[oldest_held % slots]:
            oldest_held += 1
        while next_submit < n and next_submit - oldest_held < slots:
            released[next_submit % slots] = False
            decoding.append((next_submit, pool.submit(next_submit % slots, sources[next_submit])))
            next_submit += 1
        pool.flush()  # before waiting on the oldest: it may be in a chunk held back
        if decoding:  # the oldest decode, in order (a batch is never full here: it is submitted when it fills)
            seq, fut = decoding.popleft()
            try:
                error = fut.result()
            except BrokenExecutor as e:  # a worker process was killed (out of memory, a signal)
                raise EngineError(f"a decode worker died ({first_line(e)}); try thread workers") from None
            if error is None:
                ready.append(seq)
            else:
                results.done[seq] = Prediction(source_name(seq, sources[seq]), error=error)
                release(seq)
        all_decoded = not decoding and next_submit == n
        if ready and (len(ready) == batch or all_decoded):
            results.make_room()
            results.add(ready, runner.submit([s % slots for s in ready], top_k))
            for seq in ready:  # submit has copied the batch out of the ring: its slots may take new images
                release(seq)
            ready = []
        elif results.in_flight and not decoding:  # the ring is full of in-flight images, or the end
            results.collect_oldest()  # only results move on
        if results.next_yield in results.done:
            yield from results.finished()
        if all_decoded and not results.in_flight and results.next_yield < n:  # finished() took what was in order
            raise AssertionError(f"pipeline lost image {results.next_yield}")  # a bug, not a user error


class _Results:
    """The in-order end of a stream: the runner's tickets outstanding (oldest first), finished predictions by seq
    (a reorder buffer), handed out in seq order."""

    def __init__(self, sources: Sequence[ImageSource], runner: Runner | EncodedRunner, finish: Finish,
                 on_features: OnFeatures | None = None):
        self.sources, self.runner, self.finish, self.on_features = sources, runner, finish, on_features
        self.in_flight: deque[tuple[list[int], Any]] = deque()
        self.done: dict[int, Any] = {}  # Predictions, or what the finish made
        self.next_yield = 0

    def make_room(self) -> None:
        """Before a batch is submitted: at most ``runner.depth`` tickets outstanding, since a new one reuses the
        oldest one's result buffers."""
        if len(self.in_flight) == self.runner.depth:
            self.collect_oldest()

    def add(self, seqs: list[int], ticket: Any) -> None:
        self.in_flight.append((seqs, ticket))

    def collect_oldest(self) -> None:
        seqs, ticket = self.in_flight.popleft()
        names = [source_name(seq, self.sources[seq]) for seq in seqs]
        tops = self.runner.result(ticket)
        if self.on_features is not None:  # the rows of images that were classified, not of files that failed
            rows = self.runner.features_of(ticket)  # type: ignore[union-attr]
            ok = [i for i, top in enumerate(tops) if not isinstance(top, str)]
            self.on_features([seqs[i] for i in ok], rows[ok])
        self.done.update(zip(seqs, self.finish(names, tops)))

    def finished(self) -> Iterator[Prediction]:
        while self.next_yield in self.done:
            yield self.done.pop(self.next_yield)
            self.next_yield += 1

    def drain(self) -> Iterator[Prediction]:
        while self.in_flight:
            self.collect_oldest()
            yield from self.finished()
        yield from self.finished()


# ------------------------------------------------------------------------------------- GPU decoding (--decode gpu)

class EncodedRunner(Protocol):
    """A runner that decodes too: ``submit_encoded`` takes the files' bytes, ``result`` gives top-k or an error
    message per file."""

    batch: int
    depth: int

    def submit_encoded(self, items: list[tuple[str, bytes]], top_k: int) -> Any: ...

    def result(self, ticket: Any) -> list[TopK | str]: ...

    def close(self) -> None: ...


def classify_encoded(sources: Sequence[ImageSource], runner: EncodedRunner, top_k: int,
                     computed_by: ComputedBy = (None, None, None), finish: Finish | None = None,
                     on_features: OnFeatures | None = None) -> Iterator[Any]:
    """Predictions for image files decoded by the runner (on the GPU), in order; ``computed_by``, ``finish`` and
    ``on_features`` as classify's.

    Where the runner decodes and classifies in two steps (``decode`` of ``decode_batch`` files, which it reads
    itself, ``split`` into batches, ``classify`` of each: the cuda runner), one thread decodes while this thread
    starts the forwards and hands out the results, so the host never waits for the decoder and the forward one
    after the other. The decode thread holds the GIL only between its calls into C (the cuda runner's decoder reads
    and decodes a whole call's files with the GIL released); where it decodes through nvImageCodec's Python API,
    which takes the GIL back once per image, the switch interval is cut to DECODE_SWITCH_INTERVAL for the run so
    that this thread cannot keep it long. Other runners read and decode on this thread, a batch at a time."""
    if any(isinstance(s, Image.Image) for s in sources):
        raise EngineError("GPU decoding takes image files, not in-memory images; decode them on the CPU")
    threaded = DECODE_THREAD and all(hasattr(runner, a) for a in ("decode", "split", "classify", "decode_batch"))
    try:
        results = _Results(sources, runner, finish or predictions_by(computed_by), on_features)
        yield from (_stream_decoding_thread if threaded else _stream_encoded)(sources, runner, top_k, results)
    finally:
        runner.close()


# --decode gpu's files are read and decoded on a thread of their own (classify_encoded); False: on the caller's
DECODE_THREAD = True
DECODE_SWITCH_INTERVAL = 0.0005  # seconds: how long a Python thread may keep the GIL from the decode thread


def _stream_encoded(sources: Sequence[ImageSource], runner: EncodedRunner, top_k: int,
                    results: _Results) -> Iterator[Any]:
    """Each batch of files read, then given to the runner, errors of unreadable files in their places; the
    results of ``runner.depth`` batches outstanding, yielded in order as they come."""
    for first in range(0, len(sources), runner.batch):
        seqs, items, failed = read_batch(sources, first, min(first + runner.batch, len(sources)))
        results.done.update({seq: Prediction(source_name(seq, sources[seq]), error=error)
                             for seq, error in failed.items()})
        if items:
            results.make_room()
            results.add(seqs, runner.submit_encoded(items, top_k))
        yield from results.finished()
    yield from results.drain()


def _stream_decoding_thread(sources: Sequence[ImageSource], runner: Any, top_k: int,
                            results: _Results) -> Iterator[Any]:
    """_stream_encoded with the reading and decoding on threads of their own (classify_encoded): the runner's
    ``decode_chains`` of them (one where it has none), thread j decoding calls j, j + chains, ..., taken here in call
    order. Each batch's predictions are handed out as soon as they are in order, so that the consumer's work on them
    falls between the forwards this thread starts rather than after a whole decode call's."""
    chains = max(1, getattr(runner, "decode_chains", 1))
    firsts = range(0, len(sources), runner.decode_batch)  # each decode call's first image
    decoded: list[queue.Queue[Any]] = [queue.Queue() for _ in range(chains)]  # runner.decode's results, or an error
    stop = threading.Event()

    def decode_calls(chain: int) -> None:
        try:
            for call in range(chain, len(firsts), chains):
                if stop.is_set():
                    return
                first = firsts[call]
                end = min(first + runner.decode_batch, len(sources))
                decoded[chain].put(runner.decode([os.fspath(s) for s in sources[first:end]], call))
        except BaseException as e:  # handed to the consuming thread, which raises it there
            decoded[chain].put(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(DECODE_SWITCH_INTERVAL)
    threads = [threading.Thread(target=decode_calls, args=(j,), name="gpu-decode", daemon=True)
               for j in range(min(chains, len(firsts)))]
    for t in threads:
        t.start()
    try:
        for call, seq in enumerate(firsts):
            got = decoded[call % chains].get()
            if isinstance(got, BaseException):
                raise got
            for part in runner.split(got):
                results.make_room()
                results.add(list(range(seq, seq + part.images)), runner.classify(part, top_k))
                seq += part.images
                yield from results.finished()
        yield from results.drain()
    finally:
        stop.set()
        runner.cancel_decode()  # a decode waiting for a buffer gives up
        for t in threads:
            t.join()
        sys.setswitchinterval(interval)
