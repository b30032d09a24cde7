"""Class names by network: the 1000 ImageNet-1k names of torchvision's classifier (0 tench ... 999 toilet tissue,
in its index order), and "class N" for the FID network, whose 1008 classes are TF's 2015 Inception classes (index 0
a "background" class, the rest in an order of their own): their names are not shipped, and ImageNet's would be
wrong for them. A run's labels follow its weight file's network (Engine.labels) and are passed to whatever labels
a class."""

from __future__ import annotations

import functools
from collections.abc import Sequence

Labels = tuple[str, ...]  # a network's class names, by class index
NUMBERED_NOTE = ("these weights are the FID network: its 1008 classes are TF's 2015 Inception classes, whose names "
                 "are not shipped; each is labelled \"class N\"")


@functools.cache
def imagenet_labels() -> Labels:
    from importlib import resources  # on use, as the architecture's tables: neither is needed to read a result line

    from .arch import NUM_CLASSES

    text = resources.files("inception_engine.data").joinpath("imagenet_classes.txt").read_text(encoding="utf-8")
    names = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(names) != NUM_CLASSES:
        raise RuntimeError(f"imagenet_classes.txt has {len(names)} names, expected {NUM_CLASSES}; "
                           f"the install is broken")
    return names


@functools.cache
def numbered(count: int) -> Labels:
    """"class 0" ... "class count-1": the names of classes whose names are not shipped."""
    return tuple(f"class {i}" for i in range(count))


def network_labels(network: str) -> Labels:
    """The class names of a network (a key of arch.NETWORKS): ImageNet's for torchvision's classifier, numbered for
    the FID network."""
    from .arch import NETWORKS

    return imagenet_labels() if network == "torchvision" else numbered(NETWORKS[network].classes)


def known_labels(index: Sequence[int], names: Sequence[object]) -> Labels | None:
    """The network's label set (network_labels) that names each class index ``index[j]`` as ``names[j]``; None
    where none does. Indices must be ints."""
    from .arch import NETWORKS

    if not index or min(index) < 0:
        return None
    for network in NETWORKS:
        labels = network_labels(network)
        if max(index) < len(labels) and list(map(labels.__getitem__, index)) == list(names):
            return labels
    return None
