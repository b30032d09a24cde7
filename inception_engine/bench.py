"""inception-bench's work: time every backend at every batch size on the same input, check its logits against the
float64 NumPy reference, and put onnxruntime (CPU) beside the CPU path in the same run.

Timing goes through each backend's ``time_forward(x, iters, warmup)`` (ms per forward, the backend's own clock:
CUDA events on the GPU, perf_counter on the CPU). Per-layer timing uses an optional backend method

    time_layers(x, iters, warmup) -> dict[str, float | list[float]]   # op name -> ms (median taken if a list)

and ``peak_memory_bytes() -> int`` where a backend has them. Names may be variants (backends.VARIANTS, e.g.
"torch-graph"); ``precision`` is passed to backends whose ``PRECISIONS`` hold it, any other row says it has no such
mode. The float64 reference runs on the first ``reference_images`` images of each batch only (the input's first
images are the same at every batch size, so it is computed once per slice size), which keeps batch 128 affordable.

Every batch size also gets the chip's two floors: compute (plan FLOPs / peak FLOP/s) and memory (weights once +
every activation buffer written once, / peak bytes/s); "x floor" is a row's median over the larger of the two.

A backend that compiles when it is built (torch-compile, torch-compile-max: torch.compile at each batch size, static
shapes) says how long that took in ``compile_seconds``; the row carries it as ``compile_s`` and the table adds a
"compile s" column when any row has one. Its timed forwards come after the compile and the usual warm-up.
"""

from __future__ import annotations

import csv
import inspect
import io
import json
import os
import platform
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import backends
from .backends import host_timed_ms
from .backends.numpy_backend import NumpyBackend
from .errors import EngineError, WeightsError
from .errors import first_line
from .plan import ConvOp, FCOp, Plan, build_plan
from .model_files import load_weights
from .weights import ENV_VAR, Weights, atomic_write, candidate_paths, find_weights

ORT = "onnxruntime"
INPUT_SEED = 0
SYNTHETIC_SEED = 0
PRECISIONS = ("fp32", "tf32", "fp16")
# The roofline's ceilings, of an H100 / H200 (the same tensor cores and clocks), as dev/measure_ceilings.py measures
# them: an fp32 SGEMM 8192^3 with TF32 off, and the fast modes' compute floor, PyTorch's 8192^3 GEMM with TF32 on and
# in fp16, dense (1.2x and 1.3x below the datasheets' 495 and 990 TFLOP/s).
FP32_PEAK_TFLOPS = 51.3
PEAK_TFLOPS = {"fp32": FP32_PEAK_TFLOPS, "tf32": 411.6, "fp16": 764.0}
PEAK_GBS = 4300.0  # an H200's device-to-device copy, bytes read + written (dev/measure_ceilings.py)
# The same ceilings of the H100 (dev/measure_ceilings.py): its HBM3 copies at 70 % of the H200's.
# Keyed by what the device's name contains; any other GPU, or none, gets the H200's above.
CEILINGS = {"H100": ({"fp32": 52.0, "tf32": 411.6, "fp16": 764.0}, 3026.0)}
REFERENCE_IMAGES = 2
CPU_ROWS = ("cpu", ORT)
DESCRIPTIONS = {
    "cpu": "our CPU path (C kernels, else NumPy; see the note)",
    "cuda": "own kernels, measured per-conv choices, one CUDA graph per forward",
    "cuda-untuned": "own kernels, the cost model's choices, one CUDA graph per forward",
    "cuda-eager": "own kernels, launched one by one",
    "cuda-unfused": "own kernels as cuda, but each 1x1 conv its own GEMM (no fused 1x1 groups)",
    "cudnn": "cuDNN + cuBLAS, one CUDA graph per forward",
    "cudnn-eager": "cuDNN + cuBLAS, called one by one from Python",
    "torch": "PyTorch eager",
    "torch-graph": "PyTorch, CUDA-graph replay",
    "torch-compile": "torch.compile(mode='reduce-overhead'): Inductor's kernels, CUDA-graph trees",
    "torch-compile-max": "torch.compile(mode='max-autotune'): Inductor's kernels, autotuned GEMMs/convs, CUDA graphs",
    ORT: "onnxruntime on the CPU",
}

Progress = Callable[[str], None]


