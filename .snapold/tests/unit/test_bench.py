"""bench.py: statistics, comparisons (x cudnn, cpu / onnxruntime), per-layer GFLOP/s, failures per row, the files.

GPU backends are stood in for by small fakes with fixed clocks, so the arithmetic is checked exactly on any machine.
"""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from inception_engine import bench, bench_report, cli
from inception_engine.bench_report import CEILINGS, FP32_PEAK_TFLOPS, PEAK_GBS, PEAK_TFLOPS
from inception_engine.errors import BackendUnavailable, EngineError
from inception_engine.plan import ConvOp, PoolOp, build_plan, fuse_pointwise

from helpers.random_weights import write_random_weights


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
    return write_random_weights(tmp_path_factory.mktemp("w") / "w.npz", seed=5)


class FakeGpu:
    """Logits: zeros; a forward 'takes' ``ms``; every op of its plan 'takes' ``layer_ms``."""

    name = "fake"
    ms = 2.0
    layer_ms = 0.5
    closed = 0

    @classmethod
    def check_available(cls) -> None:
        pass

    def __init__(self, weights, plan, tune: bool = False):  # the bare name cuda runs with tune=True
        self.plan = plan

    def forward(self, x):
        return np.zeros((self.plan.batch, 1000), np.float32)

    def time_forward(self, x, iters, warmup):
        return [self.ms] * iters

    def time_layers(self, x, iters, warmup):
        return {op.name: [self.layer_ms] * iters for op in self.plan.ops}

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

    ops = build_plan(2).ops  # every op in plan order, pools and the classifier too; FLOPs and GFLOP/s of the convs
    layers = [l for l in report.layers if l.batch == 2]
    assert [l.layer for l in layers] == [op.name for op in ops]
    for l, op in zip(layers, ops):
        assert l.ms == {"cuda": 0.5, "cudnn": 1.0}
        if isinstance(op, ConvOp):
            assert l.flops == op.flops and l.gflops("cuda") == pytest.approx(op.flops / 0.5e-3 / 1e9)
        else:
            assert l.flops == 0 and l.gflops("cuda") is None
    assert any(isinstance(op, PoolOp) for op in ops)

    text = bench_report.table(report)
    assert "error: RuntimeError: launch failed" in text and "per-op times" in text
    assert "Mixed_6b.branch7x7_2" in text and "1.50" in text


def test_layers_of_a_backends_own_plan_get_rows_of_their_own(fakes, monkeypatch, weights_file):
    """A backend that fuses convs (the CUDA NHWC path: plan.fuse_pointwise) reports its fused layers by their own
    names and FLOPs; the peer's layers keep theirs, and each row has only the columns that ran it."""
    class FusingGpu(FakeGpu):
        def __init__(self, weights, plan, tune: bool = False):
            self.plan = fuse_pointwise(build_plan(plan.batch, concurrent=True))

    real = bench.backends.backend_class
    monkeypatch.setattr(bench.backends, "backend_class", lambda name: FusingGpu if name == "cuda" else real(name))
    report = bench.run_bench(["cuda", "cudnn"], [2], iters=2, warmup=1, weights_path=str(weights_file),
                             per_layer=True, reference=False)
    fused = {op.name: op for op in fuse_pointwise(build_plan(2, concurrent=True)).conv_ops}
    rows = {l.layer: l for l in report.layers}
    assert rows["Mixed_5b.pointwise"].ms == {"cuda": 0.5}
    assert rows["Mixed_5b.pointwise"].flops == fused["Mixed_5b.pointwise"].flops
    assert rows["Mixed_5b.branch1x1"].ms == {"cudnn": 1.0}  # a member: the peer's row only
    assert rows["Mixed_5b.branch5x5_2"].ms == {"cuda": 0.5, "cudnn": 1.0}
    assert "Mixed_7c.pointwise" in bench_report.table(report)


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
    assert "unavailable: backend 'cuda'" in bench_report.table(report)


