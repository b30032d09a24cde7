"""Reading image files for --decode gpu: on the calling thread, or ahead of it in a process of its own.

The GPU decoder (nvImageCodec) runs on the main thread and takes the GIL back once per image; any other Python
thread that holds the GIL then makes it wait (on the H100 machine a spinning thread took the decode from ~7,700 to
77 images/s, and reader threads cost more than reading inline). Reading a file is still ~40-60 µs of the main
thread's time (open, fstat, read, close), a third of the pipeline's budget per image at 8,000 images/s. So long runs
read in a separate process, which has a GIL of its own: it reads each batch's files into a slot of a shared-memory
ring, and the main thread takes the bytes out with one copy per file. A file that does not fit in its slot's space,
or that changes size while being read, is read again on the main thread; errors come back as the same one-line
messages either way.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from concurrent.futures import BrokenExecutor, Future, ProcessPoolExecutor
from multiprocessing import shared_memory

from .images import first_line

ReadResult = tuple[bytes | None, str | None]  # (the file's bytes, None) or (None, the error line)
SLOT_BYTES_PER_FILE = 512 * 1024  # a batch's slot: room for files of this size on average (ImageNet's: ~110 KB)


def read_error(source: str | os.PathLike, e: OSError) -> str:
    """The error line for a file that cannot be read, worded as images.open_image words it."""
    if isinstance(e, FileNotFoundError):
        return f"{source}: no such file"
    if isinstance(e, IsADirectoryError):
        return f"{source}: is a directory, not an image"
    if isinstance(e, PermissionError):
        return f"{source}: permission denied"
    return f"{source}: cannot read ({first_line(e)})"


def read_file(source: str | os.PathLike) -> ReadResult:
    try:
        with open(source, "rb", buffering=0) as f:  # unbuffered: one fstat and one read, no BufferedReader copy
            data = f.readall()
    except OSError as e:
        return None, read_error(source, e)
    return (data, None) if data else (None, f"{source}: empty file")


def read_files(sources: Sequence[str | os.PathLike]) -> list[ReadResult]:
    return [read_file(s) for s in sources]


# ------------------------------------------------------------------------------------- the reader process's side

_ring: shared_memory.SharedMemory | None = None  # the reader process's view of the ring (set by its initializer)

Placed = tuple[int, int] | str | None  # (offset, length) in the ring, an error line, or None: read it yourself


def _attach(name: str) -> None:
    global _ring
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the pool
    _ring = shared_memory.SharedMemory(name=name)  # the parent owns and unlinks it (see pipeline._attach_ring)


def _read_into(start: int, size: int, sources: list[str]) -> list[Placed]:
    """Each file's bytes packed into ring[start:start + size], in order."""
    assert _ring is not None, "reader started without the ring"
    buf, pos, end = _ring.buf, start, start + size
    placed: list[Placed] = []
    for source in sources:
        try:
            with open(source, "rb", buffering=0) as f:
                n = os.fstat(f.fileno()).st_size
                if n == 0 or pos + n > end:
                    placed.append(None)  # empty (the caller words it) or no room: the caller reads it
                    continue
                got = f.readinto(buf[pos:pos + n])
                if got != n or f.read(1):
                    placed.append(None)  # it changed while being read
                    continue
        except OSError as e:
            placed.append(read_error(source, e))
            continue
        placed.append((pos, n))
        pos += n
    return placed


# ------------------------------------------------------------------------------------------- the caller's side

class FileReader:
    """Reads batches of files ahead of the caller, in a process of its own, into a ring of ``slots`` batch slots.

    ``submit(slot, sources)`` starts reading a batch into a slot; ``take(slot, sources, future)`` gives each file's
    ReadResult, after which the slot may be reused. If the reader process dies, the rest is read on this thread."""

    def __init__(self, batch: int, slots: int):
        import multiprocessing

        self.slot_bytes = batch * SLOT_BYTES_PER_FILE
        self.slots = slots
        self._shm: shared_memory.SharedMemory | None = shared_memory.SharedMemory(create=True,
                                                                                  size=slots * self.slot_bytes)
        # forkserver: a fresh interpreter, not a fork of one that holds a CUDA context and threads
        self._pool: ProcessPoolExecutor | None = ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("forkserver"), initializer=_attach, initargs=(self._shm.name,))

    @staticmethod
    def ring_bytes(batch: int, slots: int) -> int:
        return batch * SLOT_BYTES_PER_FILE * slots

    def submit(self, slot: int, sources: Sequence[str | os.PathLike]) -> Future | None:
        """None once the reader process is gone: ``take`` then reads on this thread."""
        if self._pool is None:
            return None
        try:
            return self._pool.submit(_read_into, slot * self.slot_bytes, self.slot_bytes, [str(s) for s in sources])
        except (BrokenExecutor, RuntimeError):
            self._pool = None
            return None

    def take(self, sources: Sequence[str | os.PathLike], future: Future | None) -> list[ReadResult]:
        if future is None:
            return read_files(sources)
        try:
            placed = future.result()
        except BrokenExecutor:  # the reader was killed (out of memory, a signal): read here from now on
            self._pool = None
            return read_files(sources)
        assert self._shm is not None
        buf = self._shm.buf
        out: list[ReadResult] = []
        for source, p in zip(sources, placed):
            if p is None:
                out.append(read_file(source))
            elif isinstance(p, str):
                out.append((None, p))
            else:
                out.append((bytes(buf[p[0]:p[0] + p[1]]), None))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None
