"""bench.py: statistics, comparisons (x cudnn, cpu / onnxruntime), per-layer GFLOP/s, failures per row, the files.

GPU backends are stood in for by small fakes with fixed clocks, so the arithmetic is checked exactly on any machine.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from click.testing import CliRunner
from random_weights import write_random_weights

from inception_engine import bench, cli
from inception_engine.errors import BackendUnavailable, EngineError
from inception_engine.plan import build_plan


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
    return write_random_weights(tmp_path_factory.mktemp("w") / "w.npz", seed=5)


class FakeGpu:
    """Logits: zeros; a forward 'takes' ``ms``; every conv layer 'takes' ``layer_ms``."""

    name = "fake"
    ms = 2.0
    layer_ms = 0.5
    closed = 0

    @classmethod
    def check_available(cls) -> None:
        pass

    def __init__(self, weights, plan):
        self.plan = plan

    def forward(self, x):
        return np.zeros((self.plan.batch, 1000), np.float32)

    def time_forward(self, x, iters, warmup):
        return [self.ms] * iters

    def time_layers(self, x, iters, warmup):
        return {op.name: [self.layer_ms] * iters for op in self.plan.conv_ops}

    def peak_memory_bytes(self):
        return 3 * 2**20 * self.plan.batch

    def close(self):
        FakeGpu.closed += 1


class FakeCudnn(FakeGpu):
    ms = 3.0
    layer_ms = 1.0


class Broken(FakeGpu):
    def forward(self, x):
        raise RuntimeError("launch failed\nsecond line")


@pytest.fixture
def fakes(monkeypatch):
    real = bench.backends.backend_class

    def backend_class(name):
        if name == "cuda":
            return FakeGpu
        if name == "cudnn":
            return FakeCudnn
        if name == "torch":
            return Broken
        return real(name)

    monkeypatch.setattr(bench.backends, "backend_class", backend_class)
    FakeGpu.closed = 0


def test_stats_row_percentiles_and_throughput():
    times = list(np.random.default_rng(0).uniform(1, 10, 57))
    row = bench.stats_row("x", 8, times)
    p10, p50, p90, p99 = np.percentile(times, [10, 50, 90, 99])
    assert (row.p10_ms, row.median_ms, row.p90_ms, row.p99_ms) == pytest.approx((p10, p50, p90, p99))
    assert row.median_ms == pytest.approx(float(np.median(times)))
    assert row.images_per_s == pytest.approx(8 / (p50 / 1e3))


def test_rel_l2():
    ref = np.array([[3.0, 4.0]])
    assert bench.rel_l2(np.array([[3.0, 4.0]], np.float32), ref) == 0
    assert bench.rel_l2(np.array([[3.0, 5.0]]), ref) == pytest.approx(0.2)


def test_gpu_rows_speedup_per_layer_memory_and_failures(fakes, weights_file):
    report = bench.run_bench(["cuda", "cudnn", "torch"], [1, 2], iters=3, warmup=1, weights_path=str(weights_file),
                             per_layer=True, reference=False)
    rows = {(r.backend, r.batch): r for r in report.rows}
    assert set(rows) == {(b, n) for b in ("cuda", "cudnn", "torch") for n in (1, 2)}  # no onnxruntime without cpu
    for n in (1, 2):
        cuda, cudnn, broken = rows["cuda", n], rows["cudnn", n], rows["torch", n]
        assert cuda.median_ms == 2.0 and cuda.images_per_s == pytest.approx(n / 2e-3)
        assert cuda.speedup_vs_cudnn == pytest.approx(1.5) and cudnn.speedup_vs_cudnn == pytest.approx(1.0)
        assert cuda.peak_memory_bytes == 3 * 2**20 * n and cuda.rel_l2 is None
        assert broken.status == "error: RuntimeError: launch failed"  # first line only
    assert FakeGpu.closed == 6  # every backend instance closed, the failing ones too

    convs = build_plan(2).conv_ops
    layers = [l for l in report.layers if l.batch == 2]
    assert [l.layer for l in layers] == [op.name for op in convs]
    for l, op in zip(layers, convs):
        assert l.ms == {"cuda": 0.5, "cudnn": 1.0} and l.flops == op.flops
        assert l.gflops("cuda") == pytest.approx(op.flops / 0.5e-3 / 1e9)

    text = bench.table(report)
    assert "error: RuntimeError: launch failed" in text and "per-layer (conv) times" in text
    assert "Mixed_6b.branch7x7_2" in text and "1.50" in text


def test_unavailable_backend_row_and_the_rest_still_run(monkeypatch, weights_file):
    def backend_class(name):
        if name == "cuda":
            raise BackendUnavailable("backend 'cuda' needs the Python package 'pycuda', which is not installed")
        return FakeCudnn

    monkeypatch.setattr(bench.backends, "backend_class", backend_class)
    report = bench.run_bench(["cuda", "cudnn"], [1], iters=1, warmup=0, weights_path=str(weights_file),
                             reference=False)
    rows = {r.backend: r for r in report.rows}
    assert rows["cuda"].status == "unavailable: backend 'cuda' needs the Python package 'pycuda', which is not " \
                                  "installed"
    assert rows["cudnn"].status == "ok" and rows["cudnn"].median_ms == 3.0
    assert "unavailable: backend 'cuda'" in bench.table(report)


def test_files_json_csv_and_layers_csv(fakes, weights_file, tmp_path):
    report = bench.run_bench(["cuda", "cudnn"], [1], iters=2, warmup=0, weights_path=str(weights_file),
                             per_layer=True, reference=False)
    j = bench.write_json(report, tmp_path / "out" / "b.json")
    doc = json.loads(j.read_text())
    assert doc["rows"][0]["backend"] == "cuda" and doc["rows"][0]["speedup_vs_cudnn"] == pytest.approx(1.5)
    assert doc["layers"][0]["gflops"]["cuda"] == pytest.approx(doc["layers"][0]["flops"] / 0.5e-3 / 1e9)
    written = bench.write_csv(report, tmp_path / "b.csv")
    assert [p.name for p in written] == ["b.csv", "b_layers.csv"]
    rows = list(csv.DictReader(open(written[0])))
    assert [r["backend"] for r in rows] == ["cuda", "cudnn"] and float(rows[0]["median_ms"]) == 2.0
    layer_rows = list(csv.DictReader(open(written[1])))
    assert len(layer_rows) == 2 * 94 and {r["backend"] for r in layer_rows} == {"cuda", "cudnn"}
    assert not list(tmp_path.glob("**/*.part"))  # atomic writes leave no temp files behind


def test_cli_exit_code_1_when_a_backend_fails(fakes, weights_file):
    r = CliRunner().invoke(cli.bench_cmd, ["--backends", "torch", "--batch-sizes", "1", "--iters", "1",
                                           "--weights", str(weights_file), "--no-reference"])
    assert r.exit_code == 1 and "error: RuntimeError" in r.output and "Traceback" not in r.output


def test_bad_arguments():
    with pytest.raises(EngineError):
        bench.run_bench(["cpu"], [1], iters=0)
    with pytest.raises(EngineError):
        bench.run_bench([], [1])
