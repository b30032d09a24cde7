"""The streaming pipeline (pipeline.py) on the CPU: order, errors in place, thread and process decode workers,
host memory bounded by the ring, laziness; and the uint8 preprocessing it is built on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine import pipeline
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.cuda_runner import slot_runs
from inception_engine.engine import Engine
from inception_engine.errors import EngineError
from inception_engine.ingest import files, workers
from inception_engine.ingest.images import Preprocess, decode_u8, load_image, normalize_u8, preprocess_pil
from inception_engine.ingest.ring import HostRing
from inception_engine.plan import build_plan
from inception_engine.weights import Weights

from helpers.random_weights import random_arrays

SIZE, RESIZE = 75, 86  # small images keep the CPU forwards quick; the pipeline does not care


@pytest.fixture(scope="module")
def weights() -> Weights:
    return Weights(random_arrays(7), {"count_include_pad": True, "input": {"size": SIZE, "resize": RESIZE}})


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(3)
    paths = []
    for i in range(23):
        p = d / f"{i:02d}.jpg"
        h, w = (90 + 3 * i, 120) if i % 2 else (120, 95 + 2 * i)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(p, quality=90)
        paths.append(p)
    return paths


def reference_tops(weights: Weights, paths: list, k: int) -> list[list[int]]:
    """Class indices of the top k, one image at a time through the float64 NumPy backend: no pipeline at all."""
    pre = Preprocess.from_manifest(weights.manifest)
    backend = NumpyBackend(weights, build_plan(1, weights.layers(), input_size=SIZE), dtype=np.float64)
    tops = []
    for p in paths:
        probs = pipeline.softmax(backend.forward(load_image(p, pre)[None].astype(np.float64)))
        tops.append([i for i, _ in pipeline.top_k_rows(probs, k)[0]])
    return tops


def test_uint8_path_is_bit_identical_to_the_float_path():
    rng = np.random.default_rng(0)
    pre = Preprocess()
    for shape in ((300, 400, 3), (512, 343, 3), (299, 299, 3)):
        img = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))
        u8 = decode_u8(img, pre)
        assert u8.shape == (299, 299, 3) and u8.dtype == np.uint8
        x = normalize_u8(u8, pre)
        assert x.shape == (3, 299, 299) and x.dtype == np.float32
        assert np.array_equal(x, preprocess_pil(img, pre))
    batch = rng.integers(0, 256, (2, 5, 5, 3), dtype=np.uint8)
    assert np.array_equal(normalize_u8(batch, pre)[1], normalize_u8(batch[1], pre))


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_order_errors_and_results_match_the_reference(weights, photos, tmp_path, kind):
    bad = tmp_path / "bad.jpg"
    bad.write_text("not a picture")
    sources = [*photos[:5], tmp_path / "missing.png", *photos[5:13], bad, *photos[13:]]
    with Engine(weights, backend="cpu", batch_size=3, workers=2, worker_kind=kind) as engine:
        preds = engine.predict(sources, top_k=3)
    assert [p.image for p in preds] == [str(s) for s in sources]
    assert [p.ok for p in preds] == [s not in (bad, tmp_path / "missing.png") for s in sources]
    assert "no such file" in preds[5].error and "not an image" in preds[14].error
    got = [[i for i, _, _ in p.top] for p in preds if p.ok]
    assert got == reference_tops(weights, photos, 3)


def test_process_workers_decode_in_chunks_held_back_until_flushed(photos, tmp_path):
    """7 images in chunks of 3 (the last one short, an error inside a chunk): each future settles with its own
    image's result, and nothing is sent before a chunk is full or flushed."""
    bad = tmp_path / "bad.jpg"
    bad.write_text("not a picture")
    sources = [*photos[:4], bad, *photos[4:6]]
    pre = Preprocess()
    ring = HostRing(len(sources), pre, shared=True)
    pool = workers.DecodePool(ring, pre, 2, "process", chunk=3)
    try:
        futures = [pool.submit(i, s) for i, s in enumerate(sources)]
        last = futures[-1]
        assert not last.done()  # the 7th image waits in a chunk of one until the flush
        pool.flush()
        errors = [f.result(timeout=60) for f in futures]
        assert [e is None for e in errors] == [s != bad for s in sources] and "not an image" in errors[4]
        for i, s in enumerate(sources):
            if s != bad:
                assert np.array_equal(ring.array[i], decode_u8(s, pre))
    finally:
        pool.close()
        ring.close()


