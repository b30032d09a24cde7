"""What the two native builds share (cuda_build.py for cuda_src/, backends/cpu_kernels.py for cpu_src/): where the
shipped sources are, and the cache key that changes whenever one of them, the compiler or the flags change."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
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


def c_compiler() -> list[str]:
    """The C compiler command: $CC (it may carry arguments: "ccache gcc"), else cc."""
    return shlex.split(os.environ.get("CC", "")) or ["cc"]


def c_cache_dir() -> Path:
    """Where the C libraries are cached."""
    from .paths import user_cache_dir  # here: this module also loads alone, as a file (test_cuda_build)

    return user_cache_dir() / "cpu"


def c_library(stem: str, sources: tuple[str, ...], flags: tuple[str, ...]) -> Path:
    """``~/.cache/inception-engine/cpu/<stem>-<key>.so``: cpu_src's ``sources`` built with ``flags`` by the C
    compiler, compiling them first if that is not cached. The key hashes every file of cpu_src, the compiler (its
    path and ``--version``) and the flags: an edited source or another compiler never loads stale code. Raises
    OSError with the reason (no compiler, a failed build)."""
    cc = c_compiler()
    found = shutil.which(cc[0])
    if found is None:
        raise OSError(f"no C compiler: {cc[0]!r} (from $CC, else cc) is not on PATH")
    cc[0] = found
    try:
        version = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise OSError(f"C compiler {found} does not run: {e}") from None
    src = source_dir("cpu_src", sources[0])
    path = c_cache_dir() / f"{stem}-{build_key(src, ('.c', '.h'), chr(0).join((*cc, version, *flags)))}.so"
    if path.is_file():
        return path
    return compile_library([*cc, *flags, *(str(src / s) for s in sources)], path, ", ".join(sources), timeout=600)
