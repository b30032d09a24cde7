"""Image decoding and torchvision's Inception-V3 preprocessing, on Pillow and NumPy only.

torchvision's ``Inception_V3_Weights.IMAGENET1K_V1.transforms()`` is ``ImageClassification(crop_size=299,
resize_size=342)``: Resize(342, bilinear) -> CenterCrop(299) -> to float in [0, 1] -> Normalize(mean, std).
On a PIL image that is (torchvision/transforms/functional.py, ``_compute_resized_output_size`` and
``center_crop``):

- the shorter side becomes 342 and the longer ``int(342 * long / short)``; PIL's own bilinear ``resize`` (which
  filters over the whole footprint when shrinking, i.e. antialiased) does it; no resize when already that size;
- crop offsets ``top = int(round((h - 299) / 2.0))``, ``left = int(round((w - 299) / 2.0))``;
- ``uint8 / 255`` then ``(x - mean) / std``, all in float32.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .. import arch
from ..errors import EngineError, first_line
from ..weights import IMAGENET_MEAN, IMAGENET_STD
from .entries import DEFAULT_MAX_PIXELS, MAX_PIXELS_ENV, file_error, open_regular
from .fid_resize import MODE_SCALING, fid_planes, pytorch_fid_input, rgb_of
from .modes import RESIZE_MODES
from .pil_resize import crop_box, resize_crop_image, resized_size

RESIZE = 342  # torchvision's resize_size for Inception-V3
# A slot of an FID tool's image for the GPU's resize (Preprocess.gpu_resize): four int32 (what follows, height, width,
# 0), then SLOT_PIXELS: the decoded (height, width, 3) uint8 RGB pixels; or SLOT_INPUT: the network's float32
# (3, size, size) input, resized on the host (pixels too many for the slot)
SLOT_HEADER = 16
SLOT_PIXELS, SLOT_INPUT = 1, 2
ORIENTATION = 0x0112  # the EXIF orientation tag

# --decode gpu hands nvImageCodec at least this many files a call (a whole number of batches): its call has a fixed
# cost of a few milliseconds, which a batch of 64 does not amortise.
DECODE_IMAGES = 256


def decode_call_images(batch: int) -> int:
    """The files of one --decode gpu call at this batch size: whole batches, at least DECODE_IMAGES."""
    return batch * max(1, -(-DECODE_IMAGES // batch))


@dataclass(frozen=True)
class Preprocess:
    size: int = arch.INPUT_SIZE
    resize: int = RESIZE
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    # the most pixels an image may declare: more is refused from its header, before a pixel is decoded. It travels
    # with the preprocessing to wherever images are decoded (decode processes, the GPU decoder's header check).
    max_pixels: int = DEFAULT_MAX_PIXELS
    # whose preprocessing (fid_resize.RESIZE_MODES): "torchvision" (resize, crop: uint8 pixels), or an FID tool's
    # resize to size x size with that tool's scaling as mean and std (decoded straight to the network's input)
    mode: str = "torchvision"
    # an FID tool's resize left to the GPU: the decode workers hand over the decoded pixels in a slot (SLOT_HEADER),
    # which the cuda runner resizes as the GPU decode path does (the runner's ring_pre sets it)
    gpu_resize: bool = False

    @property
    def pixel_dtype(self) -> type:
        """What a decoded image is made of: uint8 pixels (torchvision's; an FID slot for the GPU's resize), float32
        (the FID tools' resizes)."""
        return np.uint8 if self.mode == "torchvision" or self.gpu_resize else np.float32

    @property
    def decoded_shape(self) -> tuple[int, ...]:
        """A decoded image's shape: (size, size, 3) uint8 pixels, which a quarter of float32's bytes carry to the
        GPU; with an FID tool's resize, whose pixels are fractional, the network's input itself, (3, size, size)
        float32 normalised where the image is decoded (a decode worker), so that the process that runs the forward
        has nothing left to do to it; with that resize left to the GPU, a slot of bytes (SLOT_HEADER) that holds the
        decoded pixels where they fit, else that input."""
        if self.mode == "torchvision":
            return (self.size, self.size, 3)
        if self.gpu_resize:
            return (SLOT_HEADER + 3 * self.size * self.size * 4,)
        return (3, self.size, self.size)

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], max_pixels: int = DEFAULT_MAX_PIXELS,
                      mode: str | None = None) -> Preprocess:
        """The weight file's ``input`` section wins over torchvision's defaults, field by field. ``mode``: whose
        preprocessing (None: the weight file's network's, pytorch-fid's for the FID network); an FID tool's brings
        its own scaling."""
        inp = manifest.get("input", {}) or {}
        if mode is None:
            mode = "pytorch-fid" if manifest.get("network") == "fid" else "torchvision"
        if mode not in RESIZE_MODES:
            raise EngineError(f"no preprocessing {mode!r}; choose one of {', '.join(RESIZE_MODES)}")
        mean = tuple(float(m) for m in inp.get("mean", IMAGENET_MEAN))
        std = tuple(float(s) for s in inp.get("std", IMAGENET_STD))
        if mode in MODE_SCALING:
            mean, std = (MODE_SCALING[mode][0],) * 3, (MODE_SCALING[mode][1],) * 3
        return cls(size=int(inp.get("size", arch.INPUT_SIZE)), resize=int(inp.get("resize", RESIZE)),
                   mean=mean, std=std, max_pixels=max_pixels, mode=mode)  # type: ignore[arg-type]


