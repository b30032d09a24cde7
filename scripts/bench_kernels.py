"""Per-kernel throughput of the CUDA backend next to the GPU's roofline.

    python3 scripts/bench_kernels.py [--batch-sizes 1,8,128] [--iters 20] [--json FILE]

For every op of the forward: median GPU time of its launches (CudaBackend.time_layers: CUDA events, the host's
launch latency hidden behind gpu_sleep), achieved TFLOP/s against the fp32 FFMA peak and GB/s against HBM
bandwidth, counting the minimum traffic (each input, weight and output element once). Then the whole forward:
graph replay and eager launches (time_forward), and the sum of per-op times. Needs a GPU and pycuda.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inception_engine.backends import cuda_backend as cb  # noqa: E402
from inception_engine.plan import ConvOp, FCOp, Op, View, build_plan  # noqa: E402
from inception_engine.weights import Weights  # noqa: E402

# Datasheet peaks: fp32 (non-tensor) FLOP/s and HBM bytes/s. H100 SXM: 67 TFLOP/s, 3.35 TB/s (~3.0 reachable).
PEAKS = {"H200": (67e12, 4.8e12), "H100": (67e12, 3.35e12)}


def peaks_for(device_name: str) -> tuple[float, float]:
    for key, peaks in PEAKS.items():
        if key in device_name:
            return peaks
    return PEAKS["H100"]


def elems(v: View) -> int:
    n, c, h, w = v.dims
    return n * c * h * w


def work(op: Op) -> tuple[int, int]:
    """(flops, minimum bytes moved) of one op."""
    if isinstance(op, ConvOp):
        weights = op.dst.channels * op.src.channels * op.kernel[0] * op.kernel[1] + op.dst.channels
        return op.flops, 4 * (elems(op.src) + weights + elems(op.dst))
    if isinstance(op, FCOp):
        fin, fout, n = op.src.channels, op.dst.channels, op.src.n
        return 2 * n * fin * fout, 4 * (fin * fout + fout + elems(op.src) + elems(op.dst))
    return 0, 4 * (elems(op.src) + elems(op.dst))


def describe(op: Op, backend: cb.CudaBackend) -> str:
    cfg = backend.configs.get(op.name)
    if isinstance(op, (ConvOp, FCOp)):
        if cfg is None:
            return "fc_gemv"
        k = op.kernel if isinstance(op, ConvOp) else (1, 1)
        return f"{k[0]}x{k[1]} {cfg.tile.name}" + (f" splitK{cfg.splits}" if cfg.splits > 1 else "")
    return next(s.kernel for s in backend.specs if s.op == op.name)


def bench(weights: Weights, batch: int, iters: int, peak_flops: float, peak_bytes: float) -> dict:
    plan = build_plan(batch, weights.layers())
    x = np.random.default_rng(0).standard_normal(plan.input.dims).astype(np.float32)
    with cb.CudaBackend(weights, plan, graph=True) as backend:
        graph_ms = statistics.median(backend.time_forward(x, iters, warmup=3))
        layer_ms = {k: statistics.median(v) for k, v in backend.time_layers(x, iters).items()}
        rows = []
        for op in plan.ops:
            ms = layer_ms[op.name]
            flops, nbytes = work(op)
            rows.append({"op": op.name, "kernel": describe(op, backend), "ms": ms,
                         "tflops": flops / ms / 1e9, "pct_fp32": 100 * flops / ms / 1e-3 / peak_flops,
                         "gbps": nbytes / ms / 1e6, "pct_hbm": 100 * nbytes / ms / 1e-3 / peak_bytes,
                         "flops": flops, "bytes": nbytes})
        launches = len(backend.specs)
    with cb.CudaBackend(weights, plan, graph=False) as backend:
        eager_ms = statistics.median(backend.time_forward(x, iters, warmup=3))
    return {"batch": batch, "graph_ms": graph_ms, "eager_ms": eager_ms, "sum_of_ops_ms": sum(layer_ms.values()),
            "launches": launches, "flops": plan.flops, "ops": rows}


def table(result: dict) -> str:
    lines = [f"batch {result['batch']}: forward {result['graph_ms']:.3f} ms (graph), {result['eager_ms']:.3f} ms "
             f"(eager), sum of ops {result['sum_of_ops_ms']:.3f} ms, {result['launches']} launches, "
             f"{result['flops'] / result['graph_ms'] / 1e9:.1f} TFLOP/s overall",
             f"{'op':34s} {'kernel':22s} {'ms':>8s} {'TFLOP/s':>8s} {'%fp32':>6s} {'GB/s':>8s} {'%hbm':>6s}"]
    for r in result["ops"]:
        lines.append(f"{r['op']:34s} {r['kernel']:22s} {r['ms']:8.4f} {r['tflops']:8.2f} {r['pct_fp32']:6.1f} "
                     f"{r['gbps']:8.1f} {r['pct_hbm']:6.1f}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1,8,128")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    gpu = cb.Gpu()
    name = gpu.device.name()
    gpu.release()
    peak_flops, peak_bytes = peaks_for(name)
    print(f"{name}: roofline {peak_flops / 1e12:.0f} TFLOP/s fp32, {peak_bytes / 1e12:.2f} TB/s")
    weights = cb.he_weights(0)  # values do not change the timing
    results = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        results.append(bench(weights, batch, args.iters, peak_flops, peak_bytes))
        print(table(results[-1]), flush=True)
    print("\nsummary")
    for r in results:
        top = sorted(r["ops"], key=lambda o: -o["ms"])[:5]
        print(f"batch {r['batch']:4d}: graph {r['graph_ms']:8.3f} ms, eager {r['eager_ms']:8.3f} ms, "
              f"{r['batch'] / r['graph_ms'] * 1e3:8.0f} img/s; slowest: "
              + ", ".join(f"{o['op']} {o['ms']:.3f}" for o in top))
    if args.json:
        args.json.write_text(json.dumps({"device": name, "peak_flops": peak_flops, "peak_bytes": peak_bytes,
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
