"""What an ideal fp16-operand network computes: every convolution's operands rounded to IEEE binary16 (round to
nearest, ties to even, subnormals, overflow to infinity: numpy.float16 is that format), products summed in float64,
everything else float64. The kernels of cuda_src/conv_f16.cu cannot be closer to float64 than this (their fp32 sums
only add error), so tests hold them to a tight bound around it, and to a looser one around float64.
"""

from __future__ import annotations

import numpy as np

from inception_engine.backends.numpy_primitives import conv2d_bias_relu, fc
from inception_engine.synthetic import walk
from inception_engine.weights import Weights


def fp16_round(a: np.ndarray) -> np.ndarray:
    """float32 values (as the kernels read them from memory) rounded to fp16, returned as float64."""
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float64)


def fp16_forward(weights: Weights, x: np.ndarray) -> np.ndarray:
    params = {k: v.astype(np.float64) for k, v in weights.arrays.items()}

    def conv(layer, a):
        w, b = fp16_round(params[layer.name + ".weight"]), params[layer.name + ".bias"]
        return conv2d_bias_relu(fp16_round(a), w, b, layer.stride, layer.pad)

    def linear(layer, a):  # the fc runs as a 1x1 GEMM on the tensor cores at batch > 1: fp16 operands as well
        return fc(fp16_round(a.reshape(a.shape[0], -1)), fp16_round(params[layer.name + ".weight"]),
                  params[layer.name + ".bias"])

    return walk(x.astype(np.float64), conv, linear, weights.count_include_pad)
