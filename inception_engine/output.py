"""Result files that survive large jobs: one line per image, appended as results arrive, resumable.

``--output FILE.jsonl`` writes one JSON object per line, ``{"image": PATH, "top": [{"index", "label", "prob"}],
"backend": B, "precision": P}`` or ``{"image": PATH, "error": MSG}``; ``FILE.csv`` one row per image, ``image,
error``, then index, label and probability of each of the top k, then ``backend, precision`` (empty for errors).
Probabilities are written to PROB_DIGITS significant digits: float32 logits carry no more. Lines are written whole, a batch at a time with one ``write`` (a killed process
leaves whole lines behind it), flushed to the OS at once and to the disk every few seconds and at the end. A
crash loses at most what had not been flushed: the batch in flight.

``--resume`` reads such a file back: the images it names are skipped, and a last line cut short by a crash (no
newline, or not parseable) is cut off before appending.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from .errors import EngineError
from .pipeline import Prediction

FSYNC_SECONDS = 5.0
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
PROB_DIGITS = 6


def rounded(prob: float) -> float:
    return float(f"{prob:.{PROB_DIGITS}g}")


def output_format(path: Path) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise EngineError(f"{path}: --output takes a .jsonl or .csv file")
    return fmt


def as_json(p: Prediction) -> dict:
    if p.ok:
        assert p.top is not None
        top = [{"index": i, "label": label, "prob": rounded(prob)} for i, label, prob in p.top]
        computed_in = {k: v for k, v in (("backend", p.backend), ("precision", p.precision)) if v is not None}
        return {"image": p.image, "top": top, **computed_in}
    return {"image": p.image, "error": p.error}


def jsonl_bytes(preds: Sequence[Prediction]) -> bytes:
    """The --output FILE.jsonl lines of these predictions, one JSON object per line."""
    return "".join(json.dumps(as_json(p)) + "\n" for p in preds).encode()


def csv_header(top_k: int) -> list[str]:
    return (["image", "error"] + [f"top{r}_{f}" for r in range(1, top_k + 1) for f in ("index", "label", "prob")]
            + ["backend", "precision"])


def csv_row(p: Prediction, top_k: int) -> list[str]:
    if not p.ok:
        return [p.image, p.error or ""] + [""] * (3 * top_k) + ["", ""]
    assert p.top is not None
    return ([p.image, ""] + [str(v) for i, label, prob in p.top for v in (i, label, rounded(prob))]
            + [p.backend or "", p.precision or ""])


def image_key(path: str) -> str:
    """How a result line and an input are matched on --resume: the absolute path, so ./a.jpg and a.jpg agree."""
    return os.path.abspath(path)


def read_done(path: Path, fmt: str, top_k: int) -> tuple[set[str], int]:
    """(image keys with a result, byte length of the whole lines) of an existing result file."""
    data = path.read_bytes()
    done: set[str] = set()
    good = 0  # end of the last whole, readable line
    pos = 0
    header_seen = False
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:
            break  # cut short by a crash
        line = data[pos:end].decode("utf-8", errors="replace")
        try:
            if fmt == "jsonl":
                image = json.loads(line)["image"]
            else:
                row = next(csv.reader([line]))
                if not header_seen:
                    header_seen = True
                    if row != csv_header(top_k):
                        raise EngineError(f"{path}: its columns are not those of --top-k {top_k}; resume with the "
                                          f"--top-k it was written with")
                    good, pos = end + 1, end + 1
                    continue
                image = row[0]
        except (ValueError, KeyError, TypeError, IndexError, StopIteration):
            break  # a damaged line: everything from here on is written again
        done.add(image_key(image))
        good = pos = end + 1
    return done, good


class ResultFile:
    """Appends predictions to a .jsonl or .csv file; ``done`` holds what an earlier run (--resume) wrote."""

    def __init__(self, path: str | os.PathLike, top_k: int, resume: bool):
        self.path = Path(path)
        self.fmt = output_format(self.path)
        self.top_k = top_k
        self.done: set[str] = set()
        if not self.path.parent.is_dir():
            raise EngineError(f"{self.path}: the directory {self.path.parent} does not exist")
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists and not resume:
            raise EngineError(f"{self.path} exists; pass --resume to continue it, or choose another file")
        new = True
        if exists:
            self.done, good = read_done(self.path, self.fmt, top_k)
            new = good == 0
            with open(self.path, "r+b") as f:
                f.truncate(good)  # a line cut short by a crash goes; its image runs again
        self._file: IO[bytes] = open(self.path, "ab")
        self._last_sync = time.monotonic()
        self._pending: list[Prediction] = []
        if self.fmt == "csv" and new:
            self._write_rows([csv_header(top_k)])

    def _write_rows(self, rows: list[list[str]]) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        self._file.write(buf.getvalue().encode())

    def add(self, p: Prediction) -> None:
        self._pending.append(p)

    def flush(self) -> None:
        """Write what was added, in one write; to the disk too if the last fsync is a few seconds old."""
        if self._pending:
            if self.fmt == "jsonl":
                self._file.write(jsonl_bytes(self._pending))
            else:
                self._write_rows([csv_row(p, self.top_k) for p in self._pending])
            self._pending = []
            self._file.flush()
        if time.monotonic() - self._last_sync > FSYNC_SECONDS:
            os.fsync(self._file.fileno())
            self._last_sync = time.monotonic()

    def close(self) -> None:
        if self._file.closed:
            return
        self.flush()
        os.fsync(self._file.fileno())
        self._file.close()
