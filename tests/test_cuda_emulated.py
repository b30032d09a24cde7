"""The CUDA kernels, and the CUDA backend end to end, run on the CPU where there is no GPU (CI).

cuda_src/*.cu is compiled by g++ with tests/cuda_emu/emu.h (each CUDA thread a fiber, see there) into a library
whose entry points are generated from the backend's own argument formats, so a kernel signature that disagrees
with what the backend packs does not even compile. tests/cuda_emu/pycuda stands in for pycuda on top of it. Under
that stand-in the GPU tests of test_cuda_kernels.py run unchanged (except the large stem shapes, for time), and
the backend's self-test runs one whole forward (75x75 images, batch 2) against the float64 NumPy reference.
This proves the kernels' arithmetic and the host-side plumbing; timing, memory ordering, launch limits of a real
GPU and the CUDA-graph path are for the GPU run (dev/gpu_machine/gpu_check.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inception_engine import cuda_build
from inception_engine.backends import cuda as cb
from inception_engine.plan import build_plan

TESTS = Path(__file__).resolve().parent
EMU = TESTS / "cuda_emu"
GXX = shutil.which("g++")
NOT_EMULATED = {"timing.cu"}  # inline PTX (%globaltimer); gpu_sleep is a no-op in the stand-in

pytestmark = pytest.mark.skipif(GXX is None or cuda_build.find_nvcc() is None,
                                reason="needs g++ and nvcc (the stand-in loads the kernels the backend builds)")

C_PARAM = {"P": "void*", "i": "int", "q": "long long"}


def wrapper_source() -> str:
    lines = [f'#include "{s}"' for s in cuda_build.SOURCES if s not in NOT_EMULATED]
    for kernel in cb.all_kernel_names():
        if cb.source_of(kernel) in NOT_EMULATED:
            continue
        fmt = cb.arg_format(kernel)
        params = ", ".join(f"{C_PARAM[c]} a{i}" for i, c in enumerate(fmt))
        args = ", ".join(f"emu::Ptr{{a{i}}}" if c == "P" else f"a{i}" for i, c in enumerate(fmt))
        lines.append(f'extern "C" void emu_{kernel}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, {params}) '
                     f'{{ emu::launch(dim3{{gx, gy, gz}}, dim3{{bx}}, [&] {{ {kernel}({args}); }}); }}')
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def emu_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("emu")
    (out / "emu_kernels.cpp").write_text(wrapper_source())
    lib = out / "libemu.so"
    cmd = [GXX, "-std=c++20", "-O2", "-shared", "-fPIC", "-fno-strict-aliasing", "-include", str(EMU / "emu.h"),
           "-include", str(EMU / "tf32_emu.h"), "-I", str(cuda_build.source_dir()), str(out / "emu_kernels.cpp"),
           "-o", str(lib)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return lib


def run_emulated(lib: Path, *args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(EMU), str(TESTS.parent), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, INCEPTION_EMU_LIB=str(lib), PYTHONPATH=path)
    return subprocess.run([sys.executable, *args], cwd=TESTS.parent, env=env, capture_output=True, text=True,
                          timeout=900)


def test_kernel_tests_pass_on_the_emulator(emu_lib):
    # The 8x8 and 17x17 network shapes (the split-K ones at batch 1) are cheap; the 35x35+ ones take minutes here.
    select = "not every_network_shape or Mixed_6b or Mixed_7"
    r = run_emulated(emu_lib, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-k", select,
                     "tests/test_cuda_kernels.py")
    tail = r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    assert "passed" in tail and "skipped" not in tail, tail  # ran, not skipped for want of a GPU


def test_pipeline_kernels_on_the_emulator(emu_lib):
    """The streaming pipeline's kernels: pipeline_io.cu's normalize and top-k and the cuda runner streaming images
    through a ring (tests/test_pipeline_kernels.py); resize_pil.cu bit-exact against Pillow and GpuJpegDecoder's
    host side with Pillow standing in for nvImageCodec (tests/test_resize_pil_kernel.py)."""
    r = run_emulated(emu_lib, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                     "tests/test_pipeline_kernels.py", "tests/test_resize_pil_kernel.py")
    tail = r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    assert "passed" in tail and "skipped" not in tail, tail


def test_backend_forward_on_the_emulator(emu_lib):
    """fp32 on NCHW tensors (the emulator reports sm_90, where fp32 defaults to NHWC: test_cuda_nhwc.py runs that)."""
    r = run_emulated(emu_lib, "-m", "inception_engine.backends.cuda", "--selftest", "--batch", "2",
                     "--graph", "off", "--concurrent", "on", "--input-size", "75", "--layout", "nchw")
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]


def test_bench_kernels_runs_on_the_emulator(emu_lib):
    """dev/bench_kernels.py end to end (the eager modes, the per-op table, the summary), on tiny inputs; with
    Winograd forced on, whose rows carry actual TFLOP/s and the direct kernel's ms (12 columns)."""
    r = run_emulated(emu_lib, "dev/bench_kernels.py", "--batch-sizes", "1", "--iters", "1", "--warmup", "0",
                     "--per-op", "1", "--input-size", "75", "--no-graph", "--winograd", "on")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    summary = r.stdout.split("\nsummary\n")[1]
    assert all(mode in summary for mode in ("eager, serial, fixup", "eager, concurrent, reduce",
                                            "eager, serial, reduce, direct")), summary
    assert "Mixed_7c.branch3x3dbl_2" in r.stdout and "slowest ops" in summary
    wino_rows = [line for line in r.stdout.splitlines() if "winograd F" in line]
    eligible = sum(cb.winograd_eligible(op) for op in build_plan(1, input_size=75).conv_ops)
    assert eligible == 41, eligible  # 3x3, 5x5, 1x7, 7x1: every one forced to Winograd
    assert len(wino_rows) == eligible and all(len(line.split()) == 12 for line in wino_rows), wino_rows
