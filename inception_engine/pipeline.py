"""Streaming classification: images in, predictions out in input order, decode overlapped with the forward.

    decode workers ──> host ring of uint8 slots ──> runner (GPU or CPU) ──> top-k ──> Prediction, in order
    (threads or          (size x size x 3 bytes       submit(slots) copies a batch out and starts it,
     processes)           per image)                  result(ticket) waits for it

Decoding (Pillow: read, EXIF orientation, RGB, Resize, CenterCrop) runs in a pool of workers, which write each
image's uint8 pixels straight into a slot of a ring of host memory: image number ``seq`` goes to slot
``seq % slots``. Processes (the ring is then shared memory) decode 2.7x faster than threads on the H100 machine's
16 cores, whose GIL serialises Pillow's Python parts; threads start instantly, so short runs use them. A process
worker takes several images a task (``process_chunk``), so that the parent's share of the work stays small. The main
thread keeps the pool ``slots`` images ahead of the oldest slot still in use, gathers decoded images into batches
and hands each batch's slots to the runner, which copies them out (the cuda runner into pinned memory, then over
PCIe on a copy stream while the previous batch's forward runs) and frees them for the next images. Host memory is
``slots`` images whatever the number of inputs. An image that cannot be decoded gets its error Prediction in its
place in the output and the rest goes on.

``classify_encoded`` is the same stream for --decode gpu: this thread reads the files, the runner decodes.
"""

from __future__ import annotations

import functools
import mmap
import os
import select
import signal
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from PIL import Image

from .errors import EngineError
from .images import Preprocess, decode_u8, decode_u8_bytes, file_error, first_line, open_regular
from .labels import imagenet_labels

ImageSource = str | os.PathLike | Image.Image
TopK = list[tuple[int, float]]  # (class index, probability), most likely first
WORKER_KINDS = ("auto", "thread", "process")
# auto: processes for runs of at least this many images (2,841 against threads' 1,040 images/s of decode on the H100
# machine's 16 cores: the GIL serialises Pillow's Python parts, docs/PERFORMANCE.md), threads below (no start-up).
PROCESS_MIN_IMAGES = 256


@dataclass(frozen=True)
class Prediction:
    image: str  # the path as given, or "<PIL.Image N>" for in-memory images
    top: list[tuple[int, str, float]] | None = None  # (class index, label, probability), most likely first
    error: str | None = None
    # what computed ``top``: the backend's name and the precision it ran in (Engine.predict_iter fills them in;
    # None for errors, which nothing computed)
    backend: str | None = None
    precision: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# (backend, precision): what each prediction of a stream records as having computed it
ComputedBy = tuple[str | None, str | None]
# What a stream hands out for a batch of results, in order: from each image's name and its top-k, or its error
# message (None: a Prediction each; Engine.predict_iter's ``render``: each one's line of an output file)
Finish = Callable[[list[str], list[TopK | str]], list[Any]]


def make_predictions(names: list[str], tops: list[TopK | str], computed_by: ComputedBy) -> list[Prediction]:
    """A Prediction per image, its classes labelled, recording ``computed_by``; or its error."""
    backend, precision = computed_by
    return [Prediction(name, error=top) if isinstance(top, str) else
            Prediction(name, labelled(top), backend=backend, precision=precision) for name, top in zip(names, tops)]


def predictions_by(computed_by: ComputedBy) -> Finish:
    """A stream's default Finish: make_predictions recording ``computed_by``."""
    return functools.partial(make_predictions, computed_by=computed_by)


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


def labelled(top: TopK) -> list[tuple[int, str, float]]:
    names = imagenet_labels()
    return [(i, names[i], p) for i, p in top]


def top_classes(probs: np.ndarray, k: int) -> list[tuple[int, str, float]]:
    """The k most likely classes of one probability row, with their labels."""
    return labelled(top_k_rows(probs[None], k)[0])


def source_name(i: int, src: ImageSource) -> str:
    return f"<PIL.Image {i}>" if isinstance(src, Image.Image) else str(src)


# ------------------------------------------------------------------------------------------------- the host ring

