"""Stand-ins for multi_gpu._worker, for the tests of what inception-run --gpus's parent does when a worker goes
wrong. A spawned worker imports its target by name, so they live in a module that the workers can import."""

from __future__ import annotations

import os


def dies_at_once(gpu: int, *args: object) -> None:
    """A worker that dies before it sends anything, as one the OOM killer or a crash in a driver ends."""
    os._exit(3)


def notes_mid_run(gpu: int, *args: object) -> None:
    """The real worker, whose engine takes a note as its run starts (as one without a tuning table for its GPU
    does)."""
    from inception_engine import engine, multi_gpu

    runner = engine.Engine.runner

    def noting(self: engine.Engine, n_images: int, features: bool = False, **kwargs: object) -> object:
        self._note_once("this engine took a note mid-run")
        return runner(self, n_images, features, **kwargs)

    engine.Engine.runner = noting  # type: ignore[method-assign]
    multi_gpu._worker(gpu, *args)  # type: ignore[arg-type]
