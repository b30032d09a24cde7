"""resize_fid.cu (ingest/gpu_fid_resize.py) on the GPU (and on the CPU emulator: test_cuda_emulated.py): the FID
tools' resizes of decoded pixels into the network's float32 input against the CPU path (ingest/fid_resize.py,
normalised as the host does), for upscales, downscales, the identity, tiny images and every EXIF orientation, each
slot written whole and nothing outside the targeted slots. clean-fid's must match bit for bit (the same double
arithmetic as Pillow's); pytorch-fid's within the bound below.

Tolerance: the kernel follows torch's float32 arithmetic, the CPU path interpolates in float64. The source
coordinate s = scale * (o + 0.5) - 0.5 is computed in float (scale = in / size rounded, the product rounded, the
difference rounded: |error| <= 3 u max(s, 1) with u = 2^-24), which moves each weight by as much and the interpolated
value (neighbours at most 1 apart in [0, 1]) by at most 3 u in_size; the interpolation's six roundings and the
CPU path's rounding of its result to float32 add a few u more; the scaling (x - 0.5) / 0.5 doubles it. Bound:
2 (3 in_size + 16) u, about 9e-5 for a 1,000-pixel side, against outputs in [-1, 1].
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest
from PIL import Image

from inception_engine.backends.cuda.device import driver
from inception_engine.errors import EngineError
from inception_engine.ingest import gpu_fid_resize, jpeg_decode
from inception_engine.ingest.fid_resize import FID_SIZE, MODE_SCALING, clean_fid_planes, pytorch_fid_planes
from inception_engine.ingest.images import Preprocess, decode_u8, normalize_planes, normalize_u8

# resize_pil.cu's tests' device buffers, stand-ins of jpeg_batch.c and JPEG makers (this folder is on sys.path)
from test_resize_pil import Device, FakeNative, jpeg_bytes, png_bytes, turned_jpeg

MEAN, STD = MODE_SCALING["pytorch-fid"]
PRE = Preprocess(mean=(MEAN,) * 3, std=(STD,) * 3, mode="pytorch-fid")
CLEAN = Preprocess(mean=(MODE_SCALING["clean-fid"][0],) * 3, std=(MODE_SCALING["clean-fid"][1],) * 3, mode="clean-fid")
PLANE = 3 * FID_SIZE * FID_SIZE
U = 2.0 ** -24
TRANSPOSES = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}


def bound(h: int, w: int) -> float:
    return 2 * (3 * max(h, w, FID_SIZE) + 16) * U


def upright(a: np.ndarray, orientation: int) -> np.ndarray:
    return a if orientation == 1 else np.asarray(Image.fromarray(a).transpose(TRANSPOSES[orientation]))


def cpu_input(a: np.ndarray) -> np.ndarray:
    """The CPU path's network input for the upright image a: (3, 299, 299) float32."""
    return normalize_planes(pytorch_fid_planes(a), PRE)


@pytest.fixture
def device(gpu):
    d = Device()
    yield d
    d.free()


def run(kernels: Any, device: Device, cases: list[tuple[int, int, int]], sentinel: float, clean: bool = False) \
        -> list[str]:
    """Each (h, w, orientation) image (random pixels) into every other slot of a batch filled with ``sentinel``;
    the failures, one line each. clean: clean-fid's resize, which must give the CPU path's floats exactly."""
    pre = CLEAN if clean else PRE
    resize = (gpu_fid_resize.GpuCleanFidResize if clean else gpu_fid_resize.GpuFidResize)(kernels, pre.mean, pre.std,
                                                                                          FID_SIZE)
    slots = 2 * len(cases) + 1
    y = device.alloc(slots * PLANE * 4)
    driver().memcpy_htod(y, np.full(slots * PLANE, sentinel, np.float32))
    images, jobs = [], []
    for i, (h, w, o) in enumerate(cases):
        a = np.random.default_rng(zlib.crc32(repr((h, w, o)).encode())).integers(0, 256, (h, w, 3), dtype=np.uint8)
        images.append(a)
        jobs.append((device.upload(a, pad=3 * (i % 3)), 2 * i + 1, o))
    resize.enqueue(jobs, y, driver().Stream())
    resize.wait()
    got = np.empty(slots * PLANE, np.float32)
    driver().memcpy_dtoh(got, y)
    got = got.reshape(slots, 3, FID_SIZE, FID_SIZE)
    resize.close()
    bad = []
    for i, ((h, w, o), a) in enumerate(zip(cases, images)):
        want = normalize_planes(clean_fid_planes(upright(a, o)), CLEAN) if clean else cpu_input(upright(a, o))
        err = float(np.abs(got[2 * i + 1] - want).max())
        if not err <= (0.0 if clean else bound(*a.shape[:2])):
            bad.append(f"{h}x{w} orientation {o}: max |GPU - CPU| {err:.2e} > {bound(h, w):.2e}")
    if not (got[0::2] == np.float32(sentinel)).all():
        bad.append("a kernel wrote outside its slot")
    return bad


