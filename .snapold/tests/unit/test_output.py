"""inception-run --output FILE.jsonl / .csv, --resume, interruption, and the new options' one-line errors."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine import cli, engine
from inception_engine.output import as_json, csv_row, read_lines
from inception_engine.pipeline import Prediction
from inception_engine.weights import save_weights

from helpers.cli import one_line_error, runner
from helpers.random_weights import random_arrays


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    """Small images (75x75 input) keep the CPU forwards quick."""
    return save_weights(tmp_path_factory.mktemp("w") / "w.npz", random_arrays(5),
                        {"count_include_pad": True, "input": {"size": 75, "resize": 86}})


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(2)
    for i in range(9):
        Image.fromarray(rng.integers(0, 256, (80 + i, 100, 3), dtype=np.uint8)).save(d / f"p{i}.jpg")
    (d / "p4.jpg").write_text("broken")
    return d


def model_name(weights: Path) -> str:
    from inception_engine.weights import load_weight_file

    return load_weight_file(weights).model_id().name


def run(*args: str):
    return runner().invoke(cli.run_cmd, [*args, "--backend", "cpu", "--batch-size", "2", "--workers", "2"])


def lines(path: Path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_jsonl_has_one_line_per_image_in_order_like_json(weights_file, photos, tmp_path):
    out = tmp_path / "r.jsonl"
    r = run(str(photos), "--weights", str(weights_file), "--output", str(out), "--top-k", "3")
    assert r.exit_code == 1 and r.stdout == ""  # p4 is broken; results go to the file, not the terminal
    assert "9 images (1 error) in " in r.stderr and "on the cpu backend, fp32" in r.stderr and str(out) in r.stderr
    got = lines(out)
    doc = json.loads(run(str(photos), "--weights", str(weights_file), "--json", "--top-k", "3").stdout)
    assert got == doc["results"]
    assert all((e["backend"], e["precision"]) == ("cpu", "fp32") for e in got if "top" in e)
    assert [e["image"] for e in got] == [str(photos / f"p{i}.jpg") for i in range(9)]
    assert "error" in got[4] and "not an image" in got[4]["error"]


def test_existing_file_needs_resume_and_resume_needs_a_file(weights_file, photos, tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"image": "x"}\n')
    assert "--resume" in one_line_error(run(str(photos), "--weights", str(weights_file), "--output", str(out)))
    assert "give the file" in one_line_error(run(str(photos), "--weights", str(weights_file), "--resume"))
    assert ".jsonl or .csv" in one_line_error(run(str(photos), "--weights", str(weights_file), "--output",
                                                  str(tmp_path / "r.txt")))
    assert "choose one" in one_line_error(run(str(photos), "--weights", str(weights_file), "--output",
                                              str(tmp_path / "n.jsonl"), "--json"))
    assert one_line_error(run(str(photos), "--weights", str(weights_file), "--precision", "fp16")) == \
        "error: --precision fp16: the cpu backend computes in fp32 only; give fp32, or auto"
    assert "--decode gpu: needs the cuda backend" in one_line_error(run(str(photos), "--weights", str(weights_file),
                                                                        "--decode", "gpu"))


def test_resume_skips_done_images_and_cuts_a_torn_last_line(weights_file, photos, tmp_path):
    full = tmp_path / "full.jsonl"
    run(str(photos), "--weights", str(weights_file), "--output", str(full))
    whole = full.read_text().splitlines(keepends=True)
    part = tmp_path / "part.jsonl"
    part.write_text("".join(whole[:3]) + whole[3][:25])  # a crash in the middle of the fourth line
    r = run(str(photos), "--weights", str(weights_file), "--output", str(part), "--resume")
    assert r.exit_code == 1  # p4 is still broken
    assert "resume: 3 of 9 images" in r.stderr
    assert part.read_text().startswith("".join(whole[:3]))
    assert same_results(lines(part), lines(full))  # the torn line went, the rest was appended in order
    assert "; 1 damaged line dropped (their images run again)" in r.stderr
    before = part.read_text().splitlines(keepends=True)
    again = run(str(photos), "--weights", str(weights_file), "--output", str(part), "--resume")
    assert "resume: 8 of 9" in again.stderr and "1 that failed run again" in again.stderr  # p4's error, retried
    p4 = [line for line in before if "p4.jpg" in line]
    assert part.read_text().splitlines(keepends=True) == [line for line in before if line not in p4] + p4


def same_results(a: list[dict], b: list[dict]) -> bool:
    """Same images, errors and classes; probabilities to float32 rounding (batches form differently on resume)."""
    def key(e: dict) -> tuple:
        return e["image"], e.get("error"), [t["index"] for t in e.get("top", [])]

    probs = [t["prob"] for e in a for t in e.get("top", [])], [t["prob"] for e in b for t in e.get("top", [])]
    return [key(e) for e in a] == [key(e) for e in b] and np.allclose(*probs, rtol=1e-5)


def test_interrupted_run_leaves_whole_lines_and_resume_finishes(weights_file, photos, tmp_path, monkeypatch):
    real = engine.Engine.predict_iter

    def interrupted(self, images, top_k=5, on_progress=None, render=None):
        for i, p in enumerate(real(self, images, top_k, on_progress, render)):
            if i == 5:
                raise KeyboardInterrupt
            yield p

    out = tmp_path / "r.jsonl"
    monkeypatch.setattr(engine.Engine, "predict_iter", interrupted)
    r = run(str(photos), "--weights", str(weights_file), "--output", str(out))
    assert r.exit_code == 130 and "interrupted after 5 of 9" in r.stderr and "--resume" in r.stderr
    assert [e["image"] for e in lines(out)] == [str(photos / f"p{i}.jpg") for i in range(5)]
    monkeypatch.setattr(engine.Engine, "predict_iter", real)
    run(str(photos), "--weights", str(weights_file), "--output", str(out), "--resume")
    assert [e["image"] for e in lines(out)] == [str(photos / f"p{i}.jpg") for i in range(9)]


def test_csv_rows_and_top_k_must_match_on_resume(weights_file, photos, tmp_path):
    out = tmp_path / "r.csv"
    run(str(photos), "--weights", str(weights_file), "--output", str(out), "--top-k", "2")
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["image", "error", "top1_index", "top1_label", "top1_prob", "top2_index", "top2_label",
                       "top2_prob", "backend", "precision", "model"]
    assert len(rows) == 10 and rows[5][1] and rows[5][2:] == [""] * 9  # p4's error row
    assert float(rows[1][4]) >= float(rows[1][7]) > 0 and rows[1][8:] == ["cpu", "fp32", model_name(weights_file)]
    assert all(len(re.sub(r"^0\.0*|\.|e.*$", "", row[4])) <= 6 for row in rows[1:] if row[4])  # not repr's 17
    lines = read_lines(out.read_bytes(), "csv", out)
    assert lines.top_k == 2 and len(lines.records) == 9 and lines.damaged == lines.duplicates == 0
    assert len(lines.done) == 8  # p4's error row is not done: it runs again
    before = out.read_bytes()
    err = one_line_error(run(str(photos), "--weights", str(weights_file), "--output", str(out), "--resume",
                             "--top-k", "3"))
    assert "holds top-2 results; resume it with --top-k 2" in err and out.read_bytes() == before


def test_jsonl_refuses_another_top_k_on_resume_as_csv_does(weights_file, photos, tmp_path):
    out = tmp_path / "r.jsonl"
    run(str(photos), "--weights", str(weights_file), "--output", str(out), "--top-k", "5")
    before = out.read_bytes()
    err = one_line_error(run(str(photos), "--weights", str(weights_file), "--output", str(out), "--resume",
                             "--top-k", "2"))
    assert "holds top-5 results; resume it with --top-k 5" in err and out.read_bytes() == before


def test_prebuilding_the_kernels_without_a_gpu_is_one_line():
    import subprocess
    import sys

    from inception_engine import backends

    if backends.is_available("cuda")[0]:
        pytest.skip("a GPU is usable here: the command would build")
    r = subprocess.run([sys.executable, "-m", "inception_engine.cuda_build"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr


def test_long_runs_decode_in_processes_by_default(weights_file, photos, tmp_path, monkeypatch, decode_pool_kinds):
    """inception-run leaves the worker kind to the pipeline (auto), which takes processes from 256 images on."""
    from inception_engine import pipeline

    kinds = decode_pool_kinds
    monkeypatch.setattr(pipeline, "PROCESS_MIN_IMAGES", 9)
    run(str(photos), "--weights", str(weights_file), "--output", str(tmp_path / "a.jsonl"))
    monkeypatch.setattr(pipeline, "PROCESS_MIN_IMAGES", 10)
    run(str(photos), "--weights", str(weights_file), "--output", str(tmp_path / "b.jsonl"))
    assert kinds == ["process", "thread"]
    assert (tmp_path / "a.jsonl").read_text().count("\n") == 9


def test_probabilities_are_written_to_6_significant_digits_with_what_computed_them():
    p = Prediction("a.jpg", top=[(1, "goldfish", 0.9999999999349396), (2, "great white shark", 1.1812345678e-76)],
                   backend="cuda", precision="fp16", model="3f9a0c12ab45")
    assert as_json(p) == {"image": "a.jpg", "top": [{"index": 1, "label": "goldfish", "prob": 1.0},
                                                    {"index": 2, "label": "great white shark", "prob": 1.18123e-76}],
                          "backend": "cuda", "precision": "fp16", "model": "3f9a0c12ab45"}
    assert csv_row(p, 2) == ["a.jpg", "", "1", "goldfish", "1.0", "2", "great white shark", "1.18123e-76", "cuda",
                             "fp16", "3f9a0c12ab45"]
    assert as_json(Prediction("b.jpg", error="not an image")) == {"image": "b.jpg", "error": "not an image"}


def test_a_rewrite_cut_short_leaves_nothing_behind_the_next_run(weights_file, photos, tmp_path):
    """The temporary copy of a resume's rewrite, left by a run killed in the middle of it, is removed by the next
    run that holds the file's lock; a file the run created and never wrote to is removed too."""
    out = tmp_path / "r.jsonl"
    run(str(photos), "--weights", str(weights_file), "--output", str(out))
    stale = tmp_path / ".r.jsonl.x1y2.tmp"
    stale.write_text("half a rewrite")
    run(str(photos), "--weights", str(weights_file), "--output", str(out), "--resume")
    assert not stale.exists()
    r = run(str(photos), "--weights", str(tmp_path / "missing.npz"), "--output", str(tmp_path / "new.csv"))
    assert r.exit_code == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


