"""The registry of cuda_src/'s kernels: one ``KernelSpec`` per entry point (``spec(name)``, ``REGISTRY``) with its
name, the file that defines it, its parameters as the C source names them (``Signature``), its block (threads) and
its dynamic shared memory (bytes, or a function of the conv where it depends on it, as for the halo tiles). Everything
else is read off it: ``source_of``, ``signature``, ``arg_format`` (the pycuda struct format), ``unit_of`` (the
compile unit, cuda_build.UNITS), the block and shared memory of every launch (launch.py, launch_nhwc.py, stream.py,
jpeg_decode.py) and the shared-memory opt-in at load (``Kernels``, which builds the cubins with cuda_build, nvcc at
first use, cached, and loads them into the current context). The conv tile families' block and shared memory are
their tiles' (tiles.py), read here, not restated.

A new kernel is one entry in ``entries`` (a new tile family: a loop over its tiles). Tests hold the C side to it:
tests/kernels/test_kernel_signatures.py checks each entry's file declares it with its parameters and its block
(__launch_bounds__), and that its dynamic shared memory is used where the registry gives it some and only there;
tests/kernels/test_nvcc_compile.py finds every name in the compiled cubins; tests/kernels/test_cuda_emulated.py
compiles a C++ wrapper from the formats, so a signature that disagrees with what the launches pack does not compile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

from ... import cuda_build
from ...plan import ConvOp
from .device import driver
from .tiles import (F16_TILES, INPUT_MMA_MAX_SHARED, INPUT_MMA_PRECISIONS, INPUT_MMA_TILE, INPUT_TILE, KERNEL_SIZES,
                    MAX_SHARED_BYTES, MAXPOOL_KERNEL, MAXPOOL_PREFIXES, NHWC_ELEMS, TF32_TILES, THREADS, TILES,
                    WINO_TILES, Tile, blocks, halo_conv_smem_bytes, input_mma_smem_bytes, is_halo, is_tma, is_ws,
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
WINO_SIGNATURES = (WINO_INPUT, WINO_GEMM, WINO_OUTPUT)  # wino_kernel_names' order
CONV_INPUT_NHWC = Signature.of("P: x wt bias y", "i: batch cin h w cout ho wo y_cstride kh kw stride pad_h pad_w relu")
# The same as pycuda struct formats (what a launch packs its arguments with).
CONV_FORMAT, FIXUP_FORMAT = CONV.format, FIXUP.format
NHWC_CONV_FORMAT, NHWC_TMA_FORMAT = NHWC_CONV.format, NHWC_TMA.format
WINO_INPUT_FORMAT, WINO_GEMM_FORMAT, WINO_OUTPUT_FORMAT = WINO_INPUT.format, WINO_GEMM.format, WINO_OUTPUT.format
TOPK_THREADS = 1024  # pipeline_io.cu's TOPK_N: softmax_topk_rows' block, a thread for each class it sorts
SHARED_WITHOUT_OPT_IN = 48 * 1024  # dynamic shared memory a kernel may take without opting in at load


@dataclass(frozen=True)
class ConvShared:
    """Dynamic shared memory that depends on the conv a launch computes: ``bytes_of(op)``, at most ``most`` (what
    the kernel is allowed at load)."""

    bytes_of: Callable[[ConvOp], int]
    most: int


@dataclass(frozen=True)
class KernelSpec:
    """One entry point of cuda_src/: its name, the file that defines it, its parameters, its block (threads: the
    source's __launch_bounds__) and its dynamic shared memory (bytes of every launch, or a ConvShared)."""

    name: str
    source: str
    signature: Signature
    threads: int
    shared: int | ConvShared = 0

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.threads, 1, 1)

    @property
    def arg_format(self) -> str:
        return self.signature.format

    @property
    def unit(self) -> str:
        """The compile unit (cuda_build.UNITS) whose cubin holds it."""
        return cuda_build.unit_of(self.source, self.name)

    @property
    def max_shared(self) -> int:
        """The most dynamic shared memory a launch takes: past SHARED_WITHOUT_OPT_IN the kernel opts in at load."""
        return self.shared.most if isinstance(self.shared, ConvShared) else self.shared

    def shared_bytes(self, op: ConvOp | None = None) -> int:
        """Dynamic shared memory of a launch (of the conv ``op``, where it depends on the conv)."""
        if isinstance(self.shared, ConvShared):
            assert op is not None, f"{self.name}: its shared memory depends on the conv"
            return self.shared.bytes_of(op)
        return self.shared

    def blocks(self, threads: int) -> int:
        """The blocks of this kernel that cover ``threads`` threads (a thread an element), at least one: a grid's
        extent."""
        return blocks(threads, self.threads)


