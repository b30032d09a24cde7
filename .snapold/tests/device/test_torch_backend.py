"""The torch backend against the float64 NumPy reference: on the CPU here, on the GPU (eager, CUDA graph, tf32, fp16)
where one is. PyTorch is optional; without it only the 'not installed' path is tested."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from inception_engine import backends
from inception_engine.errors import BackendUnavailable, EngineError
from inception_engine.plan import build_plan

from helpers.backends import SMALL_INPUT, network_weights, reference, rel_l2, small_network, small_weights, top5

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed")


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_without_torch_the_backend_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(BackendUnavailable, match="PyTorch is not installed"):
        backends.backend_class("torch")


def real_network(batch: int, seed: int):
    """Real network at ``batch``: weights, plan, input and the float64 reference logits."""
    weights = network_weights(0)
    plan = build_plan(batch, weights.layers())
    x = np.random.default_rng(seed).standard_normal(plan.input.dims).astype(np.float32)
    return weights, plan, x, reference(weights, plan, x)


@pytest.fixture(scope="module")
def net():
    return real_network(1, seed=1)


@needs_torch
def test_full_network_cpu_matches_reference(net):
    from inception_engine.backends.torch_backend import TorchBackend

    weights, plan, x, ref = net
    backend = TorchBackend(weights, plan, device="cpu")
    try:
        got = backend.forward(x)
        assert got.shape == (1, 1000) and got.dtype == np.float32
        assert rel_l2(got, ref) <= 1e-4
        assert (top5(got) == top5(ref)).all()
        times = backend.time_forward(x, iters=1, warmup=0)
        assert len(times) == 1 and times[0] > 0
        assert backend.peak_memory_bytes() >= sum(a.nbytes for a in weights.arrays.values())
    finally:
        backend.close()


@needs_torch
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_small_network_every_op_and_view_kind(count_include_pad):
    """Concat slices written and read back, padded avg pools counting padding or not, 1x7 / 7x1, batch 3."""
    from inception_engine.backends.torch_backend import TorchBackend

    weights = small_weights(count_include_pad, seed=2)
    plan = build_plan(3, small_network(count_include_pad), input_size=SMALL_INPUT)
    x = np.random.default_rng(3).standard_normal(plan.input.dims).astype(np.float32)
    backend = TorchBackend(weights, plan, device="cpu")
    try:
        got = backend.forward(x)
    finally:
        backend.close()
    assert got.shape == (3, 10)
    assert rel_l2(got, reference(weights, plan, x)) <= 1e-5


@needs_torch
def test_bad_options_are_one_line_errors():
    from inception_engine.backends.torch_backend import TorchBackend

    weights = small_weights(True)
    plan = build_plan(1, small_network(True), input_size=SMALL_INPUT)
    with pytest.raises(EngineError, match="precision must be one of"):
        TorchBackend(weights, plan, device="cpu", precision="bf16")
    with pytest.raises(BackendUnavailable, match="graph=True needs a CUDA device"):
        TorchBackend(weights, plan, device="cpu", graph=True)
    backend = TorchBackend(weights, plan, device="cpu")
    assert backend.mode == "eager" and TorchBackend.PRECISIONS == ("fp32", "tf32", "fp16")
    with pytest.raises(ValueError, match="does not match the plan"):
        backend.forward(np.zeros((2, 3, SMALL_INPUT, SMALL_INPUT), np.float32))


@needs_torch
def test_math_switches_are_put_back():
    import torch

    from inception_engine.backends.torch_backend import TorchBackend

    weights = small_weights(True)
    plan = build_plan(1, small_network(True), input_size=SMALL_INPUT)
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    backend = TorchBackend(weights, plan, device="cpu", precision="tf32")
    backend.forward(np.zeros(plan.input.dims, np.float32))
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.benchmark) == before


@pytest.fixture(scope="module")
def net8():
    return real_network(8, seed=4)


@pytest.mark.gpu
@needs_torch
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("which", ["net", "net8"])
def test_gpu_fp32_matches_reference(graph, which, request):
    if not torch_cuda():
        pytest.skip("PyTorch has no CUDA device")
    from inception_engine.backends.torch_backend import TorchBackend

    weights, plan, x, ref = request.getfixturevalue(which)
    backend = TorchBackend(weights, plan, device="cuda", graph=graph)
    try:
        got = backend.forward(x)
        assert rel_l2(got, ref) <= 1e-4
        assert (top5(got) == top5(ref)).all()
        assert np.array_equal(backend.forward(x), got)  # replay / rerun gives the same logits
        times = backend.time_forward(x, iters=3, warmup=1)
        assert len(times) == 3 and min(times) > 0
        assert backend.peak_memory_bytes() > sum(a.nbytes for a in weights.arrays.values())
    finally:
        backend.close()


@pytest.mark.gpu
@needs_torch
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("precision, tolerance", [("tf32", 2e-2), ("fp16", 5e-2)])
def test_gpu_reduced_precision_runs_close(precision, tolerance, graph, net):
    if not torch_cuda():
        pytest.skip("PyTorch has no CUDA device")
    from inception_engine.backends.torch_backend import TorchBackend

    weights, plan, x, ref = net
    backend = TorchBackend(weights, plan, device="cuda", graph=graph, precision=precision)
    try:
        assert backend.mode == ("graph" if graph else "eager")
        got = backend.forward(x)
        times = backend.time_forward(x, iters=2, warmup=1)
    finally:
        backend.close()
    assert got.dtype == np.float32 and np.isfinite(got).all()
    assert rel_l2(got, ref) <= tolerance
    assert len(times) == 2 and min(times) > 0


# ---- torch.compile (compile_mode): the torch-compile and torch-compile-max rows of inception-bench ------------------

HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_compile_failure_names_the_error_under_pytorchs_wrappers():
    """Dynamo's BackendCompilerFailed says "backend='inductor' raised:" first; the row should say what failed."""
    from inception_engine.backends.torch_backend import compile_failure

    class BackendCompilerFailed(Exception):  # torch._dynamo.exc's: the cause in .inner_exception
        def __init__(self, inner):
            super().__init__(f"backend='inductor' raised:\n{type(inner).__name__}: {inner}\n\nSet "
                             f"TORCHDYNAMO_VERBOSE=1 for the internal stack trace")
            self.inner_exception = inner

    try:
        try:
            raise RuntimeError("Triton Error [CUDA]: out of resource: shared memory\nRequired: 232448")
        except RuntimeError as root:
            raise ValueError("LoweringException: RuntimeError: ...\n  target: aten.convolution") from root
    except ValueError as lowering:
        wrapped = BackendCompilerFailed(lowering)
    assert compile_failure(wrapped) == "RuntimeError: Triton Error [CUDA]: out of resource: shared memory"
    assert compile_failure(RuntimeError("  \n")) == "RuntimeError"
    a, b = ValueError("a"), KeyError("b")
    a.__cause__, b.__cause__ = b, a  # a cycle ends the walk
    assert compile_failure(a) in ("ValueError: a", "KeyError: 'b'")


