"""Compile the CUDA kernels (cuda_src/*.cu) to cubins with nvcc, once per (sources, flags, target), cached on disk.

A compile unit is a source file, or (conv_nhwc.cu) one element type's tiles of one kind: ``UNITS``. A backend builds
the units its launches need, in parallel, so a first run waits for the few kernels it uses (the largest tf32 unit
compiles in about a seventh of the whole file's time). A cubin is named
``<unit>-<key>.cubin`` in ``~/.cache/inception-engine/kernels/`` where the key hashes every file of cuda_src (a
header change rebuilds everything), the flags and the target, so a second process starts without compiling and an
edited kernel never loads stale code. Files appear atomically (compile to a temporary name, rename).
``python -m inception_engine.cuda_build`` builds every unit for this machine's GPU ahead of the first run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from . import native_build
from .errors import BackendUnavailable
from .paths import user_cache_dir

SOURCES = ("conv.cu", "conv_tf32.cu", "conv_f16.cu", "conv_nhwc.cu", "conv_input_nhwc.cu", "winograd.cu", "pool.cu",
           "pool_nhwc.cu", "fc.cu", "softmax.cu", "timing.cu", "pipeline_io.cu", "resize_pil.cu")
# unit -> (source, extra nvcc flags). conv_nhwc.cu is one unit per element type and kind of tile (its IE_NHWC_ONLY_*
# macros): sync = the mma.sync tiles and the split-K reduction; fp32 has wgmma tiles only.
NHWC_ELEMS = {"f16": "conv_nhwc_", "tf32": "conv_nhwc_tf32_", "f32": "conv_nhwc_f32_"}  # unit suffix -> kernel prefix
NHWC_KINDS = {"f16": ("sync", "wgmma", "ws", "halo"), "tf32": ("sync", "wgmma", "ws", "halo"), "f32": ("sync", "wgmma")}
UNITS: dict[str, tuple[str, tuple[str, ...]]] = {
    **{name: (name, ()) for name in SOURCES if name != "conv_nhwc.cu"},
    **{f"conv_nhwc_{e}_{k}": ("conv_nhwc.cu", (f"-DIE_NHWC_ONLY_{e.upper()}", f"-DIE_NHWC_ONLY_{k.upper()}"))
       for e, kinds in NHWC_KINDS.items() for k in kinds},
}
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


def unit_of(source: str, kernel: str) -> str:
    """The compile unit that holds ``kernel`` of ``source``."""
    if source != "conv_nhwc.cu":
        return source
    elem = max((prefix, e) for e, prefix in NHWC_ELEMS.items() if kernel.startswith(prefix))[1]
    kind = next((k for k in ("wgmma", "ws", "halo") if f"_{k}_" in kernel), "sync")
    return f"conv_nhwc_{elem}_{kind}"


def build_key(arch: str) -> str:
    targets = [" ".join(target_flags(name, arch)) for name in SOURCES]
    return native_build.build_key(source_dir(), (".cu", ".cuh", ".h"), " ".join((arch, *FLAGS, *targets)))


def cubin_paths(arch: str) -> dict[str, Path]:
    """Where each unit's cubin lives for this target (whether built yet or not)."""
    key = build_key(arch)
    return {unit: cache_dir() / f"{Path(unit).stem}-{key}.cubin" for unit in UNITS}


def log_path(cubin: Path) -> Path:
    """nvcc's output for the build that wrote ``cubin``."""
    return cubin.with_suffix(".log")


def is_cached(arch: str) -> bool:
    return all(p.is_file() for p in cubin_paths(arch).values())


def build(arch: str, units: Iterable[str] | None = None) -> dict[str, Path]:
    """Compile those of ``units`` (default: all) that are not cached yet, at once, in parallel; unit -> cubin path."""
    every = cubin_paths(arch)
    paths = {unit: every[unit] for unit in (UNITS if units is None else units)}
    todo = {name: p for name, p in paths.items() if not p.is_file()}
    if not todo:
        return paths
    nvcc = find_nvcc()
    if nvcc is None:
        raise BackendUnavailable(f"nvcc (the CUDA compiler) is not on PATH and the kernels for {arch} are not "
                                 f"cached in {cache_dir()}; install the CUDA toolkit or put its bin/ on PATH")
    cache_dir().mkdir(parents=True, exist_ok=True)
    # a run that compiles says so once: it is the one wait a first run has (the install builds them where it can)
    print(f"note: compiling {len(todo)} kernel unit{'s' if len(todo) != 1 else ''} for {arch} (once; "
          f"`python -m inception_engine.cuda_build` builds them ahead)", file=sys.stderr)
    src = source_dir()
    jobs = []
    for name, dst in todo.items():
        fd, tmp = tempfile.mkstemp(prefix="." + dst.name + ".", suffix=".part", dir=dst.parent)
        os.close(fd)
        source, defines = UNITS[name]
        cmd = [nvcc, *target_flags(source, arch), *FLAGS, *defines, "-cubin", "-o", tmp, str(src / source)]
        jobs.append((name, dst, tmp, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                      text=True)))
    failure = None
    for name, dst, tmp, proc in jobs:
        out, _ = proc.communicate()
        if proc.returncode == 0:
            os.replace(tmp, dst)
            # ptxas's information beside the cubin: -Werror passes some of it that matters (C7520, a serialized
            # wgmma pipeline), which tests/test_nvcc_compile.py reads here
            log_path(dst).write_text(out)
            continue
        os.unlink(tmp)
        lines = [l for l in out.splitlines() if "error" in l.lower()] or out.splitlines() or ["(no output)"]
        failure = failure or f"nvcc could not compile {name} for {arch}: {lines[0].strip()}"
    if failure:
        raise BackendUnavailable(failure)
    return paths


def local_targets() -> list[str]:
    """nvcc targets of this machine's GPUs, from nvidia-smi (no CUDA library needed); [] where there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.split():
        major, _, minor = line.strip().partition(".")
        if major.isdigit() and minor.isdigit() and target((int(major), int(minor))) not in found:
            found.append(target((int(major), int(minor))))
    return found


def main(argv: list[str] | None = None) -> int:
    """Build every unit for this machine's GPUs, so that no run waits for nvcc. ``--at-install`` (setup.py): never
    fail, say in one line what was done."""
    import time

    at_install = "--at-install" in (sys.argv[1:] if argv is None else argv)
    say = "inception-engine: " if at_install else "error: "
    archs = local_targets()
    if not archs:
        print(f"{say}no NVIDIA GPU found (nvidia-smi sees none); the kernels compile at the first run on one",
              file=sys.stderr)
        return 0 if at_install else 2
    t0 = time.perf_counter()
    try:
        units = sum(len(build(arch)) for arch in archs)
    except BackendUnavailable as e:
        print(f"{say}{e}; the kernels compile at the first run", file=sys.stderr)
        return 0 if at_install else 2
    print(f"inception-engine: {units} kernel units for {', '.join(archs)} in {cache_dir()} "
          f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
