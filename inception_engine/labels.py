"""The 1000 ImageNet-1k class names, in the index order of torchvision's classifiers (0 tench ... 999 toilet tissue)."""

from __future__ import annotations

import functools
from importlib import resources

from .arch import NUM_CLASSES


@functools.cache
def imagenet_labels() -> tuple[str, ...]:
    text = resources.files("inception_engine.data").joinpath("imagenet_classes.txt").read_text(encoding="utf-8")
    names = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(names) != NUM_CLASSES:
        raise RuntimeError(f"imagenet_classes.txt has {len(names)} names, expected {NUM_CLASSES}; "
                           f"the install is broken")
    return names


def label(index: int) -> str:
    return imagenet_labels()[index]