class HostRing:
    """``slots`` images of (size, size, 3) uint8: anonymous memory for thread workers; for process workers an
    anonymous shared file (Linux memfd) that each worker maps through a descriptor handed over at its start. It has
    no name: nothing is left in /dev/shm whatever ends the run (SIGKILL included), and a small /dev/shm (a
    container's 64 MB) does not bound it."""

    def __init__(self, slots: int, size: int, shared: bool):
        shape = (slots, size, size, 3)
        self.fd: int | None = None
        self._map: mmap.mmap | None = None
        if shared:
            self.fd = os.memfd_create("inception-ring", os.MFD_CLOEXEC)
            os.ftruncate(self.fd, int(np.prod(shape)))
            self._map = mmap.mmap(self.fd, int(np.prod(shape)))
        self.array = (np.ndarray(shape, np.uint8, buffer=self._map) if self._map is not None else
                      np.empty(shape, np.uint8))
        self.slots = slots

    @classmethod
    def wrapping(cls, pixels: np.ndarray) -> HostRing:
        """A ring over images decoded already (N, size, size, 3): slot i is image i."""
        ring = cls.__new__(cls)
        ring.fd, ring._map, ring.array, ring.slots = None, None, pixels, len(pixels)
        return ring

    def close(self) -> None:
        self.array = None  # type: ignore[assignment]  # the mapping cannot close while an array views it
        if self._map is not None:
            self._map.close()
            self._map = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class RingDescriptor:
    """A ring's file descriptor on its way into a worker process: pickled while the process is being started, it
    travels as a descriptor passed to the new process (multiprocessing's DupFd), not as a number."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self) -> tuple:
        from multiprocessing import reduction

        return _detach_descriptor, (reduction.DupFd(self.fd),)


def _detach_descriptor(dup: Any) -> int:
    return dup.detach()


def decode_into(ring: np.ndarray, slot: int, source: ImageSource, pre: Preprocess,
                data: bytes | None = None) -> str | None:
    """Decode one image (from ``data``, its file's bytes read already, where given) into its ring slot; the error
    line instead where it cannot be read. Anything Pillow throws is this image's error, never the run's."""
    try:
        ring[slot] = decode_u8(source, pre) if data is None else decode_u8_bytes(data, str(source), pre)
        return None
    except EngineError as e:
        return str(e)
    except Exception as e:  # a decoder bug or an exotic file must not end a 100,000-image run
        return f"{source}: cannot decode ({type(e).__name__}: {first_line(e)})"


_worker_ring: np.ndarray | None = None  # a worker process's view of the shared ring (set by its initializer)
_worker_pre: Preprocess | None = None
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _attach_ring(fd: int, shape: tuple[int, ...], pre: Preprocess, owner: int) -> None:
    """A decode process's start: die with the run, map the ring, keep the preprocessing."""
    global _worker_ring, _worker_pre
    die_with(owner)
    _worker_pre = pre  # once per process, not pickled with every task
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the pool
    ring = mmap.mmap(fd, int(np.prod(shape)))
    os.close(fd)  # the mapping keeps the memory
    _worker_ring = np.ndarray(shape, np.uint8, buffer=ring)
    warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # images.open_image refuses those itself


def die_with(owner: int) -> None:
    """End this process as soon as the process that owns the pool (``owner``) ends, however it ends.

    A killed owner leaves no one to shut the pool down: the workers would wait for tasks forever, and they hold the
    forkserver's liveness pipe and the resource tracker's, so those would never end either. A daemon thread waits on
    a pidfd of the owner (readable when it exits) and exits the process; PR_SET_PDEATHSIG kills it with its direct
    parent, the forkserver. Once the workers are gone the forkserver and the resource tracker see their pipes close
    and end by themselves (the tracker unlinking the pool's semaphores)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the owner watch below still holds
        pass
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        os._exit(1)
    except (OSError, AttributeError):  # no pidfd (Linux < 5.3): poll the owner instead
        fd = None

    def watch() -> None:
        if fd is not None:
            select.select([fd], [], [])
        else:
            while _alive(owner):
                time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, and another user's: only a pid reused after the owner ended can be that
        return True
    return True


def _decode_chunk_in_worker(slots: list[int], sources: list[str]) -> list[str | None]:
    assert _worker_ring is not None and _worker_pre is not None, "worker started without the ring"
    return [decode_into(_worker_ring, slot, source, _worker_pre) for slot, source in zip(slots, sources)]


def process_chunk(slots: int, workers: int) -> int:
    """Images per task sent to a decode process. A task costs the parent ~200 us of CPU (pickling, the executor's
    queue and result threads) and an image in it ~20 us more, and the
    parent's threads share one GIL with the pipeline: one image a task capped a 32-CPU machine at ~3,200 images/s
    (docs/performance-log.md, "Several GPUs of one machine"). Chunks as large as leave every worker two tasks in the
    ring, up to 16."""
    return max(1, min(16, slots // (2 * workers)))


class DecodePool:
    """Workers that decode images into a HostRing's slots. Process workers get images ``chunk`` at a time (default:
    ``process_chunk`` of the ring and the workers): ``submit`` holds them back until a chunk is full or ``flush`` is
    called, which a caller must do before waiting on a future."""

    def __init__(self, ring: HostRing, pre: Preprocess, workers: int, kind: str = "thread", chunk: int | None = None):
        if kind not in WORKER_KINDS[1:]:
            raise EngineError(f"unknown worker kind {kind!r}; choose one of {', '.join(WORKER_KINDS)}")
        self.ring, self.pre, self.kind = ring, pre, kind
        self.chunk = chunk or process_chunk(ring.slots, workers)
        self._pending: list[tuple[int, str, Future]] = []
        self._pool: Executor
        if kind == "process":
            assert ring.fd is not None, "process workers need a shared ring"
            import multiprocessing

            # forkserver: a fresh interpreter, not a fork of one that holds a CUDA context and threads.
            self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"),
                                             initializer=_attach_ring,
                                             initargs=(RingDescriptor(ring.fd), ring.array.shape, pre, os.getpid()))
        else:
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="decode")

    def submit(self, slot: int, source: ImageSource) -> Future:
        if self.kind == "process" and not isinstance(source, Image.Image):
            f: Future = Future()
            self._pending.append((slot, str(source), f))
            if len(self._pending) == self.chunk:
                self.flush()
            return f
        if self.kind == "process":  # an in-memory image cannot cross to a process cheaply: decode it here
            f = Future()
            f.set_result(decode_into(self.ring.array, slot, source, self.pre))
            return f
        return self._pool.submit(decode_into, self.ring.array, slot, source, self.pre)

    def flush(self) -> None:
        """Send the images held back to a process worker; each image's future settles with the chunk."""
        if not self._pending:
            return
        chunk, self._pending = self._pending, []
        try:
            task = self._pool.submit(_decode_chunk_in_worker, [slot for slot, _, _ in chunk],
                                     [src for _, src, _ in chunk])
        except BrokenExecutor as e:  # a worker died since the last chunk: the images' waiters report it
            for _, _, f in chunk:
                f.set_exception(e)
            return

        def settle(finished: Future) -> None:
            try:
                errors = finished.result()
            except BaseException as e:  # BrokenExecutor (a worker killed), cancelled at close: every image's
                for _, _, f in chunk:
                    f.set_exception(e)
                return
            for (_, _, f), error in zip(chunk, errors):
                f.set_result(error)

        task.add_done_callback(settle)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------------------------------------------ runners

