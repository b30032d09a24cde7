"""The preprocessing of the FID tools, each reproduced as the tool does it, named by the tool (``--resize``):

- ``torchvision``: the classifier's (images.py: shorter side to 342, Pillow bilinear with antialiasing, centre crop
  299, ImageNet mean and std); uint8 pixels.
- ``pytorch-fid`` (pytorch_fid/fid_score.py and inception.py): ``Image.open(path).convert("RGB")`` (no EXIF
  orientation, alpha dropped), ToTensor (x / 255), ``F.interpolate(x, size=(299, 299), mode="bilinear",
  align_corners=False)`` (no antialiasing: each output samples the two nearest inputs per axis, whatever the
  scale), then 2x - 1 (the FID weight file's mean = std = 0.5).
- ``clean-fid`` (cleanfid/resize.py, mode "clean"): ``np.array(Image.open(path).convert("RGB"))``, each channel
  resized as a float32 Pillow image (mode "F") to 299x299 with ``Image.BICUBIC`` and clipped to [0, 255], not
  quantised; its network then scales by (x - 128) / 128 (mean = std = 128/255 here).

A decode worker writes the network's input (images.Preprocess.decoded_shape). For pytorch-fid that is
cpu_src/fid_resize.c (pytorch_fid_input): torch's own float32 arithmetic, x / 255 first, as resize_fid.cu computes
it on the GPU decode path, resize and scaling in one pass. Where no C compiler builds it, and for clean-fid, the
resizes below give fractional pixels, float32 in [0, 255], normalised (x / 255 - mean) / std in float32; for
pytorch-fid that interpolates in float64 and divides by 255 after, so it agrees with torch to float32 rounding of the
coordinates (~1e-5), not bit for bit. With --decode gpu the GPU decoder's resizes (gpu_fid_resize.py, resize_fid.cu)
reproduce both on the GPU.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Sequence

import numpy as np
from PIL import Image

from .. import native_build
from .modes import RESIZE_MODES

log = logging.getLogger(__name__)

FID_SIZE = 299
# What each FID mode's network takes: (mean, std) of x / 255, per channel. pytorch-fid: 2x - 1 = (x - 0.5) / 0.5;
# clean-fid's InceptionV3W: (255x - 128) / 128 = (x - 128/255) / (128/255).
MODE_SCALING = {"pytorch-fid": (0.5, 0.5), "clean-fid": (128 / 255, 128 / 255)}


def bilinear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torch's bilinear interpolation with align_corners=False and no antialiasing (aten's
    area_pixel_compute_source_index and the linear kernel), per output index: (lo, hi, frac), output i being
    (1 - frac) * x[lo] + frac * x[hi]. Output i samples source position (i + 0.5) * in / out - 0.5, clamped at 0
    below, between its floor and the next pixel (the last one at the edge)."""
    src = np.maximum((np.arange(out_size) + 0.5) * (in_size / out_size) - 0.5, 0.0)
    lo = np.minimum(src.astype(np.int64), in_size - 1)
    return lo, np.minimum(lo + 1, in_size - 1), src - lo


def pytorch_fid_planes(rgb: np.ndarray, size: int = FID_SIZE) -> np.ndarray:
    """(H, W, 3) uint8 -> (3, size, size) float32 in [0, 255], a plane per channel (the network's layout):
    pytorch-fid's bilinear interpolation.

    Enlarging (H, W <= size, generators' 256 x 256 and smaller): Pillow's bilinear resize of each channel as a float32
    image. Where it does not shrink, Pillow's triangle filter keeps its support of one pixel, so each output takes
    torch's two taps with torch's weights (the same source position (i + 0.5) * in / out - 0.5, clamped at the
    edges); it sums in double and rounds to float32 between its two passes: within one float32 step of the float64
    result, about 3x faster. Shrinking (Pillow would widen the filter: antialiasing, which torch's bilinear does not
    do): the float64 taps, columns then rows (torch's order), as gathers of uint8 columns and of whole rows, no
    matrix product (the decode workers run it side by side, and a multi-threaded BLAS in each would oversubscribe
    the cores)."""
    h, w = rgb.shape[:2]
    if h <= size and w <= size:
        return pillow_planes(rgb, size, Image.BILINEAR)
    (ylo, yhi, fy), (xlo, xhi, fx) = bilinear_taps(h, size), bilinear_taps(w, size)
    cols = rgb[:, xlo] * (1.0 - fx)[None, :, None]
    cols += rgb[:, xhi] * fx[None, :, None]
    out = cols[ylo]
    out *= (1.0 - fy)[:, None, None]
    out += cols[yhi] * fy[:, None, None]
    return np.ascontiguousarray(np.moveaxis(out, -1, 0), dtype=np.float32)


