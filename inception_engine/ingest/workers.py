"""Decode workers: a pool of threads or processes that decode images (Pillow: read, EXIF orientation, RGB, Resize,
CenterCrop) straight into slots of a HostRing, an image's error line instead where it cannot be decoded.

Processes (the ring is then shared memory) decode 2.7x faster than threads on the H100 machine's 16 cores, whose GIL
serialises Pillow's Python parts; threads start instantly. A process worker takes several images a task
(``process_chunk``), so that the parent's share of the work stays small, and ends as soon as the process that owns
the pool ends, however it ends (``die_with``).
"""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing
import os
import select
import signal
import threading
import time
import warnings
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
from PIL import Image

from ..errors import EngineError, first_line
from .files import ImageSource
from .modes import WORKER_KINDS
from .images import Preprocess, decode_u8, decode_u8_bytes, let_pillow_open
from .ring import HostRing, RingDescriptor


def default_workers() -> int:
    """Decode workers by default: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def decode_into(ring: np.ndarray, slot: int, source: ImageSource, pre: Preprocess,
                data: bytes | None = None) -> str | None:
    """Decode one image (from ``data``, its file's bytes read already, where given) into its ring slot; the error
    line instead where it cannot be read. Anything Pillow throws is this image's error, never the run's."""
    try:
        dst = ring[slot]  # written in place where the decode can (pytorch-fid's resize), else copied in
        x = decode_u8(source, pre, dst) if data is None else decode_u8_bytes(data, str(source), pre, dst)
        if x is not dst:
            dst[...] = x
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
    let_pillow_open(pre.max_pixels)  # the run's pixel limit (--max-pixels), in this process too
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the pool
    dtype = np.dtype(pre.pixel_dtype)
    ring = mmap.mmap(fd, int(np.prod(shape)) * dtype.itemsize)
    os.close(fd)  # the mapping keeps the memory
    _worker_ring = np.ndarray(shape, dtype, buffer=ring)
    warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # images.open_image refuses those itself


def die_with(owner: int) -> None:
    """End this process as soon as the process that owns the pool (``owner``) ends, however it ends.

    A killed owner leaves no one to shut the pool down: the workers would wait for tasks forever, and they hold the
    forkserver's liveness pipe and the resource tracker's, so those would never end either. A daemon thread waits on
    a pidfd of the owner (readable when it exits) and exits the process; PR_SET_PDEATHSIG kills it with its direct
    parent, the forkserver. Once the workers are gone the forkserver and the resource tracker see their pipes close
    and end by themselves (the tracker unlinking the pool's semaphores)."""
    try:
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


def forkserver_context() -> multiprocessing.context.BaseContext:
    """Where decode processes come from: a forkserver, a fresh interpreter (not a fork of one that holds a CUDA
    context and threads) that imports this module (NumPy, Pillow, the preprocessing) once; each worker is forked
    from it with those imports done, and unpickles its tasks' functions from them."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])  # instead of the default, __main__: the whole command's imports
    return ctx


def start_forkserver() -> None:
    """Start the decode processes' forkserver now, without waiting for it: its interpreter and imports (~0.5 s)
    then run beside whatever the caller does next (the engine builds its backend), and the workers that the pool
    forks later start at once. Nothing happens where it runs already."""
    from multiprocessing import forkserver

    forkserver_context()
    forkserver.ensure_running()


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
            self._pool = ProcessPoolExecutor(workers, mp_context=forkserver_context(),
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
