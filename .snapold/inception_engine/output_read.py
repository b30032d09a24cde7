"""Reading an --output file back (output.py's formats) for --resume, by the readers' rule of output.py's doc: a line
that is not a whole, well-formed result does not count, and where an image has several lines the last one wins.

Each classification line records what computed it (backend, precision, model); a file is resumed only by a run that
computes the same way (``check_computed``), so that no file ever mixes the results of two models, backends or
precisions. A file written before results named their model (JSON lines without "model", a CSV without its column)
cannot show that, and is refused for --resume.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EngineError
from .labels import known_labels

NAME_ERRORS = "surrogateescape"  # how a file name's non-UTF-8 bytes are written and read in CSV and text
COMPUTED_KEYS = ("backend", "precision", "model")  # what a classification records as having computed it
Computed = tuple[str | None, str | None, str | None]  # their values, None where a line lacks one
Parsed = tuple[str, bool, int | None, Computed | None]  # (image, ok, top-k, computed) of a well-formed line
MAX_RECORD_BYTES = 1 << 20  # a CSV row (a path is at most 4,096 bytes, a message a few hundred) is far shorter


def csv_header(top_k: int) -> list[str]:
    return (["image", "error"] + [f"top{r}_{f}" for r in range(1, top_k + 1) for f in ("index", "label", "prob")]
            + list(COMPUTED_KEYS))


def image_key(path: str) -> str:
    """How a result line and an input are matched on --resume: the absolute path, so ./a.jpg and a.jpg agree."""
    return os.path.abspath(path)


@dataclass
class Record:
    key: str
    ok: bool  # a classification (True) or an error line (False)
    line: bytes  # the whole line, newline included
    computed: Computed | None = None  # a classification's backend, precision and model


@dataclass
class ResultLines:
    """What an existing result file holds, by the readers' rule: the last whole, well-formed line per image."""

    records: dict[str, Record] = field(default_factory=dict)  # by image key, in the order of their last lines
    top_k: int | None = None  # the file's top-k (None: no classification in it yet)
    damaged: int = 0  # lines that are not results (garbled, another top-k, cut short by a crash)
    duplicates: int = 0  # lines of an image that a later line supersedes

    @property
    def done(self) -> set[str]:
        return {key for key, r in self.records.items() if r.ok}

    def computed(self) -> list[Computed]:
        """What computed the file's classifications, each way once, in the order of their first lines."""
        return list(dict.fromkeys(r.computed for r in self.records.values() if r.ok and r.computed is not None))


def valid_top(top: list[tuple[object, object, object]]) -> bool:
    """Entries (index, label, probability) as inception-run writes them: known classes with their labels (of one
    network's set: labels.network_labels), probabilities in [0, 1]."""
    return bool(top) and all(
        isinstance(index, int) and not isinstance(index, bool) and isinstance(prob, float) and 0.0 <= prob <= 1.0
        for index, _, prob in top) and known_labels([t[0] for t in top], [t[1] for t in top]) is not None


def valid_name(image: object) -> bool:
    return isinstance(image, str) and image != "" and "\x00" not in image


def parse_jsonl(line: bytes) -> Parsed | None:
    """(image, ok, top-k, computed) of one JSON line, or None where it is not a well-formed result."""
    try:
        obj = json.loads(line.decode("ascii"))
    except ValueError:  # UnicodeDecodeError included: inception-run writes ASCII
        return None
    computed_in = {k for k in COMPUTED_KEYS if isinstance(obj, dict) and isinstance(obj.get(k), str)}
    if not isinstance(obj, dict) or not valid_name(obj.get("image")) or set(obj) not in (
            {"image", "top"} | computed_in, {"image", "error"}):
        return None
    if "error" in obj:
        error = obj["error"]
        return (obj["image"], False, None, None) if isinstance(error, str) and error else None
    top = obj["top"]
    if not isinstance(top, list) or not all(isinstance(t, dict) and set(t) == {"index", "label", "prob"}
                                            for t in top):
        return None
    if not valid_top([(t["index"], t["label"], t["prob"]) for t in top]):
        return None
    return obj["image"], True, len(top), tuple(obj.get(k) for k in COMPUTED_KEYS)  # type: ignore[return-value]


def parse_csv(row: list[str], top_k: int) -> Parsed | None:
    """(image, ok, top-k, computed) of one CSV row of a file with top_k columns, or None where it is not a
    well-formed result."""
    extra = len(COMPUTED_KEYS)
    if len(row) != 2 + 3 * top_k + extra or not valid_name(row[0]) or any("\x00" in v for v in row):
        return None
    image, error, rest = row[0], row[1], row[2:-extra]
    if error:
        return (image, False, None, None) if not any(row[2:]) else None
    try:
        top = [(int(rest[i]) if rest[i].isdigit() else None, rest[i + 1], float(rest[i + 2]))
               for i in range(0, len(rest), 3)]
    except ValueError:
        return None
    computed = tuple(v or None for v in row[-extra:])
    return (image, True, top_k, computed) if valid_top(top) else None  # type: ignore[arg-type, return-value]


