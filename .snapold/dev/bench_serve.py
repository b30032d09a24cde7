"""inception-serve under load, beside inception-run on the same files and a peer server (LitServe with
torchvision's Inception-V3 in fp16 and LitServe's own batching), in one run on a GPU machine.

    python dev/bench_serve.py [--images 1024] [--concurrency 1,4,16,64,256] [--sizes 1,64] [--seconds 5]
                              [--precision fp16] [--decode gpu] [--peer litserve|none] [--run-images 16384]
                              [--profile 64,128] [--http-workers 1,4] [--json out.json]
    python dev/bench_serve.py --soak 420 [--rate R | --soak-load 0.8] [--sizes 64] [--http-workers 4] ...

On the GPU machine the HTTP packages come from dev/gpu_machine/serve_kit.sh (``install`` sets PYTHONPATH).

Load: tritonclient's asyncio client (tritonclient.http.aio) against inception-serve, aiohttp against the peer,
from ``--client-procs`` processes (one Python process cannot send 10,000 requests a second), each request
``size`` JPEG files as bytes (binary tensor data; the peer: base64 in JSON, its usual form), asking for the top 5:
- closed loop: ``c`` requests outstanding at all times for ``--seconds``, for each c of ``--concurrency``;
- open loop: requests started at a fixed rate (``--rate`` requests/s; default 80 % of the closed loop's best), each
  one's latency counted from when it was due, so that a server falling behind shows in p99 (no coordinated
  omission);
per row: images/s, requests/s, p50 and p99 latency in ms, failed requests, and inception-serve's CPU time (its
process, every thread) per image answered. ``--profile SIZE,C``: py-spy samples inception-serve during that row
(the thread holding the GIL: with one GPU the event loop and the device's thread share one) and its hottest frames
are printed, by thread, by self and by total samples (dev/serve_standin.py measures the same without a GPU).

``--http-workers 1,4``: the rows for inception-serve with each number of HTTP front-end processes, one server after
the other in the same run. ``--soak SECONDS``: instead, a soak (serve_soak.py says what it samples and judges).

Beside it: ``inception-run DIR`` (--decode, --precision as given) on ``--run-images`` files (the --images folder's
files linked as many times as needed), its steady images/s (bench_folder.inception_run); and ``inception-run
--server URL`` on the same files against the warm server: its wall time and when its first result came.

The peer (``--peer litserve``): a LitServe server in a subprocess (this file, ``--peer-server PORT BATCH``) with
torchvision's Inception-V3 (random weights: no download; the speed is the same) in fp16 on cuda:0, decoding
with Pillow + torchvision's transforms in LitServe's workers, batching up to 64 single-image requests within 1 ms
(LitServe's batch_timeout; for 64-image requests: each request its own batch).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "dev")]

READY = "inception-serve: ready at "
MODEL = "inception_v3"


# ---------------------------------------------------------------------------------------------- the load itself

def payloads(files: list[Path], size: int, count: int = 64) -> list[list[bytes]]:
    """``count`` requests' images, ``size`` files each, cycling through ``files``."""
    data = [f.read_bytes() for f in files]
    return [[data[(r * size + j) % len(data)] for j in range(size)] for r in range(count)]


async def triton_sender(url: str, conc: int) -> tuple[Any, Any]:
    import numpy as np
    import tritonclient.http.aio as aio
    from tritonclient.http import InferInput, InferRequestedOutput

    client = aio.InferenceServerClient(url.removeprefix("http://"), conn_limit=max(conc, 1))
    outputs = [InferRequestedOutput("probabilities", binary_data=True, class_count=5)]

    async def send(images: list[bytes]) -> bool:
        inp = InferInput("images", [len(images)], "BYTES")
        inp.set_data_from_numpy(np.array(images, dtype=np.object_), binary_data=True)
        r = await client.infer(MODEL, [inp], outputs=outputs)
        return r.as_numpy("probabilities").shape[0] == len(images)

    return send, client.close


async def ready_sender(url: str, conc: int) -> tuple[Any, Any]:
    """A bare round trip (GET /v2/health/ready) with the same client: the HTTP floor under an image's latency."""
    import tritonclient.http.aio as aio

    client = aio.InferenceServerClient(url.removeprefix("http://"), conn_limit=max(conc, 1))

    async def send(images: list[bytes]) -> bool:
        return await client.is_server_ready()

    return send, client.close


