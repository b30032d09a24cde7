"""pool.cu: the NCHW max/average pool and global average pool."""

from __future__ import annotations

from collections.abc import Iterator

from ....plan import GlobalAvgPoolOp, PoolOp
from ..tiles import THREADS, blocks
from .direct_nchw import batch_stride, view_ptr
from .spec import KernelSpec, LaunchSpec, Signature, registry

SOURCES = ("pool.cu",)
POOL = Signature.of("P: x y", "i: batch channels h w x_bstride ho wo y_bstride kernel stride pad is_max "
                    "count_include_pad")
GAP = Signature.of("P: x y", "i: batch channels hw x_bstride y_bstride")


def entries() -> Iterator[KernelSpec]:
    yield KernelSpec("pool2d", "pool.cu", POOL, THREADS)
    yield KernelSpec("global_avg_pool", "pool.cu", GAP, THREADS)


KERNELS = registry(entries())


def pool_spec(op: PoolOp, arena: int) -> LaunchSpec:
    n, c, h, w = op.src.dims
    _, _, ho, wo = op.dst.dims
    k = KERNELS["pool2d"]
    return LaunchSpec.of(op.name, k, (k.blocks(n * c * ho * wo), 1, 1),
                         dict(x=view_ptr(arena, op.src), y=view_ptr(arena, op.dst), batch=n, channels=c, h=h, w=w,
                              x_bstride=batch_stride(op.src), ho=ho, wo=wo, y_bstride=batch_stride(op.dst),
                              kernel=op.kernel, stride=op.stride, pad=op.pad, is_max=int(op.kind == "max"),
                              count_include_pad=int(op.count_include_pad)))


def gap_spec(op: GlobalAvgPoolOp, arena: int) -> LaunchSpec:
    n, c, h, w = op.src.dims
    k = KERNELS["global_avg_pool"]  # a warp a plane
    return LaunchSpec.of(op.name, k, (blocks(n * c, k.threads // 32), 1, 1),
                         dict(x=view_ptr(arena, op.src), y=view_ptr(arena, op.dst), batch=n, channels=c, hw=h * w,
                              x_bstride=batch_stride(op.src), y_bstride=batch_stride(op.dst)))
