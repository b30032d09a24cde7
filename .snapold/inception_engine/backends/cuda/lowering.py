"""Lowering: a plan, its convs' configs and the facts of a GPU as the CUDA backend's launches, a pure function
(``lower``): no driver call, nothing allocated, so it runs and is tested on the CPU.

Every launch is chosen from the one table of kernel families (families/) by the layout's plan walk (launch.py for
NCHW, launch_nhwc.py for NHWC). Device addresses stay symbolic: a ``Ref`` names a buffer of ``Lowering.words`` and a
byte offset into it, and the backend, once it has allocated the buffers, turns each spec into plain numbers
(``resolve``). So the backend allocates, uploads, captures and replays, and decides nothing about launches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ...plan import GlobalAvgPoolOp, Plan
from .cost_model import ConvConfig
from .families.conv_nhwc import weight_setup_specs
from .families.spec import LaunchSpec
from .int8_scales import Int8Scales
from .launch import launch_specs, view_ptr
from .launch_nhwc import nhwc_launch_specs, nhwc_side, tma_map_layout
from .tiles import NAN_BITS, NHWC_ELEMS
from .workspace import counter_layout, workspace_layout


@dataclass(frozen=True)
class Ref:
    """A device address by name: ``offset`` bytes into the buffer ``buffer`` (a key of ``Lowering.words``). Adding
    bytes to it gives another Ref, so the families' builders compute addresses as they would from a number."""

    buffer: str
    offset: int = 0

    def __add__(self, other: int) -> Ref:
        return Ref(self.buffer, self.offset + other)

    __radd__ = __add__

    def resolve(self, bases: Mapping[str, int]) -> int:
        return bases[self.buffer] + self.offset


@dataclass(frozen=True)
class GpuFacts:
    """What lowering needs to know of the GPU: SMs the persistent tiles spread over (the GPU's, less any margin
    left to other work) and whether it has the wgmma tiles (cuda_build.has_wgmma)."""

    num_sms: int
    wgmma: bool


@dataclass(frozen=True)
class Lowering:
    """The launches of one forward, and the buffers they name: 32-bit words of each, in allocation order, and the
    word each starts filled with where it must (NaN in the activations, so that a read of what was never written
    shows; zeroed tile counters)."""

    specs: tuple[LaunchSpec, ...]
    words: dict[str, int]
    fill: dict[str, int]
    input: Ref  # where the (batch, 3, size, size) float32 input goes
    output: Ref  # where the (batch, classes) logits or probabilities come out
    features: Ref  # where the global average pool's (batch, channels) float32 output is once the forward is done
    setup: tuple[LaunchSpec, ...] = ()  # run once, after the parameters are uploaded and before any forward


def resolve_spec(spec: LaunchSpec, bases: Mapping[str, int]) -> LaunchSpec:
    """The launch with every Ref among its arguments and tensor maps' addresses made a device address."""
    def value(a: int | Ref) -> int:
        return a.resolve(bases) if isinstance(a, Ref) else a

    maps = tuple(replace(m, address=value(m.address)) for m in spec.maps)
    return replace(spec, args=tuple(value(a) for a in spec.args), maps=maps)


def lower(plan: Plan, configs: Mapping[str, ConvConfig | None], precision: str, nhwc: bool, gpu: GpuFacts,
          params: Mapping[str, int], params_words: int, softmax: bool = False, fixup: bool = False,
          int8: Int8Scales | None = None) -> Lowering:
    """The forward of ``plan`` with these configs as launches over symbolic buffers: "arena" (activations), "side"
    (NHWC: the float32 input, features and logits), "params" (``params``: each key's element offset, as
    params.pack_params lays them out in ``params_words``), "ws" (split-K and Winograd), "probs" (softmax),
    "counters" (fixup's tile counters), "maps" (the TMA tiles' tensor maps). int8: precision "int8"'s scales (the
    calibration, as the launches take it). Its ``setup``: what the uploaded parameters need once (the fp32 tiles'
    weights split into fp16 halves)."""
    configs = dict(configs)
    words: dict[str, int] = {}
    fill: dict[str, int] = {}
    if nhwc:  # fp16: two activations per float32 word, int8 four (arena_elems is a multiple of ALIGN)
        elem = NHWC_ELEMS[precision]
        words["arena"], fill["arena"] = plan.arena_elems * elem.bytes // 4, elem.nan_word
        side = nhwc_side(plan)
        words["side"], fill["side"] = side.elems, NAN_BITS
    else:
        words["arena"], fill["arena"] = plan.arena_elems, NAN_BITS
    words["params"] = params_words
    words["ws"] = workspace_layout(plan, configs)[0]
    n_counters = counter_layout(plan, configs)[0]
    probs = Ref("probs") if softmax else None
    if softmax:
        words["probs"] = plan.batch * plan.output.channels
    counters = Ref("counters") if fixup and n_counters else None
    if counters is not None:
        words["counters"], fill["counters"] = n_counters, 0
    arena, par, ws = Ref("arena"), Ref("params"), Ref("ws")
    if nhwc:
        map_bytes = tma_map_layout(plan, configs)[0]
        if map_bytes:
            words["maps"] = math.ceil(map_bytes / 4)
        specs = nhwc_launch_specs(plan, configs, arena, Ref("side"), par, dict(params), ws, probs, precision,
                                  max(1, gpu.num_sms), Ref("maps") if map_bytes else 0, int8)
        setup = [s for op in plan.conv_ops if (cfg := configs[op.name]) is not None
                 for s in weight_setup_specs(op, cfg.tile, par + 4 * params[op.name + ".weight"])]
        return Lowering(tuple(specs), words, fill, Ref("side", 4 * side.input),
                        probs or Ref("side", 4 * side.logits), Ref("side", 4 * side.features), tuple(setup))
    specs = launch_specs(plan, configs, arena, par, dict(params), ws, probs, counters)
    # NCHW: the pool's output is an arena buffer of its own, (N, C, 1, 1) contiguous, which the FC reads last
    gap = next(op for op in plan.ops if isinstance(op, GlobalAvgPoolOp))
    return Lowering(tuple(specs), words, fill, view_ptr(arena, plan.input), probs or view_ptr(arena, plan.output),
                    view_ptr(arena, gap.dst))