@dataclass
class Row:
    backend: str
    batch: int
    status: str = "ok"  # "ok", "unavailable: <reason>" or "error: <what went wrong>"
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    images_per_s: float | None = None
    peak_memory_bytes: int | None = None
    rel_l2: float | None = None  # ||logits - reference|| / ||reference||, reference in float64, first images only
    top1_agree: int | None = None  # of the ``ref_images`` checked, how many have the reference's top-1 class
    ref_images: int | None = None
    x_floor: float | None = None  # median / the larger of the batch's compute and memory floors
    graph_fallback: str | None = None  # the backend was asked for a CUDA graph and runs eagerly: why
    speedup_vs_cudnn: float | None = None  # cudnn median / this median, same batch
    ratio_vs_onnxruntime: float | None = None  # this median / onnxruntime median, same batch (CPU row only)
    compile_s: float | None = None  # compiling rows: wall seconds to compile at this batch size (backend's docs)
    compile_cached: bool | None = None  # True: the compiler's on-disk caches served it; None: not known or no compile


@dataclass
class LayerTime:
    batch: int
    layer: str
    flops: int
    ms: dict[str, float] = field(default_factory=dict)  # backend -> median ms

    def gflops(self, backend: str) -> float | None:
        """None for an op without FLOPs counted (a pool, the classifier's glue)."""
        return self.flops / (self.ms[backend] * 1e-3) / 1e9 if self.flops else None


@dataclass
class Floor:
    """The chip's two lower bounds on one forward at one batch size."""

    batch: int
    flops: int
    bytes: int  # weights once + every activation buffer once, in the precision's element size
    compute_ms: float
    memory_ms: float

    @property
    def ms(self) -> float:
        return max(self.compute_ms, self.memory_ms)


def floor(plan: Plan, weights: Weights, precision: str, peak_tflops: float, peak_gbs: float) -> Floor:
    elem = 2 if precision == "fp16" else 4
    params = sum(weights.arrays[f"{op.name}.{part}"].size for op in plan.ops if isinstance(op, (ConvOp, FCOp))
                 for part in ("weight", "bias"))
    nbytes = elem * (params + sum(b.elems for b in plan.buffers.values()))
    return Floor(plan.batch, plan.flops, nbytes, plan.flops / (peak_tflops * 1e12) * 1e3,
                 nbytes / (peak_gbs * 1e9) * 1e3)


@dataclass
class Report:
    weights: str
    synthetic: bool
    iters: int
    warmup: int
    batch_sizes: list[int]
    backends: list[str]
    precision: str = "fp32"
    peak_tflops: float = FP32_PEAK_TFLOPS
    peak_gbs: float = PEAK_GBS
    reference_images: int | None = REFERENCE_IMAGES  # None: no reference
    rows: list[Row] = field(default_factory=list)
    layers: list[LayerTime] = field(default_factory=list)
    floors: list[Floor] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    host: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "weights": self.weights, "synthetic": self.synthetic, "iters": self.iters, "warmup": self.warmup,
            "batch_sizes": self.batch_sizes, "backends": self.backends, "precision": self.precision,
            "peak_tflops": self.peak_tflops, "peak_gbs": self.peak_gbs, "reference_images": self.reference_images,
            "input": f"standard normal, seed {INPUT_SEED}, float32 (N, 3, 299, 299)", "host": self.host,
            "rows": [asdict(r) for r in self.rows],
            "floors": [{**asdict(f), "ms": f.ms} for f in self.floors],
            "layers": [{**asdict(l), "gflops": {b: l.gflops(b) for b in l.ms}} for l in self.layers],
            "notes": self.notes,
        }


def host_info() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine(),
                            "cpus": os.cpu_count(), "numpy": np.__version__}
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return info


def gpu_name() -> str | None:
    """The name of the GPU the GPU backends would run on, or None where there is none (or no pycuda)."""
    from .backends.cuda.device import probe
    from .errors import BackendUnavailable

    try:
        return str(probe()[0].name())
    except BackendUnavailable:
        return None


def ceilings(device: str | None) -> tuple[dict[str, float], float]:
    """(TFLOP/s per precision, GB/s) of the named GPU: CEILINGS' entry it matches, else the H200's."""
    for key, value in CEILINGS.items():
        if device and key in device:
            return value
    return PEAK_TFLOPS, PEAK_GBS


