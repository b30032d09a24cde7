"""Every result knows where it came from (issue 50): the weight file's provenance record and its checksum, the model's
short name in every output, --resume refusing a file of another model, backend or precision, the synthetic model
kept away from the real weights' default places; and partial output that says so."""

from __future__ import annotations

import csv
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine import cli, engine
from inception_engine.errors import ConversionError, WeightsError
from inception_engine.onnx_convert import convert
from inception_engine.weights import (MANIFEST_KEY, Weights, check_manifest, load_weight_file, model_digest,
                                      save_weights, sha256_array)

from helpers.cli import one_line_error, runner
from helpers.random_weights import random_arrays

SMALL = {"count_include_pad": True, "input": {"size": 75, "resize": 86}}  # quick CPU forwards


def weights_of(path: Path, seed: int, kind: str | None) -> Path:
    """A small weight file of random arrays; ``kind``: its provenance's, None for a file converted before
    provenance was kept."""
    manifest = dict(SMALL)
    if kind is not None:
        manifest["provenance"] = {"kind": kind, "source_sha256": "ab" * 32, "source_name": "x.onnx",
                                  "producer": "pytorch 2.5", "calibration": None}
    return save_weights(path, random_arrays(seed), manifest)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("w")
    return {"old": weights_of(d / "old.npz", 5, None), "real": weights_of(d / "real.npz", 5, "torchvision"),
            "other": weights_of(d / "other.npz", 6, "torchvision"),
            "synthetic": weights_of(d / "syn.npz", 7, "synthetic")}


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(2)
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (80, 90, 3), dtype=np.uint8)).save(d / f"p{i}.jpg")
    return d


def run(*args: str):
    return runner().invoke(cli.run_cmd, [*args, "--backend", "cpu", "--batch-size", "2", "--workers", "1"])


def test_the_model_is_named_by_its_arrays_and_kind(files):
    old, real, other, syn = (load_weight_file(files[k]).model_id() for k in ("old", "real", "other", "synthetic"))
    assert old.digest == real.digest != other.digest  # the same arrays, whatever the manifest says of them
    assert len(real.digest) == 12 and real.name == real.digest and real.kind == "torchvision"
    assert syn.name == f"synthetic-{syn.digest}" and "SYNTHETIC" in syn.describe()
    assert old.kind == "unknown" and "source not recorded" in old.describe()  # an old file still loads
    arrays = random_arrays(5)
    in_memory = Weights(arrays, {}).model_id()  # no checksums in the manifest: computed from the arrays
    assert in_memory.digest == real.digest == model_digest({k: sha256_array(k, a) for k, a in arrays.items()})


def test_an_edited_provenance_fails_its_checksum(files, tmp_path):
    with zipfile.ZipFile(files["synthetic"]) as z:
        manifest = json.loads(str(np.load(z.open(MANIFEST_KEY + ".npy"))))
    check_manifest(manifest)
    manifest["provenance"]["kind"] = "torchvision"  # a synthetic model passed off as the real one
    with pytest.raises(WeightsError, match="provenance fails its checksum"):
        check_manifest(manifest)
    manifest["provenance"] = {"kind": "mystery"}
    with pytest.raises(WeightsError, match="kind is one of torchvision, fid, synthetic, other"):
        check_manifest(manifest)


def test_every_output_names_the_model(files, photos, tmp_path):
    name = load_weight_file(files["synthetic"]).model_id().name
    text = run(str(photos / "p0.jpg"), "--weights", str(files["synthetic"]))
    assert text.exit_code == 0 and text.stdout.splitlines()[0].endswith(f"model {name} (SYNTHETIC: random weights, "
                                                                        f"its classes mean nothing)")
    doc = json.loads(run(str(photos), "--weights", str(files["synthetic"]), "--json").stdout)
    assert doc["model"] == name and doc["provenance"] == {"kind": "synthetic", "source_sha256": "ab" * 32}
    assert {r["model"] for r in doc["results"]} == {name}
    assert (doc["complete"], doc["done"], doc["inputs"]) == (True, 4, 4)
    run(str(photos), "--weights", str(files["real"]), "--output", str(tmp_path / "r.jsonl"))
    real = load_weight_file(files["real"]).model_id().name
    assert {json.loads(line)["model"] for line in (tmp_path / "r.jsonl").read_text().splitlines()} == {real}
    run(str(photos), "--weights", str(files["real"]), "--output", str(tmp_path / "r.csv"))
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert len(rows) == 4 and {r["model"] for r in rows} == {real}
    old = run(str(photos / "p0.jpg"), "--weights", str(files["old"]))
    assert "(source not recorded: converted before provenance was kept)" in old.stdout.splitlines()[0]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_resume_refuses_a_file_of_another_model_and_leaves_it_as_it_was(files, photos, tmp_path, suffix):
    out = tmp_path / f"r{suffix}"
    run(str(photos / "p0.jpg"), str(photos / "p1.jpg"), "--weights", str(files["real"]), "--output", str(out))
    with out.open("ab") as f:
        f.write(b"torn")  # a damaged last line, which a resume drops by rewriting the file
    before = out.read_bytes()
    err = one_line_error(run(str(photos), "--weights", str(files["other"]), "--output", str(out), "--resume"))
    mine, theirs = (load_weight_file(files[k]).model_id().name for k in ("other", "real"))
    assert f"holds results computed with another model {theirs} (this run: {mine})" in err
    assert out.read_bytes() == before
    same = run(str(photos), "--weights", str(files["old"]), "--output", str(out), "--resume")  # the same arrays
    assert same.exit_code == 0 and len(out.read_bytes().splitlines()) == 4 + (suffix == ".csv")


