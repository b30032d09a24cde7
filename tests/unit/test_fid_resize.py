"""The FID tools' preprocessing (ingest/fid_resize.py) against hand-computed cases and independent references."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from PIL import Image

from inception_engine.errors import EngineError
from inception_engine.ingest import fid_resize
from inception_engine.ingest.fid_resize import (bilinear_taps, clean_fid_planes, fid_planes, pytorch_fid_input,
                                                pytorch_fid_planes)
from inception_engine.ingest.images import (SLOT_HEADER, SLOT_INPUT, SLOT_PIXELS, Preprocess, decode_u8, load_image,
                                            normalize_u8)
from inception_engine.ingest.workers import decode_into


def torch_bilinear_reference(x: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """F.interpolate(mode="bilinear", align_corners=False) written out per output pixel, float64: source position
    (i + 0.5) * in / out - 0.5, negative positions clamped to 0, the two neighbours (the last pixel repeated at the
    far edge) weighted by the distance."""
    def taps(i: int, n_in: int, n_out: int) -> list[tuple[int, float]]:
        pos = max((i + 0.5) * n_in / n_out - 0.5, 0.0)
        lo = min(math.floor(pos), n_in - 1)
        hi = lo + 1 if lo < n_in - 1 else lo
        t = pos - lo
        return [(lo, 1.0 - t), (hi, t)]

    h, w = x.shape[:2]
    out = np.zeros((out_h, out_w, x.shape[2]))
    for i in range(out_h):
        for j in range(out_w):
            for r, wr in taps(i, h, out_h):
                for c, wc in taps(j, w, out_w):
                    out[i, j] += wr * wc * x[r, c]
    return out


def channels_last(planes: np.ndarray) -> np.ndarray:
    """(3, H, W) planes as (H, W, 3) pixels, the tools' and the references' layout."""
    return np.moveaxis(planes, 0, -1)


def pytorch_fid_resize(rgb: np.ndarray, size: int = 299) -> np.ndarray:
    """pytorch-fid's resize, channels last."""
    return channels_last(pytorch_fid_planes(rgb, size))


def clean_fid_resize(rgb: np.ndarray, size: int = 299) -> np.ndarray:
    """clean-fid's resize, channels last."""
    return channels_last(clean_fid_planes(rgb, size))


def bilinear_weights(in_size: int, out_size: int) -> np.ndarray:
    """fid_resize.bilinear_taps as an (out_size, in_size) float64 matrix."""
    lo, hi, frac = bilinear_taps(in_size, out_size)
    m = np.zeros((out_size, in_size))
    np.add.at(m, (np.arange(out_size), lo), 1.0 - frac)
    np.add.at(m, (np.arange(out_size), hi), frac)
    return m


