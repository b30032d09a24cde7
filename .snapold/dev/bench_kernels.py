"""Per-kernel throughput of the CUDA backend next to the GPU's roofline.

    python3 dev/bench_kernels.py [--batch-sizes 1,8,32,128] [--iters 20] [--per-op 1,128] [--json FILE]
        [--precision fp32|tf32] [--winograd auto|on|off]

For every op of the forward (at the --per-op batch sizes): median GPU time of its launches
(CudaBackend.time_layers: CUDA events, the host's launch latency hidden behind gpu_sleep), achieved TFLOP/s
against the precision's peak (fp32 FFMA, or dense TF32 tensor cores) and GB/s against HBM bandwidth, counting the
minimum traffic (each input, weight and output element once). A Winograd conv's TFLOP/s is effective (the direct
convolution's FLOPs over its time, comparable with the other rows and above the FFMA peak where Winograd wins);
"actual" counts the multiply-adds its batched GEMM really does, and "direct ms" is the same layer by the direct
kernel (a second per-op pass with winograd off): the per-layer A/B. Then the whole forward in every mode of MODES
(time_forward: median of --iters, each from an idle GPU; the "direct" mode is the default one with winograd off,
the whole-forward A/B), and last one table of forward times, mode by batch size. --winograd sets the modes that do
not say. Needs a GPU and pycuda.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inception_engine.backends import cuda as cb  # noqa: E402
from inception_engine.plan import ConvOp, FCOp, Op, View, build_plan  # noqa: E402
from inception_engine.weights import Weights  # noqa: E402

# Ways to run the forward: CudaBackend keyword arguments. The first is the backend's default.
# fp32: the NCHW path's FFMA and Winograd kernels (on sm_90a fp32 defaults to NHWC, 3xFP16: inception-bench's cuda
# row, with cuda-nchw beside it).
MODES = {name: {**kw, "nhwc": False} for name, kw in {
    "graph, concurrent, fixup": {"graph": True, "concurrent": True, "fixup": True},
    "graph, concurrent, reduce, direct": {"graph": True, "concurrent": True, "fixup": False, "winograd": False},
    "graph, serial, fixup": {"graph": True, "concurrent": False, "fixup": True},
    "graph, concurrent, reduce": {"graph": True, "concurrent": True, "fixup": False},
    "graph, serial, reduce": {"graph": True, "concurrent": False, "fixup": False},
    "eager, serial, fixup": {"graph": False, "concurrent": False, "fixup": True},
    "eager, concurrent, reduce": {"graph": False, "concurrent": True, "fixup": False},
    "eager, serial, reduce, direct": {"graph": False, "concurrent": False, "fixup": False, "winograd": False},
}.items()}
# tf32 has no _fixup kernels (split-K always reduces in conv_splitk_reduce), so fixup/reduce would be the same run.
TF32_MODES = {
    "tf32 graph, concurrent": {"graph": True, "concurrent": True, "precision": "tf32"},
    "tf32 graph, serial": {"graph": True, "concurrent": False, "precision": "tf32"},
    "tf32 eager, serial": {"graph": False, "concurrent": False, "precision": "tf32"},
    "tf32 eager, concurrent": {"graph": False, "concurrent": True, "precision": "tf32"},
}
F16_MODES = {name.replace("tf32", "fp16"): {**kw, "precision": "fp16"} for name, kw in TF32_MODES.items()}
MODES_OF = {"fp32": MODES, "tf32": TF32_MODES, "fp16": F16_MODES}

# Datasheet peaks: fp32 (non-tensor) FLOP/s and HBM bytes/s. H100 SXM: 67 TFLOP/s, 3.35 TB/s (~3.0 reachable).
PEAKS = {"H200": (67e12, 4.8e12), "H100": (67e12, 3.35e12)}
# Dense TF32 tensor-core FLOP/s (the datasheets' 989 TFLOP/s counts 2:4 sparsity), the same on H100 SXM and H200.
TF32_PEAK = 494e12
F16_PEAK = 989e12  # dense fp16 tensor-core FLOP/s with fp32 accumulation, H100 SXM / H200


def peaks_for(device_name: str, precision: str = "fp32") -> tuple[float, float]:
    flops, hbm = next((peaks for key, peaks in PEAKS.items() if key in device_name), PEAKS["H100"])
    return {"tf32": TF32_PEAK, "fp16": F16_PEAK}.get(precision, flops), hbm


def elems(v: View) -> int:
    n, c, h, w = v.dims
    return n * c * h * w


def work(op: Op, elem: int = 4) -> tuple[int, int]:
    """(flops, minimum bytes moved) of one op, its elements ``elem`` bytes each (fp16: 2)."""
    if isinstance(op, ConvOp):
        weights = op.dst.channels * op.src.channels * op.kernel[0] * op.kernel[1] + op.dst.channels
        return op.flops, elem * (elems(op.src) + weights + elems(op.dst))
    if isinstance(op, FCOp):
        fin, fout, n = op.src.channels, op.dst.channels, op.src.n
        return 2 * n * fin * fout, elem * (fin * fout + fout + elems(op.src) + elems(op.dst))
    return 0, elem * (elems(op.src) + elems(op.dst))


def winograd_flops(op: ConvOp, cfg: cb.ConvConfig) -> int:
    """FLOPs of a Winograd conv's batched GEMM: 2 x nn positions x Cout x Cin x (batch x tiles)."""
    shape = cb.config_shape(op, cfg)
    return 2 * shape.nn * op.dst.channels * op.src.channels * shape.t_total


