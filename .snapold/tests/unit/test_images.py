"""Image decoding and preprocessing: torchvision's Inception-V3 transform math, every Pillow mode, EXIF orientation,
and one-line errors for files that are not good images."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from inception_engine.errors import EngineError
from inception_engine.ingest.images import Preprocess, crop_box, load_image, resized_size, to_rgb
from inception_engine.weights import IMAGENET_MEAN, IMAGENET_STD

MEAN = np.array(IMAGENET_MEAN, np.float32).reshape(3, 1, 1)
STD = np.array(IMAGENET_STD, np.float32).reshape(3, 1, 1)


def normalised(rgb_uint8_hwc: np.ndarray) -> np.ndarray:
    """What ToTensor + Normalize make of uint8 pixels: float32 /255, minus mean, over std."""
    x = rgb_uint8_hwc.astype(np.float32).transpose(2, 0, 1) / np.float32(255)
    return (x - MEAN) / STD


def torchvision_like(img: Image.Image, resize: int = 342, crop: int = 299) -> np.ndarray:
    """Written from torchvision's documented semantics, independently of the code under test: Resize(int) keeps the
    aspect ratio with the shorter edge at ``resize`` (longer edge truncated), CenterCrop rounds offsets with
    Python's round()."""
    w, h = img.size
    if w <= h:
        ow, oh = resize, int(resize * h / w)
    else:
        ow, oh = int(resize * w / h), resize
    if (ow, oh) != (w, h):
        img = img.resize((ow, oh), Image.BILINEAR)
    top, left = int(round((oh - crop) / 2.0)), int(round((ow - crop) / 2.0))
    return normalised(np.asarray(img.convert("RGB"))[top:top + crop, left:left + crop])


