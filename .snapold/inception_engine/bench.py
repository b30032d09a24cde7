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

import inspect
import os
import platform
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import backends
from .backends import host_timed_ms
from .backends.numpy_backend import NumpyBackend
from .bench_report import (CEILINGS, INPUT_SEED, ORT, PEAK_GBS, PEAK_TFLOPS, REFERENCE_IMAGES, Floor, LayerTime, Report,
                           Row)
from .errors import EngineError, WeightsError
from .errors import first_line
from .plan import ConvOp, FCOp, Plan, build_plan
from .model_files import load_weights
from .weights import ENV_VAR, Weights, candidate_paths, find_weights

# inception-bench's work as cli.py calls it: running (here) and writing the results (bench_report.py)
SYNTHETIC_SEED = 0
PRECISIONS = ("fp32", "tf32", "fp16", "int8")
CPU_ROWS = ("cpu", ORT)

Progress = Callable[[str], None]


def floor(plan: Plan, weights: Weights, precision: str, peak_tflops: float, peak_gbs: float) -> Floor:
    elem = 2 if precision == "fp16" else 4
    params = sum(weights.arrays[f"{op.name}.{part}"].size for op in plan.ops if isinstance(op, (ConvOp, FCOp))
                 for part in ("weight", "bias"))
    nbytes = elem * (params + sum(b.elems for b in plan.buffers.values()))
    return Floor(plan.batch, plan.flops, nbytes, plan.flops / (peak_tflops * 1e12) * 1e3,
                 nbytes / (peak_gbs * 1e9) * 1e3)


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


def onnxruntime_peer(onnx_path: str | None, synthetic: bool, tmp: Path, notes: list[str]
                     ) -> OnnxRuntimePeer | str | None:
    """The peer, or the reason there is none (which becomes the row's status); None, and a note, where onnxruntime
    is not installed (a base install: no row only to say so)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        notes.append(f"no {ORT} row: onnxruntime is not installed (pip install onnxruntime adds it, and the cpu/ort "
                     f"column)")
        return None
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


def check_options(backend_names: list[str], batch_sizes: list[int], iters: int, warmup: int, precision: str,
                  peak_tflops: float | None, peak_gbs: float | None, reference_images: int) -> None:
    """run_bench's arguments, each refused in one line naming the option."""
    if iters < 1 or warmup < 0:
        raise EngineError(f"--iters must be >= 1 and --warmup >= 0, got {iters} and {warmup}")
    if not backend_names or not batch_sizes or min(batch_sizes) < 1:
        raise EngineError("need at least one backend and batch sizes >= 1")
    if precision not in PRECISIONS:
        raise EngineError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if any(p is not None and p <= 0 for p in (peak_tflops, peak_gbs)) or reference_images < 1:
        raise EngineError("--peak-tflops and --peak-gbs must be > 0 and --reference-images >= 1")


def this_gpus_ceilings(precision: str, peak_tflops: float | None, peak_gbs: float | None,
                       notes: list[str]) -> tuple[float, float]:
    """(TFLOP/s, GB/s): those given, the others this GPU's (``ceilings``), with a note where it has none measured."""
    device = gpu_name()
    tflops, gbs = ceilings(device)
    peak_tflops = tflops[precision] if peak_tflops is None else peak_tflops
    peak_gbs = gbs if peak_gbs is None else peak_gbs
    if device is not None and (tflops, gbs) == (PEAK_TFLOPS, PEAK_GBS) and "H200" not in device:
        notes.append(f"floors: no measured ceilings for {device}, the H200's used (give --peak-tflops and "
                     f"--peak-gbs)")
    return peak_tflops, peak_gbs


