"""``inception-run --gpus N`` without Ray: one worker process per GPU of this machine, results in input order.

The inputs are cut into chunks of a few batches, dealt round-robin: worker ``w`` classifies chunks ``w``, ``w + N``,
``w + 2N``, ... as one stream (its own Engine and pipeline, ``CUDA_VISIBLE_DEVICES=w`` so that it sees one GPU), and
the parent takes chunk ``c``'s predictions from worker ``c % N`` in turn, so the output stays in input order and a
slower GPU holds the others back by at most a chunk or so of results (they wait in its queue). Decode workers are
shared out: each process gets its share of the CPUs. For several machines use Ray (ray_data.py).

The parent builds no engine and reads no weights (an ONNX export given as weights it converts, or finds converted,
once: the workers read the weight file). Its EngineConfig was checked where it was made; what probes the GPU (the
GPU count, config.resolve: ~0.5 s) runs while the workers start, ending them where it fails. Each worker sends its
engine's facts (results.EngineFacts) first on its queue, before its chunks, and the parent reports worker 0's
(``GpuRun.facts``).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from . import backends
from .config import EngineConfig, resolve
from .engine import Engine
from .errors import EngineError, first_line
from .ingest.workers import default_workers, die_with
from .model_files import weight_file_path
from .output import Rendered
from .results import EngineFacts, Prediction

CHUNK_BATCHES = 4  # chunk = this many batches: long enough to keep a worker's pipeline full, short enough to balance


@dataclass(frozen=True)
class WorkerNote:
    """A note a worker's engine took mid-run (no tuning table, the --decode gpu fallback): the parent prints it."""

    text: str


def deal(paths: list[str], workers: int, chunk: int) -> list[list[str]]:
    """Each worker's inputs: chunks of ``chunk`` paths dealt round-robin."""
    shares: list[list[str]] = [[] for _ in range(workers)]
    for c, start in enumerate(range(0, len(paths), chunk)):
        shares[c % workers] += paths[start:start + chunk]
    return shares


