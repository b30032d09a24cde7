"""Where inception-run's results go, one writer for every driver: text or one JSON document on standard output, or
an --output file of JSON lines or CSV (output.ResultFile, which resumes). Each sink takes the results in input order,
a Prediction or an already rendered line (output.Rendered) at a time, and ends whole: Ctrl-C closes it (whole lines,
a closed JSON document, marked ``"complete": false``) before the run exits with 130."""

from __future__ import annotations

import errno
import json
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .errors import EngineError
from .output import Rendered, ResultFile, as_json, terminal_bytes
from .output_read import Computed
from .results import Prediction

if TYPE_CHECKING:
    from .results import EngineFacts

Echo = Callable[..., None]


def write_results(inputs: list[tuple[str, str | None]], preds: Iterator[Prediction | Rendered], sink: Any,
                  resumable: Path | None) -> tuple[int, int]:
    """Every input's result into the sink, in order: the next prediction (or its rendered line, from --gpus's
    workers into a file), or the argument's own error. Returns
    (results, failed). Ctrl-C closes the sink (whole lines, a closed JSON document marked incomplete) and exits
    with 130."""
    failed = total = 0
    try:
        for path, err in inputs:
            r = next(preds) if err is None else Prediction(path, error=err)
            sink.add(r)
            failed += not r.ok
            total += 1
    except KeyboardInterrupt:
        sink.close(len(inputs), complete=False)
        raise interrupted(total, len(inputs), resumable) from None
    sink.close(len(inputs))
    return total, failed


def interrupted(done: int, inputs: int, resumable: Path | None) -> click.exceptions.Exit:
    """Says on stderr, in one line, how far a run got when Ctrl-C came; returns the exit (code 130) to raise. The
    output file is named only where it holds results (a file the run created and wrote nothing to is removed)."""
    holds = resumable is not None and resumable.is_file() and resumable.stat().st_size > 0
    where = f"; {resumable} holds the results so far, --resume continues" if holds else ""
    click.echo(f"interrupted after {done} of {inputs} images{where}", err=True)
    return click.exceptions.Exit(130)


class NoBar:
    """A progress bar that is not drawn: tqdm (~30 ms of imports) is loaded only for one that is."""

    def update(self, n: int = 1) -> None:
        pass

    def __enter__(self) -> NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def progress_bar(total: int, desc: str, unit: str, show: bool) -> Any:
    """tqdm's bar on stderr where ``show``, else a NoBar; both a context manager with ``update(n)``."""
    if not show:
        return NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


def terminal_echo(text: str, nl: bool = True, err: bool = False) -> None:
    """click.echo with any progress bar cleared first and drawn again after, so that the two never share a line
    (stdout and stderr are often the same terminal). Under tqdm's lock: its monitor thread redraws bars too."""
    from tqdm import tqdm

    with tqdm.external_write_mode(file=sys.stderr if err else sys.stdout):
        click.echo(text, nl=nl, err=err)


class TextSink:
    """A header line (``# cpu backend, fp32, weights PATH, model 3f9a0c12ab45 (torchvision)``), then per image its
    path and the top-k, one class a
    line: probability (4 decimals), label, class index."""

    def __init__(self, header: str, echo: Echo = click.echo):
        self.echo = echo
        to_stdout(header + "\n", echo)

    def add(self, r: Prediction) -> None:
        lines = [r.image]
        if r.ok:
            assert r.top is not None
            lines += [f"  {p:6.4f}  {label} ({i})" for i, label, p in r.top]
        else:
            lines.append(f"  error: {r.error}")
        to_stdout(terminal_bytes("\n".join(lines) + "\n", click.get_text_stream("stdout").encoding), self.echo)

    def close(self, inputs: int = 0, complete: bool = True) -> None:
        pass


def to_stdout(text: str | bytes, echo: Echo = click.echo) -> None:
    """Write results to standard output with ``echo`` (click.echo, or terminal_echo beside a progress bar); one
    that cannot take them (a full disk, an I/O error) is one line. A closed pipe (| head) is left to click, which
    ends quietly."""
    try:
        echo(text, nl=False)
    except OSError as e:
        if e.errno == errno.EPIPE:
            raise
        raise EngineError(f"cannot write the results to standard output ({e.strerror or e}); write them to a file "
                          f"with --output") from None


class JsonSink:
    """One JSON document, written as results arrive: each result is held only until the next one arrives (which
    decides whether a comma follows it), so that every write ends a line and a progress bar never lands on one.
    After the results: ``"complete"`` (false where Ctrl-C stopped the run), ``"done"`` (results in the document)
    and ``"inputs"`` (results the run was to give)."""

    def __init__(self, head: dict[str, Any], echo: Echo = click.echo):
        self.echo, self.count = echo, 0
        to_stdout(json.dumps(head, indent=2)[:-2] + ',\n  "results": [\n', self.echo)
        self.held: str | None = None

    def add(self, r: Prediction) -> None:
        if self.held is not None:
            to_stdout(self.held + ",\n", self.echo)
        self.held = textwrap.indent(json.dumps(as_json(r), indent=2), "    ")
        self.count += 1

    def close(self, inputs: int = 0, complete: bool = True) -> None:
        if self.held is not None:
            to_stdout(self.held + "\n", self.echo)
            self.held = None
        tail = json.dumps({"complete": complete, "done": self.count, "inputs": inputs}, indent=2)
        to_stdout(f"  ],\n{tail[2:]}\n", self.echo)


class FileSink:
    """--output: flushed every batch's worth of results and at least once a second."""

    def __init__(self, out: ResultFile, batch: int, computed: Computed):
        out.start(computed)  # a file of another model, backend or precision is refused before a line is added
        self.out, self.batch, self.count, self.last = out, batch, 0, time.monotonic()

    def add(self, r: Prediction) -> None:
        self.out.add(r)
        self.count += 1
        if self.count % self.batch == 0 or time.monotonic() - self.last > 1.0:
            self.out.flush()
            self.last = time.monotonic()

    def close(self, inputs: int = 0, complete: bool = True) -> None:
        self.out.flush()


def make_sink(out: ResultFile | None, as_json: bool, facts: EngineFacts, echo: Echo) -> TextSink | JsonSink | FileSink:
    """The run's one sink: into ``out`` where there is a file, else one JSON document or text on standard output,
    whose head names the backend, precision, weight file and model ``facts`` give."""
    model = facts.model
    assert model is not None  # an Engine's facts name it
    if out is not None:
        return FileSink(out, facts.batch_size, (facts.backend_name, facts.precision, model.name))
    if as_json:
        provenance = {"kind": model.kind, "source_sha256": model.source_sha256}
        return JsonSink({"weights": str(facts.weights_path), "model": model.name, "provenance": provenance,
                         "backend": facts.backend_name, "precision": facts.precision}, echo)
    return TextSink(f"# {facts.backend_name} backend, {facts.precision}, weights {facts.weights_path}, "
                    f"{model.describe()}", echo)
