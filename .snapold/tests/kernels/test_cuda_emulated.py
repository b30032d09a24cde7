"""The CUDA kernels, and the CUDA backend end to end, run on the CPU where there is no GPU (CI).

cuda_src/*.cu is compiled by g++ with tests/cuda_emu/emu.h (each CUDA thread a fiber, see there) into a library
whose entry points are generated from the backend's own argument formats, so a kernel signature that disagrees
with what the backend packs does not even compile. tests/cuda_emu/pycuda stands in for pycuda on top of it. Under
that stand-in the GPU tests of test_cuda_kernels.py run unchanged (every network shape included), and the
backend's self-test runs one whole forward (75x75 images, batch 2) against the float64 NumPy reference.
This proves the kernels' arithmetic and the host-side plumbing; timing, memory ordering, launch limits of a real
GPU and the CUDA-graph path are for the GPU run (dev/gpu_machine/gpu_check.sh).
"""

from __future__ import annotations

import pytest

from inception_engine import cuda_build
from inception_engine.backends.cuda.winograd import winograd_eligible
from inception_engine.plan import build_plan

from helpers.emulator import GXX, run_emulated


pytestmark = [pytest.mark.skipif(GXX is None or cuda_build.find_nvcc() is None,
                                 reason="needs g++ and nvcc (the stand-in loads the kernels the backend builds)"),
              pytest.mark.slow]


def test_kernel_tests_pass_on_the_emulator(backend_emu_lib):
    r = run_emulated(backend_emu_lib, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                     "tests/kernels/test_cuda_kernels.py")
    tail = r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    assert "passed" in tail and "skipped" not in tail, tail  # ran, not skipped for want of a GPU


# The pipeline tests in three runs, so that a parallel run (pytest -n) spreads them: the two streaming tests (whole
# emulated forwards) alone, and every other test of the two files together, a test added to them included.
STREAM_TESTS = ["tests/kernels/test_pipeline_io.py::test_gpu_decode_stream_matches_the_cpu_stream",
                "tests/kernels/test_pipeline_io.py::test_cuda_runner_streams_the_reference_predictions"]
PIPELINE_RUNS = {"gpu-decode-stream": [STREAM_TESTS[0]], "runner-stream": [STREAM_TESTS[1]],
                 "kernels": ["tests/kernels/test_pipeline_io.py", "tests/kernels/test_resize_pil.py",
                             "tests/kernels/test_resize_fid.py",
                             *(f"--deselect={t}" for t in STREAM_TESTS)]}


@pytest.mark.parametrize("run", list(PIPELINE_RUNS))
def test_pipeline_kernels_on_the_emulator(backend_emu_lib, run):
    """The streaming pipeline's kernels: pipeline_io.cu's normalize and top-k and the cuda runner streaming images
    through a ring (tests/kernels/test_pipeline_io.py); resize_pil.cu bit-exact against Pillow and GpuJpegDecoder's
    host side with Pillow standing in for nvImageCodec (tests/kernels/test_resize_pil.py); resize_fid.cu against the
    CPU path's pytorch-fid resize (tests/kernels/test_resize_fid.py)."""
    r = run_emulated(backend_emu_lib, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                     *PIPELINE_RUNS[run])
    tail = r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    assert "passed" in tail and "skipped" not in tail, tail


def test_backend_forward_on_the_emulator(backend_emu_lib):
    """fp32 on NCHW tensors (the emulator reports sm_90, where fp32 defaults to NHWC: test_conv_nhwc.py runs that)."""
    r = run_emulated(backend_emu_lib, "-m", "inception_engine.backends.cuda", "--selftest", "--batch", "2",
                     "--graph", "off", "--concurrent", "on", "--input-size", "75", "--layout", "nchw")
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    assert "features rel L2" in r.stdout, r.stdout[-2000:]  # the pool's output copied back, checked too


@pytest.mark.parametrize("layout,precision", [("nchw", "fp32"), ("nhwc", "tf32"), ("nhwc", "fp16")])
def test_fid_network_forward_on_the_emulator(backend_emu_lib, layout, precision):
    """pytorch-fid's FID Inception (average pools without padding, Mixed_7c's padded max pool, 1008 classes) through
    the CUDA backend's pool kernels (pool.cu, pool_nhwc.cu: is_max and count_include_pad per launch), logits and
    features against float64."""
    r = run_emulated(backend_emu_lib, "-m", "inception_engine.backends.cuda", "--selftest", "--batch", "2",
                     "--graph", "off", "--concurrent", "on", "--input-size", "75", "--layout", layout,
                     "--precision", precision, "--network", "fid")
    out = r.stdout[-2000:] + r.stderr[-3000:]
    assert r.returncode == 0 and "PASS" in r.stdout and "FID network" in r.stdout, out
    print(r.stdout.strip().splitlines()[-1])  # the errors against float64, logits and features (-s shows them)


def test_bench_kernels_runs_on_the_emulator(backend_emu_lib):
    """dev/bench_kernels.py end to end (the eager modes, the per-op table, the summary), on tiny inputs; with
    Winograd forced on, whose rows carry actual TFLOP/s and the direct kernel's ms (12 columns)."""
    r = run_emulated(backend_emu_lib, "dev/bench_kernels.py", "--batch-sizes", "1", "--iters", "1", "--warmup", "0",
                     "--per-op", "1", "--input-size", "75", "--no-graph", "--winograd", "on")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    summary = r.stdout.split("\nsummary\n")[1]
    assert all(mode in summary for mode in ("eager, serial, fixup", "eager, concurrent, reduce",
                                            "eager, serial, reduce, direct")), summary
    assert "Mixed_7c.branch3x3dbl_2" in r.stdout and "slowest ops" in summary
    wino_rows = [line for line in r.stdout.splitlines() if "winograd F" in line]
    eligible = sum(winograd_eligible(op) for op in build_plan(1, input_size=75).conv_ops)
    assert eligible == 41, eligible  # 3x3, 5x5, 1x7, 7x1: every one forced to Winograd
    assert len(wino_rows) == eligible and all(len(line.split()) == 12 for line in wino_rows), wino_rows