def test_a_killed_decode_process_is_one_line(weights, photos, monkeypatch):
    """A decode process killed mid-run (out of memory, a signal): the run ends with one line, not a traceback."""
    import os
    import signal

    real_flush = workers.DecodePool.flush
    flushes = []

    def flush_then_kill(self):
        real_flush(self)
        flushes.append(1)
        if len(flushes) == 3:  # the pool is running: kill one of its processes
            os.kill(next(iter(self._pool._processes)), signal.SIGKILL)

    monkeypatch.setattr(workers.DecodePool, "flush", flush_then_kill)
    with Engine(weights, backend="cpu", batch_size=2, workers=2, worker_kind="process") as engine:
        with pytest.raises(EngineError, match="a decode worker died"):
            list(engine.predict_iter((photos * 4)[:60], top_k=1))


def test_a_broken_pool_fails_the_chunks_futures_not_the_submit(photos):
    """Once the pool knows a process died, sending a chunk raises; the images' futures carry that instead."""
    import os
    import signal
    import time
    from concurrent.futures import BrokenExecutor

    pre = Preprocess()
    ring = HostRing(4, pre, shared=True)
    pool = workers.DecodePool(ring, pre, 1, "process", chunk=2)
    try:
        first = [pool.submit(0, photos[0]), pool.submit(1, photos[1])]
        assert [f.result(timeout=60) for f in first] == [None, None]
        os.kill(next(iter(pool._pool._processes)), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not pool._pool._broken and time.monotonic() < deadline:
            time.sleep(0.05)
        later = [pool.submit(2, photos[2]), pool.submit(3, photos[3])]  # the second sends the chunk
        for f in later:
            with pytest.raises(BrokenExecutor):
                f.result(timeout=5)
    finally:
        pool.close()
        ring.close()


def test_process_chunks_keep_every_worker_two_tasks_deep():
    assert workers.process_chunk(256, 32) == 4 and workers.process_chunk(256, 16) == 8
    assert workers.process_chunk(256, 2) == 16 and workers.process_chunk(8, 8) == 1


def test_decode_plan_takes_processes_for_long_runs_with_several_workers():
    opts = pipeline.PipelineOptions(workers=4)
    assert pipeline.decode_plan(255, 64, opts) == (255, 4, "thread")
    assert pipeline.decode_plan(256, 64, opts) == (256, 4, "process")
    assert pipeline.decode_plan(10_000, 64, opts) == (256, 4, "process")  # the ring: 4 batches
    assert pipeline.decode_plan(10_000, 64, pipeline.PipelineOptions(workers=1))[2] == "thread"
    assert pipeline.decode_plan(3, 2, pipeline.PipelineOptions(workers=4, worker_kind="process")) == (3, 3, "process")


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_process_run_starts_the_forkserver_before_its_runner(weights, photos, monkeypatch, kind):
    """The decode processes' forkserver is started before the engine builds the run's runner, so that their
    start-ups overlap, with the workers' module preloaded in it (not the command's __main__); a thread run starts
    none."""
    from multiprocessing import forkserver

    from inception_engine import engine as engine_module

    steps: list[str] = []
    real_start, real_runner = engine_module.start_forkserver, Engine.runner

    def start() -> None:
        steps.append("forkserver")
        real_start()

    def runner(self, *args, **kwargs):
        steps.append("runner")
        return real_runner(self, *args, **kwargs)

    monkeypatch.setattr(engine_module, "start_forkserver", start)
    monkeypatch.setattr(Engine, "runner", runner)
    with Engine(weights, backend="cpu", batch_size=3, workers=2, worker_kind=kind) as engine:
        preds = engine.predict(photos[:4], top_k=1)
    assert all(p.ok for p in preds)
    assert steps == (["forkserver", "runner"] if kind == "process" else ["runner"])
    if kind == "process":
        assert forkserver._forkserver._preload_modules == [workers.__name__]
        assert forkserver._forkserver._forkserver_pid is not None


def test_ring_bounds_host_memory_and_results_stream(weights, photos, monkeypatch):
    """60 images through a ring of 4 batches of 2: the first prediction arrives before most images are decoded,
    and the ring never grows with the input."""
    rings: list[int] = []
    real_ring = pipeline.HostRing

    def counting_ring(slots: int, pre: Preprocess, shared: bool):
        rings.append(slots)
        return real_ring(slots, pre, shared)

    decoded: list[str] = []
    real_decode = workers.decode_u8

    def counting_decode(source, pre, out=None):
        decoded.append(str(source))
        return real_decode(source, pre, out)

    monkeypatch.setattr(pipeline, "HostRing", counting_ring)
    monkeypatch.setattr(workers, "decode_u8", counting_decode)
    sources = (photos * 3)[:60]
    with Engine(weights, backend="cpu", batch_size=2, workers=2) as engine:
        stream = engine.predict_iter(sources, top_k=1)
        first = next(stream)
        assert first.ok and len(decoded) <= 8 + 2  # the ring's slots, and at most the workers' next two
        rest = list(stream)
    assert rings == [8] and len(rest) == 59 and len(decoded) == 60
    assert [p.image for p in [first, *rest]] == [str(s) for s in sources]


def test_in_memory_images_and_a_pathological_decoder_error(weights, photos, monkeypatch):
    real_decode = workers.decode_u8

    def flaky(source, pre, out=None):
        if str(source).endswith("04.jpg"):
            raise RuntimeError("decoder exploded\nsecond line")
        return real_decode(source, pre, out)

    monkeypatch.setattr(workers, "decode_u8", flaky)
    pil = Image.open(photos[0]).copy()
    with Engine(weights, backend="cpu", batch_size=2) as engine:
        preds = engine.predict([pil, photos[4], photos[1]], top_k=2)
    assert preds[0].image == "<PIL.Image 0>" and preds[0].ok and preds[2].ok
    assert preds[1].error == f"{photos[4]}: cannot decode (RuntimeError: decoder exploded)"


def test_engine_options_are_checked(weights):
    with pytest.raises(EngineError, match="precision"):
        Engine(weights, backend="cpu", precision="bf16")
    with pytest.raises(EngineError, match="the cpu backend computes in fp32 only"):
        Engine(weights, backend="cpu", precision="fp16")
    with pytest.raises(EngineError, match="worker_kind"):
        Engine(weights, backend="cpu", worker_kind="fiber")
    with pytest.raises(EngineError, match="workers"):
        Engine(weights, backend="cpu", workers=0)
    assert Engine(weights, backend="cpu").precision == "fp32"


def test_slot_runs_split_at_holes_and_wraps():
    assert slot_runs([4, 5, 6, 7]) == [(4, 8, 0)]
    assert slot_runs([6, 7, 0, 1]) == [(6, 8, 0), (0, 2, 2)]  # the ring wraps
    assert slot_runs([1, 2, 4]) == [(1, 3, 0), (4, 5, 2)]  # slot 3's image could not be decoded


def test_the_process_ring_has_no_name_in_dev_shm(photos):
    """The ring process workers share is an anonymous memfd: nothing appears in /dev/shm while it is in use, so
    nothing can be left there, and /dev/shm's size does not limit it."""
    import os

    before = set(os.listdir("/dev/shm"))
    pre = Preprocess()
    ring = HostRing(3, pre, shared=True)
    pool = workers.DecodePool(ring, pre, 1, "process", chunk=1)
    try:
        assert pool.submit(2, photos[0]).result(timeout=60) is None
        assert np.array_equal(ring.array[2], decode_u8(photos[0], pre))
        assert not {n for n in set(os.listdir("/dev/shm")) - before if not n.startswith("sem.")}
    finally:
        pool.close()
        ring.close()


def test_read_file_gives_bytes_or_one_error_line(tmp_path):
    """--decode gpu reads files on the main thread (files.read_file): bytes whole, or inception-run's error."""
    import os

    data = bytes(range(256)) * 1000
    (tmp_path / "a.jpg").write_bytes(data)
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "dir.jpg").mkdir()
    assert files.read_file(tmp_path / "a.jpg") == (data, None)
    assert files.read_file(str(tmp_path / "a.jpg")) == (data, None)
    os.mkfifo(tmp_path / "fifo.jpg")  # never opened for reading: that would wait for a writer forever
    for name, says in [("missing.jpg", "no such file"), ("dir.jpg", "is a directory, not an image file"),
                       ("empty.jpg", "empty file"), ("fifo.jpg", "is a FIFO (named pipe), not an image file")]:
        got, error = files.read_file(tmp_path / name)
        assert got is None and error == f"{tmp_path / name}: {says}"


