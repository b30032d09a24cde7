"""Every op's time in the tuned CUDA forward, pools and the classifier included, and the forward's median, for A/B
runs of two checkouts on the GPU machine:

    python3 scripts/op_times.py --precision fp16 --batch 128 [--iters 50] [--json FILE]

Runs in whichever inception_engine Python imports first. To time another checkout with it, install that checkout
(`python3 -m pip install --no-deps -e .`, so that its cuda_src is the one compiled: on the GPU machine a bare `pip`
installs for another Python, and every checkout then compiles the same kernels; check with
`python3 -c "from inception_engine import cuda_build; print(cuda_build.source_dir())"`) and run from its folder
`python3 -c "import runpy, sys; sys.argv = ['op_times', ...]; runpy.run_path('PATH/scripts/op_times.py',
run_name='__main__')"`: with -c the current folder comes first on sys.path, where `python3 scripts/op_times.py` would
put this script's folder first and import the checkout on PYTHONPATH instead (docs/PERFORMANCE.md's trap).

The forward is timed in several blocks (--blocks), each block's median printed with the wall-clock time it ended, so
that a log of the GPU's clocks and power (nvidia-smi --query-gpu=... -lms 50) can be read beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from inception_engine.backends import cuda as cb
from inception_engine.plan import fused_plan


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--precision", default="fp16", choices=("fp32", "tf32", "fp16"))
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--blocks", type=int, default=3, help="forward timings of --iters each")
    p.add_argument("--json", help="write the times here")
    args = p.parse_args()
    weights = cb.he_weights(0)
    plan = fused_plan(args.batch, weights.layers())
    x = np.random.default_rng(1).standard_normal(plan.input.dims).astype(np.float32)
    with cb.CudaBackend(weights, plan, precision=args.precision, tune=True) as backend:
        backend.forward(x)
        ops = {k: statistics.median(v) for k, v in backend.time_layers(x, args.iters, 2).items()}
        forward = []
        for _ in range(args.blocks):
            forward.append(statistics.median(backend.time_forward(x, args.iters, 5)))
            print(f"forward {forward[-1]:.3f} ms (median of {args.iters}), ended at {time.time():.2f}", flush=True)
    for name, ms in ops.items():
        print(f"{name:<32}{ms:8.4f}")
    print(f"{'sum of ops':<32}{sum(ops.values()):8.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"precision": args.precision, "batch": args.batch, "forward_ms": forward, "ops_ms": ops}, f)


if __name__ == "__main__":
    main()
