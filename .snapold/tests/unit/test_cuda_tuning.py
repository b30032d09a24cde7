"""The shipped tuning tables (backends/cuda/tuning.py): read back as the configs they were measured as, looked up
by GPU model and conv shapes, and skipped where they do not apply. On the GPU,
tests/device/test_cuda_tuning_tables.py holds a table's configs to the same outputs as the same configs given
directly."""

from __future__ import annotations

import json

import pytest

from inception_engine.backends.cuda import tuning
from inception_engine.backends.cuda.cost_model import choose_configs
from inception_engine.plan import build_plan
from inception_engine.tune import BATCH_SIZES, PRECISIONS

NAME, ARCH, SMS = "NVIDIA H100 80GB HBM3", "sm_90", 132


def model_configs(batch: int, precision: str) -> tuple[str, dict]:
    plan = build_plan(batch)
    return tuning.shape_key(plan, precision, False, True), choose_configs(plan, SMS, False, precision, True)


def same(a: dict, b: dict) -> bool:
    key = lambda c: None if c is None else (c.tile, c.splits, c.k_split, c.wino)  # noqa: E731
    return a.keys() == b.keys() and all(key(a[n]) == key(b[n]) for n in a)


def test_a_table_gives_back_the_configs_written_to_it(tmp_path):
    path = tmp_path / tuning.table_name(NAME)
    written = {}
    for precision in ("fp16", "tf32"):
        for batch in (1, 64):
            key, configs = model_configs(batch, precision)
            table = tuning.add_to_table(path, NAME, ARCH, SMS, key, precision, batch, configs, "cmd")
            path.write_text(json.dumps(table))
            written[key] = configs
    assert len(json.loads(path.read_text())["entries"]) == 4
    for key, configs in written.items():
        assert same(tuning.table_configs(NAME, ARCH, SMS, key, tmp_path), configs)


def test_a_table_applies_only_to_its_gpu_model_and_shapes(tmp_path):
    key, configs = model_configs(8, "fp16")
    path = tmp_path / tuning.table_name(NAME)
    path.write_text(json.dumps(tuning.add_to_table(path, NAME, ARCH, SMS, key, "fp16", 8, configs, "cmd")))
    assert tuning.table_configs(NAME, ARCH, SMS, key, tmp_path) is not None
    assert tuning.table_configs(NAME, ARCH, 114, key, tmp_path) is None  # same name, another SM count
    assert tuning.table_configs(NAME, "sm_80", SMS, key, tmp_path) is None
    assert tuning.table_configs("NVIDIA H200", ARCH, SMS, key, tmp_path) is None  # no table for that model
    assert tuning.table_configs(NAME, ARCH, SMS, model_configs(8, "tf32")[0], tmp_path) is None  # no such entry
    table = json.loads(path.read_text())
    next(iter(table["entries"][key]["configs"].values()))["tile"] = "no_such_tile"
    path.write_text(json.dumps(table))
    assert tuning.table_configs(NAME, ARCH, SMS, key, tmp_path) is None  # a tile this build lacks: skipped
    path.write_text("{not json")
    assert tuning.table_configs(NAME, ARCH, SMS, key, tmp_path) is None


def test_the_shape_key_ignores_the_build_and_the_cache_key_does_not(monkeypatch):
    plan = build_plan(4)
    before = tuning.shape_key(plan, "fp16", False, True), tuning.tuning_key(NAME, ARCH, SMS, plan, "fp16", False, True)
    monkeypatch.setattr(tuning.cuda_build, "build_key", lambda arch: "an edited kernel")
    after = tuning.shape_key(plan, "fp16", False, True), tuning.tuning_key(NAME, ARCH, SMS, plan, "fp16", False, True)
    assert before[0] == after[0] and before[1] != after[1]


@pytest.mark.parametrize("path", sorted(tuning.shipped_table_dir().glob("*.json")), ids=lambda p: p.name)
def test_each_shipped_table_covers_every_precision_and_batch_size_with_tiles_of_this_build(path):
    table = json.loads(path.read_text())
    assert path.name == tuning.table_name(table["device"])
    assert table["command"].startswith("inception-tune ")
    entries = table["entries"].values()
    # int8 (a calibrated weight file, sm_90a) where a table has it at all: then at every batch size
    tabled = {e["precision"] for e in entries} | {"fp32", "tf32", "fp16"}
    assert tabled <= set(PRECISIONS)
    assert {(e["precision"], e["batch"]) for e in entries} == {(p, b) for p in tabled for b in BATCH_SIZES}
    for e in entries:
        assert all(tuning.config_from_json(d) is None or d for d in e["configs"].values())  # every tile exists
