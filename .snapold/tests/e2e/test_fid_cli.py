"""inception-fid through click's CliRunner: the scores against fid.py on the engine's own features, statistics files
in and out, KID and IS from the same pass, one-line usage errors, exit 1 for unreadable images."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine import fid_command
from inception_engine.engine import Engine
from inception_engine.fid import frechet_distance, inception_score, kernel_inception_distance, load_stats
from inception_engine.weights import save_weights

from helpers.cli import one_line_error, runner
from helpers.random_weights import random_arrays

SIZE = 75  # the network's smallest input: the FID resize goes to 75x75, so that the CPU forwards are quick


@pytest.fixture(scope="module")
def fid_weights(tmp_path_factory) -> Path:
    manifest = {"network": "fid", "count_include_pad": False, "source_name": "random FID-shaped weights",
                "input": {"mean": [0.5] * 3, "std": [0.5] * 3, "size": SIZE, "resize": SIZE}}
    return save_weights(tmp_path_factory.mktemp("w") / "fid.npz", random_arrays(7, "fid"), manifest)


def folder(root: Path, name: str, n: int, seed: int, bright: float) -> Path:
    d = root / name
    d.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        base = rng.integers(0, 200, (6, 6, 3)).astype(np.float64) * bright
        im = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).resize((64, 48), Image.BILINEAR)
        im.save(d / f"{i:02d}.png")
    return d


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("imgs")
    return folder(root, "a", 12, 1, 1.0), folder(root, "b", 10, 2, 1.25)


def run(*args: str):
    return runner().invoke(fid_command.fid_cmd, [str(a) for a in args])


def test_scores_are_fid_py_on_the_engines_features(fid_weights, dirs):
    a, b = dirs
    r = run(a, b, "--weights", fid_weights, "--backend", "cpu", "--kid", "--isc", "--json", "--batch-size", "4")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["network"], doc["resize"], doc["backend"]) == ("fid", "pytorch-fid", "cpu")
    assert doc["images"] == {str(a): 12, str(b): 10}
    with Engine(fid_weights, backend="cpu", batch_size=4) as engine:
        fa, _ = engine.features(sorted(str(p) for p in a.iterdir()))
        fb, _ = engine.features(sorted(str(p) for p in b.iterdir()))
        w, bias = (engine.weights.arrays[k].astype(np.float64) for k in ("fc.weight", "fc.bias"))
    stats = [(f.astype(np.float64).mean(0), np.cov(f.astype(np.float64), rowvar=False)) for f in (fa, fb)]
    want = frechet_distance(*stats[0], *stats[1])
    # 12 and 10 images in 2048 dimensions: singular covariances, whose zero eigenvalues leave ~1e-9 of noise
    assert want > 0 and doc["fid"] == pytest.approx(want, rel=1e-6)
    assert doc["kid"]["mean"] == pytest.approx(kernel_inception_distance(fa, fb)[0], rel=1e-9)
    assert doc["kid"]["subset_size"] == 10 and doc["kid"]["subsets"] == 100
    assert doc["isc"]["mean"] == pytest.approx(inception_score(fa.astype(np.float64) @ w.T + bias)[0], rel=1e-6)
    text = run(a, b, "--weights", fid_weights, "--backend", "cpu")
    assert text.exit_code == 0 and text.stdout.startswith("FID: ") and "KID" not in text.stdout, text.output
    assert float(text.stdout.split()[1]) == pytest.approx(want, abs=1e-6)


def test_statistics_saved_and_reused_give_the_same_fid(fid_weights, dirs, tmp_path):
    a, b = dirs
    stats = tmp_path / "a.npz"
    r = run(a, "--save-stats", stats, "--weights", fid_weights, "--backend", "cpu", "--json")
    assert r.exit_code == 0 and f"wrote {stats}" in r.stderr, r.output
    mu, sigma = load_stats(stats)
    assert mu.dtype == sigma.dtype == np.float64 and sigma.shape == (2048, 2048)
    both = json.loads(run(a, b, "--weights", fid_weights, "--backend", "cpu", "--json").stdout)["fid"]
    reused = json.loads(run(stats, b, "--weights", fid_weights, "--backend", "cpu", "--json").stdout)["fid"]
    assert reused == pytest.approx(both, rel=1e-12)
    files = json.loads(run(stats, stats, "--json").stdout)  # no engine needed: two statistics files
    assert files["fid"] == pytest.approx(0, abs=1e-6) and "backend" not in files


def test_a_statistics_file_is_factored_while_the_engine_starts(fid_weights, dirs, tmp_path, monkeypatch):
    """A against B's statistics: B's covariance is factored on a thread of its own beside the engine's start, and
    the FID is the digits of A's statistics against B's, the same factor taken."""
    import threading

    a, b = dirs
    sa, sb = tmp_path / "a.npz", tmp_path / "b.npz"
    for d, s in ((a, sa), (b, sb)):
        assert run(d, "--save-stats", s, "--weights", fid_weights, "--backend", "cpu").exit_code == 0
    threads: list[str] = []
    real = fid_command.covariance_root

    def recorded(sigma):
        threads.append(threading.current_thread().name)
        return real(sigma)

    monkeypatch.setattr(fid_command, "covariance_root", recorded)
    folder_vs_file = json.loads(run(a, sb, "--weights", fid_weights, "--backend", "cpu", "--json").stdout)["fid"]
    assert len(threads) == 1 and threads[0].startswith("fid-root")
    files = json.loads(run(sa, sb, "--json").stdout)["fid"]
    assert folder_vs_file == files  # the same statistics and the same factor: the same digits
    want = frechet_distance(*load_stats(sb), *load_stats(sa))
    assert folder_vs_file == pytest.approx(want, rel=1e-12)


def test_resize_names_another_tools_preprocessing(fid_weights, dirs):
    a, b = dirs
    docs = {m: json.loads(run(a, b, "--weights", fid_weights, "--backend", "cpu", "--json", "--resize", m).stdout)
            for m in ("pytorch-fid", "clean-fid")}
    assert docs["clean-fid"]["resize"] == "clean-fid" and docs["clean-fid"]["fid"] != docs["pytorch-fid"]["fid"]


@pytest.mark.parametrize("args,words", [
    (["{a}"], "give two folders"),
    (["{a}", "{tmp}/missing"], "neither a folder of images nor a statistics file"),
    (["{a}", "{stats}", "--kid"], "--kid needs both sides' features"),
    (["{stats}", "{a}", "--isc"], "--isc scores the images of A"),
    (["{stats}", "{a}", "--save-stats", "{tmp}/x.npz"], "statistics file already"),
    (["{a}", "{b}", "--resize", "tf"], "invalid value for '--resize'"),
])
def test_usage_errors_are_one_line_exit_2(fid_weights, dirs, tmp_path, args, words):
    a, b = dirs
    stats = tmp_path / "s.npz"
    np.savez(stats, mu=np.zeros(2), sigma=np.eye(2))
    r = run(*(x.format(a=a, b=b, tmp=tmp_path, stats=stats) for x in args), "--weights", fid_weights)
    assert r.exit_code == 2 and words in one_line_error(r), r.output


def test_an_unreadable_image_stops_the_score_with_exit_1(fid_weights, dirs, tmp_path):
    a, _ = dirs
    bad = folder(tmp_path, "bad", 3, 4, 1.0)
    (bad / "zz.png").write_text("not an image")
    r = run(a, bad, "--weights", fid_weights, "--backend", "cpu")
    assert r.exit_code == 1 and "1 of 4 images" in one_line_error(r) and "zz.png" in r.stderr, r.output
    assert r.stdout == ""


def test_the_default_precision_is_fp32(fid_weights, dirs, monkeypatch):
    """A score is set beside other tools' scores: the engine is asked for fp32 unless --precision says otherwise
    (auto would take tf32 on a GPU, which moves the FID)."""
    asked = []
    real = Engine.from_config

    def from_config(config):
        asked.append(config.precision)
        return real(config)

    monkeypatch.setattr(Engine, "from_config", staticmethod(from_config))
    a, b = dirs
    for extra in ([], ["--precision", "auto"]):
        r = run(a, b, "--weights", fid_weights, "--backend", "cpu", "--batch-size", "4", *extra)
        assert r.exit_code == 0, r.output
    assert asked == ["fp32", "auto"]


def test_without_a_c_compiler_the_pillow_resize_is_said_in_one_line(fid_weights, dirs, monkeypatch, tmp_path):
    """pytorch-fid's resize on the host is C (cpu_src/fid_resize.c); where it cannot be built, the Pillow resize
    runs instead and the run says so once, on stderr, with the score still computed."""
    from inception_engine.ingest import fid_resize

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # notes are said once a machine: a fresh one
    a, b = dirs
    ok = run(a, b, "--weights", fid_weights, "--backend", "cpu", "--batch-size", "4")
    assert ok.exit_code == 0 and fid_resize.PILLOW_FID_RESIZE_NOTE not in ok.stderr
    monkeypatch.setattr(fid_resize, "fid_library", lambda: None)
    monkeypatch.setattr("inception_engine.engine.fid_library", lambda: None)
    r = run(a, b, "--weights", fid_weights, "--backend", "cpu", "--batch-size", "4", "--workers", "1")
    assert r.exit_code == 0, r.output
    assert r.stderr.count(fid_resize.PILLOW_FID_RESIZE_NOTE) == 1
    assert abs(float(r.stdout.split()[-1]) - float(ok.stdout.split()[-1])) < 1e-3 * abs(float(ok.stdout.split()[-1]))
