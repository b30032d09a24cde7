"""pil_resize's NumPy replica of Pillow's bilinear resize + centre crop against Pillow itself: bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from inception_engine.ingest.images import crop_box, resized_size
from inception_engine.ingest.pil_resize import (
    PRECISION_BITS,
    coeffs,
    pillow_vertical_first_rule,
    plan_resize_crop,
    resize_crop_image,
    resize_crop_u8,
    vertical_first,
)

# (h, w): landscape, portrait, square, ImageNet's usual 500x375 / 375x500, smaller than 342 (upscaling), 342 on
# one or both sides (that axis not resized), one pixel either side of 342, odd and prime sizes, extreme aspect
# ratios, large photos; portraits more than twice as tall as wide, where Pillow 13 runs the vertical pass first, and
# either side of that rule's boundary (801 x 400: vertical first, 800 x 400: horizontal first).
FIXED_SIZES = [(375, 500), (500, 375), (333, 500), (500, 333), (342, 342), (342, 500), (500, 342), (342, 343),
               (343, 342), (341, 341), (343, 343), (299, 299), (299, 400), (100, 80), (80, 100), (1, 1), (7, 3000),
               (3000, 7), (684, 684), (1024, 768), (1234, 987), (997, 1009), (2448, 3264), (4000, 3000),
               (1279, 603), (801, 400), (800, 400), (1300, 600), (3000, 1000), (2000, 342), (700, 300), (1000, 343)]


def pil_reference(a: np.ndarray, resize: int = 342, size: int = 299) -> np.ndarray:
    """torchvision's way, spelled out: Pillow resizes the whole image, then the centre crop is cut from it."""
    img = Image.fromarray(a, "RGB")
    new = resized_size(img.width, img.height, resize)
    if new != img.size:
        img = img.resize(new, Image.BILINEAR)
    return np.asarray(img.crop(crop_box(*new, size)))


def content(rng: np.random.Generator, h: int, w: int, kind: str) -> np.ndarray:
    if kind == "noise":
        return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    if kind == "smooth":  # low-frequency gradients: many sums land near a rounding boundary
        y, x = np.mgrid[0:h, 0:w] / max(h, w)
        phase = rng.uniform(0, 6.3, 3)
        return np.stack([127.5 + 127.5 * np.sin(5 * x + 3 * y + p) for p in phase], -1).round().astype(np.uint8)
    return np.where(rng.random((h, w, 1)) < 0.5, 0, 255).repeat(3, -1).astype(np.uint8)  # "binary": extremes


def random_sizes(rng: np.random.Generator, n: int) -> list[tuple[int, int]]:
    sizes = []
    for _ in range(n):
        short = int(rng.choice([rng.integers(1, 342), rng.integers(342, 700), rng.integers(700, 1600)]))
        long = short + int(rng.integers(0, 2 * short + 2))
        sizes.append((short, long) if rng.random() < 0.5 else (long, short))
    return sizes


SEEDS = range(8)


@pytest.mark.parametrize("seed", SEEDS)
def test_bit_identical_to_pillow(seed):
    rng = np.random.default_rng(seed)
    sizes = FIXED_SIZES[seed::len(SEEDS)] + random_sizes(rng, 15)
    for i, (h, w) in enumerate(sizes):
        a = content(rng, h, w, ("noise", "smooth", "binary")[i % 3])
        got, ref = resize_crop_u8(a), pil_reference(a)
        assert got.shape == ref.shape == (299, 299, 3) and got.dtype == np.uint8
        mismatches = int((got != ref).sum())
        assert mismatches == 0, f"{h}x{w}: {mismatches} bytes differ from Pillow"


@pytest.mark.parametrize("resize,size", [(256, 224), (299, 299), (400, 300)])
def test_other_resize_and_crop_sizes(resize, size):
    rng = np.random.default_rng(resize)
    for h, w in [(375, 500), (500, 375), (resize, resize), (123, 456), (900, 901)]:
        a = content(rng, h, w, "noise")
        assert np.array_equal(resize_crop_u8(a, resize, size), pil_reference(a, resize, size)), (h, w)