@needs_torch
def test_compile_options_are_one_line_errors(monkeypatch):
    from inception_engine.backends.torch_backend import TorchBackend

    weights = small_weights(True)
    plan = build_plan(1, small_network(True), input_size=SMALL_INPUT)
    with pytest.raises(EngineError, match="compile_mode must be one of reduce-overhead, max-autotune"):
        TorchBackend(weights, plan, device="cpu", compile_mode="fast")
    with pytest.raises(EngineError, match="choose one"):
        TorchBackend(weights, plan, device="cpu", graph=True, compile_mode="reduce-overhead")
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "triton", None)  # import triton now raises ImportError
        with pytest.raises(BackendUnavailable, match="needs Triton, which is not installed"):
            TorchBackend(weights, plan, device="cpu", compile_mode="reduce-overhead")
    if HAS_TRITON:
        with pytest.raises(BackendUnavailable, match="replays CUDA graphs and needs a CUDA device"):
            TorchBackend(weights, plan, device="cpu", compile_mode="max-autotune")


@needs_torch
def test_as_module_is_the_network_in_one_graph(net):
    """What torch.compile is given: the same logits as the backend, every weight a frozen parameter, and one graph
    for Dynamo (a graph break would split the compiled network and its CUDA graph, to torch's disadvantage)."""
    import torch

    from inception_engine.backends.torch_backend import TorchBackend

    weights, plan, x, ref = net
    backend = TorchBackend(weights, plan, device="cpu")
    try:
        module = backend.as_module()
        params = list(module.parameters())
        assert len(params) == 2 * len(backend.params) and not any(p.requires_grad for p in params)
        with torch.no_grad():
            got = module(torch.from_numpy(x)).numpy()
        assert rel_l2(got, backend.forward(x)) <= 1e-6 and rel_l2(got, ref) <= 1e-4
        explanation = torch._dynamo.explain(module)(torch.from_numpy(x))
        assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons
    finally:
        backend.close()


