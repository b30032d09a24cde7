"""The console commands: inception-run, inception-convert-weights, inception-bench, inception-tune (``python -m
inception_engine`` lists those installed). Each takes --version and -h/--help; placeholders are capitals (N, K, X,
FILE, LIST) or a file's shape (MODEL.onnx), never click's type names.

User mistakes (EngineError, and click's usage errors: an unknown option, a bad value) print one line
``error: <message>`` on stderr and exit with code 2; an image that cannot be read is reported with the others'
results and makes inception-run exit with 1.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from . import backends
from .commands import CONTEXT, Command, command_start, plural, stderr_is_tty, user_errors, version_option
from .config import (BACKEND_CHOICES, DECODE_CHOICES, NO_GPU_NOTE, PRECISION_CHOICES, RESIZE_MODES, WORKER_KINDS,
                     RunConfig)
from .drivers import start_driver
from .errors import EngineError
from .ingest.entries import DECODE_BYTES_PER_PIXEL, DEFAULT_MAX_PIXELS, MAX_PIXELS_ENV
from .ingest.inputs import expand_inputs, may_hold_images, no_images_line
from .output import ResultFile, ResumeSummary
from .output_read import image_key
from .results import Prediction
from .sinks import interrupted, make_sink, progress_bar, terminal_echo, write_results

MIN_BAR_COLUMNS = 40  # a terminal narrower than this gets no progress bar (at 0 columns tqdm drew empty lines)


# ---------------------------------------------------------------------------------------------------- inception-run

def progress_bar_fits() -> bool:
    """A progress bar on stderr: only on a terminal wide enough to draw one."""
    if not stderr_is_tty():
        return False
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns >= MIN_BAR_COLUMNS
    except OSError:
        return False


def shown_before(note: str) -> bool:
    """Whether this machine's user has seen ``note`` already (a line in the user cache's notes-shown file), and
    remember it as seen. A note that cannot be remembered (no writable cache) is shown every time."""
    from .weights import user_cache_dir

    path = user_cache_dir() / "notes-shown"
    if path.is_symlink() or path.exists() and not path.is_file():
        return False  # only a regular file is ever replaced
    try:
        seen = path.read_text().splitlines() if path.is_file() else []
        if note in seen:
            return True
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            f.write("".join(line + "\n" for line in [*seen, note]))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        pass
    return False


@click.command(name="inception-run", cls=Command, context_settings=CONTEXT)
@click.argument("images", nargs=-1, required=True)
@click.option("--weights", "weights_path", metavar="FILE",
              help="The engine's weight file (.npz), or torchvision's ONNX export itself (.onnx: converted once, then "
                   "cached) [default: $INCEPTION_WEIGHTS, then weights/inception_v3.npz, then the user cache].")
@click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True,
              help="auto = cuda when a GPU and pycuda are usable, else cpu.")
@click.option("--precision", type=click.Choice(PRECISION_CHOICES), default="auto", show_default=True,
              help="auto = tf32 on the GPU (as PyTorch's and cuDNN's convolutions default to), fp32 on the CPU; "
                   "one the backend lacks is refused.")
@click.option("--top-k", type=click.IntRange(1, 1000), default=5, show_default=True, metavar="K",
              help="The K most likely classes of each image.")
@click.option("--batch-size", type=click.IntRange(1, 4096), default=None, show_default="64 on the GPU, 8 on the CPU",
              metavar="N", help="Images per forward.")
@click.option("--workers", type=click.IntRange(1, 1024), default=None, metavar="N",
              help="Decode workers [default: one per usable CPU].")
@click.option("--worker-kind", type=click.Choice(WORKER_KINDS), default="auto", show_default=True,
              help="Decode in processes (auto: for runs of 256 images or more; 2.7x threads' rate on 16 cores) or "
                   "in threads (no start-up).")
@click.option("--decode", type=click.Choice(DECODE_CHOICES), default="cpu", show_default=True,
              help="cpu: Pillow, torchvision's preprocessing exactly. gpu: JPEGs decoded by nvImageCodec and resized "
                   "on the GPU as Pillow does (cuda backend; pip install -e '.[gpu-decode]').")
@click.option("--resize", type=click.Choice(RESIZE_MODES), default=None,
              help="Whose preprocessing (on either decode) [default: the weight file's network's: "
                   "torchvision's for the classifier, pytorch-fid's for the FID network].")
@click.option("--output", "output_path", metavar="FILE",
              help="Write results to FILE.jsonl (one JSON line per image) or FILE.csv as they finish, instead of "
                   "printing them.")
@click.option("--resume", is_flag=True,
              help="With --output: skip the images FILE has results for, run again those that failed, append the "
                   "rest. Refused where FILE's results came from other weights, backend or precision.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None, metavar="[ADDRESS]",
              help="Run on a Ray cluster through Ray Data (ADDRESS: auto, local, ray://HOST:PORT; none: the running "
                   "one, else a new local one); IMAGE... may be URIs such as s3://, --output a directory.")
@click.option("--gpus", type=click.IntRange(0), default=None, metavar="N",
              help="GPUs to use: with --ray, GPU actors [default: all]; without, worker processes on this "
                   "machine, one per GPU [default: 1]; more than the machine has is refused. More GPUs help where "
                   "decoding keeps up with them: fp32, or --decode gpu.")
@click.option("--max-pixels", type=click.IntRange(1), default=None, metavar="N",
              help=f"Refuse an image that declares more than N pixels, before decoding it [default: ${MAX_PIXELS_ENV}, "
                   f"else {DEFAULT_MAX_PIXELS:,}, Pillow's decompression-bomb limit]. Raise it only for files you "
                   f"trust: decoding one image holds up to ~{DECODE_BYTES_PER_PIXEL} bytes a pixel in each decode "
                   f"worker (200 million pixels: ~{200e6 * DECODE_BYTES_PER_PIXEL / 1e9:.1f} GB a worker).")
@click.option("--server", "server_url", metavar="URL",
              help="Have a running inception-serve at URL (http://HOST:PORT) compute the results: the files are "
                   "read here and sent; the output is a local run's on the server's backend and precision.")
@click.option("-r", "--recursive", is_flag=True,
              help="Search directories' subfolders too (default: a directory's top level, and a notice of what "
                   "its subfolders hold).")
@click.option("--features", metavar="OUT.npy",
              help="Also write each image's 2048 pool features (float32, input order) to OUT.npy, its image list "
                   "to OUT.txt; from the same forward.")
@version_option
@user_errors
def run_cmd(images: tuple[str, ...], **options: Any) -> None:
    """Classify IMAGE... (files, directories, globs) with Inception-V3 and print the top-k ImageNet classes."""
    started = command_start()
    if options["ray_address"] is not None:
        from .ray_data import require_ray, run_on_ray

        require_ray()  # said before the weights are looked for
    run = run_config(images, options)
    if run.driver != "ray" and not may_hold_images(run.images, run.recursive):  # a usage error: before any loading
        raise EngineError(no_images_line(run.images, run.recursive))
    if run.driver == "ray":
        return run_on_ray(run)
    if run.gpus == 1:
        # before the weights are read: a machine without a GPU is refused at once (--gpus N checks the count as its
        # workers start: multi_gpu.start_on_gpus)
        backends.require_gpus(1)
    if run.driver != "server":  # which decodes nothing here, and never imports Pillow's Image
        from PIL import Image

        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # images.open_image refuses those itself
    out = ResultFile(run.output, run.top_k, run.resume) if run.output else None
    try:
        stats = run_here(run, out, started)
    except KeyboardInterrupt:  # before the results began: the engine or the workers starting, the inputs listed
        click.echo("interrupted before the first result", err=True)
        raise click.exceptions.Exit(130) from None
    finally:
        if out is not None:
            out.close()
    if out is not None:
        click.echo(stats.summary(out.path), err=True)
    if stats.failed:
        click.echo(f"error: {stats.failed} of {stats.total} inputs could not be classified", err=True)
        raise click.exceptions.Exit(1)


def run_config(images: tuple[str, ...], o: dict[str, Any]) -> RunConfig:
    """inception-run's options as one checked RunConfig."""
    engine = {"weights": o["weights_path"], **{k: o[k] for k in ("backend", "precision", "batch_size", "workers",
                                                                  "worker_kind", "decode", "max_pixels", "resize")}}
    return RunConfig(engine, images, o["top_k"], o["recursive"], o["output_path"], o["resume"], o["as_json"],
                     o["gpus"], o["ray_address"], o["server_url"], o["features"])


