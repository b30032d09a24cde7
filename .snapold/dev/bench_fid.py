"""Issue 52's target: a folder of generated images (256x256 PNGs and/or JPEGs, as generators write them) scored
against precomputed statistics, ``inception-fid`` against pytorch-fid's own command on the same files and GPU.

    python3 dev/bench_fid.py [--images 50000] [--format png|jpeg|both] [--precisions fp32,tf32] [--decode cpu]
                             [--out /tmp/bench-fid] [--json out.json]

On the GPU machine: ``source .whl/gpu-env.sh && source dev/gpu_machine/fid_kit.sh install`` first (pytorch-fid).

Steps, each cached under --work (images and weights are made once and reused by a later run):
1. --images images of 256x256 (deterministic, varied: smooth colour fields of random cell sizes, gradients, noise of
   random strength), and --ref-images others (brighter, other seeds) for the reference statistics;
2. the FID network with random weights (pytorch-fid's weights are a download these machines cannot make):
   scripts/export_pytorch_fid_onnx.py's ``random_fid_module(seed)``, its state dict saved for pytorch-fid, exported
   to ONNX as that script does (torchscript exporter, dynamic batch) and converted to the engine's .npz;
3. the reference statistics: ``inception-fid REF --save-stats stats.npz --precision fp32``;
4. timed, each a fresh process as a user runs it, wall clock from start to exit: ``inception-fid DIR stats.npz
   --weights W --json`` per --precisions and --decode, then pytorch-fid's command line ``python -m pytorch_fid DIR
   stats.npz --device cuda`` (its defaults: batch 50, workers min(8, cores)) through a shim that changes one thing:
   ``pytorch_fid.inception.load_state_dict_from_url``, its download of the FID weights, returns the random state
   dict of step 2 instead; its model, dataloader, resize and FID are its own. PyTorch runs convolutions in TF32 by
   default (torch.backends.cudnn.allow_tf32), and pytorch-fid leaves that alone: the row "pytorch-fid" is what its
   users get; a second row "pytorch-fid-fp32" has TF32 off (the shim sets cudnn.allow_tf32 = False; --no-torch-fp32
   skips it), the reference that our fp32 should match within 1e-4;
5. host memory of each run: peak RSS of its main process (os.wait4) and the peak of its process tree's proportional
   set size (PSS: shared pages split between the processes that map them; sampled every 0.2 s from /proc), and
   ours again on a tenth of the images (a folder of links): flat means the same peak at N/10 and N;
6. with --limits, what bounds the job, in the same run: the forward alone per precision and in fp16 (inception-bench
   at batch 128 on the same weights), and the fixed cost (start-up, the statistics file, the distance): ours on
   FIXED_IMAGES = 2,560 of the images less their forward at its rate. With real weights, more images than the 2,048
   features make the covariance full rank and the distance takes the Cholesky path; a singular one takes an
   eigendecomposition ~1 s slower on a 2-core host. Random weights leave pool channels dead (zero for every image),
   so their covariances are singular whatever the number of images: the fixed cost here is a real job's or more.
   Then the whole job once more under dev/startup_stamps.py, its steps printed (start-up, the decode workers, the
   stream, the statistics, the distance's parts, the exit). A precision's floor is the fixed cost plus the
   images over its forward rate. A forward with fp32's accuracy needs three half-precision tensor-core products a
   product at the least (two 11-bit halves of each operand: hi hi + hi lo + lo hi, as the cuda backend's fp32 does on
   Hopper), so none runs faster than a third of fp16's rate: the job's floor at fp32's accuracy is the fixed cost plus
   3 x images / fp16's rate.

Prints the FIDs, each run's relative difference to pytorch-fid's (and to its fp32 row), the wall-time
ratio and a table; the full stdout/stderr of every run and a JSON summary go under --out.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from startup_stamps import COMMANDS, collapsed, stamps, step_lines

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SIZE = 256
FID_CLI = COMMANDS["fid"]  # inception-fid as `python -c` runs it
# pytorch-fid's own main() with its weight download replaced by the state dict in $BENCH_FID_STATE_DICT (and, with
# BENCH_FID_TORCH_FP32=1, TF32 convolutions off), on this machine's SciPy (scripts/export_pytorch_fid_onnx.py's
# pytorch_fid_on_this_scipy: 0.3.0 calls sqrtm with a keyword SciPy 1.18 removed); nothing else of it is changed
PYTORCH_FID_SHIM = (
    "import os, sys, torch, pytorch_fid.inception as inc, pytorch_fid.fid_score as score\n"
    f"sys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
    "from export_pytorch_fid_onnx import pytorch_fid_on_this_scipy\n"
    "pytorch_fid_on_this_scipy()\n"
    "inc.load_state_dict_from_url = lambda *a, **k: torch.load(os.environ['BENCH_FID_STATE_DICT'], "
    "map_location='cpu', weights_only=True)\n"
    "if os.environ.get('BENCH_FID_TORCH_FP32') == '1':\n"
    "    torch.backends.cudnn.allow_tf32 = False\n"
    "    torch.backends.cuda.matmul.allow_tf32 = False\n"
    "score.main()\n")


def generated(seed: int, bright: float = 1.0) -> np.ndarray:
    """A 256x256 RGB image as a generator might write one: a smooth colour field of a random cell size (4..64
    pixels), a gradient, noise of random strength; ``bright`` scales it (the reference set's shift)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    cells = int(rng.choice([4, 8, 16, 32, 64]))
    coarse = rng.integers(0, 256, (SIZE // cells + 1, SIZE // cells + 1, 3), dtype=np.uint8)
    field_ = np.asarray(Image.fromarray(coarse).resize((SIZE, SIZE), Image.BICUBIC), np.float64)
    ramp = np.linspace(-1, 1, SIZE)
    grad = rng.normal(0, 30, 3) * ramp[:, None, None] + rng.normal(0, 30, 3) * ramp[None, :, None]
    img = (field_ + grad) * bright + rng.normal(0, rng.uniform(0, 8), (SIZE, SIZE, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def image_name(i: int, fmt: str) -> str:
    ext = fmt if fmt != "both" else ("png" if i % 2 == 0 else "jpeg")
    return f"{i:06d}.{'jpg' if ext == 'jpeg' else 'png'}"


def write_image(args: tuple[Path, int, float]) -> None:
    from PIL import Image

    path, seed, bright = args
    img = Image.fromarray(generated(seed, bright))
    if path.suffix == ".jpg":
        img.save(path, quality=90)
    else:
        img.save(path, compress_level=6)  # Pillow's default: what torchvision.utils.save_image writes


def image_folder(work: Path, name: str, n: int, fmt: str, seed0: int, bright: float) -> Path:
    """A folder of n generated images (made once: a '.complete' file marks it)."""
    d = work / f"{name}-{fmt}-{n}"
    if not (d / ".complete").exists():
        d.mkdir(parents=True, exist_ok=True)
        jobs = [(d / image_name(i, fmt), seed0 + i, bright) for i in range(n)]
        t0 = time.perf_counter()
        with ProcessPoolExecutor() as pool:
            list(pool.map(write_image, jobs, chunksize=256))
        (d / ".complete").write_text("ok\n")
        print(f"made {n} images in {d} ({time.perf_counter() - t0:.0f} s, "
              f"{sum(f.stat().st_size for f in d.iterdir()) / n / 1024:.0f} KiB each)", flush=True)
    return d


def subset(d: Path, n: int) -> Path:
    """A folder of links to d's first n images."""
    out = d.parent / f"{d.name}-first{n}"
    if not (out / ".complete").exists():
        out.mkdir(exist_ok=True)
        for f in sorted(p for p in d.iterdir() if not p.name.startswith("."))[:n]:
            if not (out / f.name).exists():
                (out / f.name).symlink_to(f)
        (out / ".complete").write_text("ok\n")
    return out


def export_script():
    """scripts/export_pytorch_fid_onnx.py as a module (scripts/ on sys.path, as when it runs: its onnx_check)."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    return importlib.import_module("export_pytorch_fid_onnx")


def random_weights(work: Path, seed: int) -> tuple[Path, Path]:
    """The FID network with seeded random weights: (pytorch state dict for pytorch-fid, the engine's .npz of its
    ONNX export), made once."""
    pt, npz = work / f"fid-random-{seed}.pt", work / f"fid-random-{seed}.npz"
    if not (pt.exists() and npz.exists()):
        import torch

        from inception_engine.onnx_convert import convert

        script = export_script()
        model = script.random_fid_module(seed)
        onnx = work / f"fid-random-{seed}.onnx"
        x = torch.rand(2, 3, 299, 299) * 2 - 1
        expected = script.export(model, x, onnx, "torchscript", None)
        script.check_export(onnx, x, expected, f"converting {onnx}")
        convert(onnx, npz)
        torch.save(model.state_dict(), pt.with_suffix(".part"))
        pt.with_suffix(".part").replace(pt)
    return pt, npz


@dataclass
class Run:
    """One timed command: wall seconds, peak memory, the FID it printed."""

    label: str
    argv: list[str]
    wall_s: float = 0.0
    rc: int | None = None
    fid: float | None = None
    peak_rss_mib: float = 0.0  # the main process's (os.wait4's ru_maxrss)
    peak_tree_pss_mib: float = 0.0  # the process tree's, sampled
    log: str = ""
    notes: list[str] = field(default_factory=list)


def tree_pss_kib(root: int) -> int:
    """PSS of a process and its descendants, KiB (smaps_rollup's Pss; VmRSS where the kernel has no rollup)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        total += proc_kib(pid)
    return total


def proc_kib(pid: int) -> int:
    for name, key in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            with open(name) as f:
                for line in f:
                    if line.startswith(key):
                        return int(line.split()[1])
        except OSError:
            continue
    return 0


def timed(run: Run, out: Path, env: dict[str, str] | None = None, timeout: float = 1800) -> Run:
    """run.argv in a fresh process (its own session), stdout and stderr to out/LABEL.log: wall time, peaks."""
    log = out / f"{run.label}.log"
    run.log = str(log)
    with open(log, "w") as f:
        f.write(f"$ {' '.join(run.argv)}\n")
        f.flush()
        t0 = time.perf_counter()
        p = subprocess.Popen(run.argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        peak = 0
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, tree_pss_kib(p.pid))
            if time.perf_counter() - t0 > timeout:
                os.killpg(p.pid, signal.SIGKILL)
            time.sleep(0.2)
        run.wall_s = round(time.perf_counter() - t0, 2)
    p.returncode = run.rc = os.waitstatus_to_exitcode(status)
    run.peak_rss_mib = round(usage.ru_maxrss / 1024, 1)
    run.peak_tree_pss_mib = round(peak / 1024, 1)
    run.fid = parse_fid(log.read_text())
    return run


def parse_fid(text: str) -> float | None:
    """The FID a run printed: inception-fid --json's "fid", or pytorch-fid's "FID:  X" line."""
    m = re.search(r'"fid":\s*([-0-9.eE+]+)', text) or re.search(r"^FID:\s+([-0-9.eE+]+)\s*$", text, re.M)
    return float(m.group(1)) if m else None


def ours(label: str, folder: Path, stats: Path, weights: Path, precision: str, decode: str,
         batch: int | None = None) -> Run:
    argv = [sys.executable, "-c", FID_CLI, str(folder), str(stats), "--weights", str(weights), "--json",
            "--precision", precision]
    if decode != "cpu":
        argv += ["--decode", decode]
    if batch is not None:
        argv += ["--batch-size", str(batch)]
    return Run(label, argv)


def pytorch_fid_env(state_dict: Path, fp32: bool) -> dict[str, str]:
    env = dict(os.environ, BENCH_FID_STATE_DICT=str(state_dict))
    if fp32:
        env["BENCH_FID_TORCH_FP32"] = "1"
    return env


def rel(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else abs(a - b) / abs(b)


def table(runs: list[Run], base: Run, ref: Run) -> str:
    """Rows of every run: wall time, the ratio to pytorch-fid's, peak memory, the FID and its relative difference to
    the reference's (pytorch-fid's strict fp32 where it ran, else its default)."""
    lines = [f"| run | wall s | x {base.label} | peak RSS MiB | tree PSS MiB | FID | rel. diff. to {ref.label} |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        whole = not r.label.endswith("tenth")  # the memory check's run scores other images: no ratio, no difference
        ratio = f"{base.wall_s / r.wall_s:.2f}" if r.rc == 0 and r.wall_s and whole else "-"
        fid = f"{r.fid:.6f}" if r.fid is not None else f"failed (rc {r.rc})"
        d = rel(r.fid, ref.fid) if whole else None
        lines.append(f"| {r.label} | {r.wall_s:.2f} | {ratio} | {r.peak_rss_mib:.0f} | {r.peak_tree_pss_mib:.0f} "
                     f"| {fid} | {'-' if d is None else f'{d:.2e}'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=50000, help="images scored (default: %(default)s)")
    ap.add_argument("--ref-images", type=int, default=10000, help="images of the reference statistics")
    ap.add_argument("--format", choices=["png", "jpeg", "both"], default="png",
                    help="how the images are stored (both: alternately) (default: %(default)s)")
    ap.add_argument("--precisions", default="fp32,tf32", help="inception-fid's --precision per run")
    ap.add_argument("--decode", default="cpu", help="inception-fid's --decode per run, comma-separated (gpu: the "
                                                    "FID resizes on the GPU, where the command has --decode)")
    ap.add_argument("--batch-sizes", type=lambda v: [int(b) for b in v.split(",")], default=None, metavar="N,M",
                    help="inception-fid's --batch-size per run (default: its own, 64 on the GPU)")
    ap.add_argument("--device", default="cuda", help="pytorch-fid's --device (default: %(default)s)")
    ap.add_argument("--torch-fp32", action=argparse.BooleanOptionalAction, default=True,
                    help="also pytorch-fid with TF32 off, the strict reference (default: on)")
    ap.add_argument("--no-flat", action="store_true", help="skip ours on a tenth of the images (the memory check)")
    ap.add_argument("--limits", action="store_true", help="also measure what bounds the job (step 6)")
    ap.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-fid-work"), help="images and weights (cached)")
    ap.add_argument("--out", type=Path, default=Path("bench-fid-out"), help="logs and summary.json")
    ap.add_argument("--json", type=Path, help="also write the summary here")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)

    folder = image_folder(args.work, "gen", args.images, args.format, 0, 1.0)
    ref = image_folder(args.work, "ref", args.ref_images, args.format, 10_000_000, 1.15)
    state_dict, weights = random_weights(args.work, args.seed)
    stats = args.work / f"ref-{args.format}-{args.ref_images}-seed{args.seed}.npz"
    if not stats.exists():
        r = timed(Run("ref-stats", [sys.executable, "-c", FID_CLI, str(ref), "--save-stats", str(stats),
                                    "--weights", str(weights), "--precision", "fp32"]), args.out)
        if r.rc != 0 or not stats.exists():
            raise SystemExit(f"error: the reference statistics failed (rc {r.rc}); see {r.log}")
        print(f"reference statistics of {args.ref_images} images: {r.wall_s:.1f} s", flush=True)

    runs = measure(args, folder, stats, weights, state_dict)
    report(args, runs)
    if args.limits:
        job_limits(args, folder, stats, weights, runs)


def measure(args: argparse.Namespace, folder: Path, stats: Path, weights: Path, state_dict: Path) -> list[Run]:
    """Ours per precision and decode, pytorch-fid (and its strict fp32), ours on a tenth of the images."""
    runs = []
    for decode in args.decode.split(","):
        for precision in args.precisions.split(","):
            for batch in args.batch_sizes or [None]:
                label = f"ours-{precision}-{decode}" + (f"-b{batch}" if batch is not None else "")
                runs.append(timed(ours(label, folder, stats, weights, precision, decode, batch), args.out))
                print(f"{runs[-1].label}: {runs[-1].wall_s:.1f} s, FID {runs[-1].fid}", flush=True)
                save_summary(args, runs)
    torch_cli = [sys.executable, "-c", PYTORCH_FID_SHIM, str(folder), str(stats), "--device", args.device]
    for label, fp32 in (("pytorch-fid", False), ("pytorch-fid-fp32", True))[:2 if args.torch_fp32 else 1]:
        runs.append(timed(Run(label, torch_cli), args.out, pytorch_fid_env(state_dict, fp32)))
        print(f"{label}: {runs[-1].wall_s:.1f} s, FID {runs[-1].fid}", flush=True)
        save_summary(args, runs)
    if not args.no_flat:
        first = args.decode.split(",")[0], args.precisions.split(",")[0]
        tenth = subset(folder, max(1, args.images // 10))
        runs.append(timed(ours(f"ours-{first[1]}-{first[0]}-tenth", tenth, stats, weights, first[1], first[0]),
                          args.out))
    return runs


def report(args: argparse.Namespace, runs: list[Run]) -> None:
    base = next(r for r in runs if r.label == "pytorch-fid")
    ref = next((r for r in runs if r.label == "pytorch-fid-fp32"), base)
    print(f"\n{args.images} {args.format} images {SIZE}x{SIZE} against statistics of {args.ref_images}; "
          f"{device_name()}; {os.cpu_count()} cores\n")
    print(table(runs, base, ref))
    for r in runs:
        if r.rc != 0:
            print(f"{r.label} failed (rc {r.rc}): {tail(r.log)}")
    best = min((r for r in runs if r.label.startswith("ours") and not r.label.endswith("tenth") and r.rc == 0),
               key=lambda r: r.wall_s, default=None)
    if best is not None:
        print(f"\nfastest ours: {best.label}, {base.wall_s / best.wall_s:.2f}x pytorch-fid's wall time "
              f"(target >= 10x); FID rel. diff. to {ref.label} {fmt(rel(best.fid, ref.fid))} (target <= 1e-4)")
    for r in runs:
        if r.label.startswith("ours") and not r.label.endswith("tenth") and r.rc == 0:
            print(f"{r.label}: FID {fmt(r.fid)}; rel. diff. to pytorch-fid {fmt(rel(r.fid, base.fid))}"
                  + (f", to pytorch-fid-fp32 {fmt(rel(r.fid, ref.fid))}" if ref is not base else ""))
    tenth = next((r for r in runs if r.label.endswith("tenth")), None)
    whole = next((r for r in runs if tenth is not None and r.label == tenth.label.removesuffix("-tenth")), None)
    if tenth is not None and whole is not None:
        print(f"host memory, {whole.label}: {args.images} images {whole.peak_rss_mib:.0f} MiB RSS / "
              f"{whole.peak_tree_pss_mib:.0f} MiB tree PSS; {args.images // 10} images {tenth.peak_rss_mib:.0f} / "
              f"{tenth.peak_tree_pss_mib:.0f} MiB (flat: the same at both)")
    save_summary(args, runs)
    print(f"\nlogs and summary.json in {args.out}")


FLOOR_BATCH = 128
FIXED_IMAGES = 2560  # > 2,048 features: a full-rank covariance, the distance's Cholesky path (step 6)


def forward_rate(precision: str, weights: Path, out: Path) -> float | None:
    """The forward alone: inception-bench's cuda images/s at batch FLOOR_BATCH on these weights, None if it failed."""
    path = out / f"forward-{precision}.json"
    argv = [sys.executable, "-c", "import sys; sys.argv[0] = 'inception-bench'; from inception_engine.cli import "
            "bench_main; bench_main()", "--backends", "cuda", "--precision", precision, "--batch-sizes",
            str(FLOOR_BATCH), "--iters", "30", "--no-reference", "--weights", str(weights), "--json", str(path)]
    run = timed(Run(f"forward-{precision}", argv), out)
    return cuda_rate(json.loads(path.read_text())) if run.rc == 0 and path.exists() else None


def cuda_rate(report: dict) -> float | None:
    """The cuda row's images/s in an inception-bench --json report (None where it has none: no GPU, a failure)."""
    rows = [r for r in report["rows"] if r["backend"] == "cuda" and r["images_per_s"]]
    return rows[0]["images_per_s"] if rows else None


FP32_AT_BEST = "fp32-accurate, at best"


def floors(images: int, fixed_s: float, rates: dict[str, float | None]) -> dict[str, float]:
    """The job's least wall time per forward: the fixed cost plus the images over the forward's rate; and, from
    fp16's rate, that of an fp32-accurate forward of three fp16 products a product (step 6)."""
    out = {p: fixed_s + images / rate for p, rate in rates.items() if rate}
    if rates.get("fp16"):
        out[FP32_AT_BEST] = fixed_s + 3 * images / rates["fp16"]  # type: ignore[operator]
    return out


def fixed_cost(wall_s: float, images: int, rate: float | None) -> float:
    """The job's cost that does not grow with its images: a run's wall time on ``images`` less their forward at its
    rate alone (the whole wall time where the rate is unknown: an overestimate)."""
    return wall_s - images / rate if rate else wall_s


def job_limits(args: argparse.Namespace, folder: Path, stats: Path, weights: Path, runs: list[Run]) -> None:
    """Step 6: the fixed cost and each precision's forward alone, the floors they set, beside 10x pytorch-fid."""
    base = next(r for r in runs if r.label == "pytorch-fid")
    decode, precision = args.decode.split(",")[0], args.precisions.split(",")[0]
    n = min(FIXED_IMAGES, args.images)
    run = timed(ours(f"ours-{precision}-{decode}-fixed", subset(folder, n), stats, weights, precision, decode),
                args.out)
    rates = {p: forward_rate(p, weights, args.out) for p in dict.fromkeys([*args.precisions.split(","), "fp16"])}
    fixed = fixed_cost(run.wall_s, n, rates.get(precision))
    target = base.wall_s / 10
    print(f"\nwhat bounds the job ({args.images} images; 10x pytorch-fid is {target:.2f} s):")
    print(f"  fixed cost: ours on {n} of the images, {run.wall_s:.2f} s (rc {run.rc}), "
          f"less their {precision} forward alone: {fixed:.2f} s")
    limits = {"target_s": target, "fixed_s": fixed, "fixed_run_s": run.wall_s, "forward_images_per_s": rates,
              "floors_s": floors(args.images, fixed, rates)}
    for p, floor in limits["floors_s"].items():
        how = (f"forward alone {rates[p]:,.0f} images/s at batch {FLOOR_BATCH}" if p in rates
               else "three fp16 products a product, at a third of fp16's rate")
        print(f"  {p}: {how}; job floor {floor:.2f} s = {base.wall_s / floor:.2f}x pytorch-fid at most")
    limits["steps"] = job_steps(folder, stats, weights, precision, decode)
    save_summary(args, runs, limits)


def job_steps(folder: Path, stats: Path, weights: Path, precision: str, decode: str) -> list[list]:
    """The whole job once under dev/startup_stamps.py: its main process's steps (a step repeated back to back as
    one, with its count), printed and returned as [step, start s, end s, thread, count]."""
    args = [str(folder), str(stats), "--weights", str(weights), "--json", "--precision", precision, "--decode",
            decode]
    wall, code, _, procs = stamps(args, "fid")
    main_proc = min(procs, key=lambda p: p["start"]) if procs else None  # the workers' clocks start later
    steps = [list(e) for e in collapsed(main_proc["events"])] if main_proc else []
    workers = sorted(e[1] for p in procs for e in p["events"] if e[0] == "_attach_ring")
    print(f"  where the whole job's time goes (dev/startup_stamps.py --command fid; wall {wall:.2f} s, rc {code}; "
          f"seconds from the start):")
    if steps:
        print("\n".join(step_lines(steps, "    ")))
    if workers:
        print(f"    first decode worker up at {workers[0]:.3f} s")
    return steps


def save_summary(args: argparse.Namespace, runs: list[Run], limits: dict | None = None) -> None:
    """summary.json (and --json) with the runs so far: written after each run, so that a call stopped at its time
    limit still brings back what it measured."""
    summary = {"images": args.images, "ref_images": args.ref_images, "format": args.format, "device": device_name(),
               "cores": os.cpu_count(), "runs": [asdict(r) for r in runs]}
    if limits is not None:
        summary["limits"] = limits
    for path in (args.out / "summary.json", args.json):
        if path is not None:
            tmp = path.with_suffix(".part")
            tmp.write_text(json.dumps(summary, indent=2) + "\n")
            tmp.replace(path)


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3e}" if abs(x) < 1e-2 else f"{x:.6f}"


def tail(log: str, lines: int = 3) -> str:
    return " | ".join(Path(log).read_text().strip().splitlines()[-lines:])


def device_name() -> str:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi"
    r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else "GPU unknown"


if __name__ == "__main__":
    main()
