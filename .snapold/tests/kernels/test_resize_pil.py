"""resize_pil.cu (ingest/gpu_resize.py) and ingest/jpeg_decode.py's host side, on the GPU (and on the CPU emulator:
test_cuda_emulated.py).

The kernels must give exactly pil_resize's bytes (hence Pillow's) for fresh random images, in both pass orders,
read through a row pitch wider than the pixels, and write every byte of their batch slot and nothing outside it:
the output starts poisoned with a sentinel, twice with two different sentinels, and slots not targeted must keep it.
GpuJpegDecoder.decode_into runs end to end with a stand-in for nvImageCodec that decodes with Pillow into device
memory, and decode_files through jpeg_batch.c's real reading and header rule with Pillow decoding into its arena, so
every crop must equal the CPU path bit for bit (photos stored turned or mirrored included) and the errors must name
the right files.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from inception_engine.backends.cuda.device import driver
from inception_engine.errors import EngineError
from inception_engine.ingest import gpu_resize, jpeg_decode, jpeg_header
from inception_engine.ingest.images import Preprocess, decode_u8, resize_crop
from inception_engine.ingest.pil_resize import resize_crop_u8

from helpers.fake_codec import FakeCodec
from helpers.gpu_buffers import rng_for


pytestmark = pytest.mark.gpu

PRE = Preprocess()
SLOT = PRE.size * PRE.size * 3


class Device:
    """Device buffers for one test, freed at the end."""

    def __init__(self) -> None:
        self.allocs: list[Any] = []

    def alloc(self, nbytes: int) -> int:
        a = driver().mem_alloc(max(nbytes, 4))
        self.allocs.append(a)
        return int(a)

    def upload(self, a: np.ndarray, pad: int = 0) -> gpu_resize.DeviceImage:
        """An (h, w, 3) uint8 image with rows of w * 3 + pad bytes (pad filled with 0xEE, never to be read)."""
        h, w, _ = a.shape
        pitch = w * 3 + pad
        rows = np.full((h, pitch), 0xEE, np.uint8)
        rows[:, :w * 3] = a.reshape(h, -1)
        ptr = self.alloc(rows.nbytes)
        driver().memcpy_htod(ptr, rows)
        return gpu_resize.DeviceImage(ptr, h, w, pitch)

    def download(self, ptr: int, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, np.uint8)
        driver().Context.synchronize()
        driver().memcpy_dtoh(out, ptr)
        return out

    def free(self) -> None:
        for a in self.allocs:
            a.free()


@pytest.fixture
def device(gpu):
    d = Device()
    yield d
    d.free()


# (h, w): ImageNet's 375 x 500 / 500 x 375, both axes kept (342), one kept, upscaled, tall portraits where Pillow 13
# runs the vertical pass first, a large photo, odd sizes.
SIZES = [(375, 500), (500, 375), (342, 342), (342, 411), (120, 90), (1279, 603), (801, 400), (1535, 2048), (347, 1001)]


@pytest.mark.parametrize("sentinel", [0x00, 0xFF])
def test_resize_kernels_match_pillow_exactly(gpu, device, sentinel):
    _, kernels = gpu
    resize = gpu_resize.GpuResizeCrop(kernels, PRE)
    stream = driver().Stream()
    slots = 2 * len(SIZES) + 1  # every other slot is a target; the rest must keep the sentinel
    dst = device.alloc(slots * SLOT)
    driver().memset_d8(dst, sentinel, slots * SLOT)
    images, jobs = [], []
    for i, (h, w) in enumerate(SIZES):
        a = rng_for("resize", h, w, sentinel).integers(0, 256, (h, w, 3), dtype=np.uint8)
        images.append(a)
        jobs.append((device.upload(a, pad=4 * (i % 3) + (i % 2)), 2 * i + 1, 1))
    resize.enqueue(jobs, dst, stream)
    resize.wait()
    got = device.download(dst, slots * SLOT).reshape(slots, PRE.size, PRE.size, 3)
    resize.close()
    for i, a in enumerate(images):
        ref = resize_crop_u8(a, PRE.resize, PRE.size)
        assert np.array_equal(ref, resize_crop(Image.fromarray(a), PRE))
        bad = int((got[2 * i + 1] != ref).sum())
        assert bad == 0, f"{SIZES[i]}: {bad} bytes differ from Pillow's"
    untouched = got[0::2]
    assert (untouched == sentinel).all(), "a kernel wrote outside its slot"


# EXIF orientation -> what Pillow's exif_transpose does to turn the stored image upright
TRANSPOSES = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}


def upright(a: np.ndarray, orientation: int) -> np.ndarray:
    return a if orientation == 1 else np.asarray(Image.fromarray(a).transpose(TRANSPOSES[orientation]))


def test_orientation_steps_are_pillows_transposes():
    """upright_views' table, walked on the host: each orientation's view of a stored image is Pillow's transpose."""
    h, w, pitch = 5, 7, 7 * 3 + 2
    stored = rng_for("steps").integers(0, 256, (h, pitch), dtype=np.uint8)
    pixels = stored[:, :w * 3].reshape(h, w, 3)
    for o in range(1, 9):
        (origin,), (vh,), (vw,), (row,), (col,) = gpu_resize.upright_views(
            *(np.array([x]) for x in (0, h, w, pitch, o)))
        flat = stored.ravel()
        view = np.array([[flat[origin + y * row + x * col:][:3] for x in range(vw)] for y in range(vh)])
        assert np.array_equal(view, upright(pixels, o)), o


