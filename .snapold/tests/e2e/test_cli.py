"""The console commands through click's CliRunner: results, --json schema, bad inputs, exit codes, one-line errors."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine import backends, cli, engine
from inception_engine.labels import imagenet_labels
from inception_engine.model_files import load_weights

from helpers.cli import cpu_notes_stderr, one_line_error, runner
from helpers.random_weights import write_random_weights


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    return write_random_weights(tmp_path_factory.mktemp("weights") / "w.npz", seed=3)


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory) -> Path:
    """Good images of several modes and formats, one EXIF-rotated, plus a non-image file to be skipped."""
    d = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(d / "a_rgb.jpg")
    Image.fromarray(rng.integers(0, 256, (350, 320), dtype=np.uint8), "L").save(d / "b_grey.png")
    Image.fromarray(rng.integers(0, 256, (310, 330, 4), dtype=np.uint8), "RGBA").save(d / "c_rgba.png")
    Image.fromarray(rng.integers(0, 256, (320, 310, 3), dtype=np.uint8)).convert("P").save(d / "d_palette.gif")
    Image.new("CMYK", (330, 300), (10, 200, 30, 5)).save(d / "e_cmyk.jpg")
    Image.fromarray(rng.integers(0, 65536, (300, 340), dtype=np.uint16)).save(d / "f_16bit.png")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(rng.integers(0, 256, (300, 420, 3), dtype=np.uint8)).save(d / "g_rotated.jpg", exif=exif)
    (d / "notes.txt").write_text("not an image, and not picked up from a directory")
    return d


GOOD = ["a_rgb.jpg", "b_grey.png", "c_rgba.png", "d_palette.gif", "e_cmyk.jpg", "f_16bit.png", "g_rotated.jpg"]


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    (d / "empty.jpg").write_bytes(b"")
    (d / "text.png").write_text("hello")
    png = d / "good.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (300, 300, 3), dtype=np.uint8)).save(png)
    data = png.read_bytes()
    (d / "truncated.png").write_bytes(data[: len(data) // 2])
    (d / "corrupt.png").write_bytes(data[:40] + b"\xff" * 2000)
    (d / "subdir").mkdir()
    return d


# ----------------------------------------------------------------------------------------------------- inception-run

def test_run_directory_text_output(weights_file, image_dir):
    r = runner().invoke(cli.run_cmd, [str(image_dir), "--weights", str(weights_file), "--backend", "cpu",
                                      "--top-k", "3", "--batch-size", "4"])
    assert r.exit_code == 0, r.output
    header, *lines = r.stdout.splitlines()
    model = load_weights(weights_file).model_id()
    assert header == f"# cpu backend, fp32, weights {weights_file}, model {model.name} (source not recorded: " \
                     f"converted before provenance was kept)"
    names = [l for l in lines if not l.startswith("  ")]
    assert names == [str(image_dir / n) for n in GOOD]  # sorted, notes.txt skipped
    tops = [l for l in lines if l.startswith("  ")]
    assert len(tops) == 3 * len(GOOD) and not any("error" in l for l in tops)
    labels = imagenet_labels()
    for l in tops:  # "  0.0123  label (index)"
        assert re.match(r"  [01]\.\d{4}  ", l), l
        prob, rest = l.split(None, 1)
        label, index = rest.rsplit(" (", 1)
        assert 0.0 <= float(prob) <= 1.0 and labels[int(index.rstrip(")"))] == label


def test_run_summary_counts_from_the_commands_start(weights_file, image_dir, tmp_path, monkeypatch):
    """The summary's times count from the command's start (commands.command_start): its process's start where the
    command is its process's own, as the user's clock does; from the call where it runs inside an older process (here,
    one that seems to have started 100 s ago), never the process's age."""
    import time

    from inception_engine import commands

    args = [str(image_dir), "--weights", str(weights_file), "--backend", "cpu", "--batch-size", "2"]
    for age, own in ((100.0, False), (0.5, True)):
        monkeypatch.setattr(commands, "process_start", lambda age=age: time.perf_counter() - age)
        out = tmp_path / f"age{age}.jsonl"
        t0 = time.perf_counter()
        r = runner().invoke(cli.run_cmd, [*args, "--output", str(out)])
        took = time.perf_counter() - t0
        assert r.exit_code == 0, r.output
        m = re.search(r"in ([0-9.]+) s on the .* after the first result at ([0-9.]+) s", r.stderr)
        assert m, r.stderr
        total, first = float(m.group(1)), float(m.group(2))
        if own:  # the half second before the call counted
            assert 0.5 <= first <= took + 0.5 + 0.01 and total <= took + 0.5 + 0.05
        else:
            assert first <= took + 0.01 and total <= took + 0.05


