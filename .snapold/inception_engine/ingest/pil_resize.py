"""Pillow's bilinear ``resize`` of 8-bit images, reproduced bit for bit in NumPy, restricted to a crop.

The algorithm is Pillow's (src/libImaging/Resample.c: ``precompute_coeffs``, ``normalize_coeffs_8bpc``,
``ImagingResampleHorizontal_8bpc`` / ``ImagingResampleVertical_8bpc`` and ``ImagingResampleInner``), written anew
from its description:

- per axis and output index ``xx``: ``scale = in / out`` (a box of whole pixels), the filter is stretched by
  ``max(scale, 1)`` (so shrinking averages over the whole footprint: antialiased), ``center = (xx + 0.5) * scale``,
  taps ``xmin = int(center - support + 0.5)`` (clamped to 0) up to ``int(center + support + 0.5)`` (clamped to the
  input size), weights ``triangle((x - center + 0.5) / max(scale, 1))`` normalised by their sum (summed in tap
  order), all in double;
- weights to fixed point with PRECISION_BITS = 32 - 8 - 2 = 22 fractional bits, rounded half away from zero;
- two passes, each output byte ``clip((2**21 + sum(pixel * weight)) >> 22)`` to 0..255, the second pass on the
  first one's bytes. Which pass runs first depends on the Pillow version: up to Pillow 12 always the horizontal one
  (over the source rows the vertical pass reads); from Pillow 13 (python-pillow/Pillow#9549) the vertical one when
  the height shrinks by more than twice as many pixels as the width (``h - H > 2 * (w - W)`` and ``H < h``, the
  rule as measured against Pillow 13.0). The two orders round differently, so this matters for exactness;
  ``pillow_vertical_first_rule`` finds out which kind of Pillow is installed.

An output pixel depends only on its own row's and column's coefficients and on integer sums (exact, in any order),
so evaluating only the rows and columns of a crop of the full resize gives exactly the crop of Pillow's result;
``Image.resize(..., box=...)`` would not (its coefficients are those of a different, shorter resize). Where an
axis keeps its size Pillow skips that pass; the coefficients are then [1.0, 0.0] per output, which the fixed-point
pass maps to the identity exactly, so running it anyway changes nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from PIL import Image


PRECISION_BITS = 32 - 8 - 2  # Resample.c: 8 bits of result, 2 for overflow and sign, the rest fraction
BILINEAR_SUPPORT = 1.0  # the triangle filter is non-zero on (-1, 1)


@dataclass(frozen=True)
class Coeffs:
    """Fixed-point taps of one axis for the outputs lo..hi-1 of a resize in_size -> out_size.

    Output ``lo + i`` is ``sum_t src[start[i] + t] * weights[i, t]`` (then rounded and clipped). Every output has
    ``taps`` entries: Pillow's taps, followed or preceded by zero weights, the window moved left where it would
    run past the input (``start[i] + taps <= in_size``), so a kernel reads no bounds and no tap counts."""

    start: np.ndarray  # (hi - lo,) int32: first source index
    weights: np.ndarray  # (hi - lo, taps) int32: weights with PRECISION_BITS fractional bits

    @property
    def taps(self) -> int:
        return self.weights.shape[1]

    def span(self) -> tuple[int, int]:
        """(first source index read, how many): the part of the input these outputs need."""
        lo = int(self.start.min())
        return lo, int(self.start.max()) + self.taps - lo

    def shifted(self, lo: int) -> Coeffs:
        """The same taps for an input that begins at source index lo."""
        return Coeffs(self.start - np.int32(lo), self.weights)


def resized_size(w: int, h: int, size: int) -> tuple[int, int]:
    """(w, h) after torchvision's Resize(size) with an int size: shorter side -> size, longer truncated."""
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = size, int(size * long / short)
    return (new_short, new_long) if w <= h else (new_long, new_short)


def crop_box(w: int, h: int, size: int) -> tuple[int, int, int, int]:
    """PIL crop box (left, top, right, bottom) of torchvision's CenterCrop(size) on a w x h image >= size."""
    top = int(round((h - size) / 2.0))
    left = int(round((w - size) / 2.0))
    return left, top, left + size, top + size


def coeffs(in_size: int, out_size: int, lo: int = 0, hi: int | None = None) -> Coeffs:
    """Pillow's bilinear coefficients for in_size -> out_size (the whole input as the box), outputs [lo, hi)."""
    hi = out_size if hi is None else hi
    if not (in_size > 0 and 0 <= lo < hi <= out_size):
        raise ValueError(f"bad coefficient range [{lo}, {hi}) of a resize {in_size} -> {out_size}")
    # Resample.c takes the box as C floats; a box of whole pixels below 2**24 is exact in float, then double.
    scale = float(np.float32(in_size)) / out_size
    filterscale = max(scale, 1.0)
    support = BILINEAR_SUPPORT * filterscale
    center = (np.arange(lo, hi, dtype=np.float64) + 0.5) * scale
    xmin = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)  # C's (int) truncates
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size)
    count = xmax - xmin
    ksize = int(count.max())
    ss = 1.0 / filterscale  # Resample.c multiplies by the reciprocal (not the same rounding as dividing)
    w = np.zeros((hi - lo, ksize), np.float64)
    total = np.zeros(hi - lo, np.float64)
    for t in range(ksize):  # tap by tap, so the sum accumulates in Pillow's order (np.sum would pair it up)
        x = (t + xmin - center + 0.5) * ss
        wt = np.where(t < count, np.maximum(1.0 - np.abs(x), 0.0), 0.0)
        w[:, t] = wt
        total += wt
    w = np.where(total[:, None] != 0.0, w / np.where(total != 0.0, total, 1.0)[:, None], w)
    scaled = w * (1 << PRECISION_BITS)  # a power of two: exact
    fixed = np.trunc(np.where(scaled < 0, scaled - 0.5, scaled + 0.5)).astype(np.int32)
    # Move windows that would run past the end left, their weights right by as much (zeros shift in).
    start = np.minimum(xmin, in_size - ksize)
    shift = xmin - start
    weights = np.zeros_like(fixed)
    rows = np.arange(hi - lo)
    for t in range(ksize):
        cols = t + shift
        keep = cols < ksize
        weights[rows[keep], cols[keep]] = fixed[keep, t]
    return Coeffs(start.astype(np.int32), weights)


