"""The kernels of cuda_src/ as the host sees them: every entry point's name (``all_kernel_names``), the source that
defines it (``source_of``), its parameter list as a pycuda struct format (``arg_format``), and ``Kernels``, which
builds the cubins (cuda_build: nvcc at first use, cached) and loads them into the current context.

A new kernel needs its name here (a prefix rule in ``source_of`` and ``arg_format``, or an entry in ``SOURCE_OF`` and
``ARG_FORMATS``): tests/test_nvcc_compile.py checks every name against the compiled cubins, and
tests/test_cuda_emulated.py compiles a C++ wrapper from these formats, so a signature that disagrees with what the
launch specs pack does not compile.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ... import cuda_build
from .device import driver
from .tiles import (F16_TILES, INPUT_MMA_PRECISIONS, KERNEL_SIZES, MAX_SHARED_BYTES, MAXPOOL_KERNEL, MAXPOOL_PREFIXES,
                    NHWC_ELEMS, TF32_TILES, TILES, WINO_TILES, Tile, is_halo, is_tma, is_ws,
                    wgmma_ring_bytes)
from .winograd import WINO_VARIANTS


# Parameter lists of the kernels as pycuda struct formats: P = pointer, i = int32, q = int64.
CONV_FORMAT = "PPPP" + "i" * 14
FIXUP_FORMAT = CONV_FORMAT + "PP"  # ... and the split-K workspace and tile counters
ARG_FORMATS = {
    "conv_splitk_reduce": "PPP" + "i" * 6,
    "pool2d": "PP" + "i" * 13,
    "global_avg_pool": "PP" + "i" * 5,
    "fc_gemv": "PPPP" + "i" * 4,
    "softmax_rows": "PP" + "i" * 3,
    "gpu_sleep": "q",
    "normalize_u8_nchw": "PPPii",  # pipeline_io.cu: the streaming pipeline's ends
    "softmax_topk_rows": "PPPiii",
    **{name: "P" for name in ("resize_pil_h", "resize_pil_v")},  # jpeg_decode.py's resize: a table of jobs
    **{name + e.suffix: fmt for e in NHWC_ELEMS.values()
       for name, fmt in (("pool2d_nhwc", "PP" + "i" * 13 + "P"), ("global_avg_pool_nhwc", "PP" + "i" * 5),
                         ("conv_input_nhwc", "PPPP" + "i" * 14))},
    **{f"conv_input_mma_nhwc{NHWC_ELEMS[p].suffix}": "PPPP" + "i" * 14 for p in INPUT_MMA_PRECISIONS},
    **{f"conv_nhwc{e.suffix}_splitk_reduce": "PPP" + "i" * 14 for e in NHWC_ELEMS.values()},
}
NHWC_CONV_FORMAT = "PPPP" + "i" * 25  # ... k_split, then the parts (nhwc_parts)
NHWC_TMA_FORMAT = NHWC_CONV_FORMAT + "P"  # ... and the tensor maps' address (the TMA tiles)
WINO_INPUT_FORMAT = "PPP" + "i" * 10
WINO_GEMM_FORMAT = "PPP" + "i" * 6
WINO_OUTPUT_FORMAT = "PPPP" + "i" * 10
SOURCE_OF = {"conv_splitk_reduce": "conv.cu", "pool2d": "pool.cu", "global_avg_pool": "pool.cu",
             **{f"{name}{e.suffix}": source for e in NHWC_ELEMS.values()
                for name, source in (("pool2d_nhwc", "pool_nhwc.cu"), ("global_avg_pool_nhwc", "pool_nhwc.cu"),
                                     ("conv_input_nhwc", "conv_input_nhwc.cu"))},
             **{f"conv_input_mma_nhwc{NHWC_ELEMS[p].suffix}": "conv_input_nhwc.cu" for p in INPUT_MMA_PRECISIONS},
             "fc_gemv": "fc.cu", "softmax_rows": "softmax.cu", "gpu_sleep": "timing.cu",
             "normalize_u8_nchw": "pipeline_io.cu", "softmax_topk_rows": "pipeline_io.cu",
             "resize_pil_h": "resize_pil.cu", "resize_pil_v": "resize_pil.cu"}


def conv_kernel_name(kernel: tuple[int, int], tile: Tile, fixup: bool = False) -> str:
    assert tile.fixup or not fixup, f"{tile.prefix} {tile.name} has no _fixup variant"
    return f"{tile.prefix}_{kernel[0]}x{kernel[1]}_{tile.name}" + ("_fixup" if fixup else "")


def wino_kernel_names(kernel: tuple[int, int], m: int, tile: Tile, splits: int = 1) -> tuple[str, str, str]:
    """winograd.cu's input transform, batched GEMM and output transform for this kernel shape, output tile m and
    GEMM tile (the output transform that sums split-K slices when splits > 1)."""
    variant, slices = f"{kernel[0]}x{kernel[1]}_F{m}", "_slices" if splits > 1 else ""
    return f"wino_input_{variant}", f"wino_gemm_{tile.name}{slices}", f"wino_output_{variant}{slices}"


def arg_format(kernel: str) -> str:
    if kernel in ARG_FORMATS:
        return ARG_FORMATS[kernel]
    if is_tma(kernel):
        return NHWC_TMA_FORMAT
    for prefix, fmt in (("wino_input_", WINO_INPUT_FORMAT), ("wino_gemm_", WINO_GEMM_FORMAT),
                        ("wino_output_", WINO_OUTPUT_FORMAT), ("conv_nhwc_", NHWC_CONV_FORMAT)):
        if kernel.startswith(prefix):
            return fmt
    return FIXUP_FORMAT if kernel.endswith("_fixup") else CONV_FORMAT


def nhwc_conv_source(kernel: str) -> str:
    """The file of an NHWC conv kernel (conv_nhwc_...): its tile family's. The mma.sync family holds the split-K
    reduction too."""
    if is_halo(kernel):
        return "conv_nhwc_halo.cu"
    if is_ws(kernel):
        return "conv_nhwc_ws.cu"
    return "conv_nhwc_wgmma.cu" if "_wgmma_" in kernel else "conv_nhwc_mma.cu"


def source_of(kernel: str) -> str:
    if kernel.startswith("wino_"):
        return "winograd.cu"
    if kernel in SOURCE_OF:
        return SOURCE_OF[kernel]
    if kernel.startswith("conv_nhwc_"):
        return nhwc_conv_source(kernel)
    for prefix in ("conv_tf32_", "conv_f16_"):
        if kernel.startswith(prefix):
            return prefix[:-1] + ".cu"
    return "conv.cu"


def unit_of(kernel: str) -> str:
    """The compile unit (cuda_build.UNITS) whose cubin holds ``kernel``."""
    return cuda_build.unit_of(source_of(kernel), kernel)


def all_kernel_names() -> list[str]:
    return ([conv_kernel_name(k, t, f) for k in KERNEL_SIZES for t in TILES + TF32_TILES + F16_TILES
             for f in ((False, True) if t.fixup else (False,))] + list(ARG_FORMATS)
            + sorted({name for k, ms in WINO_VARIANTS.items() for m in ms for t in WINO_TILES
                      for splits in (1, 2) for name in wino_kernel_names(k, m, t, splits)})
            + [f"{t.prefix}_{t.name}" for e in NHWC_ELEMS.values() for t in e.tiles(wgmma=True)]
            + [f"{t.prefix}_maxpool{MAXPOOL_KERNEL}_{t.name}" for e in NHWC_ELEMS.values() for t in e.mma_tiles
               if t.prefix in MAXPOOL_PREFIXES])


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
            unit = unit_of(kernel)
            self._load([unit])
            fn = self._modules[unit].get_function(kernel)
            fn.prepare(arg_format(kernel))
            # past the default limit of 48 KB the kernel must opt in; a halo tile's need depends on the conv
            ring = MAX_SHARED_BYTES if is_halo(kernel) else wgmma_ring_bytes(kernel)
            if ring > 48 * 1024:
                fn.set_attribute(driver().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, ring)
            self._funcs[kernel] = fn
        return self._funcs[kernel]