class EchoRunner:
    """An EncodedRunner that 'classifies' each file as (its length, 1.0): the stream's order and errors show."""

    batch, depth = 2, 2
    outstanding = 0  # tickets not yet collected: a real runner's result buffers hold ``depth`` of them

    def submit_encoded(self, items: list[tuple[str, bytes]], top_k: int) -> list:
        self.start_ticket()
        return [[(len(data), 1.0)] for _, data in items]

    def start_ticket(self) -> None:
        assert self.outstanding < self.depth, "a batch submitted over the result buffers of one not yet collected"
        self.outstanding += 1

    def result(self, ticket: list) -> list:
        self.outstanding -= 1
        return ticket

    def close(self) -> None:
        pass


@dataclass
class EchoPart:
    """One batch of a TwoStepRunner's decode: its 'top-k's, and the buffer it frees (its decode's last part)."""

    frees: int | None
    tops: list

    @property
    def images(self) -> int:
        return len(self.tops)


class TwoStepRunner(EchoRunner):
    """EchoRunner in the cuda runner's two steps: ``decode`` on ``decode_chains`` decode threads (``buffers`` of
    them, taken in call order as the cuda runner takes them), ``classify`` on the consuming one; records which
    thread did what, and which calls each decode thread took."""

    def __init__(self, buffers: int = 3, fail_at: int | None = None, decode_batch: int = 2, chains: int = 1):
        import threading

        from inception_engine.cuda_runner import BufferTurns

        self.turns = BufferTurns(buffers)
        self.decode_chains = chains
        self.fail_at, self.decoded, self.threads = fail_at, 0, {"decode": set(), "classify": set()}
        self.calls: dict[threading.Thread, list[int]] = {}  # decode thread -> the calls it decoded, in its order
        self.decode_batch = decode_batch  # files a decode call takes: several batches
        self.main = threading.get_ident()
        self.closed = False

    def decode(self, paths: list[str], call: int) -> tuple[int, list]:
        """Reads the files itself, as the cuda runner does: an unreadable one's result is its error."""
        import threading

        self.threads["decode"].add(threading.current_thread())  # the object: a finished thread's ident is reused
        self.calls.setdefault(threading.current_thread(), []).append(call)
        if call == self.fail_at:
            raise RuntimeError("decoder exploded")
        buffer = self.turns.take(call)
        if buffer is None:
            raise pipeline_cancelled()
        self.decoded += 1
        return buffer, [error or [(len(data), 1.0)] for data, error in map(files.read_file, paths)]

    def split(self, batch: tuple[int, list]) -> list[EchoPart]:
        """The decoded batch as parts of ``self.batch`` images; the last frees the buffer."""
        buffer, tops = batch
        return [EchoPart(buffer if a + self.batch >= len(tops) else None, tops[a:a + self.batch])
                for a in range(0, len(tops), self.batch)]

    def classify(self, part: EchoPart, top_k: int) -> list:
        import threading

        self.threads["classify"].add(threading.get_ident())
        self.start_ticket()
        if part.frees is not None:
            self.turns.give(part.frees)
        return part.tops

    def cancel_decode(self) -> None:
        self.turns.cancel()

    def close(self) -> None:
        self.closed = True