def test_files_json_csv_and_layers_csv(fakes, weights_file, tmp_path):
    report = bench.run_bench(["cuda", "cudnn"], [1], iters=2, warmup=0, weights_path=str(weights_file),
                             per_layer=True, reference=False)
    j = bench_report.write_json(report, tmp_path / "out" / "b.json")
    doc = json.loads(j.read_text())
    assert doc["rows"][0]["backend"] == "cuda" and doc["rows"][0]["speedup_vs_cudnn"] == pytest.approx(1.5)
    assert doc["layers"][0]["gflops"]["cuda"] == pytest.approx(doc["layers"][0]["flops"] / 0.5e-3 / 1e9)
    written = bench_report.write_csv(report, tmp_path / "b.csv")
    assert [p.name for p in written] == ["b.csv", "b_layers.csv"]
    rows = list(csv.DictReader(open(written[0])))
    assert [r["backend"] for r in rows] == ["cuda", "cudnn"] and float(rows[0]["median_ms"]) == 2.0
    layer_rows = list(csv.DictReader(open(written[1])))
    assert len(layer_rows) == 2 * len(build_plan(1).ops) and {r["backend"] for r in layer_rows} == {"cuda", "cudnn"}
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
    with pytest.raises(EngineError, match="--precision"):
        bench.run_bench(["cpu"], [1], precision="bf16")
    with pytest.raises(EngineError, match="--reference-images"):
        bench.run_bench(["cpu"], [1], reference_images=0)


# ---- variants, precision, graph fallback, reference slice, floors ------------------------------------------------

class Configurable(FakeGpu):
    """Takes the options a real GPU backend takes and records them; ``fallback`` plays a failed graph capture."""

    PRECISIONS = ("fp32", "tf32")
    made: list = []
    fallback: str | None = None

    def __init__(self, weights, plan, graph=False, precision="fp32"):
        super().__init__(weights, plan)
        Configurable.made.append((plan.batch, graph, precision))
        self.graph_fallback = self.fallback if graph else None


@pytest.fixture
def configurable(monkeypatch):
    real = bench.backends.backend_class
    Configurable.made = []
    Configurable.fallback = None

    def backend_class(name):
        return {"torch": Configurable, "cudnn": FakeCudnn, "cuda": FakeGpu}.get(name) or real(name)

    monkeypatch.setattr(bench.backends, "backend_class", backend_class)


def test_variants_get_their_options_and_precision_goes_where_it_is_accepted(configurable, weights_file):
    report = bench.run_bench(["torch", "torch-graph", "cudnn"], [1], iters=1, warmup=0,
                             weights_path=str(weights_file), reference=False, precision="tf32")
    assert Configurable.made == [(1, False, "tf32"), (1, True, "tf32")]
    rows = {r.backend: r for r in report.rows}
    assert rows["torch"].status == rows["torch-graph"].status == "ok"
    assert rows["cudnn"].status == "unavailable: backend has no tf32 mode"  # FakeCudnn takes no precision
    assert rows["torch"].speedup_vs_cudnn is None  # no cudnn timing to compare with
    assert report.precision == "tf32" and "precision tf32" in bench_report.table(report)

    Configurable.made = []
    report = bench.run_bench(["torch-graph", "cudnn"], [1], iters=1, warmup=0, weights_path=str(weights_file),
                             reference=False, precision="fp16")
    assert Configurable.made == []  # fp16 is not among its PRECISIONS: never built
    assert {r.status for r in report.rows} == {"unavailable: backend has no fp16 mode"}

    report = bench.run_bench(["cudnn"], [1], iters=1, warmup=0, weights_path=str(weights_file), reference=False)
    assert report.rows[0].status == "ok"  # fp32 needs no keyword