def pick_weights(path: str | None, notes: list[str]) -> tuple[Weights, str, bool]:
    """The weights to run: --weights, else the usual places, else the synthetic model (and a note saying so)."""
    if path is None and not os.environ.get(ENV_VAR):
        try:
            found = find_weights(None)
        except WeightsError:
            from .synthetic import synthetic_weights

            looked = ", ".join(str(p) for _, p in candidate_paths(None))
            notes.append(f"no weight file found (looked in {looked}): running the SYNTHETIC model (random weights, "
                         f"seed {SYNTHETIC_SEED}); timings are real, predictions meaningless")
            return synthetic_weights(seed=SYNTHETIC_SEED), f"synthetic (seed {SYNTHETIC_SEED})", True
        return load_weights(found), str(found), False
    found = find_weights(path)
    return load_weights(found), str(found), False


def stats_row(backend: str, batch: int, times_ms: list[float]) -> Row:
    t = np.asarray(times_ms, dtype=np.float64)
    p10, p50, p90, p99 = np.percentile(t, [10, 50, 90, 99])
    return Row(backend, batch, median_ms=float(p50), p10_ms=float(p10), p90_ms=float(p90), p99_ms=float(p99),
               images_per_s=batch / (float(p50) * 1e-3))


def rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64).reshape(ref.shape)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def check_against(row: Row, out: np.ndarray, ref: np.ndarray | None) -> None:
    """rel L2 and top-1 agreement of the batch's first images (as many as the reference has) vs the reference."""
    if ref is None:
        return
    k = ref.shape[0]
    got = np.asarray(out).reshape(-1, ref.shape[1])[:k]
    row.rel_l2 = rel_l2(got, ref)
    row.top1_agree = int((got.argmax(axis=1) == ref.argmax(axis=1)).sum())
    row.ref_images = k


def backend_options(name: str, klass: Any, precision: str) -> dict[str, Any] | str:
    """The keyword options for bench name ``name`` at ``precision``, or the row's status when it cannot run so."""
    options = backends.variant(name)[1]
    accepts = "precision" in inspect.signature(klass.__init__).parameters
    if accepts and precision in getattr(klass, "PRECISIONS", (precision,)):
        return {**options, "precision": precision}
    if precision == "fp32" and not accepts:  # a backend without the keyword runs fp32
        return options
    return f"unavailable: backend has no {precision} mode"


def median_ms(v: float | list[float]) -> float:
    return float(statistics.median(v)) if isinstance(v, (list, tuple)) else float(v)


class OnnxRuntimePeer:
    """onnxruntime on the CPU running the ONNX file the weights came from (or the synthetic one)."""

    def __init__(self, onnx_path: Path):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # warnings about unused initialisers etc. are noise here
        self.session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.fixed_batch = inp.shape[0] if isinstance(inp.shape[0], int) else None

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: x})[0]

    def time_forward(self, x: np.ndarray, iters: int, warmup: int) -> list[float]:
        return host_timed_ms(lambda: self.forward(x), iters, warmup)


