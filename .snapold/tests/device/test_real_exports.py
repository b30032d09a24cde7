"""Real torch.onnx exports of Inception-V3, converted and run by the engine's NumPy reference in float64, against
PyTorch's own float64 forward.

Needs PyTorch (skipped without it); the dynamo exporter also needs onnxscript. The model is torchvision's
``inception_v3`` where torchvision is installed, and in any case the stand-in of tests/helpers/torch_inception.py (same
module names, hyper-parameters and forward), so a machine with torch alone still checks real exporter output.
Both are given random BatchNorm statistics and He-scaled convolutions first (``randomise``): with torchvision's
initial BN (mean 0, var 1, gamma 1, beta 0) a wrong BN fold would go unnoticed.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import inspect
from collections import Counter

import numpy as np
import onnx
import pytest

from inception_engine import onnx_convert, synthetic
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.plan import build_plan
from inception_engine.model_files import load_weights

torch = pytest.importorskip("torch", reason="PyTorch is not installed: no real torch.onnx export to check")


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@functools.cache
def model(source: str, transform_input: bool):
    from helpers.torch_inception import Inception3, randomise

    if source == "torchvision":
        import torchvision

        m = torchvision.models.inception_v3(weights=None, aux_logits=True, init_weights=True,
                                            transform_input=transform_input)
    else:
        m = Inception3(aux_logits=True, transform_input=transform_input)
    return randomise(m, seed=int(transform_input)).eval()


def export(m, path, exporter: str) -> None:
    x = torch.from_numpy(synthetic.image_like_batch(2, seed=0))
    if exporter == "dynamo":  # opset 18; the exporter puts the weights in path.data
        torch.onnx.export(m, (x,), str(path), dynamo=True, opset_version=18)
    else:
        torch.onnx.export(m, (x,), str(path), dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["logits"], dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}})


def op_counts(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


@pytest.mark.parametrize("source", ["torchvision", "stand-in"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("transform_input", [False, True], ids=["plain", "transform_input"])
def test_real_export_converts_and_matches_torch(source, exporter, transform_input, tmp_path):
    if source == "torchvision" and not has("torchvision"):
        pytest.skip("torchvision is not installed (the stand-in variant covers the exporter)")
    if exporter == "dynamo" and not has("onnxscript"):
        pytest.skip("onnxscript is not installed: torch's dynamo ONNX exporter needs it")
    if exporter == "dynamo" and "dynamo" not in inspect.signature(torch.onnx.export).parameters:
        pytest.skip(f"torch {torch.__version__} has no dynamo ONNX exporter (torch.onnx.export(dynamo=True))")
    m = model(source, transform_input)
    path = tmp_path / f"inception_v3_{exporter}.onnx"
    export(m, path, exporter)

    weights = load_weights(onnx_convert.convert(path, tmp_path / "w.npz"))
    assert weights.manifest["exporter"] == exporter
    assert weights.manifest["input"]["transform_input"] is transform_input
    assert weights.manifest["aux_ignored"] is False  # eval mode: the exporters drop the aux classifier

    x = synthetic.image_like_batch(2, seed=21)
    got = NumpyBackend(weights, build_plan(2, weights.layers()), np.float64).forward(x.astype(np.float64))
    with torch.no_grad():
        want = copy.deepcopy(m).double()(torch.from_numpy(x).double()).numpy()
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    # How the synthetic model of the same style differs in structure (printed, for keeping the two alike).
    real = op_counts(onnx.load(str(path), load_external_data=False))
    synth = op_counts(synthetic.synthetic_onnx_model(exporter, transform_input))
    print(f"{source} {exporter} transform_input={transform_input} (torch {torch.__version__}): relative L2 "
          f"numpy float64 vs torch float64 = {err:.2e}; ops only in the real export: {dict(real - synth)}, "
          f"only in the synthetic one: {dict(synth - real)}")
    assert err <= 1e-4
    np.testing.assert_array_equal(np.argsort(-got, axis=1)[:, :5], np.argsort(-want, axis=1)[:, :5])