def test_a_full_disk_is_one_line_and_the_whole_lines_stay_for_resume(weights_file, photos, tmp_path, monkeypatch):
    import errno

    from inception_engine import output

    real = output.write_all
    writes = []

    def full_after_two(fd, data):
        writes.append(data)
        if len(writes) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(output, "write_all", full_after_two)
    out = tmp_path / "r.jsonl"
    err = one_line_error(run(str(photos), "--weights", str(weights_file), "--output", str(out)))
    assert err == f"error: {out}: cannot write (No space left on device); make room, then continue with --resume"
    kept = lines(out)
    assert 0 < len(kept) < 9
    monkeypatch.setattr(output, "write_all", real)
    r = run(str(photos), "--weights", str(weights_file), "--output", str(out), "--resume")
    assert r.exit_code == 1 and f"resume: {len(kept)} of 9" in r.stderr and len(lines(out)) == 9


def test_a_csv_header_torn_by_a_crash_is_written_again(weights_file, photos, tmp_path):
    out = tmp_path / "r.csv"
    out.write_text("image,err")  # the first write cut short: no whole line at all
    r = run(str(photos), "--weights", str(weights_file), "--output", str(out), "--resume", "--top-k", "2")
    assert r.exit_code == 1 and "resume: 0 of 9 images" in r.stderr and "1 damaged line dropped" in r.stderr
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["image", "error", "top1_index", "top1_label", "top1_prob", "top2_index", "top2_label",
                       "top2_prob", "backend", "precision", "model"] and len(rows) == 10
    other = tmp_path / "other.csv"
    other.write_text("name,score\na.jpg,1\n")  # not ours: refused, left as it is
    assert "not the header inception-run writes" in one_line_error(run(str(photos), "--weights", str(weights_file),
                                                                       "--output", str(other), "--resume"))
    assert other.read_text() == "name,score\na.jpg,1\n"