@pytest.mark.parametrize("sentinel", [0x00, 0xFF])
def test_resize_kernels_read_the_stored_image_upright(gpu, device, sentinel):
    """Every EXIF orientation, for sizes that are wide, tall and tall once turned (both pass orders): the crop of the
    stored image turned upright, exactly as Pillow makes it, and nothing written outside the targeted slots."""
    _, kernels = gpu
    resize = gpu_resize.GpuResizeCrop(kernels, PRE)
    stream = driver().Stream()
    cases = [(o, shape) for o in range(1, 9) for shape in ((375, 500), (1100, 420), (347, 1001))]
    slots = 2 * len(cases) + 1
    dst = device.alloc(slots * SLOT)
    driver().memset_d8(dst, sentinel, slots * SLOT)
    images, jobs = [], []
    for i, (o, (h, w)) in enumerate(cases):
        a = rng_for("upright", o, h, w, sentinel).integers(0, 256, (h, w, 3), dtype=np.uint8)
        images.append(a)
        jobs.append((device.upload(a, pad=3 * (i % 2)), 2 * i + 1, o))
    resize.enqueue(jobs, dst, stream)
    resize.wait()
    got = device.download(dst, slots * SLOT).reshape(slots, PRE.size, PRE.size, 3)
    resize.close()
    for i, ((o, shape), a) in enumerate(zip(cases, images)):
        ref = resize_crop_u8(upright(a, o), PRE.resize, PRE.size)
        bad = int((got[2 * i + 1] != ref).sum())
        assert bad == 0, f"orientation {o}, {shape}: {bad} bytes differ from Pillow's"
    assert (got[0::2] == sentinel).all(), "a kernel wrote outside its slot"


def test_job_layout_is_the_kernels():
    from inception_engine import cuda_build

    src = (cuda_build.source_dir() / "resize_pil.cu").read_text()
    assert f"#define RESIZE_PIL_JOB {gpu_resize.JOB_FIELDS}\n" in src


def test_resize_buffers_grow_between_batches(gpu, device):
    """A small batch then one needing bigger tables and intermediate: both exact."""
    _, kernels = gpu
    resize = gpu_resize.GpuResizeCrop(kernels, PRE)
    stream = driver().Stream()
    dst = device.alloc(2 * SLOT)
    for shapes in ([(375, 500)], [(299, 299), (2400, 1100)]):
        arrays = [rng_for("grow", s).integers(0, 256, (*s, 3), dtype=np.uint8) for s in shapes]
        resize.enqueue([(device.upload(a), i, 1) for i, a in enumerate(arrays)], dst, stream)
        resize.wait()
        got = device.download(dst, 2 * SLOT).reshape(2, PRE.size, PRE.size, 3)
        for i, a in enumerate(arrays):
            assert np.array_equal(got[i], resize_crop_u8(a)), shapes[i]
    resize.close()


# --- GpuJpegDecoder with Pillow standing in for nvImageCodec -----------------------------------------------------

def jpeg_bytes(a: np.ndarray, **kw: Any) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def turned_jpeg(a: np.ndarray, orientation: int) -> bytes:
    """a's JPEG with an EXIF orientation: the CPU path turns (or mirrors) it upright."""
    exif = Image.Exif()
    exif[jpeg_header.EXIF_ORIENTATION] = orientation
    return jpeg_bytes(a, exif=exif.tobytes())


