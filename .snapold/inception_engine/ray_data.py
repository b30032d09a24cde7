"""Classify a dataset on many GPUs and machines: the engine as a stage of Ray Data.

    import ray
    from inception_engine.ray_data import classify_dataset

    ray.init()                                                    # or ray.init("ray://head:10001")
    ds = ray.data.read_binary_files("s3://bucket/photos/", include_paths=True)  # or read_images(...): see there
    classify_dataset(ds, "weights/inception_v3.npz", gpus=8).write_parquet("s3://bucket/labels/")

Two stages, Ray's usual split for batch inference: ``decode_batch`` runs in Ray's read tasks on the CPUs of every
node (Ray fuses it into the read: bytes -> the (size, size, 3) uint8 pixels the engine's pipeline decodes,
torchvision's resize and crop), and
``InceptionPredictor`` runs as a pool of actors, one per GPU, each holding one Engine (weights loaded once, the cuda
runner kept between batches) and returning the top-k of each row. An image that cannot be decoded is a row with
``error`` set, never a failed job. ``run_ray`` is ``inception-run --ray``: the same, written as JSON lines in
inception-run's format.

Ray is imported here only inside functions: ``InceptionPredictor`` and ``decode_batch`` are plain Python that Ray
ships to its workers, and a machine without Ray gets one line saying what to install (``require_ray``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import DEFAULT_BATCH_GPU, EngineConfig, RunConfig, pixel_limit
from .engine import Engine, load
from .errors import EngineError, OptionError
from .ingest.entries import image_extensions
from .ingest.images import Preprocess
from .ingest.inputs import expand_inputs, list_directory
from .ingest.workers import decode_into
from .output import jsonl_bytes
from .results import Prediction
from .weights import Weights

Batch = dict[str, np.ndarray]
NO_RAY = "--ray needs Ray Data: pip install -e '.[ray]'"
# Each read block is decoded whole, in the read task itself (Ray fuses a map_batches without a batch_size into the
# read before it): one task reads and decodes its files, and the JPEG bytes never pass through the object store.
# With a batch_size Ray keeps the two stages apart, which is slower (docs/PERFORMANCE.md).
DECODE_BATCH = None

# Engines built by predictors in this process. Ray Data keeps each actor's predictor for the whole job, so on an
# actor this stays 1 however many batches it classifies (the tests read it through ``diagnostics``).
_engines_built = 0


def require_ray() -> Any:
    """The ``ray`` module with Ray Data importable, or the one-line EngineError saying how to get it."""
    try:
        import ray
        import ray.data  # noqa: F401  (needs pyarrow and pandas: plain `pip install ray` lacks them)
    except ImportError:
        raise EngineError(NO_RAY) from None
    return ray


# ------------------------------------------------------------------------------------------------------ decoding

def decode_batch(batch: Batch, pre: Preprocess) -> Batch:
    """Ray's ``read_binary_files(..., include_paths=True)`` rows ("bytes", "path") -> "path", "pixels" (uint8,
    zeros where the image failed) and "error" ("" or the one-line reason)."""
    paths = batch["path"]
    pixels = np.zeros((len(paths), *pre.decoded_shape), pre.pixel_dtype)
    errors = np.full(len(paths), "", dtype=object)
    for i, (data, path) in enumerate(zip(batch["bytes"], paths)):
        errors[i] = decode_into(pixels, i, str(path), pre, data) or ""
    return {"path": paths, "pixels": pixels, "error": errors}


# ---------------------------------------------------------------------------------------------------- classifying

class InceptionPredictor:
    """A callable class for ``Dataset.map_batches``: Ray builds one per actor and calls it batch after batch.

    Takes rows of "path" and either "pixels" (decode_batch's output: the fast way, decoding on CPU tasks) or
    "bytes" (read_binary_files's, decoded here: one stage, simpler, slower on a GPU actor). Returns "path",
    "error" ("" when classified), and "top_index", "top_label", "top_prob" (lists of top_k, most likely first;
    empty for errors), "backend", "precision" and "model" (what the actor's engine computes with; "" for
    errors). weights: a path, a Weights (e.g. a ray.put of one: fetched once per node, not read from each node's
    disk) or None for the usual places. diagnostics adds "worker" (host:pid) and "engines_built"
    (predictors built in that process so far) to every row."""

    def __init__(self, weights: str | os.PathLike | Weights | Any | None = None, backend: str = "auto",
                 precision: str = "auto", batch_size: int = 64, top_k: int = 5, diagnostics: bool = False):
        global _engines_built
        # Ray Data passes constructor arguments as they are: an ObjectRef arrives as one
        self.engine = Engine(resolve_weights(weights), backend=backend, batch_size=batch_size, precision=precision)
        # Ray Data starts the actors with the job, so the GPU set-up (kernels, CUDA graph) overlaps the reading
        # and decoding of the first blocks instead of waiting for the first batch
        self.engine.prepare_pixels()
        _engines_built += 1
        self.top_k = top_k
        self.worker = f"{os.uname().nodename}:{os.getpid()}" if diagnostics else None

    def __call__(self, batch: Batch) -> Batch:
        if "pixels" not in batch:
            batch = decode_batch(batch, self.engine.preprocess)
        errors = batch["error"]
        ok = np.flatnonzero(errors == "")
        tops: list[list[tuple[int, str, float]]] = [[] for _ in errors]
        if len(ok):
            pixels = batch["pixels"] if len(ok) == len(errors) else batch["pixels"][ok]  # no copy when all decoded
            for i, top in zip(ok, self.engine.classify_pixels(pixels, self.top_k)):
                tops[i] = top
        out = {"path": batch["path"], "error": errors,
               "top_index": column([[i for i, _, _ in t] for t in tops]),
               "top_label": column([[label for _, label, _ in t] for t in tops]),
               "top_prob": column([[p for _, _, p in t] for t in tops]),
               "backend": np.where(errors == "", self.engine.backend_name, "").astype(object),
               "precision": np.where(errors == "", self.engine.precision, "").astype(object),
               "model": np.where(errors == "", self.engine.model.name, "").astype(object)}
        if self.worker is not None:
            out["worker"] = np.full(len(errors), self.worker, dtype=object)
            out["engines_built"] = np.full(len(errors), _engines_built)
        return out


def column(lists: list[list[Any]]) -> np.ndarray:
    """A 1-D object array of lists (Ray stores it as an Arrow list column; np.array would make it 2-D)."""
    a = np.empty(len(lists), dtype=object)
    a[:] = lists
    return a


def resolve_weights(weights: str | os.PathLike | Weights | Any | None) -> Weights:
    """Weights however they are given: a path (None: the usual places), Weights, or an ObjectRef of Weights (on
    the node that holds it this maps the arrays, no copy)."""
    if weights is None or isinstance(weights, (str, os.PathLike, Weights)):
        return load(weights)
    return require_ray().get(weights)


def preprocess_of(weights: str | os.PathLike | Weights | Any | None) -> Preprocess:
    """The decode stage's settings (input size, resize) from the weights' manifest, however they are given."""
    return Preprocess.from_manifest(resolve_weights(weights).manifest, pixel_limit(None))


READ_BLOCKS_PER_CPU = 4  # read tasks per cluster CPU (see read_images)
FILES_PER_READ_TASK = 256  # at most, where the files can be counted: a task's decoded block is then <= ~70 MB


def read_images(sources: str | list[str], recursive: bool = True) -> Any:
    """``ray.data.read_binary_files(sources, include_paths=True)`` for the image extensions, in at least
    READ_BLOCKS_PER_CPU read tasks per CPU of the cluster, and for local files at most FILES_PER_READ_TASK files a
    task. classify_dataset decodes each task's block whole, in the task, so the cap bounds a task's memory (256 crops
    of 299x299x3 bytes: 69 MB). Local sources are listed here, once, and Ray is handed the files; remote ones (URIs)
    Ray lists, and their blocks are only cut at Ray's target block size (DataContext.target_max_block_size) of file
    bytes. Ray's default cut a folder into tasks of a dozen files or so, and the decode stage then ran at 290
    images/s where 24 tasks gave 480-510 (2,048 JPEGs, 6 Ray CPUs on a 2-core machine, decode only).
    recursive=False: directories' top level only (inputs.list_directory for local ones, a listing of the URI's top
    level for the others), as inception-run without --recursive."""
    ray = require_ray()
    exts = image_extensions()
    blocks = max(1, READ_BLOCKS_PER_CPU * int(ray.cluster_resources().get("CPU", 1)))
    sources = [sources] if isinstance(sources, str) else sources
    if not recursive:
        given, sources = sources, [s for src in sources for s in top_level_files(src, exts)]
        if not sources:
            raise EngineError(f"no image files at the top level of {', '.join(given)} (subfolders are searched "
                              f"only when recursive)")
    files = local_image_files(sources, exts)
    if files:  # an empty listing goes to Ray as given, which says what it found nothing in
        sources, blocks = files, max(blocks, -(-len(files) // FILES_PER_READ_TASK))
    return ray.data.read_binary_files(sources, include_paths=True, file_extensions=sorted(e.lstrip(".") for e in exts),
                                      override_num_blocks=blocks)


def local_image_files(sources: list[str], exts: set[str]) -> list[str] | None:
    """The files with these extensions that the sources name or hold, or None where a source is no local path (a
    URI, say). Directories are listed as inception-run --recursive lists them (inputs.list_directory)."""
    files: list[str] = []
    for src in sources:
        if os.path.isfile(src):
            files.append(src)
        elif os.path.isdir(src):
            files += list_directory(src, True, exts).files
        else:
            return None
    return files


def top_level_files(source: str, exts: set[str]) -> list[str]:
    """A directory's (local or URI) image files at its top level; any other source as it is."""
    if os.path.isdir(source):
        return list_directory(source, False, exts).files
    if os.path.exists(source) or "://" not in source:
        return [source]
    from pyarrow import fs  # Ray Data's own filesystem layer

    filesystem, path = fs.FileSystem.from_uri(source)
    if filesystem.get_file_info(path).type != fs.FileType.Directory:
        return [source]
    scheme = source.split("://", 1)[0]
    entries = filesystem.get_file_info(fs.FileSelector(path, recursive=False))
    return sorted(f"{scheme}://{e.path}" for e in entries if e.type == fs.FileType.File
                  and not e.base_name.startswith(".") and os.path.splitext(e.base_name)[1].lower() in exts)


def decode_images(ds: Any, weights: str | os.PathLike | Weights | Any | None = None) -> Any:
    """classify_dataset's first stage: rows of "bytes" and "path" -> decode_batch's "path", "pixels", "error", in
    the read tasks (DECODE_BATCH); the input size and resize from the weights' manifest."""
    return ds.map_batches(decode_batch, fn_kwargs={"pre": preprocess_of(weights)}, batch_size=DECODE_BATCH,
                          batch_format="numpy")


def classify_dataset(ds: Any, weights: str | os.PathLike | Weights | Any | None = None, *, gpus: int = 1,
                     backend: str = "auto", precision: str = "auto", batch_size: int = 64, top_k: int = 5,
                     cpu_actors: int = 1, actor_cpus: float = 1.0, diagnostics: bool = False) -> Any:
    """Decode in the read tasks, classify on ``gpus`` GPU actors (``gpus=0``: ``cpu_actors`` actors on the cpu
    backend, each reserving ``actor_cpus`` CPUs; leave CPUs over for the decode tasks or they never run). ``ds``:
    rows of "bytes" and "path", as ``ray.data.read_binary_files(..., include_paths=True)`` gives. weights: a path
    every node can read, a Weights, or an ObjectRef of one (``ray.put``). Returns the lazy Dataset of
    InceptionPredictor's columns; write it with write_parquet / write_json or ``jsonl_datasink``."""
    if gpus < 0 or cpu_actors < 1:
        raise EngineError(f"need gpus >= 0 and cpu_actors >= 1, got {gpus} and {cpu_actors}")
    decoded = decode_images(ds, weights)
    if gpus == 0 and backend == "auto":
        backend = "cpu"  # an actor that reserved no GPU must not pick one up through auto
    predictor = {"weights": weights, "backend": backend, "precision": precision, "batch_size": batch_size,
                 "top_k": top_k, "diagnostics": diagnostics}
    resources = {"num_gpus": 1, "num_cpus": 1} if gpus else {"num_gpus": 0, "num_cpus": actor_cpus}
    return decoded.map_batches(InceptionPredictor, fn_constructor_kwargs=predictor, batch_size=batch_size,
                               batch_format="numpy", concurrency=gpus or cpu_actors, **resources)


# --------------------------------------------------------------------------------------------------------- output

def rows_as_predictions(batch: Batch) -> list[Prediction]:
    """A batch of InceptionPredictor's columns as the Predictions inception-run writes."""
    preds = []
    for i, path in enumerate(batch["path"]):
        error = str(batch["error"][i])
        if error:
            preds.append(Prediction(str(path), error=error))
        else:
            top = zip(batch["top_index"][i], batch["top_label"][i], batch["top_prob"][i])
            preds.append(Prediction(str(path), top=[(int(k), str(label), float(p)) for k, label, p in top],
                                    backend=str(batch["backend"][i]), precision=str(batch["precision"][i]),
                                    model=str(batch["model"][i]) if "model" in batch else None))
    return preds


def jsonl_datasink(path: str) -> Any:
    """A Ray Datasink writing files of inception-run's --output lines ({"image", "top"} or {"image", "error"})
    into the directory or URI ``path``; refuses one that holds data already. After ``write_datasink`` its
    ``images`` and ``errors`` say how many rows it wrote and how many of them were errors (counted by the write
    tasks, so that no second pass over the results is needed)."""
    ray = require_ray()
    from ray.data.block import BlockAccessor
    from ray.data.datasource import BlockBasedFileDatasink

    class JsonLinesDatasink(BlockBasedFileDatasink):
        def __init__(self, path: str):
            super().__init__(path, file_format="jsonl", mode=ray.data.SaveMode.CREATE)
            self.images = self.errors = 0

        def write(self, blocks: Any, ctx: Any) -> int:
            blocks = list(blocks)
            super().write(blocks, ctx)
            return sum(int((BlockAccessor.for_block(b).to_numpy("error") != "").sum()) for b in blocks)

        def write_block_to_file(self, block: BlockAccessor, file: Any) -> None:
            preds = rows_as_predictions(block.to_numpy())
            file.write(jsonl_bytes(preds))

        def on_write_complete(self, write_result: Any) -> None:  # on the driver, once every write task is done
            super().on_write_complete(write_result)
            self.images, self.errors = write_result.num_rows, sum(write_result.write_returns)

    return JsonLinesDatasink(path)


# ------------------------------------------------------------------------------------------------- inception-run

@dataclass(frozen=True)
class RayRun:
    images: int
    errors: int
    seconds: float
    actors: str  # e.g. "4 GPU actors", for the summary line


def run_ray(sources: list[str], output_dir: str, address: str | None = None, gpus: int | None = None,
            config: EngineConfig | None = None, top_k: int = 5, recursive: bool = True) -> RayRun:
    """``inception-run --ray``: classify the images of ``sources`` (files, directories, URIs Ray Data reads; with
    ``recursive`` the directories' subfolders too) with the engine ``config`` describes (None: the defaults)
    on the cluster at ``address`` (None: the running one, else a new local one) with ``gpus`` GPU actors (None:
    every GPU in the cluster; none there: one cpu-backend actor per node), writing JSON lines into
    ``output_dir``."""
    ray = require_ray()
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        raise EngineError(f"{output_dir} holds files already; give an empty or new directory")
    config = config or EngineConfig()
    w = load(config.weights)  # here, so an unreadable file is one line before any cluster starts
    started = not ray.is_initialized()  # a caller's own session (a notebook, the tests) is used as it is
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        have = int(ray.cluster_resources().get("GPU", 0))
        if gpus is None:
            gpus = have
        elif gpus > have and address in (None, "", "local") and not os.environ.get("RAY_ADDRESS"):
            # this machine's cluster cannot grow: Ray would wait for the missing GPUs forever. A remote cluster may
            # be autoscaling, so there the job is left to wait for them.
            raise OptionError("gpus", gpus, f"the local Ray cluster has {have} GPU{'s' * (have != 1)}; give "
                              + (f"{have} or fewer" if have else "0 (a cpu-backend actor)"))
        if gpus == 0 and config.backend in ("auto", "cpu") and config.precision not in ("auto", "fp32"):
            # said here, once, rather than by every actor's Engine inside the job
            raise OptionError("precision", config.precision, "a job without GPUs runs the cpu backend, which "
                              "computes in fp32 only; give fp32, or auto")
        nodes = sum(1 for n in ray.nodes() if n["Alive"])
        t0 = time.perf_counter()
        ds = read_images(sources, recursive)
        results = classify_dataset(ds, ray.put(w), gpus=gpus, backend=config.backend, precision=config.precision,
                                   batch_size=config.batch_size or DEFAULT_BATCH_GPU, top_k=top_k, cpu_actors=nodes)
        sink = jsonl_datasink(output_dir)
        results.write_datasink(sink)
        return RayRun(sink.images, sink.errors, time.perf_counter() - t0,
                      f"{gpus} GPU actor{'s' * (gpus != 1)}" if gpus else f"{nodes} CPU actor{'s' * (nodes != 1)}")
    finally:
        if started:
            ray.shutdown()


def run_on_ray(run: RunConfig) -> None:
    """inception-run's --ray branch (``run`` checked the options that exclude each other): run, print the summary,
    exit 1 if any image failed. Local inputs are listed as every inception-run lists them (ingest.inputs), notices
    and unusable arguments said on stderr; URIs (s3://...) are Ray Data's to list."""
    import click

    sources, unusable = list(run.images), []
    if not any("://" in src for src in run.images):
        listed = expand_inputs(run.images, run.recursive)
        for notice in listed.notices:
            click.echo(f"note: {notice}", err=True)
        sources = [path for path, err in listed.items if err is None]
        unusable = [err for _, err in listed.items if err is not None]
        for err in unusable:
            click.echo(f"error: {err}", err=True)
    assert run.output is not None and run.ray is not None
    if not sources:  # every argument unusable: no cluster to start
        raise click.exceptions.Exit(1)
    done = run_ray(sources, run.output, run.ray or None, run.gpus, run.engine, run.top_k, run.recursive)
    n, e = int(done.images) + len(unusable), int(done.errors) + len(unusable)  # Ray may count in numpy integers
    click.echo(f"{n} image{'s' * (n != 1)} ({e} error{'s' * (e != 1)}) in {done.seconds:.1f} s on {done.actors}, "
               f"{done.images / max(done.seconds, 1e-9):.0f} images/s -> {run.output}", err=True)
    if e:
        click.echo(f"error: {e} of {n} inputs could not be classified", err=True)
        raise click.exceptions.Exit(1)
