"""A shipped tuning table (backends/cuda/tuning.py) on the GPU it was measured on: its configs give the same outputs,
bit for bit, as the same configs given directly."""

from __future__ import annotations

import numpy as np
import pytest

from inception_engine.plan import build_plan


@pytest.mark.gpu
def test_a_tables_configs_give_the_outputs_of_the_same_configs_given_directly(gpu, tmp_path, monkeypatch):
    from inception_engine.backends.cuda import CudaBackend
    from inception_engine.synthetic import synthetic_weights

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty tuning cache: the table or nothing
    w = synthetic_weights(0)
    x = np.random.default_rng(5).standard_normal((8, 3, 299, 299)).astype(np.float32)
    with CudaBackend(w, build_plan(8, w.layers()), precision="fp16", tune="cached") as from_table:
        if from_table.tuning_source != "table":
            pytest.skip(f"no shipped tuning table for this GPU ({from_table.gpu.device.name()})")
        configs, out_table = dict(from_table.configs), from_table.forward(x)
    with CudaBackend(w, build_plan(8, w.layers()), precision="fp16", configs=configs) as given:
        out_given = given.forward(x)
    assert np.isfinite(out_table).all() and np.array_equal(out_table, out_given)