def conv_kernel_name(kernel: tuple[int, int], tile: Tile, fixup: bool = False) -> str:
    assert tile.fixup or not fixup, f"{tile.prefix} {tile.name} has no _fixup variant"
    return f"{tile.prefix}_{kernel[0]}x{kernel[1]}_{tile.name}" + ("_fixup" if fixup else "")


def wino_kernel_names(kernel: tuple[int, int], m: int, tile: Tile, splits: int = 1) -> tuple[str, str, str]:
    """winograd.cu's input transform, batched GEMM and output transform for this kernel shape, output tile m and
    GEMM tile (the output transform that sums split-K slices when splits > 1)."""
    variant, slices = f"{kernel[0]}x{kernel[1]}_F{m}", "_slices" if splits > 1 else ""
    return f"wino_input_{variant}", f"wino_gemm_{tile.name}{slices}", f"wino_output_{variant}{slices}"


def nhwc_conv_source(kernel: str) -> str:
    """The file of an NHWC conv kernel (conv_nhwc_...): its tile family's."""
    if is_halo(kernel):
        return "conv_nhwc_halo.cu"
    if is_ws(kernel):
        return "conv_nhwc_ws.cu"
    return "conv_nhwc_wgmma.cu" if "_wgmma_" in kernel else "conv_nhwc_mma.cu"


def tile_shared(tile: Tile) -> int | ConvShared:
    """A conv tile's dynamic shared memory: the wgmma and warp-specialized tiles' ring, the halo tiles' by the conv,
    none for the others (static arrays)."""
    if is_halo(tile.prefix):
        return ConvShared(partial(halo_conv_smem_bytes, tile), MAX_SHARED_BYTES)
    return wgmma_ring_bytes(f"{tile.prefix}_{tile.name}")


