"""inception-run --gpus 2 --decode gpu (multi_gpu.py) on a machine with two GPUs or more: one process's predictions,
in input order, an unreadable file's error in its place, and workers that leave by themselves with exit code 0 once
their results are handed over (a --decode gpu worker skips its engine's teardown: multi_gpu._worker)."""

from __future__ import annotations


import numpy as np
import pytest
from PIL import Image

from inception_engine import backends
from inception_engine.engine import Engine
from inception_engine.multi_gpu import predict_on_gpus
from inception_engine.weights import save_weights

from helpers.random_weights import random_arrays

pytestmark = pytest.mark.gpu


def test_two_gpus_decoding_on_the_gpu_give_one_processs_predictions(tmp_path):
    have = backends.usable_gpus()
    if have < 2:
        pytest.skip(f"needs two GPUs; this machine has {have}")
    weights = save_weights(tmp_path / "w.npz", random_arrays(7), {"count_include_pad": True,
                                                                   "input": {"size": 75, "resize": 86}})
    rng = np.random.default_rng(11)
    paths = []
    for i in range(37):
        p = tmp_path / f"{i:02d}.jpg"
        h, w = (375, 500) if i % 2 else (500, 375)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(p, quality=90)
        paths.append(str(p))
    (tmp_path / "bad.jpg").write_bytes(b"not a picture")
    paths.insert(20, str(tmp_path / "bad.jpg"))
    with Engine(weights, backend="cuda", batch_size=8, precision="fp32", decode="gpu") as engine:
        one = list(engine.predict_iter(paths, 3))
    stream = predict_on_gpus(paths, 2, 3, str(weights), "cuda", 8, "fp32", None, "thread", decode="gpu")
    two = [next(stream) for _ in paths]
    procs = list(stream.procs)
    stream.close()
    assert [p.image for p in two] == paths
    assert [p.ok for p in two] == [p.ok for p in one] == [i != 20 for i in range(len(paths))]
    assert two[20].error == one[20].error
    for a, b in zip(one, two):
        if a.ok:
            assert [c[0] for c in a.top] == [c[0] for c in b.top], a.image
            np.testing.assert_allclose([c[2] for c in a.top], [c[2] for c in b.top], rtol=1e-4, atol=1e-6)
    assert [p.exitcode for p in procs] == [0, 0]