def test_run_json_schema_and_probabilities(weights_file, image_dir):
    r = runner().invoke(cli.run_cmd, [str(image_dir / "a_rgb.jpg"), str(image_dir / "g_rotated.jpg"), "--json",
                                      "--weights", str(weights_file), "--backend", "cpu", "--top-k", "5"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc) == {"weights", "model", "provenance", "backend", "precision", "results", "complete", "done",
                        "inputs"}
    assert doc["weights"] == str(weights_file) and (doc["backend"], doc["precision"]) == ("cpu", "fp32")
    model = load_weights(weights_file).model_id().name
    assert doc["model"] == model and doc["provenance"] == {"kind": "unknown", "source_sha256": None}
    assert (doc["complete"], doc["done"], doc["inputs"]) == (True, 2, 2)
    assert [e["image"] for e in doc["results"]] == [str(image_dir / "a_rgb.jpg"), str(image_dir / "g_rotated.jpg")]
    labels = imagenet_labels()
    for entry in doc["results"]:
        assert set(entry) == {"image", "top", "backend", "precision", "model"} and len(entry["top"]) == 5
        assert (entry["backend"], entry["precision"], entry["model"]) == ("cpu", "fp32", model)
        probs = [t["prob"] for t in entry["top"]]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-9
        for t in entry["top"]:
            assert set(t) == {"index", "label", "prob"} and labels[t["index"]] == t["label"]


def test_run_bad_images_get_error_entries_and_exit_1(weights_file, image_dir, bad_dir):
    args = [str(image_dir / "a_rgb.jpg"), str(bad_dir / "empty.jpg"), str(bad_dir / "text.png"),
            str(bad_dir / "truncated.png"), str(bad_dir / "corrupt.png"), str(bad_dir / "subdir"),
            str(bad_dir / "missing.jpg"), str(image_dir / "b_grey.png")]
    r = runner().invoke(cli.run_cmd, [*args, "--json", "--weights", str(weights_file), "--backend", "cpu"])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    results = json.loads(r.stdout)["results"]
    assert [e["image"] for e in results] == args
    assert "top" in results[0] and "top" in results[-1]
    expected_words = ["empty", "not an image", "truncated", "corrupt", "no image files", "no such file"]
    for entry, words in zip(results[1:-1], expected_words):
        assert set(entry) == {"image", "error"} and words in entry["error"] and "\n" not in entry["error"]
    assert "6 of 8" in r.stderr


def test_run_features_file_in_input_order_beside_the_results(weights_file, image_dir, bad_dir, tmp_path):
    """--features OUT.npy: float32 (N, 2048) rows in input order, NaN for an image that failed, the list in OUT.txt,
    the same numbers as Engine.features; the classification results unchanged."""
    from inception_engine.engine import Engine

    args = [str(image_dir / "a_rgb.jpg"), str(bad_dir / "text.png"), str(image_dir / "b_grey.png"),
            str(image_dir / "c_rgba.png")]
    out = tmp_path / "sub" / "feats.npy"
    common = ["--weights", str(weights_file), "--backend", "cpu", "--batch-size", "2", "--json"]
    r = runner().invoke(cli.run_cmd, [*args, *common, "--features", str(out)])
    assert r.exit_code == 1, r.output  # the bad image
    plain = runner().invoke(cli.run_cmd, [*args, *common])
    assert json.loads(r.stdout)["results"] == json.loads(plain.stdout)["results"]
    feats = np.load(out, mmap_mode="r")
    assert feats.shape == (4, 2048) and feats.dtype == np.float32
    assert (tmp_path / "sub" / "feats.txt").read_text().splitlines() == args
    assert np.isnan(feats[1]).all() and not np.isnan(feats[[0, 2, 3]]).any()
    with Engine(weights_file, backend="cpu", batch_size=2) as e:
        want, _ = e.features([args[0], args[2], args[3]])
    np.testing.assert_allclose(feats[[0, 2, 3]], want, rtol=1e-5, atol=1e-6)
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["feats.npy", "feats.txt"]  # no part files


@pytest.mark.parametrize("extra,words", [
    (["--features", "x.csv"], "writes a NumPy .npy file"),
    (["--features", "{d}/exists.npy"], "exists already"),
    (["--features", "f.npy", "--gpus", "2"], "--gpus does not write them"),
    (["--features", "f.npy", "--output", "o.jsonl", "--resume"], "--resume runs only the missing ones"),
])
def test_run_features_refusals_are_one_line(weights_file, image_dir, tmp_path, extra, words):
    (tmp_path / "exists.npy").write_bytes(b"x")
    extra = [e.format(d=tmp_path) for e in extra]
    r = runner().invoke(cli.run_cmd, [str(image_dir), "--weights", str(weights_file), "--backend", "cpu", *extra])
    assert r.exit_code == 2 and words in one_line_error(r), r.output


def test_run_globs(weights_file, image_dir):
    r = runner().invoke(cli.run_cmd, [str(image_dir / "*.png"), str(image_dir / "*.webp"), "--json",
                                      "--weights", str(weights_file), "--backend", "cpu", "--top-k", "1"])
    results = json.loads(r.stdout)["results"]
    assert [e["image"] for e in results] == [str(image_dir / n) for n in ("b_grey.png", "c_rgba.png",
                                                                           "f_16bit.png")] + [str(image_dir / "*.webp")]
    assert "no files match" in results[-1]["error"] and r.exit_code == 1


def test_run_progress_bar_only_on_a_tty(weights_file, image_dir, monkeypatch):
    monkeypatch.setattr(cli, "progress_bar_fits", lambda: True)
    r = runner().invoke(cli.run_cmd, [str(image_dir / "a_rgb.jpg"), str(image_dir / "b_grey.png"), "--json",
                                      "--weights", str(weights_file), "--backend", "cpu", "--batch-size", "1"])
    assert r.exit_code == 0, r.output
    assert "classifying" in r.stderr and len(json.loads(r.stdout)["results"]) == 2


@pytest.mark.parametrize("have,gpus,words", [(0, 1, "no usable GPU"), (0, 2, "no usable GPU"),
                                             (1, 2, "1 usable GPU"), (2, 3, "2 usable GPUs")])
def test_run_more_gpus_than_the_machine_has_is_refused(weights_file, image_dir, monkeypatch, have, gpus, words):
    monkeypatch.setattr(backends, "usable_gpus", lambda: have)
    r = runner().invoke(cli.run_cmd, [str(image_dir), "--weights", str(weights_file), "--gpus", str(gpus)])
    assert r.exit_code == 2 and r.stdout == ""
    assert one_line_error(r) == f"error: --gpus {gpus}: this machine has {words}"


def test_run_precision_the_cpu_lacks_is_refused_with_auto_backend_too(weights_file, image_dir, monkeypatch):
    monkeypatch.setattr(backends, "is_available", lambda name: (name == "cpu", "no GPU"))
    for backend in ("auto", "cpu"):
        r = runner().invoke(cli.run_cmd, [str(image_dir), "--weights", str(weights_file), "--backend", backend,
                                          "--precision", "fp16"])
        assert r.exit_code == 2 and r.stdout == ""
        assert one_line_error(r).startswith("error: --precision fp16: the cpu backend")


@pytest.fixture
def nested(tmp_path) -> Path:
    """photos/ with one image at its top and four in subfolders (one hidden folder's image never counts)."""
    rng = np.random.default_rng(4)
    for name in ("top.jpg", "a/x/one.jpg", "a/b/two.png", "a/b/three.jpg", "c/four.jpg", ".hidden/no.jpg"):
        (tmp_path / "photos" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (80, 90, 3), dtype=np.uint8)).save(tmp_path / "photos" / name)
    return tmp_path / "photos"


