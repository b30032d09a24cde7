"""What a user gives as weights, opened: an engine weight file (weights.py reads it), or an ONNX export, converted
with the converter's checks on first use (onnx_convert.py) and cached under its content hash. Above both, so that
neither imports the other."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from .errors import ConversionError, EngineError, WeightsError
from .weights import (HOW_TO_GET_WEIGHTS, NOT_WEIGHTS, ZIP_MAGIC, Weights, converted_cache_dir, load_weight_file,
                      save_weights, sha256_file)


def load_weights(path: str | Path) -> Weights:
    """The weights at ``path``: an engine weight file, or an ONNX export (converted once, then cached). Any
    problem is one WeightsError (a ConversionError for an ONNX file the converter refuses)."""
    path = Path(path)
    return load_weight_file(path) if is_weight_file(path) else weights_from_onnx(path)


def is_weight_file(path: Path) -> bool:
    """Whether ``path`` holds an engine weight file (a zip) rather than, presumably, an ONNX export, by its first
    bytes: WeightsError in one line where it is missing, unreadable or empty."""
    try:
        if not path.is_file():
            raise WeightsError(f"{path}: no such weight file; {HOW_TO_GET_WEIGHTS}")
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise WeightsError(f"{path}: cannot read it ({e.strerror}); check the path and its permissions") from None
    if not head:
        raise WeightsError(f"{path}: empty file, {NOT_WEIGHTS}; {HOW_TO_GET_WEIGHTS}")
    return head == ZIP_MAGIC


def weight_file_path(path: str | Path) -> Path:
    """Where the weights at ``path`` are read from: the file itself, or for an ONNX export its converted weight file
    (converted now if it is not cached yet, saying so once): what inception-run --gpus gives its workers, so that
    they neither convert nor parse the export each. ``path`` itself where the conversion cannot be cached."""
    path = Path(path)
    if is_weight_file(path):
        return path
    weights = weights_from_onnx(path)
    return weights.path if weights.path is not None and weights.path != path else path


def weights_from_onnx(path: Path) -> Weights:
    """An ONNX export given where a weight file is expected: converted with the converter's checks on first use
    and cached as ``converted/<content hash>.npz`` in the user cache (the hash covers the .onnx file and its
    external data files), reused while the files are unchanged. Says so in one line on stderr when it converts."""
    from .onnx_convert import convert_model  # onnx (~0.1 s) only for an ONNX export
    from .onnx_read import external_files, load_onnx

    try:
        model = load_onnx(path)
    except ConversionError:
        raise WeightsError(f"{path}: {NOT_WEIGHTS} (neither a .npz weight file nor a readable ONNX model); "
                           f"{HOW_TO_GET_WEIGHTS}") from None
    if not model.graph.node:
        raise WeightsError(f"{path}: {NOT_WEIGHTS} (no network in it); {HOW_TO_GET_WEIGHTS}")
    h = hashlib.sha256(sha256_file(path).encode())
    for loc, data_path in external_files(model, path):
        h.update(b"\0" + loc.encode() + b"\0" + sha256_file(data_path).encode())
    cached = converted_cache_dir() / f"{h.hexdigest()}.npz"
    if cached.is_file():
        try:
            weights = load_weight_file(cached)
            if "provenance" in weights.manifest:  # one converted before provenance was kept is converted again
                return weights
        except WeightsError:
            pass  # a damaged cache entry: convert again and replace it
    arrays, manifest = convert_model(model, path)
    try:
        save_weights(cached, arrays, manifest)
    except WeightsError:
        raise
    except EngineError as e:  # the arrays passed every check; only the cache cannot be written
        print(f"note: converted {path} for this run only; it cannot be cached ({e})", file=sys.stderr)
        return Weights(arrays, manifest, path)
    print(f"note: converted {path} to a weight file once; cached as {cached}, reused while {path.name} is "
          f"unchanged", file=sys.stderr)
    return load_weight_file(cached)