def test_real_backends_declare_their_precisions():
    from inception_engine.backends.cudnn_backend import CudnnBackend
    from inception_engine.backends.numpy_backend import NumpyBackend
    from inception_engine.backends.torch_backend import TorchBackend

    assert bench.backend_options("torch-graph", TorchBackend, "fp16") == {"graph": True, "precision": "fp16"}
    assert bench.backend_options("torch-compile", TorchBackend, "fp16") == {"compile_mode": "reduce-overhead",
                                                                            "precision": "fp16"}
    assert bench.backend_options("torch-compile-max", TorchBackend, "tf32") == {"compile_mode": "max-autotune",
                                                                                "precision": "tf32"}
    assert bench.backend_options("cudnn", CudnnBackend, "tf32") == {"precision": "tf32"}
    assert bench.backend_options("cudnn-eager", CudnnBackend, "fp32") == {"graph": False, "precision": "fp32"}
    assert bench.backend_options("cudnn", CudnnBackend, "fp16") == "unavailable: backend has no fp16 mode"
    assert bench.backend_options("cpu", NumpyBackend, "fp32") == {}
    assert bench.backend_options("cpu", NumpyBackend, "tf32") == "unavailable: backend has no tf32 mode"


def test_failed_graph_capture_is_labelled_not_silent(configurable, weights_file):
    Configurable.fallback = "CUDA-graph capture failed (cuStreamBeginCapture failed); running eagerly"
    report = bench.run_bench(["torch", "torch-graph"], [2], iters=1, warmup=0, weights_path=str(weights_file),
                             reference=False)
    rows = {r.backend: r for r in report.rows}
    assert rows["torch"].graph_fallback is None and rows["torch-graph"].graph_fallback == Configurable.fallback
    text = bench_report.table(report)
    assert "torch-graph (eager)" in text and "torch (eager)" not in text
    assert f"torch-graph, batch 2: {Configurable.fallback}" in text


class Echo(FakeGpu):
    """Logits: the first 1000 input values of each image, so the reference (same rule in float64) agrees."""

    def forward(self, x):
        return x.reshape(self.plan.batch, -1)[:, :1000].astype(np.float32)


class EchoReversed(Echo):
    def forward(self, x):
        return super().forward(x)[:, ::-1]


class EchoReference:
    calls: list = []

    def __init__(self, weights, plan, dtype):
        assert dtype == np.float64
        self.plan = plan

    def forward(self, x):
        EchoReference.calls.append(x.shape[0])
        return x.reshape(self.plan.batch, -1)[:, :1000].astype(np.float64)


def test_reference_on_the_first_images_once_per_slice_with_top1(monkeypatch, weights_file):
    monkeypatch.setattr(bench.backends, "backend_class", lambda name: {"cuda": Echo, "cudnn": EchoReversed}[name])
    monkeypatch.setattr(bench, "NumpyBackend", EchoReference)
    EchoReference.calls = []
    report = bench.run_bench(["cuda", "cudnn"], [1, 2, 4], iters=1, warmup=0, weights_path=str(weights_file),
                             reference_images=2)
    # batch 4 reuses the 2-image reference: its first two images are those of the batch-2 draw (rel L2 exactly 0)
    assert EchoReference.calls == [1, 2]
    rows = {(r.backend, r.batch): r for r in report.rows}
    for n, k in ((1, 1), (2, 2), (4, 2)):
        good, bad = rows["cuda", n], rows["cudnn", n]
        assert good.rel_l2 == 0 and good.top1_agree == k and good.ref_images == k
        assert bad.rel_l2 > 0.1 and bad.top1_agree == 0 and bad.ref_images == k
    text = bench_report.table(report)
    assert "first 2 image(s)" in text and " 2/2 " in text and " 0/2 " in text