def csv_top_k(header: list[str]) -> int | None:
    """The top-k of a CSV header inception-run writes, None for anything else."""
    k, extra = divmod(len(header) - 2 - len(COMPUTED_KEYS), 3)  # image, error, k x (index, label, prob), computed
    return k if k >= 1 and not extra and header == csv_header(k) else None


def read_lines(data: bytes, fmt: str, path: Path) -> ResultLines:
    """Parse a result file's bytes by the readers' rule (module doc). A CSV must start with inception-run's
    header (it gives the top-k); a file without one is refused, since its rows cannot be told apart from damage.
    A JSONL file's top-k is that of most of its classification lines."""
    out = ResultLines()
    pos = 0
    if fmt == "csv" and data:
        nl = data.find(b"\n")
        if nl < 0:  # the header itself cut short by a crash: nothing else was written
            out.damaged = 1
            return out
        header = next(csv.reader(io.StringIO(data[:nl + 1].decode("utf-8", NAME_ERRORS), newline="")), [])
        out.top_k = csv_top_k(header)
        if out.top_k is None:
            old = header[-2:] == ["backend", "precision"] and csv_top_k([*header, "model"]) is not None
            raise EngineError(f"{path}: " + ("written by an inception-run that did not record the model; --resume "
                                             "cannot tell its results' model from this run's, write to another file"
                                             if old else "its first line is not the header inception-run writes; "
                                             "it is not a result file to resume (choose another --output)"))
        pos = nl + 1
    entries: list[tuple[bytes, Parsed | None]] = []
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            out.damaged += 1  # cut short by a crash: no newline
            break
        end = record_end(data, pos, fmt)
        parsed = parse_record(data[pos:end + 1], fmt, out.top_k) if end >= 0 else None
        if parsed is None:
            end = nl  # a quoted newline that made no good row: only its first line is damaged
        entries.append((data[pos:end + 1], parsed))
        pos = end + 1
    if fmt == "jsonl":
        ks = Counter(parsed[2] for _, parsed in entries if parsed is not None and parsed[1])
        out.top_k = ks.most_common(1)[0][0] if ks else None
    for line, parsed in entries:
        if parsed is None or (parsed[1] and parsed[2] != out.top_k):  # damaged, or a line of another top-k
            out.damaged += 1
            continue
        image, ok, _, computed = parsed
        key = image_key(image)
        if key in out.records:
            out.duplicates += 1
            del out.records[key]  # the later line wins, and takes the later place
        out.records[key] = Record(key, ok, line, computed)
    return out


def parse_record(line: bytes, fmt: str, top_k: int | None) -> Parsed | None:
    if fmt == "jsonl":
        return parse_jsonl(line)
    assert top_k is not None
    try:
        row = next(csv.reader(io.StringIO(line.decode("utf-8", NAME_ERRORS), newline="")))
    except (csv.Error, StopIteration):
        return None
    return parse_csv(row, top_k)


def record_end(data: bytes, pos: int, fmt: str) -> int:
    """Where the record that starts at pos ends (its newline), -1 where the data ends first. A JSON line is one
    line; a CSV row runs on over newlines inside a quoted field (a file name may hold one): up to the first
    newline with an even number of quotes before it, as csv.writer doubles a quote inside a field."""
    end = data.find(b"\n", pos)
    if fmt != "csv":
        return end
    quotes, start = 0, pos
    while 0 <= end < pos + MAX_RECORD_BYTES:
        quotes += data.count(b'"', start, end)
        if quotes % 2 == 0:
            return end
        start, end = end, data.find(b"\n", end + 1)
    return -1


def check_top_k(lines: ResultLines, top_k: int, path: Path) -> None:
    if lines.top_k is not None and lines.top_k != top_k:
        raise EngineError(f"{path} holds top-{lines.top_k} results; resume it with --top-k {lines.top_k}, or write "
                          f"--top-k {top_k} to another file")


def check_computed(lines: ResultLines, computed: Computed, path: Path) -> None:
    """Refuse, in one line that says which, to add this run's results (computed by ``computed``: backend,
    precision, model) to a file whose classifications another model, backend or precision computed."""
    for theirs in lines.computed():
        if None in theirs:
            missing = ", ".join(k for k, v in zip(COMPUTED_KEYS, theirs) if v is None)
            raise EngineError(f"{path}: its results do not record their {missing} (an earlier inception-run wrote "
                              f"them), so --resume cannot tell them from this run's; write to another file")
        differ = [f"{k} {v} (this run: {mine})" for k, v, mine in zip(COMPUTED_KEYS, theirs, computed) if v != mine]
        if differ:
            raise EngineError(f"{path} holds results computed with another {', '.join(differ)}; resume it with the "
                              f"same --weights, --backend and --precision, or write to another file")
