"""The server's devices: one Engine per GPU (or one on the CPU backend), each fed batches by the batcher.

How the engines are held. A single device's engine runs on a thread of its own (``ThreadDevice``): every call into
it (and so every pycuda context push) happens on that thread, the batcher hands it jobs through a queue, and no
bytes are copied between processes, which keeps a one-image request's latency to the forward itself. With several
GPUs each engine runs in a worker process of its own (``ProcessDevice``), as ``inception-run --gpus`` does
(multi_gpu.py), for the same reasons: Engine has no device index (its cuda backend opens device 0, so each process
sees its GPU as device 0 through CUDA_VISIBLE_DEVICES), and one interpreter's GIL would serialise the host-side
work of all the GPUs (uploads, the decoders' Python parts, top-k), which at ~10,000 images/s a GPU is the limit.
Jobs go to a worker process over a pipe (pickle protocol 5: a batch of JPEGs is a few MB, which a pipe moves at
GB/s); the pixels of host-decoded images (268 KB each) go the same way.

Images decoded on the GPU (--decode gpu) go to jpeg_batch.c, the C path that reads and decodes a batch of files
without Python per file (about twice nvImageCodec's Python API's rate), as anonymous memory files (``MemoryFiles``,
made once and rewritten for every batch): the server never reads a path a client sends. Where jpeg_batch.c is
unavailable the runner decodes the bytes through nvImageCodec's Python API.

A device's loop (``serve_jobs``) keeps two jobs a runner outstanding: the next job is submitted (decoded and copied
to the GPU) before the oldest's result is collected. A GPU device has runners of several batch sizes (SMALL_RUNNERS
and the max batch), since a runner replays its whole batch's CUDA graph however few images a batch holds. An
``encoded`` job may hold more images than a batch, up to the largest runner's decode call (``encoded_batch``,
images.decode_call_images: a decode call has a fixed cost of a few milliseconds, which a batch of 64 does not
amortise): it is decoded in one call and classified a batch at a time, as inception-run's folder job does. Those
calls run on SERVER_DECODE_CHAINS threads of their own (``DecodeChains``), each with its decoder, so that two decode
calls are in flight beside the forwards; each classifies its call once decoded, in call order.

Jobs: ``encoded`` (image files' bytes, decoded by the runner on the GPU: --decode gpu), ``pixels`` (images decoded
on the host, (n, *Preprocess.decoded_shape)) -> per image its top-k (index, probability) pairs or its error message;
``tensor`` ((n, 3, size, size) float32, normalised) -> (n, classes) float32 logits.
"""

from __future__ import annotations

import asyncio
import io
import multiprocessing
import os
import queue
import signal
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from ..config import EngineConfig
from ..engine import Engine
from ..results import EngineFacts
from ..errors import EngineError, first_line
from ..ingest.images import Preprocess
from ..ingest.ring import HostRing
from ..ingest.workers import die_with
from ..multi_gpu import cpu_share

STOP = "stop"


def build_engine(spec: EngineConfig) -> Engine:
    """The server's one place that makes an Engine: from its config, checked and resolved once by the command (a
    worker process receives it pickled, not checked again)."""
    return Engine.from_config(spec)


@dataclass
class Job:
    kind: str  # "encoded", "pixels" or "tensor"
    data: Any  # list of bytes, or an array
    names: list[str]  # each image's name in error messages ("images[3]")
    top_k: int = 0


def buckets(batch: int) -> list[int]:
    """The forward batch sizes a GPU backend is built for: powers of two up to ``batch``, and ``batch``. A tensor
    job of n images runs on the smallest that holds it, padded: one plan (kernels, CUDA graph) per size, built at
    warm-up, instead of one for every n that arrives."""
    out, b = [], 1
    while b < batch:
        out.append(b)
        b *= 2
    return [*out, batch]


