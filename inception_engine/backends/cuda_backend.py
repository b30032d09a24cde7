"""CUDA backend: the whole Inception-V3 forward on the GPU with the engine's own kernels (cuda_src/), via pycuda.

Set-up does everything once: compile (or load cached) cubins, pick a kernel variant and launch shape for every op
(``choose_configs``, a small cost model), upload the weights in the layout the kernels read (conv weights
transposed to [K][Cout]), allocate one arena for all activations (the plan's offsets), the split-K workspace and
pinned host buffers, and turn the plan into a list of prepared launches (``launch_specs``). A forward is then:
copy the input in, replay the launches (one CUDA graph, or one ``prepared_async_call`` each), copy the logits out.
Nothing is allocated, compiled or synchronised in between.

The planning half (configs, parameter packing, launch specs) is plain Python and needs no GPU; pycuda is imported
only when a backend is built, so a missing pycuda is reported by ``check_available`` as one line.

    python -m inception_engine.backends.cuda_backend --selftest [--batch 1] [--graph on|off] [--input-size 299]
        [--precision fp32|tf32|fp16] [--layout auto|nchw|nhwc]

runs one forward on random He-initialised weights against the float64 NumPy reference (for compute-sanitizer).

"tf32" (TF32 products, fp32 sums, a relative error of ~1e-3 instead of ~1e-6) and "fp16" keep the activations
channels innermost (NHWC), as TF32 values in float32 words or as fp16: every conv is conv_nhwc.cu's implicit GEMM,
whose operands are whole 16-byte pieces loaded by cp.async (on sm_90a its wgmma tiles, elsewhere mma.sync), except
the first, which reads the 3-channel float32 input as uploaded (conv_input_nhwc.cu); the pools are pool_nhwc.cu's,
and the FC runs on float32 features (``nhwc_launch_specs``). ``CudaBackend(nhwc=False)`` runs them on fp32 NCHW
tensors instead (conv_tf32.cu / conv_f16.cu, the Winograd convs FFMA).
Precision "fp32" keeps float32's accuracy (~1e-6). On sm_90a it takes the NHWC path too, with float32 activations,
and each conv product is three TF32 ones on the tensor cores (conv_mma.cuh's NhwcF32, "3xTF32"); elsewhere, or with
nhwc=False, it runs on NCHW tensors: conv.cu's FFMA kernels, and winograd.cu's F(2x2, 3x3), F(4x4, 3x3),
F(2x2, 5x5) or F(3, 7) for the stride-1 3x3, 5x5, 1x7 and 7x1 convs where ``winograd_config``'s model expects a clear
gain (``CudaBackend(winograd=...)`` forces either way).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import cuda_build
from ..errors import BackendUnavailable, EngineError
from ..plan import (ALIGN, ConvOp, FCOp, FusedConvOp, GlobalAvgPoolOp, Plan, PoolOp, View, align, build_plan,
                    fuse_pointwise, is_fused, writes)
from ..weights import Weights, atomic_write, user_cache_dir
from . import event_timed_ms

THREADS = 256  # every kernel's block size (conv.cu's and conv_tf32.cu's tiles are 256 threads too)
NAN_BITS = 0x7FC00000  # float32 quiet NaN: the arena starts poisoned, so a read of never-written memory shows

KERNEL_SIZES = ((1, 1), (3, 3), (5, 5), (1, 7), (7, 1), (1, 3), (3, 1))  # conv.cu, conv_tf32.cu instantiate these
PRECISIONS = ("fp32", "tf32", "fp16")


@dataclass(frozen=True)
class Tile:
    """One block-tile shape of conv.cu or conv_tf32.cu, and what the cost model assumes about it."""

    bm: int  # output channels per block
    bn: int  # output pixels per block
    bk: int  # reduction depth per shared-memory stage
    resident: int  # blocks per SM (the kernel's __launch_bounds__ minimum)
    macs_per_us: float  # one SM's multiply-adds per microsecond with `resident` blocks (model, not measured)
    prefix: str = "conv"  # kernel names are <prefix>_<KH>x<KW>_<BM>x<BN>
    fixup: bool = True  # a _fixup variant exists (split-K reduced in the conv kernel)

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
TILES_OF = {"fp32": TILES, "tf32": TF32_TILES, "fp16": F16_TILES}
# conv_nhwc.cu's tiles (NHWC activations, CudaBackend(nhwc=True)). Here bm counts output pixels and bn output
# channels (the GEMM's rows and columns there), so conv_config is called with (pixels, Cout); speeds as fp16's.
NHWC_TILES = (Tile(128, 128, 32, 2, 600e3, "conv_nhwc", False), Tile(128, 64, 32, 2, 450e3, "conv_nhwc", False),
              Tile(64, 128, 32, 2, 450e3, "conv_nhwc", False), Tile(64, 64, 32, 3, 300e3, "conv_nhwc", False),
              Tile(128, 32, 32, 3, 300e3, "conv_nhwc", False))
# The same tiles on TF32 activations: 64-byte shared rows hold 16 k of float32; the model halves the speeds (a
# m16n8k8 .tf32 step does half the work of a m16n8k16 .f16 one).
NHWC_TF32_TILES = tuple(Tile(t.bm, t.bn, 16, t.resident, t.macs_per_us / 2, "conv_nhwc_tf32", False)
                        for t in NHWC_TILES)


def wgmma_stages(bm: int, bn: int, split: bool = False) -> int:
    """conv_nhwc.cu's wgmma_stages(): the wgmma tile's ring of stages of BM + BN rows of 64 bytes, in dynamic shared
    memory (wgmma_ring_bytes), two blocks an SM; split: fp32's 3xTF32 tiles, which need WGMMA_LO_TILES more (and
    whose 128x128 runs one block an SM)."""
    if split:
        return 8 if bn == 128 else 6
    return 4 if bm == 256 else 5 if bn == 192 else 6


WGMMA_LO_TILES = 3  # conv_nhwc.cu's: the low halves' tiles of the 3xTF32 (fp32) wgmma tiles


# The wgmma tiles' model speeds: multiply-adds per microsecond an SM with 2 blocks resident, fp16 (tf32: half). Fitted
# to per-layer times at batch 128 (H200, round 9, scripts/tune_tiles.py --precision fp16 --nhwc; the median over the
# layers of what conv_config's formula implies). 128x192 was the fastest tile on 39 of 65 fp16 layers and 42 of 65
# tf32 ones (those with Cout 192 or 384, and Conv2d_4a), 128x128 and 128x64 on most others.
WGMMA_SPEEDS = {(128, 192): 1890e3, (128, 128): 1410e3, (128, 64): 1230e3, (128, 32): 690e3, (256, 64): 1150e3,
                (256, 32): 770e3}
# fp32 on the NHWC path: three TF32 wgmma a k step (conv_mma.cuh's NhwcF32), so a third of tf32's model speed (a
# guess until measured). Its sums live in registers twice (conv_nhwc.cu's WGMMA_SPLIT_CHUNK): 128x128 runs one block
# an SM (168 registers), the others two.
F32_WGMMA_SHAPES = ((128, 128), (128, 64), (128, 32))
WGMMA_PREFIX = {"fp16": "conv_nhwc_wgmma", "tf32": "conv_nhwc_tf32_wgmma", "fp32": "conv_nhwc_f32_wgmma"}
WGMMA_SLOWDOWN = {"fp16": 1, "tf32": 2, "fp32": 6}  # model speed divisors against fp16's WGMMA_SPEEDS


def wgmma_tile(bm: int, bn: int, precision: str) -> Tile:
    """conv_nhwc.cu's wgmma tile of bm pixels x bn channels (sm_90a only: cuda_build.has_wgmma)."""
    resident = 1 if precision == "fp32" and bn == 128 else 2
    return Tile(bm, bn, 32 if precision == "fp16" else 16, resident,
                WGMMA_SPEEDS[bm, bn] / WGMMA_SLOWDOWN[precision] * resident / 2, WGMMA_PREFIX[precision], False)


# conv_nhwc.cu's warp-specialized persistent wgmma tiles (fp16 and tf32): two producer warpgroups load, two consumer
# warpgroups multiply; WS_THREADS threads, one block an SM, at most one block per SM launched (WS_SPEEDS' model
# speeds: a guess, WGMMA_SPEEDS' per SM (two blocks) x 1.2, until measured).
WS_THREADS = 512
WS_SPEEDS = {(128, 192): 1.2 * 1890e3, (128, 128): 1.2 * 1410e3, (128, 64): 1.2 * 1230e3, (256, 128): 1.2 * 1410e3}


