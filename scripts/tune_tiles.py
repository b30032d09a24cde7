"""Per-layer GPU time of every direct-GEMM tile of a precision, beside the cost model's choice and Winograd.

    python3 scripts/tune_tiles.py [--precision fp16] [--batch-sizes 1,128] [--iters 20] [--json FILE]

For each batch size, one CudaBackend per tile of cb.TILES_OF[precision] with every conv direct on that tile alone
(the model still picks its split-K), one with the model's choice among all tiles, and one with Winograd for every
eligible conv (the backend's default); each op timed by CudaBackend.time_layers (CUDA events, eager launches, the
host's launch latency hidden, median of --iters). Prints per conv: GFLOP, ms per tile, the model's tile and ms,
Winograd's ms, and which was fastest; then the sums. This is the data the cost model's tile speeds
(cb.Tile.macs_per_us) are set from. Needs a GPU and pycuda.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inception_engine.backends import cuda_backend as cb  # noqa: E402
from inception_engine.plan import ConvOp, build_plan  # noqa: E402


def layer_ms(weights, plan, iters: int, **kw) -> tuple[dict[str, float], dict[str, str]]:
    """Median ms per conv op, and the config each got (tile x splits, or F<m> for Winograd)."""
    x = np.random.default_rng(0).standard_normal(plan.input.dims).astype(np.float32)
    with cb.CudaBackend(weights, plan, graph=False, concurrent=False, **kw) as backend:
        convs = {op.name for op in plan.ops if isinstance(op, ConvOp)}
        times = backend.time_layers(x, iters=iters, only=convs)
        configs = {name: (f"F{c.wino}" if c.wino else c.tile.name) + (f"/{c.splits}" if c.splits > 1 else "")
                   for name, c in backend.configs.items() if name in convs and c is not None}
    return {name: statistics.median(t) for name, t in times.items()}, configs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", choices=cb.PRECISIONS, default="fp16")
    p.add_argument("--batch-sizes", default="1,128")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    weights = cb.he_weights(0)
    tiles = cb.TILES_OF[args.precision]
    results = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        plan = build_plan(batch, weights.layers())
        runs = {t.name: layer_ms(weights, plan, args.iters, precision=args.precision, winograd=False, tiles=(t,))
                for t in tiles}
        model, model_cfg = layer_ms(weights, plan, args.iters, precision=args.precision, winograd=False)
        wino, wino_cfg = layer_ms(weights, plan, args.iters, precision=args.precision, winograd=True)
        names = [t.name for t in tiles]
        print(f"\nbatch {batch}, {args.precision}: ms per conv (tile/splits as chosen)")
        print(f"{'conv':34s} {'GFLOP':>7s} " + " ".join(f"{n:>16s}" for n in names)
              + f" {'model':>16s} {'winograd':>14s}  fastest")
        sums = dict.fromkeys(names + ["model", "winograd", "best direct", "best"], 0.0)
        for op in plan.ops:
            if not isinstance(op, ConvOp):
                continue
            gflop = 2 * op.dst.n * op.dst.channels * op.dst.h * op.dst.w * op.src.channels * op.kernel[0] \
                * op.kernel[1] / 1e9
            per_tile = {n: runs[n][0][op.name] for n in names}
            w_ms = wino[op.name]
            best_tile = min(per_tile, key=per_tile.get)
            fastest = "winograd" if wino_cfg[op.name].startswith("F") and w_ms < per_tile[best_tile] else best_tile
            for n in names:
                sums[n] += per_tile[n]
            sums["model"] += model[op.name]
            sums["winograd"] += w_ms
            sums["best direct"] += per_tile[best_tile]
            sums["best"] += min(per_tile[best_tile], w_ms)
            cells = " ".join(f"{per_tile[n]:8.3f} {runs[n][1][op.name]:>7s}" for n in names)
            print(f"{op.name:34s} {gflop:7.2f} {cells} {model[op.name]:8.3f} {model_cfg[op.name]:>7s} "
                  f"{w_ms:8.3f} {wino_cfg[op.name]:>5s}  {fastest}")
            results.append({"batch": batch, "op": op.name, "gflop": gflop, "tiles": per_tile,
                            "tile_configs": {n: runs[n][1][op.name] for n in names}, "model": model[op.name],
                            "model_config": model_cfg[op.name], "winograd": w_ms,
                            "winograd_config": wino_cfg[op.name]})
        print("sums (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in sums.items()))
    if args.json:
        args.json.write_text(json.dumps({"precision": args.precision, "layers": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
