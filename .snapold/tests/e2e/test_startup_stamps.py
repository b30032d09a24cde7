"""dev/startup_stamps.py on the cpu backend: the stamps of one inception-run's steps, in the order they run. The
script is what finds where a GPU run's start-up goes on the lent machine, so it is kept working here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from inception_engine.weights import save_weights

from helpers.random_weights import random_arrays

ROOT = Path(__file__).resolve().parents[2]


def test_startup_stamps_of_a_cpu_run(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "dev"))
    import startup_stamps

    weights = save_weights(tmp_path / "w.npz", random_arrays(3), {"count_include_pad": True,
                                                                  "input": {"size": 75, "resize": 86}})
    (tmp_path / "photos").mkdir()
    for i in range(3):
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (90, 100, 3), dtype=np.uint8)).save(
            tmp_path / "photos" / f"{i}.jpg")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    wall, code, said, procs = startup_stamps.stamps([str(tmp_path / "photos"), "--weights", str(weights),
                                                     "--backend", "cpu", "--output", str(tmp_path / "o.jsonl")])
    assert code == 0 and "3 images (0 errors)" in said
    (proc,) = procs
    first = {step: (a, b) for step, a, b, _ in reversed(proc["events"])}
    order = ["Engine._start", "expand_inputs", "write_results", "Engine.close", "ResultFile.close", "exit"]
    assert [first[step][0] for step in order] == sorted(first[step][0] for step in order)
    assert 0 < proc["start"] < first["Engine._start"][0] and first["exit"][1] < wall


def test_a_process_that_leaves_by_os_exit_is_stamped(tmp_path):
    env = {"IE_STAMPS": str(tmp_path / "stamps"), "PYTHONPATH": str(ROOT / "dev" / "stamps"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", "import os; os._exit(3)"], env=env)
    assert done.returncode == 3
    (stamp,) = (tmp_path / "stamps").glob("*.json")
    assert [e[0] for e in json.loads(stamp.read_text())["events"]] == ["exit"]
