"""End-to-end benchmark: classifying a folder of JPEGs as a user does, beside the PyTorch DataLoader script.

    python dev/bench_e2e.py                       # makes 4,096 ImageNet-like JPEGs (cached), all rows
    python dev/bench_e2e.py --dir photos/ --precisions tf32 --kinds thread --no-torch
    python dev/bench_e2e.py --images 512 --backend cpu --precisions fp32 --no-torch --no-cold   # no GPU

Rows, each in a fresh process (so peak host memory is the row's own):
- ``cold`` / ``warm 1 photo``: ``inception-run ONE.jpg`` with an empty cache (kernels compiled, nothing tuned: what
  a fresh machine answers in), then again with the cache that left;
- ``decode only``: the decode workers alone writing into the ring, no forward: the host's ceiling;
- ``ours``: Engine.predict_iter over the folder, per precision and worker kind, after a warm-up that compiles and
  tunes (a second run of a folder is what the warm numbers describe), with the forward alone at the same batch
  (CUDA events, median) beside it;
- ``torch``: dev/torch_dataloader_baseline.py with PyTorch's defaults (TF32 convolutions), in true fp32 and in
  fp16, with the same weights; top-1 agreement of every row with the true-fp32 one.
Peak host memory is the process's peak RSS; GPU memory is what the engine allocated (arena, weights, the runner's
buffers) or PyTorch's max_memory_allocated. Prints a table; --json keeps everything.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------------------------------------------- images

def make_jpeg(path: Path, seed: int) -> None:
    """An ImageNet-like photo: 500x375 or 375x500, quality 90, smooth structure plus fine noise (so JPEG has real
    work to do: ~100-150 KB, like ImageNet's validation images)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = (500, 375) if seed % 2 else (375, 500)
    coarse = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), np.int16)
    img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
    Image.fromarray(img).save(path, quality=90)


def jpeg_folder(n: int) -> Path:
    from inception_engine.weights import user_cache_dir

    d = user_cache_dir() / f"e2e-jpegs-{n}"
    marker = d / ".complete"
    if not marker.exists():
        d.mkdir(parents=True, exist_ok=True)
        with ProcessPoolExecutor() as pool:
            list(pool.map(make_jpeg, [d / f"{i:06d}.jpg" for i in range(n)], range(n), chunksize=64))
        marker.write_text("ok\n")
    return d