def onnxruntime_peer(onnx_path: str | None, synthetic: bool, tmp: Path, notes: list[str]) -> OnnxRuntimePeer | str:
    """The peer, or the reason there is none (which becomes the row's status)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return "unavailable: onnxruntime is not installed (pip install onnxruntime)"
    if onnx_path is None:
        if not synthetic:
            return "unavailable: pass --onnx MODEL.onnx (the file the weights were converted from)"
        from .synthetic import write_synthetic_onnx

        onnx_path = str(write_synthetic_onnx(tmp / "synthetic.onnx", seed=SYNTHETIC_SEED))
        notes.append(f"onnxruntime runs the synthetic model written as ONNX (seed {SYNTHETIC_SEED})")
    if not Path(onnx_path).is_file():
        raise EngineError(f"{onnx_path}: no such ONNX file (--onnx)")
    try:
        return OnnxRuntimePeer(Path(onnx_path))
    except Exception as e:  # onnxruntime's own exception types; the message says what it could not load
        return f"error: onnxruntime cannot load {onnx_path}: {first_line(e)}"


def run_backend(name: str, klass: Any, options: dict[str, Any], weights: Weights, plan: Plan, x: np.ndarray,
                ref: np.ndarray | None, iters: int, warmup: int,
                per_layer: bool) -> tuple[Row, dict[str, tuple[float, int]]]:
    """The backend's row and, with per_layer, each op's (median ms, FLOPs; 0 for the ops that are no conv), by the
    names of the plan it ran (a backend may run a plan of its own: the CUDA NHWC path fuses each module's 1x1 convs
    and folds a max pool into the conv behind it), in that plan's order."""
    backend = klass(weights, plan, **options)
    try:
        out = backend.forward(x)
        row = stats_row(name, plan.batch, backend.time_forward(x, iters, warmup))
        row.graph_fallback = getattr(backend, "graph_fallback", None)
        row.compile_s = getattr(backend, "compile_seconds", None)
        row.compile_cached = getattr(backend, "compile_cached", None)
        check_against(row, out, ref)
        if hasattr(backend, "peak_memory_bytes"):
            row.peak_memory_bytes = int(backend.peak_memory_bytes())
        layer_ms: dict[str, tuple[float, int]] = {}
        if per_layer and hasattr(backend, "time_layers"):
            flops = {op.name: op.flops for op in getattr(backend, "plan", plan).conv_ops}
            layer_ms = {k: (median_ms(v), flops.get(k, 0)) for k, v in backend.time_layers(x, iters, warmup).items()}
        return row, layer_ms
    finally:
        backend.close()


def run_bench(backend_names: list[str], batch_sizes: list[int], iters: int = 20, warmup: int = 3,
              weights_path: str | None = None, onnx_path: str | None = None, per_layer: bool = False,
              reference: bool = True, progress: Progress | None = None, precision: str = "fp32",
              peak_tflops: float | None = None, peak_gbs: float | None = None,
              reference_images: int = REFERENCE_IMAGES) -> Report:
    """``peak_tflops``, ``peak_gbs`` None: this GPU's measured ceilings (``ceilings``)."""
    if iters < 1 or warmup < 0:
        raise EngineError(f"--iters must be >= 1 and --warmup >= 0, got {iters} and {warmup}")
    if not backend_names or not batch_sizes or min(batch_sizes) < 1:
        raise EngineError("need at least one backend and batch sizes >= 1")
    if precision not in PRECISIONS:
        raise EngineError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if any(p is not None and p <= 0 for p in (peak_tflops, peak_gbs)) or reference_images < 1:
        raise EngineError("--peak-tflops and --peak-gbs must be > 0 and --reference-images >= 1")
    say = progress or (lambda _msg: None)
    notes: list[str] = []
    if peak_tflops is None or peak_gbs is None:
        device = gpu_name()
        tflops, gbs = ceilings(device)
        peak_tflops = tflops[precision] if peak_tflops is None else peak_tflops
        peak_gbs = gbs if peak_gbs is None else peak_gbs
        if device is not None and (tflops, gbs) == (PEAK_TFLOPS, PEAK_GBS) and "H200" not in device:
            notes.append(f"floors: no measured ceilings for {device}, the H200's used (give --peak-tflops and "
                         f"--peak-gbs)")
    weights, weights_desc, synthetic = pick_weights(weights_path, notes)
    if "cpu" in backend_names:
        notes.append(cpu_path_note())
    report = Report(weights_desc, synthetic, iters, warmup, list(batch_sizes), list(backend_names), precision,
                    peak_tflops, peak_gbs, reference_images if reference else None, notes=notes, host=host_info())
    classes: dict[str, Any] = {}
    options: dict[str, dict[str, Any]] = {}
    for name in backend_names:
        try:
            classes[name] = backends.backend_class(backends.variant(name)[0])
        except EngineError as e:
            classes[name] = f"unavailable: {e}"
            continue
        opts = backend_options(name, classes[name], precision)
        if isinstance(opts, str):
            classes[name] = opts
        else:
            options[name] = opts

    refs: dict[int, np.ndarray] = {}  # images -> float64 logits of the input's first images
    with tempfile.TemporaryDirectory(prefix="inception-bench-") as tmp:
        peer = None
        if "cpu" in backend_names:
            peer = (onnxruntime_peer(onnx_path, synthetic, Path(tmp), notes) if precision == "fp32"
                    else f"unavailable: the {ORT} peer runs fp32 only")
        for batch in batch_sizes:
            plan = build_plan(batch, weights.layers())
            report.floors.append(floor(plan, weights, precision, peak_tflops, peak_gbs))
            # the first k images of this draw are the first k of any batch size's draw (one stream of normals)
            x = np.random.default_rng(INPUT_SEED).standard_normal(plan.input.dims).astype(np.float32)
            ref = None
            if reference:
                k = min(batch, reference_images)
                if k not in refs:
                    say(f"float64 NumPy reference on the input's first {k} image(s)")
                    refs[k] = NumpyBackend(weights, build_plan(k, weights.layers()), dtype=np.float64).forward(
                        x[:k].astype(np.float64))
                ref = refs[k]
            layer_times: dict[str, LayerTime] = {}  # in the order of the first backend's plan
            for name in backend_names:
                klass = classes[name]
                if isinstance(klass, str):
                    report.rows.append(Row(name, batch, status=klass))
                    continue
                if "compile_mode" in options[name]:  # say why nothing seems to happen for a while
                    say(f"batch {batch}: {name}, torch.compile(mode={options[name]['compile_mode']!r}) first")
                say(f"batch {batch}: {name}, {warmup} warm-up + {iters} timed forwards")
                try:
                    row, layer_ms = run_backend(name, klass, options[name], weights, plan, x, ref, iters, warmup,
                                                per_layer)
                except EngineError as e:
                    row, layer_ms = Row(name, batch, status=f"unavailable: {e}"), {}
                except Exception as e:  # a backend failing at one batch size must not hide the other rows
                    row, layer_ms = Row(name, batch, status=f"error: {type(e).__name__}: {first_line(e)}"), {}
                report.rows.append(row)
                if row.graph_fallback:
                    notes.append(f"{name}, batch {batch}: {row.graph_fallback}")
                for layer, (ms, flops) in layer_ms.items():
                    layer_times.setdefault(layer, LayerTime(batch, layer, flops)).ms[name] = ms
            if peer is not None:
                report.rows.append(run_peer(peer, batch, x, ref, iters, warmup, say))
            report.layers += [l for l in layer_times.values() if l.ms]
    compare(report)
    if per_layer and not report.layers:
        notes.append("--per-layer: no backend in this run has time_layers() (the GPU backends do)")
    return report


