"""Dev benchmark: the NumPy CPU path against onnxruntime on the same model, side by side in one process.

    python dev/bench_cpu.py --batch 1 --iters 20
    python dev/bench_cpu.py --threads 1          # both on one core, timed by CPU time
    python dev/bench_cpu.py --numpy-code         # ours without its C kernels (the fallback)

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
    args = ap.parse_args()
    if args.threads:  # OpenBLAS reads this when it loads, so before NumPy is imported
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)

    import numpy as np
    import onnxruntime as ort

    from inception_engine.backends.numpy_backend import NumpyBackend
    from inception_engine.plan import build_plan
    from inception_engine.synthetic import image_like_batch, synthetic_onnx_model, synthetic_weights

    weights = synthetic_weights(0)
    x = image_like_batch(args.batch, seed=1)
    ours = NumpyBackend(weights, build_plan(args.batch, weights.layers()), threads=args.threads or None,
                        native=False if args.numpy_code else None)
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
