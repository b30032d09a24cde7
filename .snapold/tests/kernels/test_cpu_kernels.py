"""The C kernels of the float32 CPU path (cpu_src/, backends/cpu_kernels.py) against float64 NumPy, and the fallback
to the NumPy code where they cannot be built.

Shapes are chosen to hit the edges of the blocking in cpu_src/conv.c and winograd.c: M not a multiple of MR (8), N
not a multiple of the 32-pixel panels (and under 16), K over one block of 384 and not a multiple of it, vectors that
wrap over several output rows (narrow maps), padding, stride 2 (gathers), Winograd tiles past the map's edge.
Inputs and outputs are channel slices of larger buffers (offset views with image strides); outputs are poisoned
with NaN so that unwritten elements fail, and the channels around them must stay NaN.
"""

from __future__ import annotations

import os
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from inception_engine import native_build
from inception_engine.backends import cpu_kernels
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.errors import BackendUnavailable
from inception_engine.plan import build_plan
from inception_engine.synthetic import image_like_batch, synthetic_weights

needs_kernels = pytest.mark.skipif(cpu_kernels.library() is None,
                                   reason=f"C kernels unavailable: {cpu_kernels.unavailable_reason()}")


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def windows(x: np.ndarray, kh: int, kw: int, stride: int, pad: tuple[int, int], fill: float) -> np.ndarray:
    """(N, C, Ho, Wo, kh, kw) windows of x padded with ``fill``."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])), constant_values=fill)
    return np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]


def slice_of(rng: np.random.Generator, shape: tuple[int, ...], before: int, after: int, fill: float | None):
    """A channel slice of a larger (N, before + C + after, H, W) float32 buffer: (buffer, view)."""
    n, c, h, w = shape
    buf = (rng.standard_normal((n, before + c + after, h, w)) if fill is None
           else np.full((n, before + c + after, h, w), fill)).astype(np.float32)
    return buf, buf[:, before:before + c]


def rng_for(*key: object) -> np.random.Generator:
    """A generator seeded by the case: the same inputs in every run (hash() of a str changes per process)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def assert_only_view_written(buf: np.ndarray, before: int, channels: int) -> None:
    """The NaN-poisoned channels around the output view of slice_of(..., before, ...) are still NaN."""
    outside = np.isnan(buf[:, :before]).all() and np.isnan(buf[:, before + channels:]).all()
    assert outside, "wrote outside the output view"


def each_case(cases: list[tuple], flag: str, flag_values: list[bool]):
    """needs_kernels, and a test per case (ids: its index), thread count (1, 3) and value of the flag argument."""
    def mark(test):
        test = pytest.mark.parametrize(flag, flag_values)(test)
        test = pytest.mark.parametrize("case", cases, ids=[str(i) for i in range(len(cases))])(test)
        return needs_kernels(pytest.mark.parametrize("threads", [1, 3])(test))
    return mark


CONV_CASES = [  # n, c, h, w, o, kh, kw, stride, pad
    (1, 3, 19, 23, 5, 3, 3, 2, (0, 0)),  # the stem's first layer, in small: 3 channels, stride 2
    (2, 37, 9, 10, 29, 3, 3, 1, (1, 1)),
    (1, 45, 17, 17, 50, 1, 7, 1, (0, 3)),
    (1, 20, 8, 8, 13, 7, 1, 1, (3, 0)),
    (3, 5, 5, 6, 7, 5, 5, 1, (2, 2)),  # 30 outputs: one partial panel, vectors over several rows
    (1, 700, 4, 3, 30, 1, 1, 1, (0, 0)),  # 12 pixels, K = 700: two K blocks
    (1, 130, 6, 7, 41, 3, 3, 1, (1, 1)),  # K = 1170: four K blocks of 293 (not a multiple of 8 or 16)
    (1, 40, 12, 13, 100, 3, 3, 2, (1, 1)),
    (2, 9, 3, 2, 11, 3, 3, 1, (1, 1)),  # 2-pixel rows: a vector spans 8 output rows, padding masks its edges
    (1, 6, 9, 5, 10, 3, 3, 1, (0, 0)),  # 3 outputs from 5 inputs a row: more runs than masked loads -> gather
    (1, 200, 8, 8, 200, 3, 3, 1, (1, 1)),  # 2 panels, 25 A panels: M is split into chunks across threads
    (1, 8, 33, 35, 16, 1, 1, 1, (0, 0)),  # 1x1: the image is the B matrix
    (1, 4, 14, 15, 9, 3, 3, 3, (1, 1)),  # stride 3: gathers
]


