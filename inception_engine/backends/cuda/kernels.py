"""The kernels of cuda_src/ as the host sees them: every entry point's name (``all_kernel_names``), the source that
defines it (``source_of``), its parameters as the C source names them (``signature``) and as a pycuda struct format
(``arg_format``), and ``Kernels``, which builds the cubins (cuda_build: nvcc at first use, cached) and loads them into
the current context.

A new kernel needs its name here (a prefix rule in ``source_of`` and ``signature``, or an entry in ``SOURCE_OF`` and
``SIGNATURES``): tests/kernels/test_nvcc_compile.py checks every name against the compiled cubins,
tests/kernels/test_kernel_signatures.py every signature against the C declaration, and
tests/kernels/test_cuda_emulated.py compiles a C++ wrapper from these formats, so a signature that disagrees with
what the launch specs pack does not compile.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ... import cuda_build
from .device import driver
from .tiles import (F16_TILES, INPUT_MMA_PRECISIONS, KERNEL_SIZES, MAX_SHARED_BYTES, MAXPOOL_KERNEL, MAXPOOL_PREFIXES,
                    NHWC_ELEMS, TF32_TILES, TILES, WINO_TILES, Tile, is_halo, is_tma, is_ws,
                    wgmma_ring_bytes)
from .winograd import WINO_VARIANTS


@dataclass(frozen=True)
class Signature:
    """A kernel's parameters as its C source declares them: names and pycuda struct codes (P pointer, i int32,
    q int64). tests/kernels/test_kernel_signatures.py checks every kernel's C declaration against its Signature."""

    params: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, *groups: str) -> Signature:
        """Signature.of("P: x wt", "i: batch cin"): groups of parameters of one code each, in order."""
        return cls(tuple((name, code) for group in groups for code, names in [group.split(":")]
                         for name in names.split()))

    def __add__(self, other: Signature) -> Signature:
        return Signature(self.params + other.params)

    @property
    def format(self) -> str:
        """The pycuda struct format a launch packs its arguments with."""
        return "".join(code for _, code in self.params)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.params)


# conv.cu's and conv_tf32.cu's tiles; conv_f16.cu's read fp16 weights (w16).
CONV_SHAPE = "i: batch cin h w x_bstride cout ho wo y_bstride stride pad_h pad_w k_split relu"
CONV = Signature.of("P: x wt bias y", CONV_SHAPE)
CONV_F16 = Signature.of("P: x w16 bias y", CONV_SHAPE)
FIXUP = CONV + Signature.of("P: ws counters")  # ... and the split-K workspace and tile counters
NHWC_PARTS = Signature.of("i: start1 offset1 cstride1 start2 offset2 cstride2 start3 offset3 cstride3 relu_end")
NHWC_CONV = Signature.of("P: x wr bias out", "i: batch cin h w x_cstride cout ho wo y_cstride kh kw stride pad_h pad_w "
                         "k_split") + NHWC_PARTS  # the parts: launch_nhwc.nhwc_parts
NHWC_TMA = NHWC_CONV + Signature.of("P: maps")  # ... and the tensor maps' address (the TMA tiles)
WINO_INPUT = Signature.of("P: x bt v", "i: batch cin h w x_bstride tiles_h tiles_w t_pad pad_h pad_w")
WINO_GEMM = Signature.of("P: u v mo", "i: cin cout o_pad t_pad nn k_split")
WINO_OUTPUT = Signature.of("P: mi at bias y", "i: batch cout ho wo y_bstride tiles_h tiles_w t_pad splits relu")
CONV_INPUT_NHWC = Signature.of("P: x wt bias y", "i: batch cin h w cout ho wo y_cstride kh kw stride pad_h pad_w relu")
SIGNATURES = {
    "conv_splitk_reduce": Signature.of("P: ws bias y", "i: splits cout n_total howo y_bstride relu"),
    "pool2d": Signature.of("P: x y", "i: batch channels h w x_bstride ho wo y_bstride kernel stride pad is_max "
                           "count_include_pad"),
    "global_avg_pool": Signature.of("P: x y", "i: batch channels hw x_bstride y_bstride"),
    "fc_gemv": Signature.of("P: x w bias y", "i: in_features out_features x_bstride y_bstride"),
    "softmax_rows": Signature.of("P: z p", "i: cols z_bstride p_bstride"),
    "gpu_sleep": Signature.of("q: ns"),
    # pipeline_io.cu: the streaming pipeline's ends
    "normalize_u8_nchw": Signature.of("P: x y mean_std", "i: hw y_bstride"),
    "softmax_topk_rows": Signature.of("P: z prob index", "i: cols z_bstride k"),
    **{name: Signature.of("P: jobs") for name in ("resize_pil_h", "resize_pil_v")},  # jpeg_decode.py: a job table
    **{name + e.suffix: sig for e in NHWC_ELEMS.values() for name, sig in (
        ("pool2d_nhwc", Signature.of("P: x y", "i: batch channels h w x_cstride ho wo y_cstride kernel stride pad "
                                     "is_max count_include_pad", "P: bias")),
        ("global_avg_pool_nhwc", Signature.of("P: x y", "i: batch channels hw x_cstride y_bstride")),
        ("conv_input_nhwc", CONV_INPUT_NHWC))},
    **{f"conv_input_mma_nhwc{NHWC_ELEMS[p].suffix}": CONV_INPUT_NHWC for p in INPUT_MMA_PRECISIONS},
    **{f"conv_nhwc{e.suffix}_splitk_reduce": Signature.of("P: ws bias y", "i: splits p_total cout y_cstride")
       + NHWC_PARTS for e in NHWC_ELEMS.values()},
}
# The same as pycuda struct formats (what Launch prepares a kernel with).
ARG_FORMATS = {name: sig.format for name, sig in SIGNATURES.items()}
CONV_FORMAT, FIXUP_FORMAT = CONV.format, FIXUP.format
NHWC_CONV_FORMAT, NHWC_TMA_FORMAT = NHWC_CONV.format, NHWC_TMA.format
WINO_INPUT_FORMAT, WINO_GEMM_FORMAT, WINO_OUTPUT_FORMAT = WINO_INPUT.format, WINO_GEMM.format, WINO_OUTPUT.format
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


def signature(kernel: str) -> Signature:
    """The parameters of ``kernel``: SIGNATURES' entry, else its family's by name."""
    if kernel in SIGNATURES:
        return SIGNATURES[kernel]
    if is_tma(kernel):
        return NHWC_TMA
    for prefix, sig in (("wino_input_", WINO_INPUT), ("wino_gemm_", WINO_GEMM), ("wino_output_", WINO_OUTPUT),
                        ("conv_nhwc_", NHWC_CONV), ("conv_f16_", CONV_F16)):
        if kernel.startswith(prefix):
            return sig
    return FIXUP if kernel.endswith("_fixup") else CONV


def arg_format(kernel: str) -> str:
    return signature(kernel).format


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
