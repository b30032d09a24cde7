"""One eager forward of the cuda backend (no CUDA graph, one stream), for a profiler to attach to:

    ncu --set full -k regex:conv_nhwc --launch-count 6 python3 dev/profile_forward.py --precision fp16 --batch 128

Prints each launch of the forward in order (op, kernel, grid), so a profiler's kernel index maps back to a layer.
--weights FILE runs that weight file (int8 needs a calibrated one: dev/make_calibrated_weights.py); --tuned takes each
conv's config from the tuning cache (inception-tune), as inception-bench's forward does, so that a batch-1 profile
lists the kernels of the forward a user times:

    ncu --clock-control none --metrics gpu__time_duration.sum --csv python3 dev/profile_forward.py \
        --precision int8 --weights W8.npz --batch 1 --tuned
--tile NAME puts every conv of the NHWC path (fp16, tf32) on that conv_nhwc_*.cu tile (w256x192: the wgmma tile,
256x192: the mma.sync one), split-K as the cost model picks it for the tile, so that one layer can be profiled on
each tile in turn.
"""

from __future__ import annotations

import argparse

import numpy as np

from inception_engine import cuda_build
from inception_engine.backends import cuda as cb
from inception_engine.model_files import load_weights
from inception_engine.plan import build_plan, fused_plan


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--precision", default="fp16", choices=("fp32", "tf32", "fp16", "int8"))
    p.add_argument("--weights", help="an engine weight file (default: He-initialised random weights)")
    p.add_argument("--tuned", action="store_true", help="configs from the tuning cache, as inception-bench's")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--tile", help="NHWC tile for every conv, e.g. w128x128 (wgmma) or 128x64 (mma.sync)")
    args = p.parse_args()
    weights = load_weights(args.weights) if args.weights else cb.he_weights(0)
    if args.tile and args.tuned:
        p.error("--tile and --tuned each choose the configs: give one")
    plan = build_plan(args.batch, weights.layers())
    configs = None
    if args.tile:
        gpu = cb.Gpu()
        num_sms, wgmma = gpu.num_sms, cuda_build.has_wgmma(gpu.arch)
        gpu.release()
        tiles = {cb.tile_label(t): t for t in cb.NHWC_ELEMS[args.precision].tiles(wgmma)}
        if args.tile not in tiles:
            p.error(f"--tile {args.tile}: this GPU's {args.precision} tiles are {', '.join(tiles)}")
        plan = fused_plan(args.batch, weights.layers(), max_pools=cb.folds_max_pools(args.precision))
        configs = cb.choose_configs(plan, num_sms, False, args.precision, False, (tiles[args.tile],), nhwc=True,
                                    wgmma=wgmma)
    x = np.random.default_rng(1).standard_normal(plan.input.dims).astype(np.float32)
    with cb.CudaBackend(weights, plan, graph=False, concurrent=False, precision=args.precision,
                        configs=configs, tune="cached" if args.tuned else False) as backend:
        for i, s in enumerate(backend.specs):
            print(f"{i:4d} {s.op:28s} {s.kernel:30s} grid {s.grid}")
        backend.forward(x)


if __name__ == "__main__":
    main()
