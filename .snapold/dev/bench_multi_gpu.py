"""Images/s of a folder classified on 1..N GPUs of one machine, as a user runs it: ``inception-run --gpus N`` and
``inception-run --ray local --gpus N``, per precision and decode mode, with the machine's ceilings beside them.

    python dev/bench_multi_gpu.py                     # 16,384 generated JPEGs (cached), 1 and 2 GPUs, fp16 and
                                                          # fp32, CPU and GPU decode, then Ray
    python dev/bench_multi_gpu.py --gpus 1,2,4 --decodes cpu --no-ray --json out.json
    python dev/bench_multi_gpu.py --images 256 --small 64 --backend cpu --gpus 1 --decodes cpu --no-ray  # no GPU

Each row is one ``inception-run`` command in a fresh process, timed from its start to its exit (what the user waits
for), once on the whole folder and once on its first ``--small`` images. The two give the rate a long run (100,000
photos) settles at, ``(N - n) / (t_N - t_n)``, and the fixed cost apart (interpreter, weights, kernels from the
cache, decode workers, Ray's local cluster). Before the rows one untimed run per precision measures each conv's
kernels (the tuning cache a second run finds), and each inception-run row's small run is made twice, the first
untimed, so that a row never pays for a compile the others got from the cache (of Ray's rows, the first only: a Ray
start is ~25 s).

The ceilings beside the rows say where the limit sits:
- decode: the decode worker processes alone writing into the host ring, no forward, on all the CPUs and on a
  1/N share of them (what each ``--gpus N`` worker gets);
- GPU: the forward alone on one GPU at the run's batch (CUDA events, median);
- PCIe: a batch's uint8 pixels copied host-to-device from pinned memory on every GPU at once (torch; skipped
  without it).
Check: every row's top-1 must equal the same precision's 1-GPU row with the same decode (Ray's: CPU decode's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "dev"))

RUN = [sys.executable, "-c", "from inception_engine.cli import run_main; run_main()"]


def top1_of(output: Path) -> dict[str, int]:
    """image -> top-1 class index from inception-run's JSON lines (a file, or a Ray output folder of files)."""
    files = sorted(output.rglob("*.jsonl")) if output.is_dir() else [output]
    top1: dict[str, int] = {}
    for f in files:
        for line in f.read_text().splitlines():
            row = json.loads(line)
            top1[row["image"]] = row["top"][0]["index"] if "top" in row else -1
    return top1


def run_command(folder: Path, limit: int | None, opts: list[str], ray: bool, tmp: Path) -> tuple[float, dict]:
    """One inception-run over the folder (or its first ``limit`` images, linked into a folder of their own): wall
    seconds and the top-1 it wrote."""
    src = folder
    if limit:
        src = tmp / f"first-{limit}"
        if not src.exists():
            src.mkdir()
            for p in sorted(folder.glob("*.jpg"))[:limit]:
                (src / p.name).symlink_to(p)
    out = tmp / ("ray-out" if ray else "out.jsonl")
    if out.is_dir():
        shutil.rmtree(out)
    out.unlink(missing_ok=True)
    cmd = RUN + [str(src), "--output", str(out), *opts] + (["--ray", "local"] if ray else [])
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[3:])}: exit {r.returncode}: {r.stderr.strip()[-400:]}")
    top1 = top1_of(out)
    # the symlinked folder's paths name the same files: compare by file name
    return seconds, {Path(k).name: v for k, v in top1.items()}


