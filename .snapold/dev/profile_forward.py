"""One eager forward of the cuda backend (no CUDA graph, one stream), for a profiler to attach to:

    ncu --set full -k regex:conv_nhwc --launch-count 6 python3 dev/profile_forward.py --precision fp16 --batch 128

Prints each launch of the forward in order (op, kernel, grid), so a profiler's kernel index maps back to a layer.
--weights FILE runs that weight file (int8 needs a calibrated one: dev/make_calibrated_weights.py); --tuned takes each
conv's config from the tuning cache (inception-tune), as inception-bench's forward does, so that a batch-1 profile
lists the kernels of the forward a user times:

    ncu --clock-control none --metrics gpu__time_duration.sum --csv python3 dev/profile_forward.py \
        --precision int8 --weights W8.npz --batch 1 --tuned > ncu.csv

--critical-path ncu.csv (the same options, no profiler) reads those durations back and prints, per op, its kernels'
time, and the concurrent graph's critical path: each stage's ops on their streams (schedule.py), an op starting
when its stream's previous op and the ops it waits for have ended, a stage when the one before it has. The sum of
durations along that path is the forward's time without launch gaps.
--tile NAME puts every conv of the NHWC path (fp16, tf32) on that conv_nhwc_*.cu tile (w256x192: the wgmma tile,
256x192: the mma.sync one), split-K as the cost model picks it for the tile, so that one layer can be profiled on
each tile in turn.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from inception_engine import cuda_build
from inception_engine.backends import cuda as cb
from inception_engine.backends.cuda.schedule import schedule
from inception_engine.model_files import load_weights
from inception_engine.plan import build_plan, fused_plan


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--precision", default="fp16", choices=("fp32", "tf32", "fp16", "int8"))
    p.add_argument("--weights", help="an engine weight file (default: He-initialised random weights)")
    p.add_argument("--tuned", action="store_true", help="configs from the tuning cache, as inception-bench's")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--tile", help="NHWC tile for every conv, e.g. w128x128 (wgmma) or 128x64 (mma.sync)")
    p.add_argument("--critical-path", type=Path, metavar="CSV", help="ncu's CSV of gpu__time_duration of this forward")
    args = p.parse_args()
    weights = load_weights(args.weights) if args.weights else cb.he_weights(0)
    if args.tile and args.tuned:
        p.error("--tile and --tuned each choose the configs: give one")
    plan = build_plan(args.batch, weights.layers())
    configs = None
    if args.tile:
        gpu = cb.Gpu()
        num_sms, wgmma = gpu.num_sms, cuda_build.has_wgmma(gpu.arch)
        gpu.release()
        tiles = {cb.tile_label(t): t for t in cb.NHWC_ELEMS[args.precision].tiles(wgmma)}
        if args.tile not in tiles:
            p.error(f"--tile {args.tile}: this GPU's {args.precision} tiles are {', '.join(tiles)}")
        plan = fused_plan(args.batch, weights.layers(), max_pools=cb.folds_max_pools(args.precision))
        configs = cb.choose_configs(plan, num_sms, False, args.precision, False, (tiles[args.tile],), nhwc=True,
                                    wgmma=wgmma)
    x = np.random.default_rng(1).standard_normal(plan.input.dims).astype(np.float32)
    tune = "cached" if args.tuned else False
    with cb.CudaBackend(weights, plan, graph=False, concurrent=False, precision=args.precision,
                        configs=configs, tune=tune) as backend:
        if args.critical_path:
            specs = backend.specs
        else:
            for i, s in enumerate(backend.specs):
                print(f"{i:4d} {s.op:28s} {s.kernel:30s} grid {s.grid}")
            backend.forward(x)
            return
    # the concurrent graph's plan (its stages and streams), as inception-bench runs it
    with cb.CudaBackend(weights, plan, precision=args.precision, configs=configs, tune=tune) as graph:
        concurrent_plan = graph.plan
        print(f"configs: the eager forward's from the {backend.tuning_source}, "
              f"the graph's from the {graph.tuning_source}")
    print_critical_path(specs, ncu_durations(args.critical_path), concurrent_plan)


def ncu_durations(path: Path) -> list[tuple[str, float]]:
    """(kernel, microseconds) of each launch ncu timed, in launch order."""
    rows = list(csv.reader(line for line in path.read_text().splitlines() if line.startswith('"')))
    head = rows[0]
    name, value, unit = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
    return [(r[name], float(r[value].replace(",", "")) * scale[r[unit]]) for r in rows[1:] if len(r) > value]


def critical_path(plan, per_op: dict[str, float]) -> tuple[list[int], float]:
    """The concurrent graph's critical path through ``plan``'s stages and streams (schedule.py), each op taking
    ``per_op[name]``: the ops on it in order (indices into plan.ops) and its length. An op starts when its stream's
    previous op and the ops it waits for have ended, a stage's first ops when the stage before it has."""
    sched = schedule(plan)
    end: dict[int, float] = {}
    came_from: dict[int, int | None] = {}  # op -> the op it waited for last (the path backwards)
    stage_start, stage_first, stage_last, tails = 0.0, 0, None, {}
    for i, op in enumerate(plan.ops):
        if i and plan.stages[i] != plan.stages[i - 1]:
            stage_last = max(range(stage_first, i), key=lambda j: end[j])
            stage_start, stage_first, tails = end[stage_last], i, {}
        before = [(stage_start, stage_last)] + [(end[j], j) for j in sched[i].waits]
        if sched[i].stream in tails:
            before.append((end[tails[sched[i].stream]], tails[sched[i].stream]))
        start, came_from[i] = max(before, key=lambda t: t[0])
        end[i] = start + per_op.get(op.name, 0.0)
        tails[sched[i].stream] = i
    last = max(end, key=lambda j: end[j])
    path: list[int] = []
    j: int | None = last
    while j is not None:
        path.append(j)
        j = came_from[j]
    return path[::-1], end[last]


def print_critical_path(specs, durations: list[tuple[str, float]], plan) -> None:
    """Per op on the concurrent graph's critical path its kernels' time (``durations``, ncu's, in launch order)."""
    timed = durations[-len(specs):]  # the forward's launches are the last ones (any before belong to the set-up)
    if len(timed) < len(specs) or any(s.kernel != k for s, (k, _) in zip(specs, timed)):
        raise SystemExit(f"the CSV's last {len(specs)} kernels are not this forward's launches")
    per_op: dict[str, float] = defaultdict(float)
    kernels: dict[str, int] = defaultdict(int)
    for s, (_, us) in zip(specs, timed):
        per_op[s.op] += us
        kernels[s.op] += 1
    path, length = critical_path(plan, per_op)
    total = sum(us for _, us in timed)
    print(f"{len(specs)} launches, {total:.1f} us in all; critical path {length:.1f} us through {len(path)} ops, "
          f"{sum(kernels[plan.ops[j].name] for j in path)} kernels")
    for j in path:
        name = plan.ops[j].name
        print(f"  {per_op.get(name, 0.0):7.1f} us {kernels[name]:2d} kernel(s)  {name}")


if __name__ == "__main__":
    main()
