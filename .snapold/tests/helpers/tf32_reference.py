"""What an ideal TF32 network computes: every convolution's operands rounded to TF32 (10 mantissa bits, round to
nearest, ties away, as cvt.rna.tf32.f32 does), products summed in float64, everything else float64.

A TF32 kernel cannot be closer to float64 than this (its fp32 sums only add error), so the GPU tests hold our tf32
kernels to a small multiple of this ideal's own error on the same input. On the synthetic model with image-like
inputs that ideal is ~3e-2 from float64 (the calibrated O(1) logits amplify per-layer rounding ~50x; fp32 shows the
same amplification, 1.6e-7 -> 1.8e-5), on N(0, 1) inputs ~7e-4.
"""

from __future__ import annotations

import numpy as np

from inception_engine.backends.numpy_primitives import conv2d_bias_relu, fc
from inception_engine.synthetic import walk
from inception_engine.weights import Weights


def tf32_round(a: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


def tf32_forward(weights: Weights, x: np.ndarray) -> np.ndarray:
    params = {k: v.astype(np.float64) for k, v in weights.arrays.items()}

    def conv(layer, a):
        w, b = tf32_round(params[layer.name + ".weight"]), params[layer.name + ".bias"]
        return conv2d_bias_relu(tf32_round(a), w, b, layer.stride, layer.pad)

    def linear(layer, a):  # the fc runs in tf32 too at batch > 1 (as a 1x1 GEMM); round its operands as well
        return fc(tf32_round(a.reshape(a.shape[0], -1)), tf32_round(params[layer.name + ".weight"]),
                  params[layer.name + ".bias"])

    return walk(x.astype(np.float64), conv, linear, weights.count_include_pad)
