"""The kernel families: one module per family of cuda_src/'s entry points, each holding the source files it owns
(``SOURCES``), its kernels' C signatures, stated once (``Signature``), its registry entries (``entries()``, block
and dynamic shared memory read off its tiles, tiles.py) and its launch builders, which give every argument by name
(``LaunchSpec.of`` packs them in the signature's order). ``FAMILIES`` is the one table of them: the kernel registry
(kernels.REGISTRY) is their entries, and tests hold cuda_build's sources (read off cuda_src/) to theirs.

Why the signatures are stated here and not read from the .cu: the entry points are stamped out by macros (a tile
family is one macro over its shapes), so reading their parameters takes a C preprocessor, which a run from cached
cubins need not have; and generating the C declarations from here would need the C types (const, __restrict__, the
element types) that a launch does not care about. So each is stated once, here, and
tests/kernels/test_kernel_signatures.py reads every declaration after the preprocessor and holds it to this one, name
for name and type for type (tests/kernels/test_cuda_emulated.py compiles calls from it too).

Adding a family: its .cu in cuda_src/ (cuda_build finds it there) and its module here, listed in ``FAMILIES``.
"""

from __future__ import annotations

from collections.abc import Iterator

from . import conv_input_nhwc, conv_nhwc, direct_nchw, fc, pool, pool_nhwc, softmax, support, winograd_nchw
from .spec import KernelSpec

FAMILIES = (direct_nchw, winograd_nchw, pool, fc, softmax, support, pool_nhwc, conv_input_nhwc, conv_nhwc)


def entries() -> Iterator[KernelSpec]:
    """Every entry point of cuda_src/, family by family."""
    for family in FAMILIES:
        yield from family.entries()


def sources() -> tuple[str, ...]:
    """The .cu files the families own."""
    return tuple(s for family in FAMILIES for s in family.SOURCES)
