"""What the fuzz tests share: inception-run in a subprocess of its own (real stdout encoding, real signals), small
random weights, and readers of its result files that keep file names' bytes (surrogateescape)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

from inception_engine.output import NAME_ERRORS

ROOT = Path(__file__).resolve().parents[2]


def run_cli(args: list[str], weights: Path, env: dict[str, str] | None = None, top_k: int = 3,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """inception-run ARGS on the cpu backend, stdout and stderr as bytes."""
    return subprocess.run([sys.executable, "-c", "from inception_engine.cli import run_main; run_main()", *args,
                           "--weights", str(weights), "--backend", "cpu", "--batch-size", "4", "--top-k",
                           str(top_k)], capture_output=True, timeout=timeout, cwd=ROOT, check=False,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))


def start_cli(args: list[str], weights: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "from inception_engine.cli import run_main; run_main()", *args,
                             "--weights", str(weights), "--backend", "cpu", "--batch-size", "2", "--top-k", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), **env))


def stderr_lines(r: subprocess.CompletedProcess) -> list[str]:
    text = r.stderr.decode("utf-8", NAME_ERRORS)
    assert "Traceback" not in text, text
    return text.splitlines()


def jsonl_rows(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.decode("ascii").splitlines()]


def csv_rows(path: Path) -> list[dict]:
    """A CSV result file as JSONL-like dicts ({"image", "error"} or {"image", "top": [indices]})."""
    rows = list(csv.reader(io.StringIO(path.read_bytes().decode("utf-8", NAME_ERRORS), newline="")))
    out = []
    for row in rows[1:]:
        if row[1]:
            out.append({"image": row[0], "error": row[1]})
        else:
            out.append({"image": row[0], "top": [{"index": int(i)} for i in row[2:-3:3]]})  # then backend, precision,
            # model
    return out


def summary(rows: list[dict]) -> list[tuple[str, str | None, list[int]]]:
    """(image, error, class indices) per row: what two result files must agree on."""
    return [(r["image"], r.get("error"), [t["index"] for t in r.get("top", [])]) for r in rows]
