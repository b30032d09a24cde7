"""The Python API: load weights once, pick a backend and precision, classify images as a stream.

    from inception_engine.engine import Engine
    with Engine("weights/inception_v3.npz") as engine:    # backend and precision "auto"
        print(engine.backend_name, engine.precision)      # e.g. "cuda tf32", or "cpu fp32" without a GPU
        for p in engine.predict_iter(["cat.jpg", "dog.png"], top_k=3):   # in order, as each batch finishes
            print(p.image, p.top if p.ok else p.error)

``predict_iter`` runs pipeline.classify: decode workers write uint8 pixels into a ring of host memory (an FID tool's
resize: the network's float32 input), the cuda backend uploads them on a copy stream, normalises on the GPU and
brings back only the top-k (cuda_runner.py: CudaRunner); other backends normalise on the host (pipeline.HostRunner).
On the cuda backend a run uses one batch size, min(batch_size, number of images), and a partial last batch runs that
batch's forward; elsewhere a final partial batch of ``n`` images gets a plan of batch ``n`` of its own rather than
being padded (on the CPU padding costs up to ``batch_size - 1`` wasted forwards, a second plan one set-up, cached for
the engine's lifetime).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from . import backends
from .backends import cpu_kernels
from .config import (BACKEND_CHOICES, DECODE_CHOICES, PRECISION_CHOICES, EngineConfig, Resolved, resolve,
                     weights_file)
from .errors import BackendUnavailable, EngineError, OptionError
from .ingest.fid_resize import PILLOW_FID_RESIZE_NOTE, fid_library
from .ingest.files import ImageSource
from .ingest.images import Preprocess
from .ingest.ring import HostRing
from .ingest.workers import start_forkserver
from .labels import NUMBERED_NOTE, Labels, network_labels
from . import arch
from .pipeline import (HostRunner, OnFeatures, PipelineOptions, Prediction, Runner, classify, classify_encoded,
                       decode_plan, labelled, predictions_by, softmax, top_classes)
from .plan import build_plan
from .model_files import load_weights
from .output import Rendered, line_renderer
from .results import EngineFacts
from .weights import Weights

__all__ = ["BACKEND_CHOICES", "DECODE_CHOICES", "PRECISION_CHOICES", "Engine", "EngineConfig", "EngineFacts",
           "Prediction", "softmax", "top_classes"]

# A run never stops to measure kernels unless that costs at most TUNE_BUDGET of its expected time: it takes this
# machine's tuning cache, else the package's table for its GPU model, else the cost model's kernels (and says so
# once). Measuring one precision and batch size takes ~15-25 s on an H100, and a run at a planning rate of 5,000
# images/s reaches the budget past ~3 million images; inception-tune measures ahead of time instead.
TUNE_BUDGET = 0.03
TUNE_SECONDS = 20.0
PLANNING_RATE = 5000.0  # images/s, a --decode gpu run's order of magnitude: a guess on the safe side


def measures_in_run(n_images: int) -> bool:
    """Whether a run of n_images may measure its kernels within TUNE_BUDGET of its expected time."""
    return n_images / PLANNING_RATE * TUNE_BUDGET >= TUNE_SECONDS


def load(weights: str | os.PathLike | Weights | None) -> Weights:
    """Weights as given: a Weights, a file's path, or None for the usual places (weights.find_weights)."""
    return weights if isinstance(weights, Weights) else load_weights(weights_file(weights))


def serves(built: tuple[dict[str, Any], Any], options: dict[str, Any]) -> bool:
    """Whether a backend built with these options serves a request for ``options``: the same options, or the same
    but for ``tune`` where its conv configs are measured ones already (tuned, or read from the tuning cache), which
    is all tuning again would give. Rebuilding costs a second or more (kernels, CUDA graph, the GPU JPEG decoder),
    and a Python caller alternating short and long runs paid it at every switch."""
    have, backend = built
    if have == options:
        return True
    same_but_tuning = ({k: v for k, v in have.items() if k != "tune"} ==
                       {k: v for k, v in options.items() if k != "tune"})
    return same_but_tuning and getattr(backend, "tuned", False)