class Runner(Protocol):
    """Classifies batches of ring slots; ``submit`` copies the slots' images out and may return before the work is
    done, ``result`` waits for it. At most ``depth`` submitted batches are outstanding (the pipeline collects the
    oldest first)."""

    batch: int
    depth: int

    def attach(self, ring: HostRing) -> None: ...

    def submit(self, slots: list[int], top_k: int) -> Any:
        """Start classifying the images in these ring slots; the slots are free again when it returns."""

    def result(self, ticket: Any) -> list[TopK]: ...

    def close(self) -> None: ...


class HostRunner:
    """Any backend's ``forward``: normalise the slots' bytes on the host and run a forward of exactly that many
    images (``forward`` is the engine's, which builds a plan per batch size). The cpu backend's runner."""

    depth = 1

    def __init__(self, forward: Callable[[np.ndarray], np.ndarray], batch: int, pre: Preprocess):
        self.forward, self.batch, self.pre = forward, batch, pre
        self.ring: HostRing | None = None

    def attach(self, ring: HostRing) -> None:
        self.ring = ring

    def submit(self, slots: list[int], top_k: int) -> list[TopK]:
        from .images import normalize_u8

        assert self.ring is not None
        return top_k_rows(softmax(self.forward(normalize_u8(self.ring.array[slots], self.pre))), top_k)

    def result(self, ticket: list[TopK]) -> list[TopK]:
        return ticket

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------------------------- pipeline

@dataclass
class PipelineOptions:
    workers: int | None = None  # decode workers (default: the CPUs this process may use)
    worker_kind: str = "auto"
    ring_batches: int = 4  # ring slots = this many batches (in flight on the runner + being decoded)


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def classify(sources: Sequence[ImageSource], runner: Runner, pre: Preprocess, top_k: int,
             options: PipelineOptions | None = None, computed_by: ComputedBy = (None, None),
             finish: Finish | None = None) -> Iterator[Any]:
    """Predictions for ``sources`` in their order, streamed as batches finish (errors per image); ``computed_by``:
    the backend and precision each result records; ``finish``: what to hand out instead of a classified image's
    Prediction, made a batch at a time (an image that could not be decoded stays a Prediction with its error)."""
    options = options or PipelineOptions()
    if not sources:
        return
    batch = runner.batch
    slots = max(batch, min(len(sources), batch * options.ring_batches))
    workers = min(options.workers or default_workers(), slots)
    kind = options.worker_kind
    if kind == "auto":
        kind = "process" if len(sources) >= PROCESS_MIN_IMAGES and workers > 1 else "thread"
    if kind == "process" and not hasattr(os, "memfd_create"):  # not Linux: the ring cannot be shared
        kind = "thread"
    ring = HostRing(slots, pre.size, shared=kind == "process")
    pool = None
    try:
        runner.attach(ring)
        pool = DecodePool(ring, pre, workers, kind)
        yield from _stream(sources, runner, pool, slots, top_k, finish or predictions_by(computed_by))
    finally:
        if pool is not None:
            pool.close()
        runner.close()
        ring.close()


