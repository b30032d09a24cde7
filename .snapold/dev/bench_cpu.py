"""Dev benchmark: the NumPy CPU path against onnxruntime on the same model, side by side in one process.

    python dev/bench_cpu.py --batch 1 --iters 20
    python dev/bench_cpu.py --threads 1          # both on one core, timed by CPU time
    python dev/bench_cpu.py --numpy-code         # ours without its C kernels (the fallback)
    python dev/bench_cpu.py --layers --threads 1 # where our time goes: every op of our forward, slowest first

Both run the synthetic Inception-V3 (inception_engine/synthetic.py; no download): ours from its folded weights,
onnxruntime from its torchscript-style ONNX graph. Timing alternates blocks of forwards between the two (three
rounds), so that load from other processes hits both alike, with a pause before each block: both libraries' idle
threads spin for a while after a call and would otherwise steal a core from the other. Prints the median ms per
forward and the ratio ours / onnxruntime.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable


def op_label(step: object, cpu_kernels) -> tuple[str, float]:
    """(what a step of our forward does, its float ops) for a C kernel call, a pooled conv (a closure over two), or
    any other step (its function name, 0)."""
    if isinstance(step, cpu_kernels.Call):
        p = step.params
        if isinstance(p, cpu_kernels.ConvParams):
            flops = 2.0 * p.images * p.o * p.ho * p.wo * p.c * p.kh * p.kw
            return f"conv {p.c}x{p.h}x{p.w} -> {p.o}x{p.ho}x{p.wo} {p.kh}x{p.kw}/{p.stride}", flops
        return f"{'max' if p.is_max else 'avg'} pool {p.c}x{p.h}x{p.w} {p.kernel}x{p.kernel}/{p.stride}", 0.0
    for cell in getattr(step, "__closure__", None) or ():
        if isinstance(cell.cell_contents, cpu_kernels.Call) and isinstance(cell.cell_contents.params,
                                                                           cpu_kernels.ConvParams):
            label, flops = op_label(cell.cell_contents, cpu_kernels)
            return f"pooled {label}", flops
    return getattr(step, "__name__", type(step).__name__), 0.0


def layer_table(labels: Iterable[tuple[str, float]], ms: Iterable[float]) -> list[tuple[str, int, float, float]]:
    """(label, how many ops, total ms, GFLOP/s) per distinct label, slowest first. The rate counts a direct
    convolution's work, so a Winograd conv shows the speed it is worth against one."""
    rows: dict[str, list[float]] = {}
    for (label, flops), t in zip(labels, ms):
        row = rows.setdefault(label, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += t
        row[2] += flops
    table = [(label, int(n), t, flops / t / 1e6 if t > 0 else 0.0) for label, (n, t, flops) in rows.items()]
    return sorted(table, key=lambda r: -r[2])


def print_layers(ours, x, iters: int, clock: Callable[[], float], cpu_kernels) -> None:
    """Every step of our forward timed alone (median of ``iters``), grouped by what it does."""
    steps = ours._steps
    times: list[list[float]] = [[] for _ in steps]
    ours.forward(x)
    for _ in range(iters):
        ours._input[...] = x
        for i, step in enumerate(steps):
            t0 = clock()
            step()
            times[i].append((clock() - t0) * 1e3)
    table = layer_table((op_label(s, cpu_kernels) for s in steps), (statistics.median(t) for t in times))
    total = sum(r[2] for r in table)
    for label, n, t, gflops in table:
        print(f"{t:8.3f} ms {100 * t / total:5.1f} %  x{n:<2d} {gflops:6.1f} GFLOP/s  {label}")
    print(f"{total:8.3f} ms in all")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for both (0: their defaults); 1 also switches to CPU time, which other jobs' load "
                         "disturbs less than wall time")
    ap.add_argument("--numpy-code", action="store_true",
                    help="run our NumPy code instead of the C kernels (what runs where they cannot be built)")
    ap.add_argument("--layers", action="store_true",
                    help="time every op of our forward instead (median of --iters), slowest first; with --threads 1 "
                         "in CPU time")
    args = ap.parse_args()
    if args.threads:  # OpenBLAS reads this when it loads, so before NumPy is imported
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)

    import numpy as np

    from inception_engine.backends import cpu_kernels
    from inception_engine.backends.numpy_backend import NumpyBackend
    from inception_engine.plan import build_plan
    from inception_engine.synthetic import image_like_batch, synthetic_onnx_model, synthetic_weights

    weights = synthetic_weights(0)
    x = image_like_batch(args.batch, seed=1)
    ours = NumpyBackend(weights, build_plan(args.batch, weights.layers()), threads=args.threads or None,
                        native=False if args.numpy_code else None)
    if args.layers:
        clock = time.thread_time if args.threads == 1 else time.perf_counter
        print_layers(ours, x, args.iters, clock, cpu_kernels)
        return
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(synthetic_onnx_model("torchscript").SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}

    ref = sess.run(None, feed)[0]
    got = ours.forward(x)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    print(f"batch {args.batch}: relative L2 difference of logits ours vs onnxruntime {err:.2e}")

    clock = time.process_time if args.threads == 1 else time.perf_counter

    def timed(f) -> float:
        t0 = clock()
        f()
        return (clock() - t0) * 1e3

    for _ in range(args.warmup):
        ours.forward(x)
        sess.run(None, feed)
    t_ours, t_ort = [], []
    rounds = 3
    for r in range(rounds):
        for times, run in ((t_ours, lambda: ours.forward(x)), (t_ort, lambda: sess.run(None, feed))):
            time.sleep(0.5)
            run()
            times += [timed(run) for _ in range(args.iters * (r + 1) // rounds - args.iters * r // rounds)]
    m_ours, m_ort = statistics.median(t_ours), statistics.median(t_ort)
    kind = "CPU time, 1 thread" if args.threads == 1 else "wall time"
    kind += ", C kernels" if ours.native else ", NumPy code"
    print(f"batch {args.batch}: ours {m_ours:.1f} ms, onnxruntime {m_ort:.1f} ms (median of {args.iters}, {kind}), "
          f"ratio {m_ours / m_ort:.2f}   [OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}]")


if __name__ == "__main__":
    sys.exit(main())