SENDERS = {"inception": triton_sender, "ready": ready_sender}


async def peer_sender(url: str, conc: int) -> tuple[Any, Any]:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max(conc, 1)))

    async def send(images: list[bytes]) -> bool:
        body = {"images": [base64.b64encode(b).decode() for b in images]}
        async with session.post(f"{url}/predict", json=body) as r:
            doc = await r.json()
            return r.status == 200 and len(doc["top"]) == len(images)

    return send, session.close


async def drive(kind: str, url: str, reqs: list[list[bytes]], mode: str, level: float, seconds: float) -> dict:
    """One client process's share: closed loop of ``level`` outstanding, or open loop at ``level`` requests/s."""
    conc = int(level) if mode == "closed" else 1024
    send, close = await SENDERS.get(kind, peer_sender)(url, conc)
    lat: list[float] = []
    errors: list[str] = []  # the first few failures' messages
    failed = images = 0
    end = time.perf_counter() + seconds

    async def one(r: int, due: float) -> None:
        nonlocal failed, images
        try:
            ok = await send(reqs[r % len(reqs)])
        except Exception as e:
            ok = False
            if len(errors) < 5:
                errors.append(f"{type(e).__name__}: {str(e).strip()[:300]}")
        if ok:
            lat.append(time.perf_counter() - due)
            images += len(reqs[r % len(reqs)])
        else:
            failed += 1

    async def closed(worker: int) -> None:
        r = worker
        while time.perf_counter() < end:
            await one(r, time.perf_counter())
            r += conc

    try:
        await one(0, time.perf_counter())  # the connection made, not timed
        lat.clear()
        images = 0
        t0 = time.perf_counter()
        if mode == "closed":
            await asyncio.gather(*(closed(w) for w in range(conc)))
        else:
            tasks: set[asyncio.Task] = set()  # those not done: a long soak keeps no task it has finished
            r = 0
            while (due := t0 + r / level) < end:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                task = asyncio.create_task(one(r, due))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                r += 1
            await asyncio.gather(*tasks)
        took = time.perf_counter() - t0
    finally:
        await close()
    return {"lat": lat, "failed": failed, "images": images, "seconds": took, "errors": errors}


def client_proc(args: tuple) -> dict:
    kind, url, files, size, mode, level, seconds = args
    return asyncio.run(drive(kind, url, payloads(files, size), mode, level, seconds))