def run_peer(peer: OnnxRuntimePeer | str, batch: int, x: np.ndarray, ref: np.ndarray | None, iters: int,
             warmup: int, say: Progress) -> Row:
    if isinstance(peer, str):
        return Row(ORT, batch, status=peer)
    if peer.fixed_batch is not None and peer.fixed_batch != batch:
        return Row(ORT, batch, status=f"unavailable: the ONNX model's batch size is fixed at {peer.fixed_batch}")
    say(f"batch {batch}: {ORT}, {warmup} warm-up + {iters} timed forwards")
    try:
        out = peer.forward(x)
        row = stats_row(ORT, batch, peer.time_forward(x, iters, warmup))
    except Exception as e:  # onnxruntime's own error types
        return Row(ORT, batch, status=f"error: {first_line(e)}")
    check_against(row, out, ref)
    return row


def compare(report: Report) -> None:
    """Fill in speed-up vs cudnn, the CPU / onnxruntime ratio and the distance to the floor, batch by batch."""
    floors = {f.batch: f for f in report.floors}
    for batch in report.batch_sizes:
        ok = {r.backend: r for r in report.rows if r.batch == batch and r.status == "ok"}
        if batch in floors:  # the floors are the GPU's: the CPU rows have none
            for r in ok.values():
                if r.backend not in CPU_ROWS:
                    r.x_floor = r.median_ms / floors[batch].ms
        if "cudnn" in ok:
            for r in ok.values():
                if r.backend != ORT:
                    r.speedup_vs_cudnn = ok["cudnn"].median_ms / r.median_ms
        if "cpu" in ok and ORT in ok:
            ok["cpu"].ratio_vs_onnxruntime = ok["cpu"].median_ms / ok[ORT].median_ms


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


