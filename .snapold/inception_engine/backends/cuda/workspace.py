"""Scratch memory of a forward: the split-K and Winograd workspace (``workspace_layout``, disjoint slices for ops that
may run at the same time) and the _fixup kernels' tile counters (``counter_layout``)."""

from __future__ import annotations

from ...plan import ConvOp, FCOp, Plan, align
from .cost_model import ConvConfig, config_shape
from .tiles import blocks


def workspace_elems(op: ConvOp | FCOp, cfg: ConvConfig | None) -> int:
    """Floats of workspace one op uses: split-K partial sums (splits x Cout x N), or Winograd's V (nn x Cin x Tp)
    followed by M (splits x nn x Cout x Tp); 0 for the others."""
    if cfg is not None and cfg.wino:
        ws = config_shape(op, cfg)
        return ws.nn * (op.src.channels + cfg.splits * op.dst.channels) * ws.t_pad
    if cfg is None or cfg.splits == 1:
        return 0
    return cfg.splits * op.dst.channels * op.dst.n * op.dst.h * op.dst.w


def workspace_layout(plan: Plan, configs: dict[str, ConvConfig | None]) -> tuple[int, dict[str, int]]:
    """(floats of workspace, element offset of each op's slice: ``workspace_elems``; split-K and Winograd ops).

    Ops that may run at the same time get disjoint slices: all ops of one stage when the plan is concurrent, so a
    stage needs the sum of its ops' slices; else ops run one after another and every slice starts at 0.
    """
    need, offsets, used, stage = 0, {}, 0, None
    for i, op in enumerate(plan.ops):
        elems = workspace_elems(op, configs.get(op.name)) if isinstance(op, (ConvOp, FCOp)) else 0
        if not elems:
            continue
        if not plan.concurrent or plan.stages[i] != stage:
            used, stage = 0, plan.stages[i]
        offsets[op.name] = used
        used += align(elems)
        need = max(need, used)
    return need, offsets


def counter_layout(plan: Plan, configs: dict[str, ConvConfig | None]) -> tuple[int, dict[str, int]]:
    """(unsigned ints of tile counters for the _fixup kernels, offset of each split op's grid.x * grid.y counters;
    split ops whose tile has no _fixup variant need none). Every op has its own: the counters must read zero at
    launch, and each op leaves its own so."""
    need, offsets = 0, {}
    for op in plan.ops:
        cfg = configs.get(op.name)
        if cfg is None or cfg.splits == 1 or not cfg.tile.fixup:
            continue
        offsets[op.name] = need
        need += blocks(op.dst.n * op.dst.h * op.dst.w, cfg.tile.bn) * blocks(op.dst.channels, cfg.tile.bm)
    return need, offsets
