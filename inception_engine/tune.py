"""``inception-tune``: measure each conv's fastest kernel configuration on this GPU ahead of the runs that need it.

Runs take their configurations from this machine's tuning cache, else from the package's table for this GPU model
(``backends/cuda/tuning.py``), else from the cost model; they never stop to measure. This command fills the cache
for the precisions and batch sizes given, with a progress bar, and with ``--table FILE`` writes (or extends) a
table of them in the package's format: how the shipped tables are made, ``python -m inception_engine.tune --table
inception_engine/data/tuning/$(name).json`` on each GPU model.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from tqdm import tqdm

from .errors import EngineError
from .weights import Weights, atomic_write

PRECISIONS = ("fp32", "tf32", "fp16")
# inception-run's default batch (64), inception-bench's defaults (1, 8, 32, 128) and the CPU's (8)
BATCH_SIZES = (1, 8, 32, 64, 128)


def tune(weights: Weights, precisions: tuple[str, ...], batch_sizes: tuple[int, ...], table: Path | None,
         show: bool = True) -> list[tuple[str, int, str, float]]:
    """Measure every (precision, batch) on GPU 0 (into the tuning cache); with ``table``, write them there too.
    Returns (precision, batch, where the configs came from, seconds) per pair."""
    import json

    from .backends.cuda import CudaBackend
    from .backends.cuda.device import probe
    from .backends.cuda.tuning import add_to_table, shape_key
    from .plan import build_plan

    device, arch = probe()
    name = device.name()
    done: list[tuple[str, int, str, float]] = []
    command = "python -m inception_engine.tune " + " ".join(
        [f"--precisions {','.join(precisions)}", f"--batch-sizes {','.join(map(str, batch_sizes))}", "--table FILE"])
    with tqdm(total=len(precisions) * len(batch_sizes), desc="tuning", unit="set", file=sys.stderr,
              disable=not show, dynamic_ncols=True) as bar:
        for precision in precisions:
            for batch in batch_sizes:
                bar.set_postfix_str(f"{precision}, batch {batch}")
                t0 = time.perf_counter()

                def step(i: int, n: int, what: str = f"{precision}, batch {batch}") -> None:
                    bar.set_postfix_str(f"{what}: candidate {i}/{n}")

                plan = build_plan(batch, weights.layers(), input_size=weights.manifest["input"]["size"])
                with CudaBackend(weights, plan, precision=precision, tune="fresh" if table else True,
                                 tune_progress=step) as b:
                    if table is not None:
                        key = shape_key(b.plan, precision, b.fixup, b.winograd, b.nhwc)
                        entry = add_to_table(table, name, arch, b.gpu.num_sms, key, precision, batch, b.configs,
                                             command)
                        atomic_write(table, lambda f, t=entry: f.write((json.dumps(t, indent=1) + "\n").encode()))
                    done.append((precision, batch, b.tuning_source, time.perf_counter() - t0))
                bar.update(1)
    return done


def int_tuple(value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value!r}: batch sizes are at least 1")
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--precisions", default=",".join(PRECISIONS), show_default=True,
              help="comma-separated: fp32, tf32, fp16")
@click.option("--batch-sizes", default=",".join(map(str, BATCH_SIZES)), show_default=True,
              help="comma-separated batch sizes")
@click.option("--weights", "weights_path", help="weight file (default: the run's search order; else synthetic "
              "weights, which time the same)")
@click.option("--table", type=click.Path(dir_okay=False, path_type=Path),
              help="also write the measured configs as a tuning table (the package's format) to this file")
def tune_cmd(precisions: str, batch_sizes: str, weights_path: str | None, table: Path | None) -> None:
    """Measure the fastest kernels of every conv on this GPU now, so that no run waits for it."""
    from .model_files import load_weights
    from .weights import find_weights

    wanted = tuple(p.strip() for p in precisions.split(","))
    bad = [p for p in wanted if p not in PRECISIONS]
    if bad:
        raise click.BadParameter(f"unknown precision {bad[0]!r}; choose from {', '.join(PRECISIONS)}",
                                 param_hint="--precisions")
    sizes = int_tuple(batch_sizes)
    try:
        try:
            weights = load_weights(find_weights(weights_path))
        except EngineError:
            if weights_path:
                raise
            from .synthetic import synthetic_weights

            weights = synthetic_weights(0)
        rows = tune(weights, wanted, sizes, table, show=sys.stderr.isatty())
    except EngineError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    for precision, batch, source, seconds in rows:
        click.echo(f"{precision:5} batch {batch:4}: {source} ({seconds:.1f} s)")
    if table is not None:
        click.echo(f"table: {table}")


def main() -> None:
    tune_cmd(prog_name="inception-tune")


if __name__ == "__main__":
    main()
