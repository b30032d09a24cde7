"""conv_input_nhwc.cu: the NHWC path's first convolution, from the float32 NCHW input as uploaded, no split-K: on
the FMA units (``INPUT_TILE``, every precision) or the tensor cores (``INPUT_MMA_TILE``, fp16 and tf32, where
tiles.input_tile says it fits). int8 (``--precision int8``): the sums, bias and ReLU quantized to int8 at ``inv_out``,
on fp16's tensor-core kernel where it fits (conv_input_mma_nhwc_i8) or the FMA kernel's fp32 sums (conv_input_nhwc_i8,
INPUT_TILE: the other shapes, and for checks against a float32 reference)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import numpy as np

from ....plan import ConvOp, FusedConvOp
from ..cost_model import ConvConfig
from ..tiles import (INPUT_MMA_MAX_SHARED, INPUT_MMA_PRECISIONS, INPUT_MMA_TILE, INPUT_TILE, NHWC_ELEMS, blocks,
                     input_mma_blocks, input_mma_smem_bytes, input_tile)
from .spec import ConvShared, KernelSpec, LaunchSpec, Signature, registry

SOURCES = ("conv_input_nhwc.cu",)
CONV_INPUT_NHWC = Signature.of("P: x wt bias y", "i: batch cin h w cout ho wo y_cstride kh kw stride pad_h pad_w relu")
CONV_INPUT_NHWC_I8 = CONV_INPUT_NHWC + Signature.of("f: inv_out")
FLOAT_PRECISIONS = ("fp16", "tf32", "fp32")  # the element types of the fp kernels (int8's is named below)
INT8_KERNEL = "conv_input_nhwc_i8"
INT8_MMA_KERNEL = "conv_input_mma_nhwc_i8"


def entries() -> Iterator[KernelSpec]:
    for e in (NHWC_ELEMS[p] for p in FLOAT_PRECISIONS):
        yield KernelSpec(f"conv_input_nhwc{e.suffix}", "conv_input_nhwc.cu", CONV_INPUT_NHWC, INPUT_TILE.threads)
    yield KernelSpec(INT8_KERNEL, "conv_input_nhwc.cu", CONV_INPUT_NHWC_I8, INPUT_TILE.threads)
    for p in INPUT_MMA_PRECISIONS:
        elem = NHWC_ELEMS[p]
        yield KernelSpec(f"conv_input_mma_nhwc{elem.suffix}", "conv_input_nhwc.cu", CONV_INPUT_NHWC,
                         INPUT_MMA_TILE.threads,
                         ConvShared(partial(input_mma_smem_bytes, elem_bytes=elem.bytes), INPUT_MMA_MAX_SHARED))
    yield KernelSpec(INT8_MMA_KERNEL, "conv_input_nhwc.cu", CONV_INPUT_NHWC_I8, INPUT_MMA_TILE.threads,
                     ConvShared(partial(input_mma_smem_bytes, elem_bytes=1), INPUT_MMA_MAX_SHARED))


KERNELS = registry(entries())


def inv_scale(scale: float) -> float:
    """conv_input_nhwc_i8's inv_out for an output stored at ``scale``: float32(1) / float32(scale), the reciprocal
    int8_reference.quantize multiplies by."""
    return float(np.float32(1.0) / np.float32(scale))


def input_conv_specs(op: ConvOp, cfg: ConvConfig, x: int, cin: int, y: int, w: int, b: int, precision: str,
                     num_sms: int | None, inv_out: float | None = None) -> list[LaunchSpec]:
    """The launch of a conv that reads the float32 NCHW input x (one slice, one part) into the NHWC view at y. int8:
    quantized at ``inv_out`` (inv_scale of the output's storage scale), on the tile cfg names (INPUT_MMA_TILE where
    tiles.input_tile picks it, or INPUT_TILE)."""
    assert cfg.splits == 1 and not isinstance(op, FusedConvOp), f"{op.name}: conv_input_nhwc: 1 slice, 1 part"
    assert (inv_out is not None) == (precision == "int8"), f"{op.name}: an int8 output's inv_out, and only its"
    n, _, h, wd = op.src.dims
    _, cout, ho, wo = op.dst.dims
    t = cfg.tile
    args = dict(x=x, wt=w, bias=b, y=y, batch=n, cin=cin, h=h, w=wd, cout=cout, ho=ho, wo=wo,
                y_cstride=op.dst.c_total, kh=op.kernel[0], kw=op.kernel[1], stride=op.stride, pad_h=op.pad[0],
                pad_w=op.pad[1], relu=1)
    suffix = NHWC_ELEMS[precision].suffix
    if inv_out is not None:
        args = dict(args, inv_out=float(inv_out))
    if t == INPUT_TILE:
        return [LaunchSpec.of(op.name, KERNELS[INT8_KERNEL if inv_out is not None else f"conv_input_nhwc{suffix}"],
                              (blocks(n * ho * wo, t.bm), blocks(cout, t.bn), 1), args)]
    assert t == INPUT_MMA_TILE == input_tile(op, precision), f"{op.name}: not a conv for conv_input_mma_nhwc{suffix}"
    grid = (input_mma_blocks(op, num_sms), blocks(cout, t.bn), 1)
    return [LaunchSpec.of(op.name, KERNELS[f"conv_input_mma_nhwc{suffix}"], grid, args, op)]
