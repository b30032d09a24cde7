"""serve/devices.py's DeviceWorker and serve_jobs on stand-in runners (no GPU): an encoded job of a whole decode call is
decoded on the worker's decode thread while the device's thread collects the job before it, its forwards start in
job order, every image's result or error (naming the image, not the memory file) comes back in order."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest

from inception_engine.errors import EngineError
from inception_engine.ingest.files import read_file
from inception_engine.ingest.images import Preprocess
from inception_engine.serve.devices import STOP, DeviceWorker, Job, serve_jobs

BATCH = 2
DECODE_BATCH = 4 * BATCH


class Engine:
    backend_name, decode, preprocess, batch_size = "cuda", "gpu", Preprocess(), BATCH

    def close(self) -> None:
        pass


@dataclass
class Decoded:
    data: list[Any]  # bytes, or the file's error line
    first: int = 0


class SmallRunner:
    """A runner that decodes within submit_encoded (the worker's path for jobs of one batch or less)."""

    batch, depth, decode_fallback = 1, 2, None

    def __init__(self, log: list[tuple[str, Any]]):
        self.log = log

    def submit_encoded(self, items: list[tuple[str, bytes]], top_k: int) -> list[Any]:
        self.log.append(("small", threading.current_thread().name))
        return [read_file(path)[1] or [(len(read_file(path)[0]), 1.0)] for path, _ in items]

    def result(self, ticket: list[Any]) -> list[Any]:
        return ticket

    def close(self) -> None:
        pass


class BigRunner(SmallRunner):
    """cuda_runner.CudaRunner's decode-call interface: decode (on any thread), split, classify, result."""

    batch, decode_batch, decode_chains, depth = BATCH, DECODE_BATCH, 1, 2 * DECODE_BATCH // BATCH

    def __init__(self, log: list[tuple[str, Any]]):
        super().__init__(log)
        self.second_decode_started = threading.Event()
        self.fail_call: int | None = None

    def decode(self, paths: list[str], call: int) -> Decoded:
        self.log.append(("decode", (call, threading.current_thread().name)))
        if call == 1:
            self.second_decode_started.set()
        if call == self.fail_call:
            raise EngineError("the decoder failed (a test's)")
        return Decoded([read_file(p)[0] or read_file(p)[1] for p in paths])

    def split(self, decoded: Decoded) -> list[Decoded]:
        return [Decoded(decoded.data[a:a + BATCH], a) for a in range(0, len(decoded.data), BATCH)]

    def classify(self, part: Decoded, top_k: int) -> list[Any]:
        self.log.append(("classify", threading.current_thread().name))
        return [d if isinstance(d, str) else [(len(d), 1.0)] for d in part.data]

    def result(self, ticket: list[Any]) -> list[Any]:
        if not self.second_decode_started.wait(5):  # job 0's result waits until job 1's decode has begun
            raise AssertionError("the next job's decode did not start while this one's result was collected")
        return ticket


def run_jobs(worker: DeviceWorker, jobs: list[Job]) -> list[tuple[Any, str | None]]:
    todo: list[Any] = [(i, job) for i, job in enumerate(jobs)] + [STOP]
    got: list[tuple[Any, str | None]] = []

    def take(block: bool) -> Any:
        return todo.pop(0) if todo else None

    serve_jobs(worker, take, lambda key, result, error: got.append((result, error)))
    return got


def images(n: int, start: int = 0) -> list[bytes]:
    return [b"x" * (start + i + 1) for i in range(n)]


@pytest.fixture
def worker():
    log: list[tuple[str, Any]] = []
    w = DeviceWorker(Engine(), [(SmallRunner(log), None), (BigRunner(log), None)])
    w.log = log  # type: ignore[attr-defined]
    yield w
    w.close()


def test_decode_calls_run_on_the_decode_thread_overlapping_the_job_before(worker):
    assert worker.encoded_batch == DECODE_BATCH and worker.depth == 2
    jobs = [Job("encoded", images(8), [f"a[{i}]" for i in range(8)], 1),
            Job("encoded", images(5, 10), [f"b[{i}]" for i in range(5)], 1),
            Job("encoded", images(1, 20), ["c[0]"], 1),
            Job("encoded", [b"y", b"", b"zz"], ["d[0]", "d[1]", "d[2]"], 1)]
    got = run_jobs(worker, jobs)
    assert [error for _, error in got] == [None] * 4
    assert [[r[0][0] for r in result] for result, _ in got[:3]] == [
        [len(d) for d in job.data] for job in jobs[:3]]
    assert got[3][0][0] == [(1, 1.0)] and got[3][0][2] == [(2, 1.0)]
    assert got[3][0][1] == "d[1]: empty file"  # the memory file's path renamed to the image's
    decodes = [v for k, v in worker.log if k == "decode"]
    assert [call for call, _ in decodes] == [0, 1, 2]  # jobs 0, 1 and 3: more than one batch
    assert all(name.startswith("device-decode") for _, name in decodes)
    main = threading.current_thread().name
    assert {v for k, v in worker.log if k in ("classify", "small")} == {main}


def test_a_failed_decode_fails_its_job_only(worker):
    worker.runners[-1][0].fail_call = 1
    jobs = [Job("encoded", images(3), ["a[0]", "a[1]", "a[2]"], 1),
            Job("encoded", images(4), ["b[0]", "b[1]", "b[2]", "b[3]"], 1),
            Job("encoded", images(6), [f"c[{i}]" for i in range(6)], 1)]
    got = run_jobs(worker, jobs)
    assert got[1] == (None, "the decoder failed (a test's)")
    assert got[0][1] is None and got[2][1] is None and len(got[2][0]) == 6
