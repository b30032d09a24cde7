"""The whole network on the CUDA backend against the float64 NumPy reference, graph replay and eager launches.

Weights: inception_engine.synthetic's calibrated stand-in (activations O(1), image-dependent logits) where that
module exists, else He-initialised random weights. Inputs: image-like batches where available, else N(0, 1).
"""

from __future__ import annotations

import numpy as np
import pytest

from inception_engine import backends, cuda_build
from inception_engine.backends import cuda_backend as cb
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.errors import EngineError
from inception_engine.plan import build_plan

pytestmark = pytest.mark.gpu

TOL = 1e-4  # rel L2 of the logits, fp32 through 94 layers against float64


@pytest.fixture(scope="module")
def weights():
    try:
        from inception_engine.synthetic import synthetic_weights
    except ImportError:
        from random_weights import random_weights

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


def assert_same_top5(got: np.ndarray, ref: np.ndarray) -> None:
    """Same five classes in the same order; a swap is tolerated only between classes the float64 reference
    itself puts within fp32 noise of each other."""
    for i, (g, r) in enumerate(zip(got, ref)):
        gi, ri = np.argsort(-g)[:5], np.argsort(-r)[:5]
        noise = 1e-4 * np.abs(r).max()
        for k in range(5):
            assert gi[k] == ri[k] or abs(r[gi[k]] - r[ri[k]]) <= noise, (
                f"image {i}: top-5 {gi.tolist()} vs reference {ri.tolist()}")


@pytest.mark.parametrize("batch", [1, 8])
def test_graph_and_eager_match_the_reference_and_each_other(weights, batch):
    """Concurrent graph (branches on several streams), serial graph, serial eager, concurrent eager: every kernel
    is deterministic, so all four must agree bit for bit; a missing fork/join or shared memory between branches
    that run at once would show as a difference (or a NaN from the poisoned arena)."""
    x = make_input(batch, seed=batch)
    ref = reference(weights, x, batch)
    plan = build_plan(batch, weights.layers())
    outs = {}
    for graph, concurrent in ((True, True), (True, False), (False, False), (False, True)):
        with cb.CudaBackend(weights, plan, graph=graph, concurrent=concurrent) as backend:
            assert backend.concurrent == concurrent and backend.plan.concurrent >= concurrent
            got = backend.forward(x)
            again = backend.forward(x)
        assert got.shape == (batch, 1000) and got.dtype == np.float32
        assert np.isfinite(got).all()
        assert rel_l2(got, ref) <= TOL, f"graph={graph} concurrent={concurrent}: rel L2 {rel_l2(got, ref):.2e}"
        assert_same_top5(got, ref)
        np.testing.assert_array_equal(again, got)
        outs[graph, concurrent] = got
    for key, got in outs.items():
        np.testing.assert_array_equal(got, outs[False, False], err_msg=f"graph, concurrent = {key} vs serial eager")


def test_conv_variants_in_use_are_covered():
    """On this GPU the network at batch 1 and 8 uses split-K somewhere and more than one tile, so the two
    full-network tests above exercise more than one kernel variant."""
    gpu = cb.Gpu()
    gpu.release()
    used = set()
    for batch in (1, 8):
        configs = cb.choose_configs(build_plan(batch), gpu.num_sms)
        used |= {(c.tile.name, c.splits > 1) for c in configs.values() if c is not None}
    assert any(split for _, split in used) and len({t for t, _ in used}) >= 2, used


def test_errors_are_one_line(weights):
    plan = build_plan(1, weights.layers())
    backend = cb.CudaBackend(weights, plan, graph=False)
    with pytest.raises(ValueError, match="does not match"):
        backend.forward(np.zeros((2, 3, 299, 299), np.float32))
    backend.close()
    backend.close()  # idempotent
    with pytest.raises(EngineError, match="closed"):
        backend.forward(np.zeros((1, 3, 299, 299), np.float32))


def test_registry_and_kernel_cache():
    assert backends.backend_class("cuda") is cb.CudaBackend
    assert backends.resolve("auto") == "cuda"
    gpu = cb.Gpu()
    assert cuda_build.is_cached(gpu.arch)  # built by the tests above (or an earlier process)
    gpu.release()
