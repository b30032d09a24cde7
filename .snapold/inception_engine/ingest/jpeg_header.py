"""Which files --decode gpu hands to nvImageCodec, from their headers alone (no decode): ``gpu_eligible`` gives
(height, width, EXIF orientation) for a file nvImageCodec decodes to what Pillow gives before it turns the image
upright (the resize reads the stored image through its orientation: gpu_resize.upright_views), None for one the
exact CPU path takes.

``plain_jpeg_size`` reads the markers of the common case itself (a tenth of Pillow's ~130 us a file); what it does
not call plain goes to ``pillow_eligible``, Pillow's own reading of the header. cuda_src/jpeg_batch.c holds the
same plain rule in C for its batches (tests/kernels/test_jpeg_batch.py keeps the two equal).
"""

from __future__ import annotations

import io

from PIL import Image

from .entries import DEFAULT_MAX_PIXELS
from .images import bomb_pixels, let_pillow_open, too_many_pixels

EXIF_ORIENTATION = 0x0112
GPU_MODES = ("RGB", "L")  # JPEG modes nvImageCodec decodes to what Pillow + to_rgb give (CMYK it would not)
ORIENTATIONS = range(1, 9)  # EXIF's: 1 upright, 2-8 the flips and turns Pillow's exif_transpose undoes


def jpeg_complete(data: bytes) -> bool:
    """Whether an end-of-image marker follows the last start-of-scan. Entropy-coded data cannot hold FF D9, so a
    JPEG cut short fails this and goes to Pillow, which reports truncation as the CPU path does (nvJPEG might
    decode it with grey filler). An EXIF thumbnail's markers come before the main image's last scan."""
    if data.endswith(b"\xff\xd9"):  # the usual case, without scanning the file back to its last scan
        return True
    return data.rfind(b"\xff\xd9") > data.rfind(b"\xff\xda")


SOF_HUFFMAN = (0xC0, 0xC1, 0xC2)  # baseline, extended sequential, progressive: what Pillow and nvJPEG both read
STANDALONE = set(range(0xD0, 0xD8)) | {0x01}  # markers without a length


def plain_jpeg_size(data: bytes, limit: int = DEFAULT_MAX_PIXELS) -> tuple[int, int, int] | None:
    """(height, width, EXIF orientation) of a plain JPEG, read from its markers without Pillow (a tenth of Pillow's
    ~130 µs a file); None for anything else, which gpu_eligible then asks Pillow about. Plain: 8-bit Huffman-coded,
    grey or JFIF YCbCr (component ids 1, 2, 3), no Adobe colour transform 0, an EXIF orientation of 1 to 8 where it
    has one, no XMP (Pillow reads orientation there too), a single EXIF block, within the pixel limit ``limit``,
    and complete."""
    if data[:2] != b"\xff\xd8":
        return None
    pos, n, size, exif_seen, orientation = 2, len(data), None, False, 1
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in STANDALONE:
            return None
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        seg = data[pos + 4:pos + 2 + length]
        if length < 2 or len(seg) != length - 2:
            return None
        if marker == 0xDA:  # start of scan: the header is over
            break
        if marker == 0xE1:
            if seg.startswith(b"Exif\x00\x00"):
                orientation = exif_orientation(seg[6:]) or 0
                if exif_seen or orientation not in ORIENTATIONS:
                    return None
                exif_seen = True
            elif seg.startswith(b"http://ns.adobe.com/xap/"):
                return None
        elif marker == 0xEE and seg.startswith(b"Adobe") and len(seg) >= 12 and seg[11] == 0:
            return None
        elif marker in SOF_HUFFMAN:
            if size is not None or len(seg) < 6 or seg[0] != 8:
                return None
            h, w, components = int.from_bytes(seg[1:3], "big"), int.from_bytes(seg[3:5], "big"), seg[5]
            if components == 3:
                if len(seg) < 15 or (seg[6], seg[9], seg[12]) != (1, 2, 3):
                    return None
            elif components != 1:
                return None
            size = (h, w)
        elif 0xC3 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # other SOFs: lossless, arithmetic
            return None
        pos += 2 + length
    else:
        return None
    if size is None or min(size) < 1:
        return None
    if size[0] * size[1] > limit:
        return None  # pillow_eligible refuses it, in images.too_many_pixels's words
    return (*size, orientation) if jpeg_complete(data) else None


def exif_orientation(tiff: bytes) -> int | None:
    """The orientation tag of an EXIF block's first IFD (1 where it has none), None where the block is malformed."""
    order = {b"II": "little", b"MM": "big"}.get(tiff[:2])
    if order is None or len(tiff) < 8 or int.from_bytes(tiff[2:4], order) != 42:
        return None
    ifd = int.from_bytes(tiff[4:8], order)
    if ifd + 2 > len(tiff):
        return None
    count = int.from_bytes(tiff[ifd:ifd + 2], order)
    if ifd + 2 + 12 * count > len(tiff):
        return None
    for e in range(ifd + 2, ifd + 2 + 12 * count, 12):
        if int.from_bytes(tiff[e:e + 2], order) == EXIF_ORIENTATION:
            if int.from_bytes(tiff[e + 2:e + 4], order) != 3 or int.from_bytes(tiff[e + 4:e + 8], order) != 1:
                return None  # not one SHORT: let Pillow make sense of it
            return int.from_bytes(tiff[e + 8:e + 10], order)
    return 1


def gpu_eligible(path: str, data: bytes, limit: int = DEFAULT_MAX_PIXELS) -> tuple[int, int, int] | None:
    """(height, width, orientation) for a file nvImageCodec should decode, as stored, with the EXIF orientation
    (ORIENTATIONS) that the CPU path would turn it upright by; None for one the CPU path should take. Raises
    EngineError for more than ``limit`` pixels (the run's limit; images.too_many_pixels's words, as on the CPU)."""
    layout = plain_jpeg_size(data, limit)
    return layout if layout is not None else pillow_eligible(path, data, limit)


def pillow_eligible(path: str, data: bytes, limit: int = DEFAULT_MAX_PIXELS) -> tuple[int, int, int] | None:
    """gpu_eligible by Pillow's reading of the header, for the files plain_jpeg_size leaves to it."""
    let_pillow_open(limit)
    try:
        with Image.open(io.BytesIO(data)) as img:  # parses the header only
            fmt, mode, (w, h) = img.format, img.mode, img.size
            orientation = img.getexif().get(EXIF_ORIENTATION, 1)  # what ImageOps.exif_transpose reads (EXIF, XMP)
            # An Adobe marker with transform 0 stores R, G, B as they are (libjpeg, hence Pillow, leaves them
            # unconverted); leave such files to Pillow rather than trust another decoder with the flag.
            stored_rgb = img.info.get("adobe_transform") == 0
    except Image.DecompressionBombError as e:
        raise too_many_pixels(path, bomb_pixels(e), limit) from None
    except Exception:  # unidentified, corrupt header, malformed EXIF: the CPU path says what in its own words
        return None
    if w * h > limit:
        raise too_many_pixels(path, w * h, limit)
    upright_by = orientation if isinstance(orientation, int) and orientation in ORIENTATIONS else None
    if fmt != "JPEG" or mode not in GPU_MODES or upright_by is None or stored_rgb or not jpeg_complete(data):
        return None
    return h, w, upright_by