def cpu_share(gpu: int, gpus: int) -> list[int]:
    """The CPUs worker ``gpu`` of ``gpus`` keeps to: its slice of those this process may use (all, where there are
    fewer CPUs than workers). Each worker's decoders (nvImageCodec's threads, Pillow's processes) then stay on
    their own cores instead of every worker's threads contending for all of them."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return []
    if len(cpus) < gpus:
        return cpus
    per = len(cpus) // gpus
    return cpus[gpu * per:(gpu + 1) * per]


def _worker(gpu: int, inbox: Any, config: EngineConfig, top_k: int, out: Any, cpus: list[int],
            fmt: str | None) -> None:
    """Builds its engine and puts its facts (EngineFacts) on ``out``, then classifies the share that comes on
    ``inbox`` with its chunk size (the parent lists its inputs meanwhile), putting each chunk's predictions as one
    list (one pickle and one queue round trip a chunk, not an image). With ``fmt`` (the --output file's format) each
    prediction goes as its rendered line (output.Rendered): the parent, one process for every GPU, then only puts
    lines in order."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)  # a fresh (spawned) interpreter: set before pycuda starts
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it ends the workers
    die_with(os.getppid())  # a parent killed outright (SIGKILL) takes its GPU workers with it
    if cpus:
        os.sched_setaffinity(0, cpus)

    def end(*_: object) -> None:
        # the parent ends a worker with SIGTERM: leave through the with-block, which shuts the decode processes
        # down, without waiting to hand over results that the parent no longer reads
        out.cancel_join_thread()
        sys.exit(143)

    signal.signal(signal.SIGTERM, end)
    try:
        with Engine.from_config(config) as engine:
            out.put(engine.facts())
            engine.on_note = lambda note: out.put(WorkerNote(note))
            chunk, share = inbox.get()
            done: list[Prediction | Rendered] = []
            for p in engine.predict_iter(share, top_k, render=fmt):
                done.append(p)
                if len(done) == chunk:
                    out.put(done)
                    done = []
            if done:  # the input's last chunk, shorter
                out.put(done)
            if config.decode == "gpu":
                # All this process holds then is what the driver frees with it (GPU memory, its context,
                # nvImageCodec's): it leaves as soon as its results are handed over, sparing the run the engine's
                # teardown (~0.5 s between the last result and the run's end). Its CPU-decode counterpart shuts its
                # decode processes down in order instead (through the with-block).
                out.close()
                out.join_thread()
                os._exit(0)
    except EngineError as e:
        out.put(EngineError(f"GPU {gpu}: {e}"))
    except Exception as e:  # whatever it was, the parent reports it in one line instead of waiting forever
        out.put(EngineError(f"GPU {gpu}: {type(e).__name__}: {first_line(e)}"))


def _next(q: Any, proc: Any, gpu: int, on_note: Callable[[str], None]) -> Any:
    """The next item a worker put on its queue, waiting while the worker lives: EngineError, in one line, where it
    sent one or died. Its notes on the way go to on_note."""
    while True:
        try:
            item = q.get(timeout=1.0)
        except queue.Empty:
            if not proc.is_alive() and q.empty():
                raise EngineError(f"the worker for GPU {gpu} died (exit code {proc.exitcode})") from None
            continue
        if isinstance(item, EngineError):
            raise item
        if isinstance(item, WorkerNote):
            on_note(item.text)
            continue
        return item


def predict_on_gpus(paths: list[str], gpus: int, top_k: int, config: EngineConfig,
                    on_progress: Callable[[int], None] | None = None, fmt: str | None = None) -> GpuRun:
    """Predictions for ``paths`` in order, classified by ``gpus`` worker processes: ``start_on_gpus``, then
    ``GpuRun.classify(paths)``."""
    return start_on_gpus(gpus, top_k, config, on_progress, fmt).classify(paths)


def start_on_gpus(gpus: int, top_k: int, config: EngineConfig, on_progress: Callable[[int], None] | None = None,
                  fmt: str | None = None) -> GpuRun:
    """``gpus`` worker processes (GPU 0 .. gpus - 1) started now, in parallel, each on its own share of the CPUs
    (``cpu_share``), building its engine while the caller lists the inputs it then gives ``GpuRun.classify``; with
    ``fmt`` ("jsonl" or "csv"), each prediction comes as its line of such a file (output.Rendered), rendered by the
    workers. Refused at the call where this machine has fewer GPUs (OptionError) or the backend cannot run as
    configured (config.resolve); a weight file that cannot be read is worker 0's EngineError, at ``GpuRun.facts``
    or the first prediction. What probes the GPU (its count; the backend, unless it is cpu) runs while the workers
    start, ending them where it fails."""
    if config.weights_path is not None:  # an ONNX export: converted (or found converted) here once, not by each worker
        config = config.replace(weights=weight_file_path(config.weights_path))
    # resolving any backend but cpu probes its library and the GPU: that waits until the workers are starting
    resolved = resolve(config) if config.backend == "cpu" else None
    cpus = [cpu_share(g, gpus) for g in range(gpus)]
    if config.workers is None:
        config = config.replace(workers=max(1, len(cpus[0]) or default_workers() // gpus))
    ctx = multiprocessing.get_context("spawn")  # not a fork of a process that may hold a CUDA context
    queues, inboxes = [ctx.Queue() for _ in range(gpus)], [ctx.Queue() for _ in range(gpus)]
    # not daemonic: a daemonic process may not start processes, and each worker starts its decode processes.
    # GpuRun.close ends them instead.
    procs = [ctx.Process(target=_worker, args=(g, inboxes[g], config, top_k, queues[g], cpus[g], fmt))
             for g in range(gpus)]
    for p in procs:
        p.start()
    run = GpuRun(gpus, queues, inboxes, procs, on_progress)
    try:
        backends.require_gpus(gpus)
        run.chunk = (resolved or resolve(config)).batch_size * CHUNK_BATCHES
    except BaseException:
        run.close()
        raise
    return run


class GpuRun:
    """The workers' chunks in input order, as an iterator that ``close`` ends at any point, read or not. Each
    worker leaves by itself once its share is read (so that it shuts its decode processes and semaphores down in
    order); one still running when the caller stops early is ended with SIGTERM."""

    def __init__(self, gpus: int, queues: list[Any], inboxes: list[Any], procs: list[Any],
                 on_progress: Callable[[int], None] | None):
        self.procs = procs
        self.chunk = 0  # images a chunk: CHUNK_BATCHES batches, set once the batch size is settled
        self._gpus, self._on_progress = gpus, on_progress
        self._queues, self._inboxes = queues, inboxes
        self._facts: dict[int, EngineFacts] = {}  # per worker, taken off its queue ahead of its first chunk
        # called with each note a worker's engine takes mid-run, once per text (every worker may take the same one)
        self.on_note: Callable[[str], None] | None = None
        self._noted: set[str] = set()
        self._finished = False
        self._it: Iterator[Prediction | Rendered] | None = None

    def classify(self, paths: list[str]) -> GpuRun:
        """Give the workers their inputs: chunks of ``paths`` dealt round-robin (``deal``); the run, for iterating
        over their predictions in the order of ``paths``."""
        for inbox, share in zip(self._inboxes, deal(paths, self._gpus, self.chunk)):
            inbox.put((self.chunk, share))
        self._it = self._chunks(len(paths))
        return self

    def facts(self) -> EngineFacts:
        """Worker 0's engine's facts (its backend, precision, batch size, weight file and notes), once its engine
        is built: EngineError, in one line, where it fails or dies first."""
        return self._facts_of(0)

    def _note(self, text: str) -> None:
        if text not in self._noted:
            self._noted.add(text)
            if self.on_note is not None:
                self.on_note(text)

    def _facts_of(self, g: int) -> EngineFacts:
        if g not in self._facts:
            self._facts[g] = _next(self._queues[g], self.procs[g], g, self._note)
        return self._facts[g]

    def _chunks(self, n: int) -> Iterator[Prediction | Rendered]:
        chunk, gpus, on_progress = self.chunk, self._gpus, self._on_progress
        chunks = (n + chunk - 1) // chunk
        for c in range(chunks):
            g = c % gpus
            self._facts_of(g)  # the worker's first item
            preds = _next(self._queues[g], self.procs[g], g, self._note)
            # every chunk taken: the workers leave by themselves (a caller takes exactly n results and never asks
            # past the last one, so this is said before they are handed out)
            self._finished = c == chunks - 1
            if on_progress:
                on_progress(len(preds))
            yield from preds

    def __iter__(self) -> GpuRun:
        return self

    def __next__(self) -> Prediction | Rendered:
        if self._it is None:
            raise RuntimeError("GpuRun.classify gives the workers their inputs first")
        return next(self._it)

    def close(self) -> None:
        if self._it is not None:
            self._it.close()
        for p in self.procs:
            if self._finished:
                p.join(timeout=30)
            if p.is_alive():
                p.terminate()
            p.join(timeout=30)
            if p.is_alive():  # stuck past its SIGTERM: its decode processes may be left, but the command ends
                p.kill()
                p.join()
        self.procs = []
