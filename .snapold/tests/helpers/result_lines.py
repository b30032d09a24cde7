"""inception-run's --output JSON lines, read back and compared, for the tests that run the engine more than one way
(Ray, worker processes, a server); and any of its outputs as text, compared to float32 rounding."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest


def read_rows(path: Path) -> list[dict]:
    """The rows of a .jsonl file, or of every .jsonl file in a directory (Ray writes one per block)."""
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def assert_same_results(a: list[dict], b: list[dict]) -> None:
    """The same images in the same order with the same errors and classes; probabilities to float32 rounding: the
    cpu backend's sums come out a few ulp apart for another batch size, and which images share a batch depends on
    how the work was cut up."""
    assert [r["image"] for r in a] == [r["image"] for r in b]
    for x, y in zip(a, b):
        assert x.get("error") == y.get("error")
        top_x, top_y = x.get("top", []), y.get("top", [])
        assert [(t["index"], t["label"]) for t in top_x] == [(t["index"], t["label"]) for t in top_y]
        assert [t["prob"] for t in top_x] == pytest.approx([t["prob"] for t in top_y], rel=1e-5)


NUMBER = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")


def same_but_last_digits(a: str, b: str, rel: float = 1e-5) -> bool:
    """Whether two outputs (text, JSON, JSON lines, CSV) are the same text around their decimal numbers, and those
    numbers within ``rel``: what assert_same_results asks of rows, for any output format."""
    if NUMBER.split(a) != NUMBER.split(b):
        return False
    x, y = (np.array([float(v) for v in NUMBER.findall(t)]) for t in (a, b))
    return x.shape == y.shape and bool(np.all(np.abs(x - y) <= rel * np.maximum(np.abs(x), np.abs(y))))