def test_jsonl_lines_are_json_dumps_of_the_records_byte_for_byte():
    """output.jsonl_lines builds each line without json.dumps: the same bytes on fuzzed predictions (names with
    quotes, backslashes, non-ASCII and undecodable bytes; probabilities of every size; errors; labels of another
    list and NaN, which take json.dumps's own path)."""
    import json

    import numpy as np

    from inception_engine.labels import imagenet_labels
    from inception_engine.output import as_json, jsonl_bytes, jsonl_lines
    from inception_engine.pipeline import Prediction

    rng = np.random.default_rng(5)
    names = imagenet_labels()
    odd = ['a "quoted" name.jpg', "back\\slash.jpg", "ünïcode 写真.jpg", "bad\udcff.jpg", "tab\there.jpg", "x.jpg"]
    preds = []
    for n in range(400):
        k = int(rng.integers(1, 6))
        idx = [int(i) for i in rng.choice(len(names), k, replace=False)]
        probs = [float(x) for x in rng.random(k) * 10.0 ** float(rng.integers(-12, 1))]
        top = [(i, names[i], q) for i, q in zip(idx, probs)]
        kind = n % 8
        if kind == 4:  # the edges of the 6-digit form: no point, exponents, the ends of [0, 1]
            probs = [0.0, 1.0, 1e-05, 0.0001, 0.5, 1.5e-07][:k]
            top = [(i, names[i], q) for i, q in zip(idx, probs)]
        if kind == 5:
            top[0] = (top[0][0], "not this list's label", top[0][2])
        if kind == 6:
            top[-1] = (top[-1][0], top[-1][1], float("nan"))
        name = odd[n % len(odd)] + str(n)
        preds.append(Prediction(name, error=f"{name}: cannot decode") if kind == 7 else
                     Prediction(name, top=top, backend=("cuda", None)[n % 2], precision=("fp16", None)[n % 3 % 2],
                                model=("3f9a0c12ab45", None)[n % 5 % 2]))
    for p in preds:
        assert jsonl_lines([p])[0] == json.dumps(as_json(p)) + "\n", p
    assert jsonl_bytes(preds) == "".join(json.dumps(as_json(p)) + "\n" for p in preds).encode("ascii")
    # a stream's batches: one top length, backend and precision (rendered together), an error or an odd entry among
    # them (which sends the batch, or that entry, to json.dumps's path)
    for b in range(12):
        k = 1 + b % 5
        batch = []
        for n in range(64):
            idx = [int(i) for i in rng.choice(len(names), k, replace=False)]
            probs = [float(x) for x in rng.random(k) * 10.0 ** float(rng.integers(-12, 1))]
            if n % 16 == 3:
                probs = [0.0, 1.0, 1e-05, 0.0001, 1.5e-07][:k]
            batch.append(Prediction(odd[n % len(odd)] + f"{b}-{n}", top=[(i, names[i], q) for i, q in zip(idx, probs)],
                                    backend="cuda", precision="fp16", model="synthetic-3f9a0c12ab45"))
        if b % 3 == 1:
            batch[40] = Prediction(batch[40].image, error="cannot decode")
        if b % 3 == 2:
            p = batch[17]
            batch[17] = Prediction(p.image, top=[(i, label, float("nan")) for i, label, _ in p.top], backend="cuda",
                                   precision="fp16", model="synthetic-3f9a0c12ab45")
        assert jsonl_bytes(batch) == "".join(json.dumps(as_json(p)) + "\n" for p in batch).encode("ascii"), b