def _stream(sources: Sequence[ImageSource], runner: Runner, pool: DecodePool, slots: int,
            top_k: int, finish: Finish) -> Iterator[Any]:
    n, batch = len(sources), runner.batch
    decoding: deque[tuple[int, Future]] = deque()  # (seq, future), in seq order
    ready: list[int] = []  # decoded seqs waiting for a batch
    results = _Results(sources, runner, finish)
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

    def __init__(self, sources: Sequence[ImageSource], runner: Runner | EncodedRunner, finish: Finish):
        self.sources, self.runner, self.finish = sources, runner, finish
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
        self.done.update(zip(seqs, self.finish(names, self.runner.result(ticket))))

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


def read_file(source: str | os.PathLike) -> tuple[bytes | None, str | None]:
    """(bytes, None), or (None, the error line) for a file that cannot be read, worded as images.open_image."""
    try:
        with open_regular(source, buffered=False) as f:  # unbuffered: one read, no BufferedReader copy
            return f.readall(), None
    except EngineError as e:  # missing, empty, or not a regular file (a FIFO is never read: it would block)
        return None, str(e)
    except OSError as e:
        return None, file_error(source, e)


def classify_encoded(sources: Sequence[ImageSource], runner: EncodedRunner, top_k: int,
                     computed_by: ComputedBy = (None, None), finish: Finish | None = None) -> Iterator[Any]:
    """Predictions for image files decoded by the runner (on the GPU), in order; ``computed_by`` and ``finish`` as
    classify's.

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
        yield from (_stream_decoding_thread if threaded else _stream_encoded)(sources, runner, top_k,
                                                                              finish or predictions_by(computed_by))
    finally:
        runner.close()


# --decode gpu's files are read and decoded on a thread of their own (classify_encoded); False: on the caller's
DECODE_THREAD = True
DECODE_SWITCH_INTERVAL = 0.0005  # seconds: how long a Python thread may keep the GIL from the decode thread


def read_batch(sources: Sequence[ImageSource], first: int, end: int
               ) -> tuple[list[int], list[tuple[str, bytes]], dict[int, Prediction]]:
    """Files first .. end - 1 read: the readable ones' seqs and (name, bytes), the others' error predictions."""
    seqs, items, failed = [], [], {}
    for seq in range(first, end):
        data, error = read_file(sources[seq])  # type: ignore[arg-type]  # PIL images were refused
        if data is None:
            failed[seq] = Prediction(source_name(seq, sources[seq]), error=error)
        else:
            seqs.append(seq)
            items.append((source_name(seq, sources[seq]), data))
    return seqs, items, failed


def _stream_encoded(sources: Sequence[ImageSource], runner: EncodedRunner, top_k: int,
                    finish: Finish) -> Iterator[Any]:
    """Each batch of files read, then given to the runner, errors of unreadable files in their places; the
    results of ``runner.depth`` batches outstanding, yielded in order as they come."""
    results = _Results(sources, runner, finish)
    for first in range(0, len(sources), runner.batch):
        seqs, items, failed = read_batch(sources, first, min(first + runner.batch, len(sources)))
        results.done.update(failed)
        if items:
            results.make_room()
            results.add(seqs, runner.submit_encoded(items, top_k))
        yield from results.finished()
    yield from results.drain()


def _stream_decoding_thread(sources: Sequence[ImageSource], runner: Any, top_k: int,
                            finish: Finish) -> Iterator[Any]:
    """_stream_encoded with the reading and decoding on threads of their own (classify_encoded): the runner's
    ``decode_chains`` of them (one where it has none), thread j decoding calls j, j + chains, ..., taken here in call
    order. Each batch's predictions are handed out as soon as they are in order, so that the consumer's work on them
    falls between the forwards this thread starts rather than after a whole decode call's."""
    import queue
    import threading

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

    results = _Results(sources, runner, finish)
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
