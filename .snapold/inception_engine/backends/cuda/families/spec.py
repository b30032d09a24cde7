"""What every kernel family module is made of: a kernel's C parameters (``Signature``), its registry entry
(``KernelSpec``: source, signature, block, dynamic shared memory) and one launch of it (``LaunchSpec``), whose
arguments a family's launch builder gives by name (``LaunchSpec.of``) and which are packed here, in the order the
signature states, so that no builder restates the C parameter order."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .... import cuda_build
from ....plan import ConvOp
from ..tensor_maps import TensorMap
from ..tiles import blocks


@dataclass(frozen=True)
class Signature:
    """A kernel's parameters as its C source declares them: names and pycuda struct codes (P pointer, i int32,
    q int64, f float32). tests/kernels/test_kernel_signatures.py checks every kernel's C declaration against its
    Signature."""

    params: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, *groups: str) -> Signature:
        """Signature.of("P: x wt", "i: batch cin"): groups of parameters of one code each, in order."""
        return cls(tuple((name, code) for group in groups for code, names in [group.split(":")]
                         for name in names.split()))

    def __add__(self, other: Signature) -> Signature:
        return Signature(self.params + other.params)

    @property
    def format(self) -> str:
        """The pycuda struct format a launch packs its arguments with."""
        return "".join(code for _, code in self.params)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.params)

    def pack(self, kernel: str, args: Mapping[str, float]) -> tuple[float, ...]:
        """The arguments given by name, in the C order: exactly the signature's names, each once."""
        if set(args) != set(self.names):
            missing, extra = sorted(set(self.names) - set(args)), sorted(set(args) - set(self.names))
            raise ValueError(f"{kernel}: arguments do not match its signature (missing {missing}, extra {extra})")
        return tuple(args[name] for name in self.names)


@dataclass(frozen=True)
class ConvShared:
    """Dynamic shared memory that depends on the conv a launch computes: ``bytes_of(op)``, at most ``most`` (what
    the kernel is allowed at load)."""

    bytes_of: Callable[[ConvOp], int]
    most: int


@dataclass(frozen=True)
class KernelSpec:
    """One entry point of cuda_src/: its name, the file that defines it, its parameters, its block (threads: the
    source's __launch_bounds__) and its dynamic shared memory (bytes of every launch, or a ConvShared)."""

    name: str
    source: str
    signature: Signature
    threads: int
    shared: int | ConvShared = 0

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.threads, 1, 1)

    @property
    def arg_format(self) -> str:
        return self.signature.format

    @property
    def unit(self) -> str:
        """The compile unit (cuda_build.UNITS) whose cubin holds it."""
        return cuda_build.unit_of(self.source, self.name)

    @property
    def max_shared(self) -> int:
        """The most dynamic shared memory a launch takes: past 48 KiB the kernel opts in at load."""
        return self.shared.most if isinstance(self.shared, ConvShared) else self.shared

    def shared_bytes(self, op: ConvOp | None = None) -> int:
        """Dynamic shared memory of a launch (of the conv ``op``, where it depends on the conv)."""
        if isinstance(self.shared, ConvShared):
            assert op is not None, f"{self.name}: its shared memory depends on the conv"
            return self.shared.bytes_of(op)
        return self.shared

    def blocks(self, threads: int) -> int:
        """The blocks of this kernel that cover ``threads`` threads (a thread an element), at least one: a grid's
        extent."""
        return blocks(threads, self.threads)


def registry(specs: Iterable[KernelSpec]) -> dict[str, KernelSpec]:
    """name -> spec; a name given twice must be the same entry (the Winograd transforms are shared by the tiles)."""
    table: dict[str, KernelSpec] = {}
    for s in specs:
        if table.setdefault(s.name, s) != s:
            raise ValueError(f"two registry entries named {s.name}: {table[s.name]} and {s}")
    return table


@dataclass(frozen=True)
class LaunchSpec:
    """One kernel launch: everything pycuda needs, as plain numbers."""

    op: str  # the plan op it belongs to (per-layer timing groups by this)
    kernel: str  # entry point in the cubins
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[float, ...]  # device pointers, int32s and float32s (int8 scales), in the kernel's parameter order
    shared: int = 0  # bytes of dynamic shared memory
    maps: tuple[TensorMap, ...] = ()  # tensor maps the kernel reads from its `maps` argument's address, 128 bytes each

    @classmethod
    def of(cls, op: str, kernel: KernelSpec, grid: tuple[int, int, int], args: Mapping[str, float],
           conv: ConvOp | None = None, maps: tuple[TensorMap, ...] = ()) -> LaunchSpec:
        """A launch of ``kernel`` with its arguments by name (packed in its signature's order), its registry entry's
        block and dynamic shared memory (that of the conv it computes, ``conv``, where that depends on the conv)."""
        return cls(op, kernel.name, grid, kernel.block, kernel.signature.pack(kernel.name, args),
                   kernel.shared_bytes(conv), maps)

    def arg(self, name: str, kernel: KernelSpec) -> float:
        """The argument ``name`` of this launch of ``kernel``."""
        return self.args[kernel.signature.names.index(name)]
