"""winograd.cu: the stride-1 3x3, 5x5, 1x7 and 7x1 convs on NCHW by Winograd's F(m, k), three launches each (input
transform, batched GEMM on ``WINO_TILES``, output transform). Its set-up (eligible convs, U, the transforms) is
winograd.py's."""

from __future__ import annotations

from collections.abc import Iterator

from ....plan import ConvOp
from ..cost_model import ConvConfig, config_shape
from ..tiles import THREADS, WINO_TILES, Tile
from ..winograd import WINO_VARIANTS, o_pad
from .direct_nchw import batch_stride, view_ptr
from .spec import KernelSpec, LaunchSpec, Signature, registry

SOURCES = ("winograd.cu",)
WINO_INPUT = Signature.of("P: x bt v", "i: batch cin h w x_bstride tiles_h tiles_w t_pad pad_h pad_w")
WINO_GEMM = Signature.of("P: u v mo", "i: cin cout o_pad t_pad nn k_split")
WINO_OUTPUT = Signature.of("P: mi at bias y", "i: batch cout ho wo y_bstride tiles_h tiles_w t_pad splits relu")
WINO_SIGNATURES = (WINO_INPUT, WINO_GEMM, WINO_OUTPUT)  # wino_kernel_names' order


def wino_kernel_names(kernel: tuple[int, int], m: int, tile: Tile, splits: int = 1) -> tuple[str, str, str]:
    """winograd.cu's input transform, batched GEMM and output transform for this kernel shape, output tile m and
    GEMM tile (the output transform that sums split-K slices when splits > 1)."""
    variant, slices = f"{kernel[0]}x{kernel[1]}_F{m}", "_slices" if splits > 1 else ""
    return f"wino_input_{variant}", f"wino_gemm_{tile.name}{slices}", f"wino_output_{variant}{slices}"


def entries() -> Iterator[KernelSpec]:
    for k, ms in WINO_VARIANTS.items():
        for m in ms:
            for t in WINO_TILES:
                for splits in (1, 2):
                    for name, sig, threads in zip(wino_kernel_names(k, m, t, splits), WINO_SIGNATURES,
                                                  (THREADS, t.threads, THREADS)):
                        yield KernelSpec(name, "winograd.cu", sig, threads)


KERNELS = registry(entries())


def winograd_specs(op: ConvOp, relu: bool, cfg: ConvConfig, arena: int, u: int, b: int, bt: int, at: int,
                   ws: int) -> list[LaunchSpec]:
    """The three launches of a Winograd conv (winograd.cu): V at ws, M (cfg.splits copies) right after it
    (``workspace_elems``). u, b: U (``winograd_weights``) and bias addresses; bt, at: the F(m, k) transforms
    (``winograd_transforms``)."""
    n, cin, h, w = op.src.dims
    _, cout, ho, wo = op.dst.dims
    shape = config_shape(op, cfg)
    v, m = ws, ws + 4 * shape.nn * cin * shape.t_pad
    opad = o_pad(cout, cfg.tile)
    k_in, k_gemm, k_out = (KERNELS[k] for k in wino_kernel_names(op.kernel, cfg.wino, cfg.tile, cfg.splits))
    tiles = dict(tiles_h=shape.tiles_h, tiles_w=shape.tiles_w, t_pad=shape.t_pad)
    return [
        LaunchSpec.of(op.name, k_in, (k_in.blocks(cin * shape.t_total), 1, 1),
                      dict(x=view_ptr(arena, op.src), bt=bt, v=v, batch=n, cin=cin, h=h, w=w,
                           x_bstride=batch_stride(op.src), pad_h=op.pad[0], pad_w=op.pad[1], **tiles)),
        LaunchSpec.of(op.name, k_gemm, (shape.t_pad // cfg.tile.bn, opad // cfg.tile.bm, shape.nn * cfg.splits),
                      dict(u=u, v=v, mo=m, cin=cin, cout=cout, o_pad=opad, t_pad=shape.t_pad, nn=shape.nn,
                           k_split=cfg.k_split)),
        LaunchSpec.of(op.name, k_out, (k_out.blocks(cout * shape.t_total), 1, 1),
                      dict(mi=m, at=at, bias=b, y=view_ptr(arena, op.dst), batch=n, cout=cout, ho=ho, wo=wo,
                           y_bstride=batch_stride(op.dst), splits=cfg.splits, relu=int(relu), **tiles)),
    ]
