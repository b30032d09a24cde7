"""The engine's weight file: one ``.npz`` of float32 arrays keyed by canonical layer names
(``Mixed_6b.branch7x7_2.weight``) plus ``__manifest__``, a JSON string describing where the weights came from.

Manifest fields: ``format`` (FORMAT_VERSION), ``source_sha256``, ``source_name``, ``opset``, ``exporter``
("torchscript" | "dynamo" | ...), ``input`` ({"mean": [3], "std": [3], "size": 299, "resize": 342,
"transform_input": bool}), ``count_include_pad`` (bool), ``softmax_in_model`` (bool), ``layers``
({key: shape}) and ``sha256`` ({key: hex digest of the array's bytes}).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import arch
from .paths import user_cache_dir
from .errors import WeightsError

FORMAT_VERSION = 1
MANIFEST_KEY = "__manifest__"
ENV_VAR = "INCEPTION_WEIGHTS"
DEFAULT_NAME = "inception_v3.npz"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

HOW_TO_GET_WEIGHTS = (
    "export torchvision's Inception-V3 to ONNX (scripts/export_torchvision_onnx.py, on a machine with PyTorch) "
    "and run `inception-convert-weights inception_v3.onnx`, or pass --weights PATH"
)


@dataclass
class Weights:
    arrays: dict[str, np.ndarray]  # float32, canonical keys
    manifest: dict[str, Any]
    path: Path | None = None

    def conv(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return self.arrays[name + ".weight"], self.arrays[name + ".bias"]

    @property
    def count_include_pad(self) -> bool:
        return bool(self.manifest.get("count_include_pad", True))

    @property
    def mean(self) -> tuple[float, float, float]:
        return tuple(self.manifest.get("input", {}).get("mean", IMAGENET_MEAN))  # type: ignore[return-value]

    @property
    def std(self) -> tuple[float, float, float]:
        return tuple(self.manifest.get("input", {}).get("std", IMAGENET_STD))  # type: ignore[return-value]

    def layers(self) -> list[arch.Layer]:
        return arch.inception_v3(count_include_pad=self.count_include_pad)


def sha256_array(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_arrays(arrays: dict[str, np.ndarray]) -> None:
    """Every canonical key present with its canonical shape, and nothing else."""
    expected = arch.weight_shapes()
    missing = sorted(set(expected) - set(arrays))
    if missing:
        raise WeightsError(f"weights lack {len(missing)} arrays, first {missing[0]}")
    extra = sorted(set(arrays) - set(expected))
    if extra:
        raise WeightsError(f"weights have unexpected arrays, first {extra[0]}")
    for k, shape in expected.items():
        if tuple(arrays[k].shape) != shape:
            raise WeightsError(f"{k}: expected shape {shape}, found {tuple(arrays[k].shape)}")


def default_file_mode() -> int:
    """The mode a plain open() gives a new file: 0666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: str | Path, write: Any) -> Path:
    """Call ``write(file_object)`` on a temp file in the destination's directory, then rename it into place, so an
    interrupted run never leaves a partial file at ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".part", dir=path.parent)
    try:
        os.fchmod(fd, default_file_mode())  # mkstemp creates 0600
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def save_weights(path: str | Path, arrays: dict[str, np.ndarray], manifest: dict[str, Any]) -> Path:
    arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}
    check_arrays(arrays)
    manifest = dict(manifest)
    manifest["format"] = FORMAT_VERSION
    manifest["layers"] = {k: list(v.shape) for k, v in arrays.items()}
    manifest["sha256"] = {k: sha256_array(v) for k, v in arrays.items()}
    payload = {**arrays, MANIFEST_KEY: np.array(json.dumps(manifest, sort_keys=True))}
    return atomic_write(path, lambda f: np.savez(f, **payload))


def load_weights(path: str | Path) -> Weights:
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: no such weight file; {HOW_TO_GET_WEIGHTS}")
    try:
        with np.load(path, allow_pickle=False) as z:
            if MANIFEST_KEY not in z.files:
                raise WeightsError(f"{path}: not an inception-engine weight file (no manifest); "
                                   f"convert the ONNX model with inception-convert-weights")
            manifest = json.loads(str(z[MANIFEST_KEY]))
            if manifest.get("format") != FORMAT_VERSION:
                raise WeightsError(f"{path}: weight format {manifest.get('format')} is not {FORMAT_VERSION}; "
                                   f"convert the ONNX model again with this version")
            arrays = {}
            for k in z.files:
                if k == MANIFEST_KEY:
                    continue
                try:
                    arrays[k] = z[k]
                except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
                    raise WeightsError(f"{path}: array {k} is corrupt ({e}); convert the model again") from None
    except WeightsError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, json.JSONDecodeError, KeyError) as e:
        raise WeightsError(f"{path}: not a readable weight file ({e}); convert the model again") from None
    sums = manifest.get("sha256", {})
    for k, a in arrays.items():
        if a.dtype != np.float32:
            raise WeightsError(f"{path}: array {k} is {a.dtype}, expected float32")
        if sums.get(k) != sha256_array(a):
            raise WeightsError(f"{path}: array {k} fails its checksum (corrupt file); convert the model again")
    try:
        check_arrays(arrays)
    except WeightsError as e:
        raise WeightsError(f"{path}: {e}") from None
    return Weights(arrays, manifest, path)


def candidate_paths(explicit: str | Path | None = None) -> list[tuple[str, Path]]:
    """Where weights are looked for, in order: --weights, $INCEPTION_WEIGHTS, ./weights/, the user cache dir."""
    if explicit:
        return [("--weights", Path(explicit))]
    out = []
    if os.environ.get(ENV_VAR):
        return [(f"${ENV_VAR}", Path(os.environ[ENV_VAR]))]
    out.append(("./weights", Path("weights") / DEFAULT_NAME))
    out.append(("user cache", user_cache_dir() / DEFAULT_NAME))
    return out


def find_weights(explicit: str | Path | None = None) -> Path:
    """The weight file to use. An explicit path or $INCEPTION_WEIGHTS must exist (no silent fallback)."""
    cands = candidate_paths(explicit)
    for _, p in cands:
        if p.is_file():
            return p
    if len(cands) == 1:
        src, p = cands[0]
        raise WeightsError(f"{p} (from {src}): no such weight file; {HOW_TO_GET_WEIGHTS}")
    tried = ", ".join(str(p) for _, p in cands)
    raise WeightsError(f"no weights found (looked in {tried}); {HOW_TO_GET_WEIGHTS}")
