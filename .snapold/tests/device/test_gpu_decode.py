"""ingest/jpeg_decode.py: which files go to nvImageCodec (no GPU needed), and real GPU decoding against the
exact CPU path.

The GPU test decodes a few dozen ImageNet-like JPEGs (500 x 375 and 375 x 500, quality 90, smooth content with
edges and grain, like photos) and the files that must take the CPU path. The resize is exact (resize_pil.cu), so
GPU crops differ from the CPU path's only by the JPEG decoders: nvJPEG's IDCT against libjpeg-turbo's integer one
(a level per Y/Cb/Cr sample), YCbCr -> RGB rounding (a level) and chroma upsampling rounding (a level or two), a few
levels at most, less on average after the resize averages neighbours. MAX_ABS_DIFF = 8 leaves margin for that; a
real mismatch (replicated instead of smooth chroma upsampling, a wrong orientation or colour space) shows as tens of
levels. The measured mean and max are printed (pytest -s) so the bound can be tightened.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine.errors import BackendUnavailable, EngineError
from inception_engine.ingest import gpu_resize, jpeg_decode, jpeg_header, nvimgcodec
from inception_engine.ingest.images import Preprocess, decode_u8

PRE = Preprocess()
MAX_ABS_DIFF = 8  # per byte, GPU-decoded JPEG crop against the CPU path's (see the module doc)
MEAN_ABS_DIFF = 1.0  # over all bytes of all GPU-decoded crops


def photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Photo-like content: smooth colour fields (a small random grid upsampled), a few hard-edged shapes, grain."""
    field = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
    a = np.asarray(field, np.float64)
    for _ in range(4):
        y0, x0 = rng.integers(0, h - 40), rng.integers(0, w - 40)
        a[y0:y0 + rng.integers(20, h // 2), x0:x0 + rng.integers(20, w // 2)] = rng.integers(0, 256, 3)
    a += rng.normal(0, 4, a.shape)
    return np.clip(a, 0, 255).round().astype(np.uint8)


def encode(a: np.ndarray, fmt: str = "JPEG", **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, fmt, **kw)
    return buf.getvalue()


def rotated_jpeg(a: np.ndarray, orientation: int = 6) -> bytes:
    exif = Image.Exif()
    exif[jpeg_header.EXIF_ORIENTATION] = orientation  # stored turned (6: as a phone held upright): Pillow turns it
    return encode(a, quality=90, exif=exif.tobytes())


def cmyk_jpeg(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).convert("CMYK").save(buf, "JPEG", quality=90)
    return buf.getvalue()


# --- which path a file takes (no GPU) ---------------------------------------------------------------------------

def test_header_triage():
    rng = np.random.default_rng(0)
    a = photo(rng, 375, 500)
    jpeg = encode(a, quality=90)
    assert jpeg_header.gpu_eligible("a.jpg", jpeg) == (375, 500, 1)
    assert jpeg_header.gpu_eligible("g.jpg", encode(a[:, :, 1], quality=90)) == (375, 500, 1)  # greyscale: L
    for o in range(1, 9):  # turned photos go to the GPU as stored, with the orientation the resize reads them by
        assert jpeg_header.gpu_eligible("r.jpg", rotated_jpeg(a, o)) == (375, 500, o)
    # an Adobe APP14 segment with transform 0 after SOI: the three channels are stored as R, G, B
    adobe_rgb = jpeg[:2] + b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00" + jpeg[2:]
    for name, data in [("b.png", encode(a, "PNG")), ("c.jpg", cmyk_jpeg(a)), ("t.jpg", jpeg[:-5000]),
                       ("n.jpg", b"no image"), ("e.jpg", b""), ("s.jpg", adobe_rgb), ("9.jpg", rotated_jpeg(a, 9))]:
        assert jpeg_header.gpu_eligible(name, data) is None, name


def test_the_marker_reader_agrees_with_pillow():
    """plain_jpeg_size, which spares most files Pillow's header parse, answers only where Pillow's triage gives the
    same answer, and does answer for the plain JPEGs that are most of a photo collection."""
    rng = np.random.default_rng(4)
    a = photo(rng, 300, 420)
    exif1, exif6 = Image.Exif(), Image.Exif()
    exif1[jpeg_header.EXIF_ORIENTATION] = 1
    exif6[jpeg_header.EXIF_ORIENTATION] = 6
    plain = {"baseline": encode(a, quality=90), "grey": encode(a[:, :, 0], quality=80),
             "progressive": encode(a, quality=90, progressive=True), "optimized": encode(a, optimize=True),
             "4:4:4": encode(a, subsampling=0), "exif upright": encode(a, exif=exif1.tobytes()),
             "exif turned": encode(a, exif=exif6.tobytes()), "restart markers": encode(a, restart_marker_rows=1)}
    baseline = plain["baseline"]
    other = {"xmp": encode(a, xmp=b"<x:xmpmeta/>"),
             "cmyk": cmyk_jpeg(a), "png": encode(a, "PNG"), "truncated": baseline[:-3000],
             "adobe rgb": baseline[:2] + b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00" + baseline[2:],
             "not an image": b"\xff\xd8 no", "empty": b""}
    plain["trailing bytes"] = baseline + b"\x00" * 10  # after the end marker: Pillow and nvJPEG ignore them
    for name, data in {**plain, **other}.items():
        fast = jpeg_header.plain_jpeg_size(data)
        assert fast is None or fast == jpeg_header.pillow_eligible(name, data), name
        assert (fast is not None) == (name in plain), name
    assert jpeg_header.plain_jpeg_size(baseline) == (300, 420, 1)
    assert jpeg_header.plain_jpeg_size(plain["exif turned"]) == (300, 420, 6)


def test_truncation_is_seen_past_an_exif_thumbnail():
    rng = np.random.default_rng(1)
    thumb = encode(photo(rng, 60, 80), quality=80)  # a JPEG inside APP1, with its own scan and end marker
    app1 = b"\xff\xe1" + (len(thumb) + 2).to_bytes(2, "big") + thumb
    jpeg = encode(photo(rng, 375, 500), quality=90)
    with_thumb = jpeg[:2] + app1 + jpeg[2:]
    assert jpeg_header.jpeg_complete(with_thumb)
    assert not jpeg_header.jpeg_complete(with_thumb[:-3000])


def test_decompression_bombs_are_refused_in_the_cpu_paths_words(monkeypatch):
    """The GPU decode's header check refuses more than the run's limit as images.open_image does, whether Pillow's own
    bomb check fires first (its limit 1,000: above 2,000 pixels) or not."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    for limit in (1000, 2000):
        with pytest.raises(EngineError, match=r"^x\.jpg: refused, it declares 2,400 pixels, more than the "
                                              f"{limit:,} an image may have"):
            jpeg_header.gpu_eligible("x.jpg", encode(np.zeros((40, 60, 3), np.uint8)), limit)


def test_cuda_array_interface_is_checked():
    cai = {"shape": (10, 20, 3), "typestr": "|u1", "data": (4096, False), "strides": (64, 3, 1)}
    ok = type("Img", (), {"__cuda_array_interface__": cai})()
    assert jpeg_decode.device_image(ok, 10, 20) == gpu_resize.DeviceImage(4096, 10, 20, 64)
    packed = type("Img", (), {"__cuda_array_interface__": {**cai, "strides": None}})()
    assert jpeg_decode.device_image(packed, 10, 20).pitch == 60
    assert jpeg_decode.device_image(ok, 20, 10) is None  # rotated by the decoder after all
    planar = type("Img", (), {"__cuda_array_interface__": {**cai, "shape": (3, 10, 20)}})()
    assert jpeg_decode.device_image(planar, 10, 20) is None

    class HostImage:  # nvImageCodec's CPU backend decodes into host memory
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("buffer is not in device memory")
    assert jpeg_decode.device_image(HostImage(), 10, 20) is None


def test_missing_nvimgcodec_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # import fails as if not installed
    if "nvidia" in sys.modules:  # imported already (an earlier test): `from nvidia import` finds the attribute
        monkeypatch.delattr(sys.modules["nvidia"], "nvimgcodec", raising=False)
    with pytest.raises(BackendUnavailable, match=r"^--decode gpu needs nvidia-nvimgcodec-cu13 ") as e:
        nvimgcodec.load_nvimgcodec()
    assert "\n" not in str(e.value)


# --- real nvImageCodec on the GPU ------------------------------------------------------------------------------

def cpu_path(path: str, data: bytes) -> np.ndarray:
    return decode_u8(path, PRE)


@pytest.mark.gpu
@pytest.mark.parametrize("native", [True, False], ids=["jpeg_batch.c", "python api"])
def test_gpu_decode_agrees_with_the_cpu_path(gpu, tmp_path, monkeypatch, native):
    """Both ways to nvImageCodec: decode_files through cuda_src/jpeg_batch.c, decode_into through its Python API."""
    monkeypatch.setattr(jpeg_decode, "NATIVE", native)
    try:
        nvimgcodec.load_nvimgcodec()
    except BackendUnavailable as e:
        pytest.skip(str(e))
    from inception_engine.backends.cuda.device import driver

    _, kernels = gpu
    rng = np.random.default_rng(19)
    files: dict[str, bytes] = {}
    for i in range(32):
        files[f"photo{i:02d}.jpg"] = encode(photo(rng, *((375, 500) if i % 2 else (500, 375))), quality=90)
    files["tall.jpg"] = encode(photo(rng, 1100, 420), quality=90)  # Pillow 13: vertical pass first
    files["grey.jpg"] = encode(photo(rng, 375, 500)[:, :, 0], quality=90)
    for o in range(2, 9):  # stored turned or mirrored: decoded as stored, resized upright
        files[f"turned{o}.jpg"] = rotated_jpeg(photo(rng, 375, 500), o)
    fallback = {"b.png": encode(photo(rng, 300, 400), "PNG"), "cmyk.jpg": cmyk_jpeg(photo(rng, 375, 500))}
    broken = {"cut.jpg": files["photo00.jpg"][:20000]}
    items = []
    for name, data in {**files, **fallback, **broken}.items():
        (tmp_path / name).write_bytes(data)
        items.append((str(tmp_path / name), data))

    drv = driver()
    dec = jpeg_decode.GpuJpegDecoder(kernels, PRE, max_batch=len(items))
    if native:  # nvcc and nvImageCodec's header are on the GPU machine: the C path must have been built
        assert dec.native_unavailable is None, dec.native_unavailable
    stream = drv.Stream()
    slot = PRE.size * PRE.size * 3
    dst = drv.mem_alloc(len(items) * slot)
    drv.memset_d8(int(dst), 0x5A, len(items) * slot)
    on_cpu: list[str] = []

    def fallback_path(path: str, data: bytes) -> np.ndarray:
        on_cpu.append(Path(path).name)
        return cpu_path(path, data)

    errors = (dec.decode_files([path for path, _ in items], int(dst), stream, fallback_path) if native else
              dec.decode_into(items, int(dst), stream, fallback_path))
    stream.synchronize()
    got = np.empty((len(items), PRE.size, PRE.size, 3), np.uint8)
    drv.memcpy_dtoh(got, int(dst))
    dec.close()
    dst.free()

    assert sorted(on_cpu) == sorted([*fallback, *broken]), "only those files take the CPU path"
    diffs = []
    for (path, data), err, crop in zip(items, errors, got):
        name = Path(path).name
        if name in broken:
            with pytest.raises(EngineError) as e:
                cpu_path(path, data)
            assert err == str(e.value), name
            continue
        assert err is None, err
        ref = cpu_path(path, data)
        d = np.abs(crop.astype(np.int16) - ref)
        if name in fallback:
            assert not d.any(), f"{name}: the CPU path's result must arrive unchanged"
        else:
            diffs.append(d)
            assert d.max() <= MAX_ABS_DIFF, f"{name}: max diff {d.max()}, mean {d.mean():.3f}"
    mean = float(np.mean([d.mean() for d in diffs]))
    print(f"\nGPU-decoded JPEGs vs CPU path: {len(diffs)} crops, mean abs diff {mean:.3f}, "
          f"max {max(int(d.max()) for d in diffs)}, bytes differing {np.mean([(d > 0).mean() for d in diffs]):.1%}")
    assert mean <= MEAN_ABS_DIFF


@pytest.mark.gpu
def test_decode_chains_give_the_one_chain_predictions_in_order(gpu, tmp_path, monkeypatch):
    """--decode gpu through jpeg_batch.c with several decode calls in flight (cuda_runner.CudaRunner's chains, each its
    own decoder, copy stream and thread): the predictions of one chain, in input order, errors in their places. Decode
    calls of 4 files (2 batches), 23 inputs: 6 calls over 2 chains, the last call partial."""
    from helpers.random_weights import random_arrays

    from inception_engine import pipeline
    from inception_engine.ingest import images
    from inception_engine.backends.cuda.backend import CudaBackend
    from inception_engine.cuda_runner import CudaRunner
    from inception_engine.plan import build_plan
    from inception_engine.weights import Weights

    try:
        nvimgcodec.load_nvimgcodec()
    except BackendUnavailable as e:
        pytest.skip(str(e))
    monkeypatch.setattr(images, "DECODE_IMAGES", 4)  # a decode call: images.decode_call_images
    size = 75
    pre = Preprocess(size=size, resize=86)
    weights = Weights(random_arrays(17), {"count_include_pad": True})
    rng = np.random.default_rng(23)
    sources = []
    for i in range(20):
        path = tmp_path / f"{i:02d}.jpg"
        Image.fromarray(rng.integers(0, 256, (90 + 3 * i, 100, 3), dtype=np.uint8)).save(path, quality=90)
        sources.append(path)
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8 not really")
    sources[3:3] = [tmp_path / "missing.jpg"]
    Image.fromarray(rng.integers(0, 256, (80, 92, 3), dtype=np.uint8)).save(tmp_path / "p.png")
    sources[11:11] = [tmp_path / "bad.jpg", tmp_path / "p.png"]
    backend = CudaBackend(weights, build_plan(2, weights.layers(), input_size=size), graph=False, nhwc=False)
    runs = {}
    try:
        for chains in (1, 2):
            monkeypatch.setattr(jpeg_decode, "DECODE_CHAINS", chains)
            runner = CudaRunner(backend, pre, gpu_decode=True)
            assert runner.decode_fallback is None and runner.decode_chains == chains
            runs[chains] = list(pipeline.classify_encoded(sources, runner, 3))
    finally:
        backend.close()
    one, two = runs[1], runs[2]
    assert [p.image for p in two] == [str(s) for s in sources]
    assert [(p.top, p.error) for p in two] == [(p.top, p.error) for p in one]
    assert [p.ok for p in two] == [s.exists() and s.name != "bad.jpg" for s in sources]