def test_coefficients_of_a_range_are_the_full_tables_rows():
    for in_size, out_size in [(500, 456), (375, 342), (100, 342), (342, 342), (4000, 456), (7, 391)]:
        full = coeffs(in_size, out_size)
        part = coeffs(in_size, out_size, 29, min(328, out_size))
        assert np.array_equal(part.start, full.start[29:328]) and np.array_equal(part.weights, full.weights[29:328])
        assert full.start.min() >= 0 and full.start.max() + full.taps <= in_size  # no read outside the input
        sums = full.weights.sum(1)
        assert np.all(np.abs(sums - (1 << PRECISION_BITS)) <= full.taps), (in_size, out_size)  # rounding only


def test_plan_reads_exactly_the_source_the_first_pass_needs():
    plan = plan_resize_crop(1000, 750, 342, 299)  # 750 wide -> 342 x 456: rows 78..376 of 456 are kept
    assert not plan.vertical_first
    lo, n = plan.first_span()
    first, last = np.nonzero(plan.y.weights.any(0))[0][[0, -1]]
    assert (lo, n) == (plan.y.start.min(), plan.y.start.max() + plan.y.taps - lo) and 0 < lo and lo + n < 1000
    assert first == 0 and last == plan.y.taps - 1  # no all-zero tap column: the window is no wider than needed
    tall = plan_resize_crop(2000, 600, 342, 299)  # 600 wide -> 342 x 1140: Pillow 13 shrinks the height first
    assert tall.vertical_first == pillow_vertical_first_rule()
    if tall.vertical_first:
        assert tall.first_span() == tall.x.span()


def test_pass_order_rule():
    assert vertical_first(801, 400, 684, 342) and not vertical_first(800, 400, 684, 342)
    assert not vertical_first(300, 100, 400, 50)  # the height grows: horizontal first whatever the width does
    assert not vertical_first(375, 500, 342, 456)  # ImageNet's landscape 500 x 375, and its portrait below
    assert not vertical_first(500, 375, 456, 342)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="smaller than crop"):
        resize_crop_u8(np.zeros((10, 10, 3), np.uint8), 100, 200)
    with pytest.raises(ValueError, match="uint8"):
        resize_crop_u8(np.zeros((10, 10, 3), np.float32))
    with pytest.raises(ValueError, match="bad coefficient range"):
        coeffs(10, 20, 15, 25)


# (h, w) far from any photograph's shape: a row or a column, a few pixels by hundreds, both sides of 342; the whole
# Pillow resize of these still fits a test's memory (the 1 x 700 one is 342 x 239,400 pixels).
EXTREME_SIZES = [(1, 700), (700, 1), (2, 600), (600, 2), (3, 1000), (1000, 3), (5, 2900), (2900, 5), (340, 6000),
                 (6000, 345), (343, 4000), (1, 342), (342, 1), (9, 4000)]


@pytest.mark.parametrize("h,w", EXTREME_SIZES)
def test_only_the_crops_rectangle_gives_pillows_bytes_at_extreme_aspect_ratios(h, w):
    rng = np.random.default_rng(h * 10007 + w)
    a = content(rng, h, w, ["noise", "smooth", "binary"][(h + w) % 3])
    assert np.array_equal(resize_crop_image(Image.fromarray(a, "RGB")), pil_reference(a))


@pytest.mark.parametrize("seed", range(3))
def test_resize_crop_takes_either_way_and_matches_the_whole_resize(seed):
    """images.resize_crop (Pillow for photographs' shapes, only the crop beyond FULL_RESIZE_MAX_CROPS) against
    the whole resize, on random sizes around the switch and far past it."""
    from inception_engine.ingest import images

    rng = np.random.default_rng(100 + seed)
    for _ in range(6):
        short = int(rng.integers(1, 400))
        ratio = float(rng.choice([rng.uniform(1, 12), rng.uniform(12, 200)]))
        long = max(short, min(int(short * ratio), 9000))
        h, w = (short, long) if rng.random() < 0.5 else (long, short)
        a = content(rng, h, w, "noise")
        assert np.array_equal(images.resize_crop(Image.fromarray(a, "RGB")), pil_reference(a)), (h, w)
