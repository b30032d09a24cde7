"""Fixtures of the kernel tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from inception_engine import cuda_build

from helpers.build_cache import file_lock
from helpers.emulator import build_emu_lib
from helpers.gpu_memory import OnGpu


def build_sm90_once(build_cache_dir: Path) -> dict[str, Path]:
    """cuda_build.build("sm_90") in the user cache the backend loads its cubins from (the emulator reports sm_90).
    The lock keeps parallel workers from running the same nvcc jobs at once: the first builds, the others wait and
    find every unit cached."""
    with file_lock(build_cache_dir / "cuda_build-sm_90.lock"):
        return cuda_build.build("sm_90")


@pytest.fixture(scope="session")
def kernel_cubins(build_cache_dir) -> dict[str, Path]:
    """Every compile unit's cubin for sm_90 (cuda_build.UNITS -> path), built once for the run."""
    if cuda_build.find_nvcc() is None:
        pytest.skip("nvcc (CUDA toolkit) is not on PATH")
    return build_sm90_once(build_cache_dir)


@pytest.fixture(scope="session")
def backend_emu_lib(build_cache_dir) -> Path:
    """Every kernel the backend launches, compiled for the CPU emulator (helpers.emulator): the library that
    helpers.emulator.run_emulated loads in place of the GPU. Where nvcc is installed, the backend's cubins are built
    first, once, so that the emulated runs of parallel workers do not each compile them."""
    if cuda_build.find_nvcc() is not None:
        build_sm90_once(build_cache_dir)
    return build_emu_lib(build_cache_dir)


@pytest.fixture(scope="module")
def gpu_mem(gpu):
    """helpers.gpu_memory on the GPU (a module may override it: test_conv_nhwc_i8 skips GPUs without wgmma)."""
    mem = OnGpu(gpu[1], gpu[0].arch)
    yield mem
    mem.close()


@pytest.fixture(params=["emulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def mem(request):
    """The test module's ``emu`` (its kernels on the CPU emulator), then ``gpu_mem``."""
    return request.getfixturevalue("emu" if request.param == "emulated" else "gpu_mem")