def backend_classes(backend_names: list[str], precision: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Each name's backend class, or the status of its rows where it cannot run (a str); the options of those that
    can."""
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
    return classes, options


def run_row(name: str, klass: Any, options: dict[str, Any] | None, weights: Weights, plan: Plan, x: np.ndarray,
            ref: np.ndarray | None, iters: int, warmup: int, per_layer: bool,
            say: Progress) -> tuple[Row, dict[str, tuple[float, int]]]:
    """run_backend's row at the plan's batch size; where the backend cannot run (``klass`` a status) or fails, the
    row says so and the other rows go on."""
    batch = plan.batch
    if isinstance(klass, str):
        return Row(name, batch, status=klass), {}
    if "compile_mode" in options:  # say why nothing seems to happen for a while
        say(f"batch {batch}: {name}, torch.compile(mode={options['compile_mode']!r}) first")
    say(f"batch {batch}: {name}, {warmup} warm-up + {iters} timed forwards")
    try:
        return run_backend(name, klass, options, weights, plan, x, ref, iters, warmup, per_layer)
    except EngineError as e:
        return Row(name, batch, status=f"unavailable: {e}"), {}
    except Exception as e:  # a backend failing at one batch size must not hide the other rows
        return Row(name, batch, status=f"error: {type(e).__name__}: {first_line(e)}"), {}


def bench_input(dims: tuple[int, ...], precision: str, reference_images: int) -> np.ndarray:
    """The timed batch: N(0, 1) from seed INPUT_SEED, whose first k images are the first k of any batch size's draw
    (one stream of normals); for int8 the first ``reference_images`` are image-like instead (the same for every batch
    size), since N(0, 1) lies outside the range an 8-bit network's scales were calibrated on."""
    x = np.random.default_rng(INPUT_SEED).standard_normal(dims).astype(np.float32)
    if precision == "int8":
        from .synthetic import image_like_batch

        k = min(dims[0], reference_images)
        x[:k] = image_like_batch(reference_images, seed=INPUT_SEED, size=dims[-1])[:k]
    return x


def run_bench(backend_names: list[str], batch_sizes: list[int], iters: int = 20, warmup: int = 3,
              weights_path: str | None = None, onnx_path: str | None = None, per_layer: bool = False,
              reference: bool = True, progress: Progress | None = None, precision: str = "fp32",
              peak_tflops: float | None = None, peak_gbs: float | None = None,
              reference_images: int = REFERENCE_IMAGES) -> Report:
    """``peak_tflops``, ``peak_gbs`` None: this GPU's measured ceilings (``ceilings``)."""
    check_options(backend_names, batch_sizes, iters, warmup, precision, peak_tflops, peak_gbs, reference_images)
    say = progress or (lambda _msg: None)
    notes: list[str] = []
    if peak_tflops is None or peak_gbs is None:
        peak_tflops, peak_gbs = this_gpus_ceilings(precision, peak_tflops, peak_gbs, notes)
    weights, weights_desc, synthetic = pick_weights(weights_path, notes)
    if "cpu" in backend_names:
        notes.append(cpu_path_note())
    if precision == "int8":
        notes.append(f"int8: each batch's first {reference_images} image(s) are image-like "
                     f"(synthetic.image_like_batch, seed {INPUT_SEED}), the rest N(0, 1), so that rel L2 and top-1 "
                     f"judge the 8-bit network on inputs like those its scales were calibrated on; its accuracy "
                     f"over many images: dev/int8_accuracy.py")
    report = Report(weights_desc, synthetic, iters, warmup, list(batch_sizes), list(backend_names), precision,
                    peak_tflops, peak_gbs, reference_images if reference else None, notes=notes, host=host_info())
    classes, options = backend_classes(backend_names, precision)

    refs: dict[int, np.ndarray] = {}  # images -> float64 logits of the input's first images
    with tempfile.TemporaryDirectory(prefix="inception-bench-") as tmp:
        peer = None
        if "cpu" in backend_names:
            peer = (onnxruntime_peer(onnx_path, synthetic, Path(tmp), notes) if precision == "fp32"
                    else f"unavailable: the {ORT} peer runs fp32 only")
        for batch in batch_sizes:
            plan = build_plan(batch, weights.layers())
            report.floors.append(floor(plan, weights, precision, peak_tflops, peak_gbs))
            x = bench_input(plan.input.dims, precision, reference_images)
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
                row, layer_ms = run_row(name, classes[name], options.get(name), weights, plan, x, ref, iters, warmup,
                                        per_layer, say)
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


def cpu_path_note() -> str:
    """Which code the cpu rows run: the fast C kernels, or the NumPy fallback and why (it is ~2x slower)."""
    from .backends import cpu_kernels

    reason = cpu_kernels.unavailable_reason()
    if reason is None:
        return "cpu runs the C kernels of cpu_src/ (AVX-512, compiled at first use)"
    return f"cpu runs its NumPy code (about 2x slower): the C kernels are unavailable: {reason}"
