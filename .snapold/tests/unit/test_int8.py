"""The 8-bit pieces on the CPU: calibration (calibrate.py), its record in the weight file (weights.py) and the
integer-semantics reference (backends/int8_reference.py) the INT8 kernels will be checked against."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine import arch, cli
from inception_engine.backends import int8_reference as q8
from inception_engine.calibrate import AbsHistogram, calibrate_file, calibration_record
from inception_engine.errors import WeightsError
from inception_engine.synthetic import image_like_batch
from inception_engine.weights import (MANIFEST_KEY, Weights, load_weight_file, require_calibration,
                                      save_weights)

from helpers.cli import one_line_error, runner
from helpers.random_weights import random_arrays

SMALL = {"count_include_pad": True, "input": {"size": 75, "resize": 86},
         "provenance": {"kind": "other", "source_sha256": None, "calibration": None}}


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def calibrated() -> Weights:
    w = Weights(random_arrays(3), json.loads(json.dumps(SMALL)))
    x = image_like_batch(6, seed=1, size=75)
    w.manifest["provenance"]["calibration"] = calibration_record(w, [x[:2], x[2:]], 6, "0" * 64)
    return w


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("calib")
    rng = np.random.default_rng(2)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (80, 90, 3), dtype=np.uint8)).save(d / f"p{i}.png")
    return d


def test_quantize_rounds_half_to_even_and_saturates_symmetrically():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 1e9, -1e9], np.float32)
    assert q8.quantize(x, 1.0).tolist() == [0, 2, 2, 0, -2, 126, 127, -127]
    assert q8.requantize(np.array([3, -127], np.int8), 1.0, 2.0).tolist() == [2, -64]  # 1.5 -> 2, -63.5 -> -64


def test_weight_scales_are_max_abs_over_127_per_output_channel():
    w = np.array([[[[1.0, -2.54]]], [[[0.0, 0.0]]]], np.float32)
    s = q8.weight_scales(w)
    assert s.tolist() == pytest.approx([2.54 / 127, 1.0])
    assert q8.quantize_weights(w, s).tolist() == [[[[50, -127]]], [[[0, 0]]]]


def test_int8_conv_is_exact_integer_arithmetic():
    rng = np.random.default_rng(0)
    x = rng.integers(-127, 128, (2, 5, 7, 6)).astype(np.int8)
    w = rng.integers(-127, 128, (4, 5, 3, 2)).astype(np.int8)
    got = q8.conv_int32(x, w, 2, (1, 0))
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (0, 0)))
    want = np.zeros(got.shape, np.int64)
    for i in range(got.shape[2]):
        for j in range(got.shape[3]):
            patch = xp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 2]
            want[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w.astype(np.int64))
    assert got.dtype == np.int32 and np.array_equal(got, want)


def test_pools_on_int8_max_exact_average_rounds_half_to_even():
    x = np.array([[[[1, 2], [3, 4]]]], np.int8)  # window sums with pad 1: corners see 4 of 9 or 4 of 4 elements
    mx = q8.pool_int8(x, arch.Pool("p", "x", "max", 3, 1, 1))
    assert mx.tolist() == [[[[4, 4], [4, 4]]]]
    avg = q8.pool_int8(x, arch.Pool("p", "x", "avg", 2, 2, 0))
    assert avg.tolist() == [[[[2]]]]  # 10 / 4 = 2.5 -> 2 (half to even)
    excl = q8.pool_int8(np.array([[[[1, 2], [2, 2]]]], np.int8), arch.Pool("p", "x", "avg", 3, 1, 1, False))
    assert excl.tolist() == [[[[2, 2], [2, 2]]]]  # 7 / 4 = 1.75 -> 2 everywhere (every window holds all four)


def test_window_sums_are_exact_integers_and_counts_follow_the_padding_rule():
    rng = np.random.default_rng(4)
    acc = rng.integers(-2**26, 2**26, (2, 3, 5, 4)).astype(np.int32)  # sums of 9 reach 2^29.2: float32 would round
    for include in (True, False):
        sums, counts = q8.window_sums(acc, arch.Pool("p", "x", "avg", 3, 1, 1, include))
        padded = np.pad(acc.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        inside = np.pad(np.ones((5, 4), np.int64), 1)
        for i in range(5):
            for j in range(4):
                assert np.array_equal(sums[:, :, i, j], padded[:, :, i:i + 3, j:j + 3].sum(axis=(2, 3)))
                want = 9 if include else inside[i:i + 3, j:j + 3].sum()
                assert np.broadcast_to(counts, sums.shape)[0, 0, i, j] == want


def test_moved_pools_are_the_average_pools_a_lone_1x1_conv_reads_unless_the_file_rounds_them():
    tv, fid = arch.inception_v3(), arch.inception_v3(network="fid")
    ours = {"method": "percentile"}
    moved = q8.moved_pools(tv, ours)
    assert sorted(moved) == sorted(f"{m}.avg_pool" for m in ("Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6b",
                                                             "Mixed_6c", "Mixed_6d", "Mixed_6e", "Mixed_7b",
                                                             "Mixed_7c"))
    assert all(conv.endswith(".branch_pool") for conv in moved.values())
    assert "Mixed_7c.max_pool" not in q8.moved_pools(fid, ours) and len(q8.moved_pools(fid, ours)) == 8
    assert q8.moved_pools(tv, {"method": "qdq:onnxruntime"}) == {}
    assert "Mixed_5b.avg_pool" not in q8.moved_pools(tv, ours, frozenset({"Mixed_5b.branch_pool"}))


def test_a_moved_pool_skips_the_pools_rounding_and_stays_in_integers_until_its_epilogue(calibrated):
    """forward_int8's branch_pool of a moved pool: the conv's exact int32 sums over the pool's int8 input, window
    sums, then the one float32 epilogue; against pooling first, it differs where the pool's rounding mattered, and
    is closer to the float network there."""
    x = image_like_batch(2, seed=5, size=75)
    calib = require_calibration(calibrated)
    seen: dict[str, tuple[np.ndarray, float | None]] = {}
    q8.forward_int8(calibrated, x, visit=lambda n, a, s: seen.__setitem__(n, (a, s)))
    assert "Mixed_5b.avg_pool" not in seen and "Mixed_5b.branch_pool" in seen
    src, s_x = seen["Mixed_5b"]  # the pool's input (the concat before Mixed_5c)
    w, b = calibrated.conv("Mixed_5c.branch_pool")
    s_w = np.asarray(calib["weight_scales"]["Mixed_5c.branch_pool"], np.float32)
    acc = q8.conv_int32(src, q8.quantize_weights(w, s_w), 1, (0, 0)).astype(np.int64)
    sums = np.pad(acc, ((0, 0), (0, 0), (1, 1), (1, 1)))
    sums = sum(sums[:, :, i:i + acc.shape[2], j:j + acc.shape[3]] for i in range(3) for j in range(3))
    mult = (np.float32(s_x) * s_w).reshape(1, -1, 1, 1)
    y = (sums.astype(np.float32) * mult) * (np.float32(1) / np.float32(9)) + b.reshape(1, -1, 1, 1)
    got, s_out = seen["Mixed_5c.branch_pool"]
    assert np.array_equal(got, q8.quantize(np.maximum(y, 0), s_out))
    pooled_first = q8.conv_int32(q8.pool_int8(src, arch.Pool("p", "x", "avg", 3, 1, 1)), q8.quantize_weights(w, s_w),
                                 1, (0, 0))
    first = q8.quantize(q8.conv_epilogue(pooled_first, s_x, s_w, b), s_out)
    exact = np.maximum(sums * np.float64(s_x) * s_w.reshape(1, -1, 1, 1) / 9 + b.reshape(1, -1, 1, 1), 0) / s_out
    differ = got != first
    assert differ.any()
    assert np.abs(got - exact)[differ].mean() < np.abs(first - exact)[differ].mean()


def test_histogram_is_independent_of_how_the_data_is_split():
    rng = np.random.default_rng(1)
    parts = [rng.standard_normal(1000) * s for s in (0.01, 1.0, 50.0)]
    one, many = AbsHistogram(), AbsHistogram()
    one.add(np.concatenate(parts))
    for p in parts:  # the range doubles twice on the way
        many.add(p)
    assert one.exponent == many.exponent and np.array_equal(one.counts, many.counts)
    a = np.abs(np.concatenate(parts))
    width = 2.0 ** one.exponent / 2048
    assert np.percentile(a, 99) <= one.percentile(99) <= np.percentile(a, 99) + 2 * width


def test_calibration_is_deterministic_whatever_the_batches(calibrated):
    x = image_like_batch(6, seed=1, size=75)
    again = calibration_record(calibrated, [x[:1], x[1:4], x[4:]], 6, "0" * 64)
    assert again == require_calibration(calibrated)


def test_a_file_without_calibration_is_refused_in_one_line_naming_the_command(tmp_path):
    path = save_weights(tmp_path / "w.npz", random_arrays(3), SMALL)
    with pytest.raises(WeightsError, match="inception-convert-weights MODEL.onnx --calibrate IMAGE_DIR") as e:
        require_calibration(load_weight_file(path))
    assert "\n" not in str(e.value)


def test_the_calibration_lives_under_the_checksums(calibrated, tmp_path):
    path = save_weights(tmp_path / "w.npz", calibrated.arrays, calibrated.manifest)
    assert require_calibration(load_weight_file(path)) == require_calibration(calibrated)
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    manifest = json.loads(np.load(path)[MANIFEST_KEY][()])
    manifest["provenance"]["calibration"]["activation_scales"]["Mixed_5b"] *= 2
    edited = tmp_path / "edited.npz"
    np.savez(edited, **{k: np.load(path)[k] for k in (n[:-4] for n in members) if k != MANIFEST_KEY},
             **{MANIFEST_KEY: np.array(json.dumps(manifest, sort_keys=True))})
    with pytest.raises(WeightsError, match="provenance fails its checksum"):
        load_weight_file(edited)


def test_int8_logits_follow_fp32_and_concat_branches_share_its_scale(calibrated):
    x = image_like_batch(3, seed=9, size=75)
    seen: dict[str, tuple[str, float | None]] = {}
    got = q8.forward_int8(calibrated, x, visit=lambda n, a, s: seen.__setitem__(n, (a.dtype.name, s)))
    want = q8.float_walk(calibrated, x, lambda n, t: None)
    assert cosine(got, want).min() > 0.995
    assert seen["Conv2d_1a_3x3"] == seen["fc"] == ("float32", None)  # DEFAULT_FLOAT_LAYERS
    for layer in calibrated.layers():
        if isinstance(layer, arch.Concat):
            assert {seen[s] for s in layer.srcs} == {("int8", seen[layer.name][1])}
    all_int8 = q8.forward_int8(calibrated, x, float_layers=frozenset({"fc"}))
    assert not np.array_equal(all_int8, got) and cosine(all_int8, want).min() > 0.99


def test_calibrate_file_records_the_images_and_method(calibrated, photos, tmp_path):
    path = save_weights(tmp_path / "w.npz", calibrated.arrays, SMALL)
    record = calibrate_file(path, photos, count=2)
    stored = require_calibration(load_weight_file(path))
    assert stored == record and stored["images"] == 2 and stored["method"] == "percentile"
    assert stored["parameter"] == 99.99 and len(stored["images_sha256"]) == 64
    assert calibrate_file(path, photos, count=3)["images_sha256"] != stored["images_sha256"]


def test_convert_with_calibrate(synthetic_onnx, photos, tmp_path):
    out = tmp_path / "w.npz"
    r = runner().invoke(cli.convert_cmd, [str(synthetic_onnx()), "-o", str(out), "--calibrate", str(photos),
                                          "--calibration-images", "1"])
    assert r.exit_code == 0, r.output + r.stderr
    assert require_calibration(load_weight_file(out))["images"] == 1
    assert f"8-bit scales from 1 image of {photos}" in r.output  # the line says the file is calibrated
    for where, message in ((tmp_path / "none", "not a directory of calibration images"),
                           (tmp_path, "no image files to calibrate with")):
        r = runner().invoke(cli.convert_cmd, [str(synthetic_onnx()), "-o", str(tmp_path / "x.npz"), "--calibrate",
                                              str(where)])
        assert message in one_line_error(r) and not (tmp_path / "x.npz").exists()


def test_a_calibration_that_fails_leaves_no_file(synthetic_onnx, tmp_path):
    (tmp_path / "bad.png").write_bytes(b"not a png")
    r = runner().invoke(cli.convert_cmd, [str(synthetic_onnx()), "-o", str(tmp_path / "x.npz"), "--calibrate",
                                          str(tmp_path)])
    assert "bad.png" in one_line_error(r) and not (tmp_path / "x.npz").exists()