# The cuda runner replays one CUDA graph of its whole batch whatever a batch holds: a lone image on a runner of 64
# would take a batch-64 forward (~2 ms in fp16 on an H100) where a batch-1 forward takes a fraction of it. A device
# keeps runners of these sizes too (below its max batch), each batch going to the smallest that holds it.
SMALL_RUNNERS = (1, 8)
# Decode calls in flight on the largest runner (jpeg_decode.DECODE_CHAINS is inception-run's): two lift the GPU
# decoder's rate beside a busy forward (fp16, H100: 14,300 -> 17,600 images/s, jpeg_decode.py), where one call at a
# time held the server below inception-run's rate. The second decoder's start (~1.2 s) is paid before the server is
# ready, not by a request.
SERVER_DECODE_CHAINS = 2
# Decode calls classified and not yet collected, at most: the runner's result buffers hold two calls' batches
# (cuda_runner.CudaRunner.depth).
CLASSIFIED_AHEAD = 2


class DecodeChains:
    """The largest runner's decode calls, each on chain ``call % chains`` (a thread, its memory files and, in the
    runner, its decoder), then classified on that thread in call order, no more than CLASSIFIED_AHEAD calls ahead
    of the results collected (``collected``). ``gpu`` is held while a call's batches are enqueued: the device's
    thread enqueues on the same backend (a tensor job's forward)."""

    def __init__(self, runner: Any, chains: int, gpu: threading.Lock):
        self.runner, self.gpu = runner, gpu
        self.pools = [ThreadPoolExecutor(1, thread_name_prefix=f"decode-chain{j}") for j in range(chains)]
        self.files = [MemoryFiles() for _ in range(chains)]
        self._turn = threading.Condition()
        self._next = 0  # the next call to classify
        self._collected = 0  # calls whose results were collected
        self._calls = 0  # calls submitted
        self._closed = False

    def submit(self, data: Sequence[bytes | memoryview], names: list[str], top_k: int) -> Future:
        """Decode and classify these images as the next call: a future of (the runner's tickets, memory file ->
        image name)."""
        call, self._calls = self._calls, self._calls + 1
        chain = call % len(self.pools)
        return self.pools[chain].submit(self._call, call, chain, data, names, top_k)

    def _call(self, call: int, chain: int, data: Sequence[bytes | memoryview], names: list[str],
              top_k: int) -> tuple[list[Any], dict[str, str]]:
        try:
            paths = self.files[chain].hold(data)  # this chain's files: its previous call has read them
            decoded = self.runner.decode(paths, call)
            with self._turn:
                self._turn.wait_for(lambda: self._closed or (self._next == call
                                                             and call < self._collected + CLASSIFIED_AHEAD))
                if self._closed:
                    raise EngineError("the device stopped before this batch ran")
            with self.gpu:
                tickets = [self.runner.classify(part, top_k) for part in self.runner.split(decoded)]
            return tickets, dict(zip(paths, names))
        finally:
            with self._turn:  # a call that failed still passes on its turn
                self._turn.wait_for(lambda: self._closed or self._next == call)
                self._next += 1
                self._turn.notify_all()

    def collected(self) -> None:
        """A call's results were read: its result buffers are free for a later call's batches."""
        with self._turn:
            self._collected += 1
            self._turn.notify_all()

    def close(self) -> None:
        """Ends the chains: a call not yet classified fails (the device's loop collects every call it submitted
        first, so none is left in a server that stops in order)."""
        with self._turn:
            self._closed = True
            self._turn.notify_all()
        self.runner.cancel_decode()
        for pool in self.pools:
            pool.shutdown(wait=True, cancel_futures=True)
        for files in self.files:
            files.close()


