"""The Python API: load weights once, pick a backend, classify images.

    from inception_engine.engine import Engine
    with Engine("weights/inception_v3.npz", backend="cpu") as engine:
        for p in engine.predict(["cat.jpg", "dog.png"], top_k=3):
            print(p.image, p.top if p.ok else p.error)

Batches: images are decoded one by one and run ``batch_size`` at a time. A final partial batch of ``n`` images gets a
plan (and a backend instance) of batch ``n`` of its own rather than being padded: padding costs a full batch of
compute every call (on the CPU path that is up to ``batch_size - 1`` wasted forwards), a second plan costs one
set-up, cached for the engine's lifetime.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from . import backends
from .errors import EngineError
from .images import Preprocess, load_image
from .labels import imagenet_labels
from .plan import build_plan
from .weights import Weights, find_weights, load_weights

BACKEND_CHOICES = ("auto", *backends.BACKENDS)

ImageSource = str | os.PathLike | Image.Image


@dataclass(frozen=True)
class Prediction:
    image: str  # the path as given, or "<PIL.Image N>" for in-memory images
    top: list[tuple[int, str, float]] | None = None  # (class index, label, probability), most likely first
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (max subtracted, so large logits do not overflow)."""
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


def top_classes(probs: np.ndarray, k: int) -> list[tuple[int, str, float]]:
    """The k most likely classes of one probability row; ties broken by the lower index."""
    names = imagenet_labels()
    order = np.argsort(-probs, kind="stable")[:k]
    return [(int(i), names[i], float(probs[i])) for i in order]


def load(weights: str | os.PathLike | Weights | None) -> Weights:
    if isinstance(weights, Weights):
        return weights
    return load_weights(find_weights(weights))


class Engine:
    def __init__(self, weights: str | os.PathLike | Weights | None = None, backend: str = "auto",
                 batch_size: int = 8):
        if batch_size < 1:
            raise EngineError(f"batch size must be at least 1, got {batch_size}")
        if backend not in BACKEND_CHOICES:
            raise EngineError(f"unknown backend {backend!r}; choose one of {', '.join(BACKEND_CHOICES)}")
        self.weights = load(weights)
        self.backend_name = backends.resolve(backend)
        self.backend_class = backends.backend_class(self.backend_name)  # BackendUnavailable with the reason
        self.batch_size = batch_size
        self.preprocess = Preprocess.from_manifest(self.weights.manifest)
        self._backends: dict[int, Any] = {}  # batch size -> backend instance, built on first use

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for b in self._backends.values():
            b.close()
        self._backends.clear()

    def backend(self, batch: int) -> Any:
        if batch not in self._backends:
            plan = build_plan(batch, self.weights.layers(), input_size=self.preprocess.size)
            self._backends[batch] = self.backend_class(self.weights, plan,
                                                       **backends.DEFAULT_OPTIONS.get(self.backend_name, {}))
        return self._backends[batch]

    def forward(self, x: np.ndarray) -> np.ndarray:
        """(N, 3, size, size) float32 normalised images -> (N, 1000) float32 logits, any N >= 1."""
        s = self.preprocess.size
        x = np.asarray(x)
        if x.ndim != 4 or x.shape[1:] != (3, s, s) or x.shape[0] < 1:
            raise EngineError(f"input must have shape (N, 3, {s}, {s}), got {x.shape}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        outs = [self.backend(len(chunk)).forward(chunk)
                for chunk in (x[i:i + self.batch_size] for i in range(0, len(x), self.batch_size))]
        return np.concatenate(outs, axis=0)

    def predict(self, images: Sequence[ImageSource], top_k: int = 5,
                on_progress: Callable[[int], None] | None = None) -> list[Prediction]:
        """Classify images (paths or PIL images). A file that cannot be read gets a Prediction with ``error`` set;
        the others still run. ``on_progress(n)`` is called as each n images finish."""
        if not 1 <= top_k <= len(imagenet_labels()):
            raise EngineError(f"top-k must be between 1 and {len(imagenet_labels())}, got {top_k}")
        results: list[Prediction | None] = [None] * len(images)
        pending: list[tuple[int, str, np.ndarray]] = []

        def run_pending() -> None:
            probs = softmax(self.forward(np.stack([x for _, _, x in pending])))
            for (i, name, _), p in zip(pending, probs):
                results[i] = Prediction(name, top=top_classes(p, top_k))
            if on_progress:
                on_progress(len(pending))
            pending.clear()

        for i, src in enumerate(images):
            name = f"<PIL.Image {i}>" if isinstance(src, Image.Image) else str(src)
            try:
                pending.append((i, name, load_image(src, self.preprocess)))
            except EngineError as e:
                results[i] = Prediction(name, error=str(e))
                if on_progress:
                    on_progress(1)
            if len(pending) == self.batch_size:
                run_pending()
        if pending:
            run_pending()
        return [r for r in results if r is not None]