def ws_stages(bm: int, bn: int) -> int:
    """conv_nhwc.cu's ws_stages(): the warp-specialized tile's ring, ~200 KB of stages of BM + BN rows of 64 bytes."""
    return min(12, 200 * 1024 // ((bm + bn) * 64))


def ws_tile(bm: int, bn: int, precision: str) -> Tile:
    """conv_nhwc.cu's warp-specialized tile of bm pixels x bn channels (sm_90a; fp16 and tf32)."""
    return Tile(bm, bn, 32 if precision == "fp16" else 16, 1, WS_SPEEDS[bm, bn] / WGMMA_SLOWDOWN[precision],
                f"conv_nhwc{'_tf32' if precision == 'tf32' else ''}_ws", False)


def is_ws(kernel_or_prefix: str) -> bool:
    """A warp-specialized tile's kernel (or prefix): WS_THREADS threads, a persistent grid."""
    return kernel_or_prefix.endswith("_ws") or "_ws_" in kernel_or_prefix


# conv_nhwc.cu's halo tiles (fp16 and tf32, sm_90a): stride-1 convs of HALO_CIN input channels and Cout <= BN, the
# stem's Conv2d_2a and 2b. HALO_BM positions of the padded-width grid a tile, HALO_THREADS threads, one block an SM,
# at most one block per SM launched; the weights and two tiles' input rows in up to MAX_SHARED_BYTES of shared memory.
# HALO_SPEEDS (fp16's, as WGMMA_SPEEDS; tf32 halves them): fitted to tf32's Conv2d_2b on h256x64 (0.514 ms) and
# Conv2d_2a on h256x32 (0.321 ms) at batch 128 (H100, round 12), through conv_config's formula.
HALO_BM, HALO_THREADS, HALO_CIN = 256, 384, 32
HALO_SPEEDS = {64: 1790e3, 32: 1620e3}
MAX_SHARED_BYTES = 227 * 1024  # dynamic shared memory a block may opt in to (sm_90)


def halo_tile(bn: int, precision: str) -> Tile:
    """conv_nhwc.cu's halo tile of HALO_BM grid positions x bn channels (fp16, tf32); bk: one tap of HALO_CIN."""
    return Tile(HALO_BM, bn, HALO_CIN, 1, HALO_SPEEDS[bn] / WGMMA_SLOWDOWN[precision],
                f"conv_nhwc{'_tf32' if precision == 'tf32' else ''}_halo", False)


def is_halo(kernel_or_prefix: str) -> bool:
    return kernel_or_prefix.endswith("_halo") or "_halo_" in kernel_or_prefix


def halo_smem_bytes(tile: Tile, kernel: tuple[int, int], wg: int) -> int:
    """conv_nhwc.cu's halo_smem_bytes(): the weights (KH KW bn rows of HALO_CIN elements), two buffers of the
    tile's input rows (HALO_BM + (KH - 1) Wg + KW - 1 of them, in whole KB), four mbarriers; wg: the padded input
    width."""
    (kh, kw), row = kernel, HALO_CIN * (4 if tile.prefix.startswith("conv_nhwc_tf32") else 2)
    rows = HALO_BM + (kh - 1) * wg + kw - 1
    return kh * kw * tile.bn * row + 2 * (-(-rows * row // 1024) * 1024) + 4 * 8


def halo_fits(op: ConvOp, tile: Tile) -> bool:
    """A halo tile computes this conv: stride 1, Cin = HALO_CIN, Cout <= its bn, shared memory to spare."""
    return (op.stride == 1 and op.src.channels == HALO_CIN and op.dst.channels <= tile.bn
            and halo_smem_bytes(tile, op.kernel, op.src.w + 2 * op.pad[1]) <= MAX_SHARED_BYTES)


def tile_fits(op: ConvOp, tile: Tile) -> bool:
    """Whether the tile computes this conv: every tile does but the halo tiles (``halo_fits``)."""
    return not is_halo(tile.prefix) or halo_fits(op, tile)


def tile_label(tile: Tile) -> str:
    """A tile's name that tells the NHWC path's wgmma tiles (w128x128), warp-specialized ones (ws128x128) and halo
    ones (h256x64) from its mma.sync ones of the same shape."""
    kind = "ws" if is_ws(tile.prefix) else "h" if is_halo(tile.prefix) else "w" if "_wgmma" in tile.prefix else ""
    return kind + tile.name


# conv_nhwc.cu's wgmma tiles, the order in which they are instantiated there, then the warp-specialized and halo
# ones.
NHWC_WGMMA_TILES = (tuple(wgmma_tile(bm, bn, "fp16") for bm, bn in WGMMA_SPEEDS)
                    + tuple(ws_tile(bm, bn, "fp16") for bm, bn in WS_SPEEDS)
                    + tuple(halo_tile(bn, "fp16") for bn in HALO_SPEEDS))
NHWC_TF32_WGMMA_TILES = (tuple(wgmma_tile(bm, bn, "tf32") for bm, bn in WGMMA_SPEEDS)
                         + tuple(ws_tile(bm, bn, "tf32") for bm, bn in WS_SPEEDS)
                         + tuple(halo_tile(bn, "tf32") for bn in HALO_SPEEDS))
NHWC_F32_WGMMA_TILES = tuple(wgmma_tile(bm, bn, "fp32") for bm, bn in F32_WGMMA_SHAPES)
# conv_input_nhwc.cu: the first conv of the NHWC path, from the float32 NCHW input on the FMA units, 256 pixels x 32
# channels per block (one pixel per thread), no split-K. Its speed is a model guess; no other tile competes with it.
INPUT_TILE = Tile(256, 32, 1, 4, 100e3, "conv_input", False)
INPUT_MAX_K = 256  # conv_input_nhwc.cu's CONV_INPUT_MAX_K: Cin*KH*KW of its weights in shared memory
NHWC_PIECE = 8  # channels per 16-byte piece of fp16 (tf32's 4 divide it): NHWC channel counts, strides and offsets
HALF_NAN_BITS = 0x7E007E00  # two fp16 quiet NaNs: the NHWC arena starts poisoned too


@dataclass(frozen=True)
class NhwcElem:
    """An element type of the NHWC path's activations (conv_mma.cuh's NhwcF16, NhwcTf32 and NhwcF32)."""

    bytes: int
    suffix: str  # of its kernels' names: conv_nhwc<suffix>_splitk_reduce, pool2d_nhwc<suffix>, ...
    nan_word: int  # a 32-bit word of NaNs of this type, to poison the arena
    mma_tiles: tuple[Tile, ...]  # conv_nhwc.cu's mma.sync tiles for it (none for fp32: wgmma only)
    wgmma_tiles: tuple[Tile, ...]  # ... and its wgmma tiles (sm_90a)

    def tiles(self, wgmma: bool = False) -> tuple[Tile, ...]:
        return self.mma_tiles + (self.wgmma_tiles if wgmma else ())


NHWC_ELEMS = {"fp16": NhwcElem(2, "", HALF_NAN_BITS, NHWC_TILES, NHWC_WGMMA_TILES),
              "tf32": NhwcElem(4, "_tf32", NAN_BITS, NHWC_TF32_TILES, NHWC_TF32_WGMMA_TILES),
              "fp32": NhwcElem(4, "_f32", NAN_BITS, (), NHWC_F32_WGMMA_TILES)}
# winograd.cu's batched-GEMM tiles: conv.cu's shapes and, as the model's (untested) assumption, their speed per MAC.
WINO_TILES = (Tile(128, 128, 8, 2, 180e3, "wino_gemm", False), Tile(64, 64, 16, 4, 120e3, "wino_gemm", False),
              Tile(32, 128, 8, 4, 120e3, "wino_gemm", False))
# Kernel shape -> the output tiles m of F(m x m, k x k) (F(m, 7) along the long axis of 1x7 / 7x1) that winograd.cu
# instantiates. 1x7 / 7x1: F(3, 7) only, as the CPU path (numpy_backend.winograd_tile): on the network's 17-wide
# maps F(2, 7) does 1.33x its GEMM work and traffic, and F(4, 7) saves 7% (17 = 5 x 4 - 3 wastes more edge) at
# twice the error (per layer 9.4e-7 / 2.9e-6 / 5.6e-6 for m = 2 / 3 / 4). 5x5: F(2x2) only, 6 x 6 positions like
# F(4x4, 3x3) (the same BT); F(3x3, 5x5) would need one more interpolation point, less accurate.
WINO_VARIANTS = {(3, 3): (2, 4), (5, 5): (2,), (1, 7): (3,), (7, 1): (3,)}
# The smallest batch at which the model may choose Winograd for a kernel shape. 3x3: measured faster on an H100 at
# batch 1 (the three stem layers the model picks: forward 1.00 ms, 1.09 direct). The others are unmeasured at batch
# 1, where one small layer is a few microseconds either way and not on the forward's critical path: direct until
# measured.
WINO_MIN_BATCH = {(3, 3): 1, (5, 5): 2, (1, 7): 2, (7, 1): 2}
WINO_T_ALIGN = 128  # V and M rows (T = batch x tiles) are padded to whole GEMM tiles along T (the widest tile's)

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


def winograd_eligible(op: ConvOp) -> bool:
    """winograd.cu computes stride-1 convolutions of the kernel shapes of WINO_VARIANTS (any padding)."""
    return op.kernel in WINO_VARIANTS and op.stride == 1


def winograd_tile(kernel: tuple[int, int], m: int) -> tuple[int, int]:
    """Output tile (mh, mw) of Winograd with tile size m: m along each axis the kernel extends in, else 1."""
    return tuple(m if k > 1 else 1 for k in kernel)  # type: ignore[return-value]


@dataclass(frozen=True)
class WinogradShape:
    """How F(mh x mw, kh x kw) cuts one conv: tiles of the output map, and the sizes of its work buffers."""

    m: int
    kernel: tuple[int, int]
    tiles_h: int
    tiles_w: int
    t_total: int  # batch x tiles: the GEMMs' N
    t_pad: int  # t_total rounded up to whole GEMM tiles along T: the row length of V and M

    @property
    def nn(self) -> int:  # nh x nw transform positions (n = m + k - 1 per axis): the number of GEMMs
        return math.prod(m + k - 1 for m, k in zip(winograd_tile(self.kernel, self.m), self.kernel))


def winograd_shape(op: ConvOp, m: int, t_align: int = WINO_T_ALIGN) -> WinogradShape:
    """t_align: the GEMM tile's BN (a small batch-1 map has 16 tiles: padding T to 128 would do 8x the work)."""
    n, _, ho, wo = op.dst.dims
    mh, mw = winograd_tile(op.kernel, m)
    th, tw = -(-ho // mh), -(-wo // mw)
    t_total = n * th * tw
    return WinogradShape(m, op.kernel, th, tw, t_total, -(-t_total // t_align) * t_align)


def config_shape(op: ConvOp, cfg: ConvConfig) -> WinogradShape:
    """The shape of a Winograd config's work: its output tile, T padded to its GEMM tile's width."""
    return winograd_shape(op, cfg.wino, cfg.tile.bn)


def o_pad(cout: int, tile: Tile) -> int:
    """U's row length: Cout rounded up to whole GEMM tiles (zero columns), so the GEMM loads without bounds checks."""
    return -(-cout // tile.bm) * tile.bm


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
    nhwc: every conv on conv_nhwc.cu (tiles: a subset of the precision's NHWC_ELEMS tiles, with the wgmma ones if
    wgmma), no Winograd, except those that read the network's input (conv_input_nhwc.cu, INPUT_TILE); the FC as
    without nhwc."""
    if precision not in TILES_OF:
        raise EngineError(f"the cuda backend has no {precision!r} mode; choose one of {', '.join(PRECISIONS)}")
    if nhwc:
        check_nhwc_precision(precision, wgmma)
    conv_tiles = tiles or (NHWC_ELEMS[precision].tiles(wgmma) if nhwc else TILES_OF[precision])
    tiles = TILES_OF[precision] if nhwc else conv_tiles
    configs: dict[str, ConvConfig | None] = {}
    for op in plan.ops:
        if isinstance(op, ConvOp) and nhwc:
            reads_input = op.src.buffer == plan.input.buffer
            # a set of tiles none of which computes this conv (a halo tile alone, in tuning) leaves it to the model
            fit = tuple(t for t in conv_tiles if tile_fits(op, t)) or tuple(
                t for t in NHWC_ELEMS[precision].tiles(wgmma) if tile_fits(op, t))
            configs[op.name] = conv_config(op.dst.n * op.dst.h * op.dst.w, op.dst.channels,
                                           op.src.channels * op.kernel[0] * op.kernel[1], num_sms, False,
                                           (INPUT_TILE,) if reads_input else fit,
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


def tuning_candidates(plan: Plan, num_sms: int, fixup: bool, precision: str,
                      winograd: bool | None, nhwc: bool = False,
                      wgmma: bool = False) -> list[dict[str, ConvConfig | None]]:
    """The config sets ``tune_configs`` times, each a whole forward's: one per direct tile of the precision (every
    conv on that tile, split-K as the model picks it for the tile) and, unless winograd is False, one with every
    eligible conv by Winograd (the others as the model picks). nhwc: one per NHWC tile of the precision."""
    if nhwc:
        return [choose_configs(plan, num_sms, False, precision, False, (t,), nhwc=True, wgmma=wgmma)
                for t in NHWC_ELEMS[precision].tiles(wgmma)]
    sets = [choose_configs(plan, num_sms, fixup, precision, False, (t,)) for t in TILES_OF[precision]]
    if winograd is not False:
        sets.append(choose_configs(plan, num_sms, fixup, precision, True))
    return sets


def pick_fastest(default: dict[str, ConvConfig | None], sets: list[dict[str, ConvConfig | None]],
                 times: list[dict[str, float]]) -> dict[str, ConvConfig | None]:
    """default, with each op that was timed in every set given its config from the set where it ran fastest."""
    out = dict(default)
    for name in default:
        if all(name in t for t in times):
            out[name] = sets[min(range(len(sets)), key=lambda i: times[i][name])][name]
    return out


def config_to_json(cfg: ConvConfig | None) -> dict[str, Any] | None:
    if cfg is None:
        return None
    return {"prefix": cfg.tile.prefix, "tile": cfg.tile.name, "splits": cfg.splits, "k_split": cfg.k_split,
            "wino": cfg.wino}


def config_from_json(d: dict[str, Any] | None) -> ConvConfig | None:
    if d is None:
        return None
    tiles = {(t.prefix, t.name): t for t in TILES + TF32_TILES + F16_TILES + WINO_TILES + (INPUT_TILE,)
             + tuple(t for e in NHWC_ELEMS.values() for t in e.tiles(wgmma=True))}
    return ConvConfig(tiles[d["prefix"], d["tile"]], int(d["splits"]), int(d["k_split"]), 0.0, int(d["wino"]))


def tuning_key(device_name: str, arch: str, num_sms: int, plan: Plan, precision: str, fixup: bool,
               winograd: bool | None, nhwc: bool = False) -> str:
    """What a tuned config set depends on: the GPU, the kernels' build, the conv shapes, the mode."""
    ops = [(op.name, op.kernel, op.stride, op.pad, op.src.dims, op.dst.dims) for op in plan.conv_ops]
    what = [device_name, arch, num_sms, cuda_build.build_key(arch), precision, fixup, winograd is not False, ops]
    if nhwc:
        what.append("nhwc")
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:20]


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
        need += _blocks(op.dst.n * op.dst.h * op.dst.w, cfg.tile.bn) * _blocks(op.dst.channels, cfg.tile.bm)
    return need, offsets


@dataclass(frozen=True)
class Scheduled:
    """Where one op runs in a concurrent forward."""

    stream: int  # 0 is the main stream, which forks every stage to the others and joins them at its end
    waits: tuple[int, ...]  # earlier ops of the same stage, on other streams, that must finish first


def _overlap(a: View, b: View) -> bool:
    return a.buffer == b.buffer and bool(range(max(a.c_offset, b.c_offset),
                                              min(a.c_offset + a.channels, b.c_offset + b.channels)))


def depends(later: Any, earlier: Any) -> bool:
    """Whether op ``later`` must wait for op ``earlier``: it reads what ``earlier`` writes, or writes what it reads
    or writes. By buffer name and channels, which is exact within a stage of a concurrent plan (no two buffers
    used in one stage share memory)."""
    return any(_overlap(later.src, w) for w in writes(earlier)) or any(
        _overlap(w, earlier.src) or any(_overlap(w, e) for e in writes(earlier)) for w in writes(later))


def schedule(plan: Plan) -> list[Scheduled]:
    """Streams for the ops of each stage, one per op of ``plan.ops``. An op with no dependency in its stage starts
    a new stream (the stage's first op takes the main stream); an op whose latest dependency is the last op so far
    on that op's stream continues that stream (a branch's chain of convs stays on one stream); any other op starts
    a new stream and waits for its dependencies by events. Streams are numbered afresh in each stage."""
    out: list[Scheduled] = []
    start = 0
    tails: dict[int, int] = {}  # stream -> last op placed on it in this stage
    for i, op in enumerate(plan.ops):
        if i and plan.stages[i] != plan.stages[i - 1]:
            start, tails = i, {}
        deps = [j for j in range(start, i) if depends(op, plan.ops[j])]
        stream = len(tails)
        if deps and tails[out[deps[-1]].stream] == deps[-1]:
            stream = out[deps[-1]].stream
        tails[stream] = i
        out.append(Scheduled(stream, tuple(j for j in deps if out[j].stream != stream)))
    return out


def axis_matrices(m: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(AT, G, BT) of F(m, k) along one axis (numpy_backend.winograd_matrices, float64); 1 x 1 ones for k == 1."""
    from .numpy_backend import winograd_matrices

    return winograd_matrices(m, k) if k > 1 else (np.ones((1, 1)),) * 3


def winograd_weights(w: np.ndarray, m: int, opad: int) -> np.ndarray:
    """U[xi][c][o] = (G_h w[o, c] G_w^T)[xi] for Winograd with output tile m (``winograd_tile``), (nn, Cin, opad)
    float32: computed in float64, rounded once, zero for o >= Cout."""
    cout, cin, kh, kw = w.shape
    mh, mw = winograd_tile((kh, kw), m)
    gh, gw = axis_matrices(mh, kh)[1], axis_matrices(mw, kw)[1]
    u = np.einsum("ik,jl,ockl->ijco", gh, gw, w.astype(np.float64)).reshape(len(gh) * len(gw), cin, cout)
    out = np.zeros((len(u), cin, opad), np.float32)
    out[:, :, :cout] = u
    return out


def winograd_transforms(m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(BT, AT) of F(m, k) as winograd.cu reads them: row-major float32, n x n and m x n (n = m + k - 1). A kernel
    of k x k, 1 x k or k x 1 taps uses this one pair."""
    at, _, bt = axis_matrices(m, k)
    return bt.astype(np.float32), at.astype(np.float32)


def transforms_key(op: ConvOp, cfg: ConvConfig) -> str:
    """pack_params' key prefix of the transforms a Winograd conv reads: one pair per F(m, k)."""
    return f"winograd_F{cfg.wino}_{max(op.kernel)}"


def direct_weights(w: np.ndarray, tile: Tile) -> np.ndarray:
    """A direct conv's (or the FC-as-GEMM's) weights (Cout, Cin[, kh, kw]) as its kernel reads them, as float32
    words: wt[K][Cout] (K = Cin*kh*kw in (c, r, s) order) for conv.cu and conv_tf32.cu, whose A tiles are rows
    along Cout; for conv_f16.cu IEEE binary16 (rounded to nearest even) w16[Cout][K8], K8 = K rounded up to a
    multiple of 8 with zeros, so each row is whole 16-byte pieces for its cp.async loads; for conv_nhwc.cu
    w16[Cout][KH][KW][Cin8] ((r, s, c) order, Cin padded to 8 with zeros), binary16 or, for its tf32 tiles, float32
    rounded to TF32 (``round_tf32``), for its fp32 tiles float32 (they split it in two TF32 halves themselves);
    conv_input_nhwc.cu reads wt as conv.cu."""
    if tile.prefix.startswith("conv_nhwc"):
        cout, cin, kh, kw = w.shape
        tf32, f32 = tile.prefix.startswith("conv_nhwc_tf32"), tile.prefix.startswith("conv_nhwc_f32")
        w16 = np.zeros((cout, kh, kw, -(-cin // NHWC_PIECE) * NHWC_PIECE),
                       np.float32 if tf32 or f32 else np.float16)
        with np.errstate(over="ignore"):
            w16[..., :cin] = w.transpose(0, 2, 3, 1)
        w16 = w16.reshape(cout, -1)
        return round_tf32(w16) if tf32 else w16 if f32 else w16.view(np.float32)
    w = w.reshape(w.shape[0], -1)
    if tile.prefix != "conv_f16":
        return np.ascontiguousarray(w.T, dtype=np.float32)
    w16 = np.zeros((w.shape[0], -(-w.shape[1] // 8) * 8), np.float16)
    with np.errstate(over="ignore"):
        w16[:, :w.shape[1]] = w
    return w16.view(np.float32)


def round_tf32(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 as cvt.rna.tf32.f32 does: 10 mantissa bits, to nearest, ties away from zero
    (half of the dropped range added to the magnitude bits); infinities and NaNs unchanged."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    return np.where(finite, (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000), bits).view(np.float32)


def op_params(weights: Weights, op: ConvOp | FCOp) -> tuple[np.ndarray, np.ndarray]:
    """(weight, bias) of a conv or FC; a fused conv's stacked in member order, with zero bias for the members whose
    moved pool adds theirs (plan.FusedConvOp)."""
    if not isinstance(op, FusedConvOp):
        return weights.arrays[op.name + ".weight"], weights.arrays[op.name + ".bias"]
    first_pooled = len(op.members) - op.pooled
    w = np.concatenate([weights.arrays[m + ".weight"] for m in op.members])
    b = np.concatenate([weights.arrays[m + ".bias"] * (i < first_pooled) for i, m in enumerate(op.members)])
    return w, b.astype(np.float32)


def pack_params(weights: Weights, plan: Plan, configs: dict[str, ConvConfig | None]) -> tuple[np.ndarray,
                                                                                             dict[str, int]]:
    """Every parameter in the layout its kernel reads, in one float32 array, and each key's element offset
    (ALIGN-aligned, so every array starts on a 256-byte boundary as arena buffers do).

    A direct conv's weights are laid out by ``direct_weights`` for its kernel; a Winograd conv's become U
    (``winograd_weights``), and the transforms it uses are stored once under "<transforms_key>.bt" / ".at". The FC
    weight stays (out, in) for fc_gemv and takes its kernel's ``direct_weights`` layout when the FC runs as a
    1x1-conv GEMM.
    """
    parts: list[np.ndarray] = []
    offsets: dict[str, int] = {}
    pos = 0

    def add(key: str, a: np.ndarray) -> None:
        nonlocal pos
        a = np.ascontiguousarray(a, dtype=np.float32).ravel()
        offsets[key] = pos
        padded = align(a.size)
        parts.extend([a, np.zeros(padded - a.size, np.float32)])
        pos += padded

    for op in plan.ops:
        if isinstance(op, PoolOp) and op.bias:
            add(op.bias + ".bias", weights.arrays[op.bias + ".bias"])
        if not isinstance(op, (ConvOp, FCOp)):
            continue
        w, b = op_params(weights, op)
        cfg = configs[op.name]
        if cfg is not None and cfg.wino:
            w = winograd_weights(w, cfg.wino, o_pad(op.dst.channels, cfg.tile))
            key = transforms_key(op, cfg)
            if f"{key}.bt" not in offsets:
                bt, at = winograd_transforms(cfg.wino, max(op.kernel))
                add(f"{key}.bt", bt)
                add(f"{key}.at", at)
        elif cfg is not None:
            w = direct_weights(w, cfg.tile)
        add(op.name + ".weight", w)
        add(op.name + ".bias", b)
    return np.concatenate(parts), offsets


@dataclass(frozen=True)
class LaunchSpec:
    """One kernel launch: everything pycuda needs, as plain numbers."""

    op: str  # the plan op it belongs to (per-layer timing groups by this)
    kernel: str  # entry point in the cubins
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[int, ...]  # device pointers and int32s, in the kernel's parameter order
    shared: int = 0  # bytes of dynamic shared memory


# Parameter lists of the kernels as pycuda struct formats: P = pointer, i = int32, q = int64.
CONV_FORMAT = "PPPP" + "i" * 14
FIXUP_FORMAT = CONV_FORMAT + "PP"  # ... and the split-K workspace and tile counters
ARG_FORMATS = {
    "conv_splitk_reduce": "PPP" + "i" * 6,
    "pool2d": "PP" + "i" * 13,
    "global_avg_pool": "PP" + "i" * 5,
    "fc_gemv": "PPPP" + "i" * 4,
    "softmax_rows": "PP" + "i" * 3,
    "gpu_sleep": "q",
    "normalize_u8_nchw": "PPPii",
    "softmax_topk_rows": "PPPiii",
    **{name: "PPPP" + "i" * 5 for name in ("resize_pil_h", "resize_pil_v")},  # gpu_decode.py's resize
    **{name + e.suffix: fmt for e in NHWC_ELEMS.values()
       for name, fmt in (("pool2d_nhwc", "PP" + "i" * 13 + "P"), ("global_avg_pool_nhwc", "PP" + "i" * 5),
                         ("conv_input_nhwc", "PPPP" + "i" * 14))},
    **{f"conv_nhwc{e.suffix}_splitk_reduce": "PPP" + "i" * 14 for e in NHWC_ELEMS.values()},
}
NHWC_CONV_FORMAT = "PPPP" + "i" * 25  # ... k_split, then the parts (nhwc_parts)
WINO_INPUT_FORMAT = "PPP" + "i" * 10
WINO_GEMM_FORMAT = "PPP" + "i" * 6
WINO_OUTPUT_FORMAT = "PPPP" + "i" * 10
SOURCE_OF = {"conv_splitk_reduce": "conv.cu", "pool2d": "pool.cu", "global_avg_pool": "pool.cu",
             **{f"conv_nhwc{e.suffix}_splitk_reduce": "conv_nhwc.cu" for e in NHWC_ELEMS.values()},
             **{f"{name}{e.suffix}": source for e in NHWC_ELEMS.values()
                for name, source in (("pool2d_nhwc", "pool_nhwc.cu"), ("global_avg_pool_nhwc", "pool_nhwc.cu"),
                                     ("conv_input_nhwc", "conv_input_nhwc.cu"))},
             "fc_gemv": "fc.cu", "softmax_rows": "softmax.cu", "gpu_sleep": "timing.cu",
             "normalize_u8_nchw": "pipeline_io.cu", "softmax_topk_rows": "pipeline_io.cu",
             "resize_pil_h": "resize_pil.cu", "resize_pil_v": "resize_pil.cu"}


def wgmma_ring_bytes(kernel: str) -> int:
    """Dynamic shared memory of a conv_nhwc.cu wgmma tile (its ring: stages of BM + BN rows of 64 bytes, and for
    fp32's the low halves' tiles; for a warp-specialized tile, each stage's two mbarriers too), else 0: conv_nhwc.cu's
    wgmma_ring_bytes() and ws_ring_bytes()."""
    if "_wgmma_" not in kernel and not is_ws(kernel):
        return 0
    bm, bn = (int(v) for v in kernel.rsplit("_", 1)[1].split("x"))
    if is_ws(kernel):
        return ws_stages(bm, bn) * ((bm + bn) * 64 + 16)
    split = kernel.startswith(WGMMA_PREFIX["fp32"])
    return (wgmma_stages(bm, bn, split) + WGMMA_LO_TILES * split) * (bm + bn) * 64


def conv_kernel_name(kernel: tuple[int, int], tile: Tile, fixup: bool = False) -> str:
    assert tile.fixup or not fixup, f"{tile.prefix} {tile.name} has no _fixup variant"
    return f"{tile.prefix}_{kernel[0]}x{kernel[1]}_{tile.name}" + ("_fixup" if fixup else "")


def wino_kernel_names(kernel: tuple[int, int], m: int, tile: Tile, splits: int = 1) -> tuple[str, str, str]:
    """winograd.cu's input transform, batched GEMM and output transform for this kernel shape, output tile m and
    GEMM tile (the output transform that sums split-K slices when splits > 1)."""
    variant, slices = f"{kernel[0]}x{kernel[1]}_F{m}", "_slices" if splits > 1 else ""
    return f"wino_input_{variant}", f"wino_gemm_{tile.name}{slices}", f"wino_output_{variant}{slices}"


def arg_format(kernel: str) -> str:
    if kernel in ARG_FORMATS:
        return ARG_FORMATS[kernel]
    for prefix, fmt in (("wino_input_", WINO_INPUT_FORMAT), ("wino_gemm_", WINO_GEMM_FORMAT),
                        ("wino_output_", WINO_OUTPUT_FORMAT), ("conv_nhwc_", NHWC_CONV_FORMAT)):
        if kernel.startswith(prefix):
            return fmt
    return FIXUP_FORMAT if kernel.endswith("_fixup") else CONV_FORMAT


def source_of(kernel: str) -> str:
    if kernel.startswith("wino_"):
        return "winograd.cu"
    if kernel in SOURCE_OF:
        return SOURCE_OF[kernel]
    for prefix in ("conv_tf32_", "conv_f16_", "conv_nhwc_"):
        if kernel.startswith(prefix):
            return prefix[:-1] + ".cu"
    return "conv.cu"


def unit_of(kernel: str) -> str:
    """The compile unit (cuda_build.UNITS) whose cubin holds ``kernel``."""
    return cuda_build.unit_of(source_of(kernel), kernel)


def all_kernel_names() -> list[str]:
    return ([conv_kernel_name(k, t, f) for k in KERNEL_SIZES for t in TILES + TF32_TILES + F16_TILES
             for f in ((False, True) if t.fixup else (False,))] + list(ARG_FORMATS)
            + sorted({name for k, ms in WINO_VARIANTS.items() for m in ms for t in WINO_TILES
                      for splits in (1, 2) for name in wino_kernel_names(k, m, t, splits)})
            + [f"{t.prefix}_{t.name}" for e in NHWC_ELEMS.values() for t in e.tiles(wgmma=True)])


def view_ptr(base: int, v: View) -> int:
    """Device address of element (0, 0, 0, 0) of the view."""
    return base + 4 * (v.offset + v.c_offset * v.h * v.w)


def batch_stride(v: View) -> int:
    return v.c_total * v.h * v.w


def _blocks(n: int, per_block: int) -> int:
    return max(1, math.ceil(n / per_block))


def conv_specs(name: str, src: View, dst: View, kernel: tuple[int, int], stride: int, pad: tuple[int, int],
               relu: bool, cfg: ConvConfig, arena: int, w: int, b: int, ws: int,
               counters: int | None = None) -> list[LaunchSpec]:
    """The implicit-GEMM launch when cfg.splits == 1. Split-K: one _fixup launch given tile counters (zeroed, see
    conv.cu) and a tile that has the variant, else the plain kernel into the workspace plus conv_splitk_reduce.
    w, b: weight/bias addresses."""
    n, cin, h, wd = src.dims
    _, cout, ho, wo = dst.dims
    n_total, t = n * ho * wo, cfg.tile
    split = cfg.splits > 1
    fixup = split and counters is not None and t.fixup
    y = view_ptr(arena, dst)
    args = (view_ptr(arena, src), w, b, ws if split and not fixup else y, n, cin, h, wd, batch_stride(src), cout, ho,
            wo, batch_stride(dst), stride, pad[0], pad[1], cfg.k_split, int(relu))
    gemm = LaunchSpec(name, conv_kernel_name(kernel, t, fixup),
                      (_blocks(n_total, t.bn), _blocks(cout, t.bm), cfg.splits), (THREADS, 1, 1),
                      args + ((ws, counters) if fixup else ()))
    if not split or fixup:
        return [gemm]
    reduce = LaunchSpec(name, "conv_splitk_reduce", (_blocks(cout * n_total, THREADS), 1, 1), (THREADS, 1, 1),
                        (ws, b, y, cfg.splits, cout, n_total, ho * wo, batch_stride(dst), int(relu)))
    return [gemm, reduce]


def winograd_specs(op: ConvOp, relu: bool, cfg: ConvConfig, arena: int, u: int, b: int, bt: int, at: int,
                   ws: int) -> list[LaunchSpec]:
    """The three launches of a Winograd conv (winograd.cu): V at ws, M (cfg.splits copies) right after it
    (``workspace_elems``). u, b: U (``winograd_weights``) and bias addresses; bt, at: the F(m, k) transforms
    (``winograd_transforms``)."""
    n, cin, h, w = op.src.dims
    _, cout, ho, wo = op.dst.dims
    shape = config_shape(op, cfg)
    v, m = ws, ws + 4 * shape.nn * cin * shape.t_pad
    opad = o_pad(cout, cfg.tile)
    k_in, k_gemm, k_out = wino_kernel_names(op.kernel, cfg.wino, cfg.tile, cfg.splits)
    return [
        LaunchSpec(op.name, k_in, (_blocks(cin * shape.t_total, THREADS), 1, 1), (THREADS, 1, 1),
                   (view_ptr(arena, op.src), bt, v, n, cin, h, w, batch_stride(op.src), shape.tiles_h, shape.tiles_w,
                    shape.t_pad, op.pad[0], op.pad[1])),
        LaunchSpec(op.name, k_gemm, (shape.t_pad // cfg.tile.bn, opad // cfg.tile.bm, shape.nn * cfg.splits),
                   (THREADS, 1, 1), (u, v, m, cin, cout, opad, shape.t_pad, shape.nn, cfg.k_split)),
        LaunchSpec(op.name, k_out, (_blocks(cout * shape.t_total, THREADS), 1, 1), (THREADS, 1, 1),
                   (m, at, b, view_ptr(arena, op.dst), n, cout, ho, wo, batch_stride(op.dst), shape.tiles_h,
                    shape.tiles_w, shape.t_pad, cfg.splits, int(relu))),
    ]


def pool_spec(op: PoolOp, arena: int) -> LaunchSpec:
    n, c, h, w = op.src.dims
    _, _, ho, wo = op.dst.dims
    return LaunchSpec(op.name, "pool2d", (_blocks(n * c * ho * wo, THREADS), 1, 1), (THREADS, 1, 1),
                      (view_ptr(arena, op.src), view_ptr(arena, op.dst), n, c, h, w, batch_stride(op.src), ho, wo,
                       batch_stride(op.dst), op.kernel, op.stride, op.pad, int(op.kind == "max"),
                       int(op.count_include_pad)))


def gap_spec(op: GlobalAvgPoolOp, arena: int) -> LaunchSpec:
    n, c, h, w = op.src.dims
    return LaunchSpec(op.name, "global_avg_pool", (_blocks(n * c, THREADS // 32), 1, 1), (THREADS, 1, 1),
                      (view_ptr(arena, op.src), view_ptr(arena, op.dst), n, c, h * w, batch_stride(op.src),
                       batch_stride(op.dst)))


def fc_specs(op: FCOp, cfg: ConvConfig | None, arena: int, w: int, b: int, ws: int,
             counters: int | None = None) -> list[LaunchSpec]:
    n, fin, _, _ = op.src.dims
    fout = op.dst.channels
    if cfg is None:
        return [LaunchSpec(op.name, "fc_gemv", (_blocks(fout, THREADS // 32), n, 1), (THREADS, 1, 1),
                           (view_ptr(arena, op.src), w, b, view_ptr(arena, op.dst), fin, fout,
                            batch_stride(op.src), batch_stride(op.dst)))]
    # A 1x1 convolution of a (N, in, 1, 1) image: M = out, N = batch, K = in; no ReLU on the logits.
    return conv_specs(op.name, op.src, op.dst, (1, 1), 1, (0, 0), False, cfg, arena, w, b, ws, counters)


def softmax_spec(logits: View, arena: int, probs: int) -> LaunchSpec:
    n, c = logits.n, logits.channels
    return LaunchSpec("softmax", "softmax_rows", (n, 1, 1), (THREADS, 1, 1),
                      (view_ptr(arena, logits), probs, c, batch_stride(logits), c))


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
    """conv_nhwc.cu and pool_nhwc.cu move 16-byte pieces: every view but the input's needs channel counts, buffer
    widths and channel offsets that are multiples of 8, and fewer than 2^31 elements per buffer (conv_nhwc.cu's
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


def check_nhwc_precision(precision: str, wgmma: bool) -> None:
    """fp32 on the NHWC path has wgmma tiles only (conv_mma.cuh's NhwcF32): sm_90a."""
    if precision == "fp32" and not wgmma:
        raise EngineError("fp32 on the NHWC layout runs on Hopper's wgmma tiles only (sm_90a); this GPU has none: "
                          "use the default layout")


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
    """conv_nhwc.cu's parts arguments (its header): start, element offset from part 0 and pixel stride of parts
    1-3, then relu_end. A plain conv has one part; a fused conv's (plan.FusedConvOp) follow its members."""
    cout = op.dst.channels
    if not isinstance(op, FusedConvOp):
        return (cout, 0, 0) * 3 + (cout,)
    assert 1 <= len(op.parts) <= 4, f"{op.name}: conv_nhwc.cu writes at most 4 parts, not {len(op.parts)}"
    base, start, rest = op.parts[0].offset + op.parts[0].c_offset, op.parts[0].channels, []
    for v in op.parts[1:]:
        rest.append((start, v.offset + v.c_offset - base, v.c_total))
        start += v.channels
    rest += [(cout, 0, 0)] * (3 - len(rest))
    relu_end = sum(v.channels for v in op.parts[:len(op.parts) - op.pooled])
    return tuple(x for part in rest for x in part) + (relu_end,)


def nhwc_conv_specs(op: ConvOp, cfg: ConvConfig, x: int, x_cstride: int, cin: int, y: int, w: int, b: int,
                    ws: int, precision: str = "fp16", num_sms: int | None = None) -> list[LaunchSpec]:
    """conv_nhwc.cu's launch (x, y: ``nhwc_ptr`` addresses; y that of the first part of a fused conv), and its
    split-K reduction when cfg.splits > 1; for INPUT_TILE conv_input_nhwc.cu's, x then the float32 NCHW input
    (x_cstride unused). A warp-specialized or halo tile's blocks loop over the tiles: num_sms of them (one an SM), or
    one per tile where there are fewer or num_sms is None."""
    n, _, h, wd = op.src.dims
    _, cout, ho, wo = op.dst.dims
    y_cstride = writes(op)[0].c_total
    p_total, t, suffix = n * ho * wo, cfg.tile, NHWC_ELEMS[precision].suffix
    if t.prefix == "conv_input":
        assert cfg.splits == 1 and not isinstance(op, FusedConvOp), f"{op.name}: conv_input_nhwc: 1 slice, 1 part"
        return [LaunchSpec(op.name, f"conv_input_nhwc{suffix}", (_blocks(p_total, t.bm), _blocks(cout, t.bn), 1),
                           (THREADS, 1, 1), (x, w, b, y, n, cin, h, wd, cout, ho, wo, op.dst.c_total, *op.kernel,
                                             op.stride, *op.pad, 1))]
    split = cfg.splits > 1
    parts = nhwc_parts(op)
    args = (x, w, b, ws if split else y, n, cin, h, wd, x_cstride, cout, ho, wo, y_cstride, *op.kernel,
            op.stride, *op.pad, cfg.k_split, *parts)
    assert t in NHWC_ELEMS[precision].tiles(True), f"{op.name}: {t.prefix} {t.name} is not a {precision} NHWC tile"
    kernel = f"{t.prefix}_{t.name}"
    grid = (_blocks(p_total, t.bm), _blocks(cout, t.bn), cfg.splits)
    block, shared = WS_THREADS if is_ws(kernel) else THREADS, wgmma_ring_bytes(kernel)
    if is_halo(kernel):  # tiles of HALO_BM positions of each image's padded-width grid (conv_nhwc.cu)
        assert halo_fits(op, t) and not split, f"{op.name}: not a conv for {kernel}"
        wg = wd + 2 * op.pad[1]
        grid, block, shared = (n * _blocks(ho * wg, HALO_BM), 1, 1), HALO_THREADS, halo_smem_bytes(t, op.kernel, wg)
    if is_ws(kernel) or is_halo(kernel):
        tiles = math.prod(grid)
        grid = (min(tiles, num_sms or tiles), 1, 1)
    specs = [LaunchSpec(op.name, kernel, grid, (block, 1, 1), args, shared)]
    if split:
        specs.append(LaunchSpec(op.name, f"conv_nhwc{suffix}_splitk_reduce",
                                (_blocks(p_total * cout // 2, THREADS), 1, 1), (THREADS, 1, 1),
                                (ws, b, y, cfg.splits, p_total, cout, y_cstride, *parts)))
    return specs


def nhwc_pool_spec(op: PoolOp, arena: int, precision: str = "fp16", bias: int = 0) -> LaunchSpec:
    """pool_nhwc.cu's pool2d; bias: the device address of op.bias's bias (a moved pool), else 0."""
    assert bool(bias) == bool(op.bias), f"{op.name}: a moved pool needs its conv's bias, and only it"
    n, c, h, w = op.src.dims
    _, _, ho, wo = op.dst.dims
    elem = NHWC_ELEMS[precision]
    return LaunchSpec(op.name, f"pool2d_nhwc{elem.suffix}", (_blocks(n * ho * wo * c * elem.bytes // 16, THREADS), 1, 1),
                      (THREADS, 1, 1), (nhwc_ptr(arena, op.src, precision), nhwc_ptr(arena, op.dst, precision), n, c,
                                        h, w, op.src.c_total, ho, wo, op.dst.c_total, op.kernel, op.stride, op.pad,
                                        int(op.kind == "max"), int(op.count_include_pad), bias))


def nhwc_launch_specs(plan: Plan, configs: dict[str, ConvConfig | None], arena: int, side: int, params: int,
                      offsets: dict[str, int], ws: int, probs: int | None = None,
                      precision: str = "fp16", num_sms: int | None = None) -> list[LaunchSpec]:
    """The whole NHWC forward as launches, in plan order. arena: the NHWC activations of the precision's elements
    (the plan's offsets in elements); side: the float32 side buffer (``nhwc_side``); num_sms: the GPU's, the grid of
    the persistent tiles (``nhwc_conv_specs``)."""
    lay = nhwc_side(plan)
    elem = NHWC_ELEMS[precision]
    specs: list[LaunchSpec] = []
    ws_offsets = workspace_layout(plan, configs)[1]
    features = logits = None
    for op in plan.ops:
        if isinstance(op, (ConvOp, FCOp)):
            wp, bp = params + 4 * offsets[op.name + ".weight"], params + 4 * offsets[op.name + ".bias"]
            ws_op = ws + 4 * ws_offsets.get(op.name, 0)
        if isinstance(op, ConvOp):
            cfg = configs[op.name]
            reads_input = op.src.buffer == plan.input.buffer
            assert cfg is not None and (cfg.tile == INPUT_TILE) == reads_input, f"{op.name}: not an NHWC config"
            x = side + 4 * lay.input if reads_input else nhwc_ptr(arena, op.src, precision)
            specs += nhwc_conv_specs(op, cfg, x, op.src.c_total, op.src.channels,
                                     nhwc_ptr(arena, writes(op)[0], precision), wp, bp, ws_op, precision, num_sms)
        elif isinstance(op, PoolOp):
            bias = params + 4 * offsets[op.bias + ".bias"] if op.bias else 0
            specs.append(nhwc_pool_spec(op, arena, precision, bias))
        elif isinstance(op, GlobalAvgPoolOp):
            nb, ch, hh, ww = op.src.dims
            features = View("features", lay.features, op.dst.dims, 0, ch)
            specs.append(LaunchSpec(op.name, f"global_avg_pool_nhwc{elem.suffix}",
                                    (_blocks(nb * ch * elem.bytes // 16, THREADS), 1, 1), (THREADS, 1, 1),
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


# ---------------------------------------------------------------------------------------------------------------
# The GPU half: pycuda from here on.


def driver() -> Any:
    try:
        import pycuda.driver as drv
    except ImportError as e:
        if importlib.util.find_spec("pycuda") is None:
            raise BackendUnavailable("the GPU backends need pycuda, which is not installed (pip install '.[gpu]' "
                                     "on a machine with an NVIDIA GPU)") from None
        raise BackendUnavailable(f"pycuda is installed but cannot load ({e}); is the NVIDIA driver installed?"
                                 ) from None
    return drv


def probe(index: int = 0) -> tuple[Any, str]:
    """(device, nvcc target) of GPU ``index``, without creating a context; BackendUnavailable if there is none."""
    drv = driver()
    try:
        drv.init()
        if drv.Device.count() <= index:
            raise BackendUnavailable("no CUDA GPU found (the driver sees no device)")
        device = drv.Device(index)
        return device, cuda_build.target(device.compute_capability())
    except drv.Error as e:
        raise BackendUnavailable(f"the CUDA driver is unusable here ({str(e).splitlines()[0]}); "
                                 f"check the GPU with nvidia-smi") from None


class Gpu:
    """One device and its primary context (shared with the CUDA runtime, so cuDNN or PyTorch in the same process
    see the same memory). The context is current only inside ``with gpu:``; nothing is left pushed in between."""

    def __init__(self, index: int = 0):
        drv = driver()
        self.device, self.arch = probe(index)
        self.ctx = self.device.retain_primary_context()
        self.num_sms = self.device.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)

    def __enter__(self) -> Gpu:
        self.ctx.push()
        return self

    def __exit__(self, *exc: object) -> None:
        driver().Context.pop()

    def release(self) -> None:
        self.ctx.detach()


class Kernels:
    """The cubins of cuda_src loaded into the current context: the compile units given (default: all) at once, any
    other on first use; entry points prepared on first use."""

    def __init__(self, arch: str, units: Iterable[str] | None = None):
        self.arch = arch
        self._modules: dict[str, Any] = {}
        self._funcs: dict[str, Any] = {}
        self._load(cuda_build.UNITS if units is None else units)

    def _load(self, units: Iterable[str]) -> None:
        todo = [u for u in units if u not in self._modules]
        if todo:
            drv = driver()
            self._modules.update({u: drv.module_from_file(str(p)) for u, p in cuda_build.build(self.arch, todo).items()})

    def __getitem__(self, kernel: str) -> Any:
        if kernel not in self._funcs:
            unit = unit_of(kernel)
            self._load([unit])
            fn = self._modules[unit].get_function(kernel)
            fn.prepare(arg_format(kernel))
            # past the default limit of 48 KB the kernel must opt in; a halo tile's need depends on the conv
            ring = MAX_SHARED_BYTES if is_halo(kernel) else wgmma_ring_bytes(kernel)
            if ring > 48 * 1024:
                fn.set_attribute(driver().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, ring)
            self._funcs[kernel] = fn
        return self._funcs[kernel]


@dataclass(frozen=True)
class Launch:
    spec: LaunchSpec
    func: Any  # prepared pycuda Function

    def __call__(self, stream: Any) -> None:
        self.func.prepared_async_call(self.spec.grid, self.spec.block, stream, *self.spec.args,
                                      shared_size=self.spec.shared)


class CudaBackend:
    name = "cuda"
    PRECISIONS = PRECISIONS

    @classmethod
    def check_available(cls) -> None:
        _, arch = probe()
        if not cuda_build.is_cached(arch) and cuda_build.find_nvcc() is None:
            raise BackendUnavailable(f"nvcc (the CUDA compiler) is not on PATH and no compiled kernels for "
                                     f"{arch} are cached; install the CUDA toolkit or put its bin/ on PATH")

    def __init__(self, weights: Weights, plan: Plan, graph: bool = True, softmax: bool = False, device: int = 0,
                 concurrent: bool | None = None, fixup: bool = False, precision: str = "fp32",
                 winograd: bool | None = True, tiles: tuple[Tile, ...] | None = None, tune: bool | str = False,
                 configs: dict[str, ConvConfig | None] | None = None, nhwc: bool | None = None,
                 fuse: bool | None = None):
        """softmax: forward returns probabilities (softmax on the GPU) instead of logits. concurrent: run the
        branches of each Inception module on several streams (``schedule``); default: with the graph only, where
        the fork/join events cost no host time. A plan not built for that (``build_plan(concurrent=True)``) is
        rebuilt so. fixup: split-K convs reduce inside the conv kernel (one launch), else in conv_splitk_reduce
        (the default: measured faster on the H200, 1.03 vs 1.75 ms at batch 1, docs/PERFORMANCE.md round 1);
        the tensor-core kernels have no such variant, so in tf32/fp16 split-K always uses conv_splitk_reduce.
        precision: "fp32" (float32 accuracy: on NCHW the FFMA kernels, on NHWC 3xTF32 tensor-core GEMMs), "tf32"
        or "fp16" (tensor-core GEMMs for the convs and the batched FC, with TF32 or fp16 operands). winograd: the stride-1 3x3, 5x5, 1x7, 7x1 convs by Winograd (winograd.cu)
        always (True, the default), where the cost model expects it to be faster (None) or never (False); in every
        precision (the Winograd GEMMs are FFMA). The default is every eligible conv because that measured as fast
        as the model's choice or faster at every batch size (H100, one run: 0.97 vs 1.00 ms at batch 1, 3.26 vs
        3.33 at 8, 10.42 vs 10.43 at 32, 39.50 vs 39.52 at 128): the model assumes V and M miss L2, which at batch
        1 and 8 they do not. tiles: restrict the direct GEMMs to these tiles of the precision (tuning).
        tune: each conv's tile, split-K and Winograd-or-not measured on this GPU instead of the cost model's guess
        (``tune_configs``: a few seconds the first time, then from the cache); "cached": the cache's configs where
        this GPU and plan have been tuned, else the cost model's (no measuring). configs: use exactly these.
        nhwc: activations in NHWC buffers (conv_nhwc.cu, pool_nhwc.cu; no Winograd), fp16, TF32-rounded float32
        or (fp32, sm_90a only) float32: no per-element gather in the convs, and for fp16 half the activation bytes.
        Default (None): wherever the plan's channel counts allow it (``check_nhwc``), and for fp32 where the GPU
        has wgmma (fp16 measured 1.6x faster at batch 1 and 2.3x at batch 128 than fp32 NCHW activations on an
        H200, docs/PERFORMANCE.md round 5; fp32: round 10); False: conv.cu / conv_f16.cu / conv_tf32.cu and
        Winograd on fp32 NCHW activations.
        fuse (NHWC only; default: with NHWC): each module's 1x1 convs that read its input as one GEMM, with the
        average pool of the pool branch moved behind its conv (plan.fuse_pointwise), which needs a plan whose
        buffers live for whole stages (rebuilt so, as for concurrent). A plan fused already is taken as it is."""
        if precision not in PRECISIONS:
            raise EngineError(f"the cuda backend has no {precision!r} mode; choose one of {', '.join(PRECISIONS)}")
        wgmma = cuda_build.has_wgmma(probe(device)[1]) if precision == "fp32" and nhwc is not False else True
        if nhwc:
            check_nhwc_precision(precision, wgmma)
            check_nhwc(plan)
        elif nhwc is None:
            nhwc = nhwc_fits(plan) and (precision != "fp32" or wgmma)
        self.nhwc = nhwc
        self.precision = precision
        self.fixup = fixup
        self.winograd = winograd
        self.tiles = tiles
        self.concurrent = graph if concurrent is None else concurrent
        fused = is_fused(plan)
        self.fuse = fused or (nhwc if fuse is None else fuse)
        if self.fuse and not nhwc:
            raise EngineError("fused 1x1 convolutions run on the NHWC layout only")
        if (self.concurrent or self.fuse) and not plan.concurrent:
            if not plan.layers:
                raise ValueError("a concurrent or fused cuda backend needs a plan from build_plan (it has no layers)")
            plan = build_plan(plan.batch, list(plan.layers), input_size=plan.input.h, concurrent=True)
        if self.fuse and not fused:
            plan = fuse_pointwise(plan)
        if plan.arena_elems >= 2**31:
            raise EngineError(f"batch {plan.batch} is too large for the cuda backend (32-bit indexing); "
                              f"use a smaller batch")
        if tune and configs is None:
            configs = tune_configs(weights, plan, precision, fixup, winograd, device, nhwc=nhwc,
                                   measure=tune != "cached")
        self._given_configs = configs
        drv = driver()
        self.plan = plan
        self.graph_mode = graph
        self._gpu = Gpu(device)
        self._allocs: list[Any] = []
        self._device_bytes = 0
        self._graph: Any = None
        self._sleep: Any = None
        self._launches: list[Launch] = []
        self._streams: list[Any] = []
        self._stages: list[tuple[Any, list[tuple[Any, Any, list[Any], list[Launch]]], list[tuple[Any, Any]]]] = []
        self._tail: list[Launch] = []
        self._host: list[Any] = []
        self._closed = False
        try:
            with self._gpu:
                try:
                    self._setup(weights, softmax, drv)
                except BaseException:
                    self._free()
                    raise
        except BaseException:
            self._gpu.release()
            self._closed = True
            raise

    def _alloc(self, elems: int) -> int:
        drv = driver()
        nbytes = 4 * max(elems, 1)
        try:
            a = drv.mem_alloc(nbytes)
        except drv.MemoryError:
            need = self._device_bytes + nbytes
            raise BackendUnavailable(f"not enough GPU memory for batch {self.plan.batch} (needs ~{need >> 20} MiB); "
                                     f"use a smaller batch") from None
        self._allocs.append(a)
        self._device_bytes += nbytes
        return int(a)

    def _setup(self, weights: Weights, softmax: bool, drv: Any) -> None:
        plan = self.plan
        self.configs = self._given_configs or choose_configs(plan, self._gpu.num_sms, self.fixup, self.precision,
                                                             self.winograd, self.tiles, self.nhwc,
                                                             cuda_build.has_wgmma(self._gpu.arch))
        params, offsets = pack_params(weights, plan, self.configs)
        if self.nhwc:  # fp16: two activations per float32 word (arena_elems is a multiple of ALIGN, so even)
            elem = NHWC_ELEMS[self.precision]
            words = plan.arena_elems * elem.bytes // 4
            self._arena = self._alloc(words)
            drv.memset_d32(self._arena, elem.nan_word, words)
            side = nhwc_side(plan)
            self._side = self._alloc(side.elems)
            drv.memset_d32(self._side, NAN_BITS, side.elems)
        else:
            self._arena = self._alloc(plan.arena_elems)
            drv.memset_d32(self._arena, NAN_BITS, plan.arena_elems)
        self._params = self._alloc(params.size)
        self._ws = self._alloc(workspace_layout(plan, self.configs)[0])
        self._probs = self._alloc(plan.batch * plan.output.channels) if softmax else None
        n_counters = counter_layout(plan, self.configs)[0]
        self._counters = self._alloc(n_counters) if self.fixup and n_counters else None
        if self._counters is not None:
            drv.memset_d32(self._counters, 0, n_counters)
        drv.memcpy_htod(self._params, params)
        drv.Context.synchronize()
        self._stream = drv.Stream(1)  # CU_STREAM_NON_BLOCKING: no implicit sync with the legacy stream
        self._x_host = drv.pagelocked_empty(plan.input.dims, np.float32)
        self._y_host = drv.pagelocked_empty((plan.batch, plan.output.channels), np.float32)
        self._host = [self._x_host, self._y_host]
        if self.nhwc:
            self._in_ptr = self._side + 4 * side.input
            self._out_ptr = self._probs if softmax else self._side + 4 * side.logits
            self.specs = nhwc_launch_specs(plan, self.configs, self._arena, self._side, self._params,
                                           offsets, self._ws, self._probs, self.precision, self._gpu.num_sms)
        else:
            self._in_ptr = view_ptr(self._arena, plan.input)
            self._out_ptr = self._probs if softmax else view_ptr(self._arena, plan.output)
            self.specs = launch_specs(plan, self.configs, self._arena, self._params, offsets, self._ws, self._probs,
                                      self._counters)
        # Only the units these launches need (a first run compiles one precision's), plus gpu_sleep (time_layers)
        # and the streaming pipeline's ends: all built in parallel.
        kernels = Kernels(self._gpu.arch, {unit_of(k) for k in {s.kernel for s in self.specs} | {
            "gpu_sleep", "normalize_u8_nchw", "softmax_topk_rows"}})
        self.kernels = kernels
        self._launches = [Launch(s, kernels[s.kernel]) for s in self.specs]
        self._sleep = kernels["gpu_sleep"]
        if self.concurrent:
            self._setup_streams(drv)
        if self.graph_mode:
            from ..cuda_graph import CudaGraph

            self._graph = CudaGraph(self._stream.handle, self._launch_all)

    def _setup_streams(self, drv: Any) -> None:
        """Streams and events for ``schedule(plan)``: per op its launches, stream and the events it waits for;
        per stage a fork event and the join events of its side streams. Events are recorded anew each forward."""
        plan, sched = self.plan, schedule(self.plan)
        by_op: dict[str, list[Launch]] = {}
        for launch in self._launches:
            by_op.setdefault(launch.spec.op, []).append(launch)
        self._streams = [self._stream] + [drv.Stream(1) for _ in range(max(s.stream for s in sched))]
        flags = drv.event_flags.DISABLE_TIMING
        done = {j: drv.Event(flags) for s in sched for j in s.waits}
        for stage in sorted(set(plan.stages)):
            ops = [i for i, st in enumerate(plan.stages) if st == stage]
            side = sorted({sched[i].stream for i in ops} - {0})
            steps = [(self._streams[sched[i].stream], done.get(i), [done[j] for j in sched[i].waits],
                      by_op.get(plan.ops[i].name, [])) for i in ops]
            self._stages.append((drv.Event(flags), steps, [(self._streams[k], drv.Event(flags)) for k in side]))
        self._tail = [launch for launch in self._launches if launch.spec.op not in {op.name for op in plan.ops}]

    def _launch_all(self) -> None:
        if not self.concurrent:
            for launch in self._launches:
                launch(self._stream)
            return
        main = self._stream
        for fork, steps, joins in self._stages:
            if joins:
                fork.record(main)
                for stream, _ in joins:
                    stream.wait_for_event(fork)
            for stream, done, waits, launches in steps:
                for event in waits:
                    stream.wait_for_event(event)
                for launch in launches:
                    launch(stream)
                if done is not None:
                    done.record(stream)
            for stream, join in joins:
                join.record(stream)
                main.wait_for_event(join)
        for launch in self._tail:
            launch(main)

    # What a caller that drives the GPU itself (cuda_stream.CudaRunner) needs: the context, the stream every forward
    # runs on, where the (batch, 3, size, size) float32 input goes and the (batch, classes) output comes out.
    @property
    def gpu(self) -> Gpu:
        self._check_open()
        return self._gpu

    @property
    def stream(self) -> Any:
        return self._stream

    @property
    def input_ptr(self) -> int:
        return self._in_ptr

    @property
    def output_ptr(self) -> int:
        return self._out_ptr

    def replay(self) -> None:
        """Enqueue one forward on ``stream`` (the context current), reading input_ptr, writing output_ptr."""
        self._run()

    def _run(self) -> None:
        if self._graph is not None:
            self._graph.launch()
        else:
            self._launch_all()

    def _check_open(self) -> None:
        """Before entering the context: a closed backend has released it, so it must not push or pop it."""
        if self._closed:
            raise EngineError("this cuda backend was closed; create a new one")

    def _upload(self, x: np.ndarray) -> None:
        if tuple(x.shape) != self.plan.input.dims:
            raise ValueError(f"input shape {tuple(x.shape)} does not match the plan's {self.plan.input.dims}")
        np.copyto(self._x_host, x, casting="same_kind")
        driver().memcpy_htod_async(self._in_ptr, self._x_host, self._stream)

    def forward(self, x: np.ndarray) -> np.ndarray:
        drv = driver()
        self._check_open()
        with self._gpu:
            self._upload(x)
            self._run()
            drv.memcpy_dtoh_async(self._y_host, self._out_ptr, self._stream)
            self._stream.synchronize()
        return self._y_host.copy()

    def time_forward(self, x: np.ndarray, iters: int, warmup: int) -> list[float]:
        """Milliseconds per forward on the GPU's clock (CUDA events around the launches; the input is uploaded
        once before). Each forward starts from an idle GPU, as a latency-bound caller would see it."""
        drv = driver()
        self._check_open()
        with self._gpu:
            self._upload(x)
            return event_timed_ms(drv, self._stream, self._run, iters, warmup)

    def time_layers(self, x: np.ndarray, iters: int = 20, warmup: int = 1,
                    only: set[str] | None = None) -> dict[str, list[float]]:
        """Per op (or the ops named in ``only``): milliseconds of GPU time of its launches (a split-K conv counts
        both, a Winograd conv its three), launched eagerly.

        gpu_sleep holds the GPU while the host enqueues start event, the op's launches and end event for all
        iterations, so launch latency of the host is not counted as kernel time.
        """
        drv = driver()
        groups: dict[str, list[Launch]] = {}
        for launch in self._launches:
            if only is None or launch.spec.op in only:
                groups.setdefault(launch.spec.op, []).append(launch)
        out: dict[str, list[float]] = {}
        self._check_open()
        with self._gpu:
            self._upload(x)
            for _ in range(max(1, warmup)):
                self._launch_all()  # every buffer now holds what this op reads in a real forward
            events = [(drv.Event(), drv.Event()) for _ in range(iters)]
            for op, launches in groups.items():
                # 20 us of host time per enqueued call is generous; a longer sleep only costs idle GPU time.
                sleep_ns = 20_000 * (len(launches) + 2) * iters + 50_000
                self._sleep.prepared_async_call((1, 1, 1), (1, 1, 1), self._stream, sleep_ns)
                for start, end in events:
                    start.record(self._stream)
                    for launch in launches:
                        launch(self._stream)
                    end.record(self._stream)
                self._stream.synchronize()
                out[op] = [end.time_since(start) for start, end in events]
            del events  # destroyed while the context is current
        return out

    def peak_memory_bytes(self) -> int:
        """Device memory this backend holds: arena, parameters, workspace (split-K, Winograd), probabilities."""
        return self._device_bytes

    def _free(self) -> None:
        if self._graph is not None:
            self._graph.close()
            self._graph = None
        for a in self._allocs:
            a.free()
        self._allocs = []
        for h in self._host:
            h.base.free()  # pagelocked_empty's array base is its HostAllocation
        self._host = []
        self._x_host = self._y_host = None
        self._launches = []
        self._stages, self._tail, self._streams = [], [], []
        self._sleep = None

    def close(self) -> None:
        if self._closed:
            return
        with self._gpu:
            self._free()
        self._gpu.release()
        self._closed = True

    def __enter__(self) -> CudaBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------------------
# Self-test: one forward against the float64 NumPy reference (compute-sanitizer runs this).


def tuning_cache_dir() -> Path:
    return user_cache_dir() / "tuning"


def time_convs(weights: Weights, plan: Plan, configs: dict[str, ConvConfig | None], precision: str = "fp32",
               fixup: bool = False, device: int = 0, iters: int = 10, nhwc: bool = False) -> dict[str, float]:
    """Median milliseconds of each conv of a forward with these configs: one eager, serial backend on this very plan
    (fused or not), CudaBackend.time_layers on an N(0, 1) input."""
    x = np.random.default_rng(0).standard_normal(plan.input.dims).astype(np.float32)
    with CudaBackend(weights, plan, graph=False, concurrent=False, device=device, fixup=fixup, precision=precision,
                     configs=configs, nhwc=nhwc, fuse=is_fused(plan)) as backend:
        ms = backend.time_layers(x, iters=iters, only={op.name for op in plan.conv_ops})
    return {name: statistics.median(t) for name, t in ms.items()}


def tune_configs(weights: Weights, plan: Plan, precision: str = "fp32", fixup: bool = False,
                 winograd: bool | None = True, device: int = 0, iters: int = 10,
                 nhwc: bool = False, measure: bool = True) -> dict[str, ConvConfig | None] | None:
    """The configs of a forward with each conv's measured fastest candidate (``tuning_candidates``: every direct
    tile, and Winograd unless winograd is False), each conv timed in place with CudaBackend.time_layers (median of
    ``iters``) in one eager backend per candidate set. Cached per GPU, kernel build, conv shapes and mode as JSON in
    ``tuning_cache_dir()``, so only the first backend of a kind pays for it. measure=False: the cached configs or
    None (the caller then takes the cost model's)."""
    gpu = Gpu(device)
    try:
        key = tuning_key(gpu.device.name(), gpu.arch, gpu.num_sms, plan, precision, fixup, winograd, nhwc)
        num_sms, wgmma = gpu.num_sms, cuda_build.has_wgmma(gpu.arch)
    finally:
        gpu.release()
    path = tuning_cache_dir() / f"{key}.json"
    try:
        return {name: config_from_json(d) for name, d in json.loads(path.read_text()).items()}
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not tuned yet, or a damaged file: tune again
    if not measure:
        return None
    sets = tuning_candidates(plan, num_sms, fixup, precision, winograd, nhwc, wgmma)
    times = [time_convs(weights, plan, configs, precision, fixup, device, iters, nhwc) for configs in sets]
    best = pick_fastest(choose_configs(plan, num_sms, fixup, precision, winograd, nhwc=nhwc, wgmma=wgmma), sets,
                        times)
    saved = {name: config_to_json(c) for name, c in best.items()}
    atomic_write(path, lambda f: f.write(json.dumps(saved, indent=1).encode()))
    return {name: config_from_json(d) for name, d in saved.items()}  # as a later run reads them back


def he_weights(seed: int) -> Weights:
    """He-initialised random weights of the real shapes: activations stay O(1) through the 94 ReLU layers."""
    from .. import arch

    rng = np.random.default_rng(seed)
    arrays = {}
    for key, shape in arch.weight_shapes().items():
        fan_in = int(np.prod(shape[1:])) if key.endswith(".weight") else 0
        scale = math.sqrt(2.0 / fan_in) if fan_in else 0.1
        arrays[key] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return Weights(arrays, {"count_include_pad": True})


def rel_l2(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def top5_agree(got: np.ndarray, ref: np.ndarray) -> bool:
    """Same five classes in the same order, except swaps of classes the float64 reference puts within fp32 noise."""
    gi, ri = np.argsort(-got)[:5], np.argsort(-ref)[:5]
    noise = 1e-4 * np.abs(ref).max()
    return all(a == b or abs(ref[a] - ref[b]) <= noise for a, b in zip(gi, ri))


def top1_agree(got: np.ndarray, ref: np.ndarray, noise: float) -> bool:
    """Same top class, except where the float64 reference puts the two classes within ``noise`` of each other."""
    return bool(ref[np.argmax(got)] >= ref.max() - noise)


# Self-test limits: rel L2 of the logits against float64. TF32 keeps 10 mantissa bits (~5e-4 per layer).
SELFTEST_TOL = {"fp32": 1e-4, "tf32": 3e-3, "fp16": 3e-3}


def selftest(batch: int, graph: bool, input_size: int, seed: int = 0, concurrent: bool | None = None,
             precision: str = "fp32", winograd: bool | None = None, nhwc: bool | None = None,
             fuse: bool | None = None) -> bool:
    """fp32: rel L2 <= 1e-4 and the same top 5; tf32: rel L2 <= 3e-3 and the same top 1 (a tie within the TF32
    error of the reference's logits excepted)."""
    from .numpy_backend import NumpyBackend

    weights = he_weights(seed)
    plan = build_plan(batch, weights.layers(), input_size=input_size)
    x = np.random.default_rng(seed + 1).standard_normal(plan.input.dims).astype(np.float32)
    with CudaBackend(weights, plan, graph=graph, concurrent=concurrent, precision=precision,
                     winograd=winograd, nhwc=nhwc, fuse=fuse) as backend:
        got = backend.forward(x)
        fused = sum(isinstance(op, FusedConvOp) for op in backend.plan.ops)
        launches, streams = len(backend.specs), max(1, len(backend._streams))
        wino = sum(1 for c in backend.configs.values() if c is not None and c.wino)
        nhwc = backend.nhwc
    ref = NumpyBackend(weights, plan, dtype=np.float64).forward(x.astype(np.float64))
    err, tol = rel_l2(got, ref), SELFTEST_TOL[precision]
    if precision == "fp32":
        what, same = "top-5", all(top5_agree(g, r) for g, r in zip(got, ref))
    else:
        what, same = "top-1", all(top1_agree(g, r, 1e-3 * np.abs(r).max()) for g, r in zip(got, ref))
    ok = bool(np.isfinite(got).all()) and err <= tol and same
    print(f"cuda selftest ({precision}{', nhwc' if nhwc else ''}): batch {batch}, input {input_size}, graph {'on' if graph else 'off'}, "
          f"{launches} launches on {streams} stream(s), {wino} Winograd convs, {fused} fused 1x1 groups: "
          f"rel L2 {err:.2e} (limit {tol:.0e}), "
          f"{what} {'same' if same else 'DIFFERENT'} -> {'PASS' if ok else 'FAIL'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inception_engine.backends.cuda_backend")
    p.add_argument("--selftest", action="store_true", required=True, help="one forward vs the NumPy reference")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--graph", choices=("on", "off"), default="on")
    p.add_argument("--concurrent", choices=("on", "off", "auto"), default="auto",
                   help="branches on several streams (auto: with the graph only)")
    p.add_argument("--input-size", type=int, default=299, help="smaller images make sanitizer runs faster")
    p.add_argument("--precision", default="fp32", help=f"one of {', '.join(PRECISIONS)}")
    p.add_argument("--winograd", choices=("on", "off", "auto"), default="on",
                   help="stride-1 3x3/5x5/1x7/7x1 convs by Winograd (on, the backend's default: every eligible "
                        "conv; auto: where the cost model expects a gain)")
    p.add_argument("--fuse", choices=("on", "off", "auto"), default="auto",
                   help="each module's 1x1 convs as one GEMM (NHWC only; auto: with NHWC)")
    p.add_argument("--layout", choices=("auto", "nchw", "nhwc"), default="auto",
                   help="activations: nhwc = NHWC of the precision's elements (fp32: sm_90a only), nchw = fp32 "
                        "NCHW, auto = the backend's default (nhwc where the GPU allows it)")
    args = p.parse_args(argv)
    concurrent = None if args.concurrent == "auto" else args.concurrent == "on"
    winograd = None if args.winograd == "auto" else args.winograd == "on"
    try:
        return 0 if selftest(args.batch, args.graph == "on", args.input_size, concurrent=concurrent,
                             precision=args.precision, winograd=winograd,
                             nhwc=None if args.layout == "auto" else args.layout == "nhwc",
                             fuse=None if args.fuse == "auto" else args.fuse == "on") else 1
    except EngineError as e:
        print(f"cuda selftest: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
