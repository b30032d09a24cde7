"""pool_nhwc.cu: the NHWC path's pools, per element type: pool2d (a moved average pool adds its conv's bias) and the
global average pool, which writes float32 features (the FC's input) to the side buffer."""

from __future__ import annotations

from collections.abc import Iterator

from ....plan import GlobalAvgPoolOp, PoolOp
from ..tiles import NHWC_ELEMS, THREADS
from .conv_nhwc import nhwc_ptr
from .spec import KernelSpec, LaunchSpec, Signature, registry

SOURCES = ("pool_nhwc.cu",)
POOL_NHWC = Signature.of("P: x y", "i: batch channels h w x_cstride ho wo y_cstride kernel stride pad is_max "
                         "count_include_pad", "P: bias")
GAP_NHWC = Signature.of("P: x y", "i: batch channels hw x_cstride y_bstride")


def entries() -> Iterator[KernelSpec]:
    for e in NHWC_ELEMS.values():
        yield KernelSpec(f"pool2d_nhwc{e.suffix}", "pool_nhwc.cu", POOL_NHWC, THREADS)
        yield KernelSpec(f"global_avg_pool_nhwc{e.suffix}", "pool_nhwc.cu", GAP_NHWC, THREADS)


KERNELS = registry(entries())


def nhwc_pool_spec(op: PoolOp, arena: int, precision: str = "fp16", bias: int = 0) -> LaunchSpec:
    """pool_nhwc.cu's pool2d; bias: the device address of op.bias's bias (a moved pool), else 0."""
    assert bool(bias) == bool(op.bias), f"{op.name}: a moved pool needs its conv's bias, and only it"
    n, c, h, w = op.src.dims
    _, _, ho, wo = op.dst.dims
    elem = NHWC_ELEMS[precision]
    k = KERNELS[f"pool2d_nhwc{elem.suffix}"]  # a thread a 16-byte piece
    return LaunchSpec.of(op.name, k, (k.blocks(n * ho * wo * c * elem.bytes // 16), 1, 1),
                         dict(x=nhwc_ptr(arena, op.src, precision), y=nhwc_ptr(arena, op.dst, precision), batch=n,
                              channels=c, h=h, w=w, x_cstride=op.src.c_total, ho=ho, wo=wo, y_cstride=op.dst.c_total,
                              kernel=op.kernel, stride=op.stride, pad=op.pad, is_max=int(op.kind == "max"),
                              count_include_pad=int(op.count_include_pad), bias=bias))


def nhwc_gap_spec(op: GlobalAvgPoolOp, arena: int, features: int, precision: str = "fp16") -> LaunchSpec:
    """pool_nhwc.cu's global average pool of the NHWC view into float32 (N, C) features at ``features``."""
    nb, ch, hh, ww = op.src.dims
    k = KERNELS[f"global_avg_pool_nhwc{NHWC_ELEMS[precision].suffix}"]  # a thread a 16-byte piece of channels
    return LaunchSpec.of(op.name, k, (k.blocks(nb * ch * NHWC_ELEMS[precision].bytes // 16), 1, 1),
                         dict(x=nhwc_ptr(arena, op.src, precision), y=features, batch=nb, channels=ch, hw=hh * ww,
                              x_cstride=op.src.c_total, y_bstride=ch))
