"""Measured tuning, the half that needs no GPU: the candidate config sets that ``backend.tune_configs`` times (one
whole forward per tile, and one with Winograd), picking each conv's fastest (``pick_fastest``), and the on-disk cache
(``tuning_key``, JSON in ``tuning_cache_dir()``). The timing runs a ``CudaBackend``, so it lives in backend.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ... import cuda_build
from ...plan import Plan
from ...weights import user_cache_dir
from .cost_model import ConvConfig, choose_configs
from .tiles import F16_TILES, INPUT_MMA_TILE, INPUT_TILE, NHWC_ELEMS, TF32_TILES, TILES, TILES_OF, WINO_TILES


def tuning_candidates(plan: Plan, num_sms: int, fixup: bool, precision: str,
                      winograd: bool | None, nhwc: bool = False,
                      wgmma: bool = False) -> list[dict[str, ConvConfig | None]]:
    """The config sets ``tune_configs`` times, each a whole forward's: one per direct tile of the precision (every
    conv on that tile, split-K as the model picks it for the tile) and, unless winograd is False, one with every
    eligible conv by Winograd (the others as the model picks). nhwc: one per NHWC tile of the precision."""
    if nhwc:
        return [choose_configs(plan, num_sms, False, precision, False, (t,), nhwc=True, wgmma=wgmma)
                for t in NHWC_ELEMS[precision].tiles(wgmma)]
    sets = [choose_configs(plan, num_sms, fixup, precision, False, (t,)) for t in TILES_OF[precision]]
    if winograd is not False:
        sets.append(choose_configs(plan, num_sms, fixup, precision, True))
    return sets


def pick_fastest(default: dict[str, ConvConfig | None], sets: list[dict[str, ConvConfig | None]],
                 times: list[dict[str, float]]) -> dict[str, ConvConfig | None]:
    """default, with each op that was timed in every set given its config from the set where it ran fastest."""
    out = dict(default)
    for name in default:
        if all(name in t for t in times):
            out[name] = sets[min(range(len(sets)), key=lambda i: times[i][name])][name]
    return out


def config_to_json(cfg: ConvConfig | None) -> dict[str, Any] | None:
    if cfg is None:
        return None
    return {"prefix": cfg.tile.prefix, "tile": cfg.tile.name, "splits": cfg.splits, "k_split": cfg.k_split,
            "wino": cfg.wino}


def config_from_json(d: dict[str, Any] | None) -> ConvConfig | None:
    if d is None:
        return None
    tiles = {(t.prefix, t.name): t for t in TILES + TF32_TILES + F16_TILES + WINO_TILES + (INPUT_TILE, INPUT_MMA_TILE)
             + tuple(t for e in NHWC_ELEMS.values() for t in e.tiles(wgmma=True))}
    return ConvConfig(tiles[d["prefix"], d["tile"]], int(d["splits"]), int(d["k_split"]), 0.0, int(d["wino"]))


def tuning_key(device_name: str, arch: str, num_sms: int, plan: Plan, precision: str, fixup: bool,
               winograd: bool | None, nhwc: bool = False) -> str:
    """What a tuned config set depends on: the GPU, the kernels' build, the conv shapes, the mode."""
    ops = [(op.name, op.kernel, op.stride, op.pad, op.src.dims, op.dst.dims, op.max_pool) for op in plan.conv_ops]
    what = [device_name, arch, num_sms, cuda_build.build_key(arch), precision, fixup, winograd is not False, ops]
    if nhwc:
        what.append("nhwc")
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:20]




def tuning_cache_dir() -> Path:
    return user_cache_dir() / "tuning"
