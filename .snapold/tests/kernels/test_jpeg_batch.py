"""cuda_src/jpeg_batch.c: its header rule against jpeg_header.plain_jpeg_size on fuzzed JPEG headers, its reading
of a batch of files of every kind, and (where nvImageCodec is installed) its batched decode in nvImageCodec's
CPU-only mode against Pillow, byte for byte. Needs nvcc, which compiles it."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

from inception_engine import cuda_build
from inception_engine.ingest import jpeg_batch
from inception_engine.ingest.nvimgcodec import DECODER_OPTIONS
from inception_engine.ingest.jpeg_header import plain_jpeg_size

from helpers.gpu_present import gpu_unavailable_reason
from helpers.gpu_buffers import rng_for

pytestmark = pytest.mark.skipif(cuda_build.find_nvcc() is None, reason="needs nvcc to compile cuda_src/jpeg_batch.c")
LIMIT = Image.MAX_IMAGE_PIXELS


def jpeg(rng: np.random.Generator, **save: object) -> bytes:
    h, w = (int(x) for x in rng.integers(8, 40, 2))
    img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    mode = save.pop("mode", "RGB")
    out = io.BytesIO()
    img.convert(mode).save(out, "JPEG", **save)
    return out.getvalue()


def exif(orientation: int) -> bytes:
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def with_xmp(data: bytes) -> bytes:
    """An XMP packet (APP1) right after the start of image."""
    seg = b"http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta/>"
    return data[:2] + b"\xff\xe1" + (len(seg) + 2).to_bytes(2, "big") + seg + data[2:]


def variants(rng: np.random.Generator) -> list[bytes]:
    """Headers of each kind the rule tells apart, then each with bytes of its header mutated or its tail cut."""
    base = [jpeg(rng), jpeg(rng, progressive=True), jpeg(rng, mode="L"), jpeg(rng, mode="CMYK"),
            jpeg(rng, subsampling=0), jpeg(rng, exif=exif(1)), jpeg(rng, exif=exif(6)), jpeg(rng, exif=exif(3)),
            jpeg(rng, exif=exif(8)), jpeg(rng, exif=exif(9)), jpeg(rng, exif=exif(0)),
            with_xmp(jpeg(rng)), jpeg(rng, quality=30), b"", b"\xff\xd8", b"not a jpeg at all"]
    out = list(base)
    for data in base:
        if len(data) < 4:
            continue
        for _ in range(40):
            b = bytearray(data)
            for _ in range(int(rng.integers(1, 4))):
                pos = int(rng.integers(2, min(len(b), 400)))
                b[pos] = int(rng.integers(0, 256))
            out.append(bytes(b))
        out += [data[:int(rng.integers(2, len(data)))] for _ in range(10)]
    return out


def test_header_rule_agrees_with_the_python_one():
    rng = rng_for("jpeg_batch rule")
    files = variants(rng)
    c = [jpeg_batch.plain_size(d, LIMIT) for d in files]
    py = [plain_jpeg_size(d) for d in files]
    assert c == py
    assert sum(x is not None for x in c) >= 5 and sum(x is None for x in c) >= 5  # both answers exercised
    assert {x[2] for x in c if x is not None} >= {1, 3, 6, 8}  # orientations read, each as the Python rule reads it
    big = jpeg(rng)
    assert jpeg_batch.plain_size(big, 10) is None and jpeg_batch.plain_size(big, 0) is not None  # the pixel limit


def test_read_sorts_a_batch_of_files_of_every_kind(tmp_path):
    rng = rng_for("jpeg_batch read")
    plain, grey_png = jpeg(rng), io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (9, 7), dtype=np.uint8)).save(grey_png, "PNG")
    (tmp_path / "a.jpg").write_bytes(plain)
    (tmp_path / "b.png").write_bytes(grey_png.getvalue())
    (tmp_path / "cut.jpg").write_bytes(plain[:len(plain) // 2])
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "dir.jpg").mkdir()
    os.mkfifo(tmp_path / "fifo.jpg")  # opened without blocking, refused as not a regular file
    names = ["a.jpg", "b.png", "cut.jpg", "empty.jpg", "dir.jpg", "fifo.jpg", "missing.jpg", "a.jpg"]
    reader = jpeg_batch.JpegBatch(with_decoder=False)
    try:
        for threads in (1, 3):
            got = reader.read([os.fsencode(tmp_path / n) for n in names], LIMIT, threads)
            P, O, U = jpeg_batch.PLAIN, jpeg_batch.OTHER, jpeg_batch.UNREADABLE
            assert got.kind.tolist() == [P, O, O, U, U, U, U, P]
            assert tuple(got.layout[0]) == plain_jpeg_size(plain) and tuple(got.layout[7]) == tuple(got.layout[0])
            assert [reader.data(i, int(got.length[i])) for i in (0, 1, 2)] == [
                plain, grey_png.getvalue(), plain[:len(plain) // 2]]
            assert got.length[3:7].tolist() == [0, 0, 0, 0]
    finally:
        reader.close()


def installed_release() -> tuple[int, int, int] | None:
    codec = jpeg_batch.nvimgcodec_dir()
    return None if codec is None else jpeg_batch.header_version(codec)


def test_releases_before_the_first_one_run_are_left_to_the_python_api(tmp_path, monkeypatch):
    for version, refused in (((0, 8, 0), True), ((0, 9, 0), False), ((1, 0, 2), False)):
        (tmp_path / "include").mkdir(exist_ok=True)
        (tmp_path / "include" / "nvimgcodec_version.h").write_text("".join(
            f"#define NVIMGCODEC_VER_{part} {n}\n" for part, n in zip(("MAJOR", "MINOR", "PATCH"), version)))
        assert jpeg_batch.header_version(tmp_path) == version
        monkeypatch.setattr(jpeg_batch, "nvimgcodec_dir", lambda: tmp_path)
        monkeypatch.setattr(jpeg_batch, "build", lambda codec: (_ for _ in ()).throw(OSError("built")))
        with pytest.raises(OSError, match="older than 0.9.0" if refused else "built"):
            jpeg_batch.library.__wrapped__(True)


@pytest.mark.skipif((installed_release() or (0, 0, 0)) < jpeg_batch.MIN_RELEASE,
                    reason=f"nvImageCodec {'.'.join(map(str, jpeg_batch.MIN_RELEASE))} or later is not installed "
                           "(the gpu-decode extra)")
@pytest.mark.skipif(gpu_unavailable_reason() is None,
                    reason="a GPU is here: tests/device/test_gpu_decode.py runs the batched decode on it (nvImageCodec "
                           "0.9's CPU-only mode never returned on the H100 machine)")
def test_decode_in_cpu_mode_is_pillows_decode(tmp_path):
    """The batched decode's set-up (code streams, images into caller memory at offsets, one decode call) through
    nvImageCodec's CPU-only mode, whose libjpeg-turbo with smooth chroma upsampling is Pillow's decoder: the check
    of that set-up on machines without a GPU (CI)."""
    rng = rng_for("jpeg_batch decode")
    files = [jpeg(rng), jpeg(rng, progressive=True), jpeg(rng, mode="L"), jpeg(rng, subsampling=0), jpeg(rng)]
    paths = []
    for i, data in enumerate(files):
        paths.append(tmp_path / f"{i}.jpg")
        paths[-1].write_bytes(data)
    codec = jpeg_batch.JpegBatch()
    try:
        codec.open_decoder(jpeg_batch.CPU_ONLY, 2, DECODER_OPTIONS)
        got = codec.read([os.fsencode(p) for p in paths], LIMIT)
        assert (got.kind == jpeg_batch.PLAIN).all()
        which = np.array([4, 0, 2, 3, 1], np.int32)  # any order of the read's files
        hw = got.hw[which].astype(np.int64)
        nbytes = hw[:, 0] * hw[:, 1] * 3
        offsets = np.cumsum(nbytes) - nbytes
        out = np.full(int(nbytes.sum()), 7, np.uint8)
        ok = codec.decode(which, hw, out.ctypes.data, offsets, 0)
    finally:
        codec.close()
    assert ok.tolist() == [1] * 5
    for k, i in enumerate(which):
        want = np.asarray(Image.open(paths[i]).convert("RGB"))
        np.testing.assert_array_equal(out[offsets[k]:offsets[k] + nbytes[k]].reshape(want.shape), want)