def too_many_pixels(name: object, pixels: int | None, limit: int) -> EngineError:
    """The one message for an image that declares more than ``limit`` pixels, whatever its size and whoever
    noticed (our header checks, or Pillow's own bomb check: pillow_errors)."""
    declared = f"{pixels:,} pixels" if pixels is not None else "more pixels than that"
    return EngineError(f"{name}: refused, it declares {declared}, more than the {limit:,} an image may have (a "
                       f"decompression bomb?); for files you trust, --max-pixels N or ${MAX_PIXELS_ENV} raises the "
                       f"limit")


def check_declared_size(img: Image.Image, name: object, limit: int = DEFAULT_MAX_PIXELS) -> None:
    """Refuse an image whose header declares more than ``limit`` pixels, before any pixel is decoded (a
    decompression bomb: a few bytes of file that would decode to gigabytes)."""
    w, h = img.size
    if w * h > limit:
        raise too_many_pixels(name, w * h, limit)


def let_pillow_open(limit: int) -> None:
    """Raise Pillow's own bomb limit (``Image.MAX_IMAGE_PIXELS``, a process-wide setting) to ``limit`` where it is
    lower, so that an image up to the run's limit opens: this process decodes with that limit (never lowered, so
    what else runs in the process keeps at least its own). Above it, check_declared_size or pillow_errors refuse."""
    if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < limit:
        Image.MAX_IMAGE_PIXELS = limit


def open_image(path: str | Path, limit: int = DEFAULT_MAX_PIXELS, upright: bool = True) -> Image.Image:
    """Decode a file fully (so truncation shows up here), orientation from EXIF applied (unless ``upright`` is
    False: the FID tools do not), refusing more than ``limit`` pixels. Any failure is an EngineError naming the
    file and the real reason."""
    let_pillow_open(limit)
    with open_regular(path) as f, pillow_errors(path, limit), Image.open(f) as img:
        check_declared_size(img, path, limit)
        img.load()
        return exif_upright(img) if upright else img


def open_image_bytes(data: bytes, name: str, limit: int = DEFAULT_MAX_PIXELS, upright: bool = True) -> Image.Image:
    """open_image for a file's bytes read elsewhere (Ray Data's workers), with the same messages under ``name``."""
    if not data:
        raise EngineError(f"{name}: empty file")
    let_pillow_open(limit)
    with pillow_errors(name, limit):
        img = Image.open(io.BytesIO(data))
        check_declared_size(img, name, limit)
        img.load()
        return exif_upright(img) if upright else img


@contextmanager
def pillow_errors(name: object, limit: int = DEFAULT_MAX_PIXELS) -> Iterator[None]:
    """Pillow's (and the file system's) ways of failing on a file, as one-line EngineErrors naming it (``limit``:
    the pixel limit the run decodes with, named where Pillow's own bomb check refuses an image)."""
    try:
        yield
    except EngineError:
        raise
    except UnidentifiedImageError:
        raise EngineError(f"{name}: not an image (Pillow cannot identify the format)") from None
    except Image.DecompressionBombError as e:  # Pillow's message differs; its first number is the declared size
        raise too_many_pixels(name, bomb_pixels(e), limit) from None
    except OSError as e:
        if e.errno is not None:  # the file system failed (a read error), not the image data
            raise EngineError(file_error(name, e)) from None
        raise EngineError(f"{name}: corrupt or truncated image data ({first_line(e)})") from None
    except (ValueError, SyntaxError, EOFError) as e:
        # Pillow reports truncated or corrupt data as OSError without an errno ("image file is truncated", "broken
        # data stream") and some decoders as ValueError/SyntaxError.
        raise EngineError(f"{name}: corrupt or truncated image data ({first_line(e)})") from None


