"""The execution plan: tensor shapes, concat layout, and the arena memory plan.

The memory plan is checked two ways that do not trust the plan's own bookkeeping: lifetimes recomputed from the
op list must give pairwise disjoint arena ranges for every buffer live at each op, and a simulated run that stamps
every written arena element with the id of the op that wrote it must let each op read exactly what its producers
wrote (a buffer placed over a still-needed one would show another op's stamp).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from inception_engine import arch
from inception_engine.plan import (ConvOp, FCOp, FusedConvOp, GlobalAvgPoolOp, Plan, PoolOp, View, build_plan,
                                   fuse_max_pools, fuse_pointwise, fused_plan, writes)

# torchvision inception_v3 output sizes (C, H, W) for a 299x299 input.
TORCHVISION_SHAPES = {
    "Conv2d_1a_3x3": (32, 149, 149),
    "Conv2d_2a_3x3": (32, 147, 147),
    "Conv2d_2b_3x3": (64, 147, 147),
    "maxpool1": (64, 73, 73),
    "Conv2d_3b_1x1": (80, 73, 73),
    "Conv2d_4a_3x3": (192, 71, 71),
    "maxpool2": (192, 35, 35),
    "Mixed_5b": (256, 35, 35),
    "Mixed_5c": (288, 35, 35),
    "Mixed_5d": (288, 35, 35),
    "Mixed_6a": (768, 17, 17),
    "Mixed_6b": (768, 17, 17),
    "Mixed_6c": (768, 17, 17),
    "Mixed_6d": (768, 17, 17),
    "Mixed_6e": (768, 17, 17),
    "Mixed_7a": (1280, 8, 8),
    "Mixed_7b": (2048, 8, 8),
    "Mixed_7c": (2048, 8, 8),
    "avgpool": (2048, 1, 1),
    "fc": (1000, 1, 1),
}
# Branch outputs that live inside a concat: (C, H, W) of the branch itself.
TORCHVISION_BRANCHES = {
    "Mixed_5b.branch_pool": (32, 35, 35),
    "Mixed_5d.branch3x3dbl_3": (96, 35, 35),
    "Mixed_6a.branch3x3": (384, 17, 17),
    "Mixed_6a.max_pool": (288, 17, 17),
    "Mixed_6b.branch7x7_2": (128, 17, 17),
    "Mixed_6e.branch7x7dbl_5": (192, 17, 17),
    "Mixed_7a.branch3x3_2": (320, 8, 8),
    "Mixed_7a.max_pool": (768, 8, 8),
    "Mixed_7b.branch3x3_2a": (384, 8, 8),
    "Mixed_7c.branch_pool": (192, 8, 8),
}

BATCHES = [1, 3, 8]


@pytest.fixture(scope="module", params=BATCHES)
def plan(request) -> Plan:
    return build_plan(request.param)


def by_name(plan: Plan) -> dict[str, object]:
    return {op.name: op for op in plan.ops}


def test_shapes_match_torchvision(plan):
    n = plan.batch
    assert plan.input.dims == (n, 3, 299, 299)
    ops = by_name(plan)
    for name, chw in TORCHVISION_SHAPES.items():
        if name in plan.buffers:
            assert plan.buffers[name].shape == (n, *chw), name
        else:  # a tensor written into a concat buffer
            assert ops[name].dst.dims == (n, *chw), name
    for name, chw in TORCHVISION_BRANCHES.items():
        assert ops[name].dst.dims == (n, *chw), name
    assert plan.output.dims == (n, 1000, 1, 1)


def test_ops_are_94_convs_and_the_rest():
    plan = build_plan(1)
    kinds = [type(op) for op in plan.ops]
    assert kinds.count(ConvOp) == 94
    assert kinds.count(PoolOp) == 2 + 3 + 1 + 4 + 1 + 2  # stem, Mixed_5x, 6a, 6x, 7a, 7x
    assert kinds.count(GlobalAvgPoolOp) == 1 and kinds.count(FCOp) == 1
    assert isinstance(plan.ops[-1], FCOp) and plan.ops[-1].dst == plan.output
    assert len(arch.conv_layers()) == 94


def test_conv_views_agree_with_layers(plan):
    ops = by_name(plan)
    for layer in arch.conv_layers():
        op = ops[layer.name]
        assert op.kernel == layer.kernel and op.stride == layer.stride and op.pad == layer.pad
        assert op.src.channels == layer.in_ch and op.dst.channels == layer.out_ch


def test_concat_offsets_contiguous_and_complete(plan):
    ops = by_name(plan)
    concats = [l for l in arch.inception_v3() if isinstance(l, arch.Concat)]
    assert len(concats) == 11
    for cat in concats:
        buf = plan.buffers[cat.name]
        offset = 0
        for src in cat.srcs:
            dst = ops[src].dst
            assert dst.buffer == cat.name and dst.offset == buf.offset and dst.shape == buf.shape, src
            assert dst.c_offset == offset, f"{src} starts at channel {dst.c_offset}, expected {offset}"
            offset += dst.channels
        assert offset == buf.shape[1], f"{cat.name}: branches cover {offset} of {buf.shape[1]} channels"


def lifetimes(plan: Plan) -> dict[str, tuple[int, int]]:
    """(first write, last read) per buffer, recomputed from the ops alone."""
    first, last = {plan.input.buffer: -1}, {plan.output.buffer: len(plan.ops)}
    for i, op in enumerate(plan.ops):
        first.setdefault(op.dst.buffer, i)
        last[op.src.buffer] = max(last.get(op.src.buffer, -1), i)
    assert set(first) == set(last) == set(plan.buffers)
    return {b: (first[b], last[b]) for b in first}


def arena_range(plan: Plan, name: str) -> tuple[int, int]:
    b = plan.buffers[name]
    return b.offset, b.offset + b.elems


def overlapping_pairs(plan: Plan, names: list[str]) -> list[tuple[str, str]]:
    ranges = sorted((arena_range(plan, b), b) for b in names)
    return [(a, b) for ((_, end_a), a), ((start_b, _), b) in zip(ranges, ranges[1:]) if start_b < end_a]


def test_live_buffers_never_overlap(plan):
    life = lifetimes(plan)
    for name, (first, last) in life.items():
        assert (plan.buffers[name].first, plan.buffers[name].last) == (first, last), name
        start, end = arena_range(plan, name)
        assert 0 <= start and end <= plan.arena_elems, name
    for i in range(-1, len(plan.ops) + 1):
        live = [b for b, (first, last) in life.items() if first <= i <= last]
        assert not overlapping_pairs(plan, live), f"op {i}: overlapping live buffers"


def test_reuse_saves_memory_and_reuse_false_gives_disjoint_buffers():
    reused, separate = build_plan(3), build_plan(3, reuse=False)
    assert not overlapping_pairs(separate, list(separate.buffers))
    assert reused.arena_elems < separate.arena_elems / 2
    assert {b.shape for b in reused.buffers.values()} == {b.shape for b in separate.buffers.values()}


def view_ranges(v: View) -> list[slice]:
    """The arena ranges a view covers: per image, its channels are one contiguous run."""
    n, c_total, h, w = v.shape
    hw = h * w
    return [slice(v.offset + (i * c_total + v.c_offset) * hw, v.offset + (i * c_total + v.c_offset + v.channels) * hw)
            for i in range(n)]


@pytest.mark.parametrize("kind", ["reuse", "no reuse", "fused", "pools folded"])
def test_simulated_run_reads_what_producers_wrote(plan, kind):
    if kind == "no reuse":
        plan = build_plan(plan.batch, reuse=False)
    elif kind == "fused":
        plan = fuse_pointwise(build_plan(plan.batch, concurrent=True))
    elif kind == "pools folded":
        plan = fused_plan(plan.batch, list(arch.inception_v3()))
        assert sum(bool(op.max_pool) for op in plan.conv_ops) == 1
    stamp = np.full(plan.arena_elems, -2, np.int16)  # -2: never written, -1: the input
    producer: dict[tuple[str, int], int] = {}  # (buffer, channel) -> op id that writes it
    for r in view_ranges(plan.input):
        stamp[r] = -1
    for ch in range(3):
        producer[(plan.input.buffer, ch)] = -1
    for i, op in enumerate(plan.ops):
        src = op.src
        expected = np.repeat([producer.get((src.buffer, src.c_offset + c), -2) for c in range(src.channels)],
                             src.h * src.w)
        assert (expected >= -1).all(), f"{op.name} reads channels of {src.buffer} that no earlier op writes"
        for r in view_ranges(src):
            got = stamp[r]
            assert (got == expected).all(), (
                f"{op.name} reads {src.buffer} but finds data of op {got[got != expected][0]}: overlapping buffers")
        for dst in writes(op):
            for r in view_ranges(dst):
                stamp[r] = i
            for c in range(dst.channels):
                producer[(dst.buffer, dst.c_offset + c)] = i
    for r in view_ranges(plan.output):
        assert (stamp[r] == len(plan.ops) - 1).all()


def test_every_op_input_written_before(plan):
    written: set[tuple[str, int]] = {(plan.input.buffer, c) for c in range(3)}
    for op in plan.ops:
        need = {(op.src.buffer, op.src.c_offset + c) for c in range(op.src.channels)}
        assert need <= written, f"{op.name} reads before its input is complete"
        assert op.src.buffer != op.dst.buffer, f"{op.name} reads and writes one buffer"
        written |= {(op.dst.buffer, op.dst.c_offset + c) for c in range(op.dst.channels)}


def test_bad_batch_rejected():
    with pytest.raises(ValueError, match="batch"):
        build_plan(0)


@pytest.mark.parametrize("batch", [1, 5])
def test_fuse_pointwise_stacks_each_modules_1x1_convs_and_moves_its_average_pool(batch):
    """Every Inception module but Mixed_6a (one 1x1 conv, a max pool) gets one fused op at its first op, whose members
    are the module's 1x1 convs on its input and whose parts are their destinations, the pooled member last with its
    raw product in its pool's own buffer; the moved pool writes that member's destination and names its bias; the
    FLOPs do not change. The ops not involved are untouched, in order."""
    plan = build_plan(batch, concurrent=True)
    fused = fuse_pointwise(plan)
    by_name = {op.name: op for op in plan.ops}
    groups = [op for op in fused.ops if isinstance(op, FusedConvOp)]
    assert [g.name for g in groups] == [f"Mixed_{m}.pointwise" for m in ("5b", "5c", "5d", "6b", "6c", "6d", "6e",
                                                                         "7a", "7b", "7c")]
    gone = set()
    for g in groups:
        members = [by_name[m] for m in g.members]
        assert all(m.kernel == (1, 1) for m in members)
        assert all(m.src == g.src for m in members[:len(members) - g.pooled])
        assert g.dst.dims == (batch, sum(m.dst.channels for m in members), g.src.h, g.src.w)
        assert g.parts[:len(members) - g.pooled] == tuple(m.dst for m in members[:len(members) - g.pooled])
        for m, part in zip(members[len(members) - g.pooled:], g.parts[len(members) - g.pooled:]):
            pool = next(op for op in fused.ops if isinstance(op, PoolOp) and op.bias == m.name)
            old_pool = by_name[pool.name]
            assert (old_pool.kind, old_pool.stride, old_pool.src, old_pool.dst) == ("avg", 1, g.src, m.src)
            assert pool.src == part and part.buffer == old_pool.dst.buffer and part.channels == m.dst.channels
            assert pool.dst == m.dst and fused.ops.index(pool) > fused.ops.index(g)
            gone.add(m.name)
        assert g.pooled == (0 if g.name == "Mixed_7a.pointwise" else 1)
        gone |= set(g.members)
        assert fused.stages[fused.ops.index(g)] == plan.stages[min(plan.ops.index(m) for m in members)]
    kept = [op for op in plan.ops if op.name not in gone and not (isinstance(op, PoolOp) and any(
        isinstance(f, PoolOp) and f.bias and f.name == op.name for f in fused.ops))]
    assert [op for op in fused.ops if not isinstance(op, FusedConvOp) and not getattr(op, "bias", "")] == kept
    assert sum(op.flops for op in fused.conv_ops) == sum(op.flops for op in plan.conv_ops)
    assert list(fused.stages) == sorted(fused.stages) and len(fused.stages) == len(fused.ops)
    assert fuse_pointwise(fused).ops == fused.ops  # nothing left to fuse
    with pytest.raises(ValueError, match="concurrent=True"):
        fuse_pointwise(build_plan(batch))


@pytest.mark.parametrize("batch", [1, 8, 128])
def test_fuse_max_pools_folds_the_stems_pools_into_the_1x1_convs_behind_them(batch):
    """MaxPool_3a into Conv2d_3b and (any width) MaxPool_5a into Mixed_5b's fused 1x1 group: the conv reads the
    pool's input (stride 2, a 3x3 window), writes what it wrote, and the pool is gone; nothing else changes. By
    default only the 64-channel pool, the one that measured faster folded."""
    plain = fuse_pointwise(build_plan(batch, concurrent=True, pool_inputs=True))
    assert {op.name for op in fuse_max_pools(plain).conv_ops if op.max_pool} == {"Conv2d_3b_1x1"}
    folded = fuse_max_pools(plain, max_channels=None)
    before = {op.name: op for op in plain.ops}
    convs = {op.name: op for op in folded.conv_ops if op.max_pool}
    assert set(convs) == {"Conv2d_3b_1x1", "Mixed_5b.pointwise"}
    for conv, pool in ((convs["Conv2d_3b_1x1"], before["maxpool1"]), (convs["Mixed_5b.pointwise"], before["maxpool2"])):
        assert (pool.kind, pool.kernel, pool.stride, pool.pad) == ("max", 3, 2, 0)
        assert (conv.src, conv.stride, conv.max_pool, conv.kernel) == (pool.src, 2, 3, (1, 1))
        assert before[conv.name].src == pool.dst and writes(conv) == writes(before[conv.name])
        assert conv.flops == before[conv.name].flops
    assert [op.name for op in folded.ops] == [op.name for op in plain.ops if op.name not in ("maxpool1", "maxpool2")]
    assert len(folded.stages) == len(folded.ops) and list(folded.stages) == sorted(folded.stages)
    assert fuse_max_pools(folded, max_channels=None).ops == folded.ops  # nothing left to fold
    assert fused_plan(batch, list(arch.inception_v3())).ops == fuse_max_pools(plain).ops


def test_a_max_pool_stays_where_its_input_space_is_written_before_the_conv_reads_it():
    """A pool is folded only if nothing from it to the end of its conv's stage writes over the pool's input: here
    Conv2d_3b's output is moved onto the pool's input, so 3b must keep reading the pool's output."""
    plan = fuse_pointwise(build_plan(2, concurrent=True, pool_inputs=True))
    pool = next(op for op in plan.ops if op.name == "maxpool1")
    conv = next(op for op in plan.ops if op.name == "Conv2d_3b_1x1")
    moved = dataclasses.replace(plan.buffers[conv.dst.buffer], offset=plan.buffers[pool.src.buffer].offset)
    folded = fuse_max_pools(dataclasses.replace(plan, buffers={**plan.buffers, conv.dst.buffer: moved}), None)
    assert {op.name for op in folded.conv_ops if op.max_pool} == {"Mixed_5b.pointwise"}
    assert "maxpool1" in [op.name for op in folded.ops]
