"""``inception-fid A B``: the Frechet Inception Distance of two folders of images (or of statistics files as
pytorch-fid writes them), with KID and the Inception Score from the same pass where asked.

Each folder's images run once through the engine (the cpu or cuda backend): the pool features of every batch go
into float64 running statistics (fid.RunningStats: memory flat in the number of images) and, for --kid and --isc,
into temporary memory-mapped files (features; the classifier's logits, computed from the same features in float64),
which the scores read back and which are removed at the end. The preprocessing follows the weight file's network
(the FID network: pytorch-fid's) unless --resize names another tool's (ingest/fid_resize.py). An image that cannot
be read stops the score (a score over part of a folder would pass for the whole one's): its error is said in one
line, exit 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np

from .backends.blas_threads import single_threaded_blas
from .commands import CONTEXT, Command, user_errors, version_option
from .config import BACKEND_CHOICES, DECODE_CHOICES, PRECISION_CHOICES, RESIZE_MODES, WORKER_KINDS, EngineConfig
from .engine import Engine
from .errors import EngineError
from .fid import (IS_SPLITS, KID_SUBSET_SIZE, KID_SUBSETS, RunningStats, covariance_root, frechet_distance,
                  inception_score, kernel_inception_distance, load_stats, save_stats)
from .ingest.inputs import expand_inputs
from .sinks import progress_bar


@dataclass
class Side:
    """One side of the comparison: its statistics, and with --kid / --isc its features' and logits' files."""

    name: str
    images: int = 0
    mu: np.ndarray | None = None
    sigma: np.ndarray | None = None
    features: np.ndarray | None = None  # (images, 2048) float32, memory-mapped
    logits: np.ndarray | None = None  # (images, classes) float32, memory-mapped
    failed: list[str] = field(default_factory=list)
    root: np.ndarray | None = None  # sigma's fid.covariance_root, where computed ahead


def stats_side(path: str) -> Side:
    mu, sigma = load_stats(path)
    return Side(path, mu=mu, sigma=sigma)


def is_stats_file(arg: str) -> bool:
    return arg.lower().endswith(".npz")


def check_usage(a: str, b: str | None, kid: bool, isc: bool, save: str | None) -> None:
    """Usage errors before anything loads: what each side is, and what KID, IS and --save-stats need."""
    for arg in (a, b):
        if arg is not None and not (is_stats_file(arg) and os.path.isfile(arg) or os.path.isdir(arg)):
            raise EngineError(f"{arg}: neither a folder of images nor a statistics file (.npz with mu and sigma, as "
                              f"pytorch-fid --save-stats writes)")
    if b is None and save is None:
        raise EngineError("give two folders or statistics files to compare (or one folder with --save-stats)")
    stats = [arg for arg in (a, b) if arg is not None and is_stats_file(arg)]
    if kid and stats:
        raise EngineError(f"--kid needs both sides' features; {stats[0]} holds only statistics")
    if isc and is_stats_file(a):
        raise EngineError(f"--isc scores the images of A; {a} holds only statistics")
    if save is not None and is_stats_file(a):
        raise EngineError(f"--save-stats writes A's statistics; {a} is a statistics file already")


def list_folder(folder: str, recursive: bool) -> list[str]:
    listed = expand_inputs([folder], recursive)
    errors = [err for _, err in listed.items if err is not None]
    if errors:
        raise EngineError(errors[0])
    for notice in listed.notices:
        click.echo(f"note: {notice}", err=True)
    return [path for path, _ in listed.items]


def score_folder(engine: Engine, folder: str, recursive: bool, keep: tuple[bool, bool], tmp: Path) -> Side:
    """One pass over a folder: running statistics, and where ``keep`` says so (features, logits) their files."""
    paths = list_folder(folder, recursive)
    side = Side(folder, len(paths))
    # host decoding: worker processes on every core, where a multi-threaded BLAS would only slow them
    stats = RunningStats(blas=contextlib.nullcontext if engine.decode == "gpu" else single_threaded_blas)
    if keep[0]:
        side.features = np.lib.format.open_memmap(tmp / f"{id(side)}.f.npy", "w+", np.float32,
                                                  (len(paths), engine.feature_width))
    if keep[1]:
        side.logits = np.lib.format.open_memmap(tmp / f"{id(side)}.l.npy", "w+", np.float32,
                                                (len(paths), engine.classes))
    fc_w = engine.weights.arrays["fc.weight"].astype(np.float64).T
    fc_b = engine.weights.arrays["fc.bias"].astype(np.float64)

    def take(indices: list[int], rows: np.ndarray) -> None:
        stats.add(rows)
        if side.features is not None:
            side.features[indices] = rows
        if side.logits is not None:  # the classifier on the same features, in float64
            side.logits[indices] = rows.astype(np.float64) @ fc_w + fc_b

    show = sys.stderr.isatty() and len(paths) > engine.batch_size
    with progress_bar(len(paths), f"scoring {folder}", "img", show) as bar:
        for p in engine.predict_iter(paths, top_k=1, on_progress=bar.update, on_features=take):
            if not p.ok:  # type: ignore[union-attr]
                side.failed.append(p.error)  # type: ignore[union-attr]
    if side.failed:
        raise ImagesFailed(f"{len(side.failed)} of {len(paths)} images in {folder} could not be read (first: "
                           f"{side.failed[0]}); no score")
    side.mu, side.sigma = stats.result()
    return side


class ImagesFailed(EngineError):
    """Images of a folder could not be read: exit 1, as inception-run exits for unreadable images."""


def scores(sides: list[Side], kid: bool, isc: bool, rooted: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if len(sides) == 2:
        x, y = sides[rooted], sides[1 - rooted]  # the distance is symmetric: the factored side first
        out["fid"] = frechet_distance(x.mu, x.sigma, y.mu, y.sigma, x.root)  # type: ignore[arg-type]
    if kid:
        mean, std = kernel_inception_distance(sides[0].features, sides[1].features)  # type: ignore[arg-type]
        m = min(KID_SUBSET_SIZE, sides[0].images, sides[1].images)
        out["kid"] = {"mean": mean, "std": std, "subsets": KID_SUBSETS, "subset_size": m}
    if isc:
        mean, std = inception_score(sides[0].logits)  # type: ignore[arg-type]
        out["isc"] = {"mean": mean, "std": std, "splits": IS_SPLITS}
    return out


def report(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    if "fid" in result:
        click.echo(f"FID: {result['fid']:.6f}")
    if "kid" in result:
        k = result["kid"]
        click.echo(f"KID: {k['mean']:.6f} +- {k['std']:.6f} ({k['subsets']} subsets of {k['subset_size']})")
    if "isc" in result:
        s = result["isc"]
        click.echo(f"IS: {s['mean']:.4f} +- {s['std']:.4f} ({s['splits']} splits)")


@click.command(name="inception-fid", cls=Command, context_settings=CONTEXT)
@click.argument("a", metavar="A")
@click.argument("b", metavar="B", required=False)
@click.option("--weights", "weights_path", metavar="FILE",
              help="The weight file (.npz) or ONNX export; the FID network is pytorch-fid's, exported with "
                   "scripts/export_pytorch_fid_onnx.py [default: the usual places, as inception-run].")
@click.option("--resize", type=click.Choice(RESIZE_MODES), default=None,
              help="Whose preprocessing [default: the weight file's network's: pytorch-fid for the FID network].")
@click.option("--kid", is_flag=True, help="Also the Kernel Inception Distance (both sides folders).")
@click.option("--isc", is_flag=True, help="Also the Inception Score of A's images.")
@click.option("--save-stats", "save", metavar="OUT.npz", help="Write A's mu and sigma (float64), pytorch-fid's format.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document: fid, kid, isc and what computed them.")
@click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True,
              help="Where the network runs (the features come from the cpu and cuda backends).")
@click.option("--precision", type=click.Choice(PRECISION_CHOICES), default="fp32", show_default=True,
              help="fp32: the score other tools give (pytorch-fid's with TF32 off to ~1e-5). tf32 and fp16 are "
                   "faster and move the FID (README: how far); auto is tf32 on the GPU, as inception-run's.")
@click.option("--batch-size", type=click.IntRange(1, 4096), default=None, metavar="N", help="Images per forward.")
@click.option("--decode", type=click.Choice(DECODE_CHOICES), default="cpu", show_default=True,
              help="cpu: Pillow, the tool's preprocessing exactly. gpu: JPEGs decoded by nvImageCodec and resized on "
                   "the GPU (torchvision's and pytorch-fid's resizes; cuda backend; other files on the CPU).")
@click.option("--workers", type=click.IntRange(1, 1024), default=None, metavar="N", help="Decode workers.")
@click.option("--worker-kind", type=click.Choice(WORKER_KINDS), default="auto", show_default=True,
              help="Decode workers as threads or processes.")
@click.option("-r", "--recursive", is_flag=True, help="Take folders' subfolders too.")
@version_option
@user_errors
def fid_cmd(a: str, b: str | None, weights_path: str | None, resize: str | None, kid: bool, isc: bool,
            save: str | None, as_json: bool, backend: str, precision: str, batch_size: int | None, decode: str,
            workers: int | None, worker_kind: str, recursive: bool) -> None:
    """The FID of A and B: each a folder of images or a statistics file (.npz of mu and sigma)."""
    check_usage(a, b, kid, isc, save)
    inputs = [x for x in (a, b) if x is not None]
    config = EngineConfig(weights_path, backend, precision, batch_size, workers, worker_kind, decode=decode,
                          resize=resize) \
        if any(not is_stats_file(x) for x in inputs) else None
    try:
        result, sides = run_fid(config, inputs, kid, isc, recursive)
    except ImagesFailed as e:
        click.echo(f"error: {e}", err=True)
        raise click.exceptions.Exit(1) from None
    except KeyboardInterrupt:
        click.echo("interrupted; no score", err=True)
        raise click.exceptions.Exit(130) from None
    if save is not None:
        save_stats(save, sides[0].mu, sides[0].sigma)  # type: ignore[arg-type]
        click.echo(f"wrote {save} (statistics of {sides[0].images} images in {a})", err=True)
    report(result, as_json)


def run_fid(config: EngineConfig | None, inputs: list[str], kid: bool, isc: bool,
            recursive: bool) -> tuple[dict[str, Any], list[Side]]:
    """Each input's statistics (a folder scored, a file read), then the scores, with what computed them."""
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="inception-fid-") as tmp:
        files = {k: stats_side(arg) for k, arg in enumerate(inputs) if is_stats_file(arg)}  # bad ones said first
        # the side whose covariance the distance factors (fid.frechet_distance's sigma1): B where it is a statistics
        # file, whose factor is then computed while the engine starts, else A; so a folder scores the same digits as
        # its saved statistics in the same place
        rooted = 1 if 1 in files else 0
        engine = None
        if config is not None:
            with ThreadPoolExecutor(1, thread_name_prefix="fid-root") as pool:
                # the statistics file's factor (a second or more where it is singular) beside the engine's start,
                # which uses no BLAS: so it runs with the BLAS's threads as they are, and ends before scoring begins
                root = pool.submit(covariance_root, files[rooted].sigma) if rooted in files else None
                engine = Engine.from_config(config)
                if root is not None:
                    files[rooted].root = root.result()
        if engine is not None:  # its fallbacks, once a machine as inception-run says them (not the numbered classes)
            from .cli import show_notes
            from .labels import NUMBERED_NOTE

            show_notes(tuple(note for note in engine.notes if note != NUMBERED_NOTE))
        try:
            sides = []
            for k, arg in enumerate(inputs):
                if k in files:
                    sides.append(files[k])
                else:
                    assert engine is not None
                    sides.append(score_folder(engine, arg, recursive, (kid, isc and k == 0), Path(tmp)))
            result.update(scores(sides, kid, isc, rooted))
            if engine is not None:
                model = engine.model
                result.update(model=model.name, kind=model.kind, network=engine.weights.network,
                              resize=engine.preprocess.mode, backend=engine.backend_name,
                              precision=engine.precision, decode=engine.decode)
                if engine.weights.network != "fid":
                    click.echo("note: these weights are not the FID network (pytorch-fid's); its FID compares "
                               "only with scores of the same weights", err=True)
            result["images"] = {s.name: s.images for s in sides if s.images}
            for s in sides:  # the memory maps go before their folder does
                s.features = s.logits = None
        finally:
            if engine is not None:
                engine.close()
    return result, sides


def fid_main() -> None:
    """Score generated images: the FID of two folders or statistics files (KID and IS from the same pass)."""
    fid_cmd.main(prog_name="inception-fid")
