"""Stand-ins for multi_gpu._worker, for the tests of what inception-run --gpus's parent does when a worker goes
wrong. A spawned worker imports its target by name, so they live in a module that the workers can import."""

from __future__ import annotations

import os


def dies_at_once(gpu: int, *args: object) -> None:
    """A worker that dies before it sends anything, as one the OOM killer or a crash in a driver ends."""
    os._exit(3)
