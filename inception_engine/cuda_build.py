"""Compile the CUDA kernels (cuda_src/*.cu) to cubins with nvcc, once per (sources, flags, target), cached on disk.

A cubin is named ``<source stem>-<key>.cubin`` in ``~/.cache/inception-engine/kernels/`` where the key hashes every
file of cuda_src (a header change rebuilds everything), the flags and the target, so a second process starts without
compiling and an edited kernel never loads stale code. Files appear atomically (compile to a temporary name, rename).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import native_build
from .errors import BackendUnavailable
from .weights import user_cache_dir

SOURCES = ("conv.cu", "conv_tf32.cu", "conv_f16.cu", "conv_nhwc.cu", "conv_input_nhwc.cu", "winograd.cu", "pool.cu",
           "pool_nhwc.cu", "fc.cu", "softmax.cu", "timing.cu", "resize_pil.cu")
# -lineinfo costs nothing at run time and lets compute-sanitizer and Nsight point at source lines.
FLAGS = ("-O3", "-std=c++17", "-lineinfo", "-Werror", "all-warnings")
# Sources with kernels for an architecture's own features, built for its "a" target where it has one: conv_nhwc.cu's
# wgmma tiles need sm_90a (`-arch=sm_90a` would run a plain sm_90 pass too, which rejects wgmma: the -gencode form).
ARCH_SPECIFIC = {"conv_nhwc.cu": ("sm_90",)}


def has_wgmma(arch: str) -> bool:
    """Whether conv_nhwc.cu's wgmma tiles are built for this target."""
    return arch in ARCH_SPECIFIC["conv_nhwc.cu"]


def target_flags(name: str, arch: str) -> list[str]:
    if arch in ARCH_SPECIFIC.get(name, ()):
        n = arch.removeprefix("sm_")
        return [f"-gencode=arch=compute_{n}a,code=sm_{n}a"]
    return [f"-arch={arch}"]


def source_dir() -> Path:
    return native_build.source_dir("cuda_src", SOURCES[0])


def cache_dir() -> Path:
    return user_cache_dir() / "kernels"


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc")
    return None


def target(compute_capability: tuple[int, int]) -> str:
    """nvcc's name for a device's architecture: (9, 0) -> "sm_90"."""
    return f"sm_{compute_capability[0]}{compute_capability[1]}"


def build_key(arch: str) -> str:
    targets = [" ".join(target_flags(name, arch)) for name in SOURCES]
    return native_build.build_key(source_dir(), (".cu", ".cuh", ".h"), " ".join((arch, *FLAGS, *targets)))


def cubin_paths(arch: str) -> dict[str, Path]:
    """Where each source's cubin lives for this target (whether built yet or not)."""
    key = build_key(arch)
    return {name: cache_dir() / f"{Path(name).stem}-{key}.cubin" for name in SOURCES}


def is_cached(arch: str) -> bool:
    return all(p.is_file() for p in cubin_paths(arch).values())


def build(arch: str) -> dict[str, Path]:
    """Compile what is not cached yet (all sources at once, in parallel) and return source name -> cubin path."""
    paths = cubin_paths(arch)
    todo = {name: p for name, p in paths.items() if not p.is_file()}
    if not todo:
        return paths
    nvcc = find_nvcc()
    if nvcc is None:
        raise BackendUnavailable(f"nvcc (the CUDA compiler) is not on PATH and the kernels for {arch} are not "
                                 f"cached in {cache_dir()}; install the CUDA toolkit or put its bin/ on PATH")
    cache_dir().mkdir(parents=True, exist_ok=True)
    src = source_dir()
    jobs = []
    for name, dst in todo.items():
        fd, tmp = tempfile.mkstemp(prefix="." + dst.name + ".", suffix=".part", dir=dst.parent)
        os.close(fd)
        cmd = [nvcc, *target_flags(name, arch), *FLAGS, "-cubin", "-o", tmp, str(src / name)]
        jobs.append((name, dst, tmp, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                      text=True)))
    failure = None
    for name, dst, tmp, proc in jobs:
        out, _ = proc.communicate()
        if proc.returncode == 0:
            os.replace(tmp, dst)
            continue
        os.unlink(tmp)
        lines = [l for l in out.splitlines() if "error" in l.lower()] or out.splitlines() or ["(no output)"]
        failure = failure or f"nvcc could not compile {name} for {arch}: {lines[0].strip()}"
    if failure:
        raise BackendUnavailable(failure)
    return paths
