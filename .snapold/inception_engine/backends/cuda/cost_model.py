"""The cost model: each conv's tile, split-K and Winograd-or-not when nothing was measured (``choose_configs``), and
``ConvConfig``, the record of that choice that tuning, parameter packing and the launch specs all read.

Times are microseconds from a few constants (waves of blocks at each tile's model speed, split-K traffic, HBM
streaming for Winograd); they only rank variants against each other. The default ``cuda`` backend measures instead
(backend.tune_configs) and uses the model only for what it did not time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import EngineError
from ...plan import ConvOp, FCOp, Plan
from .tiles import (HALO_CIN, KERNEL_SIZES, NHWC_ELEMS, PRECISIONS, TILES, TILES_OF, WINO_TILES, Tile,
                    check_nhwc_precision, input_tile, is_halo, is_tma, tile_fits)
from .winograd import WINO_MIN_BATCH, WINO_VARIANTS, WinogradShape, winograd_eligible, winograd_shape


# Cost model of one conv launch (microseconds), used only to rank variants against each other.
WAVE_OVERHEAD_US = 1.0  # first loads and final stores of each wave of blocks
REDUCE_FIXED_US = 2.0  # the split-K reduction as one more kernel (conv_splitk_reduce)
FIXUP_FIXED_US = 0.5  # the split-K reduction by the last block of each tile (_fixup kernels): no launch
FIXUP_SLICE_US = 0.3  # ... which reads the slices one after another, an L2 round trip each
REDUCE_BYTES_PER_US = 2.0e6  # partial sums written and read back through L2, ~2 TB/s
MIN_K_SPLIT = 64  # a K slice shorter than this spends more on prologue and reduction than it saves
MAX_SPLITS = 64
LAUNCH_US = 2.0  # one more kernel in the forward (Winograd's two transforms)
HBM_BYTES_PER_US = 3.0e6  # what a streaming kernel gets of the H200's 4.8 TB/s (model, not measured)
# Winograd is chosen only where the model puts it below this fraction of the direct conv's time: its GEMM speed
# and HBM rate are assumptions, and three launches with ~10x the memory traffic risk more than one.
WINO_MARGIN = 0.8


@dataclass(frozen=True)
class ConvConfig:
    tile: Tile
    splits: int  # K slices (blockIdx.z); > 1 writes partial sums to the workspace, then conv_splitk_reduce
    k_split: int  # K per slice, a multiple of tile.bk
    est_us: float
    wino: int = 0  # Winograd with output tile m = wino (``winograd_tile``; tile: winograd.cu's GEMM; splits, k_split:
    # its split-K over Cin, whose slices the output transform sums); 0: direct


def conv_config(cout: int, n_total: int, k_total: int, num_sms: int, fixup: bool = True,
                tiles: tuple[Tile, ...] = TILES, max_splits: int = MAX_SPLITS,
                fused_reduce: bool = False) -> ConvConfig:
    """The (tile, split-K) pair the cost model ranks fastest for C[cout, n_total] with reduction depth k_total.

    Time = waves of blocks x (work of one block at 1/resident of an SM) + split-K traffic and reduction (fixup, for
    tiles that have it: in the conv kernel, see conv.cu; fused_reduce: by the next kernel, which reads the slices
    anyway, as winograd.cu's output transform; else a separate conv_splitk_reduce launch). A lone block
    per SM is charged as much as a full SM, so few large blocks (batch 1 on 17x17 and 8x8 grids) lose to more,
    thinner ones.
    """
    best: ConvConfig | None = None
    for tile in tiles:
        tiles = math.ceil(cout / tile.bm) * math.ceil(n_total / tile.bn)
        seen = set()
        for want in range(1, (1 if is_halo(tile.prefix) else max_splits) + 1):  # the halo tiles: no split-K
            k_split = math.ceil(math.ceil(k_total / want) / tile.bk) * tile.bk
            if want > 1 and k_split < MIN_K_SPLIT:
                break
            splits = math.ceil(k_total / k_split)
            if splits in seen:
                continue
            seen.add(splits)
            waves = math.ceil(tiles * splits / (num_sms * tile.resident))
            us = waves * (tile.bm * tile.bn * k_split * tile.resident / tile.macs_per_us + WAVE_OVERHEAD_US)
            if splits > 1:
                us += 4 * (2 * splits + 1) * cout * n_total / REDUCE_BYTES_PER_US
                if not fused_reduce:
                    us += (FIXUP_FIXED_US + FIXUP_SLICE_US * splits) if fixup and tile.fixup else REDUCE_FIXED_US
            if best is None or us < best.est_us:
                best = ConvConfig(tile, splits, k_split, us)
    assert best is not None
    return best


def config_shape(op: ConvOp, cfg: ConvConfig) -> WinogradShape:
    """The shape of a Winograd config's work: its output tile, T padded to its GEMM tile's width."""
    return winograd_shape(op, cfg.wino, cfg.tile.bn)


def winograd_config(op: ConvOp, m: int, num_sms: int) -> ConvConfig:
    """Winograd with output tile m for ``op``, timed by the model as three streaming passes over HBM: the input
    transform (read x, write V), the batched GEMM (conv_config's compute model for its nn x ceil(O/BM) x Tp/BN
    blocks and split-K over Cin, whose slices the output transform sums; or its V and M traffic if that takes
    longer) and the output transform (read M, write y), plus two launches; for each GEMM tile, T padded to its BN.
    V and M are assumed to miss L2 (they do at batch >= 8 on the big maps), so small layers come out pessimistic.
    The same model for every kernel shape: the transforms' arithmetic (up to 9 x 9 multiply-adds per value) is
    assumed hidden under their memory traffic."""
    cin, cout = op.src.channels, op.dst.channels
    x_bytes = 4 * op.src.n * cin * op.src.h * op.src.w
    y_bytes = 4 * op.dst.n * cout * op.dst.h * op.dst.w
    best: ConvConfig | None = None
    for tile in WINO_TILES:
        ws = winograd_shape(op, m, tile.bn)
        gemm = conv_config(cout, ws.nn * ws.t_pad, cin, num_sms, fixup=False, tiles=(tile,), fused_reduce=True)
        v_bytes, m_bytes = 4 * ws.nn * cin * ws.t_pad, 4 * ws.nn * cout * ws.t_pad
        us = ((x_bytes + v_bytes) / HBM_BYTES_PER_US + max(gemm.est_us, (v_bytes + m_bytes) / HBM_BYTES_PER_US)
              + (m_bytes + y_bytes) / HBM_BYTES_PER_US + 2 * LAUNCH_US)
        if best is None or us < best.est_us:
            best = ConvConfig(tile, gemm.splits, gemm.k_split, us, m)
    assert best is not None
    return best


def uses_gemv(op: FCOp) -> bool:
    """fc_gemv at batch 1 (float4 loads: in_features % 4 == 0 and a 16-byte aligned input); else the GEMM."""
    src = op.src
    return src.n == 1 and src.channels % 4 == 0 and (src.offset + src.c_offset * src.h * src.w) % 4 == 0


def model_takes(op: ConvOp, tile: Tile) -> bool:
    """Whether the model may pick this tile for this conv unmeasured. Halo tiles only on single-plane inputs (Cin =
    HALO_CIN, the stem's 2a and 2b, where they win): on wider inputs the model, which does not see their set-up
    (weights copied per block, halo rows beyond the tile) nor their shared-memory bound, would pick them for most
    35x35 and 17x17 layers, and the untuned forward would be slower. TMA tiles never: their model speeds are guesses.
    Tuning measures every tile everywhere it fits."""
    if is_tma(tile.prefix):
        return False
    return not is_halo(tile.prefix) or op.src.channels == HALO_CIN


def choose_configs(plan: Plan, num_sms: int, fixup: bool = True, precision: str = "fp32",
                   winograd: bool | None = None, tiles: tuple[Tile, ...] | None = None,
                   nhwc: bool = False, wgmma: bool = False) -> dict[str, ConvConfig | None]:
    """Conv op name -> its config; the FC -> None (fc_gemv) or the config of the 1x1-conv GEMM that replaces it.
    fixup: split-K convs reduce in the kernel where the tile has a _fixup variant (else with conv_splitk_reduce).
    precision: "tf32" / "fp16" pick conv_tf32.cu's / conv_f16.cu's tiles for the direct GEMMs (convs and the
    FC-as-GEMM); tiles: a subset of them instead (scripts/tune_tiles.py times one tile at a time).
    winograd: for the stride-1 convs of WINO_VARIANTS' shapes, None lets the cost model choose between the direct
    kernel and each Winograd tile (``winograd_config``; Winograd below WINO_MARGIN of the direct time, from
    WINO_MIN_BATCH up), True takes the fastest Winograd tile, False the direct kernel. The Winograd GEMMs are FFMA
    in every precision, and the choice is made against the FFMA direct kernel in every precision too: the
    tensor-core tiles' model speeds are uncalibrated guesses, while measured (H100, batch 128) the Winograd layers
    run 1.5-3x faster than FFMA direct and the tensor-core kernels only 1.44x on the whole forward.
    nhwc: every conv on conv_nhwc_*.cu (tiles: a subset of the precision's NHWC_ELEMS tiles, with the wgmma ones if
    wgmma), no Winograd, except those that read the network's input (conv_input_nhwc.cu, ``input_tile``); the FC as
    without nhwc. int8 (NHWC, wgmma only): the FC on fp32's tiles (TILES_OF: it reads float32 features)."""
    if precision not in TILES_OF:
        raise EngineError(f"the cuda backend has no {precision!r} mode; choose one of {', '.join(PRECISIONS)}")
    if nhwc:
        check_nhwc_precision(precision, wgmma)
    asked = tiles is not None  # a subset asked for (tuning, tune_tiles.py), else the model's own choice
    conv_tiles = tiles or (NHWC_ELEMS[precision].tiles(wgmma) if nhwc else TILES_OF[precision])
    tiles = TILES_OF[precision] if nhwc else conv_tiles
    configs: dict[str, ConvConfig | None] = {}
    for op in plan.ops:
        if isinstance(op, ConvOp) and nhwc:
            reads_input = op.src.buffer == plan.input.buffer
            # the tiles asked for, or the model's own choice among those it trusts; a set of tiles none of which
            # computes this conv (a halo tile alone, in tuning) leaves it to the model
            fit = tuple(t for t in conv_tiles if tile_fits(op, t) and (asked or model_takes(op, t))) or tuple(
                t for t in NHWC_ELEMS[precision].tiles(wgmma) if tile_fits(op, t) and model_takes(op, t))
            configs[op.name] = conv_config(op.dst.n * op.dst.h * op.dst.w, op.dst.channels,
                                           op.src.channels * op.kernel[0] * op.kernel[1], num_sms, False,
                                           (input_tile(op, precision),) if reads_input else fit,
                                           1 if reads_input else MAX_SPLITS)
        elif isinstance(op, ConvOp):
            if op.kernel not in KERNEL_SIZES:
                raise EngineError(f"{op.name}: no CUDA kernel for a {op.kernel[0]}x{op.kernel[1]} convolution "
                                  f"(have {', '.join(f'{a}x{b}' for a, b in KERNEL_SIZES)})")
            k_total = op.src.channels * op.kernel[0] * op.kernel[1]
            n_total = op.dst.n * op.dst.h * op.dst.w
            cfg = conv_config(op.dst.channels, n_total, k_total, num_sms, fixup, tiles)
            if winograd is not False and winograd_eligible(op):
                wino = min((winograd_config(op, m, num_sms) for m in WINO_VARIANTS[op.kernel]),
                           key=lambda c: c.est_us)
                ffma = cfg if precision == "fp32" else conv_config(op.dst.channels, n_total, k_total, num_sms, fixup)
                gain = wino.est_us < WINO_MARGIN * ffma.est_us and op.dst.n >= WINO_MIN_BATCH[op.kernel]
                if winograd or gain:
                    cfg = wino
            configs[op.name] = cfg
        elif isinstance(op, FCOp):
            configs[op.name] = None if uses_gemv(op) else conv_config(op.dst.channels, op.dst.n, op.src.channels,
                                                                      num_sms, fixup, tiles)
    return configs