COLUMNS = ("backend", "batch", "median ms", "p10 ms", "p90 ms", "p99 ms", "images/s", "peak MiB", "rel L2",
           "top-1", "x floor", "x cudnn", "cpu/ort")
COMPILE_COLUMN = "compile s"  # added after COLUMNS when a row compiled


def compiled(report: Report) -> bool:
    return any(r.compile_s is not None for r in report.rows)


def compile_cell(r: Row) -> str:
    return fmt(r.compile_s, ".1f") + (" cached" if r.compile_s is not None and r.compile_cached else "")


def label(r: Row) -> str:
    return f"{r.backend} (eager)" if r.graph_fallback else r.backend


def cpu_path_note() -> str:
    """Which code the cpu rows run: the fast C kernels, or the NumPy fallback and why (it is ~2x slower)."""
    from .backends import cpu_kernels

    reason = cpu_kernels.unavailable_reason()
    if reason is None:
        return "cpu runs the C kernels of cpu_src/ (AVX-512, compiled at first use)"
    return f"cpu runs its NumPy code (about 2x slower): the C kernels are unavailable: {reason}"


def header(report: Report) -> list[str]:
    lines = [f"weights: {report.weights}; precision {report.precision}",
             f"{report.warmup} warm-up + {report.iters} timed forwards per row; input N(0, 1) seed {INPUT_SEED}"]
    if report.reference_images is not None:
        lines.append(f"rel L2 and top-1 = logits of each batch's first {report.reference_images} image(s) (fewer "
                     f"if the batch is smaller) vs the float64 NumPy reference on those images")
    names = [*report.backends, *([ORT] if "cpu" in report.backends else [])]
    lines.append("backends: " + "; ".join(f"{n} = {DESCRIPTIONS[n]}" for n in names if n in DESCRIPTIONS))
    peak = f"{report.peak_tflops:g} TFLOP/s"
    if gpu_rows(report):
        lines.append(f"x floor (GPU rows) = median / the GPU's larger floor (compute: FLOPs / {peak}; memory: "
                     f"weights + all activations once / {report.peak_gbs:g} GB/s)")
    if compiled(report):
        lines.append(f"{COMPILE_COLUMN} = wall seconds of compiling at that batch size, each batch size separately "
                     f"(static shapes): torch.compile's first calls, from Dynamo's trace through Inductor's code "
                     f"generation and autotuning to the CUDA graph's capture; 'cached': Inductor's on-disk caches "
                     f"served the code (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 compiles from scratch)")
    return lines


def gpu_rows(report: Report) -> bool:
    """Whether a GPU backend measured anything: the floors (the GPU's) mean nothing to a CPU-only table."""
    return any(r.status == "ok" and r.backend not in ("cpu", ORT) for r in report.rows)


def floor_lines(report: Report) -> list[str]:
    lines = ["floors:"]
    for f in report.floors:
        lines.append(f"  batch {f.batch:>4}: compute {f.compute_ms:.3f} ms ({f.flops / 1e9:.1f} GFLOP), memory "
                     f"{f.memory_ms:.3f} ms ({f.bytes / 1e6:.0f} MB)")
    return lines


def table(report: Report) -> str:
    lines = header(report)
    lines += [f"note: {n}" for n in report.notes]
    columns = (*COLUMNS, COMPILE_COLUMN) if compiled(report) else COLUMNS
    body: list[tuple[str, ...]] = []
    for r in report.rows:
        if r.status != "ok":
            body.append((label(r), str(r.batch), r.status))
            continue
        mem = None if r.peak_memory_bytes is None else r.peak_memory_bytes / 2**20
        top1 = "-" if r.top1_agree is None else f"{r.top1_agree}/{r.ref_images}"
        cells = (label(r), str(r.batch), fmt(r.median_ms, ".2f"), fmt(r.p10_ms, ".2f"), fmt(r.p90_ms, ".2f"),
                 fmt(r.p99_ms, ".2f"), fmt(r.images_per_s, ".1f"), fmt(mem, ".0f"), fmt(r.rel_l2, ".1e"),
                 top1, fmt(r.x_floor, ".1f"), fmt(r.speedup_vs_cudnn, ".2f"), fmt(r.ratio_vs_onnxruntime, ".2f"))
        body.append((*cells, compile_cell(r)) if len(columns) > len(COLUMNS) else cells)
    measured = [b for b in body if len(b) == len(columns)]
    widths = [max([len(c)] + [len(b[i]) for b in measured]) for i, c in enumerate(columns)]
    widths[0] = max([widths[0]] + [len(b[0]) for b in body])
    widths[1] = max([widths[1]] + [len(b[1]) for b in body])

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    lines += ["", line(columns)]
    for b in body:  # a row that did not run has its status spanning the rest of the line
        lines.append(line(b) if len(b) == len(columns) else f"{line(b[:2])}  {b[2]}")
    if report.floors and gpu_rows(report):
        lines += ["", *floor_lines(report)]
    if report.layers:
        lines += ["", layer_table(report)]
    return "\n".join(lines)