@dataclass(frozen=True)
class RunStats:
    """How a run went, for its summary line: results, errors, the clock at the command's start (commands.
    command_start: its process's start, the interpreter and the imports counted), first and last result."""

    total: int
    failed: int
    todo: int
    batch: int
    computed_in: str
    t0: float
    first_at: float | None
    last_at: float

    def summary(self, path: Path) -> str:
        # the rate between the first result and the last, past start-up (backend, kernels, decoders, the pipeline
        # filling) and before the teardown (the engine's or the workers' end): what a long run settles at. The
        # first batch's images came with the first result.
        end = time.perf_counter()
        after = self.todo - min(self.todo, self.batch)
        steady = (f", {after / max(self.last_at - self.first_at, 1e-9):.0f} images/s after the first result at "
                  f"{self.first_at - self.t0:.2f} s" if self.first_at is not None and after >= self.batch else "")
        return (f"{plural(self.total, 'image')} ({plural(self.failed, 'error')}) in {end - self.t0:.1f} s on the "
                f"{self.computed_in}, {self.todo / max(end - self.t0, 1e-9):.0f} images/s{steady} -> {path}")


def run_here(run: RunConfig, out: ResultFile | None, started: float) -> RunStats:
    """The run on this machine's driver (this process, or one worker per GPU), results into the run's sink. The
    driver (the engine's weights, with --decode gpu nvImageCodec's start; or the workers) starts before the inputs
    are listed, so that listing a large folder overlaps its start-up."""
    progress: list[Callable[[int], None]] = []  # the progress bar's update, once it exists
    driver = start_driver(run, lambda n: progress[0](n) if progress else None, out.fmt if out is not None else None)
    try:
        inputs, resumed = list_inputs(run, out)
        todo = [path for path, err in inputs if err is None]
        preds = driver.stream(todo)  # --gpus: the workers get their inputs now, before their facts are read
        try:
            facts = driver.facts()
        except KeyboardInterrupt:  # while worker 0 builds its engine, which may take long (kernels compiling)
            raise interrupted(0, len(inputs), out.path if out is not None else None) from None
        show_notes(facts.notes)
        # notes taken mid-run (by this engine or a --gpus worker's): printed with or without the progress bar
        driver.on_note = lambda note: terminal_echo(f"note: {note}", err=True)
        computed_in = f"{facts.backend_name} backend, {facts.precision}"
        show = progress_bar_fits() and len(todo) > facts.batch_size
        first_at: list[float] = []  # when the first result came: start-up ends there
        t0 = started  # the summary's times count from the command's start, as its user's clock does
        with progress_bar(len(todo), "classifying", "img", show) as bar:
            # results to the bar's terminal: clear the bar around each write (into a file or a pipe: no need)
            echo = terminal_echo if show and sys.stdout.isatty() else click.echo
            sink = make_sink(out, run.as_json, facts, echo)  # a file of another model is refused here
            if resumed is not None:  # said once the file is known to be this run's to continue
                click.echo(resumed, err=True)
            progress.append(bar.update)
            try:
                total, failed = write_results(inputs, first_timed(preds, first_at), sink,
                                              out.path if out is not None else None)
            finally:  # the decode processes and GPU workers end now, not when the generator is collected
                preds.close()  # type: ignore[attr-defined]  # both drivers' streams are generators
        return RunStats(total, failed, len(todo), facts.batch_size, computed_in, t0,
                        first_at[0] if first_at else None, time.perf_counter())
    finally:  # the engine or the workers end, whatever stopped this run
        driver.close()


