"""Result files that survive large jobs: one line per image, appended as results arrive, resumable.

``--output FILE.jsonl`` writes one JSON object per line, ``{"image": PATH, "top": [{"index", "label", "prob"}],
"backend": B, "precision": P, "model": M}`` or ``{"image": PATH, "error": MSG}``; ``FILE.csv`` one row per image,
``image, error``, then index, label and probability of each of the top k, then ``backend, precision, model``
(empty for errors). M names the weights (results.ModelId.name: 12 hex digits of their checksums, "synthetic-"
before them for the synthetic model). Each line says it rather than a header line, so that every line stands on
its own (grep, concatenated files, readers that take each line as a result) and --resume can refuse a file of
another model line by line (output_read.check_computed).
Probabilities are written to PROB_DIGITS significant digits: float32 logits carry no more. Lines are written whole,
a batch at a time with one ``write`` (a killed process leaves whole lines behind it), flushed to the OS at once and
to the disk every few seconds and at the end. A crash loses at most what had not been flushed: the batch in flight.

File names. Any name the file system holds is written, losslessly: a path is the string Python gives it, its bytes
decoded as UTF-8 with each byte that is not UTF-8 turned into the lone surrogate U+DC80..U+DCFF (the
``surrogateescape`` rule of ``os.fsdecode``). JSON (``.jsonl``, ``--json``) writes that character as the escape
``\\udcXX``; a CSV and the terminal text hold the original byte (such a row is then not UTF-8). Python reads either
back to the same string (``json.loads``; ``bytes.decode("utf-8", "surrogateescape")``), and ``os.fsencode`` of it
gives the name's bytes.

One writer at a time: a run holds an exclusive ``flock`` on its output file while it writes; a second run given
the same file is refused. Only a regular file is ever appended to or replaced.

``--resume`` reads such a file back, and the rule for any reader is: a line that is not a whole, well-formed
result (cut short by a crash, damaged) does not count, and where an image has several lines the last one wins.
Images whose result is a classification are skipped; images whose result is an error run again. Where the file
holds a damaged or torn line, a duplicate, or the error line of an image that runs again, it is first rewritten,
atomically, with the last good line of each other image: after a resumed run every image has one line.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import functools
import glob
import io
import json
import math
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as encode_ascii  # type: ignore[attr-defined]  # json's C encoder
from pathlib import Path
from typing import NamedTuple

from .errors import EngineError, first_line
from .ingest.entries import file_error, not_a_file
from .labels import Labels, known_labels
from .output_read import (COMPUTED_KEYS, NAME_ERRORS, Computed, ResultLines, check_computed, check_top_k, csv_header,
                          read_lines)
from .results import ComputedBy, Prediction, TopK, make_predictions

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
        computed_in = {k: v for k, v in zip(COMPUTED_KEYS, computed_by(p)) if v is not None}
        return {"image": p.image, "top": top, **computed_in}
    return {"image": p.image, "error": p.error}


def jsonl_bytes(preds: Sequence[Prediction]) -> bytes:
    """The --output FILE.jsonl lines of these predictions, one JSON object per line: json.dumps(as_json(p)) for
    each (ASCII: it escapes everything else, a file name's undecodable bytes included), put together from
    pre-escaped labels, the C string encoder and one formatting call for all the probabilities, since a folder job
    writes tens of thousands of lines a second."""
    return "".join(jsonl_lines(preds)).encode("ascii")


@functools.cache
def json_top_prefixes(labels: Labels) -> tuple[str, ...]:
    """Per class of ``labels``, the start of its entry in a JSONL line's "top" list, up to the probability."""
    return tuple(f'{{"index": {i}, "label": {json.dumps(label)}, "prob": ' for i, label in enumerate(labels))


PROB_FORMAT = f"%.{PROB_DIGITS}g"  # printf-style: one % call formats a whole batch's probabilities


def jsonl_lines(preds: Sequence[Prediction]) -> list[str]:
    """json.dumps(as_json(p)) + a newline for each prediction, without building the dicts (tests/unit/test_output.py
    holds the two to the same bytes on fuzzed predictions). A probability in [0, 1] is written as its 6 significant
    digits, with ".0" where they hold neither point nor exponent: the repr that json.dumps writes of the rounded
    float, since no shorter decimal reads back as the same double.

    The predictions a stream makes (a top list of one length, one backend and precision: the "plain" ones) are
    rendered together by ``plain_lines``, one formatting call for all their lines; the others (errors, anything
    else) one at a time."""
    first = next((p for p in preds if p.error is None and p.top), None)
    shape = (len(first.top), computed_by(first)) if first is not None and first.top else None
    plain = [at for at, p in enumerate(preds) if p.error is None and p.top and (len(p.top), computed_by(p)) == shape]
    out: list[str | None] = [None] * len(preds)
    for at, line in zip(plain, plain_lines([preds[at] for at in plain]) or []):
        out[at] = line
    return [line if line is not None else one_line(p) for p, line in zip(preds, out)]


def one_line(p: Prediction) -> str:
    """p's JSONL line on its own (an error, or a prediction plain_lines did not take)."""
    if p.error is None and p.top:
        lines = plain_lines([p])
        if lines is not None:
            return lines[0]
    return json.dumps(as_json(p)) + "\n"


def plain_lines(preds: list[Prediction]) -> list[str] | None:
    """The JSONL lines of predictions whose top lists have one length and whose backend, precision and model are the
    same,
    made together (``top_lines``): None where any entry is not what a classifier makes (labels not all of one
    network's set, an index or a probability out of range or not a number), which json.dumps then writes as it
    writes it."""
    if not preds:
        return []
    index, names, probs = zip(*[c for p in preds for c in p.top])  # type: ignore[union-attr]
    labels = known_labels(index, names) if set(map(type, index)) == {int} else None
    if labels is None or set(map(type, probs)) != {float}:
        return None
    return top_lines([p.image for p in preds], len(preds[0].top), index, probs,  # type: ignore[arg-type]
                     computed_by(preds[0]), labels)


def top_lines(images: list[str], k: int, index: Sequence[int], probs: Sequence[float],
              computed: ComputedBy, labels: Labels) -> list[str] | None:
    """The JSONL lines of ``images``, each with k classes (``index`` and ``probs`` row after row, ints and floats:
    a classifier's top-k) named by ``labels``, computed by ``computed`` (backend, precision, model; None left out),
    made by one formatting call for all of them. None where a probability is outside [0, 1] or not a number, or an
    index not a class."""
    s = math.fsum(probs)
    prefixes = json_top_prefixes(labels)
    if s != s or min(probs) < 0.0 or max(probs) > 1.0 or min(index) < 0 \
            or max(index) >= len(prefixes):  # NaN first: min and max are only sound without it
        return None
    stride = 1 + 2 * k  # one line's arguments: the image's name, then each class's prefix and probability
    args: list[object] = [""] * (len(images) * stride)
    args[0::stride] = [encode_ascii(image) for image in images]
    for j in range(k):
        args[1 + 2 * j::stride] = list(map(prefixes.__getitem__, index[j::k]))
        args[2 + 2 * j::stride] = probs[j::k]
    extra = "".join(f', "{key}": {encode_ascii(v)}' for key, v in zip(COMPUTED_KEYS, computed) if v is not None)
    line = '{"image": %s, "top": [' + ", ".join(["%s" + PROB_FORMAT + "}"] * k) + "]" + extra.replace("%", "%%") + "}"
    text = "\n".join([line] * len(images)) % tuple(args)
    # the 6 significant digits of 0 and 1 (and -0) have no point: json.dumps writes the float as 0.0 and 1.0. A file
    # name cannot make these strings: its quotes are escaped.
    for bare in ("0", "1", "-0"):
        text = text.replace(f'"prob": {bare}}}', f'"prob": {bare}.0}}')
    return [line + "\n" for line in text.split("\n")]


class Rendered(NamedTuple):
    """A result already as its line of a --output file, rendered where it was computed (inception-run --gpus's
    workers, so that the parent only puts lines in order), with what the run's summary needs of it."""

    image: str
    ok: bool
    line: bytes  # the record, newline included


def render(preds: Sequence[Prediction], fmt: str, top_k: int) -> list[Rendered]:
    """Each prediction as its line of a ``fmt`` ("jsonl" or "csv") file of top-k results: the bytes ResultFile
    writes for it (JSONL lines made together, as jsonl_lines makes them)."""
    lines = ([line.encode("ascii") for line in jsonl_lines(preds)] if fmt == "jsonl" else
             csv_lines(csv_row(p, top_k) for p in preds))
    return [Rendered(p.image, p.ok, line) for p, line in zip(preds, lines)]


def line_renderer(fmt: str, top_k: int, computed: ComputedBy, labels: Labels
                  ) -> Callable[[list[str], list[TopK | str]], list[Rendered]]:
    """A stream's results to their lines of a ``fmt`` file a batch at a time, as the pipeline has them (each image's
    name and its top-k (index, probability) pairs, or its error), classes named by ``labels`` (the network's): no
    Prediction is made for a JSONL line (the pipeline's ``finish``; Engine.predict_iter's ``render``). The bytes are
    ``render``'s of the same predictions."""
    def lines(images: list[str], tops: list[TopK | str]) -> list[Rendered]:
        out: list[Rendered | None] = [None] * len(tops)
        ok = [at for at, top in enumerate(tops) if not isinstance(top, str)]
        if fmt == "jsonl" and ok and len({len(tops[at]) for at in ok}) == 1:
            index, probs = zip(*[c for at in ok for c in tops[at]])
            for at, line in zip(ok, top_lines([images[at] for at in ok], len(tops[ok[0]]), index, probs,
                                              computed, labels) or []):
                out[at] = Rendered(images[at], True, line.encode("ascii"))
        rest = [at for at, done in enumerate(out) if done is None]  # errors; NaN; CSV
        preds = make_predictions([images[at] for at in rest], [tops[at] for at in rest], computed, labels)
        for at, done in zip(rest, render(preds, fmt, top_k)):
            out[at] = done
        return out  # type: ignore[return-value]  # every one filled

    return lines


def csv_row(p: Prediction, top_k: int) -> list[str]:
    if not p.ok:
        return [p.image, p.error or ""] + [""] * (3 * top_k + len(COMPUTED_KEYS))
    assert p.top is not None
    return ([p.image, ""] + [str(v) for i, label, prob in p.top for v in (i, label, rounded(prob))]
            + [v or "" for v in computed_by(p)])


def computed_by(p: Prediction) -> Computed:
    """What computed p (COMPUTED_KEYS' values)."""
    return p.backend, p.precision, p.model


def csv_bytes(rows: Iterable[list[str]]) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue().encode("utf-8", NAME_ERRORS)


def csv_lines(rows: Iterable[list[str]]) -> list[bytes]:
    """csv_bytes of each row (a row's bytes may hold newlines of a quoted field), from one writer."""
    buf = io.StringIO()
    write, ends = csv.writer(buf, lineterminator="\n").writerow, [0]
    for row in rows:
        write(row)
        ends.append(buf.tell())
    text = buf.getvalue()
    return [text[a:b].encode("utf-8", NAME_ERRORS) for a, b in zip(ends, ends[1:])]


def terminal_bytes(text: str, encoding: str | None) -> bytes:
    """Text for the terminal in its encoding, a file name's undecodable bytes as they are (as ls would print them
    into a pipe); a character the encoding lacks as a backslash escape."""
    try:
        return text.encode(encoding or "utf-8", NAME_ERRORS)
    except UnicodeEncodeError:
        return text.encode(encoding or "utf-8", "backslashreplace")


# ------------------------------------------------------------------------------------------------------ writing

@dataclass(frozen=True)
class ResumeSummary:
    done: int  # images skipped: their classification is in the file
    retried: int  # images whose error line was dropped: they run again
    damaged: int  # lines that were not whole, well-formed results (dropped: their images run again)
    duplicates: int  # lines a later line of the same image superseded (dropped)


class ResultFile:
    """Appends predictions to a .jsonl or .csv file, holding its lock until ``close``; ``resume`` lists what an
    earlier run wrote, ``start`` (before the first ``add``) checks the file is this run's to continue and tidies it.
    A file this run created and wrote nothing to is removed at ``close``."""

    def __init__(self, path: str | os.PathLike, top_k: int, resume: bool):
        self.path = Path(path)
        self.fmt = output_format(self.path)
        self.top_k = top_k
        self.done: set[str] = set()
        if not self.path.parent.is_dir():
            raise EngineError(f"{self.path}: the directory {self.path.parent} does not exist")
        self._fd, self.created = open_locked(self.path)
        self._pending: list[Prediction | Rendered] = []
        self._last_sync = time.monotonic()
        self._lines = ResultLines()
        self._rewrite: bytes | None = None  # the file's lines as resume leaves them, written by start
        try:
            remove_stale_copies(self.path)
            size = os.fstat(self._fd).st_size
            if size and not resume:
                raise EngineError(f"{self.path} exists; pass --resume to continue it, or choose another file")
            if size:
                self._lines = read_lines(os.pread(self._fd, size, 0), self.fmt, self.path)
                check_top_k(self._lines, top_k, self.path)
        except BaseException:
            self._release()
            raise

    def resume(self, keys: Iterable[str]) -> ResumeSummary:
        """What this run's images (``keys``) find in the file: their classified images go into ``done`` (to be
        skipped); error lines of those that run again, damaged, torn and superseded lines are to be dropped, by
        ``start`` (the file is not changed before the run's engine is known to match it)."""
        lines = self._lines
        wanted = set(keys)
        retry = {key for key, r in lines.records.items() if not r.ok and key in wanted}
        self.done = lines.done & wanted
        if retry or lines.damaged or lines.duplicates:
            kept = [r.line for key, r in lines.records.items() if key not in retry]
            if self.fmt == "csv" and kept:
                kept.insert(0, csv_bytes([csv_header(self.top_k)]))
            self._rewrite = b"".join(kept)
        return ResumeSummary(len(self.done), len(retry), lines.damaged, lines.duplicates)

    def start(self, computed: Computed) -> None:
        """Before the first result is added: refuse a file whose results another model, backend or precision
        computed (``computed``: this run's), then drop what ``resume`` found to drop, rewriting the file
        atomically."""
        check_computed(self._lines, computed, self.path)
        if self._rewrite is not None:
            self._replace(self._rewrite)
            self._rewrite = None

    def _replace(self, data: bytes) -> None:
        """Put data in the file's place, atomically (a temporary file beside it, fsync, rename), and hold the lock
        of the new file before letting go of the old one's."""
        target = Path(os.path.realpath(self.path))  # a symbolic link stays one: its target is replaced
        tmp = None
        try:
            import tempfile  # on use: a rewrite is rare, and tempfile brings shutil and random

            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=rewrite_prefix(target), suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fchmod(f.fileno(), stat.S_IMODE(os.fstat(self._fd).st_mode))
                os.fsync(f.fileno())
            os.replace(tmp, target)
            tmp = None
            fsync_dir(target.parent)
        except OSError as e:  # the file is as it was
            raise EngineError(f"{self.path}: cannot rewrite it without its damaged or repeated lines "
                              f"({e.strerror or first_line(e)}); make room, or write to another file") from None
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
        new, _ = open_locked(self.path)
        os.close(self._fd)
        self._fd = new

    def add(self, p: Prediction | Rendered) -> None:
        self._pending.append(p)

    def flush(self) -> None:
        """Write what was added, in one write; to the disk too if the last fsync is a few seconds old."""
        try:
            if self._pending:
                header = (csv_bytes([csv_header(self.top_k)]) if self.fmt == "csv" and os.fstat(self._fd).st_size == 0
                          else b"")
                # lines rendered by --gpus workers as they are, the predictions rendered here, together
                fresh = iter(render([p for p in self._pending if not isinstance(p, Rendered)], self.fmt, self.top_k))
                data = header + b"".join((p if isinstance(p, Rendered) else next(fresh)).line for p in self._pending)
                self._pending = []
                write_all(self._fd, data)
            if time.monotonic() - self._last_sync > FSYNC_SECONDS:
                os.fsync(self._fd)
                self._last_sync = time.monotonic()
        except OSError as e:  # a full disk, a quota, an I/O error: what was written whole stays, for --resume
            raise EngineError(f"{self.path}: cannot write ({e.strerror or first_line(e)}); make room, then continue "
                              f"with --resume") from None

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            self._last_sync = -math.inf  # to the disk now
            self.flush()
        finally:
            self._release()

    def _release(self) -> None:
        """Close the file (letting go of its lock); an empty one this run created goes (still locked)."""
        if self.created and os.fstat(self._fd).st_size == 0:
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1


def rewrite_prefix(target: Path) -> str:
    return f".{target.name}."


def remove_stale_copies(path: Path) -> None:
    """Remove what a run killed while rewriting the file left beside it (its lock is ours: no rewrite is under way)."""
    target = Path(os.path.realpath(path))
    for stale in target.parent.glob(f"{glob.escape(rewrite_prefix(target))}*.tmp"):
        stale.unlink(missing_ok=True)


def open_locked(path: Path) -> tuple[int, bool]:
    """(descriptor, created) of the regular file at path, opened to append and locked exclusively: a device, a FIFO
    or a directory is refused, and so is a file another run is writing."""
    flags = os.O_RDWR | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC  # non-blocking: a FIFO must not hang the open
    try:
        kind = not_a_file(os.stat(path).st_mode)
    except FileNotFoundError:
        kind = None
    except OSError as e:
        raise EngineError(f"{file_error(path, e)}; choose another --output file") from None
    if kind is not None:
        raise EngineError(f"{path}: {kind}, not a regular file; --output takes a file name")
    created = True
    try:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            created = False
            fd = os.open(path, flags)
    except OSError as e:
        raise EngineError(f"{file_error(path, e)}; choose another --output file") from None
    try:
        kind = not_a_file(os.fstat(fd).st_mode)
        if kind is not None:
            raise EngineError(f"{path}: {kind}, not a regular file; --output takes a file name")
        os.set_blocking(fd, True)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise EngineError(f"{path}: cannot lock it ({e.strerror}); --output needs a local file") from None
            raise EngineError(f"{path}: another inception-run is writing it; wait for that run to end, or choose "
                              f"another file") from None
        if os.fstat(fd).st_ino != os.stat(path).st_ino:  # replaced by a resuming run since it was opened
            raise EngineError(f"{path}: another inception-run is writing it; wait for that run to end, or choose "
                              f"another file")
    except BaseException:
        os.close(fd)
        raise
    return fd, created


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
