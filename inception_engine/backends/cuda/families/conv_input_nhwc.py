"""conv_input_nhwc.cu: the NHWC path's first convolution, from the float32 NCHW input as uploaded, no split-K: on
the FMA units (``INPUT_TILE``, every precision) or the tensor cores (``INPUT_MMA_TILE``, fp16 and tf32, where
tiles.input_tile says it fits)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from ....plan import ConvOp, FusedConvOp
from ..cost_model import ConvConfig
from ..tiles import (INPUT_MMA_MAX_SHARED, INPUT_MMA_PRECISIONS, INPUT_MMA_TILE, INPUT_TILE, NHWC_ELEMS, blocks,
                     input_mma_blocks, input_mma_smem_bytes, input_tile)
from .spec import ConvShared, KernelSpec, LaunchSpec, Signature, registry

SOURCES = ("conv_input_nhwc.cu",)
CONV_INPUT_NHWC = Signature.of("P: x wt bias y", "i: batch cin h w cout ho wo y_cstride kh kw stride pad_h pad_w relu")


def entries() -> Iterator[KernelSpec]:
    for e in NHWC_ELEMS.values():
        yield KernelSpec(f"conv_input_nhwc{e.suffix}", "conv_input_nhwc.cu", CONV_INPUT_NHWC, INPUT_TILE.threads)
    for p in INPUT_MMA_PRECISIONS:
        elem = NHWC_ELEMS[p]
        yield KernelSpec(f"conv_input_mma_nhwc{elem.suffix}", "conv_input_nhwc.cu", CONV_INPUT_NHWC,
                         INPUT_MMA_TILE.threads,
                         ConvShared(partial(input_mma_smem_bytes, elem_bytes=elem.bytes), INPUT_MMA_MAX_SHARED))


KERNELS = registry(entries())


def input_conv_specs(op: ConvOp, cfg: ConvConfig, x: int, cin: int, y: int, w: int, b: int, precision: str,
                     num_sms: int | None) -> list[LaunchSpec]:
    """The launch of a conv that reads the float32 NCHW input x (one slice, one part) into the NHWC view at y."""
    assert cfg.splits == 1 and not isinstance(op, FusedConvOp), f"{op.name}: conv_input_nhwc: 1 slice, 1 part"
    n, _, h, wd = op.src.dims
    _, cout, ho, wo = op.dst.dims
    t, suffix = cfg.tile, NHWC_ELEMS[precision].suffix
    args = dict(x=x, wt=w, bias=b, y=y, batch=n, cin=cin, h=h, w=wd, cout=cout, ho=ho, wo=wo,
                y_cstride=op.dst.c_total, kh=op.kernel[0], kw=op.kernel[1], stride=op.stride, pad_h=op.pad[0],
                pad_w=op.pad[1], relu=1)
    if t == INPUT_TILE:
        return [LaunchSpec.of(op.name, KERNELS[f"conv_input_nhwc{suffix}"],
                              (blocks(n * ho * wo, t.bm), blocks(cout, t.bn), 1), args)]
    assert t == INPUT_MMA_TILE == input_tile(op, precision), f"{op.name}: not a conv for conv_input_mma_nhwc{suffix}"
    grid = (input_mma_blocks(op, num_sms), blocks(cout, t.bn), 1)
    return [LaunchSpec.of(op.name, KERNELS[f"conv_input_mma_nhwc{suffix}"], grid, args, op)]
