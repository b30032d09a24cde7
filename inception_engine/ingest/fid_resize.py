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

The two FID resizes give fractional pixels, float32 in [0, 255], which the decode worker normalises (x / 255 -
mean) / std in float32 into the network's input (images.Preprocess.decoded_shape). pytorch-fid divides by 255 before
it interpolates; both are linear, so the results agree to float32 rounding (a few ulp), not bit for bit. With
--decode gpu the GPU decoder's resizes (gpu_fid_resize.py, resize_fid.cu) reproduce both on the GPU.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .modes import RESIZE_MODES

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


def fid_planes(img: Image.Image, mode: str, size: int = FID_SIZE) -> np.ndarray:
    """A decoded image as the FID tool ``mode`` feeds it to its network, before the scaling: RGB by Pillow's own
    conversion (as both tools do: no EXIF orientation, alpha dropped), resized to size x size, float32, (3, size,
    size)."""
    rgb = np.asarray(img.convert("RGB"), dtype=np.uint8)
    if mode == "pytorch-fid":
        return pytorch_fid_planes(rgb, size)
    if mode == "clean-fid":
        return clean_fid_planes(rgb, size)
    raise ValueError(f"no FID resize {mode!r}; choose one of {', '.join(RESIZE_MODES[1:])}")
