"""``inception-tune`` (the command is cli.tune_cmd): measure each conv's fastest kernel configuration on this GPU
ahead of the runs that need it.

Runs take their configurations from this machine's tuning cache, else from the package's table for this GPU model
(``backends/cuda/tuning.py``), else from the cost model; they never stop to measure. This command fills the cache
for the precisions and batch sizes given, with a progress bar, and with ``--table FILE`` writes (or extends) a
table of them in the package's format: how the shipped tables are made, ``inception-tune --table
inception_engine/data/tuning/NAME.json`` on each GPU model (NAME: ``tuning.table_name`` of the GPU's name).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tqdm import tqdm

from .weights import Weights, atomic_write

PRECISIONS = ("fp32", "tf32", "fp16", "int8")  # int8: a calibrated weight file
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
    command = "inception-tune " + " ".join(
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