def list_inputs(run: RunConfig, out: ResultFile | None) -> tuple[list[tuple[str, str | None]], str | None]:
    """The run's inputs as (path, error or None), notices said on stderr; with --resume, those ``out`` lacks, and
    the line that says what the file holds (else None)."""
    listed = expand_inputs(run.images, run.recursive)
    inputs = listed.items
    for notice in listed.notices:
        click.echo(f"note: {notice}", err=True)
    if out is not None and run.resume:
        before = len(inputs)
        summary = out.resume(image_key(path) for path, _ in inputs)
        inputs = [(path, err) for path, err in inputs if image_key(path) not in out.done]
        return inputs, resume_line(summary, before, out.path)
    return inputs, None


def show_notes(notes: tuple[str, ...]) -> None:
    """auto's fallback and the like: each said once per machine (the results record it each time)."""
    for note in notes:
        if not shown_before(note):
            hint = " (--backend cuda says why)" if note == NO_GPU_NOTE else ""
            click.echo(f"note: {note}{hint}", err=True)


def first_timed(preds: Iterator[Prediction], first_at: list[float]) -> Iterator[Prediction]:
    """preds, noting in first_at when the first one came."""
    for p in preds:
        if not first_at:
            first_at.append(time.perf_counter())
        yield p


def resume_line(summary: ResumeSummary, inputs: int, path: Path) -> str:
    """One line on what --resume found: images skipped, failed ones run again, lines dropped from the file."""
    line = f"resume: {summary.done} of {inputs} images are in {path} already"
    if summary.retried:
        line += f"; {summary.retried} that failed run again"
    if summary.damaged:
        line += f"; {plural(summary.damaged, 'damaged line')} dropped (their images run again)"
    if summary.duplicates:
        line += f"; {plural(summary.duplicates, 'duplicate line')} dropped (an image's last line is kept)"
    return line


