"""What bounds the fp32 (3xFP16) wgmma tile: the same forward with one piece of the tile taken out at a time.

    python3 dev/gpu_machine/fp32_tile_ablation.py [--variants all] [--rounds 2] [--batch 128] [--iters 20]
                                                  [--work .ablation] [--json FILE]

On the GPU machine, from the repo root (``source .whl/gpu-env.sh`` first). Each variant is a copy of this checkout's
package, kernels and build files (TREE) under --work with one edit to cuda_src/conv_nhwc_wgmma.cu; its results are
wrong by design, only its time counts. Every variant runs ``inception-bench --backends cuda --precision fp32
--batch-sizes BATCH --iters ITERS --no-reference`` from its own tree (its own kernels and tuning table), in turn,
--rounds times, with the SM clock and board power sampled while it runs (gpu_clocks.py): a variant that multiplies
stale or zero operands draws less power and may keep a higher clock, which is why the split and load variants below
keep running on real data, one tile in four. A table of medians, with each variant's time against the unchanged
tree's, is printed last.

Variants (VARIANTS): main (unchanged), nodrain (the sums drained once at the end, not every WGMMA_SPLIT_CHUNK
tiles), onewg (A_hi B_hi only: the two cross products' wgmma out), nowg (no wgmma), split1of4 (A's split into
halves, and B's move, for one tile in four: the sets keep real halves of earlier tiles), load1of4 (the copies of
one tile in four: the ring keeps real floats of earlier tiles). An edit whose text is no longer in the file stops
the run and names the variant: update EDITS with the kernel.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import gpu_clocks  # this folder is on sys.path, as `python3 dev/gpu_machine/NAME.py` has it

ROOT = Path(__file__).resolve().parents[2]
KERNEL = "cuda_src/conv_nhwc_wgmma.cu"
TREE = ("inception_engine", "cuda_src", "cpu_src", "pyproject.toml", "setup.py", "README.md")

# variant -> (text in KERNEL, its replacement); main has none.
EDITS: dict[str, tuple[str, str]] = {
    "nodrain": ("constexpr int WGMMA_SPLIT_CHUNK = 4;", "constexpr int WGMMA_SPLIT_CHUNK = 1 << 30;"),
    "onewg": ("E::template wgmma<BN>(dx[mb], a_hi, b_lo, accumulate);\n"
              "                E::template wgmma<BN>(dx[mb], a_lo, b_hi, 1);", "(void)a_lo;"),
    "nowg": ("E::template wgmma<BN>(d[mb], a_hi, b_hi, accumulate);\n"
             "                E::template wgmma<BN>(dx[mb], a_hi, b_lo, accumulate);\n"
             "                E::template wgmma<BN>(dx[mb], a_lo, b_hi, 1);",
             "(void)a_hi; (void)a_lo; (void)b_hi; (void)b_lo;"),
    "split1of4": ("load.split(st, halves + set * S::SIZE);",
                  "if ((chunk_tiles & 3) == 0) load.split(st, halves + set * S::SIZE);"),
    "load1of4": ("cp_async_ring<STAGES, BK, true>(k_begin, k_end, load, multiply, split);",
                 "{\n        int loads = 0;\n"
                 "        cp_async_ring<STAGES, BK, true>(k_begin, k_end, [&](int k, int s) { if ((loads++ & 3) == 0) "
                 "load(k, s); }, multiply, split);\n    }"),
}
VARIANTS = ("main", *EDITS)


@dataclass
class Run:
    variant: str
    ms: float | None
    clocks: str


def make_tree(variant: str, work: Path) -> Path:
    """A copy of what the forward needs of this checkout (TREE: the package, its kernels, its build files; the GPU
    machine's copy of a checkout has no .git to list files with) with the variant's edit."""
    tree = work / variant
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    for name in TREE:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        elif src.is_file():
            shutil.copy2(src, tree / name)
    if variant in EDITS:
        old, new = EDITS[variant]
        kernel = tree / KERNEL
        text = kernel.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"fp32_tile_ablation: variant {variant}: its edit's text is not in {KERNEL} once "
                             f"(found {text.count(old)} times); update EDITS in {Path(__file__).name}")
        kernel.write_text(text.replace(old, new))
    return tree


def build_all(trees: dict[str, Path], work: Path) -> None:
    """Every tree's kernels compiled at once, in parallel (a fp32 selftest at batch 1 builds what the forward
    launches), so that the timed runs do not wait for nvcc one tree after another. A tree that fails says so in
    build_<variant>.log, and its runs then fail on their own."""
    procs = []
    for variant, tree in trees.items():
        log = (work / f"build_{variant}.log").open("w")
        procs.append((log, subprocess.Popen([sys.executable, "-m", "inception_engine.backends.cuda", "--selftest",
                                             "--batch", "1", "--precision", "fp32"], cwd=tree, stdout=log,
                                            stderr=subprocess.STDOUT)))
    for log, proc in procs:
        proc.wait()
        log.close()


BENCH = ("import sys; sys.argv[0] = 'inception-bench'; from inception_engine.cli import bench_main; bench_main()")


def bench(tree: Path, label: str, args: argparse.Namespace) -> Run:
    """One inception-bench run in the tree, its clocks sampled; its median ms from its --json report."""
    report = args.work / f"{label}.json"
    report.unlink(missing_ok=True)
    samples = args.work / f"{label}_clocks.csv"
    command = [sys.executable, "-c", BENCH, "--backends", "cuda", "--precision", "fp32", "--batch-sizes",
               str(args.batch), "--iters", str(args.iters), "--no-reference", "--json", str(report.resolve())]
    with (args.work / f"{label}.log").open("w") as log:
        gpu_clocks.run(samples, command, cwd=tree, output=log)
    rows = json.loads(report.read_text())["rows"] if report.exists() else []
    ms = next((r["median_ms"] for r in rows if r["backend"] == "cuda" and r["median_ms"]), None)
    return Run(label.split("_")[0], ms, gpu_clocks.parse(samples.read_text()).describe())


def table(runs: list[Run]) -> list[str]:
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.variant, []).append(r)
    base = [r.ms for r in by.get("main", []) if r.ms is not None]
    base_ms = statistics.median(base) if base else None
    lines = [f"{'variant':<10} {'ms':>8} {'vs main':>8}  rounds; clocks of the last round"]
    for variant, rs in by.items():
        times = [r.ms for r in rs if r.ms is not None]
        ms = statistics.median(times) if times else None
        vs = f"{(ms / base_ms - 1) * 100:+.1f} %" if ms is not None and base_ms else "-"
        each = " / ".join(f"{t:.2f}" for t in times) or "failed (see its log)"
        lines.append(f"{variant:<10} {ms if ms is not None else float('nan'):8.2f} {vs:>8}  {each}; {rs[-1].clocks}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="The fp32 wgmma tile with one piece taken out at a time, timed.")
    p.add_argument("--variants", default="all", help=f"comma-separated, of: {', '.join(VARIANTS)} (default all)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--work", type=Path, default=ROOT / ".ablation", help="the trees and logs (git-ignored)")
    p.add_argument("--json", type=Path, help="also write the runs here")
    args = p.parse_args(argv)
    variants = VARIANTS if args.variants == "all" else tuple(v.strip() for v in args.variants.split(","))
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    trees = {v: make_tree(v, args.work) for v in variants}
    build_all(trees, args.work)
    runs = [bench(trees[v], f"{v}_{r + 1}", args) for r in range(args.rounds) for v in variants]
    for line in table(runs):
        print(line)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in runs], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
