"""Winograd set-up for winograd.cu: which convs it computes (``winograd_eligible``, ``WINO_VARIANTS``), how
F(m x m, k x k) cuts a conv into tiles and work buffers (``winograd_shape``), and the weights (U) and transforms it
reads (``winograd_weights``, ``winograd_transforms``), computed in float64 from the CPU path's matrices
(numpy_primitives.winograd_matrices) and rounded once. Whether a conv takes Winograd is cost_model.py's choice."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...plan import ConvOp
from .tiles import Tile


# Kernel shape -> the output tiles m of F(m x m, k x k) (F(m, 7) along the long axis of 1x7 / 7x1) that winograd.cu
# instantiates. 1x7 / 7x1: F(3, 7) only, as the CPU path (numpy_primitives.winograd_tile): on the network's 17-wide
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


def o_pad(cout: int, tile: Tile) -> int:
    """U's row length: Cout rounded up to whole GEMM tiles (zero columns), so the GEMM loads without bounds checks."""
    return -(-cout // tile.bm) * tile.bm


def axis_matrices(m: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(AT, G, BT) of F(m, k) along one axis (numpy_primitives.winograd_matrices, float64); 1 x 1 ones for k == 1."""
    from ..numpy_primitives import winograd_matrices

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