# ----------------------------------------------------------------------------------------- inception-convert-weights

@click.command(name="inception-convert-weights", cls=Command, context_settings=CONTEXT)
@click.argument("model", required=False, metavar="MODEL.onnx")
@click.option("-o", "--output", default=None, metavar="OUT.npz",
              show_default="~/.cache/inception-engine/inception_v3.npz, where inception-run looks",
              help="Where to write the engine's weight file.")
@click.option("--force", is_flag=True, help="Overwrite OUT.npz if it exists (else an existing file is an error).")
@click.option("--synthetic", "synthetic_out", metavar="OUT.onnx",
              help="Instead: write a synthetic Inception-V3 ONNX model (random weights, torch.onnx-like graph).")
@click.option("--style", type=click.Choice(["torchscript", "dynamo"]), default="torchscript", show_default=True,
              help="With --synthetic: which torch.onnx exporter's graph to imitate.")
@click.option("--transform-input", is_flag=True, help="With --synthetic: include torchvision's transform_input.")
@click.option("--seed", type=int, default=0, show_default=True, metavar="N", help="With --synthetic: random seed.")
@click.option("--fid", is_flag=True, help="With --synthetic: pytorch-fid's FID Inception (1008 classes) instead.")
@click.option("--calibrate", metavar="DIR", help="Also store 8-bit scales, measured on images of DIR (calibrate.py).")
@click.option("--calibration-images", type=int, default=300, show_default=True, metavar="N",
              help="With --calibrate: how many of DIR's images (the first N, sorted by path).")
@version_option
@user_errors
def convert_cmd(model: str | None, output: str | None, force: bool, synthetic_out: str | None, style: str,
                transform_input: bool, seed: int, fid: bool, calibrate: str | None, calibration_images: int) -> None:
    """Convert an ONNX export of torchvision's Inception-V3, or of pytorch-fid's FID Inception (MODEL.onnx), into
    the engine's weight file."""
    try:
        convert_or_synthesize(model, output, force, synthetic_out, style, transform_input, seed, fid)
    except KeyboardInterrupt:  # files are written atomically: nothing half-written is left
        click.echo("interrupted; nothing was written", err=True)
        raise click.exceptions.Exit(130) from None


