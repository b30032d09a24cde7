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

import dataclasses
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
    """dst = relu(conv(src, weights[name]) + bias[name]); weights are ``<name>.weight`` / ``<name>.bias``.

    With ``max_pool`` = k (``fuse_max_pools``), a 1x1 conv of a k x k max pool of src (stride ``stride``, no
    padding) whose output is never stored: dst = relu(conv1x1(max_pool(src)) + bias)."""

    name: str
    src: View
    dst: View
    kernel: tuple[int, int]
    stride: int
    pad: tuple[int, int]
    max_pool: int = field(default=0, kw_only=True)

    @property
    def flops(self) -> int:
        n, cout, ho, wo = self.dst.dims
        return 2 * n * cout * ho * wo * self.src.channels * self.kernel[0] * self.kernel[1]


@dataclass(frozen=True)
class FusedConvOp(ConvOp):
    """1x1 convs that read the same src, as one GEMM of their stacked weights (``fuse_pointwise``): channels
    [start, start + parts[i].channels) of the stacked output go to view parts[i], start being the channels of the
    parts before it. Each part is member i's destination, except for the last ``pooled`` members, whose average pool
    was moved behind them: their parts receive the raw product (no bias, no ReLU) for a PoolOp with ``bias`` to
    finish. ``dst`` is the stacked output as a whole, a view of no buffer (shapes and FLOPs only). A raw product
    wider than an arena element (int8's exact int32 sums: ``fuse_pointwise``'s product_elems) has a view of
    ``channels`` values whose pixels are ``c_total`` arena elements apart, product_elems per value."""

    members: tuple[str, ...] = ()  # the convs, in stacking order (their weights are "<member>.weight")
    parts: tuple[View, ...] = ()
    pooled: int = 0


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
    bias: str = ""  # fuse_pointwise's moved pools: dst = relu(pool(src) + bias of this conv); src is its raw product


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


def is_fused(plan: Plan) -> bool:
    """Whether ``fuse_pointwise`` or ``fuse_max_pools`` made this plan (it has fused convs, moved pools or convs that
    read through a max pool)."""
    return any(isinstance(op, FusedConvOp) or (isinstance(op, PoolOp) and op.bias)
               or (isinstance(op, ConvOp) and op.max_pool) for op in plan.ops)


def writes(op: Op) -> tuple[View, ...]:
    """The views an op writes: its dst, or a fused conv's parts."""
    return op.parts if isinstance(op, FusedConvOp) else (op.dst,)


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


def poolable(l: Layer, home: dict[str, tuple[str, int]]) -> bool:
    """A max pool ``fuse_max_pools`` may fold into the 1x1 convs that read it: no padding, its output a buffer of
    its own (not a slice of a concat)."""
    return isinstance(l, Pool) and l.kind == "max" and l.pad == 0 and home[l.name] == (l.name, 0)


def tensor_shapes(layers: list[Layer], input_size: int) -> dict[str, tuple[int, int, int]]:
    """Each tensor's (channels, h, w), checked: a conv's and an FC's input width, a concat's parts' sizes."""
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
    return chw


def tensor_homes(layers: list[Layer], chw: dict[str, tuple[int, int, int]]) -> dict[str, tuple[str, int]]:
    """tensor -> (the buffer it lives in, its channel offset there): a concat's parts live in the concat's buffer,
    every other tensor in its own."""
    home: dict[str, tuple[str, int]] = {}
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
    return home


def best_fit(sizes: dict[str, int], first: dict[str, int], last: dict[str, int], at: dict[int, int],
             reuse: bool) -> tuple[dict[str, int], int]:
    """Each buffer's offset in the arena, and the arena's size: greedy best fit in order of first write, into the
    smallest gap that the buffers still live (``at`` of their first and last op) leave, where ``reuse``."""
    offsets: dict[str, int] = {}
    live: list[tuple[int, int, str]] = []  # (offset, size, buffer)
    arena = 0
    for b in sorted(first, key=lambda b: first[b]):
        size = sizes[b]
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
    return offsets, arena


