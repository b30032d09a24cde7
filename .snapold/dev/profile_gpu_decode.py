"""Where --decode gpu spends its time: the host's header check, nvImageCodec's decode per backend, the resize.

    python dev/profile_gpu_decode.py DIR [--images 1024] [--batch 128]
    python dev/profile_gpu_decode.py --cprofile DIR [--images 4096] [--batch 128]
    python dev/profile_gpu_decode.py --variants DIR      # the runner's loop variant by variant, by phase
    python dev/profile_gpu_decode.py --contention DIR    # the decoder beside the forward: SMs left free, serial
    python dev/profile_gpu_decode.py --segments --batch 64 DIR   # predict_iter's rate every 2,048 images


Each stage is timed alone on the same files (already in memory; jpeg_batch.c, the default path where it builds,
reads them itself, from the page cache), synchronised, as images/s: the slowest stage is the pipeline's ceiling.
nvImageCodec's backends: its default choice, the H100's hardware JPEG engines (HW_GPU_ONLY), CUDA (GPU_ONLY) and CPU
Huffman + GPU IDCT (HYBRID_CPU_GPU); a backend this GPU or build lacks reads "unavailable".

--cprofile instead runs the whole `--decode gpu` pipeline (Engine.predict_iter, tf32, synthetic weights) under
cProfile and prints its rate and the main thread's 30 costliest functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inception_engine.ingest import jpeg_decode, jpeg_header  # noqa: E402
from inception_engine.backends.cuda.device import Gpu, driver  # noqa: E402
from inception_engine.backends.cuda.kernels import Kernels  # noqa: E402
from inception_engine.ingest.images import Preprocess, decode_u8  # noqa: E402


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:8.0f} images/s"


def profile_pipeline(paths: list[Path], batch: int) -> None:
    from inception_engine.engine import Engine
    from inception_engine.synthetic import synthetic_weights

    weights = synthetic_weights(0)  # Engine takes Weights as they are: no file needed
    files = [str(p) for p in paths]
    with Engine(weights, backend="cuda", batch_size=batch, precision="tf32", decode="gpu") as engine:
        sum(1 for _ in engine.predict_iter(files[:2 * batch]))  # untimed: kernels, graph, decoder
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        n = sum(1 for p in engine.predict_iter(files) if p.ok)
        prof.disable()
        print(f"--decode gpu pipeline under cProfile, tf32, batch {batch}: {rate(n, time.perf_counter() - t0)}")
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


class Phases:
    """Wall time per wrapped method (on any thread), summed."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._wrapped: list[tuple[object, str]] = []

    def wrap(self, obj: object, name: str, label: str | None = None) -> None:
        fn = getattr(obj, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                key = label or name
                self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0

        setattr(obj, name, timed)
        self._wrapped.append((obj, name))

    def unwrap(self) -> None:
        """Drop the instance attributes wrap set: the class's methods show through again."""
        for obj, name in reversed(self._wrapped):
            delattr(obj, name)
        self._wrapped = []


def in_memory_batches(paths: list[Path], batch: int) -> list[list[tuple[str, bytes]]]:
    """The files read into memory, as whole batches of (path, bytes) (a short last batch dropped)."""
    items = [(str(p), p.read_bytes()) for p in paths]
    return [items[i:i + batch] for i in range(0, len(items) - batch + 1, batch)]


def drive(runner: Any, batches: list, before_submit: Callable[[], object] | None = None) -> float:
    """Seconds for the runner to classify the batches, ``runner.depth`` of them in flight, as the pipeline keeps
    them; ``before_submit()`` runs before each submit."""
    tickets: list = []
    t0 = time.perf_counter()
    for b in batches:
        if len(tickets) == runner.depth:
            runner.result(tickets.pop(0))
        if before_submit is not None:
            before_submit()
        tickets.append(runner.submit_encoded(b, 5))
    for t in tickets:
        runner.result(t)
    return time.perf_counter() - t0


def profile_variants(paths: list[Path], batch: int) -> None:
    """The runner's submit_encoded/result loop on files already in memory, variant by variant, with the wall time
    of its phases: what makes the pipeline slower than decode_into alone."""
    import threading

    from inception_engine.engine import Engine
    from inception_engine.synthetic import synthetic_weights

    batches = in_memory_batches(paths, batch)
    n = len(batches) * batch
    pre = Preprocess()
    weights = synthetic_weights(0)  # Engine takes Weights as they are: no file needed
    engine = Engine(weights, backend="cuda", batch_size=batch, precision="tf32", decode="gpu")

    def loop(label: str, no_forward: bool = False, spin: bool = False) -> None:
        runner = engine.runner(n)
        runner.submit_encoded(batches[0], 5)  # makes the decoder
        runner.backend.stream.synchronize()
        dec = runner._decoders[0]
        ph = Phases()
        # jpeg_batch.c's decoder reads and decodes in decode_files and resizes by enqueue_arrays; the Python API's
        # decodes in _decode and resizes by enqueue
        ph.wrap(dec, "decode_files" if dec.reads_files else "_decode")
        ph.wrap(dec, "wait", "wait previous batch")
        ph.wrap(dec._resize, "enqueue_arrays" if dec.reads_files else "enqueue", "resize enqueue")
        ph.wrap(runner, "_classify", "normalize+forward+topk launch")
        ph.wrap(runner, "result", "result (waits)")
        if no_forward:
            runner.backend.replay = lambda: None
        spins = [0]
        stop = threading.Event()

        def spinner() -> None:
            while not stop.is_set():
                spins[0] += 1

        th = threading.Thread(target=spinner) if spin else None
        if th:
            th.start()
        dt = drive(runner, batches)
        stop.set()
        if th:
            th.join()
        if no_forward:
            del runner.backend.replay  # the instance's stand-in; the engine keeps this backend
        runner.close()
        ph.unwrap()  # the backend keeps the decoder for the next loop
        parts = ", ".join(f"{k} {1e3 * v / len(batches):.1f}" for k, v in ph.seconds.items())
        extra = f", spinner {spins[0] / dt / 1e6:.2f} M/s" if spin else ""
        print(f"{label:34} {rate(n, dt)}  ms per batch: {parts}{extra}")

    def files(label: str) -> None:
        """Engine.predict_iter on the same files, as inception-run runs it (this thread reads them)."""
        t0 = time.perf_counter()
        k = sum(1 for p in engine.predict_iter([path for b in batches for path, _ in b]) if p.ok)
        print(f"{label:34} {rate(k, time.perf_counter() - t0)}")

    with engine:
        t0 = time.perf_counter()
        backend = engine.backend_for(batch, "cached")
        with backend.gpu:
            backend.jpeg_decoders(pre)[0]
        print(f"{'decoder start-up (once a backend)':34} {1e3 * (time.perf_counter() - t0):8.0f} ms")
        loop("warm-up")
        loop("pipeline (files in memory)")
        loop("pipeline, no forward", no_forward=True)
        loop("pipeline, python thread spinning", spin=True)
        files("predict_iter on files")
        files("predict_iter on files (again)")
        hardware_engines(engine, backend, pre, batches, loop)


def hardware_engines(engine, backend, pre: Preprocess, batches: list, loop) -> None:
    """The loop again with nvImageCodec held to the hardware JPEG engines (HW_GPU_ONLY), whose decode leaves the
    SMs to the forward, and how far its crops are from Pillow's next to the default backend's (nvImageCodec's
    default may not take the engines, and the engines may not do libjpeg's smooth chroma upsampling)."""
    import numpy as np

    drv = driver()
    with backend.gpu:
        default = backend.jpeg_decoders(pre)[0]
        try:
            hw = jpeg_decode.GpuJpegDecoder(backend.kernels, pre, backend.plan.batch, backends=("HW_GPU_ONLY",))
        except Exception as e:
            print(f"HW_GPU_ONLY unavailable ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
            return
        first = batches[0]
        cpu = np.stack([decode_u8(path, pre) for path, _ in first]).astype(np.int16)
        dst = drv.mem_alloc(len(first) * pre.size * pre.size * 3)
        stream = drv.Stream(1)
        for name, dec in (("default", default), ("HW_GPU_ONLY", hw)):
            errors = dec.decode_files([path for path, _ in first], int(dst), stream, lambda p, d: decode_u8(p, pre))
            stream.synchronize()
            got = np.empty(cpu.shape, np.uint8)
            drv.memcpy_dtoh(got, dst)
            dec.release()  # its images were decoded on this stream: freed before the stream goes
            diff = np.abs(got.astype(np.int16) - cpu)[[e is None for e in errors]]
            print(f"crops of {name:12} against Pillow: max |diff| {diff.max()}, mean {diff.mean():.4f}, "
                  f"bytes differing {100 * (diff > 0).mean():.2f} %")
        dst.free()
        backend._jpeg_decoders = [hw]
    try:
        loop("pipeline, HW_GPU_ONLY (in memory)")
    finally:
        with backend.gpu:
            hw.close()
            backend._jpeg_decoders = [default]


def profile_contention(paths: list[Path], batch: int) -> None:
    """The decoder beside the forward: the runner's loop on files in memory with the persistent tiles leaving SMs
    free (CudaBackend's sm_margin), and with each decode waiting until the forward before it is done ("serial"),
    per precision; and the forward alone at each margin. The decode call takes ~12.5 ms a batch of 128 beside the
    tf32 forward and ~7.5 without it."""
    from inception_engine.backends.cuda.backend import CudaBackend
    from inception_engine.cuda_runner import CudaRunner
    from inception_engine.plan import build_plan
    from inception_engine.synthetic import synthetic_weights

    import numpy as np

    batches = in_memory_batches(paths, batch)
    n = len(batches) * batch
    pre = Preprocess()
    weights = synthetic_weights(0)
    plan = build_plan(batch, weights.layers())
    x = np.random.default_rng(0).standard_normal(plan.input.dims).astype(np.float32)

    def run(runner: CudaRunner, serial: bool) -> tuple[float, float]:
        ph = Phases()
        ph.wrap(runner, "submit_encoded")
        seconds = drive(runner, batches, runner.backend.stream.synchronize if serial else None)
        ph.unwrap()
        return n / seconds, 1e3 * ph.seconds["submit_encoded"] / len(batches)

    for precision in ("tf32", "fp16"):
        for margin in (0, 16, 33):
            with CudaBackend(weights, plan, precision=precision, tune=True if margin == 0 else "cached",
                             sm_margin=margin) as backend:
                fwd = statistics.median(backend.time_forward(x, 20, 3))
                for serial in (False, True) if margin == 0 else (False,):
                    runner = CudaRunner(backend, pre)
                    for b in batches[:2]:  # warm-up: the decoder, the graph
                        runner.result(runner.submit_encoded(b, 5))
                    rate_, submit_ms = run(runner, serial)
                    runner.close()
                    label = f"{precision} sm_margin {margin:2d}{', serial' if serial else ''}"
                    print(f"contention {label:26} {rate_:7.0f} images/s, submit_encoded {submit_ms:5.1f} ms a batch, "
                          f"forward alone {fwd:5.2f} ms")


def profile_segments(paths: list[Path], batch: int, every: int = 2048) -> None:
    """Engine.predict_iter with --decode gpu on the files, the rate of every ``every`` images: per precision, one
    engine running 4,096 then all the files, twice (a slow stretch inside a run, or at a run's start, shows here
    where a run's mean hides it; this found change 15 of dev/performance-log.md's end-to-end pipeline)."""
    from inception_engine.engine import Engine
    from inception_engine.synthetic import synthetic_weights

    files = [str(p) for p in paths]
    weights = synthetic_weights(0)
    for precision in ("tf32", "fp16"):
        with Engine(weights, backend="cuda", batch_size=batch, precision=precision, decode="gpu") as engine:
            engine.backend_for(batch, tune=True)
            list(engine.predict_iter(files[:2 * batch]))  # warm-up: kernels, graph, decoder
            for rep in range(2):
                for n in (min(4096, len(files)), len(files)):
                    t0 = time.perf_counter()
                    marks = [t0]
                    for i, _ in enumerate(engine.predict_iter(files[:n]), 1):
                        if i % every == 0 or i == n:
                            marks.append(time.perf_counter())
                    rates = " ".join(f"{min(every, n - every * j) / (b - a):.0f}"
                                     for j, (a, b) in enumerate(zip(marks, marks[1:])))
                    print(f"segments {precision} run {rep} {n:6d} images: {rate(n, marks[-1] - t0)}; per {every}: "
                          f"{rates}", flush=True)


def decode_files_rate(dec: Any, batches: list, dst: int, stream: Any, cpu: Callable) -> str:
    """decode_files' rate on the batches' files (one batch untimed first), errors counted."""
    names = [[path for path, _ in batch] for batch in batches]
    dec.decode_files(names[0], dst, stream, cpu)
    stream.synchronize()
    t0, errors = time.perf_counter(), 0
    for batch in names:
        errors += sum(e is not None for e in dec.decode_files(batch, dst, stream, cpu))
    stream.synchronize()
    return f"{rate(sum(map(len, names)), time.perf_counter() - t0)}, {errors} errors"


def python_api_rates(dec: Any, batches: list, dst: int, stream: Any, cpu: Callable) -> str:
    """nvImageCodec's batched decode alone, then decode_into (header, decode, resize), on bytes in memory."""
    n = sum(map(len, batches))
    dec._decode([b for _, b in batches[0]], stream)  # warm-up
    stream.synchronize()
    t0 = time.perf_counter()
    for batch in batches:
        dec._decode([b for _, b in batch], stream)
    stream.synchronize()
    t_decode = time.perf_counter() - t0
    t0, errors = time.perf_counter(), 0
    for batch in batches:
        errors += sum(e is not None for e in dec.decode_into(batch, dst, stream, cpu))
    stream.synchronize()
    return (f"decode {rate(n, t_decode)}, decode_into (header, decode, resize) {rate(n, time.perf_counter() - t0)}, "
            f"{errors} errors")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--images", type=int, help="default: 1,024; with --cprofile every file")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--cprofile", action="store_true", help="profile the whole pipeline instead of its stages")
    ap.add_argument("--variants", action="store_true", help="the runner's loop, variant by variant, timed by phase")
    ap.add_argument("--contention", action="store_true", help="the loop with SMs left free for the decoder, or "
                    "the decode waiting for the forward")
    ap.add_argument("--segments", action="store_true", help="predict_iter on the files, the rate of every 2,048")
    args = ap.parse_args()
    paths = sorted(p for p in Path(args.dir).iterdir() if p.suffix.lower() in (".jpg", ".jpeg"))
    if args.cprofile:
        profile_pipeline(paths[:args.images], args.batch)
        return
    if args.segments:
        profile_segments(paths[:args.images] if args.images else paths, args.batch)
        return
    if args.contention:
        profile_contention(paths[:args.images or 2048], args.batch)
        return
    if args.variants:
        profile_variants(paths[:args.images or 2048], args.batch)
        return
    paths = paths[:args.images or 1024]
    items = [(str(p), p.read_bytes()) for p in paths]
    batches = [items[i:i + args.batch] for i in range(0, len(items), args.batch)]
    pre = Preprocess()
    t0 = time.perf_counter()
    for path, data in items:
        jpeg_header.gpu_eligible(path, data)
    print(f"header check (one thread)           {rate(len(items), time.perf_counter() - t0)}")
    gpu = Gpu()
    with gpu:
        drv = driver()
        kernels = Kernels(gpu.arch)
        stream = drv.Stream(1)
        dst = drv.mem_alloc(args.batch * pre.size * pre.size * 3)
        cpu = lambda p, d: decode_u8(p, pre)  # noqa: E731
        for backends in (None, ("HW_GPU_ONLY",), ("GPU_ONLY",), ("HYBRID_CPU_GPU",)):
            name = "default" if backends is None else backends[0]
            try:
                dec = jpeg_decode.GpuJpegDecoder(kernels, pre, args.batch, backends=backends)
                if dec.reads_files:  # the default path, jpeg_batch.c: it reads the files, no decode of bytes alone
                    line = (f"jpeg_batch.c {name:15} decode_files (read, header, decode, resize) "
                            f"{decode_files_rate(dec, batches, int(dst), stream, cpu)}")
                else:
                    line = f"nvImageCodec {name:15} " + python_api_rates(dec, batches, int(dst), stream, cpu)
                dec.close()
                print(line)
            except Exception as e:  # a backend this GPU or build does not have
                print(f"nvImageCodec {name:15} unavailable ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
        dst.free()
    gpu.release()


if __name__ == "__main__":
    main()
