"""What a run is asked to do, checked once where it is said (the command line or the Python API) and passed whole.

``EngineConfig`` is an engine's options: weights, backend, precision, batch size, decode and its workers.
``RunConfig`` is one ``inception-run``: the engine's options, the inputs, where the results go and which driver
computes them (this process, ``--gpus N`` worker processes, a Ray cluster). Both are frozen dataclasses whose
``__post_init__`` makes every check that probes nothing (a choice, a range, a file that must exist, options that
exclude each other), raising OptionError or WeightsError in one line; whatever receives one (Engine, the drivers,
a --gpus worker, whatever serves next) takes it as checked and never checks its options again. A pickled config
(a --gpus worker's) is not checked again either: unpickling does not run ``__post_init__``.

``resolve`` is the one step that probes the machine: the backend ``auto`` stands for (is a GPU usable?), the
precision ``auto`` stands for on it, the batch size's default there. Its answer, ``Resolved``, is made once per
process that runs an engine, and carries the notes of the fallbacks it took.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import backends
from .errors import EngineError, OptionError
from .ingest.entries import DEFAULT_MAX_PIXELS, MAX_PIXELS_ENV
from .ingest.modes import RESIZE_MODES, WORKER_KINDS

if TYPE_CHECKING:
    from .weights import Weights

BACKEND_CHOICES = ("auto", *backends.BACKENDS)
PRECISION_CHOICES = ("auto", "fp32", "tf32", "fp16", "int8")  # int8: a calibrated weight file, sm_90a
DECODE_CHOICES = ("cpu", "gpu")
DEFAULT_BATCH_GPU, DEFAULT_BATCH_CPU = 64, 8  # batch_size=None
# auto: TF32 where the backend has it (PyTorch's and cuDNN's default for convolutions too: rel L2 ~7e-4 against
# float64, docs/PERFORMANCE.md), float32 elsewhere.
AUTO_PRECISION = "tf32"
NO_GPU_NOTE = "no usable GPU: running on the CPU"  # backend="auto"'s note where it falls back
MAX_TOP_K = 1000  # the classifier's classes


def choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionError(option, value, f"choose one of {', '.join(choices)}")


def at_least_one(option: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise OptionError(option, value, "must be at least 1")


def pixel_limit(value: int | None) -> int:
    """The most pixels an image may declare: ``value``, else $INCEPTION_MAX_PIXELS, else DEFAULT_MAX_PIXELS
    (Pillow's default). At least 1; OptionError naming the keyword or the variable otherwise."""
    if value is None:
        text = os.environ.get(MAX_PIXELS_ENV, "").strip()
        if not text:
            return DEFAULT_MAX_PIXELS
        try:
            value = int(text.replace("_", "").replace(",", ""))
        except ValueError:
            value = 0
        if value < 1:
            raise EngineError(f"${MAX_PIXELS_ENV}={text}: must be a whole number of pixels, at least 1 "
                              f"(default {DEFAULT_MAX_PIXELS:,})")
    at_least_one("max_pixels", value)
    return value


def weights_file(weights: str | os.PathLike | None) -> Path:
    """The weight file ``weights`` names: the path given, which must exist, or for None the first of the usual
    places (weights.find_weights). Nothing is read."""
    if weights is not None and not os.path.lexists(weights):  # worded for the API; the rest weights.py words
        raise OptionError("weights", os.fspath(weights), "no such file (inception-convert-weights makes one from "
                                                         "torchvision's ONNX export)")
    from .weights import find_weights  # on use (NumPy): inception-run --server reads no weight file

    return find_weights(weights)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """An engine's options, checked at construction. ``weights``: a path (made the weight file's path: the path
    given, which must exist, else the first of the usual places), a Weights, or None for the usual places."""

    weights: Path | Weights | None = None
    backend: str = "auto"
    precision: str = "auto"
    batch_size: int | None = None  # None: DEFAULT_BATCH_GPU on the cuda backend, DEFAULT_BATCH_CPU elsewhere
    workers: int | None = None  # decode workers; None: one per usable CPU
    worker_kind: str = "auto"
    decode: str = "cpu"
    # the most pixels an image may declare (None: $INCEPTION_MAX_PIXELS, else Pillow's default, 89,478,485)
    max_pixels: int | None = None
    # whose preprocessing (RESIZE_MODES; None: the weight file's network's)
    resize: str | None = None

    def __post_init__(self) -> None:
        at_least_one("batch_size", self.batch_size)
        choice("backend", self.backend, BACKEND_CHOICES)
        choice("precision", self.precision, PRECISION_CHOICES)
        choice("worker_kind", self.worker_kind, WORKER_KINDS)
        choice("decode", self.decode, DECODE_CHOICES)
        if self.resize is not None:
            choice("resize", self.resize, RESIZE_MODES)
        at_least_one("workers", self.workers)
        object.__setattr__(self, "max_pixels", pixel_limit(self.max_pixels))
        from .weights import Weights

        if not isinstance(self.weights, Weights):
            object.__setattr__(self, "weights", weights_file(self.weights))

    @property
    def weights_path(self) -> Path | None:
        """The weight file to read; None where Weights were given (__post_init__ made every other value a Path)."""
        return self.weights if isinstance(self.weights, Path) else None

    def replace(self, **changes: Any) -> EngineConfig:
        """A copy with ``changes``, checked as any new config is."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """What ``auto`` stands for on this machine, and the fallbacks taken to get there (one line each)."""

    backend_name: str
    backend_class: Any
    precision: str
    batch_size: int
    notes: tuple[str, ...]


def resolve(config: EngineConfig) -> Resolved:
    """The backend resolved (the GPU probed, ~0.4 s: BackendUnavailable with the reason where a named one cannot
    run), the precision and decode checked against it, the batch size's default there."""
    notes: list[str] = []
    name, fell_back = config.backend, False
    if name == "auto":  # backends.resolve's choice (backend="cuda" raises with the reason there is no GPU)
        fell_back = not backends.is_available("cuda")[0]
        if fell_back:
            notes.append(NO_GPU_NOTE)
        name = "cpu" if fell_back else "cuda"
    backend_class = backends.backend_class(name)  # BackendUnavailable with the reason
    where = " (no usable GPU here)" if fell_back else ""
    have = getattr(backend_class, "PRECISIONS", ("fp32",))
    precision = config.precision
    if precision == "auto":
        precision = AUTO_PRECISION if AUTO_PRECISION in have else "fp32"
    elif precision not in have:
        raise OptionError("precision", precision, f"the {name} backend{where} computes in {' and '.join(have)} only; "
                          f"give {' or '.join(have)}, or auto")
    if config.decode == "gpu" and name != "cuda":
        raise OptionError("decode", config.decode, f"needs the cuda backend; this engine runs on {name}{where}")
    batch_size = config.batch_size or (DEFAULT_BATCH_GPU if name == "cuda" else DEFAULT_BATCH_CPU)
    return Resolved(name, backend_class, precision, batch_size, tuple(notes))


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One inception-run: its engine's options, its inputs, where the results go and the driver that computes them
    (``gpus`` > 1: worker processes on this machine; ``ray``: a Ray cluster's address, "" for the running or a new
    local one). Options that exclude each other are refused here, before anything starts."""

    # EngineConfig, or a dict of its keywords made into one after the run's own checks; with ``server``, the dict of
    # what the run asks of the server's engine (backend, precision, batch_size)
    engine: EngineConfig | dict[str, Any]
    images: tuple[str, ...]
    top_k: int = 5
    recursive: bool = False
    output: str | None = None  # FILE.jsonl or FILE.csv (with --ray: a directory or URI)
    resume: bool = False
    as_json: bool = False
    gpus: int | None = None
    ray: str | None = None
    server: str | None = None  # a running inception-serve's URL: it computes, this process reads and writes
    features: str | None = None  # OUT.npy: each image's pool features, the image list beside it (features_file.py)

    def __post_init__(self) -> None:
        # the run's own options first: a usage error is said before any weight file is looked for
        if not 1 <= self.top_k <= MAX_TOP_K:
            raise OptionError("top_k", self.top_k, f"must be between 1 and {MAX_TOP_K}")
        if self.features is not None:
            self._check_features()
        if self.server is not None and (self.ray is not None or self.gpus is not None):
            raise EngineError("--server computes on the server's devices; --ray and --gpus do not apply")
        if self.ray is not None:
            self._check_ray()
        elif self.gpus == 0:
            raise EngineError("--gpus 0 is for --ray; on this machine the CPU is --backend cpu")
        elif self.resume and not self.output:
            raise EngineError("--resume continues an --output FILE; give the file")
        elif self.output and self.as_json:
            raise EngineError("--json prints to the terminal and --output writes a file; choose one")
        if self.server is not None:
            self._check_server()
        elif not isinstance(self.engine, EngineConfig):
            object.__setattr__(self, "engine", EngineConfig(**self.engine))

    def _check_server(self) -> None:
        """--server: the engine is the server's, so ``engine`` stays the options the run asks of it (backend,
        precision, batch size: checked against the server's when it answers); what only a local engine uses is
        refused rather than ignored."""
        asked = self.engine if isinstance(self.engine, dict) else dataclasses.asdict(self.engine)
        local = {"weights": None, "workers": None, "worker_kind": "auto", "decode": "cpu", "max_pixels": None,
                 "resize": None}
        given = [k for k, default in local.items() if asked.get(k, default) != default]
        if given:
            opt = given[0].replace("_", "-")
            how = "it resizes as its weight file's network does" if opt == "resize" else f"inception-serve --{opt}"
            raise EngineError(f"--{opt} is the server's to choose ({how}); --server runs what the server runs")
        object.__setattr__(self, "engine", {k: asked.get(k) for k in ("backend", "precision", "batch_size")})

    def _check_features(self) -> None:
        """--features: this process's engine computes them (not --gpus, --ray or --server), for every input of the
        run (not --resume's remainder), into a new OUT.npy."""
        away = next((f"--{o}" for o, v in (("ray", self.ray), ("server", self.server)) if v is not None), None)
        if away is None and self.gpus is not None and self.gpus > 1:
            away = "--gpus"
        if away is not None:
            raise EngineError(f"--features are computed by this process's engine; {away} does not write them")
        if self.resume:
            raise EngineError("--features writes every input's row; --resume runs only the missing ones")
        from .features_file import check_features_path

        check_features_path(self.features)

    def _check_ray(self) -> None:
        address = self.ray or ""
        if os.path.exists(address) or "://" in address and not address.startswith("ray://"):
            raise EngineError(f"--ray takes the cluster's address (auto, local, ray://HOST:PORT), got the input "
                              f"{address}: write --ray auto {address}, or put --ray after the inputs")
        if not self.output:
            raise EngineError("--ray writes its results to a directory: give --output DIR (or a URI such as s3://...)")
        if self.resume or self.as_json:
            raise EngineError("--ray writes JSON lines into --output DIR; --resume and --json are not for --ray")
        resize = self.engine.get("resize") if isinstance(self.engine, dict) else self.engine.resize
        if resize is not None:  # Ray's decode tasks take the weight file's preprocessing (ray_data.preprocess_of)
            raise EngineError("--resize is for this machine's engines; --ray decodes as the weight file's network "
                              "does")

    @property
    def driver(self) -> str:
        """Where the batches run: "ray", "server" (a running inception-serve), "gpus" (worker processes, one per GPU)
        or "local" (this process)."""
        if self.ray is not None or self.server is not None:
            return "ray" if self.ray is not None else "server"
        return "gpus" if self.gpus and self.gpus > 1 else "local"
