"""pool_nhwc.cu: the NHWC path's pools, per element type: pool2d (a moved average pool adds its conv's bias) and the
global average pool, which writes float32 features (the FC's input) to the side buffer. int8 (``--precision int8``)
has its own kernels: pool2d_nhwc_i8 requantizes (``ratio``) where the fp ones add a bias (pool2d_nhwc_i8_k3s1: the
3x3 stride-1 pools, several outputs a thread), avg_pool_products_nhwc_i8 pools a moved pool's int32 products into
its conv's epilogue, and global_avg_pool_nhwc_i8 dequantizes (``scale``)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ....plan import GlobalAvgPoolOp, PoolOp
from ..tiles import NHWC_ELEMS, THREADS
from .conv_nhwc import nhwc_ptr
from .spec import KernelSpec, LaunchSpec, Signature, registry

SOURCES = ("pool_nhwc.cu",)
POOL_ARGS = Signature.of("P: x y", "i: batch channels h w x_cstride ho wo y_cstride kernel stride pad is_max "
                         "count_include_pad")
POOL_NHWC = POOL_ARGS + Signature.of("P: bias")
GAP_NHWC = Signature.of("P: x y", "i: batch channels hw x_cstride y_bstride")
POOL_NHWC_I8 = POOL_ARGS + Signature.of("f: ratio")
GAP_NHWC_I8 = GAP_NHWC + Signature.of("f: scale")
PRODUCTS_I8 = Signature.of("P: x y", "i: batch channels h w x_cstride ho wo y_cstride kernel stride pad "
                           "count_include_pad", "P: epi")
PRODUCTS_I8_KERNEL = "avg_pool_products_nhwc_i8"
PRODUCT_BYTES = 4  # a raw product of the int8 convs: an int32 (conv_nhwc.cuh's NhwcStore::column4)
FLOAT_PRECISIONS = ("fp16", "tf32", "fp32")  # the element types of the fp kernels (int8's are named below)
INT8 = "int8"
I8_SUFFIX = "_i8"
I8_RUN = 4  # pool_nhwc.cu's I8_RUN: the outputs in a row one thread of pool2d_nhwc_i8_k3s<S> pools
I8_K3_STRIDES = (1,)  # the 3x3 pools with a kernel of their own (pool2d_nhwc_i8_k3s<S>); pool_nhwc.cu says why not 2


def entries() -> Iterator[KernelSpec]:
    for e in (NHWC_ELEMS[p] for p in FLOAT_PRECISIONS):
        yield KernelSpec(f"pool2d_nhwc{e.suffix}", "pool_nhwc.cu", POOL_NHWC, THREADS)
        yield KernelSpec(f"global_avg_pool_nhwc{e.suffix}", "pool_nhwc.cu", GAP_NHWC, THREADS)
    yield KernelSpec(f"pool2d_nhwc{I8_SUFFIX}", "pool_nhwc.cu", POOL_NHWC_I8, THREADS)
    for stride in I8_K3_STRIDES:
        yield KernelSpec(f"pool2d_nhwc{I8_SUFFIX}_k3s{stride}", "pool_nhwc.cu", POOL_NHWC_I8, THREADS)
    yield KernelSpec(PRODUCTS_I8_KERNEL, "pool_nhwc.cu", PRODUCTS_I8, THREADS)
    yield KernelSpec(f"global_avg_pool_nhwc{I8_SUFFIX}", "pool_nhwc.cu", GAP_NHWC_I8, THREADS)


KERNELS = registry(entries())


def requant_ratio(s_in: float, s_out: float) -> float:
    """pool2d_nhwc_i8's ratio: float32(s_in) / float32(s_out), as int8_reference.requantize computes it (exactly 1
    where the two float32 scales are equal: the pool leaves its values as they are)."""
    return float(np.float32(s_in) / np.float32(s_out))


def nhwc_pool_spec(op: PoolOp, arena: int, precision: str = "fp16", bias: int = 0, ratio: float = 1.0) -> LaunchSpec:
    """pool_nhwc.cu's pool2d; bias: the device address of op.bias's bias (a moved pool; int8: its conv's epilogue,
    Int8Scales.moved_pool_epilogue), else 0. int8: ratio = float32(s_in) / float32(s_out), the requantization to the
    output's storage scale (1: the same scale)."""
    assert bool(bias) == bool(op.bias), f"{op.name}: a moved pool needs its conv's bias, and only it"
    assert precision == INT8 or ratio == 1.0, f"{op.name}: only an int8 pool requantizes"
    n, c, h, w = op.src.dims
    _, _, ho, wo = op.dst.dims
    int8 = precision == INT8
    if int8 and bias:
        return products_pool_spec(op, arena, bias)
    last = dict(ratio=float(ratio)) if int8 else dict(bias=bias)
    pieces = c * NHWC_ELEMS[precision].bytes // 16  # a thread a 16-byte piece
    if int8 and op.kernel == 3 and op.stride in I8_K3_STRIDES:  # and I8_RUN outputs of a row
        k = KERNELS[f"pool2d_nhwc{I8_SUFFIX}_k3s{op.stride}"]
        threads = n * ho * -(-wo // I8_RUN) * pieces
    else:
        k = KERNELS[f"pool2d_nhwc{I8_SUFFIX if int8 else NHWC_ELEMS[precision].suffix}"]
        threads = n * ho * wo * pieces
    return LaunchSpec.of(op.name, k, (k.blocks(threads), 1, 1),
                         dict(x=nhwc_ptr(arena, op.src, precision), y=nhwc_ptr(arena, op.dst, precision), batch=n,
                              channels=c, h=h, w=w, x_cstride=op.src.c_total, ho=ho, wo=wo, y_cstride=op.dst.c_total,
                              kernel=op.kernel, stride=op.stride, pad=op.pad, is_max=int(op.kind == "max"),
                              count_include_pad=int(op.count_include_pad), **last))


def products_pool_spec(op: PoolOp, arena: int, epi: int) -> LaunchSpec:
    """avg_pool_products_nhwc_i8 of a moved pool: op.src is its conv's raw int32 products (a view whose c_total
    counts bytes, PRODUCT_BYTES a channel: plan.fuse_pointwise's product_elems), epi the conv's epilogue's address."""
    assert op.kind == "avg" and op.kernel == 3 and op.stride == 1, f"{op.name}: not a moved 3x3 average pool"
    assert op.src.c_total == PRODUCT_BYTES * op.src.channels and op.src.c_offset == 0, \
        f"{op.name}: its products are not a whole buffer of int32s"
    n, c, h, w = op.src.dims
    _, _, ho, wo = op.dst.dims
    k = KERNELS[PRODUCTS_I8_KERNEL]
    threads = n * ho * -(-wo // I8_RUN) * c // PRODUCT_BYTES  # 4 channels of I8_RUN outputs a thread
    return LaunchSpec.of(op.name, k, (k.blocks(threads), 1, 1),
                         dict(x=nhwc_ptr(arena, op.src, INT8), y=nhwc_ptr(arena, op.dst, INT8), batch=n, channels=c,
                              h=h, w=w, x_cstride=op.src.c_total // PRODUCT_BYTES, ho=ho, wo=wo,
                              y_cstride=op.dst.c_total, kernel=op.kernel, stride=op.stride, pad=op.pad,
                              count_include_pad=int(op.count_include_pad), epi=epi))


def nhwc_gap_spec(op: GlobalAvgPoolOp, arena: int, features: int, precision: str = "fp16",
                  scale: float | None = None) -> LaunchSpec:
    """pool_nhwc.cu's global average pool of the NHWC view into float32 (N, C) features at ``features``; int8: of
    the values dequantized at ``scale`` (the input's storage scale, float32)."""
    assert (scale is not None) == (precision == INT8), f"{op.name}: an int8 input's scale, and only its"
    nb, ch, hh, ww = op.src.dims
    int8 = precision == INT8
    k = KERNELS[f"global_avg_pool_nhwc{I8_SUFFIX if int8 else NHWC_ELEMS[precision].suffix}"]
    last = dict(scale=float(scale)) if scale is not None else {}
    return LaunchSpec.of(op.name, k, (k.blocks(nb * ch * NHWC_ELEMS[precision].bytes // 16), 1, 1),  # a thread a piece
                         dict(x=nhwc_ptr(arena, op.src, precision), y=features, batch=nb, channels=ch, hw=hh * ww,
                              x_cstride=op.src.c_total, y_bstride=ch, **last))
