"""Issue 52's check where PyTorch and pytorch-fid are installed (the GPU machine; never the default test install,
which skips this file): the same random weights in pytorch-fid's own modules, exported to ONNX and converted, and
the same two folders of images give pytorch-fid's FID within 1e-4 relative, with its preprocessing (--resize
pytorch-fid) on the cpu backend and, where a GPU is usable, the cuda backend in fp32; and, where clean-fid is
installed too, clean-fid's FID in its "clean" mode (--resize clean-fid) with the same network as its feature
extractor (its own network, NVIDIA's TorchScript port, is a download).

pytorch-fid's InceptionV3 is built with pytorch-fid's FID Inception replaced by the same modules with random weights
(its weights are a download; the random ones are He-initialised, BatchNorm statistics random, so that activations
stay O(1)), and its own get_activations / calculate_frechet_distance compute its FID."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine import backends, fid_command
from inception_engine.onnx_convert import convert

from helpers.cli import runner

torch = pytest.importorskip("torch")
pf_inception = pytest.importorskip("pytorch_fid.inception")
pf_score = pytest.importorskip("pytorch_fid.fid_score")

ROOT = Path(__file__).resolve().parents[2]


def export_script():
    """scripts/export_pytorch_fid_onnx.py as a module (scripts/ on sys.path, as when it runs: its onnx_check)."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    return importlib.import_module("export_pytorch_fid_onnx")


def random_fid_module():
    """pytorch-fid's blocks with the export script's seeded random weights (He-initialised convolutions, random
    BatchNorm statistics), in eval mode."""
    return export_script().random_fid_module(seed=0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("fid")
    model = random_fid_module()
    onnx_path = d / "fid.onnx"
    torch.onnx.export(model, (torch.rand(2, 3, 299, 299) * 2 - 1,), str(onnx_path), dynamo=False, opset_version=17,
                      input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    weights = convert(onnx_path, d / "fid.npz")
    rng = np.random.default_rng(1)
    folders = []
    for name, bright in (("a", 1.0), ("b", 1.3)):
        f = d / name
        f.mkdir()
        for i in range(24):  # one size: pytorch-fid's DataLoader stacks the images of a batch
            coarse = rng.integers(0, 200, (8, 8, 3)).astype(np.float64) * bright
            Image.fromarray(np.clip(coarse, 0, 255).astype(np.uint8)).resize((256, 256), Image.BICUBIC) \
                .save(f / f"{i:02d}.png")
        folders.append(f)
    return model, weights, folders


def pytorch_fids_own(model, folders) -> float:
    """pytorch-fid's FID of the folders with ``model`` as its FID Inception (its resize and 2x - 1 included), on
    this machine's SciPy (export_pytorch_fid_onnx.pytorch_fid_on_this_scipy)."""
    export_script().pytorch_fid_on_this_scipy()
    original = pf_inception.fid_inception_v3
    pf_inception.fid_inception_v3 = lambda: model
    try:
        net = pf_inception.InceptionV3([pf_inception.InceptionV3.BLOCK_INDEX_BY_DIM[2048]]).eval()
    finally:
        pf_inception.fid_inception_v3 = original
    stats = [pf_score.calculate_activation_statistics(sorted(str(p) for p in f.iterdir()), net, batch_size=8,
                                                      dims=2048, device="cpu", num_workers=0) for f in folders]
    return float(pf_score.calculate_frechet_distance(*stats[0], *stats[1]))


def gpu_decode_missing() -> str | None:
    from inception_engine.errors import EngineError
    from inception_engine.ingest.jpeg_decode import check_gpu_decode

    try:
        check_gpu_decode()
    except (EngineError, OSError) as e:
        return str(e)
    return None


@pytest.mark.parametrize("backend, decode", [("cpu", "cpu"), ("cuda", "cpu"), ("cuda", "gpu")])
def test_fid_equals_pytorch_fids_within_1e_4(setup, backend, decode):
    """--decode gpu on these PNGs: each one the GPU decoder's CPU path, its network input copied to the forward as
    the GPU resize writes it (the cuda runner's pytorch-fid input)."""
    if backend == "cuda" and not backends.is_available("cuda")[0]:
        pytest.skip(f"needs a GPU: {backends.is_available('cuda')[1]}")
    if decode == "gpu" and (why := gpu_decode_missing()) is not None:
        pytest.skip(f"--decode gpu unavailable: {why}")
    model, weights, folders = setup
    want = pytorch_fids_own(model, folders)
    r = runner().invoke(fid_command.fid_cmd, [str(folders[0]), str(folders[1]), "--weights", str(weights),
                                               "--backend", backend, "--precision", "fp32", "--decode", decode,
                                               "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["resize"] == "pytorch-fid" and doc["network"] == "fid"
    print(f"{backend}, decode {decode}: FID {doc['fid']:.8f}, pytorch-fid's {want:.8f}, "
          f"rel {abs(doc['fid'] - want) / want:.2e}")
    assert want > 0 and abs(doc["fid"] - want) <= 1e-4 * want


def clean_fids_own(model, folders) -> float:
    """clean-fid's compute_fid of the folders in its "clean" mode (its loading, its float32 Pillow bicubic resize,
    its FID), ``model``'s pool features as its feature extractor on its [0, 255] input scaled as its own network
    scales it, (x - 128) / 128."""
    cleanfid = pytest.importorskip("cleanfid.fid")
    export_script().pytorch_fid_on_this_scipy()
    original = pf_inception.fid_inception_v3
    pf_inception.fid_inception_v3 = lambda: model
    try:  # pytorch-fid's wrapper for the pool features, with neither its resize nor its scaling
        net = pf_inception.InceptionV3([pf_inception.InceptionV3.BLOCK_INDEX_BY_DIM[2048]], resize_input=False,
                                       normalize_input=False).eval()
    finally:
        pf_inception.fid_inception_v3 = original

    def features(x):
        return net((x - 128) / 128)[0].flatten(1)

    return float(cleanfid.compute_fid(str(folders[0]), str(folders[1]), mode="clean", custom_feat_extractor=features,
                                      device=torch.device("cpu"), num_workers=0, batch_size=8, verbose=False))


def test_clean_fid_mode_equals_clean_fids_within_1e_4(setup):
    model, weights, folders = setup
    want = clean_fids_own(model, folders)
    r = runner().invoke(fid_command.fid_cmd, [str(folders[0]), str(folders[1]), "--weights", str(weights),
                                               "--backend", "cpu", "--resize", "clean-fid", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["resize"] == "clean-fid"
    print(f"clean-fid mode: FID {doc['fid']:.8f}, clean-fid's {want:.8f}, rel {abs(doc['fid'] - want) / want:.2e}")
    assert want > 0 and abs(doc["fid"] - want) <= 1e-4 * want