def describe(op: Op, backend: cb.CudaBackend) -> str:
    cfg = backend.configs.get(op.name)
    if isinstance(op, (ConvOp, FCOp)):
        if cfg is None:
            return "fc_gemv"
        if cfg.wino:
            return f"{op.kernel[0]}x{op.kernel[1]} winograd F{cfg.wino} {cfg.tile.name}"
        k = op.kernel if isinstance(op, ConvOp) else (1, 1)
        return (f"{k[0]}x{k[1]} {'tf32 ' if cfg.tile.prefix == 'conv_tf32' else ''}{cfg.tile.name}"
                + (f" splitK{cfg.splits}" if cfg.splits > 1 else ""))
    return next(s.kernel for s in backend.specs if s.op == op.name)


def bench(weights: Weights, batch: int, iters: int, per_op: bool, peak_flops: float, peak_bytes: float,
          warmup: int = 3, input_size: int = 299, modes: dict[str, dict] = MODES) -> dict:
    plan = build_plan(batch, weights.layers(), concurrent=True, input_size=input_size)
    x = np.random.default_rng(0).standard_normal(plan.input.dims).astype(np.float32)
    forward_ms, launches, rows = {}, {}, []
    for mode, kwargs in modes.items():
        with cb.CudaBackend(weights, plan, **kwargs) as backend:
            forward_ms[mode] = statistics.median(backend.time_forward(x, iters, warmup=warmup))
            launches[mode] = len(backend.specs)
            if per_op and not rows:
                layer_ms = {k: statistics.median(v) for k, v in backend.time_layers(x, iters, warmup).items()}
                wino = {name: c for name, c in backend.configs.items() if c is not None and c.wino}
                direct_ms = {}
                if wino:
                    with cb.CudaBackend(weights, plan, **{**kwargs, "winograd": False}) as direct:
                        direct_ms = {k: statistics.median(v)
                                     for k, v in direct.time_layers(x, iters, warmup, only=set(wino)).items()}
                for op in backend.plan.ops:  # the plan it ran: the NHWC modes fuse each module's 1x1 convs
                    ms = layer_ms[op.name]
                    flops, nbytes = work(op)
                    actual = winograd_flops(op, wino[op.name]) if op.name in wino else flops
                    rows.append({"op": op.name, "kernel": describe(op, backend), "ms": ms,
                                 "tflops": flops / ms / 1e9, "pct_peak": 100 * flops / ms / 1e-3 / peak_flops,
                                 "actual_tflops": actual / ms / 1e9, "direct_ms": direct_ms.get(op.name),
                                 "gbps": nbytes / ms / 1e6, "pct_hbm": 100 * nbytes / ms / 1e-3 / peak_bytes,
                                 "flops": flops, "bytes": nbytes})
    return {"batch": batch, "forward_ms": forward_ms, "launches": launches,
            "sum_of_ops_ms": sum(r["ms"] for r in rows), "flops": plan.flops, "ops": rows}


