"""The GPU through pycuda: ``driver`` (pycuda is imported here, and only when a backend is built, so a missing
pycuda is one line from ``CudaBackend.check_available``), ``probe`` (a device and its nvcc target, no context) and
``Gpu`` (a device's primary context, current only inside ``with gpu:``). The cuDNN backend and inception-bench probe
the GPU through here too."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from typing import Any

from ... import cuda_build
from ...errors import BackendUnavailable


def driver() -> Any:
    try:
        import pycuda.driver as drv
    except ImportError as e:
        if importlib.util.find_spec("pycuda") is None:
            raise BackendUnavailable("the GPU backends need pycuda, which is not installed (pip install '.[gpu]' "
                                     "on a machine with an NVIDIA GPU)") from None
        raise BackendUnavailable(f"pycuda is installed but cannot load ({e}); is the NVIDIA driver installed?"
                                 ) from None
    return drv


def probe(index: int = 0) -> tuple[Any, str]:
    """(device, nvcc target) of GPU ``index``, without creating a context; BackendUnavailable if there is none."""
    drv = driver()
    try:
        drv.init()
        if drv.Device.count() <= index:
            raise BackendUnavailable("no CUDA GPU found (the driver sees no device)")
        device = drv.Device(index)
        return device, cuda_build.target(device.compute_capability())
    except drv.Error as e:
        raise BackendUnavailable(f"the CUDA driver is unusable here ({str(e).splitlines()[0]}); "
                                 f"check the GPU with nvidia-smi") from None


def gpu_facts(index: int = 0) -> tuple[str, str, int]:
    """(name, nvcc target, SM count) of GPU ``index``, without creating a context: a primary context that is
    retained and released again is created and destroyed (~0.1-0.2 s each time), where a device's attributes need
    none."""
    device, arch = probe(index)
    return device.name(), arch, sm_count(device)


def sm_count(device: Any) -> int:
    return device.get_attribute(driver().device_attribute.MULTIPROCESSOR_COUNT)


class Gpu:
    """One device and its primary context (shared with the CUDA runtime, so cuDNN or PyTorch in the same process
    see the same memory). The context is current only inside ``with gpu:``; nothing is left pushed in between."""

    def __init__(self, index: int = 0):
        self.device, self.arch = probe(index)
        self.ctx = self.device.retain_primary_context()
        self.num_sms = sm_count(self.device)

    def __enter__(self) -> Gpu:
        self.ctx.push()
        return self

    def __exit__(self, *exc: object) -> None:
        driver().Context.pop()

    def release(self) -> None:
        self.ctx.detach()


@functools.cache
def _libcuda() -> Any:
    """The driver library, for the calls pycuda does not make: None where it cannot be loaded (the CPU emulator)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return lib


class HostRegistration:
    """Memory allocated elsewhere (a numpy array; the pipeline's ring, shared with decode processes) page-locked
    with the current context (cuMemHostRegister), so that copies from it are DMA instead of a gather into pinned
    memory first. ``ok`` False where the driver refuses it (or cannot be reached): the caller keeps its own path.
    Unregister (``close``) with a context current, before the memory goes."""

    def __init__(self, array: Any):
        self.ptr, lib = array.ctypes.data, _libcuda()
        self.ok = lib is not None and lib.cuMemHostRegister_v2(self.ptr, array.nbytes, 0) == 0

    def close(self) -> None:
        if self.ok:
            _libcuda().cuMemHostUnregister(self.ptr)
            self.ok = False
