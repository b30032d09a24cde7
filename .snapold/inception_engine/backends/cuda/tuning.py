"""Measured tuning, the half that needs no GPU: the candidate config sets that ``backend.tune_configs`` times (one
whole forward per tile, and one with Winograd), picking each conv's fastest (``pick_fastest``), the on-disk cache
(``tuning_key``, JSON in ``tuning_cache_dir()``) and the tuning tables shipped in the package.

A tuning table (``inception_engine/data/tuning/<gpu>.json``) holds the measured configs of one GPU model for every
precision and the batch sizes that inception-run and inception-bench use, so that a first run on that GPU starts on
measured kernels without measuring anything. Its entries are keyed by ``shape_key`` (the conv shapes and the mode,
not the kernels' build): a table stays valid across kernel edits that keep the tiles' names, and an entry naming a
tile that no longer exists is skipped. ``inception-tune --table FILE`` regenerates one. The timing runs a
``CudaBackend``, so it lives in backend.py."""

from __future__ import annotations

import hashlib
import json
import re
from importlib import resources
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


def shape_key(plan: Plan, precision: str, fixup: bool, winograd: bool | None, nhwc: bool = False) -> str:
    """What a tuned config set depends on apart from the GPU and the kernels' build: the conv shapes, the mode."""
    ops = [(op.name, op.kernel, op.stride, op.pad, op.src.dims, op.dst.dims, op.max_pool) for op in plan.conv_ops]
    what = [precision, fixup, winograd is not False, ops]
    if nhwc:
        what.append("nhwc")
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:20]


def tuning_key(device_name: str, arch: str, num_sms: int, plan: Plan, precision: str, fixup: bool,
               winograd: bool | None, nhwc: bool = False) -> str:
    """The tuning cache's key: the GPU, the kernels' build, and ``shape_key``."""
    what = [device_name, arch, num_sms, cuda_build.build_key(arch), shape_key(plan, precision, fixup, winograd, nhwc)]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:20]


def table_name(device_name: str) -> str:
    """A GPU model's table file name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3.json"."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") + ".json"


def shipped_table_dir() -> Path:
    return Path(str(resources.files("inception_engine.data"))) / "tuning"


def read_table(path: Path) -> dict[str, Any]:
    """A tuning table's JSON, or an empty one where there is none (or it cannot be read)."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) and isinstance(table.get("entries"), dict) else {}


def table_configs(device_name: str, arch: str, num_sms: int, key: str,
                  table_dir: Path | None = None) -> dict[str, ConvConfig | None] | None:
    """The shipped table's configs for this GPU model and ``shape_key``, or None: no table, no entry, or an entry
    made for another chip of the same name (SM count, architecture) or naming a tile this build lacks."""
    table = read_table((table_dir or shipped_table_dir()) / table_name(device_name))
    entry = table.get("entries", {}).get(key) if table.get("num_sms") == num_sms and table.get("arch") == arch else None
    if not isinstance(entry, dict):
        return None
    try:
        return {name: config_from_json(d) for name, d in entry["configs"].items()}
    except (KeyError, TypeError, ValueError):
        return None


def add_to_table(path: Path, device_name: str, arch: str, num_sms: int, key: str, precision: str, batch: int,
                 configs: dict[str, ConvConfig | None], command: str) -> dict[str, Any]:
    """The table at ``path`` (new, or for this GPU) with this entry added; the caller writes it."""
    table = read_table(path)
    if table.get("device") != device_name or table.get("num_sms") != num_sms or table.get("arch") != arch:
        table = {"device": device_name, "arch": arch, "num_sms": num_sms, "entries": {}}
    table["command"] = command
    table["entries"][key] = {"precision": precision, "batch": batch,
                             "configs": {name: config_to_json(c) for name, c in configs.items()}}
    table["entries"] = dict(sorted(table["entries"].items(), key=lambda kv: (kv[1]["precision"], kv[1]["batch"])))
    return table



def tuning_cache_dir() -> Path:
    return user_cache_dir() / "tuning"