def images_in(d: Path, limit: int | None) -> list[str]:
    paths = sorted(str(p) for p in d.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    return paths[:limit] if limit else paths


# ------------------------------------------------------------------------------------------------- row workers

def row_ours(args: argparse.Namespace) -> dict:
    from inception_engine.engine import Engine

    paths = images_in(Path(args.dir), args.limit)
    out: dict = {"images": len(paths)}
    with Engine(args.weights, backend=args.backend, batch_size=args.batch_size, precision=args.precision,
                workers=args.workers, worker_kind=args.kind, decode=args.decode) as engine:
        batch = min(args.batch_size, len(paths))
        if engine.backend_name == "cuda":
            engine.backend_for(batch, tune=True)  # tune once (cached): the warm state a second run finds
        list(engine.predict_iter(paths[:2 * batch], top_k=5))  # warm-up: pools, pinned buffers, graph
        t0 = time.perf_counter()
        top1 = [p.top[0][0] if p.ok else -1 for p in engine.predict_iter(paths, top_k=5)]
        seconds = time.perf_counter() - t0
        out.update(seconds=seconds, images_per_s=len(paths) / seconds, top1=top1, paths=paths,
                   precision=engine.precision, backend=engine.backend_name)
        out.update(forward_alone(engine, batch))
    return out | peak_rss()


def forward_alone(engine: object, batch: int) -> dict:
    """The engine's tuned forward of ``batch`` images alone (CUDA events, median; none on the cpu backend) and the
    GPU memory its backend holds."""
    backend = engine.backend_for(batch, tune=True)  # type: ignore[attr-defined]
    out: dict = {}
    if hasattr(backend, "time_forward"):
        x = np.random.default_rng(0).standard_normal((batch, 3, 299, 299)).astype(np.float32)
        ms = statistics.median(backend.time_forward(x, iters=20, warmup=3))
        out.update(forward_ms=ms, forward_images_per_s=batch / ms * 1e3)
    if hasattr(backend, "peak_memory_bytes"):
        out["gpu_mib"] = backend.peak_memory_bytes() / 2**20
    return out


def synthetic_weights_file(folder: str | Path) -> str:
    """The deterministic synthetic model (pretrained weights cannot be downloaded here), written into folder."""
    from inception_engine.synthetic import synthetic_weights
    from inception_engine.weights import save_weights

    w = synthetic_weights(0)
    return str(save_weights(Path(folder) / "synthetic.npz", w.arrays, w.manifest))


def row_decode(args: argparse.Namespace) -> dict:
    from inception_engine.ingest.images import Preprocess
    from inception_engine.ingest.ring import HostRing
    from inception_engine.ingest.workers import DecodePool, default_workers

    paths = images_in(Path(args.dir), args.limit)
    pre, slots = Preprocess(), 4 * args.batch_size
    workers = args.workers or default_workers()
    ring = HostRing(slots, pre, shared=args.kind == "process")
    pool = DecodePool(ring, pre, workers, args.kind)
    try:
        warm = [pool.submit(i % slots, p) for i, p in enumerate(paths[:slots])]
        pool.flush()
        list(f.result() for f in warm)  # warm-up
        t0 = time.perf_counter()
        window: list = []
        for i, p in enumerate(paths):
            window.append(pool.submit(i % slots, p))
            if len(window) == slots:  # slots are reused only after their image is done, as in the pipeline
                pool.flush()
                for f in window[: slots // 2]:
                    f.result()
                window = window[slots // 2:]
        pool.flush()
        for f in window:
            f.result()
        seconds = time.perf_counter() - t0
    finally:
        pool.close()
        ring.close()
    return {"images": len(paths), "seconds": seconds, "images_per_s": len(paths) / seconds, "workers": workers,
            **peak_rss()}


def peak_rss() -> dict:
    """Peak resident memory of this process and of its largest child (a decode worker process), MiB."""
    return {"host_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


# ----------------------------------------------------------------------------------------------------- driver

def run_row(argv: list[str], env: dict | None = None, timeout: int = 600, script: Path | str = __file__) -> dict:
    """A row measured by ``script`` (default: this one, with --row) in a process of its own: its last line's JSON,
    or the error."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=ROOT)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:200], "wall_s": time.perf_counter() - t0}
    return json.loads(r.stdout.strip().splitlines()[-1])


def cold_start(photo: str, weights: str, precision: str) -> dict:
    """``inception-run photo`` with an empty cache, then with the cache it left: wall seconds to the answer."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, XDG_CACHE_HOME=cache)
        cmd = [sys.executable, "-c", "from inception_engine.cli import run_main; run_main()", photo, "--weights",
               weights, "--top-k", "1", "--precision", precision]
        for name in ("cold", "warm"):
            t0 = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
            out[name] = {"seconds": time.perf_counter() - t0, "rc": r.returncode,
                         "stderr": r.stderr.strip()[-300:]}
    return out


def agreement(a: dict, b: dict) -> str:
    if "top1" not in a or "top1" not in b:
        return "-"
    tb = dict(zip(b["paths"], b["top1"]))
    same = sum(tb.get(p) == t for p, t in zip(a["paths"], a["top1"]))
    return f"{same}/{len(a['top1'])}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="folder of images (default: make --images JPEGs, cached)")
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--limit", type=int, help="use only the first N images of the folder")
    ap.add_argument("--weights", help="weight file (default: the synthetic model, written to a temp file)")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--precisions", default="fp32,tf32,fp16")
    ap.add_argument("--kinds", default="thread,process", help="decode worker kinds")
    ap.add_argument("--decodes", default="cpu,gpu", help="cpu (Pillow) and/or gpu (nvImageCodec)")
    ap.add_argument("--sweep", default="1,2,4,8,16", help="process worker counts of the decode-only sweep (none: skip)")
    ap.add_argument("--batch-size", type=int, default=64, help="default: inception-run's own (64 on the GPU)")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--json", help="write every row to this file")
    ap.add_argument("--row", choices=["ours", "decode"], help=argparse.SUPPRESS)  # a row's worker process
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--kind", default="thread", help=argparse.SUPPRESS)
    ap.add_argument("--decode", default="cpu", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.row:
        print(json.dumps((row_ours if args.row == "ours" else row_decode)(args)))
        return

    folder = Path(args.dir) if args.dir else jpeg_folder(args.images)
    tmp = tempfile.TemporaryDirectory()
    weights = args.weights or synthetic_weights_file(tmp.name)
    def row_args(limit: int | None, workers: int | None) -> list[str]:
        out = ["--dir", str(folder), "--weights", weights, "--batch-size", str(args.batch_size)]
        out += ["--limit", str(limit)] if limit else []
        return out + (["--workers", str(workers)] if workers else [])

    common = row_args(args.limit, args.workers)
    n = len(images_in(folder, args.limit))
    rows: dict[str, dict] = {}
    if not args.no_cold:
        photo = images_in(folder, 1)[0]
        for precision in args.precisions.split(","):
            rows[f"cold start {precision}"] = cold_start(photo, weights, precision)
    for kind in args.kinds.split(","):
        rows[f"decode only, {kind} workers"] = run_row(["--row", "decode", "--kind", kind, *common])
    for w in args.sweep.split(",") if args.sweep != "none" else []:  # where the decode ceiling comes from: cores
        rows[f"decode only, {w} process(es), 512 images"] = run_row(["--row", "decode", "--kind", "process",
                                                                     *row_args(512, int(w))])
    if args.images > 1024 and not args.limit:  # host memory is the ring's, not the folder's: a quarter the images
        rows["ours tf32, process workers, 1024 images"] = run_row(["--row", "ours", "--backend", args.backend,
                                                                   "--precision", "tf32", "--kind", "process",
                                                                   *row_args(1024, args.workers)])
    decodes = args.decodes.split(",")
    for precision in args.precisions.split(","):
        for kind in args.kinds.split(",") if "cpu" in decodes else []:
            rows[f"ours {precision}, {kind} workers"] = run_row(["--row", "ours", "--backend", args.backend,
                                                                  "--precision", precision, "--kind", kind, *common])
        if "gpu" in decodes:
            rows[f"ours {precision}, gpu decode"] = run_row(["--row", "ours", "--backend", args.backend,
                                                             "--precision", precision, "--decode", "gpu", *common])
    if "gpu" in decodes and "fp32" in args.precisions.split(",") and "cpu" in decodes:
        rows["top-1: gpu decode = cpu decode (fp32)"] = {
            "agreement": agreement(rows.get("ours fp32, gpu decode", {}),
                                   rows.get(f"ours fp32, {args.kinds.split(',')[-1]} workers", {}))}
    if not args.no_torch:
        for flag, name in (([], "torch DataLoader fp32 (TF32 convs)"), (["--no-tf32"], "torch DataLoader fp32"),
                           (["--fp16"], "torch DataLoader fp16 channels_last")):
            rows[name] = run_row([str(folder), weights, "--batch-size", str(args.batch_size), *flag],
                                 script=ROOT / "dev/torch_dataloader_baseline.py")
    torch32 = rows.get("torch DataLoader fp32", {})  # top-1 agreement: against true float32
    torch_default = rows.get("torch DataLoader fp32 (TF32 convs)", {})  # speed: against the script as users run it

    print(f"\n{n} images in {folder}, batch {args.batch_size}")
    print(f"{'row':40} {'images/s':>9} {'x torch':>8} {'fwd img/s':>10} {'host MiB':>9} {'worker':>7} "
          f"{'GPU MiB':>8} {'top-1 = torch fp32':>18}")
    for name, r in rows.items():
        if "agreement" in r:
            print(f"{name:40} {r['agreement']}")
            continue
        if name.startswith("cold"):
            print(f"{name:40} first answer {r['cold']['seconds']:.1f} s cold (rc {r['cold']['rc']}), "
                  f"{r['warm']['seconds']:.1f} s warm")
            continue
        if "error" in r:
            print(f"{name:40} error: {r['error']}")
            continue
        ratio = (r["images_per_s"] / torch_default["images_per_s"] if "images_per_s" in torch_default
                 else float("nan"))
        fwd = f"{r['forward_images_per_s']:.0f}" if "forward_images_per_s" in r else "-"
        gpu = r.get("gpu_mib", r.get("gpu_peak_mib"))
        print(f"{name:40} {r['images_per_s']:9.0f} {ratio:8.2f} {fwd:>10} {r.get('host_peak_mib', 0):9.0f} "
              f"{r.get('worker_peak_mib', 0):7.0f} {(f'{gpu:.0f}' if gpu else '-'):>8} {agreement(r, torch32):>18}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    tmp.cleanup()


if __name__ == "__main__":
    main()