def test_floors_and_x_floor(fakes, weights_file):
    from inception_engine import arch

    report = bench.run_bench(["cuda", "cudnn"], [1, 4], iters=1, warmup=0, weights_path=str(weights_file),
                             reference=False, peak_tflops=50.0, peak_gbs=1000.0)
    params = sum(int(np.prod(s)) for s in arch.weight_shapes().values())
    for f in report.floors:
        plan = build_plan(f.batch)
        activations = sum(b.elems for b in plan.buffers.values())
        assert f.flops == plan.flops and f.bytes == 4 * (params + activations)
        assert f.compute_ms == pytest.approx(plan.flops / 50e12 * 1e3)
        assert f.memory_ms == pytest.approx(4 * (params + activations) / 1e12 * 1e3)
        assert f.ms == max(f.compute_ms, f.memory_ms)
        rows = {r.backend: r for r in report.rows if r.batch == f.batch}
        assert rows["cuda"].x_floor == pytest.approx(FakeGpu.ms / f.ms)
        assert rows["cudnn"].x_floor == pytest.approx(FakeCudnn.ms / f.ms)
    assert report.floors[0].compute_ms > report.floors[0].memory_ms  # compute-bound, as PERFORMANCE.md says
    text = bench_report.table(report)
    assert "floors:" in text and "50 TFLOP/s" in text and "1000 GB/s" in text
    doc = report.to_json()
    assert doc["floors"][1]["batch"] == 4 and doc["floors"][1]["ms"] == pytest.approx(report.floors[1].ms)


def test_floor_defaults_per_precision_and_gpu(fakes, weights_file, monkeypatch):
    run = lambda **kw: bench.run_bench(["cuda"], [1], iters=1, warmup=0, weights_path=str(weights_file),  # noqa: E731
                                       reference=False, **kw)
    monkeypatch.setattr(bench, "gpu_name", lambda: None)  # no GPU: the H200's ceilings
    fp32 = run()
    assert (fp32.peak_tflops, fp32.peak_gbs) == (FP32_PEAK_TFLOPS, PEAK_GBS)
    fp16 = run(precision="fp16")
    f = fp16.floors[0]
    assert fp16.peak_tflops == PEAK_TFLOPS["fp16"] > PEAK_TFLOPS["tf32"] > FP32_PEAK_TFLOPS
    assert f.compute_ms == pytest.approx(fp32.floors[0].compute_ms * FP32_PEAK_TFLOPS / PEAK_TFLOPS["fp16"])
    assert f.bytes == fp32.floors[0].bytes // 2
    assert not any(n.startswith("floors:") for n in fp32.notes + fp16.notes)
    monkeypatch.setattr(bench, "gpu_name", lambda: "NVIDIA H100 80GB HBM3")  # the H100's own ceilings
    h100 = run(precision="tf32")
    tflops, gbs = CEILINGS["H100"]
    assert (h100.peak_tflops, h100.peak_gbs) == (tflops["tf32"], gbs) and gbs < PEAK_GBS
    assert h100.floors[0].memory_ms == pytest.approx(fp32.floors[0].memory_ms * PEAK_GBS / gbs)
    assert run(peak_gbs=100.0).peak_gbs == 100.0 and run(peak_tflops=7.0).peak_tflops == 7.0  # given ones win
    monkeypatch.setattr(bench, "gpu_name", lambda: "NVIDIA A100-SXM4-80GB")  # unmeasured: the H200's, said so
    other = run()
    assert (other.peak_tflops, other.peak_gbs) == (FP32_PEAK_TFLOPS, PEAK_GBS)
    assert any("no measured ceilings for NVIDIA A100-SXM4-80GB" in n for n in other.notes)


def test_cpu_note_says_which_code_runs(monkeypatch):
    from inception_engine.backends import cpu_kernels

    monkeypatch.setattr(cpu_kernels, "unavailable_reason", lambda: None)
    assert "C kernels" in bench.cpu_path_note()
    monkeypatch.setattr(cpu_kernels, "unavailable_reason", lambda: "no C compiler (cc) on PATH")
    note = bench.cpu_path_note()
    assert note.startswith("cpu runs its NumPy code") and note.endswith("no C compiler (cc) on PATH")


def test_bare_cuda_runs_tuned_and_cuda_untuned_is_the_class_default():
    assert bench.backends.variant("cuda") == ("cuda", {"tune": True})
    assert bench.backends.variant("cuda-untuned") == ("cuda", {})
    assert bench.backends.variant("cudnn") == ("cudnn", {})


# ---- torch.compile rows: a compile per batch size, its time in the report ----------------------------------------

