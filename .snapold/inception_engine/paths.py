"""Where the engine keeps what it makes for a user (converted weights, compiled kernels, tuning): standard library
only, so that the install-time kernel build (setup.py) can use it before any dependency is installed."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    """$XDG_CACHE_HOME/inception-engine, else ~/.cache/inception-engine."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "inception-engine"
