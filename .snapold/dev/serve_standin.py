"""inception-serve's own cost, without a GPU: the real server (app, batcher, protocol, devices.ThreadDevice and
DeviceWorker.submit/result, the memory-file hand-off included) on a stand-in engine that answers at once (or after a
fixed time a batch, ``--batch-ms``, as a GPU would: the device thread waiting without the GIL), driven by
dev/bench_serve.py's load (tritonclient's asyncio client, binary BYTES requests of small JPEGs, several processes).

    python dev/serve_standin.py [--sizes 64,1] [--concurrency 32] [--seconds 6] [--client-procs 2] [--profile]
                                [--batch-ms 0] [--host-us 0] [--process] [--http-workers 1,4] [--rounds 1]

Per row: the server's images/s, and its CPU time per image (utime + stime of its processes over the row, from
/proc/PID/stat, front-ends and device processes included): the figure that a machine shared with other work changes
least. ``--http-workers 1,4``: a server of each (inception-serve --http-workers), all started at once, their rows
interleaved ``--rounds`` times, then per row the median images/s of each and its ratio to the first's.
``--profile``: py-spy samples the
server during each row (``record --format raw``), its hottest frames printed (bench_serve.top_frames).

Only this module swaps the engine (devices.DeviceWorker, in the server's own process: ``--serve PORT``); the product
has no such option. ``python dev/serve_standin.py --device-process ARGS``: inception-serve ARGS on the real engine,
its one device in a worker process (bench_serve.py --device-process, an A/B on the GPU).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "dev")]

SIZE = 299


class StandInRunner:
    """The cuda runner's encoded path's interface (submit_encoded, result), answering each image with the same top-k;
    ``batch_ms``: the time a batch takes, waited as the device thread waits for the GPU (GIL released);
    ``host_us``: the runner's own Python a image (decode calls, uploads, top-k), spun holding the GIL."""

    decode_fallback = None  # the jpeg_batch.c path: DeviceWorker hands it memory files

    def __init__(self, batch: int, batch_ms: float, host_us: float):
        self.batch, self.batch_ms, self.host_us = batch, batch_ms, host_us

    def submit_encoded(self, items: list[tuple[str, bytes]], top_k: int) -> tuple[int, int, float]:
        if self.host_us:
            busy = time.thread_time() + self.host_us * len(items) / 1e6
            while time.thread_time() < busy:
                pass
        return len(items), top_k, time.perf_counter() + self.batch_ms / 1000

    def result(self, ticket: tuple[int, int, float]) -> list[Any]:
        n, top_k, done = ticket
        if done > time.perf_counter():  # a GPU's time: waited without the GIL
            time.sleep(done - time.perf_counter())
        top = [(281 + j, 0.5 / (j + 1)) for j in range(top_k)]
        return [list(top) for _ in range(n)]  # a list per image, as the runner's top-k rows are

    def close(self) -> None:
        pass


def patch_devices(batch_ms: float, host_us: float) -> None:
    """devices.DeviceWorker made one whose runners are StandInRunners (sizes as a GPU device's: 1, 8, the batch)."""
    from inception_engine.engine import EngineFacts
    from inception_engine.ingest.images import Preprocess
    from inception_engine.serve import devices

    class Engine:
        backend_name, decode, preprocess = "cuda", "gpu", Preprocess()

        def close(self) -> None:
            pass

    class StandInWorker(devices.DeviceWorker):
        def __init__(self, spec: Any):
            self.engine, self.size = Engine(), SIZE
            # the tree before MemoryFiles (an A/B against it) has none: its memory files are made per batch
            self.files = devices.MemoryFiles() if hasattr(devices, "MemoryFiles") else None
            batch = spec.batch_size
            sizes = sorted({*devices.SMALL_RUNNERS, batch})
            self.runners = [(StandInRunner(b, batch_ms, host_us), None) for b in sizes]
            self.depth, self.sizes = 2, devices.buckets(batch)
            self.runner_depth = self.depth
            self.encoded_batch = batch  # the stand-in runners decode nothing: jobs of one batch
            self.chains = None  # nor in decode calls: no decode chains
            self.gpu = threading.Lock()

        def warm_up(self) -> None:
            pass

        def facts(self) -> EngineFacts:
            from inception_engine.weights import ModelId

            # a model id, as an engine's facts have one: inception-run --server writes it in every result
            return EngineFacts("cuda", "fp16", self.sizes[-1], None, (), ModelId("0" * 16, "synthetic"))

        def close(self) -> None:
            if self.files is not None:
                self.files.close()

    devices.DeviceWorker = StandInWorker  # type: ignore[misc]