def convert_or_synthesize(model: str | None, output: str | None, force: bool, synthetic_out: str | None, style: str,
                          transform_input: bool, seed: int, fid: bool = False) -> None:
    ctx = click.get_current_context()
    if synthetic_out is None:
        only_synthetic = [f"--{n.replace('_', '-')}" for n in ("style", "transform_input", "seed", "fid")
                          if ctx.get_parameter_source(n) != click.core.ParameterSource.DEFAULT]
        if only_synthetic:
            raise EngineError(f"{', '.join(only_synthetic)} only apply with --synthetic OUT.onnx")
        if model is None:
            raise EngineError("give the ONNX file to convert (inception-convert-weights MODEL.onnx), "
                              "or --synthetic OUT.onnx to write a synthetic one")
        if (ctx.params.get("calibrate") is None and
                ctx.get_parameter_source("calibration_images") != click.core.ParameterSource.DEFAULT):
            raise EngineError("--calibration-images only applies with --calibrate DIR")
        from .onnx_convert import convert
        from .model_files import load_weights
        from .weights import ENV_VAR, default_places, default_weights_path

        if not Path(model).is_file():
            raise EngineError(f"{model}: no such ONNX file")
        target = Path(output) if output is not None else default_weights_path()
        if target.is_file() and not force:
            raise EngineError(f"{target} exists already (an earlier conversion?); --force overwrites it, -o PATH "
                              f"writes elsewhere")
        if ctx.params.get("calibrate") is None:
            out = convert(model, target, overwrite=force)
        else:  # converted and calibrated, or (bad images) nothing written
            from .calibrate import convert_calibrated
            out = convert_calibrated(model, target, force, ctx.params["calibrate"], ctx.params["calibration_images"])
        weights = load_weights(out)  # read back: the file on disk passes its own checksums
        m, model_id = weights.manifest, weights.model_id()
        env = os.environ.get(ENV_VAR)
        use = (f"inception-run reads ${ENV_VAR} ({env}) instead while it is set" if env and
               Path(env).resolve() != out.resolve() else
               "inception-run finds it there" if out.resolve() in default_places() or env else
               f"use it with inception-run --weights {out}")
        calibration = (m.get("provenance") or {}).get("calibration")
        calibrated = ("" if not calibration else f", 8-bit scales of its QDQ nodes ({calibration['method']})"
                      if calibration["images"] is None else f", 8-bit scales from "
                      f"{plural(int(calibration['images']), 'image')} of {ctx.params['calibrate']}")
        click.echo(f"wrote {out} ({model_id.describe()}, from {Path(model).name}, exporter "
                   f"{m.get('exporter', '?')}, opset {m.get('opset', '?')}{calibrated}); {use}")
        return
    if model is not None:
        raise EngineError("give either MODEL.onnx to convert or --synthetic OUT.onnx, not both")
    if output is not None or force or ctx.params.get("calibrate") is not None:
        flag = "-o" if output is not None else "--force" if force else "--calibrate"
        raise EngineError(f"{flag} applies to conversion; --synthetic writes OUT.onnx, convert it in a second step")
    from .synthetic import write_synthetic_onnx

    from .weights import default_places

    if fid and transform_input:
        raise EngineError("--transform-input is torchvision's; the FID network scales its input itself")
    out = write_synthetic_onnx(synthetic_out, style=style, transform_input=transform_input, seed=seed,
                               network="fid" if fid else "torchvision")
    npz = out.with_name(out.stem + ".npz")
    if npz.resolve() in default_places():  # the hint never leads to where runs find the real weights
        npz = out.with_name(f"synthetic_{out.stem}.npz")
    click.echo(f"wrote {out} (synthetic {'FID ' * fid}Inception-V3, {style} style, seed {seed}: random weights, for "
               f"trying the engine out); convert it to a file of its own with: inception-convert-weights {out} -o "
               f"{npz}")


# -------------------------------------------------------------------------------------------------- inception-bench