class Compiling(FakeGpu):
    """Takes torch's keywords; with ``compile_mode`` it 'compiles' in __init__ for 40 s + batch / 10, the batch-1
    compile served by the cache."""

    PRECISIONS = ("fp32", "tf32", "fp16")
    made: list = []

    def __init__(self, weights, plan, graph=False, precision="fp32", compile_mode=None):
        super().__init__(weights, plan)
        Compiling.made.append((plan.batch, graph, precision, compile_mode))
        self.compile_seconds = None if compile_mode is None else 40.0 + plan.batch / 10
        self.compile_cached = None if compile_mode is None else plan.batch == 1


@pytest.fixture
def compiling(monkeypatch):
    real = bench.backends.backend_class
    Compiling.made = []
    monkeypatch.setattr(bench.backends, "backend_class",
                        lambda name: {"torch": Compiling, "cuda": FakeGpu, "cudnn": FakeCudnn}.get(name) or real(name))


def table_cells(text: str, backend: str, batch: int) -> dict[str, str]:
    """The table's row for (backend, batch) as column name -> cell (cells are at least two spaces apart)."""
    lines = text.splitlines()
    names = re.split(r"\s{2,}", next(l for l in lines if l.startswith("backend ")).strip())
    for l in lines:
        cells = re.split(r"\s{2,}", l.strip())
        if cells[:2] == [backend, str(batch)]:
            assert len(cells) == len(names), l
            return dict(zip(names, cells))
    raise AssertionError(f"no row {backend} {batch} in\n{text}")


def test_compile_rows_carry_each_batch_sizes_compile_time(compiling, weights_file, tmp_path):
    report = bench.run_bench(["torch-graph", "torch-compile", "torch-compile-max"], [1, 8], iters=2, warmup=1,
                             weights_path=str(weights_file), reference=False, precision="fp16")
    # one backend, so one compile, per name and batch size; the precision goes with it
    assert Compiling.made == [(n, *options) for n in (1, 8) for options in
                              ((True, "fp16", None), (False, "fp16", "reduce-overhead"),
                               (False, "fp16", "max-autotune"))]
    rows = {(r.backend, r.batch): r for r in report.rows}
    assert rows["torch-compile", 1].compile_s == pytest.approx(40.1) and rows["torch-compile", 1].compile_cached
    assert rows["torch-compile-max", 8].compile_s == pytest.approx(40.8)
    assert rows["torch-compile-max", 8].compile_cached is False
    assert rows["torch-graph", 8].compile_s is None and rows["torch-graph", 8].compile_cached is None
    assert rows["torch-compile", 8].median_ms == 2.0  # the timed forwards, not the compile

    text = bench_report.table(report)
    assert table_cells(text, "torch-compile", 1)["compile s"] == "40.1 cached"
    assert table_cells(text, "torch-compile-max", 8)["compile s"] == "40.8"
    assert table_cells(text, "torch-compile", 8)["median ms"] == "2.00"
    assert table_cells(text, "torch-graph", 1)["compile s"] == "-"
    assert "compile s = wall seconds of compiling at that batch size" in text
    assert "torch-compile = torch.compile(mode='reduce-overhead')" in text
    assert "torch-compile-max = torch.compile(mode='max-autotune')" in text

    doc = json.loads(bench_report.write_json(report, tmp_path / "b.json").read_text())
    by = {(r["backend"], r["batch"]): r for r in doc["rows"]}
    assert by["torch-compile-max", 8]["compile_s"] == pytest.approx(40.8) and by["torch-graph", 1]["compile_s"] is None
    assert by["torch-compile", 1]["compile_cached"] is True
    csv_rows = list(csv.DictReader(open(bench_report.write_csv(report, tmp_path / "b.csv")[0])))
    assert [float(r["compile_s"]) for r in csv_rows if r["backend"] == "torch-compile"] == pytest.approx([40.1, 40.8])