def open_decoder_early(config: EngineConfig) -> Any:
    """For --decode gpu on a backend that may be cuda: jpeg_batch.c's decoder opening now on a thread of its own
    (jpeg_decode.NativeStart), before the backend is resolved. None where it cannot open that way (the Python API's
    path, nvImageCodec missing: Engine says why once the backend is resolved, in that order)."""
    if config.decode != "gpu" or config.backend not in ("auto", "cuda"):
        return None
    from .ingest.jpeg_decode import NativeStart, check_gpu_decode  # on use: it loads the CUDA backend's package

    try:
        return NativeStart(config.workers or 0) if check_gpu_decode() else None
    except BackendUnavailable:
        return None


class Engine:
    """Classifies images with one backend in one precision, both fixed when it is made (``backend_name``,
    ``precision``); every Prediction it yields records them. An argument it cannot honour raises OptionError,
    never a quiet substitute: only ``"auto"`` picks (the backend: cuda where a GPU is usable, else cpu; the
    precision: tf32 where the backend has it, else fp32)."""

    def __init__(self, weights: str | os.PathLike | Weights | None = None, backend: str = "auto",
                 batch_size: int | None = None, precision: str = "auto", workers: int | None = None,
                 worker_kind: str = "auto", decode: str = "cpu", max_pixels: int | None = None,
                 resize: str | None = None):
        """weights: a weight file, an ONNX export of the model (converted once, cached in the user cache), Weights,
        or None ($INCEPTION_WEIGHTS, then the usual places; weights.find_weights). batch_size: images per forward
        (None: 64 on the cuda backend, 8 elsewhere). precision: fp32, tf32, fp16 or auto. workers: decode workers
        (default: one per usable CPU), threads or processes (worker_kind; auto: processes for long runs). decode:
        "cpu" (Pillow: torchvision's preprocessing exactly) or "gpu" (JPEGs decoded by nvImageCodec and resized on
        the GPU as Pillow does; cuda backend only, needs the gpu-decode extra). max_pixels: the most pixels an image
        may declare (None: $INCEPTION_MAX_PIXELS, else Pillow's 89,478,485). resize: whose preprocessing,
        "torchvision", "pytorch-fid" or "clean-fid" (None: the weight file's network's; ingest/fid_resize.py). The
        arguments make an EngineConfig,
        which checks them all before the weights are read; ``Engine.from_config`` takes one already made."""
        self._start(EngineConfig(weights, backend, precision, batch_size, workers, worker_kind, decode, max_pixels,
                                 resize))

    @classmethod
    def from_config(cls, config: EngineConfig, resolved: Resolved | None = None) -> Engine:
        """The engine ``config`` describes; ``resolved``: what ``config.resolve`` gave this process already."""
        engine = cls.__new__(cls)
        engine._start(config, resolved)
        return engine

    def _start(self, config: EngineConfig, resolved: Resolved | None = None) -> None:
        # --decode gpu's jpeg_batch.c decoder (jpeg_decode.NativeStart): nvImageCodec's start, the longest part of
        # the engine's, opens on a thread of its own from here, beside the GPU probe and the weights
        self._decoder_start: Any = open_decoder_early(config)
        try:
            resolved = resolved or resolve(config)
            if config.decode == "gpu" and self._decoder_start is None:
                from .ingest.jpeg_decode import check_gpu_decode  # on use, as in open_decoder_early

                check_gpu_decode()  # a missing nvImageCodec is said now, not at the first batch
            self.weights = (config.weights if isinstance(config.weights, Weights) else
                            load_weights(config.weights_path))
        except BaseException:
            if self._decoder_start is not None:
                self._decoder_start.close()
            raise
        self.config = config
        self.notes: list[str] = list(resolved.notes)  # fallbacks taken, one line each (the CLI prints them)
        # called with each note as it is taken, also those taken after construction (the CLI: print on stderr)
        self.on_note: Callable[[str], None] | None = None
        self._backend_name = resolved.backend_name
        self.backend_class = resolved.backend_class
        self._precision = resolved.precision
        self.decode = config.decode
        self.batch_size = resolved.batch_size
        self.preprocess = Preprocess.from_manifest(self.weights.manifest, config.max_pixels, config.resize)
        self.model = self.weights.model_id()  # what every result names the weights by
        # the classes' names follow the network: the FID network's are not shipped, so they are numbered
        self.labels: Labels = network_labels(self.weights.network)
        if self.weights.network == "fid":
            self.notes.append(NUMBERED_NOTE)
        if self._backend_name == "cpu" and (note := cpu_kernels.numpy_code_note()) is not None:
            self.notes.append(note)  # also builds the kernels once here, as the backend would at the first forward
        if self.preprocess.mode == "pytorch-fid" and self.decode != "gpu" and fid_library() is None:
            self.notes.append(PILLOW_FID_RESIZE_NOTE)  # also builds the library once here, before the decode workers
        self.pipeline = PipelineOptions(workers=config.workers, worker_kind=config.worker_kind)
        self._backends: dict[int, tuple[dict[str, Any], Any]] = {}  # batch -> (its options, backend), on first use
        self._pixel_runner: Runner | None = None  # classify_pixels's, kept between calls

    @property
    def backend_name(self) -> str:
        """The backend every forward runs on: "cpu", "cuda", "cudnn" or "torch" ("auto" resolved)."""
        return self._backend_name

    @property
    def precision(self) -> str:
        """The precision every forward computes in: "fp32", "tf32" or "fp16" ("auto" resolved)."""
        return self._precision

    def facts(self) -> EngineFacts:
        """Its backend, precision, batch size, weight file and the notes taken so far."""
        return EngineFacts(self._backend_name, self._precision, self.batch_size, self.weights.path, tuple(self.notes),
                           self.model, self.weights.network)

    def _note_once(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)
            if self.on_note is not None:
                self.on_note(note)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._decoder_start is not None:  # opened for a run that never came
            self._decoder_start.close()
            self._decoder_start = None
        if self._pixel_runner is not None:
            self._pixel_runner.close()
            self._pixel_runner = None
        for _, b in self._backends.values():
            b.close()
        self._backends.clear()

    def backend_for(self, batch: int, tune: bool | str = True) -> Any:
        """The backend instance for plans of ``batch`` images. tune (cuda): measure each conv's kernel (True), or
        take the cached tuning or the cost model ("cached")."""
        options = dict(backends.DEFAULT_OPTIONS.get(self._backend_name, {}))
        if "tune" in options:
            options["tune"] = tune
        if hasattr(self.backend_class, "PRECISIONS"):
            options["precision"] = self._precision
        if batch in self._backends and not serves(self._backends[batch], options):
            _, old = self._backends.pop(batch)  # e.g. a long run after a short one on the cost model's kernels
            if getattr(self._pixel_runner, "backend", None) is old:  # classify_pixels's runner must not outlive it
                self._pixel_runner.close()  # type: ignore[union-attr]
                self._pixel_runner = None
            old.close()
        if batch not in self._backends:
            plan = build_plan(batch, self.weights.layers(), input_size=self.preprocess.size)
            self._backends[batch] = (options, self.backend_class(self.weights, plan, **options))
        return self._backends[batch][1]

    def forward(self, x: np.ndarray, features: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """(N, 3, size, size) float32 normalised images -> (N, classes) float32 logits, any N >= 1; with
        ``features``, (logits, (N, 2048) float32 pool features) from the same forward."""
        s = self.preprocess.size
        x = np.asarray(x)
        if x.ndim != 4 or x.shape[1:] != (3, s, s) or x.shape[0] < 1:
            raise EngineError(f"input must have shape (N, 3, {s}, {s}), got {x.shape}")
        if features:
            self.check_features()
        x = np.ascontiguousarray(x, dtype=np.float32)
        chunks = (x[i:i + self.batch_size] for i in range(0, len(x), self.batch_size))
        if not features:
            return np.concatenate([self.backend_for(len(c)).forward(c) for c in chunks], axis=0)
        pairs = [self.backend_for(len(c)).forward(c, features=True) for c in chunks]
        return np.concatenate([p[0] for p in pairs], axis=0), np.concatenate([p[1] for p in pairs], axis=0)

    def check_features(self) -> None:
        """OptionError where this engine's backend cannot return features beside the logits."""
        if not getattr(self.backend_class, "FEATURES", False):
            raise OptionError("backend", self._backend_name, "returns no features; the cpu and cuda backends do")

    def run_batch(self, n_images: int) -> int:
        """The batch size of a run of ``n_images``: the engine's, or all of them where they are fewer."""
        return max(1, min(self.batch_size, n_images))

    def runner(self, n_images: int, features: bool = False, decode_chains: int | None = None,
               gpu_resize: bool = False) -> Runner:
        """The pipeline's runner for a run of ``n_images``: one batch size, tuned only for long runs; with
        ``features``, one that keeps each batch's pool features (``features_of``); a cuda runner decoding on the GPU
        with ``decode_chains`` decode calls in flight (None: jpeg_decode.DECODE_CHAINS); ``gpu_resize``: a cuda
        runner that resizes host-decoded FID images itself (its ``ring_pre``: the streaming pipeline's)."""
        batch = self.run_batch(n_images)
        tune: bool | str = True if measures_in_run(n_images) else "cached"
        if features:
            self.check_features()
        if self._backend_name != "cuda":
            return HostRunner(self.forward, batch, self.preprocess, features)
        started, self._decoder_start = self._decoder_start, None  # the first runner's decoder, opened at start
        try:
            return self._cuda_runner(batch, tune, started, features, decode_chains, gpu_resize)
        finally:
            if started is not None:
                started.close()  # nothing left to close where the runner's decoder took it

    def _cuda_runner(self, batch: int, tune: bool | str, started: Any, features: bool = False,
                     decode_chains: int | None = None, gpu_resize: bool = False) -> Runner:
        from .cuda_runner import CudaRunner  # on use: it loads the CUDA backend's package

        backend = self.backend_for(batch, tune)
        if getattr(backend, "tuning_source", None) == "model":
            self._note_once(f"no tuning table for {backend.gpu.device.name()} ({self.precision}, batch {batch}): "
                            f"running the cost model's kernels; `inception-tune --precisions {self.precision} "
                            f"--batch-sizes {batch}` measures the fastest once (~20 s)")
        runner = CudaRunner(backend, self.preprocess, gpu_decode=self.decode == "gpu",
                            decode_threads=self.pipeline.workers or 0, started=started, features=features,
                            decode_chains=decode_chains, gpu_resize=gpu_resize)
        if runner.decode_fallback is not None:
            self._note_once(f"--decode gpu reads and decodes through nvImageCodec's Python API, about half as fast: "
                            f"cuda_src/jpeg_batch.c is unavailable ({runner.decode_fallback})")
        return runner

    def predict_iter(self, images: Sequence[ImageSource], top_k: int = 5,
                     on_progress: Callable[[int], None] | None = None, render: str | None = None,
                     on_features: OnFeatures | None = None) -> Iterator[Prediction | Rendered]:
        """Classify images (paths or PIL images), yielding one Prediction per image in order as batches finish. A
        file that cannot be read gets a Prediction with ``error`` set; the others still run, and carry the
        engine's ``backend`` and ``precision``. ``on_progress(n)`` is called as each n images finish. Host memory
        stays at a few batches of images however many there are. ``render`` ("jsonl" or "csv"): each classified
        image comes as its line of such a file instead (output.Rendered, the bytes ResultFile writes), made a batch
        at a time from the top-k, with no Prediction in between (an unreadable file stays a Prediction).
        ``on_features(indices, rows)``: called as each batch finishes, before its results come, with the input
        indices of the images it classified and their (len, 2048) float32 pool features, from the same forward as
        the logits (``features`` gathers them into one array)."""
        if not 1 <= top_k <= self.classes:
            raise OptionError("top_k", top_k, f"must be between 1 and {self.classes}")
        if not images:
            return
        by = (self._backend_name, self._precision, self.model.name)
        finish = line_renderer(render, top_k, by, self.labels) if render else predictions_by(by, self.labels)
        n = len(images)
        if self.decode != "gpu" and decode_plan(n, self.run_batch(n), self.pipeline)[2] == "process":
            start_forkserver()  # the decode processes' start-up, beside the runner's
        runner = self.runner(n, features=on_features is not None, gpu_resize=True)
        stream = (classify_encoded(images, runner, top_k, by, finish, on_features) if self.decode == "gpu"
                  else classify(images, runner, top_k, self.pipeline, by, finish, on_features))
        try:
            for p in stream:
                if on_progress:
                    on_progress(1)
                yield p
        finally:
            # Closing this generator closes the pipeline now, with the engine still open: left to the garbage
            # collector, it could run after the backend was closed and print an ignored EngineError's traceback.
            stream.close()

    def features(self, images: Sequence[ImageSource], top_k: int = 5,
                 on_progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, list[Prediction]]:
        """(N, 2048) float32 pool features of ``images`` in their order (a row of NaN for a file that cannot be
        read) and each image's Prediction, from one forward. The array is in memory: for many images, give
        ``predict_iter`` an ``on_features`` that writes the rows away (inception-run --features does)."""
        self.check_features()
        out = np.full((len(images), self.feature_width), np.nan, np.float32)

        def keep(indices: list[int], rows: np.ndarray) -> None:
            out[indices] = rows
        preds = list(self.predict_iter(images, top_k, on_progress, on_features=keep))
        return out, preds  # type: ignore[return-value]

    @property
    def feature_width(self) -> int:
        """Features per image: the channels the global average pool averages (2048)."""
        return next(l.in_features for l in self.weights.layers() if isinstance(l, arch.FC))

    @property
    def classes(self) -> int:
        """The classifier's classes: 1000 (torchvision's), 1008 (the FID network's)."""
        return next(l.out_features for l in self.weights.layers() if isinstance(l, arch.FC))

    def classify_pixels(self, pixels: np.ndarray, top_k: int = 5) -> list[list[tuple[int, str, float]]]:
        """Top-k per image of already decoded images: (N, size, size, 3) uint8 RGB as images.decode_u8 returns
        them (for callers that decode elsewhere, such as Ray Data's workers). Batches of ``batch_size``; the
        runner is kept for the next call."""
        s = self.preprocess.size
        if pixels.ndim != 4 or pixels.shape[1:] != (s, s, 3) or pixels.dtype != np.uint8:
            raise EngineError(f"pixels must be (N, {s}, {s}, 3) uint8, got {pixels.shape} {pixels.dtype}")
        if not 1 <= top_k <= self.classes:
            raise OptionError("top_k", top_k, f"must be between 1 and {self.classes}")
        runner, out = self.prepare_pixels(), []
        for i in range(0, len(pixels), runner.batch):
            chunk = pixels[i:i + runner.batch]
            runner.attach(HostRing.wrapping(chunk))
            out += [labelled(top, self.labels) for top in runner.result(runner.submit(list(range(len(chunk))), top_k))]
        return out

    def prepare_pixels(self) -> Runner:
        """classify_pixels's runner (backend, kernels, CUDA graph), built now if it is not yet: a caller that
        starts before its first images arrive, such as a Ray actor, sets up while they are being decoded instead
        of at the first batch."""
        if self.preprocess.mode != "torchvision":
            raise EngineError(f"classify_pixels takes the classifier's uint8 pixels; the {self.preprocess.mode} "
                              f"preprocessing decodes to the network's input (Preprocess.decoded_shape): use "
                              f"predict with the image files, or forward")
        if self._pixel_runner is None:
            self._pixel_runner = self.runner(self.batch_size)
        return self._pixel_runner

    def predict(self, images: Sequence[ImageSource], top_k: int = 5,
                on_progress: Callable[[int], None] | None = None) -> list[Prediction]:
        """``predict_iter`` as a list."""
        return list(self.predict_iter(images, top_k, on_progress))