def table(result: dict) -> str:
    best = min(result["forward_ms"].values())
    lines = [f"batch {result['batch']}: " + ", ".join(f"{m} {ms:.3f} ms ({result['launches'][m]} launches)"
                                                       for m, ms in result["forward_ms"].items())
             + f"; {result['flops'] / best / 1e9:.1f} TFLOP/s overall at best"]
    if result["ops"]:
        lines += [f"per op (first mode, kernels launched one by one): sum {result['sum_of_ops_ms']:.3f} ms",
                  f"{'op':34s} {'kernel':26s} {'ms':>8s} {'TFLOP/s':>8s} {'%peak':>6s} {'GB/s':>8s} {'%hbm':>6s} "
                  f"{'actual':>8s} {'direct ms':>9s}"]
    for r in result["ops"]:
        wino = r["direct_ms"] is not None
        lines.append(f"{r['op']:34s} {r['kernel']:26s} {r['ms']:8.4f} {r['tflops']:8.2f} {r['pct_peak']:6.1f} "
                     f"{r['gbps']:8.1f} {r['pct_hbm']:6.1f}"
                     + (f" {r['actual_tflops']:8.2f} {r['direct_ms']:9.4f}" if wino else ""))
    return "\n".join(lines)


def summary(results: list[dict]) -> str:
    """Forward ms, mode by batch size, then images/s of the best mode and the slowest ops where measured."""
    lines = [f"{'forward ms (median)':28s}" + "".join(f"{'batch ' + str(r['batch']):>12s}" for r in results)]
    for mode in results[0]["forward_ms"]:
        lines.append(f"{mode:28s}" + "".join(f"{r['forward_ms'][mode]:12.3f}" for r in results))
    lines.append(f"{'images/s (best mode)':28s}"
                 + "".join(f"{r['batch'] / min(r['forward_ms'].values()) * 1e3:12.0f}" for r in results))
    for r in results:
        if r["ops"]:
            top = sorted(r["ops"], key=lambda o: -o["ms"])[:5]
            lines.append(f"batch {r['batch']} slowest ops: " + ", ".join(f"{o['op']} {o['ms']:.3f}" for o in top))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1,8,32,128")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--per-op", default="1,128", help="batch sizes that also get the per-op table")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--input-size", type=int, default=299, help="smaller images: a quick smoke run (CI emulator)")
    p.add_argument("--no-graph", action="store_true", help="eager modes only (no CUDA graph, e.g. the emulator)")
    p.add_argument("--precision", choices=sorted(MODES_OF), default="fp32",
                   help="fp32: every mode of MODES; tf32: TF32_MODES")
    p.add_argument("--winograd", choices=("auto", "on", "off"), default="on",
                   help="Winograd for the eligible convs in the modes that do not say (on: all of them, the backend's "
                        "default; auto: the cost model's choice)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    gpu = cb.Gpu()
    name = gpu.device.name()
    gpu.release()
    peak_flops, peak_bytes = peaks_for(name, args.precision)
    print(f"{name}: roofline {peak_flops / 1e12:.0f} TFLOP/s {args.precision}, {peak_bytes / 1e12:.2f} TB/s")
    weights = cb.he_weights(0)  # values do not change the timing
    results = []
    per_op = {int(b) for b in args.per_op.split(",") if b}
    winograd = {"auto": None, "on": True, "off": False}[args.winograd]
    default = {"winograd": winograd}
    modes = {m: {**default, **kw} for m, kw in MODES_OF[args.precision].items() if not (args.no_graph and kw["graph"])}
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        results.append(bench(weights, batch, args.iters, batch in per_op, peak_flops, peak_bytes, args.warmup,
                             args.input_size, modes))
        print(table(results[-1]), flush=True)
    print("\nsummary")
    print(summary(results))
    if args.json:
        args.json.write_text(json.dumps({"device": name, "peak_flops": peak_flops, "peak_bytes": peak_bytes,
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
