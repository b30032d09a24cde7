"""What a run's results are, apart from how they were computed: a Prediction per image, the model that made it
(ModelId) and what an engine runs with (EngineFacts). NumPy-free, as are the modules that only pass results on
(output, sinks, drivers, serve/client.py), so that ``inception-run --server`` imports neither NumPy nor the engine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .labels import Labels, network_labels

TopK = list[tuple[int, float]]  # (class index, probability), most likely first


@dataclass(frozen=True)
class Prediction:
    image: str  # the path as given, or "<PIL.Image N>" for in-memory images
    top: list[tuple[int, str, float]] | None = None  # (class index, label, probability), most likely first
    error: str | None = None
    # what computed ``top``: the backend's name, the precision it ran in and the model (ModelId.name)
    # (Engine.predict_iter fills them in; None for errors, which nothing computed)
    backend: str | None = None
    precision: str | None = None
    model: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# (backend, precision, model): what each prediction of a stream records as having computed it
ComputedBy = tuple[str | None, str | None, str | None]


def make_predictions(names: list[str], tops: list[TopK | str], computed_by: ComputedBy,
                     labels: Labels) -> list[Prediction]:
    """A Prediction per image, its classes named by ``labels``, recording ``computed_by``; or its error."""
    backend, precision, model = computed_by
    return [Prediction(name, error=top) if isinstance(top, str) else
            Prediction(name, labelled(top, labels), backend=backend, precision=precision, model=model)
            for name, top in zip(names, tops)]


def labelled(top: TopK, labels: Labels) -> list[tuple[int, str, float]]:
    """Each class with its name in ``labels`` (the network's: labels.network_labels); "class N" past their end."""
    return [(i, labels[i] if i < len(labels) else f"class {i}", p) for i, p in top]


@dataclass(frozen=True)
class ModelId:
    """What every result names its model by: ``digest`` (model_digest), ``kind`` (PROVENANCE_KINDS, or "unknown"
    for a file converted before provenance was kept) and the source file's SHA-256 where it is known."""

    digest: str
    kind: str
    source_sha256: str | None = None

    @property
    def name(self) -> str:
        """The digest, "synthetic-" before it for the synthetic model: what result lines and CSV rows hold."""
        return f"synthetic-{self.digest}" if self.kind == "synthetic" else self.digest

    def describe(self) -> str:
        """A few words for a header line: ``model 3f9a0c12ab45 (torchvision)``."""
        what = {"synthetic": "SYNTHETIC: random weights, its classes mean nothing",
                "unknown": "source not recorded: converted before provenance was kept"}.get(self.kind, self.kind)
        return f"model {self.name} ({what})"


@dataclass(frozen=True)
class EngineFacts:
    """What an Engine runs with, as inception-run prints it: small and picklable, so that a --gpus worker sends its
    engine's to the parent, which builds none."""

    backend_name: str
    precision: str
    batch_size: int
    weights_path: Path | None
    notes: tuple[str, ...]
    model: ModelId | None = None  # what every result names the weights by
    network: str = "torchvision"  # the weight file's network (arch.NETWORKS): its classes' names are ``labels``

    @property
    def labels(self) -> Labels:
        """The names of the network's classes (labels.network_labels)."""
        return network_labels(self.network)
