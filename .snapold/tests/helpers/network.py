"""The whole network against the float64 NumPy reference: the model of the whole-network tests, its inputs, the
cached reference logits and the top-1 agreement criterion."""

from __future__ import annotations

import numpy as np

from inception_engine.backends.cuda.backend import CudaBackend
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.plan import build_plan


def network_model():
    """inception_engine.synthetic's calibrated stand-in (activations O(1), image-dependent logits) where that module
    exists, else He-initialised random weights."""
    try:
        from inception_engine.synthetic import synthetic_weights
    except ImportError:
        from helpers.random_weights import random_weights

        return random_weights(0)
    return synthetic_weights(0)


def make_input(batch: int, seed: int, size: int = 299) -> np.ndarray:
    try:
        from inception_engine.synthetic import image_like_batch
    except ImportError:
        return np.random.default_rng(seed).standard_normal((batch, 3, size, size)).astype(np.float32)
    return image_like_batch(batch, seed=seed, size=size).astype(np.float32)


_refs: dict[tuple[int, int, int], np.ndarray] = {}


def reference(weights, x: np.ndarray, seed: int) -> np.ndarray:
    key = (x.shape[0], x.shape[2], seed)
    if key not in _refs:
        plan = build_plan(x.shape[0], weights.layers(), input_size=x.shape[2])
        _refs[key] = NumpyBackend(weights, plan, dtype=np.float64).forward(x.astype(np.float64))
    return _refs[key]


def rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref))


def assert_top1_agrees_on_256_inputs(backend: CudaBackend, weights, plan, tol: float) -> None:
    """8 batches of 32 N(0, 1) inputs (plan at batch 32): the top class is float64's on >= 99% and the logits'
    rel L2 per batch <= tol."""
    agree, errs = 0, []
    for i in range(8):
        x = np.random.default_rng(1000 + i).standard_normal((32, 3, 299, 299)).astype(np.float32)
        got = backend.forward(x)
        ref = NumpyBackend(weights, plan, dtype=np.float64).forward(x.astype(np.float64))
        agree += int((got.argmax(1) == ref.argmax(1)).sum())
        errs.append(rel_l2(got, ref))
    assert agree >= 0.99 * 256, f"top-1 agrees on {agree}/256 (rel L2 per batch up to {max(errs):.1e})"
    assert max(errs) <= tol, f"rel L2 per batch up to {max(errs):.2e}"
