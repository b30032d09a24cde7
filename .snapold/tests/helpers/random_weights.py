"""He-initialised random weights for tests of the user-facing layer (engine, CLI, bench): the real network's shapes,
no download, activations O(1) through all 94 ReLU layers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from inception_engine import arch
from inception_engine.weights import Weights, save_weights


def random_arrays(seed: int = 0, network: str = "torchvision") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {}
    for key, shape in arch.weight_shapes(arch.inception_v3(network=network)).items():
        if key.endswith(".weight"):
            fan_in = int(np.prod(shape[1:]))
            arrays[key] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        else:
            arrays[key] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    return arrays


def random_weights(seed: int = 0, network: str = "torchvision") -> Weights:
    """network "fid": the FID network's layout (arch.NETWORKS), its input scaled to [-1, 1] as pytorch-fid's."""
    if network == "fid":
        return Weights(random_arrays(seed, network), {"count_include_pad": False, "network": "fid",
                                                       "input": {"mean": [0.5] * 3, "std": [0.5] * 3}})
    return Weights(random_arrays(seed), {"count_include_pad": True})


def write_random_weights(path: Path, seed: int = 0) -> Path:
    return save_weights(path, random_arrays(seed), {"source_name": f"random He-init, seed {seed}",
                                                   "count_include_pad": True})
