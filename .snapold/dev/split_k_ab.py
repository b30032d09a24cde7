"""Split-K's cost inside the graph: a forward with its tuned configs against the same configs with K in one slice,
everywhere or only on the critical path (the ops on the graph's longest chain of kernels, each kernel counted one,
profile_forward.critical_path), alternated in one process (median milliseconds of ``CudaBackend.time_forward``, the
graph's replay).

At batch 1 the int8 forward's critical path holds 71 kernels for 50 ops: 21 are split-K reductions
(conv_nhwc_i8_splitk_reduce), each a launch after its conv (`dev/profile_forward.py --critical-path`). Tuning times
each conv alone; this measures whether those slices pay for their extra launch in the concurrent graph.

    python3 dev/split_k_ab.py --precision int8 --weights W8.npz --batch 1 [--rounds 3] [--iters 300]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from inception_engine.backends import cuda as cb
from inception_engine.model_files import load_weights
from inception_engine.plan import build_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_forward import critical_path  # noqa: E402


def one_slice(configs: dict, only: set[str] | None = None) -> dict:
    """The configs with K in one slice wherever a direct conv split it (of the ops in ``only`` where given;
    Winograd's slices are left alone)."""
    out = {}
    for name, c in configs.items():
        if c is None or c.wino or c.splits == 1 or (only is not None and name not in only):
            out[name] = c
        else:
            out[name] = dataclasses.replace(c, splits=1, k_split=c.splits * c.k_split)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", default="int8", choices=("fp32", "tf32", "fp16", "int8"))
    p.add_argument("--weights", help="an engine weight file (int8: a calibrated one)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=300)
    a = p.parse_args()
    weights = load_weights(a.weights) if a.weights else cb.he_weights(0)
    plan = build_plan(a.batch, weights.layers())
    x = np.random.default_rng(1).standard_normal(plan.input.dims).astype(np.float32)
    tuned = cb.CudaBackend(weights, plan, precision=a.precision, tune="cached")
    backends = {"tuned": tuned}
    try:
        configs = tuned.configs
        kernels = Counter(s.op for s in tuned.specs)
        path, length = critical_path(tuned.plan, {op: float(n) for op, n in kernels.items()})
        on_path = {tuned.plan.ops[j].name for j in path}
        print(f"configs from the {tuned.tuning_source}; split convs: "
              f"{sum(1 for c in configs.values() if c is not None and not c.wino and c.splits > 1)}; the critical "
              f"path: {len(path)} ops, {length:.0f} kernels")
        for k, c in (("one slice", one_slice(configs)), ("on path", one_slice(configs, on_path))):
            backends[k] = cb.CudaBackend(weights, plan, precision=a.precision, configs=c)
        times: dict[str, list[float]] = {k: [] for k in backends}
        for _ in range(a.rounds):
            for k, b in backends.items():
                times[k].append(statistics.median(b.time_forward(x, a.iters, 20)))
        outs = {k: b.forward(x) for k, b in backends.items()}
    finally:
        for b in backends.values():
            b.close()
    for k, t in times.items():
        rounds = ", ".join(f"{v:.4f}" for v in t)
        print(f"{k:10s} batch {a.batch}: {rounds} ms (median {statistics.median(t):.4f})")
    for k in ("one slice", "on path"):
        diff = float(np.abs(outs["tuned"] - outs[k]).max())
        print(f"{k}: logits {'identical to the tuned' if diff == 0 else f'differ from the tuned by up to {diff:.3g}'}")


if __name__ == "__main__":
    main()
