"""The CUDA backend's kernels on the CPU: cuda_src/*.cu compiled by g++ with tests/cuda_emu/emu.h (each CUDA thread
a fiber) into a library whose entry points are generated from the backend's own argument formats, and a Python
subprocess in which tests/cuda_emu/pycuda stands in for pycuda on top of that library."""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from inception_engine import cuda_build
from inception_engine.backends.cuda.kernels import all_kernel_names, arg_format, source_of

from helpers.build_cache import shared_library

TESTS = Path(__file__).resolve().parents[1]
EMU = TESTS / "cuda_emu"
GXX = shutil.which("g++")
NOT_EMULATED = {"timing.cu"}  # inline PTX (%globaltimer); gpu_sleep is a no-op in the stand-in

C_PARAM = {"P": "void*", "i": "int", "q": "long long", "f": "float"}


@functools.cache
def codegen_flags() -> tuple[str, ...]:
    """g++ code generation flags of every emulator library. Where the CPU has FMA (x86-64 with the fma flag), -mfma
    makes the kernels' fmaf one instruction instead of a libm call (the same correctly rounded result; about a fifth
    of an fp32 forward's time otherwise). -ffp-contract=off keeps every other a * b + c two roundings, with or
    without it. The flag is part of the library's cache key, so a build for one CPU is not loaded on another."""
    flags = ["-ffp-contract=off"]
    if platform.machine() == "x86_64":
        with open("/proc/cpuinfo") as f:
            if any(line.startswith("flags") and " fma " in line + " " for line in f):
                flags.append("-mfma")
    return tuple(flags)


def wrapper_source() -> str:
    lines = [f'#include "{s}"' for s in cuda_build.SOURCES if s not in NOT_EMULATED]
    for kernel in all_kernel_names():
        if source_of(kernel) in NOT_EMULATED:
            continue
        fmt = arg_format(kernel)
        params = ", ".join(f"{C_PARAM[c]} a{i}" for i, c in enumerate(fmt))
        args = ", ".join(f"emu::Ptr{{a{i}}}" if c == "P" else f"a{i}" for i, c in enumerate(fmt))
        lines.append(f'extern "C" void emu_{kernel}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, {params}) '
                     f'{{ emu::launch(dim3{{gx, gy, gz}}, dim3{{bx}}, [&] {{ {kernel}({args}); }}); }}')
    return "\n".join(lines) + "\n"


def build_emu_lib(cache_dir: Path) -> Path:
    """libemu-<key>.so: every kernel the backend launches (but NOT_EMULATED's), with an emu_<kernel> entry point;
    built once into cache_dir (helpers.build_cache)."""
    flags = ["-std=c++20", "-O2", *codegen_flags(), "-shared", "-fPIC", "-fno-strict-aliasing",
             "-include", str(EMU / "emu.h"),
             "-include", str(EMU / "tf32_emu.h"), "-I", str(cuda_build.source_dir())]
    return shared_library(cache_dir, "emu", GXX, flags, wrapper_source(), [EMU, cuda_build.source_dir()])


def run_emulated(lib: Path, *args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(EMU), str(TESTS.parent), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, INCEPTION_EMU_LIB=str(lib), PYTHONPATH=path)
    return subprocess.run([sys.executable, *args], cwd=TESTS.parent, env=env, capture_output=True, text=True,
                          timeout=900)
