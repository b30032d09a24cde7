"""The whole network on the CUDA backend against the float64 NumPy reference, graph replay and eager launches.

Weights: inception_engine.synthetic's calibrated stand-in (activations O(1), image-dependent logits) where that
module exists, else He-initialised random weights. Inputs: image-like batches where available, else N(0, 1).
"""

from __future__ import annotations

import numpy as np
import pytest

from inception_engine import backends, cuda_build
from inception_engine.backends.cuda.backend import CudaBackend
from inception_engine.backends.cuda.cost_model import choose_configs
from inception_engine.backends.cuda.device import Gpu
from inception_engine.backends.cuda.tuning import config_to_json, tuning_candidates
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.errors import EngineError
from inception_engine.plan import build_plan, is_fused

from helpers.network import assert_top1_agrees_on_256_inputs, make_input, reference, rel_l2
from helpers.tf32_reference import tf32_forward

pytestmark = pytest.mark.gpu

TOL = 1e-4  # rel L2 of the logits, fp32 through 94 layers against float64
TF32_TOL = 3e-3  # the same with TF32 products in every conv (10 mantissa bits, fp32 sums)


def assert_same_top5(got: np.ndarray, ref: np.ndarray) -> None:
    """Same five classes in the same order; a swap is tolerated only between classes the float64 reference
    itself puts within fp32 noise of each other."""
    for i, (g, r) in enumerate(zip(got, ref)):
        gi, ri = np.argsort(-g)[:5], np.argsort(-r)[:5]
        noise = 1e-4 * np.abs(r).max()
        for k in range(5):
            assert gi[k] == ri[k] or abs(r[gi[k]] - r[ri[k]]) <= noise, (
                f"image {i}: top-5 {gi.tolist()} vs reference {ri.tolist()}")


@pytest.mark.parametrize("nhwc", [False, None])
@pytest.mark.parametrize("batch", [1, 8])
def test_graph_and_eager_match_the_reference_and_each_other(weights, batch, nhwc):
    """Concurrent graph (branches on several streams), serial graph, serial eager, concurrent eager: every kernel
    is deterministic, so all four must agree bit for bit; a missing fork/join or shared memory between branches
    that run at once would show as a difference (or a NaN from the poisoned arena). fp32 on NCHW tensors and in the
    default layout (NHWC with 3xFP16 on sm_90a)."""
    x = make_input(batch, seed=batch)
    ref = reference(weights, x, batch)
    plan = build_plan(batch, weights.layers())
    outs = {}
    for graph, concurrent in ((True, True), (True, False), (False, False), (False, True)):
        with CudaBackend(weights, plan, graph=graph, concurrent=concurrent, nhwc=nhwc) as backend:
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


@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize("batch", [1, 8])
def test_tf32_graph_and_eager_match_the_reference(weights, batch, nhwc):
    """precision="tf32", NCHW (conv_tf32.cu) and NHWC (conv_nhwc_*.cu's tf32 tiles) tensors: the concurrent graph and
    serial eager launches agree bit for bit (same kernels, same split-K, deterministic reductions). On N(0, 1) input
    they are within the issue's TF32 bound of float64 with the same top class; on image-like input, where the synthetic
    model amplifies any rounding (tests/helpers/tf32_reference.py), they are within 2x of what ideal TF32 arithmetic
    gives on the same input."""
    plan = build_plan(batch, weights.layers())
    x_normal = np.random.default_rng(batch).standard_normal((batch, 3, 299, 299)).astype(np.float32)
    x_image = make_input(batch, seed=batch)
    ref_normal = NumpyBackend(weights, plan, dtype=np.float64).forward(x_normal.astype(np.float64))
    ref_image = reference(weights, x_image, batch)
    ideal_err = rel_l2(tf32_forward(weights, x_image), ref_image)
    outs = []
    for graph in (True, False):
        with CudaBackend(weights, plan, graph=graph, precision="tf32", nhwc=nhwc) as backend:
            assert backend.precision == "tf32" and backend.nhwc == nhwc
            convs = ("conv_nhwc_tf32_", "conv_input_mma_nhwc_tf32", "conv_tf32_1x1_") if nhwc else ("conv_tf32_",)
            assert all(s.kernel.startswith(convs) for s in backend.specs
                       if s.kernel.startswith("conv_") and s.kernel != "conv_splitk_reduce")
            got_normal = backend.forward(x_normal)
            got_image = backend.forward(x_image)
        assert np.isfinite(got_normal).all() and np.isfinite(got_image).all()
        err = rel_l2(got_normal, ref_normal)
        assert err <= TF32_TOL, f"graph={graph}: N(0,1) input: rel L2 {err:.2e}"
        np.testing.assert_array_equal(got_normal.argmax(1), ref_normal.argmax(1), err_msg=f"graph={graph}")
        err = rel_l2(got_image, ref_image)
        assert err <= 2 * ideal_err, f"graph={graph}: image-like: rel L2 {err:.2e}, ideal TF32 {ideal_err:.2e}"
        outs.append((got_normal, got_image))
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_tf32_top1_agrees_with_float64_on_256_inputs(weights):
    """The issue's criterion, on 256 synthetic N(0, 1) inputs in batches of 32: the tf32 NCHW forward's top class is
    float64's on >= 99% and every batch is within the TF32 bound. (On image-like inputs no single-rounding TF32
    forward reaches it on this model: see tests/helpers/tf32_reference.py and dev/performance-log.md.)"""
    plan = build_plan(32, weights.layers())
    with CudaBackend(weights, plan, precision="tf32", nhwc=False) as backend:
        assert_top1_agrees_on_256_inputs(backend, weights, plan, TF32_TOL)