def test_run_says_what_a_directory_listing_left_out_and_recursive_takes_it(weights_file, nested, monkeypatch):
    base = [str(nested), "--weights", str(weights_file), "--backend", "cpu", "--top-k", "1", "--json"]
    r = runner().invoke(cli.run_cmd, base)
    assert r.exit_code == 0, r.output
    assert [e["image"] for e in json.loads(r.stdout)["results"]] == [str(nested / "top.jpg")]
    assert f"note: {nested}: 4 images in subfolders not searched (--recursive searches them)" in r.stderr
    for flag in ("--recursive", "-r"):
        r = runner().invoke(cli.run_cmd, [*base, flag])
        assert r.exit_code == 0, r.output
        assert [e["image"] for e in json.loads(r.stdout)["results"]] == [
            str(nested / n) for n in ("a/b/three.jpg", "a/b/two.png", "a/x/one.jpg", "c/four.jpg", "top.jpg")]
        assert "not searched" not in r.stderr
    # nothing at all to classify: a usage error (exit 2) before the model loads, saying why
    monkeypatch.setattr(engine.Engine, "from_config", lambda *a, **k: pytest.fail("the model loaded"))
    r = runner().invoke(cli.run_cmd, [str(nested / "a"), *base[1:]])
    assert r.exit_code == 2 and r.stdout == ""
    assert one_line_error(r).startswith(f"error: no image files to classify ({nested / 'a'}: directory has no "
                                        "image files at its top level; 3 images in subfolders not searched "
                                        "(--recursive searches them)); looked for the ")


