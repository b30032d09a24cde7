"""Compiled test libraries (the fiber emulator's), built once and shared: by every test module of a run, by the
workers of a parallel run (pytest -n) and by later runs.

A library is named by a hash of everything that goes into it: the command line, the generated source, the
compiler's version and every file of the directories it includes from. A change to any of them is a new name, so a
cached library is always the one the current sources would build. The first worker to need a library builds it under
a file lock while the others wait for it; the file appears atomically (temp file in the same directory, fsync,
os.replace), so an interrupted build leaves nothing a later run would load.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path


TEST_CACHE_VAR = "INCEPTION_TEST_CACHE"  # README's "Run the tests": where the tests keep what they make


def cache_for_tests(kind: str) -> Path:
    """Where the tests keep what outlives a run, ``kind`` "models" (generated ONNX models) or "builds" (compiled
    libraries): under $INCEPTION_TEST_CACHE where it is set (models at its top, as ever, builds in builds/), else in
    the user's cache as the engine finds it ($XDG_CACHE_HOME/inception-engine, else ~/.cache/inception-engine:
    paths.user_cache_dir), as test-models/ and test-builds/. Nothing is written anywhere else."""
    from inception_engine.paths import user_cache_dir

    root = os.environ.get(TEST_CACHE_VAR)
    if root:
        return Path(root) / ("" if kind == "models" else kind)
    return user_cache_dir() / f"test-{kind}"


@functools.cache
def compiler_version(compiler: str) -> str:
    return subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout


def content_key(parts: Iterable[str], dirs: Iterable[Path]) -> str:
    """sha256 of the parts and of every file (name and bytes) under dirs, in a fixed order."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    for d in dirs:
        for f in sorted(p for p in Path(d).rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update(str(f.relative_to(d)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:20]


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on path (created if missing) for the block: one process at a time, the others wait.
    The lock goes with the file descriptor, so a process that dies holding it releases it."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def cached_build(cache_dir: Path, name: str, suffix: str, key: str, build: Callable[[Path], None]) -> Path:
    """cache_dir/<name>-<key><suffix>: build(path) writes it once (into a temp path, then moved in place)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / f"{name}-{key}{suffix}"
    if final.is_file():
        return final
    with file_lock(cache_dir / f"{name}-{key}.lock"):
        if final.is_file():  # another worker built it while this one waited
            return final
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".part", dir=cache_dir)
        os.close(fd)
        try:
            build(Path(tmp))
            os.chmod(tmp, 0o755)  # mkstemp's 0600, as a compiler's output would be
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return final


def shared_library(cache_dir: Path, name: str, compiler: str, flags: list[str], source: str,
                   include_dirs: list[Path]) -> Path:
    """lib<name>-<key>.so in cache_dir: C++ source compiled by `compiler flags`, which may read any file under
    include_dirs (all of them are in the key)."""
    def build(lib: Path) -> None:
        cpp = lib.with_name(lib.name + ".cpp")
        cpp.write_text(source)
        try:
            r = subprocess.run([compiler, *flags, "-x", "c++", str(cpp), "-o", str(lib)], capture_output=True,
                               text=True)
        finally:
            cpp.unlink()
        assert r.returncode == 0, r.stderr[-4000:]

    key = content_key([*flags, source, compiler_version(compiler)], include_dirs)
    return cached_build(cache_dir, f"lib{name}", ".so", key, build)