# cpu_src/fid_resize.c alone: plain C (no vector extensions), each product and sum rounded on its own as written.
FID_C_SOURCES = ("fid_resize.c",)
FID_C_FLAGS = ("-O3", "-std=gnu11", "-fPIC", "-shared", "-ffp-contract=off")


# The engine's note where the C resize cannot be built (Engine.notes: printed on stderr by the commands).
PILLOW_FID_RESIZE_NOTE = ("no C compiler built cpu_src/fid_resize.c ($CC, else cc): pytorch-fid's resize runs through "
                          "Pillow, ~3x slower on the host, its pixels within float32 rounding of torch's")


@functools.cache
def fid_library() -> ctypes.CDLL | None:
    """cpu_src/fid_resize.c (``ie_fid_bilinear``), loaded; None where no C compiler builds it (the decode workers then
    resize through Pillow: pytorch_fid_planes), logged at debug level. A library of its own (a fraction of a second
    to compile, where the CPU backend's takes seconds and needs AVX-512), so that each decode worker builds or loads
    it alone."""
    try:
        lib = ctypes.CDLL(str(native_build.c_library("ie_fid", FID_C_SOURCES, FID_C_FLAGS)))
    except OSError as e:
        log.debug("the C FID resize is unavailable, decode workers resize through Pillow: %s", e)
        return None
    lib.ie_fid_bilinear.restype = ctypes.c_int
    lib.ie_fid_bilinear.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p,
                                    ctypes.c_int, ctypes.c_void_p]
    return lib


def pytorch_fid_input(rgb: np.ndarray, size: int, mean: Sequence[float], std: Sequence[float],
                      out: np.ndarray | None = None) -> np.ndarray | None:
    """(H, W, 3) uint8 -> the network's (3, size, size) float32 input, (x / 255 - mean) / std of pytorch-fid's
    bilinear interpolation, by cpu_src/fid_resize.c: torch's float32 arithmetic, resize_fid.cu's (the GPU decode
    path's), in one pass (~10x Pillow's three float32 channel resizes and the normalisation); None where that
    library cannot be built (no C compiler): pytorch_fid_planes then. ``out``: where to write it (a decode worker's
    ring slot: no new megabyte to fault in and copy), C-contiguous float32 of that shape."""
    lib = fid_library()
    if lib is None:
        return None
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    if out is None:
        out = np.empty((3, size, size), np.float32)
    elif out.shape != (3, size, size) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 (3, {size}, {size}), not {out.dtype} {out.shape}")
    mean_std = np.asarray([*mean, *std], np.float32)
    if lib.ie_fid_bilinear(rgb.ctypes.data, rgb.shape[0], rgb.shape[1], rgb.strides[0], out.ctypes.data, size,
                           mean_std.ctypes.data) != 0:
        raise MemoryError(f"no memory for the resize's tables of {size} rows and columns")
    return out


def clean_fid_planes(rgb: np.ndarray, size: int = FID_SIZE) -> np.ndarray:
    """(H, W, 3) uint8 -> (3, size, size) float32 in [0, 255]: clean-fid's "clean" resize, each channel a float32
    Pillow image resized bicubically, clipped, not rounded."""
    planes = pillow_planes(rgb, size, Image.BICUBIC)
    return np.clip(planes, 0, 255, out=planes)


def pillow_planes(rgb: np.ndarray, size: int, resample: int) -> np.ndarray:
    """Each channel of (H, W, 3) uint8 as a float32 Pillow image (mode "F": its exact integers), resized to size x
    size with ``resample``, into one (3, size, size) float32 array."""
    out = np.empty((3, size, size), np.float32)
    for c in range(3):
        band = Image.fromarray(np.ascontiguousarray(rgb[:, :, c])).convert("F")
        out[c] = np.asarray(band.resize((size, size), resample=resample))
    return out


def rgb_of(img: Image.Image) -> np.ndarray:
    """(H, W, 3) uint8 by Pillow's own conversion, as both tools take it: no EXIF orientation, alpha dropped."""
    return np.asarray(img.convert("RGB"), dtype=np.uint8)


def fid_planes(img: Image.Image, mode: str, size: int = FID_SIZE) -> np.ndarray:
    """A decoded image as the FID tool ``mode`` feeds it to its network, before the scaling: RGB by Pillow's own
    conversion (as both tools do: no EXIF orientation, alpha dropped), resized to size x size, float32, (3, size,
    size)."""
    rgb = rgb_of(img)
    if mode == "pytorch-fid":
        return pytorch_fid_planes(rgb, size)
    if mode == "clean-fid":
        return clean_fid_planes(rgb, size)
    raise ValueError(f"no FID resize {mode!r}; choose one of {', '.join(RESIZE_MODES[1:])}")
