"""The int8 forward as the CUDA backend lays it out, run in NumPy: the fused plan (no average pool moved), the int8
parameters (params.pack_params with Int8Scales: int8 weight rows, the epilogue's bias, multiplier and reciprocal
per output channel) and the scalars the launches take (pool ratios, the global pool's scale, the stem's reciprocal),
each op reading and writing its NHWC views of one int8 arena poisoned with -128. What the GPU kernels compute per op
is int8_reference's arithmetic; here the plumbing around them (which scale goes where, fused parts, concat offsets)
must give int8_reference.forward_int8's tensors exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inception_engine.backends import int8_reference as q8
from inception_engine.backends.cuda.cost_model import ConvConfig
from inception_engine.backends.cuda.int8_scales import Int8Scales
from inception_engine.backends.cuda.params import INT8_PREFIX, int8_rows, pack_params
from inception_engine.backends.cuda.tiles import Tile
from inception_engine.backends.numpy_primitives import conv2d_bias_relu
from inception_engine.calibrate import calibration_record
from inception_engine.errors import WeightsError
from inception_engine.plan import ConvOp, FCOp, GlobalAvgPoolOp, PoolOp, View, fused_plan, writes
from inception_engine.synthetic import image_like_batch
from inception_engine.weights import Weights

from helpers.random_weights import random_arrays

SIZE = 75
SMALL = {"count_include_pad": True, "input": {"size": SIZE, "resize": 86},
         "provenance": {"kind": "other", "source_sha256": None, "calibration": None}}
INT8_TILE = Tile(128, 64, 64, 2, 1.0, INT8_PREFIX, False, 256)  # any int8 tile: pack_params reads its prefix


@pytest.fixture(scope="module")
def calibrated() -> Weights:
    w = Weights(random_arrays(5), json.loads(json.dumps(SMALL)))
    x = image_like_batch(4, seed=3, size=SIZE)
    w.manifest["provenance"]["calibration"] = calibration_record(w, [x], 4, "0" * 64)
    return w


def nhwc(arena: np.ndarray, v: View) -> np.ndarray:
    """The view as an (N, C, H, W) array over the NHWC arena (element (n, c, h, w) at offset + ((n H + h) W + w)
    c_total + c_offset + c), writable."""
    n, ct, h, w = v.shape
    whole = arena[v.offset:v.offset + n * h * w * ct].reshape(n, h, w, ct)
    return whole[..., v.c_offset:v.c_offset + v.channels].transpose(0, 3, 1, 2)


def run_plan(weights: Weights, x: np.ndarray, seen: dict[str, np.ndarray]) -> np.ndarray:
    plan = fused_plan(x.shape[0], weights.layers(), SIZE, max_pools=False, move_pools=False)
    assert not any(isinstance(op, PoolOp) and op.bias for op in plan.ops)
    scales = Int8Scales.of(weights)
    stem = plan.input.buffer
    configs = {op.name: ConvConfig(INT8_TILE, 1, 0, 0.0) if isinstance(op, ConvOp) and op.src.buffer != stem else None
               for op in plan.ops if isinstance(op, (ConvOp, FCOp))}
    params, offsets = pack_params(weights, plan, configs, scales)
    arena = np.full(plan.arena_elems, -128, np.int8)
    features = None
    for op in plan.ops:
        if isinstance(op, ConvOp) and op.src.buffer == stem:  # the stem: float32, quantized at its store
            w, b = weights.conv(op.name)
            y = conv2d_bias_relu(x, w, b, op.stride, op.pad)
            nhwc(arena, op.dst)[...] = np.clip(np.rint(y * scales.inv(op.name)), -127, 127)
        elif isinstance(op, ConvOp):
            cout, cin, (kh, kw) = op.dst.channels, op.src.channels, op.kernel
            rows = params[offsets[op.name + ".weight"]:].view(np.int8)[:cout * kh * kw * 16 * -(-cin // 16)]
            wq = rows.reshape(cout, kh, kw, -1)[..., :cin].transpose(0, 3, 1, 2)
            epi = params[offsets[op.name + ".bias"]:][:3 * cout]
            acc = q8.conv_int32(nhwc(arena, op.src), wq, op.stride, op.pad)
            y = acc.astype(np.float32) * epi[cout:2 * cout, None, None] + epi[:cout, None, None]
            q = np.clip(np.rint(np.maximum(y, 0) * epi[2 * cout:, None, None]), -127, 127).astype(np.int8)
            start = 0
            for part in writes(op):
                nhwc(arena, part)[...] = q[:, start:start + part.channels]
                start += part.channels
        elif isinstance(op, PoolOp):
            src = nhwc(arena, op.src)
            layer = next(l for l in weights.layers() if l.name == op.name)
            pooled = q8.pool_int8(src.copy(), layer)
            ratio = scales.pool_ratio(op)
            if ratio != 1:
                pooled = np.clip(np.rint(pooled.astype(np.float32) * ratio), -127, 127).astype(np.int8)
            nhwc(arena, op.dst)[...] = pooled
        elif isinstance(op, GlobalAvgPoolOp):
            features = nhwc(arena, op.src).astype(np.float32).mean(axis=(2, 3)) * scales.gap_scale(op)
        if isinstance(op, (ConvOp, PoolOp)):  # each layer's output as stored (a fused conv's: its members')
            for name, v in zip(scales.members(op) if isinstance(op, ConvOp) else (op.name,), writes(op)):
                seen[name] = nhwc(arena, v).copy()
    assert features is not None
    return features


def test_the_int8_plan_computes_the_references_tensors(calibrated):
    x = image_like_batch(2, seed=7, size=SIZE)
    want: dict[str, tuple[np.ndarray, float | None]] = {}
    q8.forward_int8(calibrated, x, visit=lambda n, a, s: want.__setitem__(n, (a, s)))
    seen: dict[str, np.ndarray] = {}
    features = run_plan(calibrated, x, seen)
    compared = 0
    for name, got in seen.items():
        if name not in want or want[name][1] is None:
            continue
        ref = want[name][0]
        assert got.shape == ref.shape, name
        diff = np.abs(got.astype(np.int32) - ref)
        # the stem is float32 in both, summed in the same order: its int8 store and everything after agree exactly
        assert diff.max() == 0, (name, int(diff.max()), int((diff > 0).sum()))
        assert (got != -128).all(), name
        compared += 1
    assert compared >= 40
    ref_feat = q8.dequantize(want["Mixed_7c"][0], want["Mixed_7c"][1]).mean(axis=(2, 3))
    np.testing.assert_allclose(features, ref_feat, rtol=1e-5, atol=1e-6)


def test_int8_rows_are_rsc_rows_padded_to_16_channels():
    wq = np.arange(2 * 3 * 1 * 2, dtype=np.int8).reshape(2, 3, 1, 2)
    rows = int8_rows(wq).view(np.int8)
    assert rows.size % 4 == 0 and rows.size >= 2 * 2 * 16
    r = rows[:2 * 2 * 16].reshape(2, 1, 2, 16)
    assert (r[..., :3] == wq.transpose(0, 2, 3, 1)).all() and (r[..., 3:] == 0).all()


def test_a_fused_convs_epilogue_has_each_parts_own_reciprocal(calibrated):
    plan = fused_plan(1, calibrated.layers(), SIZE, max_pools=False, move_pools=False)
    scales = Int8Scales.of(calibrated)
    op = next(op for op in plan.ops if op.name == "Mixed_5b.pointwise")
    assert len(op.members) == 3  # branch1x1 (concat), 5x5_1, 3x3dbl_1: the pool branch's conv stays behind its pool
    epi = scales.conv_epilogue(op, np.zeros(op.dst.channels, np.float32))
    inv = epi[2 * op.dst.channels:]
    widths = [p.channels for p in op.parts]
    assert inv[0] == np.float32(1) / np.float32(scales.store["Mixed_5b"])
    assert inv[widths[0]] == np.float32(1) / np.float32(scales.store[op.members[1]])


def test_int8_needs_the_calibration():
    with pytest.raises(WeightsError, match="--calibrate"):
        Int8Scales.of(Weights(random_arrays(0), json.loads(json.dumps(SMALL))))