def build_plan(batch: int, layers: list[Layer] | None = None, reuse: bool = True,
               input_size: int = arch.INPUT_SIZE, concurrent: bool = False, pool_inputs: bool = False) -> Plan:
    """The plan of ``layers`` for this batch. pool_inputs: the input of each ``poolable`` max pool stays live until
    the last reader of the pool's output, so that ``fuse_max_pools`` can let that reader take the pool's input."""
    if batch < 1:
        raise ValueError(f"batch size must be >= 1, got {batch}")
    layers = list(layers or arch.inception_v3())

    # 1. Shapes (per tensor: channels, h, w), and which tensors live inside a concat buffer at which offset.
    chw = tensor_shapes(layers, input_size)
    home = tensor_homes(layers, chw)

    # 2. Lifetimes of buffers over the op sequence (concats are not ops).
    compute = [l for l in layers if not isinstance(l, Concat)]
    first: dict[str, int] = {arch.INPUT: -1}
    last: dict[str, int] = {}
    for i, l in enumerate(compute):
        first.setdefault(home[l.name][0], i)
        last[home[l.src][0]] = i
    out_name = compute[-1].name
    last[out_name] = len(compute)
    if pool_inputs:
        for i, l in enumerate(compute):
            if poolable(l, home):
                src = home[l.src][0]
                last[src] = max(last[src], last.get(l.name, i))
    stages = op_stages([l.name for l in compute])
    # The time axis of liveness: op indices, or with concurrent=True the stage of the op (-1 and one past the
    # last stage for the input and the logits, which live outside the forward).
    if concurrent:
        at = {-1: -1, len(compute): stages[-1] + 1, **dict(enumerate(stages))}
    else:
        at = {i: i for i in range(-1, len(compute) + 1)}

    # 3. Offsets: greedy best-fit in order of first write.
    offsets, arena = best_fit({b: align(batch * chw[b][0] * chw[b][1] * chw[b][2]) for b in first}, first, last, at,
                              reuse)

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


def is_pointwise(op: object) -> bool:
    """A 1x1 conv of stride 1 and no padding (a fused one counts as done)."""
    return (isinstance(op, ConvOp) and not isinstance(op, FusedConvOp) and op.kernel == (1, 1) and op.stride == 1
            and op.pad == (0, 0))


@dataclass
class PointwiseGroup:
    """1x1 convolutions (op indices) that read the same tensor ``src``, which a backend may run as one GEMM of their
    stacked weights (the NumPy backend's fast mode; ``fuse_pointwise`` for the CUDA NHWC path). In the NumPy
    backend the product waits in scratch until each conv's own step adds its bias and applies ReLU into its
    destination. ``pools`` maps a member to the average pool that feeds it, moved behind the conv: both are
    linear (the pool per channel, the conv per pixel, and the count_include_pad=False divisor only depends on the
    position), so they commute, and the pool then runs on the conv's few output channels instead of its many
    inputs. The member's own step does nothing; the pool's step pools the product into the member's
    destination."""

    src: View
    convs: list[int]
    pools: dict[int, int]  # conv index -> index of the average pool that feeds it

    @property
    def first(self) -> int:
        return min(self.convs + list(self.pools.values()))

    @property
    def last(self) -> int:
        return max([c for c in self.convs if c not in self.pools] + list(self.pools.values()))


def movable_avg_pools(plan: Plan) -> dict[int, int]:
    """conv index -> index of the stride-1 average pool feeding that 1x1 conv, for the pools that can move behind
    their conv (PointwiseGroup says why that is exact): the conv is the only reader of the pool's output, and the
    conv's destination is already live when the pool runs, so that both can run at the pool's step."""
    ops = plan.ops
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        readers.setdefault(op.src.buffer, []).append(i)
    feeds: dict[int, int] = {}
    for i, op in enumerate(ops):
        if (isinstance(op, PoolOp) and op.kind == "avg" and op.stride == 1 and not op.bias
                and len(readers[op.dst.buffer]) == 1):
            conv = readers[op.dst.buffer][0]
            if is_pointwise(ops[conv]) and plan.buffers[ops[conv].dst.buffer].first <= i:
                feeds[conv] = i
    return feeds