def random_rgb(w: int, h: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def uniform_expected(rgb: tuple[int, int, int]) -> np.ndarray:
    return normalised(np.broadcast_to(np.array(rgb, np.uint8), (299, 299, 3)))


# ------------------------------------------------------------------------------------------------ transform math

@pytest.mark.parametrize("w,h,expected", [
    (400, 300, (456, 342)),   # landscape: 342 * 400 / 300 = 456
    (350, 500, (342, 488)),   # portrait: 342 * 500 / 350 = 488.57 -> 488 (truncated, not rounded)
    (342, 342, (342, 342)),
    (1000, 341, (1002, 342)),  # 342 * 1000 / 341 = 1002.93 -> 1002
    (299, 1200, (342, 1372)),  # upscaling: 342 * 1200 / 299 = 1372.5 -> 1372
])
def test_resized_size_follows_torchvision(w, h, expected):
    assert resized_size(w, h, 342) == expected


@pytest.mark.parametrize("w,h,left,top", [
    (342, 342, 22, 22),   # (342 - 299) / 2 = 21.5 -> round half to even -> 22
    (342, 488, 22, 94),   # (488 - 299) / 2 = 94.5 -> 94 (Python's round, not floor(x + 0.5))
    (456, 342, 78, 22),   # 78.5 -> 78
    (343, 343, 22, 22),   # 22.0
])
def test_crop_offsets_use_pythons_round(w, h, left, top):
    assert crop_box(w, h, 299) == (left, top, left + 299, top + 299)


def test_offsets_and_normalisation_exact_without_resize():
    # 342 wide: the shorter side is already 342, so no resampling happens and every output pixel can be traced:
    # R encodes the column, G the row. Crop offsets: left round(21.5) = 22, top round(100.5) = 100.
    w, h = 342, 500
    yy, xx = np.mgrid[0:h, 0:w]
    pixels = np.stack([xx % 256, yy % 256, np.full_like(xx, 7)], axis=-1).astype(np.uint8)
    x = load_image(Image.fromarray(pixels, "RGB"))
    assert x.shape == (3, 299, 299) and x.dtype == np.float32
    expected = normalised(pixels[100:399, 22:321])
    np.testing.assert_array_equal(x, expected)
    # the normalisation itself, spelled out for one pixel: R = (22 % 256) / 255
    assert x[0, 0, 0] == pytest.approx((22 / 255 - 0.485) / 0.229, abs=1e-6)
    assert x[1, 0, 0] == pytest.approx((100 / 255 - 0.456) / 0.224, abs=1e-6)


@pytest.mark.parametrize("w,h", [(400, 300), (350, 500), (640, 427), (299, 299), (1000, 341), (120, 90)])
def test_preprocessing_matches_torchvision_semantics(w, h):
    img = random_rgb(w, h, seed=w * h)
    np.testing.assert_allclose(load_image(img), torchvision_like(img), rtol=0, atol=1e-6)


def test_manifest_preprocessing_fields_are_used():
    pre = Preprocess.from_manifest({"input": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "size": 299,
                                              "resize": 320}})
    assert pre == Preprocess(size=299, resize=320, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    img = random_rgb(400, 300, seed=3)
    w, h = img.size
    ow, oh = int(320 * w / h), 320
    top, left = int(round((oh - 299) / 2.0)), int(round((ow - 299) / 2.0))
    px = np.asarray(img.resize((ow, oh), Image.BILINEAR))[top:top + 299, left:left + 299]
    expected = (px.astype(np.float32).transpose(2, 0, 1) / np.float32(255) - np.float32(0.5)) / np.float32(0.5)
    np.testing.assert_allclose(load_image(img, pre), expected, atol=1e-6)
    assert Preprocess.from_manifest({}) == Preprocess()


def test_matches_torchvision_transform_when_installed():
    tv = pytest.importorskip("torchvision")
    pytest.importorskip("torch")
    transform = tv.models.Inception_V3_Weights.IMAGENET1K_V1.transforms()
    for w, h in [(400, 300), (350, 500), (1000, 341)]:
        img = random_rgb(w, h, seed=w)
        np.testing.assert_allclose(load_image(img), transform(img).numpy(), atol=1e-5)


# ----------------------------------------------------------------------------------------------------- modes

def saved(img: Image.Image, fmt: str, **kw) -> Image.Image:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    buf.seek(0)
    return Image.open(buf)


@pytest.mark.parametrize("make,rgb", [
    (lambda: Image.new("L", (320, 310), 77), (77, 77, 77)),
    (lambda: Image.new("1", (320, 310), 1), (255, 255, 255)),
    (lambda: Image.new("RGBA", (320, 310), (255, 0, 0, 0)), (255, 255, 255)),  # fully transparent -> white
    (lambda: Image.new("RGBA", (320, 310), (10, 20, 30, 255)), (10, 20, 30)),   # opaque -> the colour
    (lambda: Image.new("RGBA", (320, 310), (0, 0, 0, 51)), (204, 204, 204)),    # 20 % black over white
    (lambda: Image.new("LA", (320, 310), (0, 0)), (255, 255, 255)),
    (lambda: Image.new("LA", (320, 310), (40, 255)), (40, 40, 40)),
    (lambda: Image.new("CMYK", (320, 310), (0, 255, 255, 0)), (255, 0, 0)),     # no cyan/black: red
    (lambda: Image.fromarray(np.full((310, 320), 257 * 100, np.uint16)), (100, 100, 100)),  # I;16
    (lambda: Image.fromarray(np.full((310, 320), 65535, np.int32), "I"), (255, 255, 255)),
    (lambda: Image.fromarray(np.full((310, 320), 0.5, np.float32), "F"), (128, 128, 128)),
])
def test_modes_convert_to_expected_rgb(make, rgb):
    img = make()
    np.testing.assert_allclose(load_image(img), uniform_expected(rgb), atol=1e-6)


def test_sixteen_bit_png_is_scaled_not_clipped():
    ramp = np.tile(np.linspace(0, 65535, 320).astype(np.uint16), (310, 1))
    img = saved(Image.fromarray(ramp), "PNG")
    assert img.mode.startswith("I")
    rgb = np.asarray(to_rgb(img))
    np.testing.assert_array_equal(rgb[..., 0], np.clip(np.rint(ramp / 257.0), 0, 255).astype(np.uint8))
    assert rgb.max() == 255 and rgb.min() == 0


def test_palette_with_transparency_composites_on_white():
    img = Image.new("P", (320, 310), 0)
    img.putpalette([0, 0, 255] + [200, 10, 10] * 255)
    img.info["transparency"] = 0
    np.testing.assert_allclose(load_image(saved(img, "PNG")), uniform_expected((255, 255, 255)), atol=1e-6)
    img.paste(1, (0, 0, 320, 310))
    np.testing.assert_allclose(load_image(saved(img, "PNG")), uniform_expected((200, 10, 10)), atol=1e-6)


@pytest.mark.parametrize("mode", ["P", "PA", "La", "RGBa", "YCbCr", "HSV", "LAB", "RGBX", "I;16B"])
def test_other_modes_give_rgb(mode):
    x = load_image(Image.new(mode, (330, 300)))
    assert x.shape == (3, 299, 299) and np.isfinite(x).all()


def test_cmyk_jpeg_file(tmp_path):
    p = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (320, 310), (0, 255, 255, 0)).save(p, quality=95)
    assert Image.open(p).mode == "CMYK"
    np.testing.assert_allclose(load_image(p), uniform_expected((255, 0, 0)), atol=0.1)