def png_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


def test_decode_into_matches_the_cpu_path_exactly(gpu, device, tmp_path, monkeypatch):
    _, kernels = gpu
    monkeypatch.setattr(jpeg_decode, "load_nvimgcodec", lambda: FakeCodec)
    monkeypatch.setattr(jpeg_decode, "NATIVE", False)  # through the stand-in, not jpeg_batch.c
    rng = rng_for("decode_into")
    photo = lambda h, w: rng.integers(0, 256, (h, w, 3), dtype=np.uint8)  # noqa: E731
    whole = jpeg_bytes(photo(375, 500))
    files = {
        "a.jpg": whole,
        "tall.jpg": jpeg_bytes(photo(900, 400)),
        "grey.jpg": jpeg_bytes(photo(500, 375)[:, :, 0]),
        **{f"turned{o}.jpg": turned_jpeg(photo(333, 500), o) for o in range(2, 9)},
        "cmyk.jpg": (lambda b: (Image.fromarray(photo(350, 360)).convert("CMYK").save(b, "JPEG"), b.getvalue())[1])(
            io.BytesIO()),
        "b.png": png_bytes(photo(300, 420)),
        "cut.jpg": whole[:len(whole) // 2],
        "notes.txt": b"not an image at all",
        "comment.jpg": b"\xff\xd8\xff\xfe\x00\x04hi" + jpeg_bytes(photo(400, 300))[2:],  # COM segment first
    }
    items = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        items.append((str(tmp_path / name), data))

    cpu_threads = set()

    def cpu(path: str, data: bytes) -> np.ndarray:
        cpu_threads.add(threading.current_thread().name)
        return decode_u8(path, PRE)

    dec = jpeg_decode.GpuJpegDecoder(kernels, PRE, max_batch=len(items) + 1)
    stream = driver().Stream()
    dst = device.alloc(len(items) * SLOT)
    driver().memset_d8(dst, 0x5A, len(items) * SLOT)
    FakeCodec.Decoder.calls = []
    errors = dec.decode_into(items, dst, stream, cpu)
    stream.synchronize()
    got = device.download(dst, len(items) * SLOT).reshape(len(items), PRE.size, PRE.size, 3)
    dec.close()
    assert FakeCodec.Decoder.calls == [11]  # a, tall, grey, turned 2-8, comment in one batch; the rest never reach it
    # the CPU path's files (png, cmyk, cut, notes) were decoded on the decoder's pool, side by side
    assert cpu_threads and all(name.startswith("gpu-decode-cpu-path") for name in cpu_threads), cpu_threads
    for (path, data), err, crop in zip(items, errors, got):
        name = Path(path).name
        if name in ("cut.jpg", "notes.txt"):
            with pytest.raises(EngineError) as e:
                cpu(path, data)
            assert err == str(e.value) and err.startswith(path) and "\n" not in err
        else:
            assert err is None, err
            assert np.array_equal(crop, cpu(path, data)), name


def test_decode_into_refuses_decompression_bombs(gpu, device, monkeypatch):
    _, kernels = gpu
    monkeypatch.setattr(jpeg_decode, "load_nvimgcodec", lambda: FakeCodec)
    monkeypatch.setattr(jpeg_decode, "NATIVE", False)  # through the stand-in, not jpeg_batch.c
    dec = jpeg_decode.GpuJpegDecoder(kernels, Preprocess(max_pixels=1000), max_batch=1)  # a 60 x 40 picture is over
    called = []
    errors = dec.decode_into([("big.jpg", jpeg_bytes(np.zeros((40, 60, 3), np.uint8)))], device.alloc(SLOT),
                             driver().Stream(), lambda p, d: called.append(p))
    dec.close()
    assert not called and errors[0].startswith("big.jpg: refused, it declares 2,400 pixels, more than the 1,000")


class FakeNative:
    """jpeg_batch.c's context with Pillow standing in for nvImageCodec: its real reading and header rule (built
    without a decoder), each file it is asked for decoded as stored (no EXIF turn) into the arena. Records the bytes
    each decode call writes."""

    def __init__(self) -> None:
        from inception_engine.ingest import jpeg_batch

        self.reader = jpeg_batch.JpegBatch(with_decoder=False)
        self.got: Any = None
        self.calls: list[int] = []

    def read(self, paths: list[bytes], max_pixels: int | None) -> Any:
        self.got = self.reader.read(paths, max_pixels)
        return self.got

    def data(self, i: int, length: int) -> bytes:
        return self.reader.data(i, length)

    def decode(self, which: np.ndarray, hw: np.ndarray, out: int, offsets: np.ndarray, stream: int) -> np.ndarray:
        self.calls.append(int(sum(int(h) * int(w) * 3 for h, w in hw)))
        ok = np.zeros(len(which), np.int32)
        for k, (i, (h, w), at) in enumerate(zip(which, hw, offsets)):
            with Image.open(io.BytesIO(self.data(int(i), int(self.got.length[i])))) as img:
                a = np.ascontiguousarray(np.asarray(img.convert("RGB")))
            if a.shape[:2] == (h, w):
                driver().memcpy_htod(out + int(at), a)
                ok[k] = 1
        return ok

    def close(self) -> None:
        self.reader.close()


def test_decode_files_in_arena_parts_matches_the_cpu_path_exactly(gpu, device, tmp_path, monkeypatch):
    """decode_files through jpeg_batch.c's context (decoding by Pillow, as stored): upright, turned and mirrored
    JPEGs decoded in parts of the arena's size and resized upright, the CPU path's files on its pool, errors in the
    CPU path's words; every crop the CPU path's bytes."""
    _, kernels = gpu
    native = FakeNative()
    monkeypatch.setattr(jpeg_decode, "NATIVE", True)
    monkeypatch.setattr(jpeg_decode, "open_native", lambda threads: (native, None))
    monkeypatch.setattr(jpeg_decode, "ARENA_BYTES", 1_100_000)  # two 333 x 500 images a part; the tall one alone
    rng = rng_for("decode_files")
    photo = lambda h, w: rng.integers(0, 256, (h, w, 3), dtype=np.uint8)  # noqa: E731
    whole = jpeg_bytes(photo(375, 500))
    files = {"a.jpg": whole, **{f"turned{o}.jpg": turned_jpeg(photo(333, 500), o) for o in range(1, 9)},
             "tall.jpg": jpeg_bytes(photo(1200, 400)), "b.png": png_bytes(photo(300, 420)),
             "cut.jpg": whole[:len(whole) // 2],
             "xmp.jpg": jpeg_bytes(photo(200, 300), xmp=b"<x:xmpmeta/>"), "notes.txt": b"not an image"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    paths = [str(tmp_path / n) for n in files] + [str(tmp_path / "missing.jpg")]

    def cpu(path: str, data: bytes) -> np.ndarray:
        return decode_u8(path, PRE)

    dec = jpeg_decode.GpuJpegDecoder(kernels, PRE, max_batch=len(paths))
    assert dec.reads_files
    stream = driver().Stream()
    dst = device.alloc(len(paths) * SLOT)
    driver().memset_d8(dst, 0x5A, len(paths) * SLOT)
    errors = dec.decode_files(paths, dst, stream, cpu)
    stream.synchronize()
    got = device.download(dst, len(paths) * SLOT).reshape(len(paths), PRE.size, PRE.size, 3)
    dec.close()
    # a, turned 1-8, tall and xmp decoded "on the GPU", in parts: each within the arena but for one image alone
    assert sum(native.calls) == sum(h * w * 3 for h, w in [(375, 500)] + [(333, 500)] * 8 + [(1200, 400), (200, 300)])
    assert len(native.calls) > 3 and all(c <= 1_100_000 or c == 1200 * 400 * 3 for c in native.calls), native.calls
    for path, err, crop in zip(paths, errors, got):
        name = Path(path).name
        if name in ("cut.jpg", "notes.txt", "missing.jpg"):
            with pytest.raises(EngineError) as e:
                cpu(path, b"")
            assert err == str(e.value) and "\n" not in err, name
        else:
            assert err is None, err
            assert np.array_equal(crop, cpu(path, b"")), name


def test_arena_parts():
    parts = jpeg_decode.arena_parts(np.array([4, 4, 4, 9, 1, 1, 20, 2]), 8)
    assert parts == [slice(0, 2), slice(2, 3), slice(3, 4), slice(4, 6), slice(6, 7), slice(7, 8)]
    assert jpeg_decode.arena_parts(np.array([], np.int64), 8) == []
