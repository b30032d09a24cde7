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
from ...plan import ConvOp, FCOp, FusedConvOp, GlobalAvgPoolOp, Plan, PoolOp, View, align, writes
from .cost_model import ConvConfig
from .kernels import spec
from .launch import LaunchSpec, fc_specs, softmax_spec
from .tiles import (INPUT_MAX_K, INPUT_MMA_TILE, INPUT_TILE, NHWC_ELEMS, NHWC_PIECE, blocks, conv_kernel, halo_fits,
                    input_mma_blocks, input_tile, is_halo, is_tma, is_ws, tile_fits)
from .tensor_maps import MAP_BYTES, Im2colMap, TensorMap, TiledMap
from .workspace import workspace_layout


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


def check_nhwc(plan: Plan) -> None:
    """conv_nhwc.cuh and pool_nhwc.cu move 16-byte pieces: every view but the input's needs channel counts, buffer
    widths and channel offsets that are multiples of 8, and fewer than 2^31 elements per buffer (conv_nhwc_*.cu's
    32-bit offsets); the input feeds convs only, each with at most INPUT_MAX_K weights per output channel
    (conv_input_nhwc.cu's shared memory); exactly one GAP and one FC end the network."""
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
            if v.channels % NHWC_PIECE or v.c_total % NHWC_PIECE or v.c_offset % NHWC_PIECE:
                raise EngineError(f"{op.name}: the NHWC path needs channel counts and offsets that are multiples "
                                  f"of {NHWC_PIECE} ({v.buffer} has {v.channels} at {v.c_offset} of {v.c_total}); "
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


def nhwc_fits(plan: Plan) -> bool:
    try:
        check_nhwc(plan)
    except EngineError:
        return False
    return True


def nhwc_ptr(base: int, v: View, precision: str = "fp16") -> int:
    """Device address of the view's first channel of pixel 0, in an NHWC arena of the precision's elements."""
    return base + NHWC_ELEMS[precision].bytes * (v.offset + v.c_offset)


def nhwc_parts(op: ConvOp) -> tuple[int, ...]:
    """conv_nhwc.cuh's parts arguments (its header): start, element offset from part 0 and pixel stride of parts
    1-3, then relu_end. A plain conv has one part; a fused conv's (plan.FusedConvOp) follow its members."""
    cout = op.dst.channels
    if not isinstance(op, FusedConvOp):
        return (cout, 0, 0) * 3 + (cout,)
    assert 1 <= len(op.parts) <= 4, f"{op.name}: conv_nhwc.cuh writes at most 4 parts, not {len(op.parts)}"
    base, start, rest = op.parts[0].offset + op.parts[0].c_offset, op.parts[0].channels, []
    for v in op.parts[1:]:
        rest.append((start, v.offset + v.c_offset - base, v.c_total))
        start += v.channels
    rest += [(cout, 0, 0)] * (3 - len(rest))
    relu_end = sum(v.channels for v in op.parts[:len(op.parts) - op.pooled])
    return tuple(x for part in rest for x in part) + (relu_end,)


def nhwc_conv_specs(op: ConvOp, cfg: ConvConfig, x: int, x_cstride: int, cin: int, y: int, w: int, b: int,
                    ws: int, precision: str = "fp16", num_sms: int | None = None, maps: int = 0) -> list[LaunchSpec]:
    """conv_nhwc_*.cu's launch (x, y: ``nhwc_ptr`` addresses; y that of the first part of a fused conv; x that of the
    pool's input for a conv that reads through a max pool, its stride the pool's), and its
    split-K reduction when cfg.splits > 1; for INPUT_TILE and INPUT_MMA_TILE conv_input_nhwc.cu's, x then the float32
    NCHW input (x_cstride unused). A warp-specialized or halo tile's blocks loop over the tiles: num_sms of them (one an
    SM; a halo tile's split between its channel tiles, grid.y), or one per tile where there are fewer or num_sms is
    None. A TMA tile reads its two tensor maps (the spec's ``maps``, which the caller encodes there) from `maps`."""
    n, _, h, wd = op.src.dims
    _, cout, ho, wo = op.dst.dims
    y_cstride = writes(op)[0].c_total
    p_total, t, suffix = n * ho * wo, cfg.tile, NHWC_ELEMS[precision].suffix
    if t in (INPUT_TILE, INPUT_MMA_TILE):
        assert cfg.splits == 1 and not isinstance(op, FusedConvOp), f"{op.name}: conv_input_nhwc: 1 slice, 1 part"
        args = (x, w, b, y, n, cin, h, wd, cout, ho, wo, op.dst.c_total, *op.kernel, op.stride, *op.pad, 1)
        if t == INPUT_TILE:
            return [LaunchSpec.of(op.name, spec(f"conv_input_nhwc{suffix}"),
                                  (blocks(p_total, t.bm), blocks(cout, t.bn), 1), args)]
        assert t == input_tile(op, precision), f"{op.name}: not a conv for conv_input_mma_nhwc{suffix}"
        grid = (input_mma_blocks(op, num_sms), blocks(cout, t.bn), 1)
        return [LaunchSpec.of(op.name, spec(f"conv_input_mma_nhwc{suffix}"), grid, args, op)]
    split = cfg.splits > 1
    parts = nhwc_parts(op)
    args = (x, w, b, ws if split else y, n, cin, h, wd, x_cstride, cout, ho, wo, y_cstride, *op.kernel,
            op.stride, *op.pad, cfg.k_split, *parts)
    assert t in NHWC_ELEMS[precision].tiles(True), f"{op.name}: {t.prefix} {t.name} is not a {precision} NHWC tile"
    assert tile_fits(op, t), f"{op.name}: {t.prefix} {t.name} does not compute it"
    kernel = conv_kernel(op, t)
    grid = (blocks(p_total, t.bm), blocks(cout, t.bn), cfg.splits)
    # halo tiles (conv_nhwc_halo.cu): tiles of t.bm positions of each image's padded-width grid, by channel tiles
    if is_halo(kernel):
        assert halo_fits(op, t) and not split and cin == op.src.channels, f"{op.name}: not a conv for {kernel}"
        wg, channel_tiles = wd + 2 * op.pad[1], blocks(cout, t.bn)
        tiles = n * blocks(ho * wg, t.bm)
        per_channel_tile = tiles if num_sms is None else max(1, num_sms // channel_tiles)
        grid = (min(tiles, per_channel_tile), channel_tiles, 1)
    elif is_ws(kernel):
        tiles = math.prod(grid)
        grid = (min(tiles, num_sms or tiles), 1, 1)
    tensor_maps: tuple[TensorMap, ...] = ()
    if is_tma(kernel):
        assert maps, f"{op.name}: a TMA tile needs the address of its tensor maps"
        args += (maps,)
        tensor_maps = tma_maps(op, cfg, x, x_cstride, w, NHWC_ELEMS[precision].bytes)
    specs = [LaunchSpec.of(op.name, spec(kernel), grid, args, op, tensor_maps)]
    if split:
        reduce = spec(f"conv_nhwc{suffix}_splitk_reduce")  # a thread a pair of channels
        specs.append(LaunchSpec.of(op.name, reduce, (reduce.blocks(p_total * cout // 2), 1, 1),
                                   (ws, b, y, cfg.splits, p_total, cout, y_cstride, *parts)))
    return specs


def tma_maps(op: ConvOp, cfg: ConvConfig, x: int, x_cstride: int, w: int, elem_bytes: int) -> tuple[TensorMap, ...]:
    """A TMA tile's two maps (conv_nhwc_ws.cu's header): the input view as im2col boxes of BM window corners x BK
    channels, the weights w[Cout][K] as boxes of BN rows x BK."""
    (n, cin, h, wd), (_, cout, ho, wo) = op.src.dims, op.dst.dims
    (kh, kw), s, (ph, pw), t = op.kernel, op.stride, op.pad, cfg.tile
    im2col = Im2colMap(x, elem_bytes, (cin, wd, h, n), x_cstride, (-pw, -ph),
                       ((wo - 1) * s - pw - (wd - 1), (ho - 1) * s - ph - (h - 1)), t.bk, t.bm, s)
    return im2col, TiledMap(w, elem_bytes, kh * kw * cin, cout, t.bk, t.bn)


def tma_map_layout(plan: Plan, configs: dict[str, ConvConfig | None]) -> tuple[int, dict[str, int]]:
    """(bytes of tensor maps, byte offset of each TMA conv's two): one 256-byte slot per conv on a TMA tile."""
    names = [op.name for op in plan.conv_ops if (c := configs.get(op.name)) is not None and is_tma(c.tile.prefix)]
    return 2 * MAP_BYTES * len(names), {name: 2 * MAP_BYTES * i for i, name in enumerate(names)}


def nhwc_pool_spec(op: PoolOp, arena: int, precision: str = "fp16", bias: int = 0) -> LaunchSpec:
    """pool_nhwc.cu's pool2d; bias: the device address of op.bias's bias (a moved pool), else 0."""
    assert bool(bias) == bool(op.bias), f"{op.name}: a moved pool needs its conv's bias, and only it"
    n, c, h, w = op.src.dims
    _, _, ho, wo = op.dst.dims
    elem = NHWC_ELEMS[precision]
    k = spec(f"pool2d_nhwc{elem.suffix}")  # a thread a 16-byte piece
    return LaunchSpec.of(op.name, k, (k.blocks(n * ho * wo * c * elem.bytes // 16), 1, 1),
                         (nhwc_ptr(arena, op.src, precision), nhwc_ptr(arena, op.dst, precision), n, c, h, w,
                          op.src.c_total, ho, wo, op.dst.c_total, op.kernel, op.stride, op.pad, int(op.kind == "max"),
                          int(op.count_include_pad), bias))


def nhwc_launch_specs(plan: Plan, configs: dict[str, ConvConfig | None], arena: int, side: int, params: int,
                      offsets: dict[str, int], ws: int, probs: int | None = None,
                      precision: str = "fp16", num_sms: int | None = None, maps: int = 0) -> list[LaunchSpec]:
    """The whole NHWC forward as launches, in plan order. arena: the NHWC activations of the precision's elements
    (the plan's offsets in elements); side: the float32 side buffer (``nhwc_side``); num_sms: the GPU's, the grid of
    the persistent tiles (``nhwc_conv_specs``); maps: ``tma_map_layout``'s bytes, where the TMA convs' tensor maps
    go (the caller encodes each spec's ``maps`` there)."""
    lay = nhwc_side(plan)
    elem = NHWC_ELEMS[precision]
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
                                     maps + map_offsets[op.name] if op.name in map_offsets else 0)
        elif isinstance(op, PoolOp):
            bias = params + 4 * offsets[op.bias + ".bias"] if op.bias else 0
            specs.append(nhwc_pool_spec(op, arena, precision, bias))
        elif isinstance(op, GlobalAvgPoolOp):
            nb, ch, hh, ww = op.src.dims
            features = View("features", lay.features, op.dst.dims, 0, ch)
            gap = spec(f"global_avg_pool_nhwc{elem.suffix}")  # a thread a 16-byte piece of channels
            specs.append(LaunchSpec.of(op.name, gap, (gap.blocks(nb * ch * elem.bytes // 16), 1, 1),
                                       (nhwc_ptr(arena, op.src, precision), side + 4 * lay.features, nb, ch, hh * ww,
                                        op.src.c_total, ch)))
        elif isinstance(op, FCOp):
            assert features is not None
            logits = View("logits", lay.logits, op.dst.dims, 0, op.dst.channels)
            fc_op = FCOp(op.name, features, logits)
            specs += fc_specs(fc_op, configs[op.name], side, wp, bp, ws_op)
    if probs is not None:
        assert logits is not None
        specs.append(softmax_spec(logits, side, probs))
    return specs
