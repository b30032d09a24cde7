"""Plan -> launches, NCHW layout: ``launch_specs`` (the whole forward in plan order: the direct convs of
families/direct_nchw.py and their split-K reduction, families/winograd_nchw.py's three launches, pools, the FC,
softmax) and ``Launch`` (a spec bound to its loaded kernel). Each launch is its family's builder's; the NHWC layout's
are launch_nhwc.py's, which reuses the FC and softmax ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...plan import ConvOp, FCOp, GlobalAvgPoolOp, Plan, PoolOp
from .cost_model import ConvConfig
from .families.direct_nchw import batch_stride, conv_specs, view_ptr
from .families.fc import fc_specs
from .families.pool import gap_spec, pool_spec
from .families.softmax import softmax_spec
from .families.spec import LaunchSpec
from .families.winograd_nchw import winograd_specs
from .kernels import launch_async
from .params import transforms_key
from .workspace import counter_layout, workspace_layout

__all__ = ["LaunchSpec", "batch_stride", "conv_specs", "fc_specs", "gap_spec", "pool_spec", "softmax_spec",
           "view_ptr", "winograd_specs"]


@dataclass(frozen=True)
class Launch:
    spec: LaunchSpec
    func: Any  # prepared pycuda Function

    def __call__(self, stream: Any) -> None:
        launch_async(self.func, self.spec.grid, self.spec.block, stream, *self.spec.args, shared=self.spec.shared)


def launch_specs(plan: Plan, configs: dict[str, ConvConfig | None], arena: int, params: int,
                 offsets: dict[str, int], ws: int, probs: int | None = None,
                 counters: int | None = None) -> list[LaunchSpec]:
    """The whole forward as launches, in plan order. ws: the workspace of split-K and Winograd convs
    (``workspace_layout``'s size);
    probs: where softmax writes, None for logits only; counters: zeroed tile counters (``counter_layout``'s size)
    for split-K by _fixup kernels, None for conv_splitk_reduce."""
    specs: list[LaunchSpec] = []
    ws_offsets = workspace_layout(plan, configs)[1]
    counter_offsets = counter_layout(plan, configs)[1]
    for op in plan.ops:
        if isinstance(op, (ConvOp, FCOp)):
            w, b = params + 4 * offsets[op.name + ".weight"], params + 4 * offsets[op.name + ".bias"]
            ws_op = ws + 4 * ws_offsets.get(op.name, 0)
            cnt = None if counters is None else counters + 4 * counter_offsets.get(op.name, 0)
        if isinstance(op, ConvOp):
            cfg = configs[op.name]
            assert cfg is not None
            if cfg.wino:
                bt, at = (params + 4 * offsets[f"{transforms_key(op, cfg)}.{k}"] for k in ("bt", "at"))
                specs += winograd_specs(op, True, cfg, arena, w, b, bt, at, ws_op)
                continue
            specs += conv_specs(op.name, op.src, op.dst, op.kernel, op.stride, op.pad, True, cfg, arena, w, b, ws_op,
                                cnt)
        elif isinstance(op, PoolOp):
            specs.append(pool_spec(op, arena))
        elif isinstance(op, GlobalAvgPoolOp):
            specs.append(gap_spec(op, arena))
        elif isinstance(op, FCOp):
            specs += fc_specs(op, configs[op.name], arena, w, b, ws_op, cnt)
    if probs is not None:
        specs.append(softmax_spec(plan.output, arena, probs))
    return specs