@pytest.mark.parametrize("precision,nhwc,fuse", [("fp32", False, None), ("fp16", False, None), ("fp16", True, None),
                                               ("tf32", True, False), ("fp32", None, None)])
def test_tuned_backend_matches_the_reference_and_is_cached(weights, precision, nhwc, fuse, tmp_path, monkeypatch):
    """tune=True: every candidate set runs once (each conv of the plan the backend runs, fused or not, timed), the
    chosen configs come from those sets, the forward still matches float64 (fp16 and tf32: within twice the ideal
    fp16-operand network's error, as test_cuda_fp16.py), and a second backend reads the same configs from the cache
    without timing."""
    monkeypatch.setattr("inception_engine.backends.cuda.backend.tuning_cache_dir", lambda: tmp_path)
    x = make_input(2, seed=5)
    ref = reference(weights, x, 2)
    plan = build_plan(2, weights.layers())
    with CudaBackend(weights, plan, precision=precision, tune=True, nhwc=nhwc, fuse=fuse) as backend:
        got = backend.forward(x)
        tuned = backend.configs
        assert is_fused(backend.plan) == (backend.nhwc and fuse is not False)
    assert len(list(tmp_path.glob("*.json"))) == 1
    gpu = Gpu()
    gpu.release()
    sets = tuning_candidates(backend.plan, gpu.num_sms, False, precision, True, backend.nhwc,
                                cuda_build.has_wgmma(gpu.arch))
    as_json = config_to_json
    assert all(any(as_json(tuned[op.name]) == as_json(s[op.name]) for s in sets) for op in backend.plan.conv_ops)
    if precision == "fp32":
        assert rel_l2(got, ref) <= TOL
    else:  # image-like inputs: the bound of test_cuda_fp16.py's, twice the error of ideal fp16 operands
        from helpers.fp16_reference import fp16_forward

        assert rel_l2(got, ref) <= 2 * rel_l2(fp16_forward(weights, x), ref)
    monkeypatch.setattr(CudaBackend, "time_layers", lambda *a, **k: pytest.fail("tuned again"))
    with CudaBackend(weights, plan, precision=precision, tune=True, nhwc=nhwc, fuse=fuse) as again:
        assert again.configs == tuned


def test_conv_variants_in_use_are_covered():
    """On this GPU the network at batch 1 and 8 uses split-K somewhere and more than one tile, so the two
    full-network tests above exercise more than one kernel variant."""
    gpu = Gpu()
    gpu.release()
    used = set()
    for batch in (1, 8):
        configs = choose_configs(build_plan(batch), gpu.num_sms)
        used |= {(c.tile.name, c.splits > 1) for c in configs.values() if c is not None}
    assert any(split for _, split in used) and len({t for t, _ in used}) >= 2, used


def test_errors_are_one_line(weights):
    plan = build_plan(1, weights.layers())
    backend = CudaBackend(weights, plan, graph=False)
    with pytest.raises(ValueError, match="does not match"):
        backend.forward(np.zeros((2, 3, 299, 299), np.float32))
    backend.close()
    backend.close()  # idempotent
    with pytest.raises(EngineError, match="closed"):
        backend.forward(np.zeros((1, 3, 299, 299), np.float32))


def test_registry_and_kernel_cache():
    assert backends.backend_class("cuda") is CudaBackend
    assert backends.resolve("auto") == "cuda"
    gpu = Gpu()
    assert cuda_build.is_cached(gpu.arch)  # built by the tests above (or an earlier process)
    gpu.release()
