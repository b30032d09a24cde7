"""softmax.cu: the rows' softmax of the logits (CudaBackend(softmax=True)), a block a row."""

from __future__ import annotations

from collections.abc import Iterator

from ....plan import View
from ..tiles import THREADS
from .direct_nchw import batch_stride, view_ptr
from .spec import KernelSpec, LaunchSpec, Signature, registry

SOURCES = ("softmax.cu",)
SOFTMAX = Signature.of("P: z p", "i: cols z_bstride p_bstride")


def entries() -> Iterator[KernelSpec]:
    yield KernelSpec("softmax_rows", "softmax.cu", SOFTMAX, THREADS)


KERNELS = registry(entries())


def softmax_spec(logits: View, arena: int, probs: int) -> LaunchSpec:
    n, c = logits.n, logits.channels
    return LaunchSpec.of("softmax", KERNELS["softmax_rows"], (n, 1, 1),
                         dict(z=view_ptr(arena, logits), p=probs, cols=c, z_bstride=batch_stride(logits), p_bstride=c))