@each_case(CONV_CASES, "relu", [True, False])
def test_conv_matches_float64(case, threads, relu):
    n, c, h, w, o, kh, kw, stride, pad = case
    rng = rng_for(case, threads, relu)
    _, x = slice_of(rng, (n, c, h, w), 2, 1, None)
    wt = (rng.standard_normal((o, c, kh, kw)) / np.sqrt(c * kh * kw)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    ref = np.einsum("nchwij,ocij->nohw", windows(x.astype(np.float64), kh, kw, stride, pad, 0.0), wt.astype(np.float64))
    ref += b[:, None, None]
    if relu:
        ref = np.maximum(ref, 0)
    ybuf, y = slice_of(rng, (n, o, *ref.shape[2:]), 3, 2, np.nan)
    cpu_kernels.prepare_conv(x, y, wt, b, stride, pad, relu, threads)()
    assert not np.isnan(y).any(), "an output element was not written"
    assert_only_view_written(ybuf, 3, o)
    assert rel_l2(y, ref) < 2e-6


WINOGRAD_CASES = [  # n, c, h, w, o, kh, kw, pad: stride 1, F(2, r) along each axis r > 1 (cpu_src/winograd.c)
    (1, 5, 7, 9, 11, 3, 3, (1, 1)),  # odd output sizes: the last tiles' second row and column are outside the map
    (2, 37, 9, 10, 29, 3, 3, (1, 1)),  # C over one block of 32 gathered channels, not a multiple; O not one of 8
    (1, 6, 13, 12, 70, 3, 3, (0, 0)),  # unpadded; O = 70: two groups of output channels, the second partial
    (1, 400, 6, 7, 17, 3, 3, (1, 1)),  # C = 400: three K blocks in each position's GEMM
    (1, 24, 19, 21, 9, 3, 3, (1, 1)),  # 110 tiles: three full panels and a 14-tile one (one vector)
    (1, 3, 2, 2, 4, 3, 3, (1, 1)),  # a single tile
    (1, 160, 8, 8, 200, 3, 3, (1, 1)),  # 16 tiles, 25 A panels: M is split into chunks across threads
    (1, 45, 17, 17, 50, 1, 7, (0, 3)),  # F(2, 7) along W: 1 x 8 input tiles
    (2, 20, 9, 8, 13, 7, 1, (3, 0)),  # F(2, 7) along H: tiles of 2 rows, one pixel wide
    (3, 5, 5, 6, 7, 5, 5, (2, 2)),  # F(2x2, 5x5): 36 positions
    (1, 70, 8, 8, 40, 1, 3, (0, 1)),  # 1-D F(2, 3), the 8x8 layers' 1x3 and 3x1
    (1, 70, 8, 8, 40, 3, 1, (1, 0)),
    (1, 6, 9, 3, 10, 7, 1, (3, 0)),  # 3-pixel rows: more runs of tiles a vector than masked stores -> scatter
    (1, 9, 12, 9, 10, 5, 3, (2, 1)),  # shapes the network lacks run the transforms' generic code: 6 x 4 tiles
]


def test_which_convs_run_winograd():
    """Stride 1, wider than 1x1, odd up to 5 along each axis or 7 along one; 7x7 (F(2, 7) both ways) is less
    accurate than the tests' 2e-6 and runs direct."""
    assert all(cpu_kernels.uses_winograd(k, 1) for k in ((3, 3), (5, 5), (1, 7), (7, 1), (1, 3), (3, 1), (5, 3)))
    assert not any(cpu_kernels.uses_winograd(k, 1) for k in ((1, 1), (7, 7), (7, 3), (2, 2), (3, 9)))
    assert not cpu_kernels.uses_winograd((3, 3), 2)


@each_case(WINOGRAD_CASES, "relu", [True, False])
def test_winograd_conv_matches_float64(case, threads, relu):
    """The Winograd path against float64 and against the direct path of the same kernels."""
    n, c, h, w, o, kh, kw, pad = case
    rng = rng_for("winograd", case, threads, relu)
    _, x = slice_of(rng, (n, c, h, w), 1, 2, None)
    wt = (rng.standard_normal((o, c, kh, kw)) / np.sqrt(c * kh * kw)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    ref = np.einsum("nchwij,ocij->nohw", windows(x.astype(np.float64), kh, kw, 1, pad, 0.0), wt.astype(np.float64))
    ref += b[:, None, None]
    if relu:
        ref = np.maximum(ref, 0)
    assert cpu_kernels.uses_winograd((kh, kw), 1)
    ybuf, y = slice_of(rng, (n, o, *ref.shape[2:]), 2, 3, np.nan)
    cpu_kernels.prepare_conv(x, y, wt, b, 1, pad, relu, threads)()
    assert not np.isnan(y).any(), "an output element was not written"
    assert_only_view_written(ybuf, 2, o)
    assert rel_l2(y, ref) < 2e-6
    direct = np.full_like(y, np.nan)
    cpu_kernels.prepare_conv(x, direct, wt, b, 1, pad, relu, threads, winograd=False)()
    assert rel_l2(y, direct) < 2e-6


POOL_CASES = [  # n, c, h, w, kind, kernel, stride, pad, count_include_pad
    (1, 5, 15, 17, "max", 3, 2, 0, True),  # the network's max pools, in small
    (2, 7, 9, 8, "avg", 3, 1, 1, True),  # its average pools, both divisors
    (2, 7, 9, 8, "avg", 3, 1, 1, False),
    (1, 3, 10, 11, "max", 3, 1, 1, True),
    (1, 4, 11, 9, "avg", 3, 2, 1, False),
    (1, 19, 8, 8, "avg", 5, 1, 2, False),
    (1, 2, 40, 37, "max", 3, 2, 1, True),  # rows over 32 pixels: several vectors a row at stride 2
    (1, 3, 20, 35, "avg", 4, 3, 1, False),  # stride 3: gathers
]


@each_case(POOL_CASES, "bias_relu", [False, True])
def test_pool_matches_float64(case, threads, bias_relu):
    """And + bias + ReLU, as when an average pool runs behind the 1x1 conv it feeds."""
    n, c, h, w, kind, k, stride, pad, count_include_pad = case
    rng = rng_for(case, threads, bias_relu)
    _, x = slice_of(rng, (n, c, h, w), 1, 2, None)
    x64 = x.astype(np.float64)
    if kind == "max":
        ref = windows(x64, k, k, stride, (pad, pad), -np.inf).max(axis=(4, 5))
    else:
        ref = windows(x64, k, k, stride, (pad, pad), 0.0).sum(axis=(4, 5))
        inside = windows(np.ones((1, 1, h, w)), k, k, stride, (pad, pad), 0.0).sum(axis=(4, 5))
        ref /= k * k if count_include_pad else inside
    bias = rng.standard_normal(c).astype(np.float32) if bias_relu else None
    if bias_relu:
        ref = np.maximum(ref + bias[:, None, None], 0)
    ybuf, y = slice_of(rng, (n, c, *ref.shape[2:]), 2, 1, np.nan)
    cpu_kernels.prepare_pool(x, y, kind, k, stride, pad, count_include_pad, threads, bias, bias_relu)()
    assert_only_view_written(ybuf, 2, c)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)


@needs_kernels
def test_views_must_have_contiguous_images():
    x = np.zeros((1, 4, 6, 6), np.float32)
    w = np.zeros((2, 4, 1, 1), np.float32)
    with pytest.raises(ValueError, match="each image contiguous"):
        cpu_kernels.prepare_conv(x[:, :, :, ::2], np.zeros((1, 2, 6, 3), np.float32), w, np.zeros(2), 1, (0, 0),
                                 True, 1)


@needs_kernels
def test_library_is_cached_by_source_and_compiler():
    path = cpu_kernels.build()
    assert path.parent == native_build.c_cache_dir() and path.name.startswith("ie_cpu-")
    mtime = path.stat().st_mtime_ns
    assert cpu_kernels.build() == path and path.stat().st_mtime_ns == mtime, "a cached library was rebuilt"


@needs_kernels
def test_pool_threads_survive_fork():
    """A child forked after the thread pool started has none of its workers; it must start its own, not wait on
    the parent's forever."""
    x = np.ones((1, 64, 16, 16), np.float32)
    y = np.empty((1, 32, 16, 16), np.float32)
    conv = cpu_kernels.prepare_conv(x, y, np.ones((32, 64, 3, 3), np.float32), np.zeros(32), 1, (1, 1), True, 2)
    conv()
    pid = os.fork()
    if pid == 0:
        y[...] = 0
        conv()
        os._exit(0 if y[0, 0, 8, 8] == 576 else 1)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung in the thread pool")
    assert os.waitstatus_to_exitcode(done[1]) == 0


@needs_kernels
def test_backends_on_two_python_threads_at_once():
    """Kernel calls from two Python threads share one thread pool, one job at a time; each backend still gets its
    own results (threads 2 and 3: the pool grows, and a job may use fewer workers than it has)."""
    weights = synthetic_weights(0)
    plan = build_plan(1, weights.layers())
    x = [image_like_batch(1, seed=s) for s in (12, 13)]
    backends = [NumpyBackend(weights, plan, threads=t) for t in (2, 3)]
    alone = [b.forward(xi) for b, xi in zip(backends, x)]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda i: [backends[i].forward(x[i]) for _ in range(3)], range(2)))
    for i in range(2):
        for got in together[i]:
            np.testing.assert_array_equal(got, alone[i])