def backend_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in backends.BENCH_BACKENDS]
    if unknown or not names:
        raise click.BadParameter(f"{', '.join(unknown) or 'empty'}; choose from {', '.join(backends.BENCH_BACKENDS)}")
    return list(dict.fromkeys(names))


def int_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        sizes = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{value!r}: batch sizes must be integers >= 1")
    return sorted(set(sizes))


# torch-compile is not among them: it compiles at every batch size, about 20 s each on an H100 (max-autotune: more
# than 6 minutes at batch 1), which would make the default run several times longer; it is asked for by name.
GPU_DEFAULT = ("cuda", "cudnn", "torch", "torch-graph")


def default_backends() -> list[str]:
    """The GPU backends where a GPU is usable, else the CPU path (with onnxruntime beside it)."""
    return list(GPU_DEFAULT) if backends.is_available("cuda")[0] else ["cpu"]


@click.command(name="inception-bench", cls=Command, context_settings=CONTEXT)
@click.option("--backends", "backend_names", callback=backend_list, metavar="LIST",
              help=f"Comma-separated, from {','.join(backends.BENCH_BACKENDS)} (default: {','.join(GPU_DEFAULT)} "
                   f"with a GPU, else cpu; cpu adds onnxruntime where it is installed). All but cpu need an NVIDIA "
                   f"GPU. cuda and cudnn replay a CUDA graph, torch runs "
                   f"eagerly; torch-graph, cuda-eager, cudnn-eager are the other ways round. torch-compile is "
                   f"torch.compile(mode='reduce-overhead'), torch-compile-max mode='max-autotune': compiled at each "
                   f"batch size (20 s or more each, so opt-in), the compile time in a column of its own.")
@click.option("--batch-sizes", callback=int_list, default="1,8", show_default=True, metavar="LIST",
              help="Comma-separated batch sizes to time each backend at.")
@click.option("--precision", type=click.Choice(["fp32", "tf32", "fp16", "int8"]), default="fp32", show_default=True,
              help="Passed to backends that have the mode (tf32 and fp16: the GPU backends); the others' rows say "
                   "they have not.")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), metavar="X",
              help="GPU backends: the chip's peak for the compute floor [default: this GPU's measured GEMM peak in "
                   "the precision, H100: 52.0 fp32, 411.6 tf32, 764 fp16; others: the H200's, 51.3 fp32].")
@click.option("--peak-gbs", type=click.FloatRange(min=0, min_open=True), metavar="X",
              help="GPU backends: the chip's memory bandwidth for the memory floor, GB/s [default: this GPU's "
                   "measured device-to-device copy, H100: 3026; others: the H200's, 4300].")
@click.option("--reference-images", type=click.IntRange(1), default=2, show_default=True, metavar="K",
              help="Check each batch's first K images against the float64 reference (it is slow on the CPU).")
@click.option("--iters", type=click.IntRange(1), default=20, show_default=True, metavar="N",
              help="Timed forwards per row.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True, metavar="N",
              help="Untimed forwards first.")
@click.option("--weights", "weights_path", metavar="FILE",
              help="The engine's weight file (.npz) or the ONNX export (.onnx) [default: the usual places; none "
                   "found: the synthetic model, said so].")
@click.option("--onnx", "onnx_path", metavar="FILE",
              help="ONNX file the weights came from, for the onnxruntime row (synthetic: written automatically).")
@click.option("--json", "json_path", metavar="FILE", help="Write the results as JSON.")
@click.option("--csv", "csv_path", metavar="FILE", help="Write the rows as CSV (per-layer: FILE's stem + _layers.csv).")
@click.option("--plot", "plot_path", metavar="FILE.png", help="Plot latency vs batch size (needs matplotlib).")
@click.option("--per-layer", is_flag=True,
              help="GPU backends: time every op (convs, pools, the classifier).")
