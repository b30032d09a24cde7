"""Backends execute a ``Plan`` with a ``Weights``. Each is one class in its own module (the CUDA backend's is
``cuda/backend.py``, in a package of its own):

    class SomethingBackend:
        name: str                                        # "cpu", "cuda", "cudnn", "torch"
        @classmethod
        def check_available(cls) -> None: ...            # raise BackendUnavailable(one-line reason)
        def __init__(self, weights: Weights, plan: Plan, **options): ...   # allocate everything here
        def forward(self, x: np.ndarray) -> np.ndarray:  # (plan.batch, 3, 299, 299) float32 -> (batch, 1000) logits
        def time_forward(self, x: np.ndarray, iters: int, warmup: int) -> list[float]: ...  # ms per forward
        def close(self) -> None: ...

``forward(x, features=True)``, where a backend has it (``FEATURES = True``: cpu, cuda), returns (logits, features):
the global average pool's output (batch, 2048) of the same forward, for FID and the like.

Optional, used by inception-bench where present: ``PRECISIONS`` (a class attribute: the values the ``precision``
keyword of ``__init__`` accepts, "fp32" / "tf32" / "fp16"), a ``graph`` keyword (replay one CUDA graph per forward),
``graph_fallback`` (an instance attribute: why a graph was asked for and the backend runs eagerly; None otherwise),
``compile_seconds`` and ``compile_cached`` (instance attributes of a backend that compiles at ``__init__``, as torch
with ``compile_mode`` does: how long that took, and whether a cache served it), ``time_layers`` and
``peak_memory_bytes`` (see bench.py).

Modules are imported lazily so that a missing optional dependency (pycuda, torch) only matters when that backend
is asked for. ``BACKENDS`` are what ``inception-run --backend`` and ``Engine`` accept; ``VARIANTS`` are further
names for the benchmark: a backend run with other options.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

from ..errors import BackendUnavailable, OptionError

BACKENDS: dict[str, tuple[str, str]] = {
    "cpu": ("inception_engine.backends.numpy_backend", "NumpyBackend"),
    "cuda": ("inception_engine.backends.cuda.backend", "CudaBackend"),
    "cudnn": ("inception_engine.backends.cudnn_backend", "CudnnBackend"),
    "torch": ("inception_engine.backends.torch_backend", "TorchBackend"),
}

# The options a bare name runs with (inception-run, inception-bench): cuda measures each conv's tile, split-K and
# Winograd-or-not on the GPU once (CudaBackend(tune=True), cached per GPU) instead of trusting its cost model. The
# classes' own defaults stay untuned, so that tests get the same kernels on every GPU.
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {"cuda": {"tune": True}}

# name -> (backend, keyword options). The bare names run each backend's default: cuda and cudnn replay a CUDA graph,
# torch runs eagerly.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "torch-graph": ("torch", {"graph": True}),
    # torch.compile(model, mode=...) of the same network, compiled per batch size: the strongest peer a PyTorch user
    # gets from one line (reduce-overhead), and the most it gets (max-autotune: benchmarks kernel choices, far longer)
    "torch-compile": ("torch", {"compile_mode": "reduce-overhead"}),
    "torch-compile-max": ("torch", {"compile_mode": "max-autotune"}),
    "cudnn-eager": ("cudnn", {"graph": False}),
    "cuda-eager": ("cuda", {"graph": False, "tune": True}),
    "cuda-untuned": ("cuda", {}),  # the cost model's tiles, Winograd for every eligible conv: the A/B of tuning
    "cuda-direct": ("cuda", {"winograd": False}),  # no Winograd, the model's tiles: the A/B against Winograd
    "cuda-model": ("cuda", {"winograd": None}),  # Winograd only where the cost model expects a gain
    # --precision tf32 / fp16 on fp32 NCHW activations (conv_tf32.cu / conv_f16.cu, Winograd), tuned: the A/B of
    # cuda's NHWC path
    "cuda-nchw": ("cuda", {"nhwc": False, "tune": True}),
    # NHWC with every 1x1 conv its own GEMM, tuned: the A/B of plan.fuse_pointwise
    "cuda-unfused": ("cuda", {"fuse": False, "tune": True}),
}
BENCH_BACKENDS = (*BACKENDS, *VARIANTS)


def variant(name: str) -> tuple[str, dict[str, Any]]:
    """(backend, options) for a bench name; a plain backend name runs with no options."""
    if name in VARIANTS:
        backend, options = VARIANTS[name]
        return backend, dict(options)
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(BENCH_BACKENDS)}")
    return name, dict(DEFAULT_OPTIONS.get(name, {}))


def backend_class(name: str) -> Any:
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("inception_engine"):
            raise BackendUnavailable(f"backend {name!r} is not available in this version") from None
        raise BackendUnavailable(f"backend {name!r} needs the Python package {e.name!r}, which is not installed"
                                 ) from None
    klass = getattr(mod, cls)
    try:
        klass.check_available()
    except BackendUnavailable as e:  # probes may be shared between backends; say which one was asked for
        raise BackendUnavailable(f"{name} backend unavailable: {e}") from None
    return klass


def is_available(name: str) -> tuple[bool, str]:
    try:
        backend_class(name)
        return True, ""
    except BackendUnavailable as e:
        return False, str(e)


def usable_gpus() -> int:
    """GPUs this process can run the cuda backend on (those CUDA_VISIBLE_DEVICES shows); 0 where the backend
    cannot run at all (no pycuda, no driver, no compiler)."""
    if not is_available("cuda")[0]:
        return 0
    from .cuda.device import driver

    return int(driver().Device.count())


def require_gpus(gpus: int) -> None:
    """OptionError unless this machine has ``gpus`` usable GPUs: asking for more than there are is refused, never
    run on fewer (or on the CPU) without a word."""
    have = usable_gpus()
    if gpus > have:
        there = f"this machine has {have} usable GPU{'s' * (have != 1)}" if have else "this machine has no usable GPU"
        raise OptionError("gpus", gpus, there)


def resolve(name: str) -> str:
    """``auto`` -> ``cuda`` when a GPU and pycuda are usable, else ``cpu``."""
    if name != "auto":
        return name
    return "cuda" if is_available("cuda")[0] else "cpu"


def host_timed_ms(run: Callable[[], object], iters: int, warmup: int = 0) -> list[float]:
    """Wall-clock ms of each of ``iters`` calls of ``run`` after ``warmup`` untimed ones: the timer of the CPU paths
    (GPU backends time with CUDA events instead)."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def event_timed_ms(drv: Any, stream: Any, run: Callable[[], object], iters: int, warmup: int = 0) -> list[float]:
    """Device ms of each of ``iters`` calls of ``run`` (work queued on the pycuda ``stream``), one CUDA-event pair
    per call, each call starting on an idle GPU as a latency-bound caller sees it; the GPU backends' timer."""
    for _ in range(warmup):
        run()
    start, end = drv.Event(), drv.Event()
    times = []
    for _ in range(iters):
        stream.synchronize()
        start.record(stream)
        run()
        end.record(stream)
        end.synchronize()
        times.append(end.time_since(start))
    return times