class DeviceWorker:
    """One engine and its runners, used from one thread only."""

    def __init__(self, spec: EngineConfig):
        self.engine = build_engine(spec)
        self.runners: list[tuple[Any, HostRing]] = []  # (runner, its ring), by batch size
        self.files = MemoryFiles()
        self.chains: DecodeChains | None = None
        self.gpu = threading.Lock()  # enqueueing on a backend: this thread's and the decode chains'
        try:
            self.size = self.engine.preprocess.size
            batch = self.engine.batch_size
            sizes = [batch] if self.engine.backend_name == "cpu" else sorted({*SMALL_RUNNERS, batch} & set(
                range(1, batch + 1)))
            for b in sizes:
                runner = self.engine.runner(b, decode_chains=SERVER_DECODE_CHAINS if b == batch else None)
                ring = HostRing(runner.batch, self.engine.preprocess, shared=False)
                self.runners.append((runner, ring))
                runner.attach(ring)
            big = self.runners[-1][0]
            # images an encoded job may hold: a decode call of the largest runner where it decodes in calls
            self.encoded_batch = (big.decode_batch if self.engine.decode == "gpu" and big.decode_fallback is None
                                  and all(hasattr(big, a) for a in ("decode", "split", "classify")) else batch)
            if self.encoded_batch > big.batch:
                self.chains = DecodeChains(big, big.decode_chains, self.gpu)
        except BaseException:
            self.close()
            raise
        # jobs outstanding on a runner: two, one computed while the next is decoded and uploaded; more would only
        # split the queue into smaller jobs. Jobs of whole decode calls: one a decode chain besides, each decoding
        # while two are classified (DecodeChains keeps those within the runner's result buffers). ``depth``: the
        # jobs the device takes at once (the batcher's turns for it).
        self.runner_depth = min(2, *(r.depth for r, _ in self.runners))
        self.depth = self.runner_depth + (len(self.chains.pools) if self.chains else 0)
        self.sizes = [batch] if self.engine.backend_name == "cpu" else buckets(batch)

    def facts(self) -> EngineFacts:
        return self.engine.facts()

    def warm_up(self) -> None:
        """Every plan a job can need built and run once, each runner's path (and its GPU decoder) included, before
        the server says it is ready."""
        for b in self.sizes:
            self.forward(np.zeros((b, 3, self.size, self.size), np.float32))
        img = io.BytesIO()
        Image.new("RGB", (self.size + 43, self.size), (120, 80, 40)).save(img, "JPEG")
        for runner, _ in self.runners:
            n = self.encoded_batch if runner is self.runners[-1][0] else runner.batch
            kind, data = (("encoded", [img.getvalue()] * n) if self.engine.decode == "gpu" else
                          ("pixels", np.zeros((n, *self.engine.preprocess.decoded_shape),
                                              self.engine.preprocess.pixel_dtype)))
            job = Job(kind, data, ["warm-up"] * n, 1)
            # every decode chain's decoder once (the jobs of a whole decode call go round them)
            jobs = [job] * (len(self.chains.pools) if self.chains and n == self.encoded_batch else 1)
            tickets = [self.submit(j) for j in jobs]
            for j, ticket in zip(jobs, tickets):
                result = self.result(j, ticket)
                if isinstance(result[0], str):
                    raise EngineError(f"warm-up: {result[0]}")

    def room(self, job: Job, pending: Sequence[Job]) -> bool:
        """Whether ``job`` may be submitted beside the ``pending`` ones (``runner_depth`` a runner; ``depth`` of
        jobs of whole decode calls)."""
        key = self._runner_key(job)
        same = sum(self._runner_key(j) == key for j in pending)
        return same < (self.depth if key == "chains" else self.runner_depth)

    def _runner_key(self, job: Job) -> Any:
        """Where a job runs: "tensor" (a forward), "chains" (every encoded job of the largest runner where it has
        decode chains: its submit_encoded and its decode calls would take the same buffers under two numberings),
        else its runner's batch."""
        if job.kind == "tensor":
            return "tensor"
        runner, _ = self._runner_of(len(job.data))
        if self.chains is not None and job.kind == "encoded" and runner is self.runners[-1][0]:
            return "chains"
        return runner.batch

    def _runner_of(self, n: int) -> tuple[Any, HostRing]:
        """The smallest runner that holds n images (the largest where none does), and its ring."""
        return next(((r, g) for r, g in self.runners if r.batch >= n), self.runners[-1])

    def forward(self, x: np.ndarray) -> np.ndarray:
        n = len(x)
        b = next(s for s in self.sizes if s >= n) if self.engine.backend_name != "cpu" else n
        if b > n:
            x = np.concatenate([x, np.zeros((b - n, *x.shape[1:]), np.float32)])
        with self.gpu:
            return self.engine.backend_for(b, tune="cached").forward(np.ascontiguousarray(x))[:n]

    def submit(self, job: Job) -> Any:
        """Start a job: (runner, its tickets, memory file -> image name) for result; a tensor job's logits."""
        if job.kind == "tensor":
            return self.forward(job.data)
        n = len(job.data)
        runner, ring = self._runner_of(n)
        if job.kind == "pixels":
            ring.array[:n] = job.data
            return runner, [runner.submit(list(range(n)), job.top_k)], {}
        if runner.decode_fallback is not None:  # nvImageCodec's Python API: it decodes the bytes themselves
            return runner, [runner.submit_encoded([(name, bytes(d)) for name, d in zip(job.names, job.data)],
                                                  job.top_k)], {}
        if self._runner_key(job) == "chains":  # one decode call, then a batch at a time, on a decode chain
            assert self.chains is not None
            return runner, self.chains.submit(job.data, job.names, job.top_k), None
        # jpeg_batch.c reads files by name, here this worker's memory files, read before the decode call returns
        paths = self.files.hold(job.data)
        return runner, [runner.submit_encoded(list(zip(paths, job.data)), job.top_k)], dict(zip(paths, job.names))

    def result(self, job: Job, ticket: Any) -> Any:
        if job.kind == "tensor":
            return ticket
        runner, tickets, names = ticket
        chained = isinstance(tickets, Future)  # a decode chain's call: its tickets once it is classified
        try:
            if chained:
                tickets, names = tickets.result()
            out = [r for t in tickets for r in runner.result(t)]
        finally:
            if chained:
                assert self.chains is not None
                self.chains.collected()
        return [renamed(r, names) for r in out] if names else out

    def close(self) -> None:
        try:
            if self.chains is not None:
                self.chains.close()
                self.chains = None
            for runner, ring in self.runners:
                runner.close()
                ring.close()
            self.runners = []
        finally:
            self.files.close()
            self.engine.close()