# ----------------------------------------------------------------------------------------------------- EXIF

def two_halves(w: int = 400, h: int = 300) -> Image.Image:
    """Left half red, right half blue (as stored)."""
    a = np.zeros((h, w, 3), np.uint8)
    a[:, : w // 2] = (255, 0, 0)
    a[:, w // 2:] = (0, 0, 255)
    return Image.fromarray(a, "RGB")


@pytest.mark.parametrize("orientation,transpose", [
    (3, Image.Transpose.ROTATE_180), (6, Image.Transpose.ROTATE_270), (8, Image.Transpose.ROTATE_90),
    (2, Image.Transpose.FLIP_LEFT_RIGHT),
])
def test_exif_orientation_is_applied(tmp_path, orientation, transpose):
    img = two_halves()
    exif = Image.Exif()
    exif[0x0112] = orientation
    p = tmp_path / f"o{orientation}.png"
    img.save(p, exif=exif)
    np.testing.assert_array_equal(load_image(p), load_image(img.transpose(transpose)))


def test_exif_rotated_jpeg_shows_upright(tmp_path):
    # Orientation 6: the stored image must be turned 90 degrees clockwise, so the stored left (red) ends on top.
    exif = Image.Exif()
    exif[0x0112] = 6
    p = tmp_path / "rot.jpg"
    two_halves().save(p, exif=exif, quality=95)
    x = load_image(p)
    red = (1.0 - 0.485) / 0.229
    assert x[0, :100].mean() == pytest.approx(red, abs=0.05)   # top rows red
    assert x[0, -100:].mean() < -1.5                            # bottom rows: no red


# ------------------------------------------------------------------------------------------------ bad files

def good_png_bytes() -> bytes:
    buf = io.BytesIO()
    random_rgb(320, 310).save(buf, "PNG")
    return buf.getvalue()


def good_jpeg_bytes() -> bytes:
    buf = io.BytesIO()
    random_rgb(320, 310).save(buf, "JPEG")
    return buf.getvalue()


@pytest.mark.parametrize("name,content,words", [
    ("empty.jpg", b"", "empty"),
    ("text.png", b"this is not an image\n", "not an image"),
    ("corrupt.png", good_png_bytes()[:40] + b"\x00garbage" * 200, "corrupt"),
    ("truncated.png", good_png_bytes()[: len(good_png_bytes()) // 2], "truncated"),
    ("truncated.jpg", good_jpeg_bytes()[: len(good_jpeg_bytes()) // 2], "truncated"),
])
def test_bad_files_raise_one_line(tmp_path, name, content, words):
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(EngineError) as e:
        load_image(p)
    msg = str(e.value)
    assert str(p) in msg and words in msg and "\n" not in msg


def test_directory_and_missing_file_raise_one_line(tmp_path):
    for p, words in [(tmp_path, "directory"), (tmp_path / "missing.jpg", "no such file")]:
        with pytest.raises(EngineError) as e:
            load_image(p)
        assert str(p) in str(e.value) and words in str(e.value) and "\n" not in str(e.value)


def png_declaring(w: int, h: int) -> bytes:
    """A 1 x 1 PNG whose header (IHDR, its CRC made good) declares w x h: what a decompression bomb shows first."""
    import struct
    import zlib

    data = bytearray(good_png_bytes())
    ihdr = 8  # after the signature: length (4), "IHDR" (4), width, height, ...
    data[ihdr + 8:ihdr + 16] = struct.pack(">II", w, h)
    body = bytes(data[ihdr + 4:ihdr + 8 + 13])
    data[ihdr + 8 + 13:ihdr + 8 + 17] = struct.pack(">I", zlib.crc32(body))
    return bytes(data)


def test_declared_size_is_refused_before_decoding_in_one_message(tmp_path):
    """An image that declares more pixels than the run's limit (Preprocess.max_pixels) is refused from its header
    in one message, the project's, at every size: by images.check_declared_size up to twice Pillow's own limit and
    by Pillow's bomb check above it (whose DecompressionBombError must not show through)."""
    import re
    import warnings

    pre = Preprocess(max_pixels=100_000)  # above a 299 x 299 crop, which Pillow checks too
    for w, h in [(400, 300), (1000, 1000), (60000, 60000)]:  # the last above twice Pillow's default limit
        p = tmp_path / f"bomb{w}.png"
        p.write_bytes(png_declaring(w, h))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with pytest.raises(EngineError) as e:
                load_image(p, pre)
        assert re.fullmatch(f"{re.escape(str(p))}: refused, it declares {w * h:,} pixels, more than the 100,000 an "
                            r"image may have \(a decompression bomb\?\); for files you trust, --max-pixels N or "
                            r"\$INCEPTION_MAX_PIXELS raises the limit", str(e.value)), str(e.value)
    ok = tmp_path / "ok.png"
    random_rgb(400, 250).save(ok)
    assert load_image(ok, pre).shape == (3, 299, 299)  # 100,000 pixels: at the limit, not over it


def test_the_limit_reaches_decode_processes_and_lifts_pillows_own(tmp_path, monkeypatch):
    """The run's limit travels with the preprocessing into a decode process (its initializer), where a 120,000-pixel
    image is refused at 100,000 although that process's Pillow would open it; and a limit above Pillow's own opens
    what Pillow alone would refuse."""
    from inception_engine.ingest import workers
    from inception_engine.ingest.ring import HostRing

    p = tmp_path / "big.png"
    random_rgb(400, 300).save(p)
    pre = Preprocess(max_pixels=100_000)
    ring = HostRing(2, pre, shared=True)
    pool = workers.DecodePool(ring, pre, 1, "process", chunk=1)
    try:
        error = pool.submit(0, p).result(timeout=60)
    finally:
        pool.close()
        ring.close()
    assert error is not None and error.startswith(f"{p}: refused, it declares 120,000 pixels, more than the 100,000")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)  # Pillow alone refuses above 20,000
    assert load_image(p, Preprocess(max_pixels=200_000)).shape == (3, 299, 299)


def test_an_extreme_aspect_ratio_is_decoded_in_bounded_memory(tmp_path, monkeypatch):
    """A 30000 x 1 PNG (96 bytes) would be 342 x 10,260,000 pixels resized whole (10 GB): only the crop's rows and
    columns are computed, and nothing the size of the whole resize is asked of Pillow or NumPy."""
    import tracemalloc

    p = tmp_path / "line.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (1, 30000, 3), dtype=np.uint8)).save(p)
    asked: list[tuple[int, int]] = []
    real = Image.Image.resize
    monkeypatch.setattr(Image.Image, "resize", lambda self, size, *a, **k: asked.append(size) or real(self, size,
                                                                                                       *a, **k))
    tracemalloc.start()
    try:
        x = load_image(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert x.shape == (3, 299, 299) and np.isfinite(x).all()
    assert all(w * h < 10**4 for w, h in asked) and peak < 40 * 2**20, (asked, peak)  # (pil_resize probes Pillow once)


@pytest.fixture
def odd_entries(tmp_path):
    """A symbolic link loop, a dangling link, a FIFO and a directory, each named like an image."""
    import os

    (tmp_path / "loop.jpg").symlink_to(tmp_path / "loop.jpg")
    (tmp_path / "dangling.jpg").symlink_to(tmp_path / "gone.jpg")
    os.mkfifo(tmp_path / "fifo.jpg")
    (tmp_path / "dir.jpg").mkdir()
    return tmp_path


@pytest.mark.parametrize("name,words", [("loop.jpg", "symbolic link loop"),
                                        ("dangling.jpg", "dangling symbolic link"),
                                        ("fifo.jpg", "is a FIFO (named pipe), not an image file"),
                                        ("dir.jpg", "is a directory")])
def test_what_a_file_is_instead_of_an_image_is_said(odd_entries, name, words):
    """The real reason, not "corrupt data" or "empty file"; a FIFO is never opened for reading (it would block)."""
    p = odd_entries / name
    with pytest.raises(EngineError) as e:
        load_image(p)
    msg = str(e.value)
    assert msg.startswith(str(p)) and words in msg and "\n" not in msg and "corrupt" not in msg


def test_the_gpu_decodes_header_check_refuses_in_the_same_words(monkeypatch):
    """--decode gpu's header check (jpeg_header.gpu_eligible, no GPU needed) takes the run's limit and words a
    refusal as the CPU path does, also where Pillow's own bomb check fires first."""
    import warnings

    from inception_engine.ingest import jpeg_header

    buf = io.BytesIO()
    random_rgb(60, 40).save(buf, "JPEG")
    data = buf.getvalue()
    assert jpeg_header.gpu_eligible("x.jpg", data) == (40, 60, 1)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # Pillow alone refuses above 2,000
    for limit in (1000, 2000):
        with pytest.raises(EngineError, match="^x.jpg: refused, it declares 2,400 pixels, more than the "
                                              f"{limit:,} an image may have"), warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            jpeg_header.gpu_eligible("x.jpg", data, limit)
    assert jpeg_header.gpu_eligible("x.jpg", data, 2400) == (40, 60, 1)