@click.option("--no-reference", is_flag=True, help="Skip the float64 NumPy reference (no rel L2, top-1 columns).")
@version_option
@user_errors
def bench_cmd(backend_names: list[str] | None, batch_sizes: list[int], precision: str, peak_tflops: float | None,
              peak_gbs: float | None, reference_images: int, iters: int, warmup: int, weights_path: str | None,
              onnx_path: str | None, json_path: str | None, csv_path: str | None, plot_path: str | None,
              per_layer: bool, no_reference: bool) -> None:
    """Time Inception-V3 forwards per backend and batch size, with accuracy against the float64 reference."""
    from . import bench, bench_report

    if plot_path:
        bench_report.require_matplotlib()  # fail before the minutes of timing, not after
    progress = (lambda msg: click.echo(f"[bench] {msg}", err=True)) if stderr_is_tty() else None
    report = bench.run_bench(backend_names or default_backends(), batch_sizes, iters, warmup, weights_path,
                             onnx_path, per_layer, not no_reference, progress, precision, peak_tflops,
                             peak_gbs, reference_images)
    click.echo(bench_report.table(report))
    written: list[Path] = []
    if json_path:
        written.append(bench_report.write_json(report, json_path))
    if csv_path:
        written += bench_report.write_csv(report, csv_path)
    if plot_path:
        written.append(bench_report.write_plot(report, plot_path))
    for p in written:
        click.echo(f"wrote {p}", err=True)
    if any(r.status.startswith("error") for r in report.rows):
        raise click.exceptions.Exit(1)


# ----------------------------------------------------------------------------------------------------- entry points

def batch_tuple(value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value!r}: batch sizes are at least 1")
    return out


@click.command(name="inception-tune", cls=Command, context_settings=CONTEXT)
@click.option("--precisions", default="fp32,tf32,fp16", show_default=True, metavar="LIST",
              help="Comma-separated, from fp32, tf32, fp16, int8 (int8: a calibrated weight file).")
@click.option("--batch-sizes", default="1,8,32,64,128", show_default=True, metavar="LIST",
              help="Comma-separated batch sizes.")
@click.option("--weights", "weights_path", metavar="FILE",
              help="The engine's weight file (.npz) or the ONNX export (.onnx) [default: the run's search order; "
                   "else synthetic weights, which time the same].")
@click.option("--table", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also write the measured configs as a tuning table (the package's format) to FILE.")
@version_option
def tune_cmd(precisions: str, batch_sizes: str, weights_path: str | None, table: Path | None) -> None:
    """Measure the fastest kernels of every conv on this GPU now, so that no run waits for it (needs an NVIDIA
    GPU)."""
    from .model_files import load_weights
    from .tune import PRECISIONS, tune
    from .weights import find_weights

    wanted = tuple(p.strip() for p in precisions.split(","))
    bad = [p for p in wanted if p not in PRECISIONS]
    if bad:
        raise click.BadParameter(f"unknown precision {bad[0]!r}; choose from {', '.join(PRECISIONS)}",
                                 param_hint="--precisions")
    sizes = batch_tuple(batch_sizes)
    try:
        try:
            weights = load_weights(find_weights(weights_path))
        except EngineError:
            if weights_path:
                raise
            from .synthetic import synthetic_weights

            weights = synthetic_weights(0)
        rows = tune(weights, wanted, sizes, table, show=sys.stderr.isatty())
    except EngineError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    for precision, batch, source, seconds in rows:
        click.echo(f"{precision:5} batch {batch:4}: {source} ({seconds:.1f} s)")
    if table is not None:
        click.echo(f"table: {table}")


def run_main() -> None:
    """Classify images (files, folders, globs): the top-k ImageNet classes, on the terminal or into a file."""
    run_cmd.main(prog_name="inception-run")


def convert_main() -> None:
    """Convert torchvision's Inception-V3 ONNX export into the engine's weight file (or write a synthetic model)."""
    convert_cmd.main(prog_name="inception-convert-weights")


def bench_main() -> None:
    """Time forwards per backend and batch size, with accuracy against the float64 reference."""
    bench_cmd.main(prog_name="inception-bench")


def tune_main() -> None:
    """Measure this GPU's fastest kernel for every convolution once, ahead of the runs."""
    tune_cmd.main(prog_name="inception-tune")
