"""The int8 forward's ops in NumPy, as the CUDA backend lays them out: each op reads its NHWC views of one int8 arena
and the parameters params.pack_params packed (int8 weight rows; a conv's epilogue arrays: bias, multiplier,
reciprocal per output channel), takes the scalars its launch takes (Int8Scales: pool ratios, the global pool's
scale, the stem's reciprocal) and writes its views. What each GPU kernel must compute, exactly, from the same
bytes: the unit test runs the whole plan with it against int8_reference; the device test runs each op on the GPU's
own inputs (an arena that reuses nothing) and compares the GPU's output element for element. A moved pool's
member writes its raw products, int32 (``products``), which the moved pool reads."""

from __future__ import annotations

import json

import numpy as np

from inception_engine import arch
from inception_engine.backends import int8_reference as q8
from inception_engine.backends.cuda.int8_scales import Int8Scales
from inception_engine.backends.numpy_primitives import conv2d_bias_relu
from inception_engine.plan import ConvOp, FusedConvOp, GlobalAvgPoolOp, Plan, PoolOp, View, writes
from inception_engine.weights import Weights


def nhwc(arena: np.ndarray, v: View) -> np.ndarray:
    """The view as an (N, C, H, W) array over the NHWC arena (element (n, c, h, w) at offset + ((n H + h) W + w)
    c_total + c_offset + c), writable."""
    n, ct, h, w = v.shape
    whole = arena[v.offset:v.offset + n * h * w * ct].reshape(n, h, w, ct)
    return whole[..., v.c_offset:v.c_offset + v.channels].transpose(0, 3, 1, 2)


def products(arena: np.ndarray, v: View) -> np.ndarray:
    """A raw product view (plan.fuse_pointwise's product_elems 4: c_total counts bytes) as an (N, C, H, W) int32
    array over the int8 arena, writable."""
    n, ct, h, w = v.shape
    assert v.c_offset == 0 and ct == 4 * v.channels, f"{v.buffer}: not a buffer of int32 products"
    return arena[v.offset:v.offset + n * h * w * ct].view(np.int32).reshape(n, h, w, v.channels).transpose(0, 3, 1, 2)


def raw(op: ConvOp | PoolOp) -> list[bool]:
    """Per view the op writes, whether it holds raw int32 products (a fused conv's last ``pooled`` parts)."""
    views = writes(op)
    pooled = op.pooled if isinstance(op, FusedConvOp) else 0
    return [i >= len(views) - pooled for i in range(len(views))]


def view_of(arena: np.ndarray, v: View, is_raw: bool) -> np.ndarray:
    return products(arena, v) if is_raw else nhwc(arena, v)


def conv_params(op: ConvOp, params: np.ndarray, offsets: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weights (Cout, Cin, kh, kw), float32 epilogue [3 Cout]) of an int8-tile conv, from the packed words."""
    cout, cin, (kh, kw) = op.dst.channels, op.src.channels, op.kernel
    rows = params[offsets[op.name + ".weight"]:].view(np.int8)[:cout * kh * kw * 16 * -(-cin // 16)]
    wq = rows.reshape(cout, kh, kw, -1)[..., :cin].transpose(0, 3, 1, 2)
    return wq, params[offsets[op.name + ".bias"]:][:3 * cout]


def run_op(op: ConvOp | PoolOp, arena: np.ndarray, plan: Plan, weights: Weights, scales: Int8Scales,
           params: np.ndarray, offsets: dict[str, int], x: np.ndarray) -> list[np.ndarray]:
    """One conv or pool of the int8 plan on the arena's current contents: its outputs, one per view it writes."""
    if isinstance(op, ConvOp) and op.src.buffer == plan.input.buffer:  # the stem: float32, quantized at its store
        w, b = weights.conv(op.name)
        y = conv2d_bias_relu(x, w, b, op.stride, op.pad)
        return [np.clip(np.rint(y * scales.inv(op.name)), -127, 127).astype(np.int8)]
    if isinstance(op, ConvOp):
        cout = op.dst.channels
        wq, epi = conv_params(op, params, offsets)
        src = nhwc(arena, op.src)
        if op.max_pool:  # a 1x1 conv that reads through a max pool (exact on int8), of the pool's stride
            src = q8.pool_int8(src.copy(), arch.Pool("pool", "x", "max", op.max_pool, op.stride))
        acc = q8.conv_int32(src, wq, 1 if op.max_pool else op.stride, op.pad)
        y = acc.astype(np.float32) * epi[cout:2 * cout, None, None] + epi[:cout, None, None]
        q = np.clip(np.rint(np.maximum(y, 0) * epi[2 * cout:, None, None]), -127, 127).astype(np.int8)
        starts = np.cumsum([0] + [v.channels for v in writes(op)])
        return [(acc if r else q)[:, a:b] for a, b, r in zip(starts[:-1], starts[1:], raw(op))]
    layer = next(l for l in weights.layers() if l.name == op.name)
    assert isinstance(layer, arch.Pool)
    if op.bias:  # a moved pool: its conv's products, window-summed, then the conv's epilogue
        c = op.dst.channels
        epi = params[offsets[op.bias + ".bias"]:][:3 * c].reshape(3, c, 1, 1)
        sums, counts = q8.window_sums(products(arena, op.src), layer)
        y = (sums.astype(np.float32) * epi[1]) * (np.float32(1) / counts) + epi[0]
        return [np.clip(np.rint(np.maximum(y, 0) * epi[2]), -127, 127).astype(np.int8)]
    pooled = q8.pool_int8(nhwc(arena, op.src).copy(), layer)
    ratio = scales.pool_ratio(op)
    if ratio != 1:
        pooled = np.clip(np.rint(pooled.astype(np.float32) * ratio), -127, 127).astype(np.int8)
    return [pooled]


def gap_features(op: GlobalAvgPoolOp, arena: np.ndarray, scales: Int8Scales) -> np.ndarray:
    """The global average pool's float32 features of the int8 arena (dequantized mean)."""
    return nhwc(arena, op.src).astype(np.float32).mean(axis=(2, 3)) * scales.gap_scale(op)


def as_quantized_onnxs(weights: Weights) -> Weights:
    """The same scales as a quantized ONNX's calibration record (its file rounds each pool's output: no pool moves)."""
    manifest = json.loads(json.dumps(weights.manifest))
    manifest["provenance"]["calibration"].update(method="qdq:test", parameter=None, images=None, images_sha256=None)
    return Weights(weights.arrays, manifest)
