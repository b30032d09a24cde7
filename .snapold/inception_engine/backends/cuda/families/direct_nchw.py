"""The NCHW direct convolutions: conv.cu's FFMA implicit GEMM (fp32), conv_tf32.cu's and conv_f16.cu's tensor-core
ones, all three launched alike, and conv.cu's split-K reduction. The default for fp32 before sm_90a (and wherever
CudaBackend(nhwc=False)); the batched FC is one of its 1x1 convs (fc.py).

Its tiles are tiles.py's ``TILES``, ``TF32_TILES`` and ``F16_TILES`` (the cost model ranks them there); its kernels
are <prefix>_<KH>x<KW>_<BM>x<BN>[_fixup] for every kernel shape of ``KERNEL_SIZES``.
"""

from __future__ import annotations

from collections.abc import Iterator

from ....plan import View
from ..cost_model import ConvConfig
from ..tiles import F16_TILES, KERNEL_SIZES, TF32_TILES, THREADS, TILES, Tile, blocks
from .spec import KernelSpec, LaunchSpec, Signature, registry

SOURCES = ("conv.cu", "conv_tf32.cu", "conv_f16.cu")
CONV_SHAPE = "i: batch cin h w x_bstride cout ho wo y_bstride stride pad_h pad_w k_split relu"
CONV = Signature.of("P: x wt bias y", CONV_SHAPE)
CONV_F16 = Signature.of("P: x w16 bias y", CONV_SHAPE)  # conv_f16.cu's read fp16 weights
FIXUP = CONV + Signature.of("P: ws counters")  # ... and the split-K workspace and tile counters
REDUCE = Signature.of("P: ws bias y", "i: splits cout n_total howo y_bstride relu")


def conv_kernel_name(kernel: tuple[int, int], tile: Tile, fixup: bool = False) -> str:
    assert tile.fixup or not fixup, f"{tile.prefix} {tile.name} has no _fixup variant"
    return f"{tile.prefix}_{kernel[0]}x{kernel[1]}_{tile.name}" + ("_fixup" if fixup else "")


def entries() -> Iterator[KernelSpec]:
    for t in TILES + TF32_TILES + F16_TILES:  # <prefix>.cu
        for k in KERNEL_SIZES:
            for fixup in (False, True) if t.fixup else (False,):
                sig = FIXUP if fixup else CONV_F16 if t.prefix == "conv_f16" else CONV
                yield KernelSpec(conv_kernel_name(k, t, fixup), f"{t.prefix}.cu", sig, t.threads)
    yield KernelSpec("conv_splitk_reduce", "conv.cu", REDUCE, THREADS)


KERNELS = registry(entries())


def view_ptr(base: int, v: View) -> int:
    """Device address of element (0, 0, 0, 0) of the view."""
    return base + 4 * (v.offset + v.c_offset * v.h * v.w)


def batch_stride(v: View) -> int:
    return v.c_total * v.h * v.w


def conv_specs(name: str, src: View, dst: View, kernel: tuple[int, int], stride: int, pad: tuple[int, int],
               relu: bool, cfg: ConvConfig, arena: int, w: int, b: int, ws: int,
               counters: int | None = None) -> list[LaunchSpec]:
    """The implicit-GEMM launch when cfg.splits == 1. Split-K: one _fixup launch given tile counters (zeroed, see
    conv.cu) and a tile that has the variant, else the plain kernel into the workspace plus conv_splitk_reduce.
    w, b: weight/bias addresses."""
    n, cin, h, wd = src.dims
    _, cout, ho, wo = dst.dims
    n_total, t = n * ho * wo, cfg.tile
    split = cfg.splits > 1
    fixup = split and counters is not None and t.fixup
    y = view_ptr(arena, dst)
    k = KERNELS[conv_kernel_name(kernel, t, fixup)]
    args = dict(x=view_ptr(arena, src), bias=b, y=ws if split and not fixup else y, batch=n, cin=cin, h=h, w=wd,
                x_bstride=batch_stride(src), cout=cout, ho=ho, wo=wo, y_bstride=batch_stride(dst), stride=stride,
                pad_h=pad[0], pad_w=pad[1], k_split=cfg.k_split, relu=int(relu))
    args[k.signature.names[1]] = w  # wt, or conv_f16.cu's w16
    if fixup:
        args.update(ws=ws, counters=counters)
    gemm = LaunchSpec.of(name, k, (blocks(n_total, t.bn), blocks(cout, t.bm), cfg.splits), args)
    if not split or fixup:
        return [gemm]
    r = KERNELS["conv_splitk_reduce"]
    reduce = LaunchSpec.of(name, r, (r.blocks(cout * n_total), 1, 1),
                           dict(ws=ws, bias=b, y=y, splits=cfg.splits, cout=cout, n_total=n_total, howo=ho * wo,
                                y_bstride=batch_stride(dst), relu=int(relu)))
    return [gemm, reduce]