def test_no_compile_column_without_a_compiling_row(compiling, weights_file):
    report = bench.run_bench(["cuda", "torch", "torch-graph"], [1], iters=1, warmup=0, weights_path=str(weights_file),
                             reference=False)
    text = bench_report.table(report)
    assert "compile s" not in text and table_cells(text, "torch", 1)["median ms"] == "2.00"


def test_compile_failure_and_missing_triton_are_one_line_rows(monkeypatch, weights_file):
    from inception_engine.backends.torch_backend import CompileFailed

    class FailsToCompile(Compiling):
        def __init__(self, weights, plan, graph=False, precision="fp32", compile_mode=None):
            raise CompileFailed(f"torch.compile(mode={compile_mode!r}) failed at batch {plan.batch}: "
                                f"InductorError: out of resource: shared memory")

    class NoTriton(Compiling):
        def __init__(self, weights, plan, graph=False, precision="fp32", compile_mode=None):
            raise BackendUnavailable("torch.compile on the GPU needs Triton, which is not installed")

    monkeypatch.setattr(bench.backends, "backend_class", lambda name: FailsToCompile)
    report = bench.run_bench(["torch-compile"], [1, 2], iters=1, warmup=0, weights_path=str(weights_file),
                             reference=False)
    assert [r.status for r in report.rows] == [
        f"error: CompileFailed: torch.compile(mode='reduce-overhead') failed at batch {n}: InductorError: out of "
        f"resource: shared memory" for n in (1, 2)]
    assert "compile s" not in bench_report.table(report)  # no row compiled
    r = CliRunner().invoke(cli.bench_cmd, ["--backends", "torch-compile", "--batch-sizes", "1", "--iters", "1",
                                           "--weights", str(weights_file), "--no-reference"])
    assert r.exit_code == 1 and "error: CompileFailed: torch.compile(mode='reduce-overhead')" in r.output
    assert "Traceback" not in r.output

    monkeypatch.setattr(bench.backends, "backend_class", lambda name: NoTriton)
    report = bench.run_bench(["torch-compile-max"], [1], iters=1, warmup=0, weights_path=str(weights_file),
                             reference=False)
    assert report.rows[0].status == "unavailable: torch.compile on the GPU needs Triton, which is not installed"


def test_cli_compile_rows_in_the_table_and_json(compiling, weights_file, tmp_path):
    out = tmp_path / "b.json"
    r = CliRunner().invoke(cli.bench_cmd, ["--backends", "cuda,torch-graph,torch-compile", "--precision", "fp16",
                                           "--batch-sizes", "1,128", "--iters", "1", "--warmup", "0",
                                           "--weights", str(weights_file), "--no-reference", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert table_cells(r.output, "torch-compile", 128)["compile s"] == "52.8"
    assert table_cells(r.output, "torch-graph", 128)["compile s"] == "-"
    rows = {(row["backend"], row["batch"]): row for row in json.loads(out.read_text())["rows"]}
    assert rows["torch-compile", 1]["compile_s"] == pytest.approx(40.1)
    assert Compiling.made == [(1, True, "fp16", None), (1, False, "fp16", "reduce-overhead"),
                              (128, True, "fp16", None), (128, False, "fp16", "reduce-overhead")]


def test_int8_benches_its_reference_images_on_image_like_inputs():
    """int8's first reference images are image-like, the same at every batch size; the rest, and every other
    precision's batch, the one stream of normals."""
    from inception_engine.bench import bench_input

    eight, one = bench_input((8, 3, 75, 75), "int8", 2), bench_input((1, 3, 75, 75), "int8", 2)
    fp16 = bench_input((8, 3, 75, 75), "fp16", 2)
    assert np.array_equal(eight[:1], one) and np.array_equal(eight[2:], fp16[2:])
    assert not np.array_equal(eight[:2], fp16[:2])
    assert np.array_equal(fp16[:1], bench_input((1, 3, 75, 75), "fp16", 2))
    # image-like: smooth (neighbouring pixels close), where normals are not
    assert np.abs(np.diff(eight[:2], axis=-1)).mean() < 0.2 < np.abs(np.diff(fp16[:2], axis=-1)).mean()