def serve(port: int, max_batch: int, process: bool, http_workers: int = 1) -> None:
    """The server as inception-serve runs it (app.GracefulServer, app.make_app; with ``http_workers`` > 1
    command.run_with_frontends), on the stand-in engine; its device a thread (as with one GPU) or, ``process``, a
    worker process (devices.ProcessDevice, as with several)."""
    from inception_engine.config import EngineConfig
    from inception_engine.serve import app as app_module
    from inception_engine.serve.app import GracefulServer, Server, make_app
    from inception_engine.serve.command import listening_socket, metrics_directory, run_with_frontends
    from inception_engine.serve.devices import ProcessDevice
    from inception_engine.serve.settings import Limits, ServeOptions

    if process:
        app_module.make_devices = lambda spec, gpus, loop: [ProcessDevice(spec, 0, loop)]  # type: ignore
    never_read = Path("/tmp/serve_standin_weights.npz")  # EngineConfig wants a weight file; no engine reads it
    never_read.touch()
    spec = EngineConfig(never_read, "cuda", "fp16", max_batch, None, "thread", "gpu")
    options = ServeOptions(spec, 1, max_batch, 0.0, 2, Limits(max_images=4096))
    sock = listening_socket("127.0.0.1", port)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    def ready(facts: Any, names: list[str]) -> None:
        print(f"standin: ready at {url}" if facts is not None else "standin: failed", file=sys.stderr, flush=True)

    if http_workers > 1:
        with metrics_directory():
            run_with_frontends(options, sock, http_workers, ready)
        return
    GracefulServer(make_app(Server(options, ready)), sock, timeout=5).run()


def serve_with_device_process(argv: list[str]) -> None:
    """inception-serve itself (its command line: ``argv``), the real engine, but with its device in a worker process
    (devices.ProcessDevice) even for one GPU: the event loop and the engine's thread then hold a GIL each. For an
    A/B on the GPU (bench_serve.py --device-process); the product keeps one GPU's engine on a thread."""
    from inception_engine.multi_gpu import cpu_share
    from inception_engine.serve import app as app_module
    from inception_engine.serve.command import serve_main
    from inception_engine.serve.devices import ProcessDevice

    def make_devices(spec: Any, gpus: int, loop: Any) -> list[Any]:
        return [ProcessDevice(spec, g, loop, cpu_share(g, gpus) if gpus > 1 else None) for g in range(gpus)]

    app_module.make_devices = make_devices  # type: ignore[assignment]
    sys.argv = ["inception-serve", *argv]
    serve_main()


def jpegs(n: int) -> list[Path]:
    """Small JPEGs (500x375, as bench_folder's small style, ~20-40 KB), made once."""
    import numpy as np
    from PIL import Image

    d = Path("/tmp/serve_standin_jpegs")
    d.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        p = d / f"{i:04}.jpg"
        if not p.exists():
            base = rng.integers(0, 255, (24, 32, 3), np.uint8)
            img = Image.fromarray(base).resize((500, 375), Image.BILINEAR)
            buf = io.BytesIO()
            img.save(buf, "JPEG", quality=90)
            p.write_bytes(buf.getvalue())
        out.append(p)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64,1")
    ap.add_argument("--concurrency", default="32")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--client-procs", type=int, default=2)
    ap.add_argument("--batch-ms", type=float, default=0.0, help="a batch's time on the stand-in device")
    ap.add_argument("--host-us", type=float, default=0.0,
                    help="the runner's Python a image on the stand-in device, holding the GIL")
    ap.add_argument("--process", action="store_true", help="the device in a worker process (ProcessDevice)")
    ap.add_argument("--http-workers", default="1", help="a server for each (comma-separated), rows interleaved")
    ap.add_argument("--rounds", type=int, default=1, help="times each row is measured on each server")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--profile", action="store_true", help="py-spy the server during each row")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        return serve(args.serve, args.max_batch, args.process, int(args.http_workers))
    files = jpegs(args.images)
    servers = {int(w): start_standin(args, int(w)) for w in args.http_workers.split(",")}
    try:
        rows = measure_all(args, servers, files)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    if len(servers) > 1 or args.rounds > 1:
        summary(rows, list(servers))


