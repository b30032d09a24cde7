"""Execution plan: the architecture's layers turned into ops on concrete tensors for one batch size.

Every backend executes the same ``Plan``. All activations live in one flat *arena* of ``arena_elems`` elements;
an op reads and writes ``View``s into it. A view is a channel slice of an NCHW buffer, so a conv that feeds a
concat simply writes at its channel offset in the concat's buffer and no concat copy ever happens.

Memory plan: each buffer is live from the first op that writes it to the last op that reads it; buffers whose
lifetimes do not overlap share arena space (greedy best-fit over offsets). With ``reuse=False`` every buffer gets
its own space. With ``concurrent=True`` lifetimes count in whole *stages* instead of ops: a stage is one Inception
module (its ops are named "<module>.<branch>") or one op outside the modules, and a buffer is live from its first
writer's stage to its last reader's stage inclusive. Buffers used in one stage then never share memory, so a backend
may run the ops of a stage in any order or concurrently (respecting their data dependencies) as long as it joins
all of them before the next stage starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import arch
from .arch import FC, Concat, Conv, GlobalAvgPool, Layer, Pool

ALIGN = 64  # elements; 256 bytes in float32, so every buffer start suits 16-byte vector loads on the GPU


@dataclass(frozen=True)
class View:
    """Channels ``[c_offset, c_offset + channels)`` of the NCHW buffer ``buffer`` that starts at ``offset``.

    Element (n, c, h, w) of the view is ``arena[offset + ((n * shape[1] + c_offset + c) * H + h) * W + w]``.
    """

    buffer: str
    offset: int
    shape: tuple[int, int, int, int]  # the whole buffer: N, C_total, H, W
    c_offset: int
    channels: int

    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def h(self) -> int:
        return self.shape[2]

    @property
    def w(self) -> int:
        return self.shape[3]

    @property
    def c_total(self) -> int:
        return self.shape[1]

    @property
    def dims(self) -> tuple[int, int, int, int]:
        """Shape of the view itself."""
        return (self.shape[0], self.channels, self.shape[2], self.shape[3])


@dataclass(frozen=True)
class ConvOp:
    """dst = relu(conv(src, weights[name]) + bias[name]); weights are ``<name>.weight`` / ``<name>.bias``."""

    name: str
    src: View
    dst: View
    kernel: tuple[int, int]
    stride: int
    pad: tuple[int, int]

    @property
    def flops(self) -> int:
        n, cout, ho, wo = self.dst.dims
        return 2 * n * cout * ho * wo * self.src.channels * self.kernel[0] * self.kernel[1]


@dataclass(frozen=True)
class PoolOp:
    name: str
    src: View
    dst: View
    kind: str  # "max" | "avg"
    kernel: int
    stride: int
    pad: int
    count_include_pad: bool


@dataclass(frozen=True)
class GlobalAvgPoolOp:
    name: str
    src: View
    dst: View  # (N, C, 1, 1)


@dataclass(frozen=True)
class FCOp:
    """dst (N, out, 1, 1) = src (N, in, 1, 1) @ weight.T + bias; no activation (these are the logits)."""

    name: str
    src: View
    dst: View


Op = ConvOp | PoolOp | GlobalAvgPoolOp | FCOp


@dataclass(frozen=True)
class Buffer:
    name: str
    offset: int
    shape: tuple[int, int, int, int]
    first: int  # index of the first op that writes it (-1: written before the forward, the input)
    last: int  # index of the last op that reads it (len(ops): read after the forward, the logits)

    @property
    def elems(self) -> int:
        n, c, h, w = self.shape
        return n * c * h * w


@dataclass(frozen=True)
class Plan:
    batch: int
    ops: tuple[Op, ...]
    buffers: dict[str, Buffer]
    arena_elems: int
    input: View
    output: View  # logits, (N, 1000, 1, 1)
    layers: tuple[Layer, ...] = field(repr=False, default=())
    stages: tuple[int, ...] = ()  # stage of each op (non-decreasing); see the module docstring
    concurrent: bool = False  # buffers used within one stage never share memory (concurrent=True or reuse=False)

    @property
    def conv_ops(self) -> list[ConvOp]:
        return [op for op in self.ops if isinstance(op, ConvOp)]

    @property
    def flops(self) -> int:
        return sum(op.flops for op in self.conv_ops) + 2 * self.batch * self.output.channels * self.ops[-1].src.channels


def _out_hw(h: int, w: int, kernel: tuple[int, int], stride: int, pad: tuple[int, int]) -> tuple[int, int]:
    return (h + 2 * pad[0] - kernel[0]) // stride + 1, (w + 2 * pad[1] - kernel[1]) // stride + 1


def align(x: int) -> int:
    """x elements rounded up to whole ALIGN."""
    return (x + ALIGN - 1) // ALIGN * ALIGN


def op_stages(names: list[str]) -> list[int]:
    """Stage of each op in order: consecutive ops of one module ("Mixed_5b.branch1x1", "Mixed_5b.avg_pool") share
    a stage; an op whose name has no module prefix is a stage of its own."""
    stages: list[int] = []
    prev = None
    for name in names:
        module = name.split(".", 1)[0] if "." in name else None
        same = bool(stages) and module is not None and module == prev
        stages.append(stages[-1] if same else (stages[-1] + 1 if stages else 0))
        prev = module
    return stages


def build_plan(batch: int, layers: list[Layer] | None = None, reuse: bool = True,
               input_size: int = arch.INPUT_SIZE, concurrent: bool = False) -> Plan:
    if batch < 1:
        raise ValueError(f"batch size must be >= 1, got {batch}")
    layers = list(layers or arch.inception_v3())

    # 1. Shapes (per tensor: channels, h, w), and which tensors live inside a concat buffer at which offset.
    chw: dict[str, tuple[int, int, int]] = {arch.INPUT: (3, input_size, input_size)}
    for l in layers:
        if isinstance(l, Conv):
            c, h, w = chw[l.src]
            if c != l.in_ch:
                raise ValueError(f"{l.name}: expects {l.in_ch} input channels, {l.src} has {c}")
            chw[l.name] = (l.out_ch, *_out_hw(h, w, l.kernel, l.stride, l.pad))
        elif isinstance(l, Pool):
            c, h, w = chw[l.src]
            chw[l.name] = (c, *_out_hw(h, w, (l.kernel, l.kernel), l.stride, (l.pad, l.pad)))
        elif isinstance(l, Concat):
            parts = [chw[s] for s in l.srcs]
            if len({p[1:] for p in parts}) != 1:
                raise ValueError(f"{l.name}: concat inputs differ in spatial size: {parts}")
            chw[l.name] = (sum(p[0] for p in parts), *parts[0][1:])
        elif isinstance(l, GlobalAvgPool):
            chw[l.name] = (chw[l.src][0], 1, 1)
        elif isinstance(l, FC):
            if chw[l.src][0] != l.in_features:
                raise ValueError(f"{l.name}: expects {l.in_features} features, {l.src} has {chw[l.src][0]}")
            chw[l.name] = (l.out_features, 1, 1)

    home: dict[str, tuple[str, int]] = {}  # tensor -> (buffer it lives in, channel offset)
    for l in layers:
        if isinstance(l, Concat):
            off = 0
            for s in l.srcs:
                if s in home:
                    raise ValueError(f"{s} feeds two concats; the plan needs one home per tensor")
                home[s] = (l.name, off)
                off += chw[s][0]
    for t in chw:
        home.setdefault(t, (t, 0))

    # 2. Lifetimes of buffers over the op sequence (concats are not ops).
    compute = [l for l in layers if not isinstance(l, Concat)]
    first: dict[str, int] = {arch.INPUT: -1}
    last: dict[str, int] = {}
    for i, l in enumerate(compute):
        first.setdefault(home[l.name][0], i)
        last[home[l.src][0]] = i
    out_name = compute[-1].name
    last[out_name] = len(compute)
    stages = op_stages([l.name for l in compute])
    # The time axis of liveness: op indices, or with concurrent=True the stage of the op (-1 and one past the
    # last stage for the input and the logits, which live outside the forward).
    if concurrent:
        at = {-1: -1, len(compute): stages[-1] + 1, **dict(enumerate(stages))}
    else:
        at = {i: i for i in range(-1, len(compute) + 1)}

    # 3. Offsets: greedy best-fit in order of first write.
    offsets: dict[str, int] = {}
    live: list[tuple[int, int, str]] = []  # (offset, size, buffer)
    arena = 0
    for b in sorted(first, key=lambda b: first[b]):
        size = align(batch * chw[b][0] * chw[b][1] * chw[b][2])
        if reuse:
            live = [x for x in live if at[last[x[2]]] >= at[first[b]]]
        live.sort()
        best, cursor = None, 0
        for off, sz, _ in live:
            gap = off - cursor
            if gap >= size and (best is None or gap < best[1]):
                best = (cursor, gap)
            cursor = max(cursor, off + sz)
        offsets[b] = best[0] if best else cursor
        live.append((offsets[b], size, b))
        arena = max(arena, offsets[b] + size)

    buffers = {b: Buffer(b, offsets[b], (batch, *chw[b]), first[b], last[b]) for b in offsets}

    def view(t: str) -> View:
        b, c_off = home[t]
        return View(b, offsets[b], buffers[b].shape, c_off, chw[t][0])

    ops: list[Op] = []
    for l in compute:
        if isinstance(l, Conv):
            ops.append(ConvOp(l.name, view(l.src), view(l.name), l.kernel, l.stride, l.pad))
        elif isinstance(l, Pool):
            ops.append(PoolOp(l.name, view(l.src), view(l.name), l.kind, l.kernel, l.stride, l.pad,
                              l.count_include_pad))
        elif isinstance(l, GlobalAvgPool):
            ops.append(GlobalAvgPoolOp(l.name, view(l.src), view(l.name)))
        elif isinstance(l, FC):
            ops.append(FCOp(l.name, view(l.src), view(l.name)))
    return Plan(batch, tuple(ops), buffers, arena, view(arch.INPUT), view(out_name), tuple(layers), tuple(stages),
                concurrent or not reuse)
