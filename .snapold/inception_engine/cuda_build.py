"""Compile the CUDA kernels (cuda_src/*.cu) to cubins with nvcc, once per (sources, flags, target), cached on disk.

A compile unit is a source file, or for the NHWC conv families (conv_nhwc_*.cu) a file and one element type:
``UNITS``. A backend builds the units its launches need, in parallel, so a first run waits for the few kernels it
uses. A cubin is named ``<unit>-<key>.cubin`` in ``~/.cache/inception-engine/kernels/`` where the key hashes every
file of cuda_src (a header change rebuilds everything), the flags and the target, so a second process starts without
compiling and an edited kernel never loads stale code. Files appear atomically (compile to a temporary name, rename).
``python -m inception_engine.cuda_build`` builds every unit for this machine's GPU ahead of the first run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from . import native_build
from .errors import BackendUnavailable
from .paths import user_cache_dir

PROBE = "common.cuh"  # a file every cuda_src/ holds (native_build.source_dir)


def source_dir() -> Path:
    return native_build.source_dir("cuda_src", PROBE)


def read_sources() -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """The .cu files of cuda_src/, each a compile unit, and those that compile once per NHWC element type they hold:
    source -> the element types, read off its ``#ifdef IE_NHWC_<ELEMENT>`` blocks (conv_nhwc.cuh's). Read off the
    directory, so that a kernel family's new .cu is built without being listed anywhere else."""
    sources = tuple(sorted(p.name for p in source_dir().glob("*.cu")))
    per_element = {}
    for name in sources:
        found = re.findall(r"^#ifdef IE_NHWC_(\w+)", (source_dir() / name).read_text(), re.M)
        if found:
            per_element[name] = tuple(dict.fromkeys(e.lower() for e in found))
    return sources, per_element


SOURCES, PER_ELEMENT = read_sources()
# The NHWC conv families (conv_nhwc.cuh) compile once per element type they hold, as <stem>_<element> with
# -DIE_NHWC_<ELEMENT>, so that a run compiles only the units its launches use. An element type's kernels are named
# conv_nhwc<suffix>_... (cuda.tiles.NHWC_ELEMS[element].suffix).
NHWC_ELEMENT_SUFFIXES = {"fp16": "", "tf32": "_tf32", "fp32": "_f32", "int8": "_i8"}
# unit -> (source, extra nvcc flags)
UNITS: dict[str, tuple[str, tuple[str, ...]]] = {
    unit: (name, defines) for name in SOURCES
    for unit, defines in ([(f"{Path(name).stem}_{e}", (f"-DIE_NHWC_{e.upper()}",)) for e in PER_ELEMENT[name]]
                          if name in PER_ELEMENT else [(name, ())])
}
# -lineinfo costs nothing at run time and lets compute-sanitizer and Nsight point at source lines.
FLAGS = ("-O3", "-std=c++17", "-lineinfo", "-Werror", "all-warnings")
# Sources with kernels for an architecture's own features, built for its "a" target where it has one: the NHWC conv
# families' wgmma tiles need sm_90a (`-arch=sm_90a` would run a plain sm_90 pass too, which rejects wgmma: the
# -gencode form). The mma.sync family goes with them, so that every NHWC conv unit has the same target.
ARCH_SPECIFIC = {name: ("sm_90",) for name in PER_ELEMENT}


def has_wgmma(arch: str) -> bool:
    """Whether the wgmma tiles (conv_nhwc_wgmma.cu, _ws.cu, _halo.cu) are built for this target."""
    return arch in ARCH_SPECIFIC["conv_nhwc_wgmma.cu"]


def target_flags(name: str, arch: str) -> list[str]:
    if arch in ARCH_SPECIFIC.get(name, ()):
        n = arch.removeprefix("sm_")
        return [f"-gencode=arch=compute_{n}a,code=sm_{n}a"]
    return [f"-arch={arch}"]


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
    if source not in PER_ELEMENT:
        return source
    element = max((len(s), e) for e, s in NHWC_ELEMENT_SUFFIXES.items() if kernel.startswith(f"conv_nhwc{s}_"))[1]
    return f"{Path(source).stem}_{element}"


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
            # wgmma pipeline), which tests/kernels/test_nvcc_compile.py reads here
            log_path(dst).write_text(out)
            continue
        os.unlink(tmp)
        lines = [l for l in out.splitlines() if "error" in l.lower()] or out.splitlines() or ["(no output)"]
        failure = failure or f"nvcc could not compile {name} for {arch}: {lines[0].strip()}"
    if failure:
        raise BackendUnavailable(failure)
    return paths


def gpu_target() -> str:
    """nvcc's target for the first visible GPU, as nvidia-smi reports its compute capability (no CUDA context, no
    pycuda: this module sits below the backends). The GPU is the first of CUDA_VISIBLE_DEVICES where that is set
    (an index or a UUID, both of which nvidia-smi --id takes), else GPU 0."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise BackendUnavailable("nvidia-smi is not on PATH, so there is no GPU to build the kernels for; "
                                 "install the NVIDIA driver")
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    if not gpu or gpu.startswith("-"):
        raise BackendUnavailable(f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} hides every GPU; "
                                 f"unset it to build the kernels for GPU 0")
    r = subprocess.run([smi, f"--id={gpu}", "--query-gpu=compute_cap", "--format=csv,noheader"],
                       capture_output=True, text=True)
    answer = (r.stdout.strip() or r.stderr.strip() or "no output").splitlines()[0].strip()
    major, _, minor = answer.partition(".")
    if r.returncode != 0 or not (major.isdigit() and minor.isdigit()):
        raise BackendUnavailable(f"nvidia-smi gave no compute capability for GPU {gpu} ({answer}); "
                                 f"check the GPU with nvidia-smi")
    return target((int(major), int(minor)))


def main(argv: list[str] | None = None) -> int:
    """Build every unit for the first visible GPU, so that no run waits for nvcc. ``--at-install`` (setup.py):
    never fail the install, say in one line what was done."""
    import time

    at_install = "--at-install" in (sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    try:
        arch = gpu_target()
        units = len(build(arch))
    except BackendUnavailable as e:
        print(f"inception-engine: {e}; the kernels compile at the first run" if at_install else f"error: {e}",
              file=sys.stderr)
        return 0 if at_install else 2
    print(f"inception-engine: {units} kernel units for {arch} in {cache_dir()} ({time.perf_counter() - t0:.1f} s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
