"""The host-decoded FID job of two checkouts, alternated on one machine: each tree's decode workers alone on the
folder (dev/bench_decode_workers.py, as that tree's streaming run decodes), then the whole job (inception-fid on the
folder against a statistics file); wall seconds and FIDs, each run in the tree's own package (PYTHONPATH, its own C
and CUDA builds). The first round of each tree pays its builds: read the later rounds.

    python3 dev/fid_job_ab.py OLD_CHECKOUT FOLDER STATS.npz --weights W.npz [--rounds 2] [--precision fp32]
                              [--batch-size 64]

With dev/bench_fid.py's files (its --images 20000 --ref-images 5000 --format jpeg), in /tmp/bench-fid-work: FOLDER
gen-jpeg-20000, STATS ref-jpeg-5000-seed0.npz, W fid-random-0.npz.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FID = "from inception_engine.fid_command import fid_main; fid_main()"


def run_in(tree: Path, argv: list[str], timeout: float) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    return time.perf_counter() - t0, r


def decode_rate(tree: Path, folder: Path) -> str:
    script = tree / "dev" / "bench_decode_workers.py"
    _, helped = run_in(tree, [str(script), "--help"], 60)
    extra = ["--gpu-resize"] if "--gpu-resize" in helped.stdout else []
    _, r = run_in(tree, [str(script), str(folder), "--slots", "256", *extra], 300)
    return (r.stdout.strip().splitlines() or [f"rc {r.returncode}: {r.stderr.strip()[-300:]}"])[-1]


def fid_job(tree: Path, a: argparse.Namespace) -> tuple[float, str]:
    wall, r = run_in(tree, ["-c", FID, str(a.folder), str(a.stats), "--weights", str(a.weights), "--json",
                            "--precision", a.precision, "--batch-size", str(a.batch_size)], 600)
    try:
        return wall, f"{json.loads(r.stdout)['fid']:.9f}"
    except (ValueError, KeyError):
        return wall, f"rc {r.returncode}: {r.stderr.strip()[-300:]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path, help="the other checkout (e.g. a git archive in .snapold)")
    ap.add_argument("folder", type=Path)
    ap.add_argument("stats", type=Path, help="the reference statistics (.npz)")
    ap.add_argument("--weights", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--batch-size", type=int, default=64)
    a = ap.parse_args()
    trees = {"old": a.old.resolve(), "new": ROOT}
    for r in range(1, a.rounds + 1):
        for label, tree in trees.items():
            print(f"round {r} {label} decode: {decode_rate(tree, a.folder)}", flush=True)
        for label, tree in trees.items():
            wall, fid = fid_job(tree, a)
            print(f"round {r} {label} job: {wall:.2f} s, FID {fid}", flush=True)


if __name__ == "__main__":
    main()
