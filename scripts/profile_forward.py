"""One eager forward of the cuda backend (no CUDA graph, one stream), for a profiler to attach to:

    ncu --set full -k regex:conv_nhwc --launch-count 6 python3 scripts/profile_forward.py --precision fp16 --batch 128

Prints each launch of the forward in order (op, kernel, grid), so a profiler's kernel index maps back to a layer.
"""

from __future__ import annotations

import argparse

import numpy as np

from inception_engine.backends.cuda_backend import CudaBackend, he_weights
from inception_engine.plan import build_plan


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--precision", default="fp16", choices=("fp32", "tf32", "fp16"))
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()
    weights = he_weights(0)
    plan = build_plan(args.batch, weights.layers())
    x = np.random.default_rng(1).standard_normal(plan.input.dims).astype(np.float32)
    with CudaBackend(weights, plan, graph=False, concurrent=False, precision=args.precision) as backend:
        for i, s in enumerate(backend.specs):
            print(f"{i:4d} {s.op:28s} {s.kernel:30s} grid {s.grid}")
        backend.forward(x)


if __name__ == "__main__":
    main()
