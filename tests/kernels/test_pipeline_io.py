"""pipeline_io.cu's kernels and cuda_runner.py's CudaRunner against the host path, on fresh random data.

normalize_u8_nchw must equal images.normalize_u8 bit for bit; softmax_topk_rows must pick the float64 reference's
classes in its order (ties to the lower index) with its probabilities to float32 rounding. Outputs start as NaN (or
-1 for indices), so an element never written fails. Runs on a GPU, and on the CPU emulator
(tests/kernels/test_cuda_emulated.py).
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

from inception_engine import pipeline
from inception_engine.backends.cuda.backend import CudaBackend
from inception_engine.backends.cuda.device import driver
from inception_engine.backends.cuda.tiles import THREADS
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.cuda_runner import TOPK_N, CudaRunner
from inception_engine.ingest.images import Preprocess, normalize_u8
from inception_engine.plan import build_plan
from inception_engine.weights import Weights

from helpers.random_weights import random_arrays

pytestmark = pytest.mark.gpu

EMULATED = "INCEPTION_EMU_LIB" in os.environ  # no CUDA graphs, and every thread a fiber: keep it small


def rng_for(*key: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def to_device(a: np.ndarray) -> object:
    drv = driver()
    d = drv.mem_alloc(max(a.nbytes, 4))
    drv.memcpy_htod(int(d), np.ascontiguousarray(a))
    return d


def from_device(d: object, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    out = np.empty(shape, dtype)
    driver().memcpy_dtoh(out, int(d))
    return out


@pytest.mark.parametrize("batch, size", [(1, 299), (3, 37)])
def test_normalize_u8_nchw_is_bit_identical_to_the_host(gpu, batch, size):
    pre = Preprocess(size=size, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    x = rng_for("normalize", batch, size).integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
    x[0, 0, 0] = (0, 255, 128)  # the extremes
    hw = size * size
    d_x, d_ms = to_device(x), to_device(np.asarray((*pre.mean, *pre.std), np.float32))
    d_y = to_device(np.full((batch, 3, size, size), np.nan, np.float32))
    try:
        gpu[1]["normalize_u8_nchw"].prepared_async_call(((hw + THREADS - 1) // THREADS, batch, 1),
                                                        (THREADS, 1, 1), None, int(d_x), int(d_y), int(d_ms),
                                                        hw, 3 * hw)
        driver().Context.synchronize()
        got = from_device(d_y, (batch, 3, size, size), np.float32)
        assert np.array_equal(got, normalize_u8(x, pre))  # NaN anywhere (unwritten) fails too
        assert np.array_equal(from_device(d_x, x.shape, np.uint8), x)  # the input is left as it was
    finally:
        for d in (d_x, d_ms, d_y):
            d.free()


@pytest.mark.parametrize("rows, cols, k", [(1, 1000, 5), (4, 1000, 1000), (3, 10, 3), (2, TOPK_N, 7)])
def test_softmax_topk_rows_matches_float64(gpu, rows, cols, k):
    z = (8 * rng_for("topk", rows, cols, k).standard_normal((rows, cols))).astype(np.float32)
    z[0, 3] = z[0, 9] = z[0].max() + 1  # a tie for first place: the lower index ranks first
    if rows > 1:
        z[1, :] = z[1, 0]  # a whole row of ties: indices in order
    d_z = to_device(z)
    d_p = to_device(np.full(rows * k, np.nan, np.float32))
    d_i = to_device(np.full(rows * k, -1, np.int32))
    try:
        gpu[1]["softmax_topk_rows"].prepared_async_call((rows, 1, 1), (TOPK_N, 1, 1), None, int(d_z), int(d_p),
                                                        int(d_i), cols, cols, k)
        driver().Context.synchronize()
        prob = from_device(d_p, (rows, k), np.float32)
        index = from_device(d_i, (rows, k), np.int32)
    finally:
        for d in (d_z, d_p, d_i):
            d.free()
    ref = pipeline.softmax(z)
    want = np.argsort(-ref, axis=1, kind="stable")[:, :k]
    assert np.array_equal(index, want)
    np.testing.assert_allclose(prob, np.take_along_axis(ref, want, axis=1), rtol=2e-6, atol=1e-12)
    assert index[0, 0] == 3 and index[0, 1] == 9


def small_images(folder, seed: str, names: list[str], shape: tuple[int, int] | None = None) -> list:
    """Random RGB pictures a little larger than the 75-pixel crop, of growing heights (or all of ``shape``), saved
    under these names."""
    from PIL import Image

    rng, paths = rng_for(seed), []
    for i, name in enumerate(names):
        Image.fromarray(rng.integers(0, 256, (*(shape or (80 + 6 * i, 92)), 3), dtype=np.uint8)).save(folder / name)
        paths.append(folder / name)
    return paths


class PageLockingDriver:
    """libcuda's host registration as the runner reaches it (ctypes): the driver's on a GPU, the emulator's on the
    CPU (its async copies refuse memory neither page-locked nor registered); counts the calls and their results."""

    def __init__(self, real):
        self.real, self.registered, self.unregistered = real, [], []

    def cuMemHostRegister_v2(self, ptr, nbytes, flags):
        status = (self.real.cuMemHostRegister_v2(ptr, nbytes, flags) if self.real is not None else
                  driver().host_register(ptr, nbytes))
        self.registered.append((nbytes, status))
        return status

    def cuMemHostUnregister(self, ptr):
        status = self.real.cuMemHostUnregister(ptr) if self.real is not None else driver().host_unregister(ptr)
        self.unregistered.append(status)
        return status


@pytest.mark.parametrize("graph", [False] if EMULATED else [False, True])
@pytest.mark.parametrize("ring, mode, gpu_resize", [
    ("page-locked", "torchvision", True), ("staged", "torchvision", True), ("page-locked", "pytorch-fid", True),
    ("staged", "pytorch-fid", True), ("page-locked", "clean-fid", True), ("page-locked", "pytorch-fid", False)])
def test_cuda_runner_streams_the_reference_predictions(graph, ring, mode, gpu_resize, tmp_path, monkeypatch):
    """An unreadable file, then 5 images in batches of 2 through a ring of 4 slots: the ring wraps, inside a batch
    too (the file's slot is skipped: slots 3 and 0 make the second batch), and the last batch is partial. fp32 on
    NCHW tensors (the emulator's forward stays quick); the top 3 must be the float64 reference's. The ring
    page-locked (the copies straight from its slots) or not (gathered into pinned staging first). The runner copies
    each batch's pool features back too (features=True): the reference's, by input index, none for the bad file.
    torchvision's preprocessing puts uint8 pixels in the ring, normalised on the GPU; an FID tool's the decoded
    pixels, resized on the GPU (Preprocess.gpu_resize), except the third image's, too many for its slot at this size
    (75: 22,500 pixels), which comes resized on the host; without gpu_resize (the server's runner) the network's
    input resized on the host."""
    from inception_engine.backends.cuda import device

    lib = PageLockingDriver(device._libcuda())
    monkeypatch.setattr(device, "_libcuda", lambda: lib if ring == "page-locked" else None)
    size = 75
    pre = Preprocess.from_manifest({"input": {"size": size, "resize": 86}}, mode=mode)
    weights = Weights(random_arrays(11), {"count_include_pad": True})
    paths = small_images(tmp_path, "runner", [f"{i}.png" for i in range(5)])
    big = small_images(tmp_path, "runner-big", ["big.png"], (170, 160))[0]
    paths[2] = big
    (tmp_path / "unreadable.png").write_bytes(b"not a picture")
    backend = CudaBackend(weights, build_plan(2, weights.layers(), input_size=size), graph=graph, nhwc=False)
    feats: dict[int, np.ndarray] = {}

    def keep(indices: list[int], rows: np.ndarray) -> None:
        feats.update(zip(indices, rows.copy()))
    try:
        runner = CudaRunner(backend, pre, features=True, gpu_resize=gpu_resize)
        preds = list(pipeline.classify([tmp_path / "unreadable.png", *paths], runner, 3,
                                       pipeline.PipelineOptions(workers=2, ring_batches=2), on_features=keep))
    finally:
        backend.close()
    if ring == "page-locked":
        ring_pre = runner.ring_pre  # an FID tool's: slots of decoded pixels for the GPU's resize
        assert ring_pre.gpu_resize == (gpu_resize and mode != "torchvision")
        assert lib.registered == [(4 * int(np.prod(ring_pre.decoded_shape)) * np.dtype(ring_pre.pixel_dtype).itemsize,
                                   0)]
        assert lib.unregistered == [0]
    host = NumpyBackend(weights, build_plan(len(paths), weights.layers(), input_size=size), dtype=np.float64)
    from inception_engine.ingest.images import load_image

    logits, ref_feats = host.forward(np.stack([load_image(p, pre) for p in paths]).astype(np.float64), features=True)
    ref = pipeline.softmax(logits)
    assert sorted(feats) == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(np.stack([feats[i] for i in range(1, 6)]), ref_feats, rtol=1e-4, atol=1e-5)
    assert preds[0].error and [p.image for p in preds[1:]] == [str(p) for p in paths]
    for p, row in zip(preds[1:], ref):
        want = np.argsort(-row, kind="stable")[:3]
        assert [i for i, _, _ in p.top] == list(want)
        np.testing.assert_allclose([q for _, _, q in p.top], row[want], rtol=1e-4)


def test_gpu_decode_stream_matches_the_cpu_stream(tmp_path, monkeypatch):
    """pipeline.classify_encoded through the cuda runner, with Pillow standing in for nvImageCodec (exact, so the
    predictions must be the CPU-decoded stream's): batches of 2 with JPEGs, a missing and a broken file in their
    places, a PNG (the CPU fallback) alone in the partial last batch; a second run with the decoder the backend kept
    gives the same."""
    from helpers.fake_codec import FakeCodec

    from inception_engine.ingest import jpeg_decode

    monkeypatch.setattr(jpeg_decode, "load_nvimgcodec", lambda: FakeCodec)
    monkeypatch.setattr(jpeg_decode, "NATIVE", False)  # through the stand-in, not jpeg_batch.c
    size = 75
    pre = Preprocess(size=size, resize=86)
    weights = Weights(random_arrays(13), {"count_include_pad": True})
    paths = small_images(tmp_path, "gpu decode stream", ["0.jpg", "1.jpg", "2.png"])
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8 not really")
    sources = [paths[0], tmp_path / "missing.jpg", paths[1], tmp_path / "bad.jpg", paths[2]]
    backend = CudaBackend(weights, build_plan(2, weights.layers(), input_size=size), graph=False, nhwc=False)
    try:
        options = pipeline.PipelineOptions(workers=2, ring_batches=2)
        gpu = list(pipeline.classify_encoded(sources, CudaRunner(backend, pre), 3))
        # nvImageCodec frees an image on the stream it was decoded on: a finished run leaves the backend's decoder
        # (kept for the next run) holding none, or the next run freed them on a destroyed stream and crashed
        assert backend.jpeg_decoders and backend.jpeg_decoders[0]._decoded == []
        again = list(pipeline.classify_encoded(sources, CudaRunner(backend, pre), 3))
        cpu = list(pipeline.classify(sources, CudaRunner(backend, pre), 3, options))
    finally:
        backend.close()
    assert [(p.top, p.error) for p in again] == [(p.top, p.error) for p in gpu]
    assert [p.image for p in gpu] == [str(s) for s in sources]
    assert [p.ok for p in gpu] == [p.ok for p in cpu] == [s.exists() and s.name != "bad.jpg" for s in sources]
    assert "no such file" in gpu[1].error and "bad.jpg" in gpu[3].error
    for g, c in zip(gpu, cpu):
        if g.ok:
            assert [i for i, _, _ in g.top] == [i for i, _, _ in c.top]
            np.testing.assert_allclose([q for _, _, q in g.top], [q for _, _, q in c.top], rtol=1e-6)

