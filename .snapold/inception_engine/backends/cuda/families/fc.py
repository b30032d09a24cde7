"""fc.cu: the FC layer as a GEMV (a warp an output), where the cost model gives it no conv config; with one, the FC
is a 1x1 convolution of the direct NCHW family (direct_nchw.py)."""

from __future__ import annotations

from collections.abc import Iterator

from ....plan import FCOp
from ..cost_model import ConvConfig
from ..tiles import THREADS, blocks
from .direct_nchw import batch_stride, conv_specs, view_ptr
from .spec import KernelSpec, LaunchSpec, Signature, registry

SOURCES = ("fc.cu",)
FC = Signature.of("P: x w bias y", "i: in_features out_features x_bstride y_bstride")


def entries() -> Iterator[KernelSpec]:
    yield KernelSpec("fc_gemv", "fc.cu", FC, THREADS)


KERNELS = registry(entries())


def fc_specs(op: FCOp, cfg: ConvConfig | None, arena: int, w: int, b: int, ws: int,
             counters: int | None = None) -> list[LaunchSpec]:
    n, fin, _, _ = op.src.dims
    fout = op.dst.channels
    if cfg is None:
        k = KERNELS["fc_gemv"]  # a warp an output
        return [LaunchSpec.of(op.name, k, (blocks(fout, k.threads // 32), n, 1),
                              dict(x=view_ptr(arena, op.src), w=w, bias=b, y=view_ptr(arena, op.dst),
                                   in_features=fin, out_features=fout, x_bstride=batch_stride(op.src),
                                   y_bstride=batch_stride(op.dst)))]
    # A 1x1 convolution of a (N, in, 1, 1) image: M = out, N = batch, K = in; no ReLU on the logits.
    return conv_specs(op.name, op.src, op.dst, (1, 1), 1, (0, 0), False, cfg, arena, w, b, ws, counters)