def bomb_pixels(e: Image.DecompressionBombError) -> int | None:
    """The pixels an image declares, from Pillow's DecompressionBombError ("Image size (N pixels) exceeds ...")."""
    found = re.search(r"\((\d+) pixels\)", str(e))
    return int(found.group(1)) if found else None


def exif_upright(img: Image.Image) -> Image.Image:
    """Rotate/flip as the EXIF orientation tag says; a broken EXIF block leaves the pixels as stored, since the
    picture itself decoded fine."""
    try:
        if img.getexif().get(ORIENTATION, 1) == 1:
            return img  # upright already: exif_transpose would only copy it
        return ImageOps.exif_transpose(img)
    except Exception:  # Pillow raises assorted errors on malformed EXIF
        return img.copy()


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB from any Pillow mode: alpha composited on white, 16/32-bit integer grey scaled from 0..65535,
    float grey taken as 0..1, bilevel as 0/255, CMYK/YCbCr/LAB/HSV via Pillow's conversions."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode in ("RGBA", "LA", "PA", "La", "RGBa") or (mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA") if mode != "La" else img.convert("LA").convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if mode.startswith("I"):  # I;16, I;16B, I;16L, I;16N, I (32-bit): 16-bit grey is the usual content
        # rint(a / 257) (65535 / 255 = 257) in integers, 4 bytes a pixel: a / 257 is never a tie for an integer a
        grey = ((np.clip(np.asarray(img), 0, 65535).astype(np.int32) + 128) // 257).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if mode == "F":
        a = np.asarray(img, dtype=np.float64)
        grey = np.clip(np.rint(np.nan_to_num(a) * 255.0), 0, 255).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    try:
        return img.convert("RGB")
    except ValueError as e:
        raise EngineError(f"image mode {mode} cannot be converted to RGB ({e})") from None


# Resized images with up to this many times the crop's pixels are made whole by Pillow (every photograph's aspect
# ratio); a longer one gets only the crop's rows and columns, by pil_resize: the same bytes (pil_resize's rule), in
# memory of the order of the crop, where the whole resize of a 30000 x 1 image would be 342 x 10 million pixels.
FULL_RESIZE_MAX_CROPS = 8


def resize_crop(img: Image.Image, pre: Preprocess = Preprocess(), out: np.ndarray | None = None) -> np.ndarray:
    """(size, size, 3) uint8 RGB from an already decoded image: EXIF orientation, RGB, torchvision's Resize and
    CenterCrop. What the decode workers hand to the GPU (a quarter of the float32 bytes). An FID tool's mode: its
    resize and scaling instead, the network's input (Preprocess.decoded_shape); with ``gpu_resize``, its slot for
    the GPU's resize (fid_slot). ``out``: an array of that shape the result may be written into (pytorch-fid's C
    resize and fid_slot do; the caller checks whether it got ``out`` back)."""
    if pre.gpu_resize and pre.mode != "torchvision":
        return fid_slot(img, pre, out)
    if pre.mode == "pytorch-fid":
        x = pytorch_fid_input(rgb_of(img), pre.size, pre.mean, pre.std, out)
        if x is not None:
            return x
    if pre.mode != "torchvision":
        return normalize_planes(fid_planes(img, pre.mode, pre.size), pre)
    img = to_rgb(exif_upright(img))
    if pre.resize < pre.size:  # only with an inconsistent manifest; torchvision would pad
        raise EngineError(f"resize {pre.resize} is smaller than crop {pre.size}; the weight manifest is inconsistent")
    new_w, new_h = resized_size(*img.size, pre.resize)
    if new_w * new_h > FULL_RESIZE_MAX_CROPS * pre.size * pre.size:

        return resize_crop_image(img, pre.resize, pre.size)
    if (new_w, new_h) != img.size:
        img = img.resize((new_w, new_h), Image.BILINEAR)
    return np.asarray(img.crop(crop_box(*img.size, pre.size)), dtype=np.uint8)


def fid_slot(img: Image.Image, pre: Preprocess, out: np.ndarray | None = None) -> np.ndarray:
    """An image as its FID tool reads it (Pillow's RGB, no EXIF orientation) in a slot for the GPU's resize
    (Preprocess.gpu_resize, SLOT_HEADER): its (h, w, 3) pixels where they fit, else the network's input resized
    here (an image of more than ~357,000 pixels at 299), which the runner copies as it is."""
    rgb = rgb_of(img)
    slot = np.empty(pre.decoded_shape, np.uint8) if out is None else out
    head = slot[:SLOT_HEADER].view(np.int32)
    if SLOT_HEADER + rgb.nbytes <= slot.nbytes:
        head[:] = (SLOT_PIXELS, rgb.shape[0], rgb.shape[1], 0)
        slot[SLOT_HEADER:SLOT_HEADER + rgb.nbytes] = rgb.reshape(-1)
    else:
        head[:] = (SLOT_INPUT, pre.size, pre.size, 0)
        x = slot[SLOT_HEADER:].view(np.float32).reshape(3, pre.size, pre.size)
        y = resize_crop(img, replace(pre, gpu_resize=False), x)
        if y is not x:
            x[...] = y
    return slot


def normalize_u8(x: np.ndarray, pre: Preprocess = Preprocess()) -> np.ndarray:
    """(..., size, size, 3) uint8 -> (..., 3, size, size) float32: ToTensor + Normalize, the operations
    cuda_src/pipeline_io.cu's normalize_u8_nchw repeats bit for bit. The FID resizes' float32 pixels (in [0, 255])
    take the same steps."""
    y = x.astype(np.float32) / np.float32(255)
    y = (y - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)
    return np.ascontiguousarray(np.moveaxis(y, -1, -3))


def normalize_planes(planes: np.ndarray, pre: Preprocess = Preprocess()) -> np.ndarray:
    """normalize_u8's operations on (3, size, size) float32 planes (an FID resize's pixels, in [0, 255]), in place:
    the same float32 division, subtraction and division of each element, so bit for bit its result, without its
    temporaries and the transposing copy."""
    planes /= np.float32(255)
    planes -= np.asarray(pre.mean, np.float32)[:, None, None]
    planes /= np.asarray(pre.std, np.float32)[:, None, None]
    return planes


def network_input(decoded: np.ndarray, pre: Preprocess = Preprocess()) -> np.ndarray:
    """Decoded images (..., Preprocess.decoded_shape) -> the network's input (..., 3, size, size) float32: uint8
    pixels normalised (normalize_u8); an FID tool's images are that already."""
    if pre.mode == "torchvision":
        return normalize_u8(decoded, pre)
    return np.ascontiguousarray(decoded, np.float32)


def preprocess_pil(img: Image.Image, pre: Preprocess = Preprocess()) -> np.ndarray:
    """(3, size, size) float32, normalised, from an already decoded image."""
    return network_input(resize_crop(img, pre), pre)


def decode_u8(source: str | os.PathLike | Image.Image, pre: Preprocess = Preprocess(),
              out: np.ndarray | None = None) -> np.ndarray:
    """A path or a PIL image -> (size, size, 3) uint8, resized and cropped (``out``: as resize_crop's). Bad files
    raise EngineError with one line naming the file."""
    if isinstance(source, Image.Image):
        return resize_crop(source, pre, out)
    return resize_crop_named(open_image(source, pre.max_pixels, pre.mode == "torchvision"), source, pre, out)


def decode_u8_bytes(data: bytes, name: str, pre: Preprocess = Preprocess(),
                    out: np.ndarray | None = None) -> np.ndarray:
    """decode_u8 of a file's bytes read elsewhere (Ray Data's workers), errors worded as for the file on disk."""
    return resize_crop_named(open_image_bytes(data, name, pre.max_pixels, pre.mode == "torchvision"), name, pre,
                             out)


def resize_crop_named(img: Image.Image, name: object, pre: Preprocess, out: np.ndarray | None = None) -> np.ndarray:
    try:
        return resize_crop(img, pre, out)
    except EngineError as e:
        raise EngineError(f"{name}: {e}") from None
    except (OSError, ValueError) as e:
        raise EngineError(f"{name}: cannot convert image ({first_line(e)})") from None


def load_image(source: str | os.PathLike | Image.Image, pre: Preprocess = Preprocess()) -> np.ndarray:
    """A path or a PIL image -> (3, size, size) float32. Bad files raise EngineError with one line."""
    return network_input(decode_u8(source, pre), pre)
