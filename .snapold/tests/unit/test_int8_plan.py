"""The int8 forward as the CUDA backend lays it out, run in NumPy (helpers/int8_plan.py): the fused plan (the
average pools moved behind their convs, as the 8-bit network computes them, or not, for a quantized ONNX's
calibration), the int8 parameters (params.pack_params with Int8Scales) and the scalars the launches take, each op
reading and writing its NHWC views of one int8 arena poisoned with -128. What the GPU kernels compute per op is
int8_reference's arithmetic; here the plumbing around them (which scale goes where, fused parts, concat offsets)
must give int8_reference.forward_int8's tensors exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inception_engine.backends import int8_reference as q8
from inception_engine.backends.cuda.backend import PRODUCT_ELEMS
from inception_engine.backends.cuda.cost_model import ConvConfig
from inception_engine.backends.cuda.int8_scales import Int8Scales
from inception_engine.backends.cuda.params import INT8_PREFIX, int8_rows, pack_params
from inception_engine.backends.cuda.tiles import Tile
from inception_engine.calibrate import calibration_record
from inception_engine.errors import WeightsError
from inception_engine.plan import ConvOp, FCOp, GlobalAvgPoolOp, PoolOp, fused_plan, writes
from inception_engine.synthetic import image_like_batch
from inception_engine.weights import Weights

from helpers.int8_plan import as_quantized_onnxs, gap_features, raw, run_op, view_of
from helpers.random_weights import random_arrays

SIZE = 75
SMALL = {"count_include_pad": True, "input": {"size": SIZE, "resize": 86},
         "provenance": {"kind": "other", "source_sha256": None, "calibration": None}}
INT8_TILE = Tile(128, 64, 64, 2, 1.0, INT8_PREFIX, False, 256)  # any int8 tile: pack_params reads its prefix


# the FID network (arch.NETWORKS["fid"]): average pools that exclude the padding (counts 4, 6, 9), a max pool in
# front of Mixed_7c's pool-branch conv
FID_SMALL = {**SMALL, "count_include_pad": False, "network": "fid",
             "input": {**SMALL["input"], "mean": [0.5] * 3, "std": [0.5] * 3}}


def calibrate(network: str, manifest: dict) -> Weights:
    w = Weights(random_arrays(5, network), json.loads(json.dumps(manifest)))
    x = image_like_batch(4, seed=3, size=SIZE)
    w.manifest["provenance"]["calibration"] = calibration_record(w, [x], 4, "0" * 64)
    return w


@pytest.fixture(scope="module")
def calibrated() -> Weights:
    return calibrate("torchvision", SMALL)


def run_plan(weights: Weights, x: np.ndarray, seen: dict[str, np.ndarray]) -> np.ndarray:
    scales = Int8Scales.of(weights)
    plan = fused_plan(x.shape[0], weights.layers(), SIZE, max_pools=True, move_pools=bool(scales.moved),
                      product_elems=PRODUCT_ELEMS["int8"])
    assert any(op.max_pool for op in plan.conv_ops)  # MaxPool_3a read by Conv2d_3b
    assert {op.name for op in plan.ops if isinstance(op, PoolOp) and op.bias} == set(scales.moved)
    stem = plan.input.buffer
    configs = {op.name: ConvConfig(INT8_TILE, 1, 0, 0.0) if isinstance(op, ConvOp) and op.src.buffer != stem else None
               for op in plan.ops if isinstance(op, (ConvOp, FCOp))}
    params, offsets = pack_params(weights, plan, configs, scales)
    arena = np.full(plan.arena_elems, -128, np.int8)
    features = None
    for op in plan.ops:
        if isinstance(op, (ConvOp, PoolOp)):  # each layer's output as stored (a fused conv's: its members')
            outs = run_op(op, arena, plan, weights, scales, params, offsets, x)
            names = scales.members(op) if isinstance(op, ConvOp) else (op.bias or op.name,)
            for name, v, out, is_raw in zip(names, writes(op), outs, raw(op)):
                view_of(arena, v, is_raw)[...] = out
                if not is_raw:
                    seen[name] = out
        elif isinstance(op, GlobalAvgPoolOp):
            features = gap_features(op, arena, scales)
    assert features is not None
    return features


@pytest.mark.parametrize("network", ["torchvision", "fid", "qdq"])
def test_the_int8_plan_computes_the_references_tensors(calibrated, network):
    if network == "fid":
        calibrated = calibrate("fid", FID_SMALL)
    if network == "qdq":
        calibrated = as_quantized_onnxs(calibrated)
        assert not Int8Scales.of(calibrated).moved
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
    plan = fused_plan(1, calibrated.layers(), SIZE, max_pools=False, product_elems=PRODUCT_ELEMS["int8"])
    scales = Int8Scales.of(calibrated)
    op = next(op for op in plan.ops if op.name == "Mixed_5b.pointwise")
    # branch1x1 (concat), 5x5_1, 3x3dbl_1, then branch_pool's raw products (int32: 4 bytes a channel)
    assert op.members[-1] == "Mixed_5b.branch_pool" and op.pooled == 1
    assert op.parts[-1].c_total == 4 * op.parts[-1].channels
    epi = scales.conv_epilogue(op, np.zeros(op.dst.channels, np.float32))
    inv = epi[2 * op.dst.channels:]
    widths = [p.channels for p in op.parts]
    assert inv[0] == np.float32(1) / np.float32(scales.store["Mixed_5b"])
    assert inv[widths[0]] == np.float32(1) / np.float32(scales.store[op.members[1]])


def test_int8_needs_the_calibration():
    with pytest.raises(WeightsError, match="--calibrate"):
        Int8Scales.of(Weights(random_arrays(0), json.loads(json.dumps(SMALL))))
