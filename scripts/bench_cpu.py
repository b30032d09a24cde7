"""Dev benchmark: the NumPy CPU path against onnxruntime on the same model, side by side in one process.

    python scripts/bench_cpu.py --batch 1 --iters 20
    OPENBLAS_NUM_THREADS=1 python scripts/bench_cpu.py --ort-threads 1     # both on one core

Both run the same random He-initialised Inception-V3 (no download needed); rounds alternate between the two so
that load from other processes hits both alike. Prints median ms per forward and the ratio ours / onnxruntime.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from inception_engine import arch
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.plan import build_plan
from inception_engine.weights import Weights


def he_weights(seed: int) -> Weights:
    """He-normal conv weights (keeps ReLU activations O(1) through 94 layers), small biases."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for key, shape in arch.weight_shapes().items():
        if key.endswith(".weight"):
            fan_in = int(np.prod(shape[1:]))
            arrays[key] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        else:
            arrays[key] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    return Weights(arrays, {"count_include_pad": True})


def onnx_model(weights: Weights) -> bytes:
    """The architecture as an ONNX graph (Conv+Relu, pools, Concat, GlobalAveragePool, Gemm)."""
    nodes, inits = [], []
    for l in weights.layers():
        if isinstance(l, arch.Conv):
            w, b = weights.conv(l.name)
            inits += [numpy_helper.from_array(w, l.name + ".weight"), numpy_helper.from_array(b, l.name + ".bias")]
            ph, pw = l.pad
            nodes.append(helper.make_node("Conv", [l.src, l.name + ".weight", l.name + ".bias"], [l.name + ".pre"],
                                          kernel_shape=list(l.kernel), strides=[l.stride] * 2, pads=[ph, pw, ph, pw]))
            nodes.append(helper.make_node("Relu", [l.name + ".pre"], [l.name]))
        elif isinstance(l, arch.Pool):
            attrs = dict(kernel_shape=[l.kernel] * 2, strides=[l.stride] * 2, pads=[l.pad] * 4)
            if l.kind == "max":
                nodes.append(helper.make_node("MaxPool", [l.src], [l.name], **attrs))
            else:
                nodes.append(helper.make_node("AveragePool", [l.src], [l.name],
                                              count_include_pad=int(l.count_include_pad), **attrs))
        elif isinstance(l, arch.Concat):
            nodes.append(helper.make_node("Concat", list(l.srcs), [l.name], axis=1))
        elif isinstance(l, arch.GlobalAvgPool):
            nodes.append(helper.make_node("GlobalAveragePool", [l.src], [l.name + ".4d"]))
            nodes.append(helper.make_node("Flatten", [l.name + ".4d"], [l.name], axis=1))
        elif isinstance(l, arch.FC):
            inits += [numpy_helper.from_array(weights.arrays[l.name + ".weight"], l.name + ".weight"),
                      numpy_helper.from_array(weights.arrays[l.name + ".bias"], l.name + ".bias")]
            nodes.append(helper.make_node("Gemm", [l.src, l.name + ".weight", l.name + ".bias"], ["logits"],
                                          transB=1))
    graph = helper.make_graph(
        nodes, "inception_v3_random",
        [helper.make_tensor_value_info(arch.INPUT, TensorProto.FLOAT, ["N", 3, arch.INPUT_SIZE, arch.INPUT_SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", arch.NUM_CLASSES])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ort-threads", type=int, default=0, help="onnxruntime intra-op threads (0: its default)")
    args = ap.parse_args()

    weights = he_weights(0)
    x = np.random.default_rng(1).standard_normal((args.batch, 3, arch.INPUT_SIZE, arch.INPUT_SIZE)).astype(np.float32)
    ours = NumpyBackend(weights, build_plan(args.batch, weights.layers()))
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.ort_threads
    sess = ort.InferenceSession(onnx_model(weights), options, providers=["CPUExecutionProvider"])

    ref = sess.run(None, {arch.INPUT: x})[0]
    got = ours.forward(x)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    print(f"batch {args.batch}: relative L2 difference of logits ours vs onnxruntime {err:.2e}")

    def timed(f) -> float:
        t0 = time.perf_counter()
        f()
        return (time.perf_counter() - t0) * 1e3

    for _ in range(args.warmup):
        ours.forward(x)
        sess.run(None, {arch.INPUT: x})
    t_ours, t_ort = [], []
    for _ in range(args.iters):
        t_ours.append(timed(lambda: ours.forward(x)))
        t_ort.append(timed(lambda: sess.run(None, {arch.INPUT: x})))
    m_ours, m_ort = statistics.median(t_ours), statistics.median(t_ort)
    print(f"batch {args.batch}: ours {m_ours:.1f} ms, onnxruntime {m_ort:.1f} ms (median of {args.iters}), "
          f"ratio {m_ours / m_ort:.2f}")


if __name__ == "__main__":
    main()
