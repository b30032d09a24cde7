"""Post-training calibration for 8 bits: the scales backends/int8_reference.py (and the INT8 kernels) run with.

``inception-convert-weights MODEL.onnx --calibrate DIR [--calibration-images N]`` converts, then runs the fp32
network (float32, direct convolutions: int8_reference.float_walk) over the first N images of DIR (sorted by path,
the classifier's own preprocessing from the weight file) and stores in the weight file's provenance, under its
checksum (weights.CALIBRATION_KEYS):
- weight scales, per output channel, symmetric: max|w| / 127 (int8_reference.weight_scales);
- activation scales, per tensor (the input, every conv, pool and concat output): the PERCENTILE-th percentile of
  |x| over all the calibration images' elements, / 127.

Why a percentile and not entropy (KL divergence, TensorRT's method: Migacz, "8-bit Inference with TensorRT", GTC
2017): Wu et al., "Integer Quantization for Deep Learning Inference: Principles and Empirical Evaluation" (2020,
sec. 4.2, Table 3) compare max, entropy and the 99.9 .. 99.9999th percentiles on Inception v3 among others; the
99.99th and 99.999th percentiles and entropy all come within a few tenths of a point of fp32, and no method wins on
every network. The percentile needs nothing but one histogram per tensor, filled in one streaming pass, and one
number; KL needs the same histogram plus a search over hundreds of candidate thresholds, each re-binning it. Plain
max is worse (one outlier pixel sets the scale) and is not offered. 99.99 is the default parameter.

Determinism and streaming: each tensor's |x| goes into a histogram of BINS bins over [0, 2^k), k the smallest for
which the largest value seen so far fits. When a batch brings a larger value, the range doubles and bins merge in
pairs, which equals binning at the larger range from the start (bin = floor(|x| * BINS / 2^k): scaling by a power of
two is exact, and floor(floor(a) / 2) = floor(a / 2)). So the result depends on the images, never on the batch size
or on how they are split. The digest names the images: SHA-256 over each file's path relative to DIR, a NUL byte,
its bytes, in sorted order.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import arch
from .backends.int8_reference import QMAX, float_walk, weight_scales
from .errors import EngineError
from .ingest.entries import image_extensions
from .ingest.images import Preprocess, load_image
from .onnx_convert import convert
from .weights import CALIBRATION_METHODS, Weights, load_weight_file, save_weights

BINS = 2048  # a power of two (the doubling rule above); 99.99 % of a 35x35x288 tensor is still ~35 samples a bin
PERCENTILE = 99.99
DEFAULT_IMAGES = 300
BATCH = 8


@dataclass
class AbsHistogram:
    """Counts of |x| in BINS equal bins over [0, 2^exponent) (module doc); exponent None until a nonzero value."""

    counts: np.ndarray = field(default_factory=lambda: np.zeros(BINS, np.int64))
    exponent: int | None = None
    zeros: int = 0  # exact zeros, kept apart (half of every ReLU output) until a range exists

    def add(self, x: np.ndarray) -> None:
        a = np.abs(np.asarray(x, np.float64)).ravel()
        top = float(a.max()) if a.size else 0.0
        if top == 0.0:
            self.zeros += a.size
            return
        need = math.frexp(top)[1]  # top < 2^need
        if self.exponent is None:
            self.exponent = need
        while self.exponent < need:  # merge pairs: the same as binning at the doubled range
            self.counts = np.concatenate([self.counts.reshape(-1, 2).sum(axis=1), np.zeros(BINS // 2, np.int64)])
            self.exponent += 1
        bins = np.floor(np.ldexp(a, -self.exponent) * BINS).astype(np.int64)
        self.counts += np.bincount(bins, minlength=BINS)

    def percentile(self, p: float) -> float:
        """The upper edge of the bin in which the p-th percentile of |x| falls (a value below 2^exponent)."""
        if self.exponent is None:
            return 0.0
        counts = self.counts.copy()
        counts[0] += self.zeros
        cum = np.cumsum(counts)
        i = int(np.searchsorted(cum, p / 100.0 * cum[-1], side="left"))
        return math.ldexp((i + 1) / BINS, self.exponent)


def calibration_images(directory: str | Path, count: int) -> list[Path]:
    """The first ``count`` image files under ``directory`` (recursively, sorted by path); one line if none."""
    if count < 1:
        raise EngineError(f"--calibration-images must be at least 1, got {count}")
    top = Path(directory)
    if not top.is_dir():
        raise EngineError(f"{directory}: not a directory of calibration images")
    exts = image_extensions()
    found = sorted(p for p in top.rglob("*") if p.is_file() and p.suffix.lower() in exts
                   and not any(part.startswith(".") for part in p.relative_to(top).parts))
    if not found:
        raise EngineError(f"{directory}: no image files to calibrate with")
    return found[:count]


def images_digest(top: Path, paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.relative_to(top).as_posix().encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


def batches(paths: list[Path], pre: Preprocess, batch: int = BATCH) -> Iterator[np.ndarray]:
    for i in range(0, len(paths), batch):
        yield np.stack([load_image(p, pre) for p in paths[i:i + batch]])


def activation_histograms(weights: Weights, xs: Iterable[np.ndarray]) -> dict[str, AbsHistogram]:
    """Every calibrated tensor's histogram over the batches ``xs`` (streaming: one batch in memory at a time)."""
    hist: dict[str, AbsHistogram] = {}

    def visit(name: str, t: np.ndarray) -> None:
        hist.setdefault(name, AbsHistogram()).add(t)

    for x in xs:
        float_walk(weights, x, visit)
    return hist