def test_resume_refuses_results_that_do_not_name_their_model(files, photos, tmp_path):
    out = tmp_path / "old.jsonl"
    line = {"image": str(photos / "p0.jpg"), "top": [{"index": 0, "label": "tench", "prob": 0.5}] * 5,
            "backend": "cpu", "precision": "fp32"}  # an earlier inception-run's line
    out.write_text(json.dumps(line) + "\n")
    err = one_line_error(run(str(photos), "--weights", str(files["real"]), "--output", str(out), "--resume"))
    assert "do not record their model" in err
    old_csv = tmp_path / "old.csv"
    old_csv.write_text("image,error,top1_index,top1_label,top1_prob,backend,precision\n")
    err = one_line_error(run(str(photos), "--weights", str(files["real"]), "--output", str(old_csv), "--resume",
                             "--top-k", "1"))
    assert "did not record the model" in err


def test_a_synthetic_model_never_goes_to_the_default_places(synthetic_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("INCEPTION_WEIGHTS", raising=False)
    monkeypatch.chdir(tmp_path)
    default = tmp_path / "cache" / "inception-engine" / "inception_v3.npz"
    with pytest.raises(ConversionError, match="synthetic model"):
        convert(synthetic_onnx())
    with pytest.raises(ConversionError, match="-o FILE.npz"):
        convert(synthetic_onnx(), Path("weights") / "inception_v3.npz")
    r = runner().invoke(cli.convert_cmd, [str(synthetic_onnx())])
    assert r.exit_code == 2 and "never written to" in one_line_error(r) and not default.exists()
    w = convert(synthetic_onnx(), tmp_path / "mine.npz")
    prov = load_weight_file(w).manifest["provenance"]
    assert prov["kind"] == "synthetic" and len(prov["source_sha256"]) == 64
    # the hint never names a default place, even where the ONNX file's stem is the real weights'
    r = runner().invoke(cli.convert_cmd, ["--synthetic", "weights/inception_v3.onnx"])
    hint = r.stdout.split("convert it to a file of its own with: ")[1].split()
    assert hint[-2:] == ["-o", "weights/synthetic_inception_v3.npz"]


def test_an_interrupted_json_document_says_it_is_incomplete(files, photos, monkeypatch):
    real = engine.Engine.predict_iter

    def interrupted(self, images, top_k=5, on_progress=None, render=None):
        for i, p in enumerate(real(self, images, top_k, on_progress, render)):
            if i == 2:
                raise KeyboardInterrupt
            yield p

    monkeypatch.setattr(engine.Engine, "predict_iter", interrupted)
    r = run(str(photos), "--weights", str(files["real"]), "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 130 and (doc["complete"], doc["done"], doc["inputs"]) == (False, 2, 4)
    assert len(doc["results"]) == 2


def test_interrupted_before_any_image_names_no_file(files, photos, tmp_path, monkeypatch):
    def at_once(self, images, top_k=5, on_progress=None, render=None):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(engine.Engine, "predict_iter", at_once)
    out = tmp_path / "c.jsonl"
    r = run(str(photos), "--weights", str(files["real"]), "--output", str(out))
    assert r.exit_code == 130 and "interrupted after 0 of 4 images" in r.stderr
    assert str(out) not in r.stderr and "--resume" not in r.stderr and not out.exists()


def test_resume_says_which_of_backend_precision_and_model_differs(tmp_path):
    from inception_engine.errors import EngineError
    from inception_engine.output_read import check_computed, read_lines

    line = {"image": "a.jpg", "top": [{"index": 0, "label": "tench", "prob": 0.5}], "backend": "cuda",
            "precision": "fp16", "model": "3f9a0c12ab45"}
    lines = read_lines((json.dumps(line) + "\n").encode(), "jsonl", tmp_path / "r.jsonl")
    check_computed(lines, ("cuda", "fp16", "3f9a0c12ab45"), tmp_path / "r.jsonl")  # the same: resumed
    with pytest.raises(EngineError) as e:
        check_computed(lines, ("cuda", "tf32", "3f9a0c12ab45"), tmp_path / "r.jsonl")
    assert "another precision fp16 (this run: tf32);" in str(e.value) and "model" not in str(e.value).split(";")[0]
    with pytest.raises(EngineError, match=r"another backend cuda \(this run: cpu\), precision fp16 \(this run: fp32\)"):
        check_computed(lines, ("cpu", "fp32", "3f9a0c12ab45"), tmp_path / "r.jsonl")