def pipeline_cancelled() -> Exception:
    from inception_engine.cuda_runner import DecodeCancelled

    return DecodeCancelled()


def jpeg_names(tmp_path, n: int) -> list:
    paths = []
    for i in range(n):
        (tmp_path / f"{i:03d}.jpg").write_bytes(b"x" * (i + 1))
        paths.append(tmp_path / f"{i:03d}.jpg")
    return paths


@pytest.mark.parametrize("decode_batch, chains, buffers", [(2, 1, 1), (5, 1, 1), (2, 2, 4), (5, 3, 5)])
def test_decoding_threads_keep_order_and_errors_and_classify_on_the_callers_thread(tmp_path, decode_batch, chains,
                                                                                   buffers):
    """A decode of one batch, of several and a part (5 = 2 + 2 + 1); one decode thread with one buffer (the decoder
    waits for every classify), or several threads each taking every chains-th call."""
    import threading

    paths = jpeg_names(tmp_path, 21)
    paths.insert(4, tmp_path / "missing.jpg")
    runner = TwoStepRunner(buffers=buffers, decode_batch=decode_batch, chains=chains)
    preds = list(pipeline.classify_encoded(paths, runner, 1))
    assert [p.image for p in preds] == [str(p) for p in paths]
    assert [p.top[0][0] if p.ok else None for p in preds] == [
        int(p.name[:3]) + 1 if p.name != "missing.jpg" else None for p in paths]
    assert runner.threads["classify"] == {threading.get_ident()}
    assert len(runner.threads["decode"]) == chains and threading.current_thread() not in runner.threads["decode"]
    calls = -(-len(paths) // decode_batch)
    assert sorted(tuple(c) for c in runner.calls.values()) == [tuple(range(j, calls, chains)) for j in range(chains)]
    assert runner.closed and not any(t.name == "gpu-decode" for t in threading.enumerate())


@pytest.mark.parametrize("chains", [1, 2])
def test_decoding_thread_error_reaches_the_caller_and_an_early_stop_ends_the_thread(tmp_path, chains):
    import threading

    runner = TwoStepRunner(fail_at=2, chains=chains, buffers=chains + 2)
    with pytest.raises(RuntimeError, match="decoder exploded"):
        list(pipeline.classify_encoded(jpeg_names(tmp_path, 9), runner, 1))
    assert runner.closed and not any(t.name == "gpu-decode" for t in threading.enumerate())
    runner = TwoStepRunner(buffers=chains, chains=chains)
    stream = pipeline.classify_encoded(jpeg_names(tmp_path, 9), runner, 1)
    next(stream)  # the decoders now wait for buffers that this consumer will never free
    stream.close()
    assert runner.closed and not any(t.name == "gpu-decode" for t in threading.enumerate())


def test_buffer_turns_are_taken_in_call_order():
    """Call c takes buffer c % n only after call c - n gave it back, whichever thread asks first; cancel wakes
    every waiter."""
    import threading

    from inception_engine.cuda_runner import BufferTurns

    turns = BufferTurns(2)
    assert turns.take(0) == 0 and turns.take(1) == 1
    got: dict[int, int | None] = {}
    late = threading.Thread(target=lambda: got.update({4: turns.take(4)}))  # buffer 0 after call 2, not before
    late.start()
    early = threading.Thread(target=lambda: got.update({2: turns.take(2)}))
    early.start()
    turns.give(0)  # call 0's buffer: call 2 takes it, call 4 keeps waiting
    early.join(5)
    assert got == {2: 0} and late.is_alive()
    turns.give(0)  # call 2's
    late.join(5)
    assert got == {2: 0, 4: 0}
    waiting = threading.Thread(target=lambda: got.update({3: turns.take(3)}))  # call 1 still holds buffer 1
    waiting.start()
    turns.cancel()
    waiting.join(5)
    assert got[3] is None and not waiting.is_alive()


def test_a_call_number_taken_twice_is_refused_not_waited_for():
    """Two numberings of one runner's decode calls (serve/devices.py once sent small jobs to submit_encoded while its
    decode chains numbered theirs): the second take of a number, held or given back, raises at once."""
    from inception_engine.cuda_runner import BufferTurns

    turns = BufferTurns(2)
    assert turns.take(0) == 0
    with pytest.raises(RuntimeError, match="decode call 0 was numbered twice"):
        turns.take(0)  # still held
    turns.give(0)
    with pytest.raises(RuntimeError, match="decode call 0 was numbered twice"):
        turns.take(0)  # given back: buffer 0 is call 2's now
    assert turns.take(1) == 1 and turns.take(2) == 0


def test_encoded_stream_reads_in_order_with_errors_in_place(tmp_path):
    """classify_encoded (--decode gpu) reads each batch on this thread: every file's bytes reach the runner, the
    unreadable ones get their error in their place, a partial last batch included."""
    sizes = {"a.jpg": 10, "b.jpg": 300, "c.jpg": 7, "d.jpg": 999}  # lengths stand for class indices
    for name, n in sizes.items():
        (tmp_path / name).write_bytes(b"x" * n)
    (tmp_path / "empty.jpg").write_bytes(b"")
    paths = [tmp_path / n for n in ["a.jpg", "missing.jpg", "b.jpg", "empty.jpg", "c.jpg", "d.jpg", "a.jpg"]]
    preds = list(pipeline.classify_encoded(paths, EchoRunner(), 1))
    assert [p.image for p in preds] == [str(p) for p in paths]
    want = [sizes[p.name] if p.name in sizes else None for p in paths]
    assert [p.top[0][0] if p.ok else None for p in preds] == want
    assert preds[1].error == f"{paths[1]}: no such file" and preds[3].error == f"{paths[3]}: empty file"
