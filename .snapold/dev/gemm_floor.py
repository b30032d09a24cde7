"""What the forward's convolutions cost as plain GEMMs in cuBLAS: a measured floor for issue 23's targets.

    python3 dev/gemm_floor.py --precision fp16 --batch 128 [--iters 50] [--json FILE]
    python3 dev/gemm_floor.py --precision int8 --weights CALIBRATED.npz --batch 128

Every conv of the plan the cuda backend runs (plan.fused_plan: each module's 1x1 convs fused into one GEMM, the stem's
max pool MaxPool_3a folded into Conv2d_3b) is an implicit GEMM of M = batch x output pixels, N = output
channels, K = input channels x kernel taps. This script times cuBLAS (through PyTorch: torch.matmul of an (M, K) by a
(K, N) matrix, fp16 operands or TF32 ones; for int8, torch._int_mm, cuBLASLt's s8 x s8 -> s32 GEMM, with K and N
rounded up to its multiples of 8 and B column-major, the layout it runs fastest, writing int32 where ours writes int8)
on each of those shapes, beside the cuda backend's own per-op times (``time_layers``: eager launches, one op at a
time) and its whole forward (the CUDA graph with concurrent branches).
cuBLAS gets the easier job: its A matrix is given, where our kernels gather A from the activations (the im2col is
implicit) and add bias and ReLU on the way out. So the sum of cuBLAS's times, one GEMM after another, is what the convs
would take if each ran as fast as NVIDIA's GEMM library runs that shape; the ops that are no GEMM (pools, the
classifier) are listed at our time.

The chip's compute floor (FLOPs over the measured tensor-core peak, inception-bench's floor) assumes every GEMM at
that peak, and its memory floor every activation through HBM once at the measured copy bandwidth. Each op is bound
by the larger of its two; their sum over the ops, run one after another, is the per-op roofline floor the report
prints beside the forward. Layers with small N or K cannot reach the compute peak in any library; the table shows
by how much each falls short. ``--from-json FILE`` prints the report of a saved run again (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass

import numpy as np

from inception_engine.backends import cuda as cb
from inception_engine.bench import ceilings, gpu_name
from inception_engine.bench_report import PEAK_TFLOPS
from inception_engine.backends.cuda.backend import prepare_plan
from inception_engine.backends.cuda.int8_scales import Int8Scales
from inception_engine.plan import ConvOp, Plan, build_plan
from inception_engine.model_files import load_weights
from inception_engine.weights import Weights


@dataclass
class LayerRow:
    op: str
    m: int
    n: int
    k: int
    gflop: float
    ours_ms: float
    cublas_ms: float | None  # None: no GEMM (a pool, the concat-free glue)


def gemm_shape(op: ConvOp) -> tuple[int, int, int]:
    batch, cout, ho, wo = op.dst.dims
    return batch * ho * wo, cout, op.src.channels * op.kernel[0] * op.kernel[1]


def the_plan(precision: str, batch: int, weights: Weights) -> Plan:
    """The fused plan the cuda backend runs in this precision (int8: the average pools its calibration moves behind
    their convs; weights without one, as our calibration would)."""
    prov = weights.manifest.get("provenance") or {}
    int8 = Int8Scales.of(weights) if precision == "int8" and prov.get("calibration") is not None else None
    return prepare_plan(build_plan(batch, weights.layers()), precision, nhwc=True, concurrent=True, fuse=True,
                        int8=int8)


def ours(precision: str, batch: int, iters: int, weights: Weights) -> tuple[float, dict[str, float], list[ConvOp]]:
    """The forward's median ms, each op's median ms, and the conv ops of the plan the backend ran."""
    plan = the_plan(precision, batch, weights)
    x = np.random.default_rng(1).standard_normal(plan.input.dims).astype(np.float32)
    with cb.CudaBackend(weights, plan, precision=precision, tune=True) as backend:
        backend.forward(x)
        forward = statistics.median(backend.time_forward(x, iters, 5))
        per_op = {k: statistics.median(v) for k, v in backend.time_layers(x, iters, 2).items()}
        convs = list(backend.plan.conv_ops)
    return forward, per_op, convs


def cublas_ms(m: int, n: int, k: int, precision: str, iters: int) -> float:
    import torch

    if precision == "int8":
        k, n = -(-k // 8) * 8, -(-n // 8) * 8
        a = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8)
        b = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8).t()

        def gemm() -> None:
            torch._int_mm(a, b)
    else:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        dtype = torch.float16 if precision == "fp16" else torch.float32
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        c = torch.empty(m, n, device="cuda", dtype=dtype)

        def gemm() -> None:
            torch.matmul(a, b, out=c)
    for _ in range(5):
        gemm()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        gemm()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


ELEM_BYTES = {"tf32": 4, "fp16": 2, "int8": 1}  # NHWC activations: TF32-rounded float32, fp16, int8


def op_floors(precision: str, batch: int, peak_tflops: float, gbs: float,
              weights: Weights | None = None) -> dict[str, tuple[float, float]]:
    """Each op's (compute floor, memory floor) in ms: its FLOPs at the tensor-core peak, and its minimum bytes
    (bench_kernels.work: input, weights and output once) at the copy bandwidth. The plan is the one the cuda backend
    runs (fused 1x1 groups), so the op names match time_layers'."""
    from bench_kernels import work  # this script's neighbour: python3 dev/gemm_floor.py puts dev/ on the path

    plan = the_plan(precision, batch, weights or cb.he_weights(0))
    floors = {}
    for op in plan.ops:  # concats are no ops: their branches write into the concat's buffer
        flops, nbytes = work(op, ELEM_BYTES[precision])
        floors[op.name] = (flops / peak_tflops / 1e9, nbytes / gbs / 1e6)
    return floors


