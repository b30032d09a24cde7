"""inception-run on a real terminal (a pseudo-terminal as both stdout and stderr, as in an interactive shell): the
progress bar and the results never share a line, and a terminal too narrow for a bar gets none (no blank lines)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine.weights import save_weights

from helpers.random_weights import random_arrays

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, list[str]]:
    """Small weights (75 px input: quick forwards) and six images."""
    d = tmp_path_factory.mktemp("tty")
    weights = save_weights(d / "w.npz", random_arrays(5), {"count_include_pad": True,
                                                           "input": {"size": 75, "resize": 86}})
    rng = np.random.default_rng(8)
    paths = []
    for i in range(6):
        paths.append(str(d / f"p{i}.jpg"))
        Image.fromarray(rng.integers(0, 256, (80, 90, 3), dtype=np.uint8)).save(paths[-1])
    return weights, paths


def run_on_terminal(args: list[str], columns: int) -> bytes:
    """Everything inception-run writes to a pseudo-terminal of ``columns`` x 24 that is its stdout and stderr."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns)}
    proc = subprocess.Popen([sys.executable, "-c", "from inception_engine.cli import run_main; run_main()", *args],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0, out.decode(errors="replace")
    return out


def screen_lines(raw: bytes) -> list[str]:
    """What each line of the terminal finally shows: a carriage return moves back to the line's start and later
    characters overwrite earlier ones (what tqdm's redraws and clears rely on)."""
    lines = []
    for line in raw.decode().replace("\r\n", "\n").split("\n"):
        shown: list[str] = []
        col = 0
        for ch in line:
            if ch == "\r":
                col = 0
                continue
            if col < len(shown):
                shown[col] = ch
            else:
                shown.append(ch)
            col += 1
        lines.append("".join(shown).rstrip())
    return lines


@pytest.mark.parametrize("as_json", [False, True])
def test_results_and_the_progress_bar_never_share_a_line(small, as_json):
    weights, paths = small
    raw = run_on_terminal([*paths, "--weights", str(weights), "--backend", "cpu", "--batch-size", "1", "--top-k",
                           "1", *(["--json"] if as_json else [])], columns=100)
    lines = screen_lines(raw)
    assert b"classifying" in raw, raw  # the bar was drawn ...
    for line in lines:  # ... and no line holds a bar and a result
        assert not ("classifying" in line and (".jpg" in line or "prob" in line or "#" in line)), lines
    results = [l for l in lines if l.endswith(".jpg") or '"image"' in l]
    assert [r.strip().removeprefix('"image": "').rstrip('",') for r in results] == paths


def test_no_bar_and_no_blank_lines_on_a_zero_width_terminal(small):
    weights, paths = small
    raw = run_on_terminal([*paths, "--weights", str(weights), "--backend", "cpu", "--batch-size", "1", "--top-k",
                           "1"], columns=0)
    assert b"classifying" not in raw
    lines = screen_lines(raw)
    assert lines[-1] == "" and "" not in lines[:-1], lines  # only the final newline's empty tail
    assert len(lines[:-1]) == 1 + 2 * len(paths)  # the header, then a path and its class per image
