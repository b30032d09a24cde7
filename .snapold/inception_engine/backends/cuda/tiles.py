"""The tile catalogue: every block-tile shape the conv kernels of cuda_src/ instantiate, what the cost model assumes
about each, and which convs a tile can compute.

A ``Tile`` names its kernels (``<prefix>_<KH>x<KW>_<BM>x<BN>`` on NCHW, ``<prefix>_<BM>x<BN>`` on NHWC) and carries
its launch shape (``threads``, a block's) and the model's speed. The families, by source:

- conv.cu (FFMA, fp32 NCHW) ``TILES``, conv_tf32.cu ``TF32_TILES``, conv_f16.cu ``F16_TILES``: ``TILES_OF[precision]``;
- the NHWC conv families, per element type ``NHWC_ELEMS[precision]``: conv_nhwc_mma.cu's mma.sync tiles (fp16, tf32)
  and, on sm_90a, conv_nhwc_wgmma.cu's wgmma tiles (``wgmma_tile``), conv_nhwc_ws.cu's warp-specialized persistent
  ones (``ws_tile``, ``ws_tma_tile``, ``ws_pp_tile``) and conv_nhwc_halo.cu's halo ones (``halo_tile``);
  conv_input_nhwc.cu ``INPUT_TILE`` and ``INPUT_MMA_TILE``;
- winograd.cu's batched GEMM ``WINO_TILES``.

The shared-memory sizes (``wgmma_stages``, ``ws_stages``, ``halo_smem_bytes``, ``wgmma_ring_bytes``) mirror
conv_nhwc_*.cu's functions of the same names, ``input_mma_smem_bytes`` conv_input_nhwc.cu's; a change there is a
change here. The kernel registry (kernels.py) reads each tile's block and dynamic shared memory from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...errors import EngineError
from ...plan import ConvOp


THREADS = 256  # the block of every tile but the warp-specialized, halo and input-mma ones, and common.cuh's IE_THREADS
NAN_BITS = 0x7FC00000  # float32 quiet NaN: the arena starts poisoned, so a read of never-written memory shows

KERNEL_SIZES = ((1, 1), (3, 3), (5, 5), (1, 7), (7, 1), (1, 3), (3, 1))  # conv.cu, conv_tf32.cu instantiate these
PRECISIONS = ("fp32", "tf32", "fp16", "int8")


@dataclass(frozen=True)
class Tile:
    """One block-tile shape of a conv family, its block (threads; its kernels' __launch_bounds__), and what the cost
    model assumes about it."""

    bm: int  # output channels per block
    bn: int  # output pixels per block
    bk: int  # reduction depth per shared-memory stage
    resident: int  # blocks per SM (the kernel's __launch_bounds__ minimum)
    macs_per_us: float  # one SM's multiply-adds per microsecond with `resident` blocks (model, not measured)
    prefix: str = "conv"  # kernel names are <prefix>_<KH>x<KW>_<BM>x<BN>
    fixup: bool = True  # a _fixup variant exists (split-K reduced in the conv kernel)
    threads: int = THREADS  # a block's threads

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}"


TILES = (Tile(128, 128, 8, 2, 180e3), Tile(64, 64, 16, 4, 120e3), Tile(32, 128, 16, 4, 120e3))
# conv_tf32.cu's tiles (warp tiles 64x32, 32x32, 32x16). No _fixup variants: split-K goes through conv_splitk_reduce.
TF32_TILES = (Tile(128, 128, 16, 2, 600e3, "conv_tf32", False), Tile(128, 64, 16, 2, 450e3, "conv_tf32", False),
              Tile(64, 64, 16, 3, 300e3, "conv_tf32", False))
# conv_f16.cu's tiles (fp16 weights and shared tiles, ldmatrix fragments, 32 k per stage; warp tiles as tf32's).
# The cost model keeps the tf32 speeds, which rank tiles and splits against each other only.
F16_TILES = tuple(Tile(t.bm, t.bn, 32, r, t.macs_per_us, "conv_f16", False) for t, r in zip(TF32_TILES, (2, 2, 3)))
TILES_OF = {"fp32": TILES, "tf32": TF32_TILES, "fp16": F16_TILES, "int8": TILES}  # int8's: the FC, on float32 features
# conv_nhwc_*.cu's tiles (NHWC activations, CudaBackend(nhwc=True)). Here bm counts output pixels and bn output
# channels (the GEMM's rows and columns there), so conv_config is called with (pixels, Cout); speeds as fp16's.
NHWC_TILES = (Tile(128, 128, 32, 2, 600e3, "conv_nhwc", False), Tile(128, 64, 32, 2, 450e3, "conv_nhwc", False),
              Tile(64, 128, 32, 2, 450e3, "conv_nhwc", False), Tile(64, 64, 32, 3, 300e3, "conv_nhwc", False),
              Tile(128, 32, 32, 3, 300e3, "conv_nhwc", False))
# The same tiles on TF32 activations: 64-byte shared rows hold 16 k of float32; the model halves the speeds (a
# m16n8k8 .tf32 step does half the work of a m16n8k16 .f16 one).
NHWC_TF32_TILES = tuple(Tile(t.bm, t.bn, 16, t.resident, t.macs_per_us / 2, "conv_nhwc_tf32", False)
                        for t in NHWC_TILES)


def wgmma_stages(bm: int, bn: int, split: bool = False) -> int:
    """conv_nhwc_wgmma.cu's wgmma_stages(): the wgmma tile's ring of stages of BM + BN rows of 64 bytes, in dynamic
    shared memory (wgmma_ring_bytes), two blocks an SM; split: fp32's 3xFP16 tiles, which need WGMMA_LO_TILES sets
    of halves (and whose 128x128 runs one block an SM)."""
    if split:
        return 8 if bn == 128 else 6
    return 4 if bm == 256 else 5 if bn == 192 else 6


WGMMA_LO_TILES = 3  # conv_nhwc_wgmma.cu's: the sets of fp16 halves of the 3xFP16 (fp32) wgmma tiles


# The wgmma tiles' model speeds: multiply-adds per microsecond an SM with 2 blocks resident, fp16 (tf32: half). Fitted
# to per-layer times at batch 128 on an H200 (scripts/tune_tiles.py --precision fp16 --nhwc; the median over the
# layers of what conv_config's formula implies). 128x192 was the fastest tile on 39 of 65 fp16 layers and 42 of 65
# tf32 ones (those with Cout 192 or 384, and Conv2d_4a), 128x128 and 128x64 on most others.
WGMMA_SPEEDS = {(128, 192): 1890e3, (128, 128): 1410e3, (128, 64): 1230e3, (128, 32): 690e3, (256, 64): 1150e3,
                (256, 32): 770e3}
# fp32 on the NHWC path: three fp16 wgmma a k step (conv_mma.cuh's NhwcF32) and the split's work, a fifth of fp16's
# model speed (the forward at batch 128 on the H100, 2026-12-07: 20.8 ms against fp16's ~4.3). Its sums live in
# registers three times (conv_nhwc_wgmma.cu's WGMMA_SPLIT_CHUNK): 128x128 runs one block an SM (237 registers), the
# others two (128x64: 128).
F32_WGMMA_SHAPES = ((128, 128), (128, 64), (128, 32))
WGMMA_PREFIX = {"fp16": "conv_nhwc_wgmma", "tf32": "conv_nhwc_tf32_wgmma", "fp32": "conv_nhwc_f32_wgmma",
                "int8": "conv_nhwc_i8_wgmma"}
# Model speed divisors against fp16's WGMMA_SPEEDS; int8's s8 wgmma has twice fp16's peak (a guess until measured).
WGMMA_SLOWDOWN = {"fp16": 1, "tf32": 2, "fp32": 5, "int8": 0.5}
WGMMA_ELEM_BYTES = {"fp16": 2, "tf32": 4, "fp32": 4, "int8": 1}  # a stage's k: its 64-byte rows of these


def wgmma_tile(bm: int, bn: int, precision: str) -> Tile:
    """conv_nhwc_wgmma.cu's wgmma tile of bm pixels x bn channels (sm_90a only: cuda_build.has_wgmma)."""
    resident = 1 if precision == "fp32" and bn == 128 else 2
    return Tile(bm, bn, 64 // WGMMA_ELEM_BYTES[precision], resident,
                WGMMA_SPEEDS[bm, bn] / WGMMA_SLOWDOWN[precision] * resident / 2, WGMMA_PREFIX[precision], False)


# conv_nhwc_ws.cu's warp-specialized persistent wgmma tiles (fp16, tf32, int8): two producer warpgroups load, two
# consumer warpgroups multiply; WS_THREADS threads, one block an SM, at most one block per SM launched (WS_SPEEDS' model
# speeds: a guess, WGMMA_SPEEDS' per SM (two blocks) x 1.2, until measured; int8's twice fp16's, WGMMA_SLOWDOWN: a
# guess too).
WS_THREADS = 512
WS_SPEEDS = {(128, 192): 1.2 * 1890e3, (128, 128): 1.2 * 1410e3, (128, 64): 1.2 * 1230e3, (256, 128): 1.2 * 1410e3}


def ws_stages(bm: int, bn: int, row: int = 64) -> int:
    """conv_nhwc_ws.cu's ws_stages(): the warp-specialized tile's ring, ~200 KB of stages of BM + BN rows of `row`
    bytes (64; the TMA tiles' 128)."""
    return min(12, 200 * 1024 // ((bm + bn) * row))


def family_prefix(precision: str, family: str) -> str:
    """The kernel prefix of a conv_nhwc_*.cu tile family ("ws", "halo") in this precision: conv_nhwc<suffix>_<family>
    (the suffix of its WGMMA_PREFIX, as NHWC_ELEMS' suffix)."""
    return f"{WGMMA_PREFIX[precision].removesuffix('_wgmma')}_{family}"


def ws_tile(bm: int, bn: int, precision: str) -> Tile:
    """conv_nhwc_ws.cu's warp-specialized tile of bm pixels x bn channels (sm_90a; fp16, tf32, int8), 64-byte rows a
    stage."""
    return Tile(bm, bn, 64 // WGMMA_ELEM_BYTES[precision], 1, WS_SPEEDS[bm, bn] / WGMMA_SLOWDOWN[precision],
                family_prefix(precision, "ws"), False, WS_THREADS)


def is_ws(kernel_or_prefix: str) -> bool:
    """A warp-specialized tile's kernel (or prefix): a persistent grid (the TMA and ping-pong ones too)."""
    return kernel_or_prefix.endswith("_ws") or "_ws_" in kernel_or_prefix


# conv_nhwc_ws.cu's TMA twins (``_ws_tma_``) of the warp-specialized tiles tuning puts on most 17x17 and 8x8 convs: one
# thread asks the copy engine for each stage's A (im2col) and B boxes through tensor maps (cuda.tensor_maps) instead
# of eight producer warps' cp.async. Model speeds as the ws tiles'; the model does not pick them unmeasured
# (cost_model.model_takes), tuning does where they win.
WS_TMA_SHAPES = ((128, 192), (256, 128))


TMA_ROW = 128  # bytes of a TMA tile's stage row: 64 k of fp16, 32 of tf32, 128 of int8 (conv_nhwc_ws.cu's header)
# int8's TMA tiles of 64-byte rows too (64 k a stage, for Cin multiples of 64 but not of 128: Inception's 64-, 192- and
# 448-channel inputs), named <prefix>_r64_<BM>x<BN>
TMA_ROW64, TMA_ROW64_TAG = 64, "_r64"


def ws_tma_tile(bm: int, bn: int, precision: str, row: int = TMA_ROW, pingpong: bool = False) -> Tile:
    """conv_nhwc_ws.cu's TMA warp-specialized tile of bm pixels x bn channels (sm_90a; fp16, tf32, int8), stage rows
    of `row` bytes (TMA_ROW; int8's also TMA_ROW64), ping-pong or not."""
    ws = ws_tile(bm, bn, precision)
    tag = TMA_ROW64_TAG if row == TMA_ROW64 else ""
    return replace(ws, bk=row // WGMMA_ELEM_BYTES[precision], prefix=f"{ws.prefix}_tma{'_pp' * pingpong}{tag}",
                   threads=WS_PP_THREADS if pingpong else ws.threads)


def is_tma(kernel_or_prefix: str) -> bool:
    return "_ws_tma" in kernel_or_prefix


def ws_row(kernel_or_prefix: str) -> int:
    """Bytes of a warp-specialized tile's stage row (conv_nhwc_ws.cu's ROW): the TMA tiles' TMA_ROW (the _r64 ones'
    TMA_ROW64), else 64."""
    if not is_tma(kernel_or_prefix):
        return 64
    return TMA_ROW64 if TMA_ROW64_TAG + "_" in kernel_or_prefix + "_" else TMA_ROW


# conv_nhwc_ws.cu's ping-pong TMA tiles (``_ws_tma_pp_``): each of the two consumer warpgroups takes whole tiles in
# turn, so that one stores its tile while the other multiplies the next; one producer warpgroup, WS_PP_THREADS threads.
# The same stages and ring as the TMA tiles; never picked unmeasured either.
WS_PP_SHAPES = ((128, 192), (128, 128))
WS_PP_THREADS = 384


def ws_pp_tile(bm: int, bn: int, precision: str, row: int = TMA_ROW) -> Tile:
    """conv_nhwc_ws.cu's ping-pong TMA tile of bm pixels x bn channels (sm_90a; fp16, tf32, int8)."""
    return ws_tma_tile(bm, bn, precision, row, pingpong=True)


def is_pingpong(kernel_or_prefix: str) -> bool:
    return "_ws_tma_pp" in kernel_or_prefix


# conv_nhwc_halo.cu's halo tiles (fp16, tf32, int8; sm_90a): stride-1 convs of several taps and Cin a multiple of 16,
# first the stem's Conv2d_2a and 2b, then Conv2d_4a and the 35x35 modules' 3x3s and 5x5s. bm positions of the
# padded-width grid a tile, bn output channels (grid.y: ceil(Cout / bn) channel tiles), HALO_THREADS threads, one block
# an SM; the bn channels' weights and two tiles' input rows, in planes of HALO_CIN channels (int8: HALO_CIN_I8, a
# 64-byte row as fp16's), in up to MAX_SHARED_BYTES of shared memory. HALO_SPEEDS (fp16's, as WGMMA_SPEEDS; tf32
# halves them, int8 doubles them: a guess): 256 x 64 and 256 x 32 fitted to tf32's Conv2d_2b and Conv2d_2a at batch
# 128 on an H100, through conv_config's formula; the 128-position tiles' are the 256 ones' of their bn (96: 64's).
# Fitting all five to their own times (the medians of the speeds they imply) makes the model's choices slower, so these
# stay (docs/PERFORMANCE.md). Tuning measures every tile anyway.
HALO_THREADS, HALO_CIN, HALO_CIN_I8, HALO_K_MULTIPLE = 384, 32, 64, 16
HALO_SPEEDS = {(256, 64): 1790e3, (256, 32): 1620e3, (128, 96): 1790e3, (128, 64): 1790e3, (128, 32): 1620e3}
MAX_SHARED_BYTES = 227 * 1024  # dynamic shared memory a block may opt in to (sm_90)


def halo_tile(bm: int, bn: int, precision: str) -> Tile:
    """conv_nhwc_halo.cu's halo tile of bm grid positions x bn channels (fp16, tf32, int8); bk: one tap of a plane,
    its channels (conv_nhwc_halo.cu's halo_cin: HALO_CIN, int8's HALO_CIN_I8)."""
    return Tile(bm, bn, HALO_CIN_I8 if precision == "int8" else HALO_CIN, 1,
                HALO_SPEEDS[bm, bn] / WGMMA_SLOWDOWN[precision], family_prefix(precision, "halo"), False, HALO_THREADS)


def is_halo(kernel_or_prefix: str) -> bool:
    return kernel_or_prefix.endswith("_halo") or "_halo_" in kernel_or_prefix


def halo_smem_bytes(tile: Tile, kernel: tuple[int, int], wg: int, cin: int) -> int:
    """conv_nhwc_halo.cu's halo_smem_bytes(): per plane of tile.bk input channels (a row: 128 bytes of tf32, 64 of
    fp16 or int8), the weights (KH KW bn rows) and two buffers of the tile's input rows (bm + (KH - 1) Wg + KW - 1 of
    them, in whole KB); four mbarriers. wg: the padded input width."""
    (kh, kw), row = kernel, 128 if tile.prefix.startswith("conv_nhwc_tf32") else 64
    rows, planes = tile.bm + (kh - 1) * wg + kw - 1, -(-cin // tile.bk)
    return planes * (kh * kw * tile.bn * row + 2 * (-(-rows * row // 1024) * 1024)) + 4 * 8


def halo_conv_smem_bytes(tile: Tile, op: ConvOp) -> int:
    """The halo tile's dynamic shared memory for this conv (``halo_smem_bytes`` of its padded width and Cin)."""
    return halo_smem_bytes(tile, op.kernel, op.src.w + 2 * op.pad[1], op.src.channels)


def halo_fits(op: ConvOp, tile: Tile) -> bool:
    """A halo tile computes this conv: stride 1, more than one tap (the copy is shared between taps), Cin a
    multiple of HALO_K_MULTIPLE, its shared memory within the limit."""
    return (op.stride == 1 and op.kernel[0] * op.kernel[1] > 1 and op.src.channels % HALO_K_MULTIPLE == 0
            and halo_conv_smem_bytes(tile, op) <= MAX_SHARED_BYTES)


def input_mma_smem_bytes(op: ConvOp, elem_bytes: int) -> int:
    """conv_input_nhwc.cu's conv_input_mma_smem_bytes for this conv: the input rows of one output row's windows
    (and a row of zeros) as float32, then the row's staged output."""
    (_, cin, _, w), (_, _, _, wo) = op.src.dims, op.dst.dims
    (kh, kw), pad_w, tiles16 = op.kernel, op.pad[1], -(-wo // 16) * 16
    wp = (max(w + 2 * pad_w, (tiles16 - 1) * op.stride + kw) + 3) // 4 * 4 + 4  # whole chunks, and one for the shift
    return 4 * (-(-((cin * kh + 1) * wp) // 4) * 4) + tiles16 * INPUT_MMA_ROW * elem_bytes


def input_mma_blocks(op: ConvOp, num_sms: int | None) -> int:
    """conv_input_mma_nhwc's grid: its blocks take output rows blockIdx.x, + blocks, ...; up to
    INPUT_MMA_MAX_ROWS rows a block where there are 4 blocks an SM (its set-up is paid once per block), one a block
    at small batch."""
    rows = op.dst.n * op.dst.h
    per_block = max(1, min(INPUT_MMA_MAX_ROWS, rows // (4 * (num_sms or 132))))
    return blocks(rows, per_block)


def input_tile(op: ConvOp, precision: str) -> Tile:
    """The tile of a conv that reads the network's input: the tensor-core kernel in fp16, tf32 and int8 (fp16
    operands, the stem the issue lets stay fp16) where K and its shared memory fit, else the FMA kernel (fp32's only
    one: a single TF32 product would break its accuracy)."""
    k = op.src.channels * op.kernel[0] * op.kernel[1]
    fits = k <= INPUT_MMA_MAX_K and input_mma_smem_bytes(op, NHWC_ELEMS[precision].bytes) <= INPUT_MMA_MAX_SHARED
    return INPUT_MMA_TILE if precision in INPUT_MMA_PRECISIONS + ("int8",) and fits else INPUT_TILE


# conv_nhwc.cuh's NhwcMaxPoolLoader: the 1x1 convs that read through a 3x3 max pool (plan.fuse_max_pools) run on
# the tiles of these prefixes, as <prefix>_maxpool3_<BM>x<BN>: fp16's and tf32's mma.sync tiles, int8's wgmma ones.
MAXPOOL_PREFIXES, MAXPOOL_KERNEL = ("conv_nhwc", "conv_nhwc_tf32", "conv_nhwc_i8_wgmma"), 3


def folds_max_pools(precision: str) -> bool:
    """Whether this precision's NHWC tiles include the MAXPOOL_PREFIXES ones (fp16, tf32, int8; fp32's wgmma tiles
    have no max-pool twins), so that its plan may fold max pools into convs (plan.fused_plan's max_pools)."""
    return any(t.prefix in MAXPOOL_PREFIXES for t in NHWC_ELEMS[precision].tiles(wgmma=True))


def tile_fits(op: ConvOp, tile: Tile) -> bool:
    """Whether the tile computes this conv: every tile does but the halo tiles (``halo_fits``) and the TMA ones
    (Cin a multiple of a stage's k, so that no stage spans two taps); a conv that reads through a max pool only the
    MAXPOOL_PREFIXES tiles."""
    if op.max_pool:
        return tile.prefix in MAXPOOL_PREFIXES and op.max_pool == MAXPOOL_KERNEL
    if is_tma(tile.prefix):
        return op.src.channels % tile.bk == 0
    return not is_halo(tile.prefix) or halo_fits(op, tile)


def conv_kernel(op: ConvOp, tile: Tile) -> str:
    """The conv_nhwc_*.cu entry point of this conv on this tile."""
    return f"{tile.prefix}_maxpool{op.max_pool}_{tile.name}" if op.max_pool else f"{tile.prefix}_{tile.name}"


def tile_label(tile: Tile) -> str:
    """A tile's name that tells the NHWC path's wgmma tiles (w128x128), warp-specialized ones (ws128x128, TMA
    wt128x192, TMA ping-pong wp128x192; int8's of 64-byte rows wt128x192r64) and halo ones (h128x64) from its mma.sync
    ones of the same shape."""
    kind = ("wp" if is_pingpong(tile.prefix) else "wt" if is_tma(tile.prefix) else "ws" if is_ws(tile.prefix)
            else "h" if is_halo(tile.prefix) else "w" if "_wgmma" in tile.prefix else "")
    return kind + tile.name + ("r64" if is_tma(tile.prefix) and ws_row(tile.prefix) == TMA_ROW64 else "")


# The sm_90a tiles in the order their files instantiate them: conv_nhwc_wgmma.cu's, conv_nhwc_ws.cu's (cp.async, then
# TMA, then TMA ping-pong), conv_nhwc_halo.cu's.
NHWC_WGMMA_TILES = (tuple(wgmma_tile(bm, bn, "fp16") for bm, bn in WGMMA_SPEEDS)
                    + tuple(ws_tile(bm, bn, "fp16") for bm, bn in WS_SPEEDS)
                    + tuple(ws_tma_tile(bm, bn, "fp16") for bm, bn in WS_TMA_SHAPES)
                    + tuple(ws_pp_tile(bm, bn, "fp16") for bm, bn in WS_PP_SHAPES)
                    + tuple(halo_tile(bm, bn, "fp16") for bm, bn in HALO_SPEEDS))
NHWC_TF32_WGMMA_TILES = (tuple(wgmma_tile(bm, bn, "tf32") for bm, bn in WGMMA_SPEEDS)
                         + tuple(ws_tile(bm, bn, "tf32") for bm, bn in WS_SPEEDS)
                         + tuple(ws_tma_tile(bm, bn, "tf32") for bm, bn in WS_TMA_SHAPES)
                         + tuple(ws_pp_tile(bm, bn, "tf32") for bm, bn in WS_PP_SHAPES)
                         + tuple(halo_tile(bm, bn, "tf32") for bm, bn in HALO_SPEEDS))
NHWC_F32_WGMMA_TILES = tuple(wgmma_tile(bm, bn, "fp32") for bm, bn in F32_WGMMA_SHAPES)
# int8 (conv_mma.cuh's NhwcI8): fp16's sm_90a tiles and shapes (split-K with int32 partial sums).
NHWC_I8_WGMMA_TILES = (tuple(wgmma_tile(bm, bn, "int8") for bm, bn in WGMMA_SPEEDS)
                       + tuple(ws_tile(bm, bn, "int8") for bm, bn in WS_SPEEDS)
                       + tuple(ws_tma_tile(bm, bn, "int8") for bm, bn in WS_TMA_SHAPES)
                       + tuple(ws_pp_tile(bm, bn, "int8") for bm, bn in WS_PP_SHAPES)
                       + tuple(ws_tma_tile(bm, bn, "int8", TMA_ROW64) for bm, bn in WS_TMA_SHAPES)
                       + tuple(ws_pp_tile(bm, bn, "int8", TMA_ROW64) for bm, bn in WS_PP_SHAPES)
                       + tuple(halo_tile(bm, bn, "int8") for bm, bn in HALO_SPEEDS))
# conv_input_nhwc.cu: the first conv of the NHWC path, from the float32 NCHW input, no split-K. INPUT_TILE: on the
# FMA units, 256 pixels x 32 channels per block (one pixel per thread), every precision. INPUT_MMA_TILE: on the tensor
# cores, an output row x 32 channels per block, fp16 and tf32, K = Cin*KH*KW <= 32 (``input_tile`` picks it where it
# fits). Their speeds are model guesses; they do not compete in tuning (the first conv has one kernel per precision).
INPUT_TILE = Tile(256, 32, 1, 4, 100e3, "conv_input", False)
INPUT_MAX_K = 256  # conv_input_nhwc.cu's CONV_INPUT_MAX_K: Cin*KH*KW of its weights in shared memory
INPUT_MMA_MAX_K = 32  # ... CONV_INPUT_MMA_K
INPUT_MMA_ROW = 40  # ... CONV_INPUT_MMA_ROW: elements of a staged output pixel
INPUT_MMA_THREADS = 128  # ... CONV_INPUT_MMA_THREADS
INPUT_MMA_TILE = Tile(16, 32, 1, 8, 400e3, "conv_input_mma", False, INPUT_MMA_THREADS)
INPUT_MMA_MAX_ROWS = 8  # output rows a block takes at most (input_mma_blocks)
INPUT_MMA_PRECISIONS = ("fp16", "tf32")  # its element types
INPUT_MMA_MAX_SHARED = 48 * 1024  # the mma kernel takes no opt-in (the emulator's buffer is this size too)
NHWC_PIECE = 8  # channels per 16-byte piece of fp16 (tf32's 4 divide it): NHWC channel counts, strides and offsets


def nhwc_cin(cin: int) -> int:
    """Input channels of an NHWC weight row's taps (params.direct_weights): Cin padded with zeros to whole pieces."""
    return -(-cin // NHWC_PIECE) * NHWC_PIECE


HALF_NAN_BITS = 0x7E007E00  # two fp16 quiet NaNs: the NHWC arena starts poisoned too
# int8's poison: four -128s, a value its kernels never write (they saturate to +-127: int8_reference's QMAX).
I8_POISON_BITS = 0x80808080


@dataclass(frozen=True)
class NhwcElem:
    """An element type of the NHWC path's activations (conv_mma.cuh's NhwcF16, NhwcTf32, NhwcF32 and NhwcI8)."""

    bytes: int
    suffix: str  # of its kernels' names: conv_nhwc<suffix>_splitk_reduce, pool2d_nhwc<suffix>, ...
    nan_word: int  # a 32-bit word of NaNs of this type (int8: of -128s), to poison the arena
    mma_tiles: tuple[Tile, ...]  # conv_nhwc_mma.cu's mma.sync tiles for it (none for fp32: wgmma only)
    wgmma_tiles: tuple[Tile, ...]  # ... and its wgmma tiles (sm_90a)

    def tiles(self, wgmma: bool = False) -> tuple[Tile, ...]:
        return self.mma_tiles + (self.wgmma_tiles if wgmma else ())


NHWC_ELEMS = {"fp16": NhwcElem(2, "", HALF_NAN_BITS, NHWC_TILES, NHWC_WGMMA_TILES),
              "tf32": NhwcElem(4, "_tf32", NAN_BITS, NHWC_TF32_TILES, NHWC_TF32_WGMMA_TILES),
              "fp32": NhwcElem(4, "_f32", NAN_BITS, (), NHWC_F32_WGMMA_TILES),
              "int8": NhwcElem(1, "_i8", I8_POISON_BITS, (), NHWC_I8_WGMMA_TILES)}
# winograd.cu's batched-GEMM tiles: conv.cu's shapes and, as the model's (untested) assumption, their speed per MAC.
WINO_TILES = (Tile(128, 128, 8, 2, 180e3, "wino_gemm", False), Tile(64, 64, 16, 4, 120e3, "wino_gemm", False),
              Tile(32, 128, 8, 4, 120e3, "wino_gemm", False))


def wgmma_ring_bytes(kernel: str) -> int:
    """Dynamic shared memory of a conv_nhwc_wgmma.cu wgmma tile (its ring: stages of BM + BN rows of 64 bytes, and for
    fp32's the low halves' tiles; for a warp-specialized tile, each stage's two mbarriers too), else 0:
    conv_nhwc_wgmma.cu's wgmma_ring_bytes() and conv_nhwc_ws.cu's ws_ring_bytes()."""
    if "_wgmma_" not in kernel and not is_ws(kernel):
        return 0
    bm, bn = (int(v) for v in kernel.rsplit("_", 1)[1].split("x"))
    if is_ws(kernel):
        row = ws_row(kernel)
        return ws_stages(bm, bn, row) * ((bm + bn) * row + 16)
    split = kernel.startswith(WGMMA_PREFIX["fp32"])
    return (wgmma_stages(bm, bn, split) + WGMMA_LO_TILES * split) * (bm + bn) * 64


def check_nhwc_precision(precision: str, wgmma: bool) -> None:
    """fp32 and int8 on the NHWC path have wgmma tiles only (conv_mma.cuh's NhwcF32, NhwcI8): sm_90a."""
    if precision == "fp32" and not wgmma:
        raise EngineError("fp32 on the NHWC layout runs on Hopper's wgmma tiles only (sm_90a); this GPU has none: "
                          "use the default layout")
    if precision == "int8" and not wgmma:
        raise EngineError("int8 runs on Hopper's wgmma tiles only (sm_90a); this GPU has none: use fp16")


def blocks(n: int, per_block: int) -> int:
    """Blocks of per_block that cover n, at least one: a grid's extent."""
    return max(1, math.ceil(n / per_block))
