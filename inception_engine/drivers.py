"""Where a run's batches are computed: in this process (``LocalDriver``, one Engine) or in worker processes, one per
GPU of this machine (``GpusDriver``, multi_gpu.GpuRun). Both take the run's config whole and give the same three
things to the command that writes the results: the engine's facts (backend, precision, batch size, weights, notes),
the results of a list of paths in their order (Predictions, or with ``fmt`` each one's line of an output file), and
notes taken mid-run. A Ray cluster (``--ray``) is the third driver: it writes its own directory of results
(ray_data.run_on_ray), since its inputs and output may be URIs this machine never reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .config import RunConfig
from .engine import Engine, EngineFacts
from .multi_gpu import start_on_gpus
from .output import Rendered
from .pipeline import Prediction

Progress = Callable[[int], None]


class Driver(Protocol):
    on_note: Callable[[str], None] | None

    def facts(self) -> EngineFacts: ...

    def stream(self, paths: list[str]) -> Iterator[Prediction | Rendered]: ...

    def close(self) -> None: ...


class Wrapping:
    """What both drivers pass through to the object that does the work (an Engine, a GpuRun)."""

    inner: Any

    @property
    def on_note(self) -> Callable[[str], None] | None:
        return self.inner.on_note

    @on_note.setter
    def on_note(self, f: Callable[[str], None] | None) -> None:
        self.inner.on_note = f

    def facts(self) -> EngineFacts:
        return self.inner.facts()

    def close(self) -> None:
        self.inner.close()


class LocalDriver(Wrapping):
    """One Engine in this process: its weights and, with --decode gpu, nvImageCodec's start begin at once."""

    def __init__(self, run: RunConfig, on_progress: Progress, fmt: str | None):
        self.inner = Engine.from_config(run.engine)
        self.top_k, self.on_progress, self.fmt = run.top_k, on_progress, fmt

    def stream(self, paths: list[str]) -> Iterator[Any]:
        return self.inner.predict_iter(paths, self.top_k, on_progress=self.on_progress, render=self.fmt)


class GpusDriver(Wrapping):
    """``run.gpus`` worker processes started at once, each building its engine while the caller lists the inputs;
    the parent builds none. ``stream`` deals the paths out at the first call, so call it before ``facts`` to
    overlap the workers' start with the first chunks' work."""

    def __init__(self, run: RunConfig, on_progress: Progress, fmt: str | None):
        assert run.gpus is not None
        self.inner = start_on_gpus(run.gpus, run.top_k, run.engine, on_progress, fmt)

    def stream(self, paths: list[str]) -> Iterator[Any]:
        return self.inner.classify(paths)


def start_driver(run: RunConfig, on_progress: Progress, fmt: str | None) -> Driver:
    """The driver ``run.driver`` names, started (not Ray's: ray_data.run_on_ray runs a whole job itself)."""
    return GpusDriver(run, on_progress, fmt) if run.driver == "gpus" else LocalDriver(run, on_progress, fmt)
