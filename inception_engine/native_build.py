"""What the two native builds share (cuda_build.py for cuda_src/, backends/cpu_kernels.py for cpu_src/): where the
shipped sources are, and the cache key that changes whenever one of them, the compiler or the flags change."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path


def source_dir(folder: str, probe: str) -> Path:
    """``folder`` (cuda_src or cpu_src) beside this module, where an install puts it (package
    ``inception_engine.<folder>``), else at the top of the checkout this module is in; ``probe`` is a file that
    must be in it. Found from this file, not through the import system: an editable install's finder answers for
    ``inception_engine.<folder>`` wherever the package was imported from, so another checkout on PYTHONPATH (an old
    tree beside the new for an A/B) would build the installed checkout's kernels under its own Python."""
    here = Path(__file__).resolve().parent
    for path in (here / folder, here.parent / folder):
        if (path / probe).is_file():
            return path
    return here.parent / folder


def build_key(src: Path, suffixes: tuple[str, ...], tools: str) -> str:
    """20 hex digits of a hash of every file of ``src`` with one of ``suffixes`` (name and bytes) and ``tools``
    (compiler, target, flags), so that any edit, even to a header, builds anew."""
    h = hashlib.sha256()
    for path in sorted(src.iterdir()):
        if path.suffix in suffixes:
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(tools.encode())
    return h.hexdigest()[:20]


def compile_library(command: list[str], path: Path, what: str, timeout: float) -> Path:
    """Run ``command`` + ["-o", a temporary file beside ``path``] and rename the result to ``path``: a cached
    library appears whole or not at all. Raises OSError with the compiler's first error line. ``what`` names the
    sources in messages."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".part", dir=path.parent)
    os.close(fd)
    try:
        try:
            done = subprocess.run([*command, "-o", tmp], capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.SubprocessError) as e:
            raise OSError(f"{command[0]} did not finish compiling {what}: {e}") from None
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if "error" in line.lower()] or done.stderr.splitlines()
            raise OSError(f"{command[0]} could not compile {what}: {(lines or ['(no output)'])[0].strip()}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