def pointwise_groups(plan: Plan, move_pools: bool = True) -> list[PointwiseGroup]:
    """The groups worth fusing (two convs or more, or a pool to move), none overlapping another in op order (they
    share one scratch). Only pools whose single reader is a 1x1 conv qualify, and only where the conv's
    destination is already live when the pool runs; none without move_pools."""
    ops = plan.ops
    feeds = movable_avg_pools(plan) if move_pools else {}
    by_src: dict[View, PointwiseGroup] = {}
    for i, op in enumerate(ops):
        if is_pointwise(op):
            src = ops[feeds[i]].src if i in feeds else op.src
            group = by_src.setdefault(src, PointwiseGroup(src, [], {}))
            group.convs.append(i)
            if i in feeds:
                group.pools[i] = feeds[i]
    groups, end = [], -1
    for g in sorted(by_src.values(), key=lambda g: g.first):
        if (len(g.convs) > 1 or g.pools) and g.first > end:
            groups.append(g)
            end = g.last
    return groups


def fuse_pointwise(plan: Plan, move_pools: bool = True, product_elems: int = 1) -> Plan:
    """The plan with each ``pointwise_groups`` group that lies within one module as one FusedConvOp named
    "<module>.pointwise", at the group's first op: the members without a moved pool first (in op order), then those
    with one, whose raw products go to the moved pool's own buffer (which held its output: as many pixels and at
    least as many channels). Each moved pool becomes a PoolOp with ``bias`` from that product into its member's
    destination, at its own place. The fused op writes all its parts at the group's first op, earlier than the
    members did, so the plan must keep every buffer of a stage live for the whole stage (``plan.concurrent``).
    product_elems: arena elements a raw product value takes (int8: 4, its int32 sums in a byte arena); a pool whose
    products do not fit its buffer stays in front of its conv. Without move_pools every average pool stays there
    (an 8-bit network whose file rounds the pool's output: backends/int8_reference.moved_pools)."""
    if not plan.concurrent:
        raise ValueError("fuse_pointwise needs a plan whose buffers live for whole stages "
                         "(build_plan(concurrent=True))")
    ops = plan.ops
    fused: dict[int, list[Op]] = {}  # op index -> what replaces it (nothing for a member)
    for g in pointwise_groups(plan, move_pools):
        module = ops[g.convs[0]].name.split(".", 1)[0]
        indices = g.convs + list(g.pools.values())
        if "." not in ops[g.convs[0]].name or len({plan.stages[i] for i in indices}) != 1:
            continue
        plain = [i for i in g.convs if i not in g.pools]
        pooled = [i for i in g.convs if i in g.pools]
        products = {}
        for i in pooled:
            pool, conv = ops[g.pools[i]], ops[i]
            n, _, h, w = pool.src.dims
            home = plan.buffers[pool.dst.buffer]
            products[i] = View(home.name, home.offset, (n, product_elems * conv.dst.channels, h, w), 0,
                               conv.dst.channels)
            if products[i].n * products[i].c_total * h * w > home.elems:
                break
        else:
            members = plain + pooled
            parts = tuple(ops[i].dst for i in plain) + tuple(products[i] for i in pooled)
            n, _, h, w = g.src.dims
            total = sum(v.channels for v in parts)
            name = f"{module}.pointwise"
            fused[g.first] = [FusedConvOp(name, g.src, View(name, 0, (n, total, h, w), 0, total), (1, 1), 1, (0, 0),
                                          tuple(ops[i].name for i in members), parts, len(pooled))]
            for i in g.convs:
                fused.setdefault(i, [])
            for i in pooled:
                pool = ops[g.pools[i]]
                fused.setdefault(g.pools[i], []).append(dataclasses.replace(pool, src=products[i], dst=ops[i].dst,
                                                                            bias=ops[i].name))
    new_ops = [x for i, op in enumerate(ops) for x in (fused[i] if i in fused else [op])]
    return dataclasses.replace(plan, ops=tuple(new_ops), stages=tuple(op_stages([op.name for op in new_ops])))


