"""Per-layer GPU time of every direct-GEMM tile of a precision, beside the cost model's choice and Winograd.

    python3 scripts/tune_tiles.py [--precision fp16] [--batch-sizes 1,128] [--iters 20] [--nhwc] [--json FILE]

For each batch size, the candidate sets of cb.tune_configs (every conv direct on one tile of cb.TILES_OF[precision],
split-K as the model picks it for that tile; and Winograd for every eligible conv) and the model's choice among all
tiles, each timed per conv by cb.time_convs (CUDA events, eager launches, the host's launch latency hidden, median
of --iters). Prints per conv: GFLOP, ms per tile, the model's tile and ms,
Winograd's ms, and which was fastest; then the sums. This is the data the cost model's tile speeds
(cb.Tile.macs_per_us) are set from. --nhwc: the NHWC path as CudaBackend runs it by default, the fused
plan (plan.fused_plan) on conv_nhwc_*.cu's tiles, the wgmma ones where the GPU has them; no Winograd there.
Needs a GPU and pycuda.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inception_engine.backends import cuda as cb  # noqa: E402
from inception_engine import cuda_build  # noqa: E402
from inception_engine.plan import ConvOp, build_plan, fused_plan  # noqa: E402


def label(cfg: cb.ConvConfig) -> str:
    return (f"F{cfg.wino}" if cfg.wino else cb.tile_label(cfg.tile)) + (f"/{cfg.splits}" if cfg.splits > 1 else "")


def layer_ms(weights, plan, configs, precision: str, iters: int,
             nhwc: bool = False) -> tuple[dict[str, float], dict[str, str]]:
    """Median ms per conv op (cb.time_convs), and the config each got (tile/splits, or F<m> for Winograd)."""
    return (cb.time_convs(weights, plan, configs, precision, iters=iters, nhwc=nhwc),
            {op.name: label(configs[op.name]) for op in plan.conv_ops})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", choices=cb.PRECISIONS, default="fp16")
    p.add_argument("--batch-sizes", default="1,128")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--nhwc", action="store_true",
                   help="the NHWC path (fp32: sm_90a only): fused plan, conv_nhwc_*.cu tiles")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    weights = cb.he_weights(0)
    gpu = cb.Gpu()
    num_sms, wgmma = gpu.num_sms, cuda_build.has_wgmma(gpu.arch)
    gpu.release()
    tiles = cb.NHWC_ELEMS[args.precision].tiles(wgmma) if args.nhwc else cb.TILES_OF[args.precision]
    results = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        if args.nhwc:
            plan = fused_plan(batch, weights.layers(), max_pools=cb.folds_max_pools(args.precision))
            per_tile_sets = cb.tuning_candidates(plan, num_sms, False, args.precision, False, True, wgmma)
            model_set = cb.choose_configs(plan, num_sms, False, args.precision, False, nhwc=True, wgmma=wgmma)
            wino_set = None
        else:
            plan = build_plan(batch, weights.layers())
            # tune_configs' candidates (one set per tile, then Winograd for every eligible conv), the model's tiles
            *per_tile_sets, wino_set = cb.tuning_candidates(plan, num_sms, False, args.precision, True)
            model_set = cb.choose_configs(plan, num_sms, False, args.precision, False)
        names = [cb.tile_label(t) for t in tiles]
        runs = {n: layer_ms(weights, plan, c, args.precision, args.iters, args.nhwc)
                for n, c in zip(names, per_tile_sets)}
        model, model_cfg = layer_ms(weights, plan, model_set, args.precision, args.iters, args.nhwc)
        if wino_set is None:  # no Winograd column: NaN, never the fastest
            wino, wino_cfg = dict.fromkeys(model, float("nan")), dict.fromkeys(model, "-")
        else:
            wino, wino_cfg = layer_ms(weights, plan, wino_set, args.precision, args.iters)
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
            sums["best"] += per_tile[best_tile] if fastest == best_tile else w_ms
            cells = " ".join(f"{per_tile[n]:8.3f} {runs[n][1][op.name]:>7s}" for n in names)
            print(f"{op.name:34s} {gflop:7.2f} {cells} {model[op.name]:8.3f} {model_cfg[op.name]:>7s} "
                  f"{w_ms:8.3f} {wino_cfg[op.name]:>5s}  {fastest}")
            results.append({"batch": batch, "op": op.name, "gflop": gflop, "tiles": per_tile,
                            "tile_configs": {n: runs[n][1][op.name] for n in names}, "model": model[op.name],
                            "model_config": model_cfg[op.name], "winograd": None if wino_set is None else w_ms,
                            "winograd_config": wino_cfg[op.name]})
        print("sums (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in sums.items()))
    if args.json:
        args.json.write_text(json.dumps({"precision": args.precision, "nhwc": args.nhwc, "layers": results},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