def load_point(kind: str, url: str, files: list[Path], size: int, mode: str, level: float, seconds: float,
               procs: int) -> dict:
    """One row: ``procs`` client processes sharing the load, their latencies merged."""
    procs = max(1, min(procs, int(level))) if mode == "closed" else procs
    share = [level / procs] if mode == "open" else [level // procs + (p < level % procs) for p in range(procs)]
    share = share * procs if mode == "open" else share
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(procs) as pool:
        parts = pool.map(client_proc, [(kind, url, files, size, mode, s, seconds) for s in share if s > 0])
    lat = sorted(x for p in parts for x in p["lat"])
    took = max(p["seconds"] for p in parts)

    def pct(q: float) -> float | None:
        return round(1000 * lat[min(len(lat) - 1, int(q * len(lat)))], 2) if lat else None

    return {"server": kind, "size": size, "mode": mode, "level": level, "seconds": round(took, 2),
            "images_s": round(sum(p["images"] for p in parts) / took), "requests_s": round(len(lat) / took),
            "p50_ms": pct(0.50), "p99_ms": pct(0.99), "failed": sum(p["failed"] for p in parts),
            "errors": [e for p in parts for e in p["errors"]][:5]}


def sweep(kind: str, url: str, files: list[Path], args: argparse.Namespace, pid: int | None = None) -> list[dict]:
    """Every row for this server; ``pid``: its process, whose CPU time each row reports (``cpu_us_image``) and
    which py-spy samples during the row ``--profile`` names."""
    rows = []
    for size in args.sizes:
        best = 0.0
        for c in args.concurrency:
            profiled = pid is not None and args.profile == [size, c]
            spy = py_spy(pid, str(Path(args.workdir) / f"pyspy_{size}_{c}.txt")) if profiled else None
            before = server_times(url) if kind == "inception" else None
            row = measured(pid, load_point, kind, url, files, size, "closed", c, args.seconds, args.client_procs)
            if before is not None:
                row.update(per_request(before, server_times(url)))
            rows.append(row)
            print(fmt(row), flush=True)
            if spy is not None:
                print(top_frames(spy, args.profile_top), flush=True)
            best = max(best, row["requests_s"])
            if kind == "inception" and size == 1 and c == 1:  # what of one image's latency is HTTP and the client
                floor = load_point("ready", url, files, size, "closed", c, args.seconds, args.client_procs)
                rows.append({**floor, "server": "ready"})
                print(fmt(rows[-1]), flush=True)
        rate = args.rate or 0.8 * best
        if rate > 0:
            row = measured(pid, load_point, kind, url, files, size, "open", rate, args.seconds, args.client_procs)
            rows.append(row)
            print(fmt(row), flush=True)
    return rows


def metric_families(url: str) -> list[Any]:
    """The server's /metrics (every process's added up), as prometheus-client parses them. Raises OSError where the
    server does not answer."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    return list(text_string_to_metric_families(urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()))


def server_times(url: str) -> dict[str, float]:
    """The sums and counts of the server's infer request seconds, batch compute seconds and queue seconds."""
    out: dict[str, float] = {}
    for family in metric_families(url):
        if family.name not in ("inception_request_seconds", "inception_compute_seconds", "inception_queue_seconds"):
            continue
        for sample in family.samples:
            part = sample.name.rsplit("_", 1)[1]
            if part in ("sum", "count") and (family.name != "inception_request_seconds"
                                             or sample.labels.get("route") == "infer"):
                key = f"{family.name.split('_')[1]}_{part}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def per_request(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Means over a row, in ms: the server's time a request (arrival to answer), a batch's compute, an image's queue
    wait (metrics' differences)."""
    def mean(name: str) -> float | None:
        n = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        return round(1000 * (after[f"{name}_sum"] - before.get(f"{name}_sum", 0.0)) / n, 3) if n else None

    return {"server_request_ms": mean("request"), "compute_ms": mean("compute"), "queue_ms": mean("queue")}


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (a server's front-ends and device processes), from /proc."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:  # it ended meanwhile
            continue
    return out


def cpu_seconds(pid: int, tree: bool = True) -> float:
    """utime + stime of a process and (``tree``) the processes below it (every thread of them), in seconds."""
    total = 0
    for p in process_tree(pid) if tree else [pid]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def measured(pid: int | None, load: Any, *args: Any) -> dict:
    """The row ``load(*args)`` gives, with the server's CPU time over it per image answered (the clients' start-up
    counted in: the server idles then)."""
    if pid is None:
        return load(*args)
    cpu0, main0 = cpu_seconds(pid), cpu_seconds(pid, tree=False)
    out = load(*args)
    images = out["images_s"] * out["seconds"]
    out["server_cpu_s"] = round(cpu_seconds(pid) - cpu0, 2)
    out["cpu_us_image"] = round(1e6 * out["server_cpu_s"] / images) if images else None
    # the server's first process alone: with HTTP front-ends, the engine's process (its one core is the limit)
    out["main_cpu_us_image"] = round(1e6 * (cpu_seconds(pid, tree=False) - main0) / images) if images else None
    return out


# ------------------------------------------------------------------------------------------ the server profiled

class Spy:
    """py-spy sampling a process until ``stop`` (SIGINT: it writes what it has): collapsed stacks, one thread's
    name at the root of each (--threads), idle frames left out."""

    def __init__(self, pid: int, out: str):
        self.out = out
        self.proc = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--format", "raw", "--threads", "--gil",
                                      "--nonblocking", "--rate", "200", "-o", out],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self) -> list[tuple[list[str], int]]:
        import signal

        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            err = self.proc.communicate()[1]
        if not Path(self.out).is_file():
            print(f"py-spy wrote nothing: {err.strip().splitlines()[-1:] or ['?']}", flush=True)
            return []
        stacks = []
        for line in Path(self.out).read_text().splitlines():
            frames, _, count = line.rpartition(" ")
            if frames and count.isdigit():
                stacks.append((frames.split(";"), int(count)))
        return stacks


def py_spy(pid: int, out: str) -> Spy | None:
    """A Spy on ``pid``, None (said once) where py-spy is not installed."""
    import shutil

    if shutil.which("py-spy") is None:
        print("py-spy is not installed (dev/gpu_machine/serve_kit.sh): no profile", flush=True)
        return None
    return Spy(pid, out)


def short(frame: str) -> str:
    """'fn (path/to/file.py:12)' as 'fn (file.py:12)'."""
    return re.sub(r"\((?:[^()]*/)?([^/()]+)\)$", r"(\1)", frame)


def top_frames(spy: Spy, top: int = 25) -> str:
    """The profile's hottest frames: per thread its share of the samples, then the frames by self samples (the
    frame on top of the stack) and by total samples (anywhere on it), as % of all samples."""
    stacks = spy.stop()
    total = sum(c for _, c in stacks)
    if not total:
        return "py-spy: no samples"
    threads: dict[str, int] = {}
    own: dict[str, int] = {}
    anywhere: dict[str, int] = {}
    for frames, c in stacks:
        threads[frames[0]] = threads.get(frames[0], 0) + c
        own[short(frames[-1])] = own.get(short(frames[-1]), 0) + c
        for f in {short(f) for f in frames[1:]}:
            anywhere[f] = anywhere.get(f, 0) + c

    def table(title: str, counts: dict[str, int]) -> list[str]:
        best = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [title, *(f"  {100 * c / total:5.1f} %  {f}" for f, c in best)]

    lines = [f"py-spy: {total} samples (non-idle) in {spy.out}",
             *table("by thread:", threads), *table("by self samples:", own), *table("by total samples:", anywhere)]
    return "\n".join(lines)


def fmt(row: dict) -> str:
    level = f"c={int(row['level'])}" if row["mode"] == "closed" else f"{row['level']:.0f} req/s"
    return (f"{row['server']:10} {row['size']:3} img/req {row['mode']:6} {level:>12}: {row['images_s']:7} img/s "
            f"{row['requests_s']:6} req/s  p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms  failed {row['failed']}"
            + (f"  server CPU {row['cpu_us_image']} us/image (main process {row['main_cpu_us_image']})"
               if row.get("cpu_us_image") else "")
            + (f"  server: {row['server_request_ms']} ms a request, compute {row['compute_ms']} ms a batch, queue "
               f"{row['queue_ms']} ms" if row.get("server_request_ms") is not None else ""))


# ------------------------------------------------------------------------------------------------ the servers

def start_inception(args: argparse.Namespace, device_process: bool = False, http_workers: int = 1,
                    decode_images: int | None = None) -> tuple[subprocess.Popen, str]:
    """inception-serve; ``device_process``: its one device in a worker process (serve_standin.py --device-process);
    ``http_workers``: its HTTP front-end processes (--http-workers); ``decode_images``: images.DECODE_IMAGES
    set to it in the engine's process (the files of a GPU decode call, and so of an encoded job)."""
    server = ([str(ROOT / "dev" / "serve_standin.py"), "--device-process"] if device_process else
              ["-m", "inception_engine.serve.command"] if decode_images is None else
              ["-c", f"import inception_engine.ingest.images as i; i.DECODE_IMAGES = {decode_images}; "
                     "from inception_engine.serve.command import serve_main; serve_main()"])
    cmd = [sys.executable, *server, "--port", "0", "--precision", args.precision,
           "--decode", args.decode, "--backend", args.backend, "--max-queue-delay-ms", str(args.delay_ms),
           "--max-images", "4096", "--http-workers", str(http_workers)]
    if args.weights:
        cmd += ["--weights", args.weights]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for line in proc.stderr:  # type: ignore[union-attr]
        sys.stderr.write(line)
        if line.startswith(READY):
            return proc, line[len(READY):].split()[0]
    raise SystemExit(f"inception-serve did not start (exit {proc.wait()})")


def start_peer(batch: int, port: int, model: str) -> subprocess.Popen:
    """The peer in a session of its own, so that stop_peer ends LitServe's processes with it."""
    proc = subprocess.Popen([sys.executable, __file__, "--peer-server", str(port), str(batch), "--peer-model", model],
                            cwd=ROOT, start_new_session=True)
    import urllib.request

    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
        if proc.poll() is not None:
            break
    stop_peer(proc)
    raise SystemExit("the LitServe peer did not start")


def stop_peer(proc: subprocess.Popen) -> None:
    """The peer and every process LitServe started, ended (its port free for the next)."""
    import signal

    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            time.sleep(1.0)  # its children leave with it
            os.killpg(proc.pid, signal.SIGKILL)  # any left
        except (subprocess.TimeoutExpired, ProcessLookupError):
            continue
        return


class TorchInception:
    """torchvision's Inception-V3 in fp16 on the device LitServe gives, torchvision's preprocessing."""

    def __init__(self, device: str):
        import torch
        import torchvision
        from torchvision import transforms

        self.torch, self.device = torch, device
        model = torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False)
        self.model = model.half().to(device).eval()
        self.pre = transforms.Compose([transforms.Resize(342), transforms.CenterCrop(299), transforms.ToTensor(),
                                       transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

    def stack(self, images: list) -> Any:
        return self.torch.stack([self.pre(img) for img in images])

    def cat(self, parts: list) -> Any:
        return self.torch.cat(parts)

    def top5(self, x: Any) -> list:
        torch = self.torch
        with torch.inference_mode():
            probs = self.model(x.to(self.device, torch.float16, non_blocking=True)).float().softmax(1)
            p, i = probs.topk(5, dim=1)
        return list(zip(p.cpu().tolist(), i.cpu().tolist()))


class FakeModel:
    """Random scores in place of the network (``--peer-model fake``): the peer's plumbing checked without torch."""

    def __init__(self, device: str):
        import numpy as np

        self.np = np

    def stack(self, images: list) -> Any:
        return self.np.stack([self.np.asarray(img.resize((299, 299)), self.np.float32) for img in images])

    def cat(self, parts: list) -> Any:
        return self.np.concatenate(parts)

    def top5(self, x: Any) -> list:
        idx = self.np.argsort(-x.reshape(len(x), -1)[:, :1000], axis=1)[:, :5]
        return [([0.2] * 5, row.tolist()) for row in idx]


try:  # the peer's API class lives at the top level: LitServe pickles it into its worker processes
    import litserve as ls
except ImportError:  # only the peer needs it
    ls = None

if ls is not None:
    class InceptionAPI(ls.LitAPI):
        """LitServe serving Inception-V3: decode (Pillow, torchvision's transforms) in decode_request, LitServe's
        batching across requests, one forward per batch."""

        def __init__(self, model: str, **batching: Any):
            super().__init__(**batching)
            self.model = model

        def setup(self, device: str) -> None:
            self.net = (TorchInception if self.model == "torch" else FakeModel)(device)

        def decode_request(self, request: dict) -> Any:
            import io

            from PIL import Image

            return self.net.stack([Image.open(io.BytesIO(base64.b64decode(s))).convert("RGB")
                                   for s in request["images"]])

        def batch(self, inputs: list) -> Any:
            return self.net.cat(inputs), [len(x) for x in inputs]

        def predict(self, x: Any) -> Any:
            if not isinstance(x, tuple):  # max_batch_size 1: LitServe calls neither batch nor unbatch
                return self.net.top5(x)
            images, sizes = x
            return self.net.top5(images), sizes

        def unbatch(self, output: Any) -> list:
            rows, sizes = output
            out, at = [], 0
            for n in sizes:
                out.append(rows[at:at + n])
                at += n
            return out

        def encode_response(self, output: Any) -> dict:
            return {"top": [list(zip(i, p)) for p, i in output]}


def peer_server(port: int, batch: int, model: str) -> None:
    """The peer: InceptionAPI batching up to ``batch`` requests within 1 ms, on cuda:0 (the fake model: the CPU)."""
    if ls is None:
        raise SystemExit("the peer needs litserve (dev/gpu_machine/serve_kit.sh)")
    api = InceptionAPI(model, max_batch_size=batch, batch_timeout=0.001)  # LitServe >= 0.2.10: the API's batching
    ls.LitServer(api, accelerator="cuda" if model == "torch" else "cpu", devices=1).run(
        host="127.0.0.1", port=port, generate_client_file=False, log_level="warning")


# ----------------------------------------------------------------------------------------------- beside them

def runs_beside(url: str, d: Path, args: argparse.Namespace, local_too: bool = True, label: str = "") -> list[dict]:
    """inception-run on the same files, locally (``local_too``) and through the warm server (--server)."""
    from bench_folder import inception_run, many

    files = len(list(d.glob("*.jpg")))
    target = many(d.parent, d, math.ceil(args.run_images / files)) if args.run_images > files else d
    local = ["--precision", args.precision, "--decode", args.decode, "--backend", args.backend, str(target)]
    local += ["--weights", args.weights] if args.weights else []
    out = Path(args.workdir) / "run.jsonl"
    rows = [{"run": "inception-run", **inception_run(local, out, timeout=900)}] if local_too else []
    for batch in args.server_batches or [None]:
        size = ["--batch-size", str(batch)] if batch else []
        rows += [{"run": f"inception-run --server{label}" + (f" --batch-size {batch}" if batch else ""),
                  **inception_run(["--server", url, *size, str(target)], out, timeout=900)}]
    for r in rows:
        r.pop("top1", None)
        print(f"{r['run']:24} {files if target is d else args.run_images} files: wall {r['wall_s']} s, steady "
              f"{r['steady']} img/s, first result at {r['first_result_s']} s, rc {r['rc']}", flush=True)
    if args.client_phases:
        client_phases(url, target, out, args.client_phases)
    return rows


def client_phases(url: str, target: Path, out: Path, inflight: list[int]) -> None:
    """inception-run --server on the same files through dev/client_phases.py, once per number of requests kept
    outstanding (0: the client's own): where its wall time goes (the interpreter's own start timed apart, as
    ``python -c pass``)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    print(f"client phases: the interpreter alone {time.perf_counter() - t0:.3f} s", flush=True)
    script = str(Path(__file__).resolve().parent / "client_phases.py")
    for n in inflight:
        out.unlink(missing_ok=True)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, script, *(["--inflight", str(n)] if n else []), "--", "--server", url,
                            str(target), "--output", str(out)], capture_output=True, text=True, timeout=300)
        wall = time.perf_counter() - t0
        lines = [line for line in r.stderr.splitlines() if line.startswith(("phases:", "error:"))]
        summary = [line for line in r.stderr.splitlines() if " images/s" in line][-1:]
        print(f"client phases, in flight {n or 'default'}: wall {wall:.3f} s, rc {r.returncode}; "
              + "; ".join(summary + lines), flush=True)


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=1024, help="JPEGs generated (bench_folder's small style)")
    ap.add_argument("--style", default="small", choices=["small", "imagenet"])
    ap.add_argument("--concurrency", type=ints, default=[1, 4, 16, 64, 256])
    ap.add_argument("--sizes", type=ints, default=[1, 64], help="images per request")
    ap.add_argument("--seconds", type=float, default=5.0, help="per row")
    ap.add_argument("--rate", type=float, default=0.0, help="open loop requests/s (0: 80%% of the best closed)")
    ap.add_argument("--client-procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 4)))
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--decode", default="gpu")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="the server's --max-queue-delay-ms")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--peer", default="litserve", choices=["litserve", "none"])
    ap.add_argument("--peer-port", type=int, default=8011)
    ap.add_argument("--peer-model", default="torch", choices=["torch", "fake"],
                    help="fake: random scores instead of the network, to check the peer's plumbing without torch")
    ap.add_argument("--run-images", type=int, default=16384, help="files for the inception-run rows (0: none)")
    ap.add_argument("--server-batches", type=ints, default=None, metavar="N,M",
                    help="inception-run --server with --batch-size N (images a request), then M, ...; default: the "
                         "server's max batch")
    ap.add_argument("--client-phases", type=ints, default=None, metavar="N,M",
                    help="then inception-run --server through dev/client_phases.py (its wall time by phase), once "
                         "per number of requests outstanding (0: the client's default)")
    ap.add_argument("--workdir", default="/tmp/bench_serve")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", type=ints, default=None, metavar="SIZE,C",
                    help="py-spy the server during the closed-loop row of SIZE images a request at concurrency C "
                         "(GIL-holding samples; py-spy from serve_kit.sh) and print its hottest frames")
    ap.add_argument("--profile-top", type=int, default=25)
    ap.add_argument("--device-process", action="store_true",
                    help="then the same rows again with the one GPU's engine in a worker process (its own GIL; "
                         "serve_standin.py --device-process); server CPU: every process of it, main process: the "
                         "HTTP side alone")
    ap.add_argument("--http-workers", type=ints, default=[1], metavar="N,M",
                    help="inception-serve --http-workers: the rows again for each (comma-separated)")
    ap.add_argument("--decode-images", type=ints, default=None, metavar="N,M",
                    help="the rows again for each GPU decode call size N (images.DECODE_IMAGES; default: "
                         "as shipped; N = the max batch: jobs of one batch, the server before decode-call jobs)")
    ap.add_argument("--soak", type=float, default=0.0, metavar="SECONDS",
                    help="instead of the sweep: a soak of SECONDS at a fixed rate, memory sampled (serve_soak.py); "
                         "exit 1 where its verdict is FAIL")
    ap.add_argument("--soak-load", type=float, default=0.8, help="the soak's rate, as a share of the saturated one")
    ap.add_argument("--soak-concurrency", type=int, default=64, help="the closed loop that finds the saturated rate")
    ap.add_argument("--sample-every", type=float, default=5.0, help="seconds between the soak's memory samples")
    ap.add_argument("--peer-server", nargs=2, type=int, metavar=("PORT", "BATCH"), help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main() -> None:
    args = parse()
    if args.peer_server:
        return peer_server(*args.peer_server, args.peer_model)
    from bench_folder import folder

    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    d = folder(Path(args.workdir), args.style, args.images)
    files = sorted(d.glob("*.jpg"))
    report: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "peer_server"}, "rows": []}
    if args.soak:
        from serve_soak import soak_command

        return soak_command(args, files, report)
    report["runs"] = []
    combos = [(w, n) for w in args.http_workers for n in args.decode_images or [None]]
    for i, (workers, calls) in enumerate(combos):
        proc, url = start_inception(args, http_workers=workers, decode_images=calls)
        name = "inception" + (f"/{workers}fe" if len(args.http_workers) > 1 else "") + (
            f"/calls{calls}" if calls else "")
        label = f" ({name})" if len(combos) > 1 else ""
        try:
            print(f"inception-serve --http-workers {workers}" + (f", decode calls of {calls}" if calls else "") + ":",
                  flush=True)
            report["rows"] += [{**r, "server": name} for r in sweep("inception", url, files, args, proc.pid)]
            if args.run_images:
                report["runs"] += runs_beside(url, d, args, local_too=i == 0, label=label)
        finally:
            proc.terminate()
            print(f"inception-serve exit code {proc.wait(timeout=120)}", flush=True)
    if args.device_process:
        proc, url = start_inception(args, device_process=True)
        try:
            one = argparse.Namespace(**{**vars(args), "profile": None})
            print("the same, the engine in a worker process:", flush=True)
            report["rows"] += [{**r, "server": "inception/device-process"}
                               for r in sweep("inception", url, files, one, proc.pid)]
        finally:
            proc.terminate()
            print(f"inception-serve (device process) exit code {proc.wait(timeout=120)}", flush=True)
    if args.peer == "litserve":
        for size in args.sizes:  # each request size on a peer batching as it suits it
            peer = start_peer(64 if size == 1 else 1, args.peer_port, args.peer_model)
            try:
                one = argparse.Namespace(**{**vars(args), "sizes": [size]})
                report["rows"] += sweep("litserve", f"http://127.0.0.1:{args.peer_port}", files, one)
            finally:
                stop_peer(peer)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")
    print(re.sub(r"\n+", "\n", "\n".join(fmt(r) for r in report["rows"])))


if __name__ == "__main__":
    main()
