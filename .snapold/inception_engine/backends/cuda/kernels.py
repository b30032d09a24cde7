"""The registry of cuda_src/'s kernels: one ``KernelSpec`` per entry point (``spec(name)``, ``REGISTRY``), the entries
of the kernel families (families/: each family's module states its kernels' signatures, blocks and shared memory, and
builds their launches). Everything else is read off it: ``source_of``, ``signature``, ``arg_format`` (the pycuda
struct format), ``unit_of`` (the compile unit, cuda_build.UNITS) and the shared-memory opt-in at load (``Kernels``,
which builds the cubins with cuda_build, nvcc at first use, cached, and loads them into the current context).

Tests hold the C side to it: tests/kernels/test_kernel_signatures.py checks each entry's file declares it with its
parameters and its block (__launch_bounds__), and that its dynamic shared memory is used where the registry gives it
some and only there; tests/kernels/test_nvcc_compile.py finds every name in the compiled cubins;
tests/kernels/test_cuda_emulated.py compiles a C++ wrapper from the formats, so a signature that disagrees with what
the launches pack does not compile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache
from typing import Any

from ... import cuda_build
from .device import driver
from .families import entries
from .families.conv_nhwc import NHWC_CONV, NHWC_TMA, nhwc_conv_source, tile_shared
from .families.direct_nchw import CONV, FIXUP, conv_kernel_name
from .families.spec import ConvShared, KernelSpec, Signature, registry
from .families.support import TOPK_THREADS
from .families.winograd_nchw import WINO_GEMM, WINO_INPUT, WINO_OUTPUT, wino_kernel_names

__all__ = ["ConvShared", "KernelSpec", "Signature", "TOPK_THREADS", "conv_kernel_name", "entries", "nhwc_conv_source",
           "registry", "tile_shared", "wino_kernel_names"]

# The pycuda struct formats a launch packs its arguments with (the emulator's tests build calls from them).
CONV_FORMAT, FIXUP_FORMAT = CONV.format, FIXUP.format
NHWC_CONV_FORMAT, NHWC_TMA_FORMAT = NHWC_CONV.format, NHWC_TMA.format
WINO_INPUT_FORMAT, WINO_GEMM_FORMAT, WINO_OUTPUT_FORMAT = WINO_INPUT.format, WINO_GEMM.format, WINO_OUTPUT.format
SHARED_WITHOUT_OPT_IN = 48 * 1024  # dynamic shared memory a kernel may take without opting in at load
REGISTRY = registry(entries())


def spec(kernel: str) -> KernelSpec:
    """The registry's entry for ``kernel``."""
    try:
        return REGISTRY[kernel]
    except KeyError:
        raise KeyError(f"{kernel!r} is not an entry point of cuda_src/ (kernels.REGISTRY)") from None


def signature(kernel: str) -> Signature:
    return spec(kernel).signature


def arg_format(kernel: str) -> str:
    return spec(kernel).arg_format


def source_of(kernel: str) -> str:
    return spec(kernel).source


def unit_of(kernel: str) -> str:
    return spec(kernel).unit


def all_kernel_names() -> list[str]:
    return list(REGISTRY)


def launch_async(func: Any, grid: tuple[int, int, int], block: tuple[int, int, int], stream: Any, *args: Any,
                 shared: int = 0) -> None:
    """A prepared pycuda Function launched on ``stream``: pycuda's ``prepared_async_call`` without the deprecated
    cuFuncSetBlockShape it calls before each launch (cuLaunchKernel takes the block itself). That call waits on the
    driver while another thread is inside it, such as nvImageCodec's decode on the decode thread, and holds the GIL
    meanwhile, so whichever thread launched stalled the other one too."""
    func._launch_kernel(grid, block, _packer()(func.arg_format, *args), shared, stream)


@cache
def _packer() -> Callable[..., bytes]:
    """pycuda's struct packer for kernel arguments, looked up once (an import statement in launch_async would run
    at every launch); imported on first use, as pycuda is only where a backend is built."""
    from pycuda._pvt_struct import pack

    return pack


class Kernels:
    """The cubins of cuda_src loaded into the current context: the compile units given (default: all) at once, any
    other on first use; entry points prepared on first use."""

    def __init__(self, arch: str, units: Iterable[str] | None = None):
        self.arch = arch
        self._modules: dict[str, Any] = {}
        self._funcs: dict[str, Any] = {}
        self._load(cuda_build.UNITS if units is None else units)

    def _load(self, units: Iterable[str]) -> None:
        todo = [u for u in units if u not in self._modules]
        if todo:
            drv = driver()
            self._modules.update({u: drv.module_from_file(str(p))
                                  for u, p in cuda_build.build(self.arch, todo).items()})

    def __getitem__(self, kernel: str) -> Any:
        if kernel not in self._funcs:
            s = spec(kernel)
            self._load([s.unit])
            fn = self._modules[s.unit].get_function(kernel)
            fn.prepare(s.arg_format)
            if s.max_shared > SHARED_WITHOUT_OPT_IN:
                fn.set_attribute(driver().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, s.max_shared)
            self._funcs[kernel] = fn
        return self._funcs[kernel]