class MemoryFiles:
    """Anonymous files in memory (memfd), each named by a path of this process's own (/proc/self/fd/N): what
    jpeg_batch.c, which reads files by name with no Python per file, can take. The server never opens a path a
    client names; these paths are its own. The files are made once and rewritten for every batch (two system calls
    an image instead of three, and no file made and freed: a quarter of the time). Used from one thread."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.paths: list[str] = []

    def hold(self, items: Sequence[bytes | memoryview]) -> list[str]:
        """The paths of files holding these items, one each, until the next call."""
        while len(self.fds) < len(items):
            self.fds.append(os.memfd_create("image", os.MFD_CLOEXEC))
            self.paths.append(f"/proc/self/fd/{self.fds[-1]}")
        for fd, data in zip(self.fds, items):
            written = os.pwrite(fd, data, 0)
            if written < len(data):  # a short write (a signal): the rest where it stopped
                view = memoryview(data)
                while written < len(view):
                    written += os.pwrite(fd, view[written:], written)
            os.ftruncate(fd, len(data))  # the previous batch's longer file cut to this one
        return self.paths[:len(items)]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds, self.paths = [], []


def renamed(result: Any, names: dict[str, str]) -> Any:
    """An error message naming a memory file, naming its image instead."""
    if isinstance(result, str):
        path = result.split(":", 1)[0]
        if path in names:
            return names[path] + result[len(path):]
    return result


# What a device's loop takes: (key, job), None where nothing is waiting (take(block=False)), or STOP.
Take = Callable[[bool], Any]
Give = Callable[[Any, Any, str | None], None]  # (key, result, error message)


def serve_jobs(worker: DeviceWorker, take: Take, give: Give) -> None:
    """Run jobs until STOP, as many submitted before the oldest is collected as ``worker.room`` allows; each job's
    result (or its error, in one line) goes to ``give`` in the order the jobs came."""
    pending: deque[tuple[Any, Job, Any]] = deque()

    def finish_oldest() -> None:
        key, job, ticket = pending.popleft()
        try:
            give(key, worker.result(job, ticket), None)
        except Exception as e:
            give(key, None, failure(e))

    while True:
        item = take(not pending)
        if item is None:
            finish_oldest()
            continue
        if item == STOP:
            while pending:
                finish_oldest()
            return
        key, job = item
        while pending and not worker.room(job, [j for _, j, _ in pending]):
            finish_oldest()
        try:
            pending.append((key, job, worker.submit(job)))
        except Exception as e:
            give(key, None, failure(e))


def failure(e: BaseException) -> str:
    return str(e) if isinstance(e, EngineError) else f"{type(e).__name__}: {first_line(e)}"


class ThreadDevice:
    """A device whose engine runs on a thread of this process."""

    def __init__(self, spec: EngineConfig, index: int, loop: asyncio.AbstractEventLoop):
        self.index, self.loop = index, loop
        self.name = "cpu" if spec.backend == "cpu" else f"gpu{index}"
        self.depth = 1
        self.encoded_batch = spec.batch_size or 1  # set from the engine's runners once warm (DeviceWorker's)
        # SimpleQueue: the event loop's put, once a batch, wakes the thread without queue.Queue's Python locking
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ready: asyncio.Future[tuple[EngineFacts, Preprocess]] = loop.create_future()
        self._thread = threading.Thread(target=self._main, args=(spec,), name=f"device-{self.name}", daemon=True)
        self._thread.start()

    async def ready(self) -> tuple[EngineFacts, Preprocess]:
        """Its engine's facts and preprocessing, once it has warmed up (EngineError where it could not)."""
        return await self._ready

    def _main(self, spec: EngineConfig) -> None:
        try:
            worker = DeviceWorker(spec)
            worker.warm_up()
        except BaseException as e:
            self.loop.call_soon_threadsafe(_settle, self._ready, None, EngineError(failure(e)))
            return
        self.depth, self.encoded_batch = worker.depth, worker.encoded_batch
        self.loop.call_soon_threadsafe(_settle, self._ready, (worker.facts(), worker.engine.preprocess), None)

        def take(block: bool) -> Any:
            try:
                return self._jobs.get(block)
            except queue.Empty:
                return None

        def give(fut: asyncio.Future, result: Any, error: str | None) -> None:
            self.loop.call_soon_threadsafe(_settle, fut, result, None if error is None else DeviceError(error))

        try:
            serve_jobs(worker, take, give)
        finally:
            worker.close()

    def run(self, job: Job) -> asyncio.Future:
        fut = self.loop.create_future()
        self._jobs.put((fut, job))
        return fut

    def close(self) -> None:
        """Finish the jobs given, then end the engine (waits for the thread)."""
        self._jobs.put(STOP)
        self._thread.join()