def test_run_recursive_with_gpus_takes_the_same_images(weights_file, nested, monkeypatch, tmp_path):
    """--gpus N lists its inputs as the plain run does (the workers are spawned: each sees the real machine, so the
    cpu backend runs them)."""
    monkeypatch.setattr(backends, "usable_gpus", lambda: 2)
    args = [str(nested), "--weights", str(weights_file), "--backend", "cpu", "--top-k", "1", "-r", "--batch-size",
            "1", "--workers", "1"]
    one = runner().invoke(cli.run_cmd, [*args, "--output", str(tmp_path / "one.jsonl")])
    two = runner().invoke(cli.run_cmd, [*args, "--gpus", "2", "--output", str(tmp_path / "two.jsonl")])
    assert one.exit_code == two.exit_code == 0, two.output
    rows = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()]
    assert [r["image"] for r in rows] == [json.loads(line)["image"]
                                          for line in (tmp_path / "one.jsonl").read_text().splitlines()]
    assert len(rows) == 5


@pytest.mark.parametrize("args,line", [
    (["--precison", "fp16"], "error: no such option --precison (did you mean --precision?); inception-run --help "
                             "lists the options"),
    (["--precision", "bf16"], "error: invalid value for '--precision': 'bf16' is not one of 'auto', 'fp32', "
                              "'tf32', 'fp16', 'int8'; inception-run --help lists the options"),
    ([], "error: missing argument 'IMAGES...'; inception-run --help lists the options"),
])
def test_usage_errors_are_one_line(args, line, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["inception-run", *args] if not args else ["inception-run", "x.jpg", *args])
    with pytest.raises(SystemExit) as e:
        cli.run_main()
    assert e.value.code == 2
    assert capsys.readouterr().err == line + "\n"


def test_the_cpu_fallback_note_is_short_and_said_once(weights_file, image_dir, tmp_path, monkeypatch):
    if backends.is_available("cuda")[0]:
        pytest.skip("a GPU is usable here: auto runs on it, without a note")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    args = [str(image_dir / "a_rgb.jpg"), "--weights", str(weights_file), "--top-k", "1"]
    first, second = runner().invoke(cli.run_cmd, args), runner().invoke(cli.run_cmd, args)
    assert first.exit_code == second.exit_code == 0
    assert first.stderr == ("note: no usable GPU: running on the CPU (--backend cuda says why)\n"
                            + cpu_notes_stderr())  # the NumPy code's note where the machine has no AVX-512F
    assert second.stderr == "" and second.stdout.startswith("# cpu backend, fp32, ")  # the header still says it


def test_run_missing_weights_says_how_to_get_them(tmp_path, image_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("INCEPTION_WEIGHTS", raising=False)
    r = runner().invoke(cli.run_cmd, [str(image_dir / "a_rgb.jpg")])
    assert r.exit_code == 2
    err = one_line_error(r)
    assert "export_torchvision_onnx.py" in err and "inception-convert-weights" in err
    r = runner().invoke(cli.run_cmd, [str(image_dir / "a_rgb.jpg"), "--weights", str(tmp_path / "nope.npz")])
    assert r.exit_code == 2 and one_line_error(r).startswith(f"error: --weights {tmp_path / 'nope.npz'}: no such file")


def test_run_corrupt_weights_file_is_one_line(tmp_path, image_dir):
    bad = tmp_path / "w.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    r = runner().invoke(cli.run_cmd, [str(image_dir / "a_rgb.jpg"), "--weights", str(bad)])
    assert r.exit_code == 2 and str(bad) in one_line_error(r)


@pytest.mark.parametrize("name", ["cuda", "cudnn", "torch"])
def test_run_unavailable_backend_exit_2(weights_file, image_dir, name):
    if backends.is_available(name)[0]:
        pytest.skip(f"{name} is usable here")
    r = runner().invoke(cli.run_cmd, [str(image_dir / "a_rgb.jpg"), "--weights", str(weights_file),
                                      "--backend", name])
    assert r.exit_code == 2 and name in one_line_error(r)


def test_entry_point_maps_errors_to_exit_codes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["inception-run", str(tmp_path / "x.jpg"), "--weights",
                                     str(tmp_path / "none.npz")])
    with pytest.raises(SystemExit) as e:
        cli.run_main()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err


# ----------------------------------------------------------------------------------------- inception-convert-weights