@pytest.mark.gpu
@needs_torch
@pytest.mark.parametrize("mode, precision, tolerance", [
    ("reduce-overhead", "fp32", 1e-4), ("reduce-overhead", "tf32", 2e-2), ("reduce-overhead", "fp16", 5e-2)])
def test_gpu_compile_matches_reference(mode, precision, tolerance, net):
    """torch.compile's logits against the float64 reference, with the torch-graph tests' tolerances; the CUDA graph
    reads the input in place (a new input, new logits, as eager gives them) and replays leave earlier logits intact."""
    if not torch_cuda():
        pytest.skip("PyTorch has no CUDA device")
    if not HAS_TRITON:
        pytest.skip("Triton is not installed")
    from inception_engine.backends.torch_backend import TorchBackend

    weights, plan, x, ref = net
    backend = TorchBackend(weights, plan, device="cuda", precision=precision, compile_mode=mode)
    try:
        assert backend.mode == "compile" and backend.graph_fallback is None  # CUDA graphs recorded, not skipped
        assert backend.compile_seconds is not None and backend.compile_seconds > 0
        got = backend.forward(x)
        other = backend.forward(-x)
        times = backend.time_forward(x, iters=3, warmup=1)
        again = backend.forward(x)
        assert backend.peak_memory_bytes() > sum(a.nbytes for a in weights.arrays.values()) // 2
    finally:
        backend.close()
    eager = TorchBackend(weights, plan, device="cuda", precision=precision)
    try:
        want_other = eager.forward(-x)
    finally:
        eager.close()
    assert got.shape == (1, 1000) and got.dtype == np.float32 and np.isfinite(got).all()
    assert rel_l2(got, ref) <= tolerance
    if precision == "fp32":
        assert (top5(got) == top5(ref)).all()
    assert rel_l2(other, want_other) <= tolerance and not np.array_equal(other, got)
    assert np.array_equal(again, got)
    assert len(times) == 3 and min(times) > 0


@pytest.mark.gpu
@needs_torch
def test_gpu_max_autotune_small_network():
    """max-autotune on the small network (every op and view kind, five convs): on the real one it benchmarks each
    conv's candidates for many minutes at each batch size, too long for the suite."""
    if not torch_cuda():
        pytest.skip("PyTorch has no CUDA device")
    if not HAS_TRITON:
        pytest.skip("Triton is not installed")
    from inception_engine.backends.torch_backend import TorchBackend

    weights = small_weights(True, seed=2)
    plan = build_plan(3, small_network(True), input_size=SMALL_INPUT)
    x = np.random.default_rng(3).standard_normal(plan.input.dims).astype(np.float32)
    backend = TorchBackend(weights, plan, device="cuda", precision="fp16", compile_mode="max-autotune")
    try:
        assert backend.mode == "compile" and backend.graph_fallback is None
        got = backend.forward(x)
        times = backend.time_forward(x, iters=2, warmup=1)
        assert np.array_equal(backend.forward(x), got)
    finally:
        backend.close()
    assert got.shape == (3, 10) and rel_l2(got, reference(weights, plan, x)) <= 5e-2
    assert len(times) == 2 and min(times) > 0
