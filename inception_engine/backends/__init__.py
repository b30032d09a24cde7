"""Backends execute a ``Plan`` with a ``Weights``. Each is one module with one class:

    class SomethingBackend:
        name: str                                        # "cpu", "cuda", "cudnn", "torch"
        @classmethod
        def check_available(cls) -> None: ...            # raise BackendUnavailable(one-line reason)
        def __init__(self, weights: Weights, plan: Plan, **options): ...   # allocate everything here
        def forward(self, x: np.ndarray) -> np.ndarray:  # (plan.batch, 3, 299, 299) float32 -> (batch, 1000) logits
        def time_forward(self, x: np.ndarray, iters: int, warmup: int) -> list[float]: ...  # ms per forward
        def close(self) -> None: ...

Modules are imported lazily so that a missing optional dependency (pycuda, torch) only matters when that backend
is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import BackendUnavailable

BACKENDS: dict[str, tuple[str, str]] = {
    "cpu": ("inception_engine.backends.numpy_backend", "NumpyBackend"),
    "cuda": ("inception_engine.backends.cuda_backend", "CudaBackend"),
    "cudnn": ("inception_engine.backends.cudnn_backend", "CudnnBackend"),
    "torch": ("inception_engine.backends.torch_backend", "TorchBackend"),
}


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
    klass.check_available()
    return klass


def is_available(name: str) -> tuple[bool, str]:
    try:
        backend_class(name)
        return True, ""
    except BackendUnavailable as e:
        return False, str(e)


def resolve(name: str) -> str:
    """``auto`` -> ``cuda`` when a GPU and pycuda are usable, else ``cpu``."""
    if name != "auto":
        return name
    return "cuda" if is_available("cuda")[0] else "cpu"