def start_standin(args: argparse.Namespace, http_workers: int) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, STAND_IN: f"{args.batch_ms},{args.host_us}"}
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "0", "--max-batch", str(args.max_batch),
                             "--http-workers", str(http_workers), *(["--process"] if args.process else [])],
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    for line in proc.stderr:  # type: ignore[union-attr]
        if line.startswith("standin: ready at "):
            return proc, line.split()[-1]
        sys.stderr.write(line)
    raise SystemExit(f"the stand-in server did not start (exit {proc.wait()})")


def measure_all(args: argparse.Namespace, servers: dict[int, tuple[subprocess.Popen, str]],
                files: list[Path]) -> list[dict]:
    """Every (size, concurrency) row on every server, ``args.rounds`` times, the servers alternating row by row."""
    from bench_serve import load_point, measured, py_spy, top_frames

    rows = []
    for r in range(args.rounds):
        for size in (int(s) for s in args.sizes.split(",")):
            for c in (int(v) for v in args.concurrency.split(",")):
                for workers, (proc, url) in servers.items():
                    spy = py_spy(proc.pid, f"/tmp/serve_standin_{size}_{c}_{workers}.txt") if args.profile else None
                    row = measured(proc.pid, load_point, "inception", url, files, size, "closed", c, args.seconds,
                                   args.client_procs)
                    rows.append({**row, "http_workers": workers, "round": r})
                    print(f"http-workers {workers} {size:3} img/req c={c:<4}: {row['images_s']:6} img/s  p50 "
                          f"{row['p50_ms']} ms  failed {row['failed']}  server CPU {row['cpu_us_image']} us/image "
                          f"({row['server_cpu_s'] / row['seconds']:.2f} cores; main process "
                          f"{row['main_cpu_us_image']})", flush=True)
                    if spy is not None:
                        print(top_frames(spy, args.top), flush=True)
    return rows


def summary(rows: list[dict], workers: list[int]) -> None:
    """Per (size, concurrency): each server's median images/s and CPU per image over the rounds, and its ratio to
    the first server's."""
    import statistics

    print("medians over the rounds (ratio: images/s against http-workers " f"{workers[0]}):")
    for key in dict.fromkeys((r["size"], r["level"]) for r in rows):
        cells = []
        for w in workers:
            mine = [r for r in rows if (r["size"], r["level"]) == key and r["http_workers"] == w]
            rate = statistics.median(r["images_s"] for r in mine)
            cpu = statistics.median(r["cpu_us_image"] or 0 for r in mine)
            cells.append((w, rate, cpu))
        base = cells[0][1] or 1
        print(f"  {key[0]:3} img/req c={int(key[1]):<4}" + "".join(
            f"  | {w} front-ends: {rate:7.0f} img/s ({rate / base:.2f}x), {cpu:.0f} us/image"
            for w, rate, cpu in cells))


# The stand-in's timings (batch ms, host us an image), for the server and for a device's worker process, which
# imports this module as its main (spawn) and so swaps its engine too.
STAND_IN = "SERVE_STANDIN"
if STAND_IN in os.environ:
    patch_devices(*(float(v) for v in os.environ[STAND_IN].split(",")))

if __name__ == "__main__":
    if sys.argv[1:2] == ["--device-process"]:
        serve_with_device_process(sys.argv[2:])
    else:
        main()