def layer_table(report: Report) -> str:
    names = [b for b in report.backends if any(b in l.ms for l in report.layers)]
    head = f"{'batch':>5}  {'op':<32}{'GFLOP':>8}" + "".join(f"  {n + ' ms':>12}  {'GFLOP/s':>8}" for n in names)
    lines = ["per-op times (every op of the plan each backend ran, launched one at a time; GFLOP/s of the convs):",
             head]
    for l in report.layers:
        cells = "".join(f"  {fmt(l.ms.get(n), '.3f'):>12}  {fmt(l.gflops(n) if n in l.ms else None, '.0f'):>8}"
                        for n in names)
        lines.append(f"{l.batch:>5}  {l.layer:<32}{l.flops / 1e9:>8.3f}{cells}")
    return "\n".join(lines)


def write_json(report: Report, path: str | Path) -> Path:
    data = json.dumps(report.to_json(), indent=2).encode()
    return atomic_write(path, lambda f: f.write(data))


CSV_FIELDS = [f.name for f in Row.__dataclass_fields__.values()]


def write_csv(report: Report, path: str | Path) -> list[Path]:
    """The rows to ``path``; per-layer times (when any) to ``<stem>_layers.csv`` beside it."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for r in report.rows:
        w.writerow(asdict(r))
    written = [atomic_write(path, lambda f: f.write(buf.getvalue().encode()))]
    if report.layers:
        lbuf = io.StringIO()
        lw = csv.writer(lbuf, lineterminator="\n")
        lw.writerow(["batch", "layer", "flops", "backend", "ms", "gflops"])
        for l in report.layers:
            for b, ms in l.ms.items():
                lw.writerow([l.batch, l.layer, l.flops, b, ms, l.gflops(b)])
        path = Path(path)
        written.append(atomic_write(path.with_name(path.stem + "_layers.csv"),
                                    lambda f: f.write(lbuf.getvalue().encode())))
    return written


def require_matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise EngineError("--plot needs matplotlib, which is not installed: pip install matplotlib "
                          "(or pip install -e '.[plot]')") from None
    return plt


def write_plot(report: Report, path: str | Path) -> Path:
    """Latency vs batch size per backend; with per-layer times, a second panel of bars per op (largest batch size
    measured)."""
    plt = require_matplotlib()
    panels = 2 if report.layers else 1
    fig, axes = plt.subplots(panels, 1, figsize=(12, 4.5 * panels), squeeze=False)
    ax = axes[0][0]
    for name in dict.fromkeys(r.backend for r in report.rows):
        pts = [(r.batch, r.median_ms) for r in report.rows if r.backend == name and r.status == "ok"]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    ax.set(xlabel="batch size", ylabel="median latency (ms)", title=f"Inception-V3 forward, weights: {report.weights}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(report.batch_sizes, [str(b) for b in report.batch_sizes])
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if report.layers:
        batch = max(l.batch for l in report.layers)
        layers = [l for l in report.layers if l.batch == batch]
        names = [b for b in report.backends if any(b in l.ms for l in layers)]
        ax = axes[1][0]
        width = 0.8 / len(names)
        for k, name in enumerate(names):
            ax.bar([i + k * width for i in range(len(layers))], [l.ms.get(name, 0.0) for l in layers], width,
                   label=name)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(layers))], [l.layer for l in layers], rotation=90,
                      fontsize=5)
        ax.set(ylabel="ms", title=f"per-op times, batch {batch}")
        ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return atomic_write(path, lambda f: f.write(buf.getvalue()))
