"""Where a run's batches are computed: in this process (``LocalDriver``, one Engine), in worker processes, one per
GPU of this machine (``GpusDriver``, multi_gpu.GpuRun), or by a running inception-serve (``ServerDriver``). Each
takes the run's config whole and gives the same three things to the command that writes the results: the engine's
facts (backend, precision, batch size, weights, notes), the results of a list of paths in their order (Predictions,
or with ``fmt`` each one's line of an output file), and notes taken mid-run. A Ray cluster (``--ray``) is the
fourth driver: it writes its own directory of results (ray_data.run_on_ray), since its inputs and output may be URIs
this machine never reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .config import RunConfig
from .output import Rendered
from .results import EngineFacts, Prediction

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
    """One Engine in this process: its weights and, with --decode gpu, nvImageCodec's start begin at once. With
    --features, each batch's features go to the run's FeatureFile, put in place when the stream ends whole."""

    def __init__(self, run: RunConfig, on_progress: Progress, fmt: str | None):
        # the drivers' modules import the engine (NumPy, the plan) on use: inception-run --server needs neither
        from .engine import Engine

        self.inner = Engine.from_config(run.engine)
        self.top_k, self.on_progress, self.fmt = run.top_k, on_progress, fmt
        self.features_path, self.features_file = run.features, None
        if run.features is not None:
            self.inner.check_features()  # before any input is listed

    def stream(self, paths: list[str]) -> Iterator[Any]:
        if self.features_path is None:
            return self.inner.predict_iter(paths, self.top_k, on_progress=self.on_progress, render=self.fmt)
        return self._with_features(paths)

    def _with_features(self, paths: list[str]) -> Iterator[Any]:
        from .features_file import FeatureFile

        assert self.features_path is not None
        file = self.features_file = FeatureFile(self.features_path, paths, self.inner.feature_width)
        stream = self.inner.predict_iter(paths, self.top_k, on_progress=self.on_progress, render=self.fmt,
                                         on_features=file.add)
        # put in place before the last result is handed out (its batch's rows are in by then): the caller takes
        # exactly one result per path and closes the stream without asking for more
        for i, result in enumerate(stream):
            if i == len(paths) - 1:
                file.commit()
                self.features_file = None
            yield result
        if self.features_file is not None:  # no paths
            file.commit()
            self.features_file = None

    def close(self) -> None:
        if self.features_file is not None:  # the stream did not end whole: no features file
            self.features_file.discard()
            self.features_file = None
        super().close()


class GpusDriver(Wrapping):
    """``run.gpus`` worker processes started at once, each building its engine while the caller lists the inputs;
    the parent builds none. ``stream`` deals the paths out at the first call, so call it before ``facts`` to
    overlap the workers' start with the first chunks' work."""

    def __init__(self, run: RunConfig, on_progress: Progress, fmt: str | None):
        from .multi_gpu import start_on_gpus

        assert run.gpus is not None
        self.inner = start_on_gpus(run.gpus, run.top_k, run.engine, on_progress, fmt)

    def stream(self, paths: list[str]) -> Iterator[Any]:
        return self.inner.classify(paths)


class ServerDriver(Wrapping):
    """A running inception-serve computes (serve.client.RemoteRun): this process reads the files, sends them and
    writes the results; the server's backend and precision must be those the run asks for (auto: any)."""

    def __init__(self, run: RunConfig, on_progress: Progress, fmt: str | None):
        from .serve.client import RemoteRun  # on use: no other run needs the client

        assert run.server is not None and isinstance(run.engine, dict)
        asked = run.engine
        self.inner = RemoteRun(run.server, run.top_k, asked["backend"], asked["precision"], asked["batch_size"],
                               on_progress)

    def stream(self, paths: list[str]) -> Iterator[Any]:
        return self.inner.classify(paths)


DRIVERS: dict[str, type[Wrapping]] = {"local": LocalDriver, "gpus": GpusDriver, "server": ServerDriver}


def start_driver(run: RunConfig, on_progress: Progress, fmt: str | None) -> Driver:
    """The driver ``run.driver`` names, started (not Ray's: ray_data.run_on_ray runs a whole job itself)."""
    return DRIVERS[run.driver](run, on_progress, fmt)  # type: ignore[call-arg]