# (h, w): generators' 256 x 256 (upscaled), the identity, a downscale on each axis, photos, tiny images (one row, one
# pixel: the second tap is the first)
SIZES = [(256, 256), (299, 299), (512, 512), (375, 500), (1001, 347), (1, 7), (1, 1), (64, 300)]


@pytest.mark.gpu
@pytest.mark.parametrize("sentinel", [0.0, -7.5])
def test_resize_matches_the_cpu_path(gpu, device, sentinel):
    _, kernels = gpu
    assert run(kernels, device, [(h, w, 1) for h, w in SIZES], sentinel) == []


@pytest.mark.gpu
def test_clean_fid_resize_matches_the_cpu_path_exactly(gpu, device):
    """Pillow's float bicubic in double, rounded to float per pass, in Pillow's pass order (both orders here:
    shrinking the height more than twice as much as the width goes vertical first): bit for bit."""
    _, kernels = gpu
    sizes = [*SIZES, (300, 1200), (700, 100)]
    assert run(kernels, device, [(h, w, 1) for h, w in sizes], -1.0, clean=True) == []
    assert run(kernels, device, [(256, 320, o) for o in (3, 6)], 2.0, clean=True) == []


@pytest.mark.gpu
def test_resize_reads_the_stored_image_upright(gpu, device):
    _, kernels = gpu
    assert run(kernels, device, [(h, w, o) for o in range(1, 9) for h, w in ((256, 320), (90, 41))], 3.0) == []


@pytest.mark.gpu
def test_decode_files_gives_the_cpu_paths_network_input(gpu, device, tmp_path, monkeypatch):
    """GpuJpegDecoder with pytorch-fid's preprocessing, through jpeg_batch.c's stand-in (Pillow decoding as
    stored): each slot the network's float32 input, JPEGs resized on the GPU as stored whatever their EXIF
    orientation (pytorch-fid ignores it), a PNG by the CPU path, errors in the CPU path's words."""
    _, kernels = gpu
    monkeypatch.setattr(jpeg_decode, "NATIVE", True)
    monkeypatch.setattr(jpeg_decode, "open_native", lambda threads: (FakeNative(), None))
    rng = np.random.default_rng(5)
    photo = lambda h, w: rng.integers(0, 256, (h, w, 3), dtype=np.uint8)  # noqa: E731
    whole = jpeg_bytes(photo(256, 256))
    files = {"a.jpg": whole, "turned6.jpg": turned_jpeg(photo(256, 320), 6), "big.jpg": jpeg_bytes(photo(500, 375)),
             "b.png": png_bytes(photo(256, 256)), "cut.jpg": whole[:len(whole) // 2]}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    paths = [str(tmp_path / n) for n in files]

    def cpu(path: str, data: bytes) -> np.ndarray:
        return decode_u8(path, PRE)  # the FID modes decode to the network's input

    dec = jpeg_decode.GpuJpegDecoder(kernels, PRE, max_batch=len(paths))
    assert dec.reads_files and dec.slot_shape == (3, FID_SIZE, FID_SIZE)
    y = device.alloc(len(paths) * PLANE * 4)
    stream = driver().Stream()
    errors = dec.decode_files(paths, y, stream, cpu)
    stream.synchronize()
    got = np.empty(len(paths) * PLANE, np.float32)
    driver().memcpy_dtoh(got, y)
    dec.close()
    for path, err, slot in zip(paths, errors, got.reshape(len(paths), 3, FID_SIZE, FID_SIZE)):
        if path.endswith("cut.jpg"):
            with pytest.raises(EngineError) as e:
                cpu(path, b"")
            assert err == str(e.value)
            continue
        assert err is None, err
        h, w = Image.open(path).size[::-1]
        assert float(np.abs(slot - cpu(path, b"")).max()) <= bound(h, w), path


def test_bound_is_tight_enough_to_fail():
    """The tolerance is far below what a wrong resize gives: the image shifted by one pixel, or (shrinking, where
    the two differ beyond uint8 rounding) Pillow's antialiased bilinear resize."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    shifted = normalize_planes(pytorch_fid_planes(np.roll(a, 1, axis=1)), PRE)
    assert np.abs(shifted - cpu_input(a)).max() > 100 * bound(256, 256)
    big = rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)
    pil = normalize_u8(np.asarray(Image.fromarray(big).resize((FID_SIZE, FID_SIZE), Image.BILINEAR), np.float32), PRE)
    assert np.abs(pil - cpu_input(big)).max() > 100 * bound(512, 512)


def test_job_layout_is_the_kernels():
    from inception_engine import cuda_build

    src = (cuda_build.source_dir() / "resize_fid.cu").read_text()
    assert f"#define RESIZE_FID_JOB {gpu_fid_resize.JOB_FIELDS}\n" in src