def entries() -> Iterator[KernelSpec]:
    """Every entry point of cuda_src/, by file; a tile family's read from its tiles (tiles.py)."""
    for t in TILES + TF32_TILES + F16_TILES:  # conv.cu, conv_tf32.cu, conv_f16.cu: <prefix>.cu
        for k in KERNEL_SIZES:
            for fixup in (False, True) if t.fixup else (False,):
                sig = FIXUP if fixup else CONV_F16 if t.prefix == "conv_f16" else CONV
                yield KernelSpec(conv_kernel_name(k, t, fixup), f"{t.prefix}.cu", sig, t.threads)
    yield KernelSpec("conv_splitk_reduce", "conv.cu",
                     Signature.of("P: ws bias y", "i: splits cout n_total howo y_bstride relu"), THREADS)
    for k, ms in WINO_VARIANTS.items():
        for m in ms:
            for t in WINO_TILES:
                for splits in (1, 2):
                    for name, sig, threads in zip(wino_kernel_names(k, m, t, splits), WINO_SIGNATURES,
                                                  (THREADS, t.threads, THREADS)):
                        yield KernelSpec(name, "winograd.cu", sig, threads)
    pool = Signature.of("P: x y", "i: batch channels h w x_bstride ho wo y_bstride kernel stride pad is_max "
                        "count_include_pad")
    yield KernelSpec("pool2d", "pool.cu", pool, THREADS)
    yield KernelSpec("global_avg_pool", "pool.cu", Signature.of("P: x y", "i: batch channels hw x_bstride y_bstride"),
                     THREADS)
    yield KernelSpec("fc_gemv", "fc.cu", Signature.of("P: x w bias y", "i: in_features out_features x_bstride "
                                                      "y_bstride"), THREADS)
    yield KernelSpec("softmax_rows", "softmax.cu", Signature.of("P: z p", "i: cols z_bstride p_bstride"), THREADS)
    yield KernelSpec("gpu_sleep", "timing.cu", Signature.of("q: ns"), 1)
    # pipeline_io.cu: the streaming pipeline's ends; resize_pil.cu: jpeg_decode.py's resize, a job table a launch
    yield KernelSpec("normalize_u8_nchw", "pipeline_io.cu", Signature.of("P: x y mean_std", "i: hw y_bstride"),
                     THREADS)
    yield KernelSpec("softmax_topk_rows", "pipeline_io.cu", Signature.of("P: z prob index", "i: cols z_bstride k"),
                     TOPK_THREADS)
    for name in ("resize_pil_h", "resize_pil_v"):
        yield KernelSpec(name, "resize_pil.cu", Signature.of("P: jobs"), THREADS)
    # the NHWC path, per element type: pools, the first conv, the conv tiles (and the max-pool twins), split-K
    for e in NHWC_ELEMS.values():
        yield KernelSpec(f"pool2d_nhwc{e.suffix}", "pool_nhwc.cu", Signature.of(
            "P: x y", "i: batch channels h w x_cstride ho wo y_cstride kernel stride pad is_max count_include_pad",
            "P: bias"), THREADS)
        yield KernelSpec(f"global_avg_pool_nhwc{e.suffix}", "pool_nhwc.cu",
                         Signature.of("P: x y", "i: batch channels hw x_cstride y_bstride"), THREADS)
        yield KernelSpec(f"conv_input_nhwc{e.suffix}", "conv_input_nhwc.cu", CONV_INPUT_NHWC, INPUT_TILE.threads)
        for t in e.tiles(wgmma=True):
            name = f"{t.prefix}_{t.name}"
            yield KernelSpec(name, nhwc_conv_source(name), NHWC_TMA if is_tma(name) else NHWC_CONV, t.threads,
                             tile_shared(t))
        for t in e.mma_tiles:
            if t.prefix in MAXPOOL_PREFIXES:
                yield KernelSpec(f"{t.prefix}_maxpool{MAXPOOL_KERNEL}_{t.name}", "conv_nhwc_mma.cu", NHWC_CONV,
                                 t.threads)
        yield KernelSpec(f"conv_nhwc{e.suffix}_splitk_reduce", "conv_nhwc_mma.cu",
                         Signature.of("P: ws bias y", "i: splits p_total cout y_cstride") + NHWC_PARTS, THREADS)
    for p in INPUT_MMA_PRECISIONS:
        elem = NHWC_ELEMS[p]
        yield KernelSpec(f"conv_input_mma_nhwc{elem.suffix}", "conv_input_nhwc.cu", CONV_INPUT_NHWC,
                         INPUT_MMA_TILE.threads,
                         ConvShared(partial(input_mma_smem_bytes, elem_bytes=elem.bytes), INPUT_MMA_MAX_SHARED))


def registry(specs: Iterable[KernelSpec]) -> dict[str, KernelSpec]:
    """name -> spec; a name given twice must be the same entry (the Winograd transforms are shared by the tiles)."""
    table: dict[str, KernelSpec] = {}
    for s in specs:
        if table.setdefault(s.name, s) != s:
            raise ValueError(f"two registry entries named {s.name}: {table[s.name]} and {s}")
    return table


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