def resample(src: np.ndarray, c: Coeffs, axis: int) -> np.ndarray:
    """One fixed-point pass along axis 0 (vertical) or 1 (horizontal) of an (h, w, channels) uint8 array."""
    src = src if axis == 1 else src.transpose(1, 0, 2)
    acc = np.full((src.shape[0], len(c.start), src.shape[2]), 1 << (PRECISION_BITS - 1), np.int64)
    for t in range(c.taps):
        acc += src[:, c.start + t, :].astype(np.int64) * c.weights[None, :, t, None]
    out = np.clip(acc >> PRECISION_BITS, 0, 255).astype(np.uint8)
    return out if axis == 1 else out.transpose(1, 0, 2)


def vertical_first(h: int, w: int, new_h: int, new_w: int) -> bool:
    """Whether Pillow 13's rule runs the vertical pass first for this resize (see the module doc)."""
    return new_h < h and h - new_h > 2 * (w - new_w)


@functools.cache
def pillow_vertical_first_rule() -> bool:
    """Whether the installed Pillow follows Pillow 13's pass order (True) or always goes horizontal first (False),
    told by one resize (5 x 40 -> 3 x 10, vertical first under the new rule) whose two orders give different
    bytes. Raises RuntimeError for a Pillow that does neither: its bytes could not be reproduced."""
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (40, 5, 3), dtype=np.uint8)
    x, y = coeffs(5, 3), coeffs(40, 10)
    got = np.asarray(Image.fromarray(src, "RGB").resize((3, 10), Image.BILINEAR))
    if np.array_equal(got, resample(resample(src, y, 0), x, 1)):
        return True
    if np.array_equal(got, resample(resample(src, x, 1), y, 0)):
        return False
    raise RuntimeError(f"Pillow {Image.__version__}'s bilinear resize follows neither known pass order")


@dataclass(frozen=True)
class ResizeCrop:
    """How to compute the centre crop of one resize: both axes' coefficients for the crop's outputs, the pass order,
    and the part of the source the first pass reads (rows of it when horizontal, columns when vertical)."""

    x: Coeffs
    y: Coeffs
    vertical_first: bool

    def first_span(self) -> tuple[int, int]:
        """(first source row or column the first pass reads, how many)."""
        return (self.x if self.vertical_first else self.y).span()


def plan_resize_crop(h: int, w: int, resize: int, size: int) -> ResizeCrop:
    """Coefficients of torchvision's Resize(resize) (PIL bilinear, shorter side -> resize) + CenterCrop(size)."""
    if resize < size:
        raise ValueError(f"resize {resize} is smaller than crop {size}")
    new_w, new_h = resized_size(w, h, resize)
    left, top, right, bottom = crop_box(new_w, new_h, size)
    return ResizeCrop(coeffs(w, new_w, left, right), coeffs(h, new_h, top, bottom),
                      pillow_vertical_first_rule() and vertical_first(h, w, new_h, new_w))


def resize_crop_u8(hwc: np.ndarray, resize: int = 342, size: int = 299) -> np.ndarray:
    """(size, size, 3) uint8 equal to ``np.asarray(img.resize(resized_size(...), BILINEAR).crop(crop_box(...)))``
    for the RGB image img whose pixels are hwc ((h, w, 3) uint8)."""
    if hwc.dtype != np.uint8 or hwc.ndim != 3:
        raise ValueError(f"expected an (h, w, channels) uint8 array, got {hwc.dtype} {hwc.shape}")
    plan = plan_resize_crop(hwc.shape[0], hwc.shape[1], resize, size)
    lo, n = plan.first_span()
    if plan.vertical_first:
        return resample(resample(hwc[:, lo:lo + n], plan.y, 0), plan.x.shifted(lo), 1)
    return resample(resample(hwc[lo:lo + n], plan.x, 1), plan.y.shifted(lo), 0)


def resize_crop_image(img: Image.Image, resize: int = 342, size: int = 299) -> np.ndarray:
    """resize_crop_u8 of an RGB PIL image, reading from it only the rectangle the crop's taps reach: memory is of
    the order of that rectangle and the crop, never of the whole resize, whatever the aspect ratio."""
    w, h = img.size
    plan = plan_resize_crop(h, w, resize, size)
    (x0, nx), (y0, ny) = plan.x.span(), plan.y.span()
    src = np.asarray(img.crop((x0, y0, x0 + nx, y0 + ny)), dtype=np.uint8)
    x, y = plan.x.shifted(x0), plan.y.shifted(y0)
    if plan.vertical_first:
        return resample(resample(src, y, 0), x, 1)
    return resample(resample(src, x, 1), y, 0)
