"""What the comparison-backend tests (cudnn, torch) share: weights for the real network, a small network that has
every op kind and every kind of view (concat slices written and read, padded and strided convs, 1x7 / 7x1 kernels,
average pools with and without padding counted), and the float64 NumPy reference."""

from __future__ import annotations

import numpy as np

from inception_engine import arch
from inception_engine.arch import FC, INPUT, Concat, Conv, GlobalAvgPool, Layer, Pool
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.plan import Plan, View
from inception_engine.weights import Weights

SMALL_INPUT = 17


def he_arrays(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """He-initialised weights (std sqrt(2 / fan_in)), biases N(0, 0.1): activations stay O(1) through ReLU layers."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in shapes.items():
        std = np.sqrt(2.0 / np.prod(shape[1:])) if key.endswith(".weight") else 0.1
        out[key] = (rng.standard_normal(shape) * std).astype(np.float32)
    return out


def network_weights(seed: int = 0) -> Weights:
    """The synthetic model where inception_engine.synthetic exists, else He-initialised random weights."""
    try:
        from inception_engine.synthetic import synthetic_weights
    except ModuleNotFoundError:
        return Weights(he_arrays(arch.weight_shapes(), seed), {"count_include_pad": True})
    return synthetic_weights(seed)


def small_network(count_include_pad: bool) -> list[Layer]:
    """17x17x3 in, 10 logits out. ``b2`` writes channels 8..20 of ``cat`` and ``e`` reads them back (a slice at an
    offset); ``p`` pools straight into ``cat``; ``cat2`` holds three convs of different kernel shapes."""
    return [
        Conv("stem", INPUT, 3, 16, (3, 3), 2, (1, 1)),  # 9x9
        Conv("a", "stem", 16, 8, (1, 1)),
        Conv("b1", "stem", 16, 6, (1, 1)),
        Conv("b2", "b1", 6, 12, (1, 7), 1, (0, 3)),
        Pool("p", "stem", "avg", 3, 1, 1, count_include_pad),
        Concat("cat", ("a", "b2", "p")),  # 36 channels
        Pool("mp", "cat", "max", 3, 2, 0),  # 4x4
        Conv("c", "mp", 36, 10, (3, 3), 1, (1, 1)),
        Conv("d", "mp", 36, 6, (7, 1), 1, (3, 0)),
        Conv("e", "b2", 12, 4, (3, 3), 2, (0, 0)),  # 9x9 -> 4x4, reading a slice of cat
        Concat("cat2", ("c", "d", "e")),  # 20 channels
        GlobalAvgPool("gap", "cat2"),
        FC("fc", "gap", 20, 10),
    ]


def small_weights(count_include_pad: bool, seed: int = 0) -> Weights:
    return Weights(he_arrays(arch.weight_shapes(small_network(count_include_pad)), seed),
                   {"count_include_pad": count_include_pad})


def reference(weights: Weights, plan: Plan, x: np.ndarray) -> np.ndarray:
    return NumpyBackend(weights, plan, dtype=np.float64).forward(x.astype(np.float64))


def rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    got = np.asarray(got, np.float64).reshape(ref.shape)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def top5(logits: np.ndarray) -> np.ndarray:
    return np.argsort(-np.asarray(logits, np.float64), axis=1, kind="stable")[:, :5]


def view_of(arena: np.ndarray, v: View) -> np.ndarray:
    """The view's (N, channels, H, W) elements inside a flat arena (a numpy view, writable)."""
    n, c, h, w = v.shape
    return arena[v.offset:v.offset + n * c * h * w].reshape(n, c, h, w)[:, v.c_offset:v.c_offset + v.channels]


def view_mask(arena_elems: int, v: View) -> np.ndarray:
    mask = np.zeros(arena_elems, bool)
    view_of(mask, v)[...] = True
    return mask