def test_bilinear_weights_hand_computed_halving_and_doubling():
    # 4 -> 2: positions 0.5 and 2.5: the mean of pixels (0, 1) and (2, 3), whatever the scale (no antialiasing)
    np.testing.assert_allclose(bilinear_weights(4, 2), [[0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5]])
    # 2 -> 4: positions -0.25 (clamped to 0), 0.25, 0.75, 1.25 (past the last pixel: the last pixel)
    np.testing.assert_allclose(bilinear_weights(2, 4), [[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]])
    # 8 -> 2 samples two pixels only: positions 1.5, 5.5 (an antialiased resize would average four)
    np.testing.assert_allclose(bilinear_weights(8, 2)[0], [0, 0.5, 0.5, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(bilinear_weights(5, 5), np.eye(5))  # same size: the identity


@pytest.mark.parametrize("shape", [(7, 5), (256, 256), (300, 180), (64, 96)])
def test_pytorch_fid_resize_matches_the_per_pixel_reference(shape):
    rgb = np.random.default_rng(shape[0]).integers(0, 256, (*shape, 3), dtype=np.uint8)
    size = 11 if shape[0] < 100 else 23  # the reference loops per pixel: small outputs
    got = pytorch_fid_resize(rgb, size)
    assert got.dtype == np.float32 and got.shape == (size, size, 3)
    np.testing.assert_allclose(got, torch_bilinear_reference(rgb.astype(np.float64), size, size), rtol=1e-6,
                               atol=1e-4)


def test_clean_fid_resize_is_pillow_bicubic_on_float_channels_clipped_not_rounded():
    rgb = np.zeros((4, 4, 3), np.uint8)
    rgb[:, 2:] = 255  # a hard edge: bicubic overshoots, clean-fid clips to [0, 255] and keeps fractions
    got = clean_fid_resize(rgb, 7)
    assert got.dtype == np.float32 and got.min() >= 0 and got.max() <= 255
    assert np.any((got > 0) & (got < 255) & (got != np.round(got)))
    want = np.asarray(Image.fromarray(rgb[:, :, 1].astype(np.float32), "F").resize((7, 7), Image.BICUBIC))
    np.testing.assert_array_equal(got[:, :, 1], np.clip(want, 0, 255))
    flat = np.full((5, 9, 3), 77, np.uint8)
    np.testing.assert_allclose(clean_fid_resize(flat, 3), 77, atol=1e-4)  # a constant stays itself


def torch_float32_bilinear(rgb: np.ndarray, size: int, mean: float, std: float) -> np.ndarray:
    """pytorch-fid's input as torch computes it in float32 (upsample_bilinear2d: the scale and source coordinate in
    float, x / 255 first), then (v - mean) / std, every operation one NumPy float32 operation: (3, size, size)."""
    f = np.float32

    def taps(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        s = np.maximum((f(n) / f(size)) * (np.arange(size, dtype=f) + f(0.5)) - f(0.5), f(0))
        lo = s.astype(np.int64)
        w1 = s - lo.astype(f)
        return lo, lo + (lo < n - 1), f(1) - w1, w1

    (y0, y1, h0, h1), (x0, x1, w0, w1) = taps(rgb.shape[0]), taps(rgb.shape[1])
    unit = np.arange(256, dtype=f) / f(255)
    px = unit[rgb]
    h0, h1 = h0[:, None], h1[:, None]
    out = np.empty((3, size, size), f)
    for c in range(3):
        p = px[:, :, c]
        v = h0 * (w0 * p[y0][:, x0] + w1 * p[y0][:, x1]) + h1 * (w0 * p[y1][:, x0] + w1 * p[y1][:, x1])
        out[c] = (v - f(mean)) / f(std)
    return out


needs_fid_c = pytest.mark.skipif(fid_resize.fid_library() is None, reason="no C compiler builds cpu_src/fid_resize.c")


@needs_fid_c
@pytest.mark.parametrize("shape", [(256, 256), (299, 299), (64, 299), (310, 200), (400, 500), (1, 700), (700, 1)])
def test_c_resize_is_torchs_float32_arithmetic_bit_for_bit(shape):
    """cpu_src/fid_resize.c (what the decode workers run for pytorch-fid) equals torch's float32 formula operation
    for operation, enlarging and shrinking, on an image view with padded rows; and lies within float32 rounding of
    the float64 interpolation."""
    rng = np.random.default_rng(sum(shape))
    wide = rng.integers(0, 256, (shape[0], shape[1] + 5, 3), dtype=np.uint8)
    rgb = wide[:, 2:shape[1] + 2]  # rows 3 (w + 5) bytes apart
    got = pytorch_fid_input(rgb, 299, (0.5,) * 3, (0.5,) * 3)
    assert got is not None and got.dtype == np.float32 and got.shape == (3, 299, 299) and got.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(got, torch_float32_bilinear(np.ascontiguousarray(rgb), 299, 0.5, 0.5))
    if shape[0] * shape[1] <= 256 * 256:
        exact = np.moveaxis(torch_bilinear_reference(rgb.astype(np.float64) / 255, 299, 299), -1, 0) * 2 - 1
        # torch rounds each source coordinate (up to ~300) to float32: a weight off by a few 2^-24 x 256, an
        # output by as much of a [0, 1] pixel step, twice that after 2x - 1
        assert np.abs(got - exact).max() < 8 * 256 * 2.0 ** -24


@needs_fid_c
def test_a_decode_worker_resizes_into_its_ring_slot(tmp_path):
    """decode_into hands the C resize its ring slot (no new array to fault in and copy): the slot, NaN-poisoned
    before, holds decode_u8's result bit for bit and its neighbours are untouched; an ``out`` of the wrong shape,
    type or layout is refused, not written."""
    rgb = np.random.default_rng(7).integers(0, 256, (256, 200, 3), dtype=np.uint8)
    path = tmp_path / "a.png"
    Image.fromarray(rgb).save(path)
    pre = Preprocess(mode="pytorch-fid", mean=(0.5,) * 3, std=(0.5,) * 3)
    ring = np.full((3, *pre.decoded_shape), np.nan, np.float32)
    assert decode_into(ring, 1, str(path), pre) is None
    np.testing.assert_array_equal(ring[1], decode_u8(path, pre))
    assert np.isnan(ring[0]).all() and np.isnan(ring[2]).all()
    out = ring[2]
    assert pytorch_fid_input(rgb, 299, pre.mean, pre.std, out) is out
    np.testing.assert_array_equal(out, ring[1])
    for bad in (np.empty((3, 299, 298), np.float32), np.empty((3, 299, 299), np.float64),
                np.empty((3, 299, 598), np.float32)[:, :, ::2]):
        with pytest.raises(ValueError, match="out must be"):
            pytorch_fid_input(rgb, 299, pre.mean, pre.std, bad)


@pytest.mark.parametrize("mode", ["pytorch-fid", "clean-fid"])
def test_a_slot_for_the_gpus_resize_holds_the_pixels_or_else_the_input(tmp_path, mode):
    """Preprocess.gpu_resize (the cuda runner's host decode path): a decode worker writes the image as its tool reads
    it (RGBA's alpha dropped, EXIF ignored) after a header saying so; an image with more pixels than the slot holds
    comes as the network's input, resized here exactly as without gpu_resize. The rest of the slot is not written."""
    pre = Preprocess(size=75, mode=mode, mean=(0.5,) * 3, std=(0.5,) * 3, gpu_resize=True)
    assert pre.pixel_dtype == np.uint8 and pre.decoded_shape == (SLOT_HEADER + 3 * 75 * 75 * 4,)
    rng = np.random.default_rng(11)
    small, big = rng.integers(0, 256, (60, 90, 4), dtype=np.uint8), rng.integers(0, 256, (160, 150, 3), dtype=np.uint8)
    Image.fromarray(small, "RGBA").save(tmp_path / "small.png")
    Image.fromarray(big).save(tmp_path / "big.png")
    ring = np.full((2, *pre.decoded_shape), 0xAB, np.uint8)
    assert decode_into(ring, 0, str(tmp_path / "small.png"), pre) is None
    assert decode_into(ring, 1, str(tmp_path / "big.png"), pre) is None
    assert ring[0, :SLOT_HEADER].view(np.int32).tolist() == [SLOT_PIXELS, 60, 90, 0]
    np.testing.assert_array_equal(ring[0, SLOT_HEADER:SLOT_HEADER + small[..., :3].size], small[..., :3].reshape(-1))
    assert (ring[0, SLOT_HEADER + small[..., :3].size:] == 0xAB).all()
    assert ring[1, :SLOT_HEADER].view(np.int32).tolist() == [SLOT_INPUT, 75, 75, 0]
    host = dataclasses.replace(pre, gpu_resize=False)
    np.testing.assert_array_equal(ring[1, SLOT_HEADER:].view(np.float32).reshape(3, 75, 75),
                                  decode_u8(tmp_path / "big.png", host))


def test_fid_modes_take_pillows_rgb_without_exif_and_their_scaling(tmp_path):
    """Both tools open with Image.open(...).convert("RGB"): EXIF orientation ignored, alpha dropped."""
    rgba = np.random.default_rng(0).integers(0, 256, (40, 30, 4), dtype=np.uint8)
    path = tmp_path / "a.png"
    exif = Image.Exif()
    exif[0x0112] = 6  # "turn me": torchvision's preprocessing does, the FID tools do not
    Image.fromarray(rgba, "RGBA").save(path, exif=exif)
    manifest = {"network": "fid", "input": {"mean": [0.5] * 3, "std": [0.5] * 3, "size": 299, "resize": 299}}
    pre = Preprocess.from_manifest(manifest)  # the FID network's default: pytorch-fid's
    assert (pre.mode, pre.mean, pre.pixel_dtype) == ("pytorch-fid", (0.5,) * 3, np.float32)
    got = decode_u8(path, pre)  # decoded straight to the network's input (Preprocess.decoded_shape)
    assert got.shape == pre.decoded_shape == (3, 299, 299) and got.dtype == np.float32
    want = pytorch_fid_input(rgba[:, :, :3], 299, pre.mean, pre.std)
    if want is None:  # no C compiler: the Pillow resize, normalised
        want = normalize_u8(pytorch_fid_resize(rgba[:, :, :3]), pre)
    np.testing.assert_array_equal(got, want)
    x = load_image(path, pre)  # 2x - 1 of the resized [0, 1] image, as pytorch-fid's normalize_input
    np.testing.assert_array_equal(x, got)
    np.testing.assert_allclose(x, np.moveaxis(pytorch_fid_resize(rgba[:, :, :3]) / 255.0 * 2 - 1, -1, 0), atol=2e-5)
    clean = Preprocess.from_manifest(manifest, mode="clean-fid")
    y = normalize_u8(channels_last(fid_planes(Image.fromarray(rgba[:, :, :3]), "clean-fid"))[None], clean)[0]
    np.testing.assert_allclose(y, np.moveaxis((clean_fid_resize(rgba[:, :, :3]) - 128.0) / 128.0, -1, 0), atol=1e-6)
    tv = Preprocess.from_manifest(manifest, mode="torchvision")
    assert tv.mean == (0.5,) * 3 and decode_u8(path, tv).dtype == np.uint8  # the weight file's scaling
    with pytest.raises(EngineError, match="choose one of"):
        Preprocess.from_manifest(manifest, mode="tf")


@pytest.mark.parametrize("shape", [(256, 256), (128, 299), (37, 200)])
def test_enlarging_through_pillow_is_within_a_float32_step_of_the_float64_taps(shape):
    """pytorch_fid_planes takes Pillow's float32 bilinear where no axis shrinks: the same taps and weights as torch's,
    one float32 rounding between its passes."""
    rgb = np.random.default_rng(shape[1]).integers(0, 256, (*shape, 3), dtype=np.uint8)
    rows, cols = bilinear_weights(shape[0], 299), bilinear_weights(shape[1], 299)
    exact = np.einsum("ph,hwc,qw->pqc", rows, rgb.astype(np.float64), cols, optimize=True)
    got = pytorch_fid_resize(rgb)
    assert got.dtype == np.float32 and got.shape == (299, 299, 3)
    assert np.abs(got - exact).max() <= 2 * np.spacing(np.float32(255))


@pytest.mark.parametrize("mode", ["pytorch-fid", "clean-fid"])
@pytest.mark.parametrize("shape", [(256, 256), (64, 299), (310, 200), (400, 500), (1, 700)])
@pytest.mark.parametrize("c_resize", [True, False])
def test_decode_workers_network_input_is_the_tools_resize_normalised(mode, shape, c_resize, monkeypatch):
    """What a decode worker writes for an FID mode (resize_crop) is, bit for bit, pytorch-fid's C resize where it
    is built, else (and for clean-fid) normalize_u8 of the channels-last Pillow resize (every element compared: a
    plane left unwritten fails), and C-contiguous as the ring's slot takes it."""
    if not c_resize:
        monkeypatch.setattr(fid_resize, "fid_library", lambda: None)
    rng = np.random.default_rng(sum(shape))
    img = Image.fromarray(rng.integers(0, 256, (*shape, 3), np.uint8))
    pre = Preprocess(mean=(0.5,) * 3, std=(0.5,) * 3, mode=mode)
    got = decode_u8(img, pre)
    by_c = fid_resize.pytorch_fid_input(np.asarray(img), 299, pre.mean, pre.std) if mode == "pytorch-fid" else None
    assert (by_c is not None) == (mode == "pytorch-fid" and c_resize and fid_resize.fid_library() is not None)
    want = by_c if by_c is not None else normalize_u8(channels_last(fid_planes(img, mode)), pre)
    assert got.shape == (3, 299, 299) and got.dtype == np.float32 and got.flags["C_CONTIGUOUS"]
    assert np.array_equal(got, want) and np.isfinite(got).all()