def calibration_record(weights: Weights, xs: Iterable[np.ndarray], images: int, digest: str,
                       percentile: float = PERCENTILE) -> dict[str, Any]:
    """provenance.calibration (weights.CALIBRATION_KEYS) from the batches ``xs`` of ``images`` images."""
    hist = activation_histograms(weights, xs)
    act = {}
    for name, h in hist.items():
        t = h.percentile(percentile)
        act[name] = float(np.float32(t / QMAX)) if t > 0 else 1.0  # an all-zero tensor: any scale is exact
    ws = {l.name: [float(s) for s in weight_scales(weights.conv(l.name)[0])]
          for l in weights.layers() if isinstance(l, arch.Conv)}
    return {"method": CALIBRATION_METHODS[0], "parameter": percentile, "images": images, "images_sha256": digest,
            "activation_scales": act, "weight_scales": ws}


def convert_calibrated(model: str | Path, target: Path, overwrite: bool, directory: str | Path,
                       count: int = DEFAULT_IMAGES) -> Path:
    """inception-convert-weights --calibrate: the images are listed before anything is written, and a calibration
    that fails on the way (an unreadable image) removes the file just converted: calibrated, or nothing."""
    calibration_images(directory, count)
    out = convert(model, target, overwrite=overwrite)
    try:
        if (load_weight_file(out).manifest.get("provenance") or {}).get("calibration") is not None:
            raise EngineError(f"{model} is already quantized (QuantizeLinear/DequantizeLinear): its own scales are "
                              f"its 8-bit calibration; convert it without --calibrate")
        calibrate_file(out, directory, count)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return out


def calibrate_file(path: str | Path, directory: str | Path, count: int = DEFAULT_IMAGES,
                   percentile: float = PERCENTILE) -> dict[str, Any]:
    """Adds the calibration to the weight file at ``path`` (rewritten atomically); returns the record."""
    weights = load_weight_file(Path(path))
    paths = calibration_images(directory, count)
    pre = Preprocess.from_manifest(weights.manifest)
    record = calibration_record(weights, batches(paths, pre), len(paths), images_digest(Path(directory), paths),
                                percentile)
    prov = dict(weights.manifest.get("provenance") or {"kind": "other", "source_sha256": None})
    prov["calibration"] = record
    save_weights(path, weights.arrays, {**weights.manifest, "provenance": prov}, overwrite=True)
    return record
