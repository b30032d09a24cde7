"""The engine process of ``inception-serve --http-workers N``: its devices and batcher, computing for N front-end
processes that it starts (``frontend_main``: app.py's routes, computing through frontends.HubClient); frontends.py
says how they hand requests over, and how the server stops."""

from __future__ import annotations

import asyncio
import mmap
import multiprocessing
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..results import EngineFacts
from ..errors import first_line
from ..ingest.workers import die_with
from .batcher import Batcher
from .devices import DeviceError, make_devices
from .frontends import ARENA_BYTES, HubClient, receive, send, unpack
from .settings import ServeOptions


@dataclass
class Frontend:
    index: int
    proc: Any  # multiprocessing.Process
    sock: socket.socket
    buf: memoryview  # its arena, as this process maps it
    writer: asyncio.StreamWriter | None = None
    acknowledged: asyncio.Event = field(default_factory=asyncio.Event)


class Hub:
    """Serves until SIGTERM or SIGINT (``main``); ``on_ready`` is told once every front-end is ready, or with None
    where the devices could not start."""

    def __init__(self, options: ServeOptions, listening: socket.socket, count: int,
                 on_ready: Callable[[EngineFacts | None, list[str]], Any]):
        self.options, self.listening, self.count, self.on_ready = options, listening, count, on_ready
        self.frontends: list[Frontend] = []
        self.devices: list[Any] = []
        self.batcher: Batcher | None = None
        self.failure: str | None = None
        self.tasks: set[asyncio.Task] = set()

    async def main(self) -> str | None:
        """Serve; returns why the server could not serve, None after a stop that was asked for."""
        from .app import Metrics

        loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        self.metrics = Metrics(self.options.max_batch)
        share = replace(self.options, decode_workers=max(1, self.options.decode_workers // self.count))
        self.frontends = [self._start_frontend(i, share) for i in range(self.count)]
        links = [asyncio.create_task(self._link(fe)) for fe in self.frontends]
        try:
            if await self._start_devices():
                await self.stopping.wait()
        finally:
            self.stopping.set()  # the front-ends' ends from here on are asked for
            await self._stop_frontends()
            for task in links:
                task.cancel()
            await self._close_devices()
        return self.failure

    def _start_frontend(self, index: int, options: ServeOptions) -> Frontend:
        mine, theirs = socket.socketpair()
        fd = os.memfd_create(f"inception-serve-arena-{index}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, ARENA_BYTES)
            buf = memoryview(mmap.mmap(fd, ARENA_BYTES))
            proc = multiprocessing.get_context("spawn").Process(
                target=frontend_main, args=(options, index, self.listening, theirs, os.getpid()),
                name=f"inception-serve-http-{index}")
            proc.start()
            theirs.close()
            socket.send_fds(mine, [b"arena"], [fd])
        finally:
            os.close(fd)
        return Frontend(index, proc, mine, buf)

    async def _start_devices(self) -> bool:
        """The devices built and warmed up, every front-end told and ready: True; False (``failure`` says why)
        where the devices could not start."""
        try:
            self.devices = make_devices(self.options.spec, self.options.gpus, asyncio.get_running_loop())
            all_facts = await asyncio.gather(*(d.ready() for d in self.devices))
        except Exception as e:
            self.failure = str(e)
            for fe in self.frontends:
                await self._tell(fe, ("failed", self.failure))
            self.on_ready(None, [])
            return False
        facts, pre = all_facts[0]
        self.batcher = Batcher(self.devices, self.options.max_batch, self.options.max_delay, self.metrics.batch)
        names = [d.name for d in self.devices]
        for fe in self.frontends:
            await self._tell(fe, ("ready", facts, pre, names))
        waits = [asyncio.create_task(fe.acknowledged.wait()) for fe in self.frontends]
        stop = asyncio.create_task(self.stopping.wait())
        await asyncio.wait([stop, asyncio.gather(*waits)], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if self.stopping.is_set():
            return False
        self.metrics.ready.set(1)
        self.on_ready(facts, names)
        return True

    async def _tell(self, fe: Frontend, message: Any) -> None:
        while fe.writer is None:  # its link not open yet
            await asyncio.sleep(0.001)
        try:
            await send(fe.writer, message)
        except ConnectionError:  # it has ended: its link says so
            pass

    async def _link(self, fe: Frontend) -> None:
        """A front-end's jobs, each answered when its batches are done; its end, where not asked for, stops the
        server."""
        reader, fe.writer = await asyncio.open_unix_connection(sock=fe.sock)
        try:
            while True:
                message = await receive(reader)
                if message[0] == "ready":
                    fe.acknowledged.set()
                    continue
                task = asyncio.create_task(self._answer(fe, message))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        if not self.stopping.is_set():
            await asyncio.get_running_loop().run_in_executor(None, fe.proc.join, 5)
            self.failure = f"HTTP front-end {fe.index} ended (exit code {fe.proc.exitcode}); the server stops"
            self.stopping.set()

    async def _answer(self, fe: Frontend, message: Any) -> None:
        _, rid, kind, where, names, top_k = message
        assert self.batcher is not None and fe.writer is not None
        try:
            results = await self.batcher.run(kind, unpack(where, fe.buf), names, top_k)
            reply = ("answer", rid, np.stack(results) if kind == "tensor" else results, None)
        except DeviceError as e:
            reply = ("answer", rid, None, str(e))
        except Exception as e:  # the hub's own fault: one line to the request, the server goes on
            reply = ("answer", rid, None, f"{type(e).__name__}: {first_line(e)}")
        try:
            await send(fe.writer, reply)
        except ConnectionError:  # the front-end has gone: nobody waits for this answer
            pass

    async def _stop_frontends(self) -> None:
        """SIGTERM to each front-end, then wait while they answer what they hold (the hub computing for them)."""
        from prometheus_client import multiprocess

        for fe in self.frontends:
            if fe.proc.is_alive():
                os.kill(fe.proc.pid, signal.SIGTERM)
        grace = self.options.limits.request_seconds + 10

        def join_all() -> None:
            for fe in self.frontends:
                fe.proc.join(grace)
                if fe.proc.is_alive():
                    fe.proc.kill()
                    fe.proc.join()

        await asyncio.get_running_loop().run_in_executor(None, join_all)
        for fe in self.frontends:
            multiprocess.mark_process_dead(fe.proc.pid)

    async def _close_devices(self) -> None:
        self.metrics.ready.set(0)
        if self.batcher is not None:
            await self.batcher.close()

        def close() -> None:
            for d in self.devices:
                d.close()

        await asyncio.get_running_loop().run_in_executor(None, close)


def frontend_main(options: ServeOptions, index: int, listening: socket.socket, link: socket.socket,
                  owner: int) -> None:
    """A front-end process (spawned): app.py's routes on the shared listening socket, computing through the hub;
    its arena comes first on ``link``. Ends with 0 once stopped (SIGTERM), as the one-process server does."""
    from .app import GracefulServer, Server, make_app, multiprocess_metrics

    die_with(owner)
    multiprocess_metrics()
    _, fds, _, _ = socket.recv_fds(link, 16, 1)
    hub = HubClient(link, fds[0])

    def on_ready(facts: EngineFacts | None, names: list[str]) -> None:
        if facts is not None:
            asyncio.get_running_loop().create_task(hub.acknowledge())

    server = Server(options, on_ready, hub=hub)
    GracefulServer(make_app(server), listening, timeout=options.limits.request_seconds + 5).run()


def serve_with_frontends(options: ServeOptions, listening: socket.socket, count: int,
                         on_ready: Callable[[EngineFacts | None, list[str]], Any]) -> str | None:
    """Run the hub and its ``count`` front-ends until stopped; why it could not serve, or None."""
    return asyncio.run(Hub(options, listening, count, on_ready).main())
