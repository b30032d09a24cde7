"""What the two native builds share (cuda_build.py for cuda_src/, backends/cpu_kernels.py for cpu_src/): where the
shipped sources are, and the cache key that changes whenever one of them, the compiler or the flags change."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path


def source_dir(folder: str, probe: str) -> Path:
    """``folder`` (cuda_src or cpu_src) as installed (package ``inception_engine.<folder>``), else at the top of a
    checkout; ``probe`` is a file that must be in it."""
    try:
        path = Path(str(resources.files(f"inception_engine.{folder}")))
        if (path / probe).is_file():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parent.parent / folder


def build_key(src: Path, suffixes: tuple[str, ...], tools: str) -> str:
    """20 hex digits of a hash of every file of ``src`` with one of ``suffixes`` (name and bytes) and ``tools``
    (compiler, target, flags), so that any edit, even to a header, builds anew."""
    h = hashlib.sha256()
    for path in sorted(src.iterdir()):
        if path.suffix in suffixes:
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(tools.encode())
    return h.hexdigest()[:20]
