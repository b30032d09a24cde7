"""serve/devices.py without a GPU: the decode chains' order, their memory files and their limit on calls classified
ahead (DecodeChains, with a runner of the cuda runner's decode / split / classify steps), and which jobs a device
takes at once (DeviceWorker.room)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from inception_engine.cuda_runner import BufferTurns, DecodeCancelled
from inception_engine.serve.devices import CLASSIFIED_AHEAD, DecodeChains, DeviceWorker, Job


class ChainRunner:
    """The cuda runner's decode-call steps: ``decode`` reads the memory files it is given (their bytes are the
    results), taking the call's buffer in call order; ``classify`` records the call it enqueued and on which thread;
    batches of ``batch`` images."""

    def __init__(self, chains: int, batch: int = 2, fail_at: int | None = None, slow: float = 0.0):
        self.batch, self.decode_chains, self.fail_at, self.slow = batch, chains, fail_at, slow
        self.turns = BufferTurns(chains + 2)
        self.classified: list[int] = []  # calls, in the order their batches were enqueued
        self.threads: set[str] = set()
        self.ahead: list[int] = []  # calls classified and not collected, at each classify
        self.collected = 0
        self.lock = threading.Lock()

    def decode(self, paths: list[str], call: int) -> tuple[int, int, list[bytes]]:
        time.sleep(self.slow * (call % 3))  # calls finish out of order across the chains
        if call == self.fail_at:
            raise RuntimeError("decoder exploded")
        buffer = self.turns.take(call)
        if buffer is None:
            raise DecodeCancelled()
        data = []
        for p in paths:
            with open(p, "rb") as f:
                data.append(f.read())
        return call, buffer, data

    def split(self, decoded: tuple[int, int, list[bytes]]) -> list[tuple[int, int | None, list[bytes]]]:
        call, buffer, data = decoded
        starts = range(0, len(data), self.batch)
        return [(call, buffer if a == starts[-1] else None, data[a:a + self.batch]) for a in starts]

    def classify(self, part: tuple[int, int | None, list[bytes]], top_k: int) -> list[bytes]:
        call, frees, data = part
        with self.lock:
            if not self.classified or self.classified[-1] != call:
                self.classified.append(call)
                self.ahead.append(len(self.classified) - self.collected)
            self.threads.add(threading.current_thread().name)
        if frees is not None:
            self.turns.give(frees)
        return data

    def cancel_decode(self) -> None:
        self.turns.cancel()


def images(call: int, n: int = 5) -> list[bytes]:
    return [f"call {call} image {i} ".encode() * (call + i + 1) for i in range(n)]


@pytest.mark.parametrize("chains", [1, 2, 3])
def test_calls_come_back_in_order_each_with_its_own_images(chains):
    """Calls of 5 images (3 batches of 2) on each chain's thread: every call's results are its own images (a chain's
    memory files are rewritten only once its previous call has read them), classified in call order on the chains'
    threads, never more than CLASSIFIED_AHEAD calls ahead of the results collected."""
    runner = ChainRunner(chains, slow=0.005)
    gpu = threading.Lock()
    dc = DecodeChains(runner, chains, gpu)
    calls = 9
    futures = [dc.submit(images(c), [f"images[{i}]" for i in range(5)], 1) for c in range(calls)]
    for c, fut in enumerate(futures):
        tickets, names = fut.result(timeout=30)
        assert [image for batch in tickets for image in batch] == images(c)
        assert sorted(names.values()) == [f"images[{i}]" for i in range(5)]
        time.sleep(0.04)  # a slow collector: the chains wait for it rather than run ahead
        runner.collected += 1
        dc.collected()
    dc.close()
    assert runner.classified == list(range(calls))
    assert runner.threads <= {f"decode-chain{j}_0" for j in range(chains)} and len(runner.threads) == chains
    assert max(runner.ahead) == CLASSIFIED_AHEAD  # the collector is the slow one: the limit is what holds them


def test_a_call_that_fails_passes_its_turn_on():
    """A decode that raises fails its own call only: the later calls are classified and come back."""
    runner = ChainRunner(2, fail_at=2)
    dc = DecodeChains(runner, 2, threading.Lock())
    futures = [dc.submit(images(c, 3), ["x"] * 3, 1) for c in range(6)]
    for c, fut in enumerate(futures):
        if c == 2:
            with pytest.raises(RuntimeError, match="decoder exploded"):
                fut.result(timeout=30)
        else:
            tickets, _ = fut.result(timeout=30)
            assert [image for batch in tickets for image in batch] == images(c, 3)
        dc.collected()
    dc.close()
    assert runner.classified == [0, 1, 3, 4, 5]


def test_close_wakes_a_call_waiting_for_its_buffer():
    """Calls submitted but never collected: close cancels the decodes waiting for a buffer and ends the threads."""
    runner = ChainRunner(2)
    dc = DecodeChains(runner, 2, threading.Lock())
    futures = [dc.submit(images(c, 3), ["x"] * 3, 1) for c in range(8)]
    futures[0].result(timeout=30)
    dc.close()
    assert all(f.done() for f in futures)
    assert not any(t.name.startswith("decode-chain") for t in threading.enumerate())


def test_room_per_runner_and_for_decode_calls():
    """Two jobs a runner at once; the largest runner's encoded jobs (on its decode chains) as many as the device's
    depth, beside them."""
    worker = DeviceWorker.__new__(DeviceWorker)
    worker.runners = [(SimpleNamespace(batch=b), None) for b in (1, 8, 128)]
    worker.chains = object()
    worker.runner_depth, worker.depth = 2, 4

    def job(n: int, kind: str = "encoded") -> Job:
        return Job(kind, [b"x"] * n, ["x"] * n)

    big, one, eight = job(256), job(1), job(8)
    assert worker.room(one, [one]) and not worker.room(one, [one, one])
    assert worker.room(one, [eight, eight, big, big])  # another runner's jobs do not count
    assert worker.room(big, [big, big, big]) and not worker.room(big, [big, big, big, big])
    assert not worker.room(job(100), [job(128), job(9), big, big]) and worker.room(job(9), [job(128), job(3), big])
    assert not worker.room(job(100, "pixels"), [job(128, "pixels")] * 2)  # host-decoded: no chains
    worker.chains = None  # no decode chains (the CPU backend, host decoding): 256 images go to the largest runner
    assert not worker.room(big, [job(128), job(128)]) and worker.room(big, [job(128), job(8)])


class EncodedRunner(ChainRunner):
    """ChainRunner with the rest of the cuda runner's encoded path: ``submit_encoded`` decodes a batch in a call of
    its own numbering, through the same buffers (as CudaRunner's does), ``result`` reads a ticket."""

    def __init__(self, batch: int, decode_batch: int, chains: int):
        super().__init__(chains, batch)
        self.decode_batch, self.depth, self.decode_fallback = decode_batch, 2 * decode_batch // batch, None
        self.serial_calls = 0

    def submit_encoded(self, items: list[tuple[str, bytes]], top_k: int) -> list[bytes]:
        call, self.serial_calls = self.serial_calls, self.serial_calls + 1
        buffer = self.turns.take(call)
        if buffer is None:
            raise DecodeCancelled()
        self.turns.give(buffer)
        return [data for _, data in items]

    def result(self, ticket: list[bytes]) -> list[bytes]:
        return ticket

    def close(self) -> None:
        pass


def test_a_device_serves_jobs_of_every_size_on_its_runners_and_chains():
    """A device of a 1-image runner and a 4-image one with two decode chains (calls of 8): jobs of 1 to 8 images,
    every one of the largest runner's through the chains (its submit_encoded and its decode calls numbered apart
    would wait on the same buffers for ever), each job's answers its own images, in order."""
    from inception_engine.serve.devices import STOP, MemoryFiles, serve_jobs

    small, big = EncodedRunner(1, 1, 1), EncodedRunner(4, 8, 2)
    worker = DeviceWorker.__new__(DeviceWorker)
    worker.runners = [(small, None), (big, None)]
    worker.files, worker.gpu = MemoryFiles(), threading.Lock()
    worker.chains = DecodeChains(big, 2, worker.gpu)
    worker.runner_depth, worker.depth = 2, 4
    sizes = [1, 3, 6, 2, 8, 4, 1, 1, 5, 7, 3, 1, 8, 2]
    jobs = [Job("encoded", images(k, n), [f"images[{i}]" for i in range(n)], 1) for k, n in enumerate(sizes)]
    todo = [(k, job) for k, job in enumerate(jobs)] + [STOP]
    answers: dict[int, list] = {}

    def take(block: bool):
        return todo.pop(0) if todo else None

    def give(key, result, error):
        answers[key] = result if error is None else error

    thread = threading.Thread(target=serve_jobs, args=(worker, take, give), daemon=True)
    thread.start()
    thread.join(timeout=30)
    stuck = thread.is_alive()
    worker.chains.close()
    worker.files.close()
    assert not stuck, f"the device's loop did not end ({len(answers)} of {len(jobs)} jobs answered)"
    assert [answers[k] for k in range(len(jobs))] == [job.data for job in jobs]
    assert small.serial_calls == sizes.count(1) and big.serial_calls == 0
    assert big.classified == list(range(len(sizes) - sizes.count(1)))
