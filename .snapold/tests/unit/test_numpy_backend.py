"""The whole network on the NumPy backend.

The float64 backend is checked against a deliberately plain executor written here: it walks ``arch.inception_v3()``
layer by layer with a dict of tensors, pads with np.pad, convolves with einsum over sliding windows and concatenates
with np.concatenate. It shares no code with the backend or the plan (no arena, no views, no im2col), so it checks
the plan's wiring and the backend's bookkeeping as well as the arithmetic.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from inception_engine import arch
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.plan import build_plan
from inception_engine.synthetic import image_like_batch, synthetic_arrays
from inception_engine.weights import Weights


def synthetic(count_include_pad: bool = True) -> Weights:
    """The synthetic model (calibrated so activations stay O(1) and depend on the image), either pool flavour."""
    return Weights(synthetic_arrays(0), {"count_include_pad": count_include_pad})


def plain_forward(weights: Weights, x: np.ndarray) -> np.ndarray:
    """Float64 forward over the layer list; see the module docstring."""
    t = {arch.INPUT: x.astype(np.float64)}
    p = {k: v.astype(np.float64) for k, v in weights.arrays.items()}
    sw = np.lib.stride_tricks.sliding_window_view
    for l in weights.layers():
        if isinstance(l, arch.Conv):
            (ph, pw), s = l.pad, l.stride
            xp = np.pad(t[l.src], ((0, 0), (0, 0), (ph, ph), (pw, pw)))
            win = sw(xp, l.kernel, axis=(2, 3))[:, :, ::s, ::s]
            y = np.einsum("nchwij,ocij->nohw", win, p[l.name + ".weight"], optimize=True)
            t[l.name] = np.maximum(y + p[l.name + ".bias"][None, :, None, None], 0)
        elif isinstance(l, arch.Pool):
            k, s, pd = l.kernel, l.stride, l.pad
            fill = -np.inf if l.kind == "max" else 0.0
            xp = np.pad(t[l.src], ((0, 0), (0, 0), (pd, pd), (pd, pd)), constant_values=fill)
            win = sw(xp, (k, k), axis=(2, 3))[:, :, ::s, ::s]
            if l.kind == "max":
                t[l.name] = win.max(axis=(4, 5))
            else:
                h, w = t[l.src].shape[2:]
                ones = sw(np.pad(np.ones((h, w)), pd), (k, k))[::s, ::s]
                count = k * k if l.count_include_pad else ones.sum(axis=(2, 3))
                t[l.name] = win.sum(axis=(4, 5)) / count
        elif isinstance(l, arch.Concat):
            t[l.name] = np.concatenate([t[s] for s in l.srcs], axis=1)
        elif isinstance(l, arch.GlobalAvgPool):
            t[l.name] = t[l.src].mean(axis=(2, 3))
        elif isinstance(l, arch.FC):
            t[l.name] = t[l.src] @ p[l.name + ".weight"].T + p[l.name + ".bias"]
    return t["fc"]


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def images(batch: int, seed: int) -> np.ndarray:
    return image_like_batch(batch, seed=seed)


@pytest.fixture(scope="module")
def weights() -> Weights:
    return synthetic()


@functools.cache
def plain_reference(count_include_pad: bool) -> tuple[np.ndarray, np.ndarray]:
    x = images(2, seed=2)
    return x, plain_forward(synthetic(count_include_pad), x)


@pytest.mark.parametrize("fast,threads", [(False, 1), (True, 1), (True, 3)], ids=["reference", "fast", "fast-3threads"])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_float64_matches_plain_executor(count_include_pad, fast, threads):
    """In float64 the fast path (Winograd, fused 1x1 groups, pools moved behind convs) must agree to rounding, and
    so must every layer split over threads (by rows or by output channels; 3: uneven parts)."""
    w = synthetic(count_include_pad)
    x, ref = plain_reference(count_include_pad)
    assert 1 < np.abs(ref).max() < 1e3 and ref.std() > 0.1, "weights should keep logits O(1)"
    backend = NumpyBackend(w, build_plan(2, w.layers()), dtype=np.float64, fast=fast, threads=threads)
    backend.arena[...] = np.nan  # an op reading anything its producer did not write turns the logits NaN
    got = backend.forward(x)
    assert got.shape == (2, 1000) and got.dtype == np.float64
    assert rel_l2(got, ref) < 1e-12


def test_count_include_pad_changes_the_logits(weights):
    """The flag has to reach the pools: the two variants of the same weights must differ."""
    x = images(1, seed=3)
    other = Weights(weights.arrays, {"count_include_pad": False})
    a = NumpyBackend(weights, build_plan(1, weights.layers())).forward(x)
    b = NumpyBackend(other, build_plan(1, other.layers())).forward(x)
    assert rel_l2(a, b) > 1e-3


@pytest.mark.parametrize("batch,count_include_pad", [(1, True), (3, True), (1, False)])
@pytest.mark.parametrize("native", [False, None], ids=["numpy-code", "default"])
def test_float32_close_to_float64(batch, count_include_pad, native):
    """The CPU path both ways: the C kernels (the default where they build) and the NumPy code they fall back to."""
    weights = synthetic(count_include_pad)
    x = images(batch, seed=4 + batch)
    plan = build_plan(batch, weights.layers())
    ref = NumpyBackend(weights, plan, dtype=np.float64).forward(x)
    fast = NumpyBackend(weights, plan, native=native)
    fast.arena[...] = np.nan
    got = fast.forward(x)
    assert got.dtype == np.float32
    err = rel_l2(got, ref)
    assert err <= 1e-4, f"float32 vs float64 relative L2 error of the logits {err:.2e}"


@pytest.mark.parametrize("threads", [2, 3])
def test_batch_rows_are_the_single_image_results(weights, threads):
    """Work is split across threads by images, rows or channels depending on the batch; the split must not change
    the result (float64, where only rounding can differ)."""
    x = images(3, seed=8)
    batched = NumpyBackend(weights, build_plan(3, weights.layers()), np.float64, fast=True, threads=threads)
    single = NumpyBackend(weights, build_plan(1, weights.layers()), np.float64, fast=True, threads=threads)
    got = batched.forward(x)
    for i in range(3):
        assert rel_l2(got[i], single.forward(x[i:i + 1])[0]) < 1e-12


def test_repeated_forwards_see_only_their_own_input(weights):
    backend = NumpyBackend(weights, build_plan(1, weights.layers()))
    a, b = images(1, seed=9), images(1, seed=10)
    ya = backend.forward(a)
    yb = backend.forward(b)
    assert rel_l2(ya, yb) > 1e-3
    np.testing.assert_array_equal(backend.forward(a), ya)
    ya[...] = 0  # the returned logits are the caller's copy, not the arena
    assert np.abs(backend.forward(b) - yb).max() == 0


def test_rejects_wrong_input_shape(weights):
    backend = NumpyBackend(weights, build_plan(2, weights.layers()))
    with pytest.raises(ValueError, match=r"\(2, 3, 299, 299\)"):
        backend.forward(images(1, seed=0))


def test_time_forward_returns_one_time_per_iteration(weights):
    backend = NumpyBackend(weights, build_plan(1, weights.layers()))
    times = backend.time_forward(images(1, seed=0), iters=2, warmup=1)
    assert len(times) == 2 and all(t > 0 for t in times)
    backend.close()