def report(d: dict) -> None:
    """The table and totals of a run (main's measurement, or a JSON it wrote)."""
    precision, rows = d["precision"], [LayerRow(**r) for r in d["rows"]]
    peak, gbs = d["peak_tflops"], d["peak_gbs"]
    floors = op_floors(precision, d["batch"], peak, gbs)
    conv_rows = [r for r in rows if r.cublas_ms is not None]
    ours_conv = sum(r.ours_ms for r in conv_rows)
    cublas_conv = sum(r.cublas_ms or 0.0 for r in conv_rows)
    other = sum(r.ours_ms for r in rows if r.cublas_ms is None)
    compute = sum(c for c, _ in floors.values())
    memory = sum(m for _, m in floors.values())
    serial = sum(max(c, m) for c, m in floors.values())
    forward = d["forward_ms"]
    print(f"{d['device']}, {precision}, batch {d['batch']}, median of {d['iters']}; floors at {peak:.1f} TFLOP/s "
          f"and {gbs:.0f} GB/s")
    print(f"{'op':34} {'M':>8} {'N':>5} {'K':>5} {'GFLOP':>7} {'floor ms':>8} {'ours ms':>8} {'cuBLAS ms':>9} "
          f"{'ours/cuBLAS':>11} {'cuBLAS TFLOP/s':>14}")
    for r in rows:
        f = f"{max(floors[r.op]):8.3f}" if r.op in floors else f"{'':>8}"
        if r.cublas_ms is None:
            print(f"{r.op:34} {'':>8} {'':>5} {'':>5} {'':>7} {f} {r.ours_ms:8.3f}")
            continue
        print(f"{r.op:34} {r.m:8d} {r.n:5d} {r.k:5d} {r.gflop:7.1f} {f} {r.ours_ms:8.3f} {r.cublas_ms:9.3f} "
              f"{r.ours_ms / r.cublas_ms:11.2f} {r.gflop / r.cublas_ms:14.0f}")
    print(f"convs, one after another: ours {ours_conv:.3f} ms, cuBLAS on the same GEMMs {cublas_conv:.3f} ms "
          f"(ours / cuBLAS {ours_conv / cublas_conv:.2f})")
    print(f"other ops (ours): {other:.3f} ms; our whole forward (graph, concurrent branches): {forward:.3f} ms")
    print(f"compute floor: {compute:.3f} ms, 1.5x it = {1.5 * compute:.3f} ms; cuBLAS's convs alone are "
          f"{cublas_conv / compute:.2f}x it")
    print(f"memory floor (every activation through HBM once): {memory:.3f} ms")
    print(f"per-op roofline floor, ops one after another (sum of max(compute, memory)): {serial:.3f} ms, 1.5x it = "
          f"{1.5 * serial:.3f} ms; the forward is {forward / serial:.2f}x it")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="fp16", choices=("tf32", "fp16", "int8"))
    ap.add_argument("--weights", help="a weight file (int8: a calibrated one; default: he_weights(0))")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", help="also write the rows and totals here")
    ap.add_argument("--from-json", help="print the report of a JSON this script wrote (no GPU needed)")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            report(json.load(f))
        return

    if args.precision == "int8" and not args.weights:
        ap.error("int8 needs a calibrated weight file: --weights (dev/make_calibrated_weights.py makes one)")
    weights = load_weights(args.weights) if args.weights else cb.he_weights(0)
    forward, per_op, convs = ours(args.precision, args.batch, args.iters, weights)
    by_name = {op.name: op for op in convs}
    rows = []
    for name, ms in per_op.items():
        op = by_name.get(name)
        if op is None:
            rows.append(LayerRow(name, 0, 0, 0, 0.0, ms, None))
            continue
        m, n, k = gemm_shape(op)
        rows.append(LayerRow(name, m, n, k, op.flops / 1e9, ms, cublas_ms(m, n, k, args.precision, args.iters)))
    tflops, gbs = ceilings(gpu_name())
    d = {"device": gpu_name(), "precision": args.precision, "batch": args.batch, "iters": args.iters,
         "peak_tflops": tflops.get(args.precision, PEAK_TFLOPS[args.precision]), "peak_gbs": gbs,
         "forward_ms": forward, "rows": [asdict(r) for r in rows]}
    report(d)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(d, f, indent=1)


if __name__ == "__main__":
    main()