@pytest.mark.parametrize("args,words", [
    ([], "give the ONNX file"),
    (["{tmp}/missing.onnx"], "no such ONNX file"),
    (["{tmp}/text.onnx"], "text.onnx"),
    (["{tmp}/text.onnx", "--synthetic", "{tmp}/s.onnx"], "not both"),
    (["{tmp}/text.onnx", "--seed", "3"], "--seed"),
    (["--synthetic", "{tmp}/s.onnx", "-o", "{tmp}/w.npz"], "-o applies"),
    (["--synthetic", "{tmp}/s.onnx", "--force"], "--force applies"),
    (["{tmp}/text.onnx", "--calibration-images", "5"], "--calibration-images only applies with --calibrate"),
])
def test_convert_refusals_are_one_line_exit_2(tmp_path, args, words):
    (tmp_path / "text.onnx").write_text("this is not a protobuf")
    r = runner().invoke(cli.convert_cmd, [a.format(tmp=tmp_path) for a in args])
    assert r.exit_code == 2, r.output
    assert words in one_line_error(r)
    assert not (tmp_path / "w.npz").exists() and not (tmp_path / "weights").exists()


def test_convert_synthetic_roundtrip_then_run(tmp_path, image_dir):
    onnx_path, npz = tmp_path / "syn.onnx", tmp_path / "syn.npz"
    r = runner().invoke(cli.convert_cmd, ["--synthetic", str(onnx_path), "--seed", "4"])
    assert r.exit_code == 0, r.output
    assert onnx_path.is_file() and f"inception-convert-weights {onnx_path}" in r.stdout
    r = runner().invoke(cli.convert_cmd, [str(onnx_path), "-o", str(npz)])
    assert r.exit_code == 0, r.output
    assert load_weights(npz).manifest["source_name"] == onnx_path.name
    r = runner().invoke(cli.run_cmd, [str(image_dir / "a_rgb.jpg"), "--weights", str(npz), "--backend", "cpu",
                                      "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["weights"] == str(npz)


# -------------------------------------------------------------------------------------------------- inception-bench

def test_bench_json_on_cpu(weights_file, tmp_path):
    out, table_csv = tmp_path / "b.json", tmp_path / "b.csv"
    r = runner().invoke(cli.bench_cmd, ["--backends", "cpu,cuda", "--batch-sizes", "1", "--iters", "2",
                                        "--warmup", "0", "--weights", str(weights_file), "--json", str(out),
                                        "--csv", str(table_csv)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    rows = {row["backend"]: row for row in doc["rows"]}
    cpu = rows["cpu"]
    assert cpu["status"] == "ok" and cpu["batch"] == 1
    assert 0 < cpu["p10_ms"] <= cpu["median_ms"] <= cpu["p90_ms"] <= cpu["p99_ms"]
    assert cpu["images_per_s"] == pytest.approx(1000.0 / cpu["median_ms"])
    assert cpu["rel_l2"] < 1e-5  # float32 path vs the float64 reference
    if not backends.is_available("cuda")[0]:
        assert rows["cuda"]["status"].startswith("unavailable: ")
    assert rows["onnxruntime"]["status"].startswith("unavailable: pass --onnx")  # real weights, no --onnx given
    assert doc["weights"] == str(weights_file) and doc["synthetic"] is False
    assert table_csv.read_text().splitlines()[0].startswith("backend,batch,status,median_ms")
    assert "cpu" in r.stdout and "median ms" in r.stdout
    if not backends.is_available("cuda")[0]:  # no GPU row ran: the GPU's floors would say nothing
        assert "floors:" not in r.stdout and "x floor (GPU rows)" not in r.stdout


def test_bench_without_weights_runs_the_synthetic_model_and_says_so(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("INCEPTION_WEIGHTS", raising=False)
    r = runner().invoke(cli.bench_cmd, ["--backends", "cpu", "--batch-sizes", "1", "--iters", "1", "--warmup", "0",
                                        "--json", "b.json"])
    assert r.exit_code == 0, r.output
    assert "SYNTHETIC" in r.stdout
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["synthetic"] is True
    rows = {row["backend"]: row for row in doc["rows"]}
    assert rows["onnxruntime"]["status"] == "ok"
    # onnxruntime runs the synthetic ONNX, the engine the synthetic weights: same model, so same logits
    assert rows["onnxruntime"]["rel_l2"] < 1e-4 and rows["cpu"]["rel_l2"] < 1e-5
    assert rows["cpu"]["ratio_vs_onnxruntime"] == pytest.approx(rows["cpu"]["median_ms"]
                                                                / rows["onnxruntime"]["median_ms"])


def test_bench_bad_options_exit_2(weights_file):
    r = runner().invoke(cli.bench_cmd, ["--backends", "cpu,tpu"])
    assert r.exit_code == 2 and "tpu" in r.output
    r = runner().invoke(cli.bench_cmd, ["--batch-sizes", "0,8"])
    assert r.exit_code == 2
    r = runner().invoke(cli.bench_cmd, ["--weights", "/nonexistent/w.npz", "--backends", "cpu"])
    assert r.exit_code == 2 and "no such weight file" in one_line_error(r)


def test_bench_backend_names_variants_and_defaults(monkeypatch):
    assert cli.backend_list(None, None, "torch-graph, cuda,torch-graph") == ["torch-graph", "cuda"]
    r = runner().invoke(cli.bench_cmd, ["--backends", "torch-eager"])
    assert r.exit_code == 2 and "torch-graph" in r.output  # the choices listed include the variants
    monkeypatch.setattr(backends, "is_available", lambda name: (name == "cuda", ""))
    assert cli.default_backends() == ["cuda", "cudnn", "torch", "torch-graph"]
    monkeypatch.setattr(backends, "is_available", lambda name: (False, "no GPU"))
    assert cli.default_backends() == ["cpu"]
    # inception-run takes the plain backends only
    assert set(cli.BACKEND_CHOICES) == {"auto", "cpu", "cuda", "cudnn", "torch"}


def test_bench_torch_compile_names_are_opt_in():
    names = "cuda,torch-graph,torch-compile,torch-compile-max"
    assert cli.backend_list(None, None, names) == names.split(",")
    assert backends.variant("torch-compile") == ("torch", {"compile_mode": "reduce-overhead"})
    assert backends.variant("torch-compile-max") == ("torch", {"compile_mode": "max-autotune"})
    assert not any(n.startswith("torch-compile") for n in cli.GPU_DEFAULT)  # minutes of compiling: asked for by name
    r = runner().invoke(cli.bench_cmd, ["--backends", "torch-compile-fast"])
    assert r.exit_code == 2 and "torch-compile-max" in r.output
    # click wraps the help at hyphens too ("torch-" / "compile")
    help_text = " ".join(runner().invoke(cli.bench_cmd, ["--help"]).output.split()).replace("- ", "-")
    assert "torch-compile is torch.compile(mode='reduce-overhead'), torch-compile-max mode='max-autotune'" in help_text


def test_bench_torch_compile_without_torch_is_a_row_not_a_traceback(weights_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as on a machine without PyTorch: import torch raises
    out = tmp_path / "b.json"
    r = runner().invoke(cli.bench_cmd, ["--backends", "torch-compile", "--batch-sizes", "1,2", "--iters", "1",
                                        "--warmup", "0", "--no-reference", "--weights", str(weights_file),
                                        "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output and "compile s" not in r.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(row["batch"], row["compile_s"]) for row in rows] == [(1, None), (2, None)]
    assert {row["status"] for row in rows} == {"unavailable: torch backend unavailable: PyTorch is not installed "
                                               "(pip install torch); the torch backend is only a comparison and "
                                               "nothing else needs it"}
    assert re.search(r"^torch-compile +1  unavailable: torch backend unavailable: PyTorch is not installed", r.stdout,
                     re.MULTILINE)


def test_bench_precision_a_backend_lacks_is_a_row_not_a_failure(weights_file, tmp_path):
    out = tmp_path / "b.json"
    r = runner().invoke(cli.bench_cmd, ["--backends", "cpu", "--batch-sizes", "1", "--iters", "1", "--warmup", "0",
                                        "--precision", "tf32", "--no-reference", "--weights", str(weights_file),
                                        "--peak-gbs", "2000", "--json", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    rows = {row["backend"]: row for row in doc["rows"]}
    assert rows["cpu"]["status"] == "unavailable: backend has no tf32 mode"
    assert rows["onnxruntime"]["status"] == "unavailable: the onnxruntime peer runs fp32 only"
    assert doc["precision"] == "tf32" and doc["peak_tflops"] == 411.6 and doc["peak_gbs"] == 2000
    assert doc["floors"][0]["compute_ms"] > 0
    r = runner().invoke(cli.bench_cmd, ["--precision", "bf16"])
    assert r.exit_code == 2 and "bf16" in r.output


def test_bench_plot_without_matplotlib_is_one_line(weights_file, tmp_path):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        r = runner().invoke(cli.bench_cmd, ["--plot", str(tmp_path / "p.png"), "--weights", str(weights_file)])
        assert r.exit_code == 2 and "matplotlib" in one_line_error(r)
        return
    r = runner().invoke(cli.bench_cmd, ["--backends", "cpu", "--batch-sizes", "1", "--iters", "1", "--warmup", "0",
                                        "--no-reference", "--weights", str(weights_file), "--plot",
                                        str(tmp_path / "p.png")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cudnn", "auto"])
def test_run_on_the_gpu_matches_the_cpu_path(synthetic_weights_file, image_dir, backend):
    """inception-run on a GPU backend: the cpu path's classes and probabilities, on the calibrated synthetic model;
    `auto` picks cuda where a GPU is usable. With --precision fp32 to fp32 noise; by default (auto: tf32 on the GPU,
    logits ~7e-4 off float64) to 5e-3, which fp32's 1e-3 did not allow (0.0020 off, H100, session 7)."""
    images = [str(image_dir / name) for name in GOOD]
    docs = {}
    for b, precision in (("cpu", "auto"), (backend, "fp32"), (backend, "auto")):
        r = runner().invoke(cli.run_cmd, [*images, "--json", "--weights", str(synthetic_weights_file),
                                          "--backend", b, "--precision", precision, "--top-k", "3",
                                          "--batch-size", "4"])
        assert r.exit_code == 0, r.output
        docs[b, precision] = json.loads(r.stdout)
    for precision, atol in (("fp32", 1e-3), ("auto", 5e-3)):
        doc = docs[backend, precision]
        assert doc["backend"] == ("cuda" if backend == "auto" else backend)
        for want, got in zip(docs["cpu", "auto"]["results"], doc["results"]):
            assert want["image"] == got["image"]
            assert want["top"][0]["index"] == got["top"][0]["index"], want["image"]
            np.testing.assert_allclose([t["prob"] for t in got["top"]], [t["prob"] for t in want["top"]], atol=atol)


@pytest.mark.parametrize("where", ["engine", "listing"])
def test_ctrl_c_before_the_first_result_is_one_line_and_130(weights_file, image_dir, tmp_path, monkeypatch, where):
    """Ctrl-C while the engine starts or the inputs are listed (a large folder): one line, exit code 130, and the
    output file this run created is not left behind."""
    from inception_engine import engine

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(*((engine.Engine, "_start") if where == "engine" else (cli, "expand_inputs")), interrupt)
    out = tmp_path / "labels.jsonl"
    r = runner().invoke(cli.run_cmd, [str(image_dir), "--weights", str(weights_file), "--backend", "cpu",
                                      "--output", str(out)])
    assert r.exit_code == 130 and r.stderr.strip() == "interrupted before the first result", r.output
    assert "Traceback" not in r.output and not out.exists()


def test_max_pixels_from_the_option_or_the_environment(weights_file, image_dir, monkeypatch):
    """--max-pixels N (else $INCEPTION_MAX_PIXELS) is the limit every image is held to, in the project's words; a
    bad value is a usage error before anything loads."""
    args = [str(image_dir / "a_rgb.jpg"), "--weights", str(weights_file), "--backend", "cpu", "--json"]
    w, h = Image.open(image_dir / "a_rgb.jpg").size
    r = runner().invoke(cli.run_cmd, [*args, "--max-pixels", "1000"])
    assert r.exit_code == 1 and json.loads(r.stdout)["results"][0]["error"].startswith(
        f"{image_dir / 'a_rgb.jpg'}: refused, it declares {w * h:,} pixels, more than the 1,000 an image may have")
    monkeypatch.setenv("INCEPTION_MAX_PIXELS", "1000")
    assert runner().invoke(cli.run_cmd, args).exit_code == 1
    assert runner().invoke(cli.run_cmd, [*args, "--max-pixels", str(w * h)]).exit_code == 0  # the option wins
    monkeypatch.setenv("INCEPTION_MAX_PIXELS", "lots")
    monkeypatch.setattr(engine.Engine, "from_config", lambda *a, **k: pytest.fail("the model loaded"))
    assert one_line_error(runner().invoke(cli.run_cmd, args)).startswith(
        "error: $INCEPTION_MAX_PIXELS=lots: must be a whole number of pixels")


def test_convert_synthetic_fid_roundtrip(tmp_path):
    """--synthetic --fid: pytorch-fid's graph with random weights; the converter names its network and kind."""
    onnx_path, npz = tmp_path / "fid.onnx", tmp_path / "fid.npz"
    r = runner().invoke(cli.convert_cmd, ["--synthetic", str(onnx_path), "--fid"])
    assert r.exit_code == 0 and "synthetic FID Inception-V3" in r.stdout, r.output
    r = runner().invoke(cli.convert_cmd, [str(onnx_path), "-o", str(npz)])
    assert r.exit_code == 0, r.output
    w = load_weights(npz)
    assert (w.network, w.arrays["fc.weight"].shape, w.count_include_pad) == ("fid", (1008, 2048), False)
    r = runner().invoke(cli.convert_cmd, ["--synthetic", str(tmp_path / "x.onnx"), "--fid", "--transform-input"])
    assert r.exit_code == 2 and "torchvision's" in one_line_error(r)


def test_run_with_the_fid_network_numbers_its_classes_everywhere(image_dir, tmp_path, monkeypatch):
    """The FID network's 1008 classes are TF's, not ImageNet's: every class is "class N" (those below 1000 too) in
    the text, --json, JSONL and CSV, said once in a note; its JSONL lines read back for --resume."""
    from inception_engine.labels import NUMBERED_NOTE

    from helpers.random_weights import random_arrays
    from inception_engine.weights import save_weights

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    manifest = {"network": "fid", "count_include_pad": False, "input": {"mean": [0.5] * 3, "std": [0.5] * 3,
                                                                       "size": 75, "resize": 75}}
    fid = save_weights(tmp_path / "fid.npz", random_arrays(7, "fid"), manifest)
    images = [str(image_dir / "a_rgb.jpg"), str(image_dir / "b_grey.png")]
    base = [*images, "--weights", str(fid), "--backend", "cpu", "--top-k", "30"]
    numbered = re.compile(r"class (\d+)")

    def named_by_index(pairs: list[tuple[int, str]]) -> None:
        assert len(pairs) == 60 and min(i for i, _ in pairs) < 1000  # ImageNet's indices among them
        assert all(label == f"class {i}" for i, label in pairs), pairs

    text = runner().invoke(cli.run_cmd, base)
    assert text.exit_code == 0 and text.stderr.count(NUMBERED_NOTE) == 1, text.output
    rows = [l.split(None, 1)[1].rsplit(" (", 1) for l in text.stdout.splitlines() if l.startswith("  ")]
    named_by_index([(int(index.rstrip(")")), label) for label, index in rows])
    again = runner().invoke(cli.run_cmd, base)
    assert again.exit_code == 0 and NUMBERED_NOTE not in again.stderr  # said once

    doc = json.loads(runner().invoke(cli.run_cmd, [*base, "--json"]).stdout)
    named_by_index([(t["index"], t["label"]) for e in doc["results"] for t in e["top"]])

    out = tmp_path / "r.jsonl"
    assert runner().invoke(cli.run_cmd, [*base, "--output", str(out)]).exit_code == 0
    named_by_index([(t["index"], t["label"]) for l in out.read_text().splitlines() for t in json.loads(l)["top"]])
    resumed = runner().invoke(cli.run_cmd, [*base, "--output", str(out), "--resume"])
    assert resumed.exit_code == 0 and "2 of 2" in resumed.output and len(out.read_text().splitlines()) == 2, \
        resumed.output

    csv_out = tmp_path / "r.csv"
    assert runner().invoke(cli.run_cmd, [*base, "--output", str(csv_out)]).exit_code == 0
    cells = [row.split(",") for row in csv_out.read_text().splitlines()[1:]]
    named_by_index([(int(c[2 + 3 * j]), c[3 + 3 * j]) for c in cells for j in range(30)])
    assert all(numbered.fullmatch(c[3]) for c in cells)


def test_run_resize_names_whose_preprocessing_runs(weights_file, image_dir):
    """--resize gives the engine's resize: each tool's preprocessing changes the results as Engine(resize=...) does;
    the default is the weight file's network's (torchvision's for the classifier)."""
    from inception_engine.output import rounded

    image = image_dir / "a_rgb.jpg"

    def probs(*extra: str) -> list[tuple[int, float]]:
        r = runner().invoke(cli.run_cmd, [str(image), "--weights", str(weights_file), "--backend", "cpu", "--json",
                                          "--top-k", "3", *extra])
        assert r.exit_code == 0, r.output
        return [(t["index"], t["prob"]) for t in json.loads(r.stdout)["results"][0]["top"]]

    default = probs()
    assert probs("--resize", "torchvision") == default
    for mode in ("pytorch-fid", "clean-fid"):
        with engine.Engine(weights_file, backend="cpu", resize=mode) as e:
            want = [(i, rounded(p)) for i, _, p in e.predict([image], top_k=3)[0].top]
        got = probs("--resize", mode)
        assert got != default and got == want, mode


@pytest.mark.parametrize("extra, words", [
    (["--weights", "W", "--ray", "auto", "--output", "out"], "--resize is for this machine's engines"),
    (["--server", "http://127.0.0.1:9"], "--resize is the server's to choose (it resizes as its weight file's")])
def test_run_resize_refusals_are_one_line(weights_file, image_dir, extra, words, monkeypatch):
    monkeypatch.setattr("inception_engine.ray_data.require_ray", lambda: None)
    extra = [str(weights_file) if a == "W" else a for a in extra]
    r = runner().invoke(cli.run_cmd, [str(image_dir / "a_rgb.jpg"), "--resize", "pytorch-fid", *extra])
    assert r.exit_code == 2 and words in one_line_error(r), r.output
