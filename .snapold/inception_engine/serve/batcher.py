"""Dynamic batching: the images of every connection's requests joined into batches for the devices.

Each kind of job (devices.Job: ``encoded``, ``pixels``, ``tensor``) has its lane, a queue of pieces of requests. A
lane's collector waits for its first image, then up to ``max_delay`` seconds more for the batch to fill to
``max_batch`` images, then for a device with room (each takes its runner's ``depth`` jobs at once), and takes
whatever the lane holds by then, up to the lane's job size: while every device is busy jobs fill by themselves. The
job size is ``max_batch``, except the ``encoded`` lane's, which is the devices' ``encoded_batch`` (a GPU decode
call of several batches: devices.py says why). A request larger than a job is split, and a job may end inside a
request: its images are answered from several jobs and put back in order. Each job's results go back to the
requests it holds, each to its own.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .devices import Job

KINDS = ("encoded", "pixels", "tensor")


@dataclass
class Pending:
    """A request's images waiting for their results: ``results[i]`` is image i's, filled batch by batch."""

    kind: str
    data: Any  # list of bytes or an array, one entry per image
    names: list[str]  # each image's name in error messages
    top_k: int
    future: asyncio.Future
    results: list[Any] = field(default_factory=list)
    left: int = 0
    queued_at: float = 0.0

    def __post_init__(self) -> None:
        self.results = [None] * len(self.data)
        self.left = len(self.data)


@dataclass
class Piece:
    request: Pending
    start: int
    stop: int


class Lane:
    def __init__(self) -> None:
        self.pieces: deque[Piece] = deque()
        self.count = 0  # images waiting
        self.arrived = asyncio.Event()

    def add(self, piece: Piece) -> None:
        self.pieces.append(piece)
        self.count += piece.stop - piece.start
        self.arrived.set()

    def take(self, most: int) -> list[Piece]:
        """Up to ``most`` images, in arrival order, splitting the last piece where it does not fit."""
        out, room = [], most
        while self.pieces and room:
            p = self.pieces.popleft()
            if p.request.future.done():  # its request timed out or failed: nobody waits for these images
                self.count -= p.stop - p.start
                continue
            if p.stop - p.start > room:
                self.pieces.appendleft(Piece(p.request, p.start + room, p.stop))
                p = Piece(p.request, p.start, p.start + room)
            out.append(p)
            room -= p.stop - p.start
        self.count -= most - room
        return out


@dataclass
class BatchStats:
    """What the metrics record of one batch."""

    device: str
    images: int
    queue_seconds: list[float]  # per request piece: from its arrival to its batch's start
    compute_seconds: float


class Batcher:
    """Runs requests' images on ``devices`` (devices.ThreadDevice / ProcessDevice, ready), in batches of up to
    ``max_batch`` gathered for up to ``max_delay`` seconds. ``on_batch`` is told of every batch."""

    def __init__(self, devices: list[Any], max_batch: int, max_delay: float,
                 on_batch: Callable[[BatchStats], None] | None = None):
        self.devices, self.max_batch, self.max_delay = devices, max_batch, max_delay
        self.on_batch = on_batch
        self.lanes = {kind: Lane() for kind in KINDS}
        # images a job of each lane may hold (devices are ready: their encoded_batch is known)
        self.job_images = {kind: max_batch for kind in KINDS}
        self.job_images["encoded"] = max(max_batch, min(d.encoded_batch for d in devices))
        self.idle: asyncio.Queue[Any] = asyncio.Queue()  # a device once per batch it may take now
        for d in devices:
            for _ in range(max(1, d.depth)):
                self.idle.put_nowait(d)
        self.running: set[asyncio.Task] = set()
        self.collectors = [asyncio.create_task(self._collect(lane, self.job_images[kind]))
                           for kind, lane in self.lanes.items()]

    async def run(self, kind: str, data: Any, names: list[str], top_k: int = 0) -> list[Any]:
        """Every image's result, in order (devices.DeviceError where a batch failed); ``names``: the images' names
        in error messages."""
        loop = asyncio.get_running_loop()
        req = Pending(kind, data, names, top_k, loop.create_future(), queued_at=time.perf_counter())
        lane, most = self.lanes[kind], self.job_images[kind]
        for start in range(0, len(data), most):
            lane.add(Piece(req, start, min(start + most, len(data))))
        return await req.future

    async def _collect(self, lane: Lane, most: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not lane.count:
                lane.arrived.clear()
                await lane.arrived.wait()
            deadline = loop.time() + self.max_delay
            while lane.count < self.max_batch and loop.time() < deadline:
                lane.arrived.clear()
                try:
                    async with asyncio.timeout(deadline - loop.time()):
                        await lane.arrived.wait()
                except TimeoutError:
                    break
            device = await self.idle.get()
            pieces = lane.take(most)
            if not pieces:  # every request waiting had timed out
                self.idle.put_nowait(device)
                continue
            task = asyncio.create_task(self._run_batch(device, pieces))
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    async def _run_batch(self, device: Any, pieces: list[Piece]) -> None:
        started = time.perf_counter()
        first = pieces[0].request
        job = Job(first.kind, join([p.request.data[p.start:p.stop] for p in pieces], first.kind),
                  [name for p in pieces for name in p.request.names[p.start:p.stop]],
                  max(p.request.top_k for p in pieces))
        try:
            results, error = await device.run(job), None
        except Exception as e:  # the device's failure, one line: every request in the batch gets it
            results, error = None, e
        finally:
            self.idle.put_nowait(device)
        at = 0
        for p in pieces:
            req = p.request
            n = p.stop - p.start
            if req.future.done():  # failed by another batch, or its client went away
                at += n
                continue
            if error is not None:
                req.future.set_exception(error)
                continue
            req.results[p.start:p.stop] = results[at:at + n]
            at += n
            req.left -= n
            if not req.left:
                req.future.set_result(req.results)
        if self.on_batch is not None:
            self.on_batch(BatchStats(device.name, len(job.names),
                                     [started - p.request.queued_at for p in pieces], time.perf_counter() - started))

    async def close(self) -> None:
        """Stop taking batches once the lanes are empty and the batches running have finished."""
        while any(lane.count for lane in self.lanes.values()) or self.running:
            await asyncio.sleep(0.01)
        for c in self.collectors:
            c.cancel()
        await asyncio.gather(*self.collectors, return_exceptions=True)


def join(parts: list[Any], kind: str) -> Any:
    if kind == "encoded":
        return [item for part in parts for item in part]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
