"""Several HTTP front-end processes before one engine process (``inception-serve --http-workers N``).

One Python process receiving requests (uvicorn's body reception, parsing, answer building) is the limit of a server
whose GPU can do more: a saturated 64-image JPEG server spent its event loop there, not on the engine. So here N
front-end processes (each a uvicorn server with the routes of app.py) accept on the one listening socket (the
kernel hands each connection to whichever is waiting in accept: a busy one takes fewer), and the process that
started them, the hub, holds the devices and their batcher (devices.py, batcher.py): one engine per GPU, whose
batches join the images of every front-end's requests.

The hand-off. Each front-end has an arena, an anonymous shared memory file (memfd) the hub made and sent it over
their socket; a request's encoded images (or host-decoded pixels, or its tensor) are copied into the arena once,
and only their place (offset, lengths, shape) goes to the hub, a small pickled message on a Unix socket. The hub's
devices read the images where they lie. Answers are small (per image its top-k, or a row of logits) and come back
pickled on the same socket; the front-end frees the request's block only then, so that no device can read a block
being rewritten, even for a request whose client has gone or timed out meanwhile. A job that does not fit the
arena's free space goes in the message itself (slower, never refused).

Metrics: every process writes its own into prometheus-client's multiprocess files (PROMETHEUS_MULTIPROC_DIR, a
directory the command makes and removes): requests in the front-ends, batches in the hub; any front-end's
``/metrics`` reads them all.

Stop: SIGTERM or SIGINT to the hub: it sends SIGTERM to each front-end, which stops accepting and answers what it
holds (uvicorn's graceful shutdown) while the hub goes on computing for them; once they have exited the hub ends its
devices and returns. A front-end that ends on its own stops the server with one line (a supervisor restarts it).
"""

from __future__ import annotations

import asyncio
import mmap
import os
import pickle
import socket
import struct
from typing import Any

import numpy as np

from ..results import EngineFacts
from ..errors import EngineError

ARENA_BYTES = 512 << 20  # a front-end's shared memory: pages are taken as used, not at creation
ALIGN = 64
FRAME = struct.Struct("<Q")


class Arena:
    """First-fit allocation of blocks in a buffer: blocks go to the lowest free place, so the pages in use stay
    those of the most requests in flight at once, not the whole buffer."""

    def __init__(self, size: int):
        self.size = size
        self.starts: list[int] = []  # sorted
        self.ends: dict[int, int] = {}

    def alloc(self, n: int) -> int | None:
        """The offset of a free block of ``n`` bytes, None where none is free."""
        n = max(ALIGN, -(-n // ALIGN) * ALIGN)
        at, i = 0, 0
        while i < len(self.starts) and self.starts[i] - at < n:  # the gap before block i is too small
            at = self.ends[self.starts[i]]
            i += 1
        if at + n > self.size:
            return None
        self.starts.insert(i, at)
        self.ends[at] = at + n
        return at

    def free(self, at: int) -> None:
        self.starts.remove(at)
        del self.ends[at]

    @property
    def used(self) -> int:
        return sum(e - s for s, e in self.ends.items())


# ------------------------------------------------------------------------------------------ messages and jobs

async def send(writer: asyncio.StreamWriter, message: Any) -> None:
    data = pickle.dumps(message, protocol=5)
    writer.write(FRAME.pack(len(data)) + data)
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> Any:
    """The next message; asyncio.IncompleteReadError where the other side has gone."""
    (n,) = FRAME.unpack(await reader.readexactly(FRAME.size))
    return pickle.loads(await reader.readexactly(n))


def pack(kind: str, data: Any, arena: Arena, buf: memoryview) -> tuple[Any, int | None]:
    """A job's data put in the arena: (where it is, as the message says it, the block to free once answered, None
    where the data travels in the message instead)."""
    if kind == "encoded":
        lengths = [len(d) for d in data]
        at = arena.alloc(sum(lengths))
        if at is None:
            return ("inline", [bytes(d) for d in data]), None
        pos = at
        for d, n in zip(data, lengths):
            buf[pos:pos + n] = d
            pos += n
        return ("shm", at, lengths), at
    array = np.ascontiguousarray(data)
    at = arena.alloc(array.nbytes)
    if at is None:
        return ("inline", array), None
    np.frombuffer(buf, array.dtype, array.size, at).reshape(array.shape)[...] = array
    return ("shm", at, (array.shape, array.dtype.str)), at


def unpack(where: Any, buf: memoryview) -> Any:
    """The job's data where ``pack`` put it: views of the arena (images' bytes, or an array), not copies."""
    if where[0] == "inline":
        return where[1]
    _, at, spec = where
    if isinstance(spec, list):
        out, pos = [], at
        for n in spec:
            out.append(buf[pos:pos + n])
            pos += n
        return out
    shape, dtype = spec
    dtype = np.dtype(dtype)
    return np.frombuffer(buf, dtype, int(np.prod(shape)), at).reshape(shape)


# --------------------------------------------------------------------------------------------- the front-end

class HubClient:
    """A front-end's link to the hub: what the app's Server uses in place of its own devices and batcher
    (``run``, as batcher.Batcher's)."""

    def __init__(self, sock: socket.socket, arena_fd: int):
        self.sock = sock
        self.map = mmap.mmap(arena_fd, 0)
        os.close(arena_fd)
        self.buf = memoryview(self.map)
        self.arena = Arena(len(self.map))
        self.futures: dict[int, tuple[asyncio.Future, int | None]] = {}
        self.next = 0
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task | None = None

    async def ready(self) -> tuple[EngineFacts, Any, list[str]]:
        """The engines' facts, preprocessing and device names once the hub's devices have warmed up (EngineError
        with the hub's line where they could not start)."""
        self.reader, self.writer = await asyncio.open_unix_connection(sock=self.sock)
        message = await receive(self.reader)
        if message[0] == "failed":
            raise EngineError(message[1])
        self.task = asyncio.create_task(self._answers())
        return message[1], message[2], message[3]

    async def acknowledge(self) -> None:
        assert self.writer is not None
        await send(self.writer, ("ready",))

    async def run(self, kind: str, data: Any, names: list[str], top_k: int = 0) -> Any:
        """Every image's result, as Batcher.run gives it (a tensor job: its logits, one array)."""
        assert self.writer is not None
        from .devices import DeviceError

        where, block = pack(kind, data, self.arena, self.buf)
        fut = asyncio.get_running_loop().create_future()
        rid, self.next = self.next, self.next + 1
        self.futures[rid] = (fut, block)
        try:
            await send(self.writer, ("job", rid, kind, where, names, top_k))
        except (ConnectionError, RuntimeError):
            self._settle_all("the engine process has ended")
        results, error = await fut
        if error is not None:
            raise DeviceError(error)
        return results

    async def _answers(self) -> None:
        assert self.reader is not None
        try:
            while True:
                _, rid, results, error = await receive(self.reader)
                fut, block = self.futures.pop(rid)
                if block is not None:  # the hub is done with it: free for the next request
                    self.arena.free(block)
                if not fut.done():  # not timed out meanwhile
                    fut.set_result((results, error))
        except (asyncio.IncompleteReadError, ConnectionError):
            self._settle_all("the engine process has ended")

    def _settle_all(self, error: str) -> None:
        for fut, _ in self.futures.values():
            if not fut.done():
                fut.set_result((None, error))

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.writer is not None:
            self.writer.close()