@pytest.mark.parametrize("network", ["torchvision", "fid"])
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_line_renderer_writes_what_render_writes_of_the_predictions(fmt, network):
    """output.line_renderer (the pipeline's finish for Engine.predict_iter's render) makes, from names and top-k
    pairs, the bytes that render makes of the same predictions: batches of plain results, with a decode error, with
    a NaN (json.dumps's path), with probabilities at the edges of the 6-digit form, odd names; with the labels of
    either network (the FID network's numbered, for all its 1008 classes)."""
    import numpy as np

    import json

    from inception_engine.labels import network_labels
    from inception_engine.output import as_json, line_renderer, plain_lines, render
    from inception_engine.pipeline import make_predictions

    labels = network_labels(network)

    rng = np.random.default_rng(8)
    odd = ['a "quoted" name.jpg', "back\\slash.jpg", "ünïcode 写真.jpg", "bad\udcff.jpg", "x.jpg"]
    by = ("cuda", "fp16", "3f9a0c12ab45")
    for b in range(8):
        names = [odd[n % len(odd)] + f"{b}-{n}" for n in range(24)]
        tops = [list(zip(rng.choice(len(labels), 4, replace=False).tolist(),
                         (rng.random(4) * 10.0 ** float(rng.integers(-9, 1))).tolist())) for _ in names]
        tops[5] = list(zip([1, 2, 3, 4], [1.0, 0.0, 0.9999999, 1e-05]))
        if b % 4 == 1:
            tops[7] = f"{names[7]}: cannot decode"
        if b % 4 == 2:
            tops[9] = [(i, float("nan")) for i, _ in tops[9]]
        if b % 4 == 3:
            tops = [f"{name}: cannot decode" for name in names]
        got = line_renderer(fmt, 4, by, labels)(names, tops)
        preds = make_predictions(names, tops, by, labels)
        assert all(label == labels[i] for p in preds if p.ok for i, label, _ in p.top)
        assert got == render(preds, fmt, 4), b
        if fmt == "jsonl" and b % 4 == 0:  # the predictions' lines made together, whichever network named them
            assert plain_lines(preds) is not None
        if fmt == "jsonl":  # and json.dumps's bytes, which share no code with either
            assert [r.line for r in got] == [(json.dumps(as_json(p)) + "\n").encode("ascii") for p in preds], b
