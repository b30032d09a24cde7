"""Plan -> launches, NHWC layout (the default for tf32 and fp16 everywhere, and for fp32 on sm_90a): whether a plan
fits the layout (``check_nhwc``), where things are (``nhwc_ptr``, the float32 side buffer ``nhwc_side``), and the
launches (``nhwc_launch_specs``): conv_nhwc_*.cu's tile of each conv's config (mma.sync, wgmma, warp-specialized or
halo; the grid per kind, the block and dynamic shared memory the kernel's registry entry's, kernels.spec),
conv_input_nhwc.cu for the convs that read the input, pool_nhwc.cu's pools, then launch.py's FC and softmax on the
float32 features."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import EngineError
from ...plan import ConvOp, FCOp, GlobalAvgPoolOp, Plan, PoolOp, View, align, writes
from .cost_model import ConvConfig
from .families.conv_nhwc import nhwc_conv_specs, nhwc_parts, nhwc_ptr, tma_maps
from .families.fc import fc_specs
from .families.pool_nhwc import nhwc_gap_spec, nhwc_pool_spec
from .families.softmax import softmax_spec
from .families.spec import LaunchSpec
from .int8_scales import Int8Scales
from .tiles import INPUT_MAX_K, INPUT_MMA_TILE, INPUT_TILE, NHWC_PIECE, is_tma
from .tensor_maps import MAP_BYTES
from .workspace import workspace_layout

__all__ = ["nhwc_conv_specs", "nhwc_parts", "nhwc_pool_spec", "nhwc_ptr", "tma_maps"]


# --- the NHWC path (CudaBackend(nhwc=True), fp16 or tf32) -----------------------------------------------------------
# Activations are fp16, or float32 rounded to TF32 (NHWC_ELEMS), in NHWC buffers at the plan's offsets (counted in
# elements): element (n, c, h, w) of a view is arena[offset + ((n * H + h) * W + w) * C_total + c_offset + c].
# The float32 NCHW input stays as uploaded, in a
# small float32 side buffer, and the convs that read it are conv_input_nhwc.cu's; the global average pool writes
# float32 features to the side buffer, and the FC and softmax run on them as in the other modes.


@dataclass(frozen=True)
class NhwcSide:
    """Element offsets in the float32 side buffer of the NHWC path."""

    input: int  # the float32 NCHW input as uploaded
    features: int  # the global average pool's output, (N, C)
    logits: int  # (N, classes)
    elems: int


def nhwc_side(plan: Plan) -> NhwcSide:
    gap = next(op for op in plan.ops if isinstance(op, GlobalAvgPoolOp))
    n_in, n_feat = align(math.prod(plan.input.dims)), align(math.prod(gap.dst.dims))
    return NhwcSide(0, n_in, n_in + n_feat, n_in + n_feat + align(math.prod(plan.output.dims)))


def check_nhwc(plan: Plan, piece: int = NHWC_PIECE) -> None:
    """conv_nhwc.cuh and pool_nhwc.cu move 16-byte pieces: every view but the input's needs channel counts, buffer
    widths and channel offsets that are multiples of ``piece`` (8; the int8 path's pieces are 16 channels), and
    fewer than 2^31 elements per buffer (conv_nhwc_*.cu's 32-bit offsets); the input feeds convs only, each with
    at most INPUT_MAX_K weights per output channel (conv_input_nhwc.cu's shared memory); exactly one GAP and one FC
    end the network."""
    per_image, widest = 0, ""  # the most elements per image of an NHWC view, and its buffer
    for op in plan.ops:
        for v in (op.src, *writes(op)):
            if v.buffer == plan.input.buffer:
                if not isinstance(op, ConvOp) or v is op.dst:
                    raise EngineError(f"{op.name}: the NHWC path feeds the input to convolutions only")
                k = op.src.channels * op.kernel[0] * op.kernel[1]
                if k > INPUT_MAX_K:
                    raise EngineError(f"{op.name}: the NHWC path's first convolution takes at most {INPUT_MAX_K} "
                                      f"inputs per output (this one {k}); use the default layout")
                continue
            if isinstance(op, FCOp) or (isinstance(op, GlobalAvgPoolOp) and v is op.dst):
                continue
            if v.channels % piece or v.c_total % piece or v.c_offset % piece:
                raise EngineError(f"{op.name}: the NHWC path needs channel counts and offsets that are multiples "
                                  f"of {piece} ({v.buffer} has {v.channels} at {v.c_offset} of {v.c_total}); "
                                  f"use the default layout")
            if v.h * v.w * v.c_total > per_image:
                per_image, widest = v.h * v.w * v.c_total, v.buffer
    if plan.batch * per_image >= 2**31:
        raise EngineError(f"batch {plan.batch} is too large for the NHWC path ({widest} would hold "
                          f"{plan.batch * per_image:,} elements, and its kernels index below 2^31); use a batch of at "
                          f"most {(2**31 - 1) // per_image}")
    kinds = [type(op) for op in plan.ops]
    if kinds.count(GlobalAvgPoolOp) != 1 or kinds.count(FCOp) != 1 or kinds[-2:] != [GlobalAvgPoolOp, FCOp]:
        raise EngineError("the NHWC path needs a network that ends in one global average pool and one FC layer")


def nhwc_fits(plan: Plan, piece: int = NHWC_PIECE) -> bool:
    try:
        check_nhwc(plan, piece)
    except EngineError:
        return False
    return True


def tma_map_layout(plan: Plan, configs: dict[str, ConvConfig | None]) -> tuple[int, dict[str, int]]:
    """(bytes of tensor maps, byte offset of each TMA conv's two): one 256-byte slot per conv on a TMA tile."""
    names = [op.name for op in plan.conv_ops if (c := configs.get(op.name)) is not None and is_tma(c.tile.prefix)]
    return 2 * MAP_BYTES * len(names), {name: 2 * MAP_BYTES * i for i, name in enumerate(names)}


def nhwc_launch_specs(plan: Plan, configs: dict[str, ConvConfig | None], arena: int, side: int, params: int,
                      offsets: dict[str, int], ws: int, probs: int | None = None,
                      precision: str = "fp16", num_sms: int | None = None, maps: int = 0,
                      int8: Int8Scales | None = None) -> list[LaunchSpec]:
    """The whole NHWC forward as launches, in plan order. arena: the NHWC activations of the precision's elements
    (the plan's offsets in elements); side: the float32 side buffer (``nhwc_side``); num_sms: the GPU's, the grid of
    the persistent tiles (``nhwc_conv_specs``); maps: ``tma_map_layout``'s bytes, where the TMA convs' tensor maps
    go (the caller encodes each spec's ``maps`` there); int8: the scales of an int8 forward (precision "int8"),
    which the stem's quantizing store, the pools' requantization and the global pool's dequantization take as
    arguments (the convs' are in their parameters: params.pack_params)."""
    assert (precision == "int8") == (int8 is not None), "an int8 forward needs its scales, and only it"
    lay = nhwc_side(plan)
    specs: list[LaunchSpec] = []
    ws_offsets = workspace_layout(plan, configs)[1]
    map_offsets = tma_map_layout(plan, configs)[1]
    features = logits = None
    for op in plan.ops:
        if isinstance(op, (ConvOp, FCOp)):
            wp, bp = params + 4 * offsets[op.name + ".weight"], params + 4 * offsets[op.name + ".bias"]
            ws_op = ws + 4 * ws_offsets.get(op.name, 0)
        if isinstance(op, ConvOp):
            cfg = configs[op.name]
            reads_input = op.src.buffer == plan.input.buffer
            assert cfg is not None and (cfg.tile in (INPUT_TILE, INPUT_MMA_TILE)) == reads_input, \
                f"{op.name}: not an NHWC config"
            x = side + 4 * lay.input if reads_input else nhwc_ptr(arena, op.src, precision)
            specs += nhwc_conv_specs(op, cfg, x, op.src.c_total, op.src.channels,
                                     nhwc_ptr(arena, writes(op)[0], precision), wp, bp, ws_op, precision, num_sms,
                                     maps + map_offsets[op.name] if op.name in map_offsets else 0,
                                     float(int8.inv(op.name)) if int8 is not None and reads_input else 1.0)
        elif isinstance(op, PoolOp):
            bias = params + 4 * offsets[op.bias + ".bias"] if op.bias else 0
            ratio = {} if int8 is None else {"ratio": float(int8.pool_ratio(op))}
            specs.append(nhwc_pool_spec(op, arena, precision, bias, **ratio))
        elif isinstance(op, GlobalAvgPoolOp):
            features = View("features", lay.features, op.dst.dims, 0, op.src.channels)
            scale = {} if int8 is None else {"scale": float(int8.gap_scale(op))}
            specs.append(nhwc_gap_spec(op, arena, side + 4 * lay.features, precision, **scale))
        elif isinstance(op, FCOp):
            assert features is not None
            logits = View("logits", lay.logits, op.dst.dims, 0, op.dst.channels)
            fc_op = FCOp(op.name, features, logits)
            specs += fc_specs(fc_op, configs[op.name], side, wp, bp, ws_op)
    if probs is not None:
        assert logits is not None
        specs.append(softmax_spec(logits, side, probs))
    return specs
