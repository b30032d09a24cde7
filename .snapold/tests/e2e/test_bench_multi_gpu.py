"""dev/bench_multi_gpu.py end to end on the cpu backend (one 'GPU', CPU decode, no Ray): the script runs the
device machine's multi-GPU measurement, where a failure costs a lent machine's time, so it is kept working here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_multi_gpu_smoke(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    out = tmp_path / "mg.json"
    r = subprocess.run([sys.executable, "dev/bench_multi_gpu.py", "--images", "12", "--small", "4", "--backend",
                        "cpu", "--gpus", "1", "--precisions", "fp32", "--decodes", "cpu", "--no-ray", "--batch-size",
                        "4", "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert "error" not in row, row
    assert row["gpus"] == 1 and len(row["top1"]) == 12 and all(v >= 0 for v in row["top1"].values())
    assert row["images_per_s_steady"] > 0 and len(row["seconds_full"]) == 1
    assert any(k.startswith("decode_") and v > 0 for k, v in result["ceilings"].items())
    assert "inception-run  fp32  cpu       1" in r.stdout and "12/12" in r.stdout