def measure_row(folder: Path, n: int, small: int, opts: list[str], ray: bool, repeats: int, warm: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        if warm:
            run_command(folder, small, opts, ray, Path(tmp))  # untimed: a first start's compiles
        t_small, t_full = [], []
        for _ in range(repeats):
            t_small.append(run_command(folder, small, opts, ray, Path(tmp))[0])
            seconds, top1 = run_command(folder, None, opts, ray, Path(tmp))
            t_full.append(seconds)
    ts, tf = statistics.median(t_small), statistics.median(t_full)
    steady = (n - small) / max(tf - ts, 1e-9)
    return {"seconds_small": t_small, "seconds_full": t_full, "images_per_s_wall": n / tf,
            "images_per_s_steady": steady, "fixed_s": ts - small / steady, "top1": top1}


# ------------------------------------------------------------------------------------------------------ ceilings

def warm_and_forward(weights: str, backend: str, precision: str, batch: int) -> dict:
    """In a process of its own: tune the batch's kernels (cached for the rows) and time the forward alone."""
    code = f"""
import json, bench_e2e
from inception_engine.engine import Engine
with Engine({weights!r}, backend={backend!r}, batch_size={batch}, precision={precision!r}) as e:
    print(json.dumps({{"precision": e.precision}} | bench_e2e.forward_alone(e, {batch})))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT / "dev", timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"tuning {precision}: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def decode_ceiling(folder: Path, workers: int, batch: int) -> float:
    import bench_e2e

    args = argparse.Namespace(dir=str(folder), limit=None, batch_size=batch, workers=workers, kind="process")
    return bench_e2e.row_decode(args)["images_per_s"]


def pcie_ceiling(gpus: int, batch: int, iters: int = 50) -> float | None:
    """GB/s of pinned host-to-device copies of a batch's uint8 pixels, on ``gpus`` GPUs at once (one thread each)."""
    try:
        import torch
    except ImportError:
        return None
    if torch.cuda.device_count() < gpus:
        return None
    nbytes = batch * 299 * 299 * 3
    srcs = [torch.empty(nbytes, dtype=torch.uint8).pin_memory() for _ in range(gpus)]
    dsts = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{g}") for g in range(gpus)]

    def copy(g: int) -> None:
        with torch.cuda.device(g):
            for _ in range(iters):
                dsts[g].copy_(srcs[g], non_blocking=True)
            torch.cuda.synchronize(g)

    for g in range(gpus):  # warm-up
        copy(g)
    threads = [threading.Thread(target=copy, args=(g,)) for g in range(gpus)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return gpus * iters * nbytes / (time.perf_counter() - t0) / 1e9


# -------------------------------------------------------------------------------------------------------- driver

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="folder of JPEGs (default: make --images of them, cached)")
    ap.add_argument("--images", type=int, default=16384)
    ap.add_argument("--small", type=int, default=1024, help="images of the short run that measures the fixed cost")
    ap.add_argument("--gpus", default="1,2")
    ap.add_argument("--precisions", default="fp16,fp32")
    ap.add_argument("--decodes", default="cpu,gpu")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--batch-size", type=int, default=64, help="inception-run's default on the GPU")
    ap.add_argument("--backend", default="cuda", help="cpu: a smoke test of the script without a GPU")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", help="write every measurement here")
    args = ap.parse_args()

    import bench_e2e

    gpu_counts = [int(g) for g in args.gpus.split(",")]
    t0 = time.perf_counter()
    folder = Path(args.dir) if args.dir else bench_e2e.jpeg_folder(args.images)
    n = len(list(folder.glob("*.jpg")))
    print(f"{n} JPEGs in {folder} ({time.perf_counter() - t0:.1f} s); {os.cpu_count()} CPUs", flush=True)
    result: dict = {"images": n, "small": args.small, "batch": args.batch_size, "cpus": os.cpu_count(), "rows": [],
                    "ceilings": {}}
    with tempfile.TemporaryDirectory() as wdir:
        weights = bench_e2e.synthetic_weights_file(wdir)
        ceil = result["ceilings"]
        for precision in args.precisions.split(","):
            t0 = time.perf_counter()
            ceil[f"forward_{precision}"] = warm_and_forward(weights, args.backend, precision, args.batch_size)
            print(f"tuned {precision} ({time.perf_counter() - t0:.0f} s): {ceil[f'forward_{precision}']}",
                  flush=True)
        for g in gpu_counts:
            share = max(1, (os.cpu_count() or 1) // g)
            ceil[f"decode_{share}_processes"] = decode_ceiling(folder, share, args.batch_size)
            ceil[f"pcie_{g}_gpus_gb_s"] = pcie_ceiling(g, args.batch_size) if args.backend == "cuda" else None
        print(f"ceilings: {json.dumps(ceil)}", flush=True)
        save(result, args.json)

        plans = [(p, d, g, False) for p in args.precisions.split(",") for d in args.decodes.split(",")
                 for g in gpu_counts]
        if not args.no_ray:
            plans += [(p, "cpu", g, True) for p in args.precisions.split(",") for g in gpu_counts]
        ray_warmed = False
        for precision, decode, g, ray in plans:
            # one GPU without Ray is the plain run (inception-run refuses --gpus 1 where there is no GPU, and the
            # cpu-backend smoke run has none)
            gpus = ["--gpus", str(g)] if ray or g > 1 else []
            opts = ["--weights", weights, "--backend", args.backend, "--precision", precision, "--batch-size",
                    str(args.batch_size), *gpus] + ([] if ray else ["--decode", decode])
            label = f"{'ray' if ray else 'inception-run'} {precision} decode {decode} gpus {g}"
            try:
                # the first row of each kind warms up (a Ray start is ~25 s: once is enough for its caches)
                row = measure_row(folder, n, args.small, opts, ray, args.repeats, warm=not ray or not ray_warmed)
                ray_warmed |= ray
            except Exception as e:  # one row failing (a missing wheel, say) leaves the others to run
                print(f"{label}: FAILED {e}", flush=True)
                result["rows"].append({"label": label, "error": str(e)})
                continue
            row.update(label=label, precision=precision, decode=decode, gpus=g, ray=ray)
            result["rows"].append(row)
            print(f"{label}: {row['images_per_s_steady']:.0f} images/s steady, {row['images_per_s_wall']:.0f} "
                  f"wall, fixed {row['fixed_s']:.1f} s", flush=True)
            save(result, args.json)  # after every row: a run cut short by its time limit keeps what it measured
    report(result)


def save(result: dict, path: str | None) -> None:
    if path:
        tmp = Path(path).with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(path)


def report(result: dict) -> None:
    rows = [r for r in result["rows"] if "error" not in r]
    one = {(r["precision"], r["decode"], r["ray"]): r for r in rows if r["gpus"] == 1}
    ref = {(r["precision"], r["decode"]): r for r in rows if r["gpus"] == 1 and not r["ray"]}
    n = result["small"]
    print(f"\n{result['images']} JPEGs, batch {result['batch']}, {result['cpus']} CPUs; steady = (N - {n}) / (t_N - "
          f"t_{n}), wall = N / t_N; efficiency = steady / (GPUs x 1-GPU steady)")
    print(f"{'path':14} {'prec':5} {'decode':6} {'GPUs':>4} {'steady/s':>9} {'wall/s':>8} {'fixed s':>8} "
          f"{'effic.':>7} {'top-1 vs 1 GPU':>15}")
    for r in rows:
        base = one.get((r["precision"], r["decode"], r["ray"]))
        eff = r["images_per_s_steady"] / (r["gpus"] * base["images_per_s_steady"]) if base else float("nan")
        check = ref.get((r["precision"], r["decode"]))
        agree = "-"
        if check is not None:
            same = sum(check["top1"].get(k) == v for k, v in r["top1"].items())
            agree = f"{same}/{len(check['top1'])}"
        print(f"{'ray' if r['ray'] else 'inception-run':14} {r['precision']:5} {r['decode']:6} {r['gpus']:>4} "
              f"{r['images_per_s_steady']:9.0f} {r['images_per_s_wall']:8.0f} {r['fixed_s']:8.1f} {eff:7.2f} "
              f"{agree:>15}")
    for r in result["rows"]:
        if "error" in r:
            print(f"{r['label']}: FAILED {r['error']}")
    ceil = result["ceilings"]
    for k, v in ceil.items():
        if k.startswith("forward_") and "forward_ms" in v:
            print(f"ceiling: forward alone {k[8:]}, one GPU, batch {result['batch']}: {v['forward_ms']:.2f} ms = "
                  f"{result['batch'] / v['forward_ms'] * 1e3:.0f} images/s per GPU")
        elif k.startswith("decode_"):
            print(f"ceiling: decode alone, {k.split('_')[1]} processes: {v:.0f} images/s")
        elif k.startswith("pcie_") and v is not None:
            per_image = 299 * 299 * 3 / 1e9
            print(f"ceiling: pinned H2D copies on {k.split('_')[1]} GPUs at once: {v:.1f} GB/s = "
                  f"{v / per_image:.0f} images/s of uint8 pixels")


if __name__ == "__main__":
    main()