# fuse_max_pools' default: the widest pool it folds. conv_nhwc_mma.cu's NhwcMaxPoolLoader waits for its loads before
# the math of the stage in hand, so only a K that the ring's first stages hold pays: folding MaxPool_3a into Conv2d_3b
# (64 channels, two stages) is faster than the two launches, folding MaxPool_5a into Mixed_5b.pointwise (192
# channels, six stages, two channel tiles that each take the maxima) slower (docs/PERFORMANCE.md).
MAX_POOL_CHANNELS = 64


def fuse_max_pools(plan: Plan, max_channels: int | None = MAX_POOL_CHANNELS) -> Plan:
    """The plan with each max pool (no padding, no bias, at most max_channels channels; None: any) whose output only
    one 1x1 conv reads folded into that conv: the conv (``ConvOp.max_pool``) reads the pool's input and takes the
    window maxima on its way, so the pool's output is neither written nor read again (the pool's read and write,
    and the conv's read, become one read; conv_nhwc_mma.cu's NhwcMaxPoolLoader). Run it after ``fuse_pointwise``, whose
    fused 1x1 group is then the only reader of the pool before Mixed_5b. A pool stays where the conv's stage, or
    the ops between the pool and the conv, write into the arena space of the pool's input (build it with
    ``build_plan(pool_inputs=True)``, which keeps that space live for them)."""
    ops = plan.ops
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        readers.setdefault(op.src.buffer, []).append(i)
    folded: dict[int, ConvOp] = {}  # conv index -> the conv reading through the pool
    dropped: set[int] = set()
    for i, pool in enumerate(ops):
        if not (isinstance(pool, PoolOp) and pool.kind == "max" and pool.pad == 0 and not pool.bias
                and (max_channels is None or pool.src.channels <= max_channels)):
            continue
        if len(readers.get(pool.dst.buffer, [])) != 1:
            continue
        j = readers[pool.dst.buffer][0]
        conv = ops[j]
        if not (isinstance(conv, ConvOp) and conv.kernel == (1, 1) and conv.stride == 1 and conv.pad == (0, 0)
                and not conv.max_pool and conv.src == pool.dst and j not in folded):
            continue
        # The conv may run anywhere in its stage (concurrent plans), so nothing from the pool to its stage's end may
        # write over the pool's input.
        end = max(k for k in range(len(ops)) if plan.stages[k] == plan.stages[j]) if plan.stages else j
        src = plan.buffers[pool.src.buffer]
        if any(overlap(plan.buffers[v.buffer], src) for k in range(i, end + 1) for v in writes(ops[k])
               if v.buffer in plan.buffers):
            continue
        folded[j] = dataclasses.replace(conv, src=pool.src, stride=pool.stride, max_pool=pool.kernel)
        dropped.add(i)
    new_ops = [folded.get(i, op) for i, op in enumerate(ops) if i not in dropped]
    return dataclasses.replace(plan, ops=tuple(new_ops), stages=tuple(op_stages([op.name for op in new_ops])))


def overlap(a: Buffer, b: Buffer) -> bool:
    """Whether two buffers share arena space."""
    return a.offset < b.offset + b.elems and b.offset < a.offset + a.elems


def fuse(plan: Plan, max_pools: bool = True, move_pools: bool = True, product_elems: int = 1) -> Plan:
    """Each module's 1x1 convs as one GEMM (``fuse_pointwise``, with move_pools the average pools moved behind their
    convs) and, with max_pools, the max pools that pay folded into the 1x1 convs behind them (``fuse_max_pools``:
    MaxPool_3a into Conv2d_3b; its conv_nhwc_mma.cu kernels exist for the mma.sync tiles of fp16 and tf32)."""
    plan = fuse_pointwise(plan, move_pools, product_elems)
    return fuse_max_pools(plan) if max_pools else plan


def fused_plan(batch: int, layers: list[Layer], input_size: int = arch.INPUT_SIZE, max_pools: bool = True,
               move_pools: bool = True, product_elems: int = 1) -> Plan:
    """The plan the CUDA NHWC path runs: stages for concurrent branches, ``fuse``d, the pools' inputs kept live for
    the convs that take them."""
    return fuse(build_plan(batch, layers, input_size=input_size, concurrent=True, pool_inputs=max_pools), max_pools,
                move_pools, product_elems)