def test_float64_cannot_run_on_the_kernels():
    weights = synthetic_weights(0)
    with pytest.raises(BackendUnavailable, match="float32"):
        NumpyBackend(weights, build_plan(1, weights.layers()), dtype=np.float64, native=True)


@pytest.fixture
def no_compiler(monkeypatch, tmp_path):
    """The C compiler is a command that does not exist, and nothing is cached: library() must give up."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cpu_kernels.load.cache_clear()
    yield
    cpu_kernels.load.cache_clear()


def test_without_a_compiler_the_backend_runs_numpy_code(no_compiler):
    assert cpu_kernels.library() is None
    assert "no-such-cc" in cpu_kernels.unavailable_reason()
    weights = synthetic_weights(0)
    plan = build_plan(1, weights.layers())
    x = image_like_batch(1, seed=11)
    backend = NumpyBackend(weights, plan)
    assert not backend.native
    ref = NumpyBackend(weights, plan, dtype=np.float64).forward(x)
    assert rel_l2(backend.forward(x), ref) <= 1e-4
    with pytest.raises(BackendUnavailable, match="no-such-cc"):
        NumpyBackend(weights, plan, native=True)


def test_a_failing_compiler_is_a_reason_not_a_crash(monkeypatch, tmp_path, no_compiler):
    cc = tmp_path / "broken-cc"
    cc.write_text("#!/bin/sh\necho 'error: this compiler is broken' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    assert cpu_kernels.library() is None
    assert "could not compile" in cpu_kernels.unavailable_reason()
    assert not list((tmp_path / "cache").rglob("*.so")), "a failed build left a library behind"
