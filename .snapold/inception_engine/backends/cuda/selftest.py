"""The self-test: one forward on He-initialised random weights against the float64 NumPy reference, the command
compute-sanitizer runs on the GPU machine (dev/gpu_machine/gpu_check.sh):

    python -m inception_engine.backends.cuda --selftest [--batch 1] [--graph on|off] [--input-size 299]
        [--precision fp32|tf32|fp16] [--layout auto|nchw|nhwc] [--winograd on|off|auto] [--fuse on|off|auto]
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from ...errors import EngineError
from ...plan import FusedConvOp, build_plan
from ...weights import Weights
from .backend import CudaBackend
from .tiles import PRECISIONS


def he_weights(seed: int, network: str = "torchvision") -> Weights:
    """He-initialised random weights of the real shapes: activations stay O(1) through the 94 ReLU layers.
    network "fid": pytorch-fid's FID Inception (arch.NETWORKS)."""
    from ... import arch

    rng = np.random.default_rng(seed)
    arrays = {}
    for key, shape in arch.weight_shapes(arch.inception_v3(network=network)).items():
        fan_in = int(np.prod(shape[1:])) if key.endswith(".weight") else 0
        scale = math.sqrt(2.0 / fan_in) if fan_in else 0.1
        arrays[key] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return Weights(arrays, {"count_include_pad": network != "fid", "network": network})


def rel_l2(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def top5_agree(got: np.ndarray, ref: np.ndarray) -> bool:
    """Same five classes in the same order, except swaps of classes the float64 reference puts within fp32 noise."""
    gi, ri = np.argsort(-got)[:5], np.argsort(-ref)[:5]
    noise = 1e-4 * np.abs(ref).max()
    return all(a == b or abs(ref[a] - ref[b]) <= noise for a, b in zip(gi, ri))


def top1_agree(got: np.ndarray, ref: np.ndarray, noise: float) -> bool:
    """Same top class, except where the float64 reference puts the two classes within ``noise`` of each other."""
    return bool(ref[np.argmax(got)] >= ref.max() - noise)


# Self-test limits: rel L2 of the logits against float64. TF32 keeps 10 mantissa bits (~5e-4 per layer).
SELFTEST_TOL = {"fp32": 1e-4, "tf32": 3e-3, "fp16": 3e-3}


def selftest(batch: int, graph: bool, input_size: int, seed: int = 0, concurrent: bool | None = None,
             precision: str = "fp32", winograd: bool | None = None, nhwc: bool | None = None,
             fuse: bool | None = None, network: str = "torchvision") -> bool:
    """fp32: rel L2 <= 1e-4 and the same top 5; tf32: rel L2 <= 3e-3 and the same top 1 (a tie within the TF32
    error of the reference's logits excepted)."""
    from ..numpy_backend import NumpyBackend

    weights = he_weights(seed, network)
    plan = build_plan(batch, weights.layers(), input_size=input_size)
    x = np.random.default_rng(seed + 1).standard_normal(plan.input.dims).astype(np.float32)
    with CudaBackend(weights, plan, graph=graph, concurrent=concurrent, precision=precision,
                     winograd=winograd, nhwc=nhwc, fuse=fuse) as backend:
        got, feats = backend.forward(x, features=True)  # the pool's output copied back beside the logits
        fused = sum(isinstance(op, FusedConvOp) for op in backend.plan.ops)
        pools = sum(bool(op.max_pool) for op in backend.plan.conv_ops)
        launches, streams = len(backend.specs), max(1, len(backend._streams))
        wino = sum(1 for c in backend.configs.values() if c is not None and c.wino)
        nhwc = backend.nhwc
    ref, ref_feats = NumpyBackend(weights, plan, dtype=np.float64).forward(x.astype(np.float64), features=True)
    err, tol = rel_l2(got, ref), SELFTEST_TOL[precision]
    feat_err = rel_l2(feats, ref_feats)
    if precision == "fp32":
        what, same = "top-5", all(top5_agree(g, r) for g, r in zip(got, ref))
    else:
        what, same = "top-1", all(top1_agree(g, r, 1e-3 * np.abs(r).max()) for g, r in zip(got, ref))
    ok = bool(np.isfinite(got).all() and np.isfinite(feats).all()) and err <= tol and feat_err <= tol and same
    what_net = ", FID network" if network == "fid" else ""
    print(f"cuda selftest ({precision}{', nhwc' if nhwc else ''}{what_net}): batch {batch}, input {input_size}, "
          f"graph {'on' if graph else 'off'}, {launches} launches on {streams} stream(s), {wino} Winograd convs, "
          f"{fused} fused 1x1 groups, {pools} max pools folded into convs: "
          f"rel L2 {err:.2e} (limit {tol:.0e}), features rel L2 {feat_err:.2e}, "
          f"{what} {'same' if same else 'DIFFERENT'} -> {'PASS' if ok else 'FAIL'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inception_engine.backends.cuda")
    p.add_argument("--selftest", action="store_true", required=True, help="one forward vs the NumPy reference")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--graph", choices=("on", "off"), default="on")
    p.add_argument("--concurrent", choices=("on", "off", "auto"), default="auto",
                   help="branches on several streams (auto: with the graph only)")
    p.add_argument("--input-size", type=int, default=299, help="smaller images make sanitizer runs faster")
    p.add_argument("--precision", default="fp32", help=f"one of {', '.join(PRECISIONS)}")
    p.add_argument("--winograd", choices=("on", "off", "auto"), default="on",
                   help="stride-1 3x3/5x5/1x7/7x1 convs by Winograd (on, the backend's default: every eligible "
                        "conv; auto: where the cost model expects a gain)")
    p.add_argument("--fuse", choices=("on", "off", "auto"), default="auto",
                   help="each module's 1x1 convs as one GEMM (NHWC only; auto: with NHWC)")
    p.add_argument("--layout", choices=("auto", "nchw", "nhwc"), default="auto",
                   help="activations: nhwc = NHWC of the precision's elements (fp32: sm_90a only), nchw = fp32 "
                        "NCHW, auto = the backend's default (nhwc where the GPU allows it)")
    p.add_argument("--network", choices=("torchvision", "fid"), default="torchvision",
                   help="fid: pytorch-fid's FID Inception (pools without padding, a max pool in Mixed_7c, 1008 "
                        "classes)")
    args = p.parse_args(argv)
    concurrent = None if args.concurrent == "auto" else args.concurrent == "on"
    winograd = None if args.winograd == "auto" else args.winograd == "on"
    try:
        return 0 if selftest(args.batch, args.graph == "on", args.input_size, concurrent=concurrent,
                             precision=args.precision, winograd=winograd,
                             nhwc=None if args.layout == "auto" else args.layout == "nhwc",
                             fuse=None if args.fuse == "auto" else args.fuse == "on", network=args.network) else 1
    except EngineError as e:
        print(f"cuda selftest: {e}", file=sys.stderr)
        return 2
