"""What an inception-bench run measured and how it is written: ``Report`` (a row per backend and batch size, the
per-op times, the chip's floors, notes) and the table, JSON, CSV and plot made from it. bench.py runs the rows."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import EngineError
from .weights import atomic_write

ORT = "onnxruntime"
INPUT_SEED = 0
# The roofline's ceilings, of an H100 / H200 (the same tensor cores and clocks), as dev/measure_ceilings.py measures
# them: an fp32 SGEMM 8192^3 with TF32 off, and the fast modes' compute floor, PyTorch's 8192^3 GEMM with TF32 on and
# in fp16, dense (1.2x and 1.3x below the datasheets' 495 and 990 TFLOP/s).
FP32_PEAK_TFLOPS = 51.3
# int8 (TOPS): twice the measured fp16 GEMM peak, the datasheets' ratio of dense int8 to fp16 on Hopper (H100 SXM:
# 1,979 against 989.5), not measured here
PEAK_TFLOPS = {"fp32": FP32_PEAK_TFLOPS, "tf32": 411.6, "fp16": 764.0, "int8": 1528.0}
PEAK_GBS = 4300.0  # an H200's device-to-device copy, bytes read + written (dev/measure_ceilings.py)
# The same ceilings of the H100 (dev/measure_ceilings.py): its HBM3 copies at 70 % of the H200's.
# Keyed by what the device's name contains; any other GPU, or none, gets the H200's above.
CEILINGS = {"H100": ({"fp32": 52.0, "tf32": 411.6, "fp16": 764.0, "int8": 1528.0}, 3026.0)}
REFERENCE_IMAGES = 2
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