class DeviceError(Exception):
    """A batch that the engine failed on (not the request's fault): HTTP 500 with this one line."""


def _process_main(spec: EngineConfig, gpu: int, conn: Any, owner: int, cpus: list[int]) -> None:
    """A GPU worker process: its engine on GPU ``gpu`` (as device 0), jobs from ``conn``, results back on it; its
    decoders on its share of the CPUs (multi_gpu.cpu_share: the default decode threads follow the affinity)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)  # a fresh (spawned) interpreter: set before pycuda starts
    # a signal to the whole process group (Ctrl-C, kill of the group) is the server's to handle: it answers what is
    # in flight, then stops its devices in order; a server that ends otherwise takes them with it (die_with)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with(owner)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        worker = DeviceWorker(spec)
        worker.warm_up()
    except BaseException as e:
        conn.send(("error", f"GPU {gpu}: {failure(e)}"))
        return
    conn.send(("ready", (worker.facts(), worker.engine.preprocess, worker.depth, worker.encoded_batch)))

    def take(block: bool) -> Any:
        return conn.recv() if block or conn.poll() else None

    try:
        serve_jobs(worker, take, lambda key, result, error: conn.send((key, result, error)))
    finally:
        worker.close()


def picklable(job: Job) -> Job:
    """The job with its images as bytes: views of request bodies (protocol.split_bytes) do not pickle."""
    if job.kind != "encoded" or all(isinstance(d, bytes) for d in job.data):
        return job
    return Job(job.kind, [bytes(d) for d in job.data], job.names, job.top_k)


class ProcessDevice:
    """A device whose engine runs in a worker process of its own (several GPUs: the module doc says why)."""

    def __init__(self, spec: EngineConfig, index: int, loop: asyncio.AbstractEventLoop, cpus: list[int] | None = None):
        self.index, self.loop, self.name, self.depth = index, loop, f"gpu{index}", 1
        self.encoded_batch = spec.batch_size or 1  # set from the worker's ready message
        ctx = multiprocessing.get_context("spawn")  # not a fork of a process that may hold a CUDA context
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_process_main, args=(spec, index, child, os.getpid(), cpus or []),
                                 daemon=True)
        self._proc.start()
        child.close()
        self._ready: asyncio.Future[tuple[EngineFacts, Preprocess]] = loop.create_future()
        self._futures: dict[int, asyncio.Future] = {}
        self._next = 0
        # sent from a thread of its own: a send blocks while the worker computes, which the event loop must not
        self._outbox: queue.Queue[Any] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"device-{self.name}-reader", daemon=True)
        self._sender = threading.Thread(target=self._send, name=f"device-{self.name}-sender", daemon=True)
        self._reader.start()
        self._sender.start()

    async def ready(self) -> tuple[EngineFacts, Preprocess]:
        """Its engine's facts and preprocessing, once it has warmed up (EngineError where it could not)."""
        return await self._ready

    def _read(self) -> None:
        try:
            kind, payload = self._conn.recv()
            if kind == "error":
                raise EngineError(payload)
            facts, pre, self.depth, self.encoded_batch = payload
            self.loop.call_soon_threadsafe(_settle, self._ready, (facts, pre), None)
            while True:
                key, result, error = self._conn.recv()
                fut = self._futures.pop(key)
                self.loop.call_soon_threadsafe(_settle, fut, result, None if error is None else DeviceError(error))
        except (EOFError, OSError, EngineError) as e:
            error = e if isinstance(e, EngineError) else DeviceError(f"the worker for {self.name} ended "
                                                                     f"(exit code {self._proc.exitcode})")
            for fut in [self._ready, *self._futures.values()]:
                self.loop.call_soon_threadsafe(_settle, fut, None, error)

    def _send(self) -> None:
        while True:
            item = self._outbox.get()
            if item != STOP:  # made picklable here, off the event loop
                item = (item[0], picklable(item[1]))
            try:
                self._conn.send(item)
            except OSError:  # the worker ended: the reader fails what is outstanding
                return
            if item == STOP:
                return

    def run(self, job: Job) -> asyncio.Future:
        fut = self.loop.create_future()
        key, self._next = self._next, self._next + 1
        self._futures[key] = fut
        self._outbox.put((key, job))
        return fut

    def close(self) -> None:
        self._outbox.put(STOP)
        self._sender.join(timeout=60)
        self._proc.join(timeout=60)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join()
        self._reader.join(timeout=5)


def _settle(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def make_devices(spec: EngineConfig, gpus: int, loop: asyncio.AbstractEventLoop) -> list[Any]:
    """One device per GPU (``gpus`` of them: worker processes where more than one), or one on the CPU backend."""
    if spec.backend == "cpu" or gpus <= 1:
        return [ThreadDevice(spec, 0, loop)]

    return [ProcessDevice(spec, g, loop, cpu_share(g, gpus)) for g in range(gpus)]

