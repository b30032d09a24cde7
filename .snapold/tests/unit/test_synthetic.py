"""The synthetic Inception-V3: deterministic, activations O(1) at every convolution on image-like inputs, logits
that spread and a top-1 class that depends on the image; ONNX files written completely."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from inception_engine import arch, synthetic
from inception_engine.backends.numpy_primitives import conv2d_bias_relu
from inception_engine.weights import check_arrays


def test_image_like_batch_is_deterministic_and_image_like():
    a, b = synthetic.image_like_batch(3, seed=5), synthetic.image_like_batch(3, seed=5)
    assert a.shape == (3, 3, 299, 299) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, synthetic.image_like_batch(3, seed=6))
    # ImageNet-normalised pixels in [0, 1]: within [(0 - 0.485) / 0.229, (1 - 0.406) / 0.225]
    assert a.min() >= -2.12 and a.max() <= 2.65
    # smooth: neighbouring pixels differ much less than the image varies
    assert np.abs(np.diff(a, axis=3)).mean() < 0.5 * a.std()


def test_params_are_deterministic():
    first = {k: v.copy() for k, v in synthetic.synthetic_bn_params(0).items()}
    synthetic._calibrated.cache_clear()
    again = synthetic.synthetic_bn_params(0)
    assert sorted(first) == sorted(again)
    for k in first:
        np.testing.assert_array_equal(first[k], again[k], err_msg=k)
    assert not again["fc.weight"].flags.writeable  # the memoised arrays cannot be changed by a caller
    convs = arch.conv_layers()
    assert len(convs) == 94 and len(first) == 5 * 94 + 2
    for c in convs:
        assert first[c.name + ".conv.weight"].shape == (c.out_ch, c.in_ch, *c.kernel)
        assert np.all(first[c.name + ".bn.running_var"] > 0)


def test_synthetic_weights_are_canonical():
    w = synthetic.synthetic_weights(0)
    check_arrays(w.arrays)
    assert all(a.dtype == np.float32 for a in w.arrays.values())
    assert w.manifest["synthetic"] is True and w.manifest["generator_version"] == synthetic.GENERATOR_VERSION
    assert w.count_include_pad is True


def test_activations_are_order_one_and_top1_varies():
    w = synthetic.synthetic_weights(0)
    x = synthetic.image_like_batch(8, seed=1234)  # not the calibration images
    stds, active = {}, {}

    def conv(layer, a):
        y = conv2d_bias_relu(a, *w.conv(layer.name), layer.stride, layer.pad)
        stds[layer.name], active[layer.name] = float(y.std()), float((y > 0).mean())
        return y

    def fc(layer, f):
        return f @ w.arrays["fc.weight"].T + w.arrays["fc.bias"]

    logits = synthetic.walk(x, conv, fc)
    s, a = np.array(list(stds.values())), np.array(list(active.values()))
    spread = logits.std(axis=1)
    top1 = logits.argmax(axis=1)
    print(f"per-conv activation std: min {s.min():.3f} ({min(stds, key=stds.get)}), max {s.max():.3f} "
          f"({max(stds, key=stds.get)}); active fraction {a.min():.2f}..{a.max():.2f}; "
          f"logit std per image {spread.min():.2f}..{spread.max():.2f}; top-1 {top1.tolist()}")
    assert len(stds) == 94
    assert 0.2 <= s.min() and s.max() <= 5.0, (s.min(), s.max())
    assert 0.2 <= a.min() and a.max() <= 0.9, (a.min(), a.max())
    assert np.all((0.3 <= spread) & (spread <= 8.0)), spread
    assert len(set(top1.tolist())) >= 4, top1


@pytest.mark.parametrize("style", ["torchscript", "dynamo"])
def test_written_onnx_is_complete_and_valid(style, synthetic_onnx):
    path = synthetic_onnx(style)
    onnx.checker.check_model(str(path))  # by path, so that the checker finds the external data file
    model = onnx.load(str(path), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == 94 and ops.count("Relu") == 94
    opset = model.opset_import[0].version
    if style == "dynamo":
        assert opset == 18 and ops.count("BatchNormalization") == 94 and "ReduceMean" in ops
        assert ops.count("Concat") == 11 + 4  # E modules nest their 1x3/3x1 pairs
        external = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
        assert external == {path.name + ".data"} and path.with_name(path.name + ".data").is_file()
    else:
        assert opset == 17 and "BatchNormalization" not in ops and "Flatten" in ops and "Identity" in ops
        assert ops.count("Concat") == 11


def test_write_is_atomic_and_leaves_no_temporaries(tmp_path, monkeypatch):
    out = synthetic.write_synthetic_onnx(tmp_path / "m.onnx", style="dynamo")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert out == tmp_path / "m.onnx"

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(onnx, "save_model", fail)
    with pytest.raises(OSError):
        synthetic.write_synthetic_onnx(tmp_path / "n.onnx", style="dynamo")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


def test_style_is_checked():
    with pytest.raises(ValueError, match="style"):
        synthetic.synthetic_onnx_model("keras")
