"""inception-run --gpus N without Ray (multi_gpu.py), on the cpu backend: N worker processes, the same file as one
process writes, in input order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine import backends, cli
from inception_engine.multi_gpu import deal
from inception_engine.weights import save_weights

from helpers.cli import runner
from helpers.random_weights import random_arrays
from helpers.result_lines import assert_same_results, read_rows


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    return save_weights(tmp_path_factory.mktemp("weights") / "small.npz", random_arrays(7),
                        {"count_include_pad": True, "input": {"size": 75, "resize": 86}})


@pytest.fixture
def two_gpus(monkeypatch) -> None:
    """The parent's GPU count check passes as on a two-GPU machine; the spawned workers run the cpu backend."""
    monkeypatch.setattr(backends, "usable_gpus", lambda: 2)


def test_deal_round_robin():
    paths = [str(i) for i in range(11)]
    assert deal(paths, 3, 2) == [["0", "1", "6", "7"], ["2", "3", "8", "9"], ["4", "5", "10"]]
    assert deal(paths[:3], 4, 2) == [["0", "1"], ["2"], [], []]


def one_process_and_two_workers(weights_file: Path, tmp_path: Path, kind: str, suffix: str) -> tuple[Path, Path]:
    """The files one process and two --gpus workers write for 11 photos and an unreadable 05b.jpg."""
    d = tmp_path / "photos"
    d.mkdir()
    rng = np.random.default_rng(2)
    for i in range(11):
        Image.fromarray(rng.integers(0, 256, (90, 100 + 3 * i, 3), dtype=np.uint8)).save(d / f"{i:02d}.jpg")
    (d / "05b.jpg").write_text("not a picture")
    args = [str(d), "--weights", str(weights_file), "--backend", "cpu", "--batch-size", "2", "--top-k", "3",
            "--worker-kind", kind, "--workers", "2"]
    one = runner().invoke(cli.run_cmd, [*args, "--output", str(tmp_path / f"one{suffix}")])
    two = runner().invoke(cli.run_cmd, [*args, "--gpus", "2", "--output", str(tmp_path / f"two{suffix}")])
    assert one.exit_code == two.exit_code == 1, two.output  # 05b.jpg
    return tmp_path / f"one{suffix}", tmp_path / f"two{suffix}"


@pytest.mark.parametrize("kind", ["thread", "process"])  # process: each worker starts decode processes of its own
def test_two_workers_write_what_one_process_writes(weights_file, tmp_path, kind, two_gpus):
    one, two = one_process_and_two_workers(weights_file, tmp_path, kind, ".jsonl")
    rows = read_rows(two)
    assert len(rows) == 12 and rows[6]["image"].endswith("05b.jpg") and "error" in rows[6]
    assert_same_results(read_rows(one), rows)


def test_two_workers_write_the_csv_one_process_writes(weights_file, tmp_path, two_gpus):
    """The workers render each CSV row themselves (output.Rendered): one header, the rows in input order, the
    unreadable file's error in its place, the same classes as one process."""
    import csv

    a, b = (list(csv.reader(f.open(newline=""))) for f in one_process_and_two_workers(weights_file, tmp_path,
                                                                                       "thread", ".csv"))
    assert a[0] == b[0] and b[0][0] == "image" and sum(row == b[0] for row in b) == 1
    assert len(b) == 13 and b[7][0].endswith("05b.jpg") and b[7][1]  # after the header and 00..05
    assert [(r[0], r[1], r[2], r[5]) for r in a] == [(r[0], r[1], r[2], r[5]) for r in b]  # image, error, classes


def test_gpus_zero_without_ray_is_a_one_line_error(tmp_path):
    result = runner().invoke(cli.run_cmd, [str(tmp_path), "--gpus", "0"])
    assert result.exit_code == 2 and result.stderr.strip().startswith("error: --gpus 0 is for --ray")


def test_stopping_early_ends_the_workers(weights_file, tmp_path, two_gpus):
    """A consumer that stops after the first result (an error elsewhere, Ctrl-C): the workers, each with decode
    processes and results it can no longer hand over, are ended within seconds."""
    import multiprocessing
    import time

    from inception_engine.multi_gpu import predict_on_gpus

    rng = np.random.default_rng(3)
    paths = []
    for i in range(48):
        paths.append(str(tmp_path / f"{i:02d}.jpg"))
        Image.fromarray(rng.integers(0, 256, (80, 90, 3), dtype=np.uint8)).save(paths[-1])
    stream = predict_on_gpus(paths, 2, 1, str(weights_file), "cpu", 2, "auto", 2, "process")
    assert next(stream).ok
    t0 = time.perf_counter()
    stream.close()
    assert time.perf_counter() - t0 < 25 and multiprocessing.active_children() == []
