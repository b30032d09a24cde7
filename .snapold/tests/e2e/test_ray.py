"""Ray Data (ray_data.py) on a local two-CPU Ray cluster with the cpu backend: the same lines as inception-run, a
bad image as one error row, one engine per actor for all its batches; inception-run --ray; the one-line error
without Ray. The cluster starts once for the module (a few seconds); images are small (75 px input) so the
forwards are quick."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine import cli
from inception_engine.weights import save_weights

from helpers.cli import runner
from helpers.random_weights import random_arrays
from helpers.result_lines import assert_same_results, read_rows

# One local Ray cluster for the module (ray_session), not one in each pytest-xdist worker, where --dist loadgroup
# groups (pytest-xdist 3.8 cannot with pytest 9.2: then each worker that takes a Ray test starts a cluster).
pytestmark = pytest.mark.xdist_group("ray")

SIZE, RESIZE = 75, 86
TOP_K = 3


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install -e '.[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=256 * 2**20)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    return save_weights(tmp_path_factory.mktemp("weights") / "small.npz", random_arrays(7),
                        {"count_include_pad": True, "input": {"size": SIZE, "resize": RESIZE}})


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """A dozen JPEGs and PNGs of assorted shapes, and bad.jpg, which is not an image."""
    d = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(5)
    for i in range(12):
        h, w = (90 + 5 * i, 120) if i % 2 else (120, 95 + 4 * i)
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(d / f"{i:02d}.{'png' if i % 3 else 'jpg'}")
    (d / "bad.jpg").write_text("not a picture")
    return d


def by_image(rows: list[dict]) -> list[dict]:
    """Ray writes in whatever order the blocks finish."""
    return sorted(rows, key=lambda r: r["image"])


@pytest.fixture(scope="module")
def inception_run_lines(photos, weights_file, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("run") / "out.jsonl"
    result = runner().invoke(cli.run_cmd, [str(photos), "--weights", str(weights_file), "--backend", "cpu",
                                           "--top-k", str(TOP_K), "--batch-size", "4", "--output", str(out)])
    assert result.exit_code == 1, result.output  # 1: bad.jpg
    return by_image(read_rows(out))


def test_dataset_gives_inception_runs_lines_and_one_engine_per_actor(ray_session, photos, weights_file,
                                                                     inception_run_lines, tmp_path):
    from inception_engine.ray_data import classify_dataset, jsonl_datasink

    ds = ray_session.data.read_binary_files(str(photos), include_paths=True)
    # two actors of half a CPU each leave a CPU for the read and decode tasks (all of it reserved: a deadlock)
    results = classify_dataset(ds, str(weights_file), gpus=0, cpu_actors=2, actor_cpus=0.5, batch_size=4,
                               top_k=TOP_K, diagnostics=True).materialize()
    rows = results.take_all()
    assert len(rows) == 13
    per_worker = {w: sum(r["worker"] == w for r in rows) for w in {r["worker"] for r in rows}}
    assert len(per_worker) <= 2 and max(per_worker.values()) > 4  # an actor called for two batches at least ...
    assert all(r["engines_built"] == 1 for r in rows)  # ... built its engine (loaded the weights) once
    errors = [r for r in rows if r["error"]]
    assert len(errors) == 1 and errors[0]["path"].endswith("bad.jpg") and len(errors[0]["top_index"]) == 0

    results.write_datasink(jsonl_datasink(str(tmp_path / "out")))
    assert_same_results(by_image(read_rows(tmp_path / "out")), inception_run_lines)


def test_inception_run_ray(ray_session, photos, weights_file, inception_run_lines, tmp_path):
    out = tmp_path / "labels"
    result = runner().invoke(cli.run_cmd, ["--ray", "local", str(photos), "--weights", str(weights_file),
                                           "--backend", "cpu", "--top-k", str(TOP_K), "--batch-size", "4",
                                           "--output", str(out)])
    assert result.exit_code == 1, result.output  # bad.jpg, as inception-run
    assert "13 images (1 error) in " in result.stderr and " on 1 CPU actor, " in result.stderr
    assert "error: 1 of 13" in result.stderr
    assert_same_results(by_image(read_rows(out)), inception_run_lines)
    again = runner().invoke(cli.run_cmd, ["--ray", "local", str(photos), "--weights", str(weights_file),
                                          "--output", str(out)])
    assert again.exit_code == 2 and "holds files already" in again.stderr


def test_more_gpus_than_the_local_cluster_has_is_one_line(ray_session, photos, weights_file, tmp_path):
    # the module's cluster has no GPU: without the check Ray would wait for one forever
    result = runner().invoke(cli.run_cmd, ["--ray", "local", str(photos), "--weights", str(weights_file),
                                           "--backend", "cpu", "--gpus", "1", "--output", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == "error: --gpus 1: the local Ray cluster has 0 GPUs; give 0 (a cpu-backend actor)"
    fp16 = runner().invoke(cli.run_cmd, ["--ray", "local", str(photos), "--weights", str(weights_file), "--gpus", "0",
                                         "--precision", "fp16", "--output", str(tmp_path / "out")])
    assert fp16.exit_code == 2, fp16.output
    assert fp16.stderr.strip() == "error: --precision fp16: a job without GPUs runs the cpu backend, which computes " \
                                  "in fp32 only; give fp32, or auto"


def test_without_ray_one_line(monkeypatch, photos, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as where it is not installed
    result = runner().invoke(cli.run_cmd, ["--ray", "local", str(photos), "--output", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --ray needs Ray Data: pip install -e '.[ray]'"


def test_local_image_files_walks_directories_and_gives_up_on_uris(tmp_path):
    from inception_engine.ray_data import local_image_files, top_level_files

    for d in ("sub", ".hidden"):
        (tmp_path / d).mkdir()
    for name in ("a.jpg", "b.PNG", "notes.txt", "sub/c.jpeg", "sub/_d.jpg", ".e.jpg", ".hidden/f.jpg"):
        (tmp_path / name).write_bytes(b"x")
    exts = {".jpg", ".jpeg", ".png"}
    # as inception-run --recursive lists a directory: hidden names left out at every level
    assert local_image_files([str(tmp_path)], exts) == [str(tmp_path / n) for n in ("a.jpg", "b.PNG", "sub/_d.jpg",
                                                                                   "sub/c.jpeg")]
    assert local_image_files([str(tmp_path / "a.jpg"), str(tmp_path / "sub")], exts) == [
        str(tmp_path / "a.jpg"), str(tmp_path / "sub" / "_d.jpg"), str(tmp_path / "sub" / "c.jpeg")]
    assert local_image_files([str(tmp_path), "s3://bucket/photos/"], exts) is None
    # without --recursive: the top level, local or a URI's (listed through pyarrow, which Ray Data brings)
    assert top_level_files(str(tmp_path), exts) == [str(tmp_path / "a.jpg"), str(tmp_path / "b.PNG")]
    pytest.importorskip("pyarrow", reason="pyarrow comes with Ray Data (pip install -e '.[ray]')")
    assert top_level_files(f"file://{tmp_path}", exts) == [f"file://{tmp_path}/a.jpg", f"file://{tmp_path}/b.PNG"]


def test_inception_run_ray_searches_subfolders_only_with_recursive(ray_session, photos, weights_file, tmp_path):
    nested = tmp_path / "nested"
    (nested / "sub").mkdir(parents=True)
    for name in ("00.jpg", "01.png"):
        (nested / name).write_bytes((photos / name).read_bytes())
    (nested / "sub" / "02.png").write_bytes((photos / "02.png").read_bytes())
    args = ["--ray", "local", str(nested), "--weights", str(weights_file), "--backend", "cpu", "--top-k", "1"]
    top = runner().invoke(cli.run_cmd, [*args, "--output", str(tmp_path / "top")])
    assert top.exit_code == 0, top.output
    assert f"note: {nested}: 1 image in subfolders not searched (--recursive searches them)" in top.stderr
    assert sorted(r["image"] for r in read_rows(tmp_path / "top")) == [str(nested / "00.jpg"), str(nested / "01.png")]
    every = runner().invoke(cli.run_cmd, [*args, "--recursive", "--output", str(tmp_path / "every")])
    assert every.exit_code == 0 and "not searched" not in every.stderr
    rows = read_rows(tmp_path / "every")
    assert sorted(r["image"] for r in rows) == [str(nested / n) for n in ("00.jpg", "01.png", "sub/02.png")]
    assert {(r["backend"], r["precision"]) for r in rows} == {("cpu", "fp32")}
