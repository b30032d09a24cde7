"""Ray's overhead on one GPU: images/s through Ray Data with one GPU actor against Engine.predict_iter (what
inception-run runs), on the same folder of images.

    python scripts/bench_ray.py DIR [--weights W] [--precision auto] [--batch-size 64] [--gpus 1]

Both are timed from a cold engine (weights loaded, runner built; kernels from the cache) to the last result, after
one untimed run of each to fill the nvcc and tuning caches; Ray's includes starting the actor, reading the files
through Ray Data, the decode tasks on the other CPUs and materialising the results. The gap is Ray's cost.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from inception_engine.engine import Engine
from inception_engine.images import image_extensions
from inception_engine.ray_data import classify_dataset, read_images, require_ray
from inception_engine.weights import find_weights, load_weights


def engine_rate(paths: list[str], weights: object, backend: str, precision: str, batch_size: int) -> float:
    t0 = time.perf_counter()
    with Engine(weights, backend=backend, batch_size=batch_size, precision=precision) as engine:
        n = sum(1 for p in engine.predict_iter(paths) if p.ok)
    return n / (time.perf_counter() - t0)


def ray_rate(folder: str, weights_ref: object, backend: str, precision: str, batch_size: int,
             gpus: int) -> tuple[float, str]:
    """Images/s, and Ray Data's per-operator stats of the run (where its time went)."""
    t0 = time.perf_counter()
    ds = read_images(folder)  # as inception-run --ray reads
    rows = classify_dataset(ds, weights_ref, gpus=gpus, backend=backend, precision=precision,
                            batch_size=batch_size).materialize()
    n = rows.filter(lambda r: r["error"] == "").count()
    return n / (time.perf_counter() - t0), rows.stats()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--weights")
    ap.add_argument("--backend", default="cuda", help="cpu: a smoke test of the script on a machine without a GPU")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--gpus", type=int, default=1, help="GPU actors for the Ray run (the engine uses one GPU); "
                    "0 with --backend cpu")
    args = ap.parse_args()
    exts = image_extensions()
    paths = sorted(str(p) for p in Path(args.folder).iterdir() if p.suffix.lower() in exts)
    weights = load_weights(find_weights(args.weights))
    ray = require_ray()
    ray.init(include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ref = ray.put(weights)
    engine_rate(paths, weights, args.backend, args.precision, args.batch_size)  # untimed: caches
    ray_rate(args.folder, ref, args.backend, args.precision, args.batch_size, args.gpus)
    direct = engine_rate(paths, weights, args.backend, args.precision, args.batch_size)
    rows = []
    for reserve in (True, False):
        # Ray Data reserves part of the cluster for each operator (op_resource_reservation_*), which can hold the
        # decode stage to a fraction of the CPUs: measured both ways, the same run
        ctx.op_resource_reservation_enabled = reserve
        rate, stats = ray_rate(args.folder, ref, args.backend, args.precision, args.batch_size, args.gpus)
        print(f"--- Ray Data stats, op_resource_reservation_enabled={reserve}\n{stats}")
        rows.append((f"Ray Data ({args.gpus} GPU actors), reservation {'on' if reserve else 'off'}:", rate))
    print(f"{len(paths)} images, batch {args.batch_size}, precision {args.precision}")
    print(f"Engine.predict_iter ({args.backend}): {direct:8.0f} images/s")
    for label, rate in rows:
        print(f"{label:44} {rate:8.0f} images/s" + (f", Ray's overhead {100 * (1 - rate / direct):.1f} % "
                                                    f"(target: under 15 %)" if args.gpus <= 1 else ""))
    ray.shutdown()


if __name__ == "__main__":
    main()
