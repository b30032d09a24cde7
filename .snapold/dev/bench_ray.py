"""Ray's overhead on one GPU: images/s through Ray Data with one GPU actor against Engine.predict_iter (what
inception-run runs), on the same folder of images, and the floors of Ray's own machinery.

    python dev/bench_ray.py DIR [--weights W] [--precision auto] [--batch-size 64] [--gpus 1] [--repeats 2]

Both are timed from a cold engine (weights loaded, runner built; kernels from the cache) to the last result, after
one untimed run of each on a few hundred of the files to fill the nvcc and tuning caches; Ray's includes starting
the actor, reading and decoding the files in Ray Data's read tasks on the other CPUs, and writing the JSON lines as
inception-run --ray does.
The gap is Ray's cost. Two floors show how much of it no predictor of ours could remove: the same Ray job with an
actor that takes the GPU but classifies nothing, with the decode stage (read + decode) and without it (read only).
Rows alternate, ``--repeats`` times, so that the machine's drift touches each alike.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from inception_engine.engine import Engine
from inception_engine.ingest.entries import image_extensions
from inception_engine.ray_data import classify_dataset, decode_images, jsonl_datasink, read_images, require_ray
from inception_engine.model_files import load_weights
from inception_engine.weights import find_weights

WARM_FILES = 512  # the untimed runs: enough batches to load and capture everything a timed run uses


def engine_rate(paths: list[str], weights: object, backend: str, precision: str, batch_size: int) -> float:
    t0 = time.perf_counter()
    with Engine(weights, backend=backend, batch_size=batch_size, precision=precision) as engine:
        n = sum(1 for p in engine.predict_iter(paths) if p.ok)
    return n / (time.perf_counter() - t0)


def ray_rate(paths: list[str], weights_ref: object, backend: str, precision: str, batch_size: int,
             gpus: int) -> tuple[float, str]:
    """Images/s, and Ray Data's per-operator stats of the run (where its time went). Read, classified and written
    as JSON lines as inception-run --ray does (run_ray), into a temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rows = classify_dataset(read_images(paths), weights_ref, gpus=gpus, backend=backend, precision=precision,
                                batch_size=batch_size)
        sink = jsonl_datasink(f"{tmp}/out")
        rows.write_datasink(sink)
        seconds = time.perf_counter() - t0
    return (sink.images - sink.errors) / seconds, rows.stats()


class IdleActor:
    """Holds a GPU (or a CPU) like InceptionPredictor and returns one small column, classifying nothing."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"path": batch["path"]}


def floor_rate(paths: list[str], weights_ref: object, batch_size: int, gpus: int, decode: bool) -> float:
    """Images/s of the same job with IdleActor in place of the predictor: Ray's reading (and decode tasks)."""
    t0 = time.perf_counter()
    ds = read_images(paths)
    if decode:
        ds = decode_images(ds, weights_ref)
    rows = ds.map_batches(IdleActor, batch_size=batch_size, batch_format="numpy", concurrency=max(gpus, 1),
                          num_gpus=1 if gpus else 0, num_cpus=1).materialize()
    n = rows.count()
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--weights")
    ap.add_argument("--backend", default="cuda", help="cpu: a smoke test of the script on a machine without a GPU")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--gpus", type=int, default=1, help="GPU actors for the Ray run (the engine uses one GPU); "
                    "0 with --backend cpu")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    exts = image_extensions()
    paths = sorted(str(p) for p in Path(args.folder).iterdir() if p.suffix.lower() in exts)
    weights = load_weights(find_weights(args.weights))
    ray = require_ray()
    ray.init(include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    ref = ray.put(weights)
    warm = paths[:WARM_FILES]
    with Engine(weights, backend=args.backend, batch_size=args.batch_size, precision=args.precision) as engine:
        if engine.backend_name == "cuda":  # a long timed run would tune first, inside its timing; Ray's actor
            engine.backend_for(args.batch_size, tune=True)  # takes the tuning cache: both get the measured kernels
    engine_rate(warm, weights, args.backend, args.precision, args.batch_size)  # untimed: caches, worker processes
    ray_rate(warm, ref, args.backend, args.precision, args.batch_size, args.gpus)
    rates: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        rates.setdefault("engine", []).append(engine_rate(paths, weights, args.backend, args.precision,
                                                          args.batch_size))
        rate, stats = ray_rate(paths, ref, args.backend, args.precision, args.batch_size, args.gpus)
        rates.setdefault("ray", []).append(rate)
        rates.setdefault("floor_decode", []).append(floor_rate(paths, ref, args.batch_size, args.gpus, True))
        rates.setdefault("floor_read", []).append(floor_rate(paths, ref, args.batch_size, args.gpus, False))
    print(f"--- Ray Data stats of the last run\n{stats}")
    direct = statistics.median(rates["engine"])
    print(f"{len(paths)} images, batch {args.batch_size}, precision {args.precision}, {args.repeats} alternated runs "
          f"(median; all runs in brackets)")

    def line(label: str, key: str) -> None:
        r = statistics.median(rates[key])
        runs = ", ".join(f"{v:.0f}" for v in rates[key])
        gap = "" if key == "engine" else f", Ray's overhead {100 * (1 - r / direct):+5.1f} % (target: under 15 %)"
        print(f"{label:46} {r:8.0f} images/s [{runs}], {len(paths) / r:6.2f} s{gap}")

    line(f"Engine.predict_iter ({args.backend}):", "engine")
    line(f"Ray Data ({args.gpus} GPU actors):", "ray")
    line("Ray floor: read + decode tasks + idle actor:", "floor_decode")
    line("Ray floor: read + idle actor:", "floor_read")
    ray.shutdown()


if __name__ == "__main__":
    main()
