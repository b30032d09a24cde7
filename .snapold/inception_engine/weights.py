"""The engine's weight file: one ``.npz`` of float32 arrays keyed by canonical layer names
(``Mixed_6b.branch7x7_2.weight``) plus ``__manifest__``, a JSON string describing where the weights came from.

Manifest fields: ``format`` (FORMAT_VERSION), ``source_sha256``, ``source_name``, ``opset``, ``exporter``
("torchscript" | "dynamo" | ...), ``input`` ({"mean": [3], "std": [3], "size": 299, "resize": 342,
"transform_input": bool}), ``count_include_pad`` (bool), ``network`` (arch.NETWORKS: "torchvision", the default,
or "fid"; it fixes the classifier's shape), ``softmax_in_model`` (bool), ``layers``
({key: shape}) and ``sha256`` ({key: hex digest of the key, a NUL byte and the array's bytes}: a checksum binds its
array to its name, so two arrays swapped together with their checksums are found out).

Provenance: ``provenance`` ({"kind": "torchvision" | "fid" | "synthetic" | "other", "source_sha256": the ONNX
file's SHA-256 or null, "source_name", "producer": the ONNX producer's name and version, "calibration": null, room
for one: calibrate.py's record, or an already-quantized ONNX's scales (onnx_qdq.py, method "qdq:<producer>"),
CALIBRATION_KEYS, checked by check_calibration}) and
``provenance_sha256``, a SHA-256 of its canonical JSON and the arrays' checksums: an edited or
transplanted record is refused. A file converted before provenance was kept has neither; it loads, its kind "unknown".

``ModelId`` names a model: MODEL_DIGEST_HEX hex digits of a SHA-256 of the arrays' checksums (``model_digest``),
"synthetic-" before them for the synthetic model. The arrays, not the source file: they compute the results, so
the same weights converted from either exporter, or read from an old file, get the same name.

A weight file is untrusted input. Reading it is bounded before anything is decompressed: every zip member must be
one the architecture expects, its declared size and its npy header (dtype, shape) must be exactly those of its
canonical array, and the manifest is at most MAX_MANIFEST_CHARS. The arrays must then match their checksums and be
finite, and the preprocessing record must be sane (check_manifest). Any failure is one WeightsError line.

``--weights`` may also name an ONNX export: it is converted once (the converter's own checks) and cached in the user
cache under its content hash (weights_from_onnx).
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import arch
# the atomic writes live in atomic.py; these names stay importable from here, where the other modules took them
from .atomic import (STALE_PART_SECONDS, _fsync_folder, _host, atomic_write, default_file_mode,  # noqa: F401
                     remove_stale_parts, writable_target)
from .errors import WeightsError
from .paths import user_cache_dir
from .results import ModelId

FORMAT_VERSION = 2  # 2: checksums bound to the array names
PROVENANCE_KINDS = ("torchvision", "fid", "synthetic", "other")  # fid: pytorch-fid's module, exported
MODEL_DIGEST_HEX = 12  # 48 bits: a collision between two weight files a user has is out of reach
HEX = "0123456789abcdef"
MANIFEST_KEY = "__manifest__"
ENV_VAR = "INCEPTION_WEIGHTS"
DEFAULT_NAME = "inception_v3.npz"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Input sizes: 75 is the smallest Inception-V3 takes (the 8x8 pool sees 1x1), 299 its own (tests use small
# ones); the resize (shorter side before the centre crop) from the crop to ~3x torchvision's 342.
SIZE_RANGE = (75, arch.INPUT_SIZE)
DEFAULT_RESIZE, RESIZE_MAX = 342, 1024
# Normalisation of [0, 1] pixels: generous bounds that keep (x - mean) / std well inside float32.
MEAN_LIMIT, STD_RANGE = 100.0, (1e-3, 100.0)
MAX_MANIFEST_CHARS = 1 << 20  # the real manifest is ~40 KB
MAX_NPY_HEADER = 4096  # numpy writes 128 bytes for these arrays
ZIP_MAGIC = b"PK\x03\x04"
NOT_WEIGHTS = "not an Inception-V3 weight file or ONNX export"

HOW_TO_GET_WEIGHTS = (
    "export torchvision's Inception-V3 to ONNX (scripts/export_torchvision_onnx.py, on a machine with PyTorch) "
    "and run `inception-convert-weights inception_v3.onnx`, or pass --weights PATH (a weight file or the .onnx)"
)
CONVERT_AGAIN = "convert the ONNX model again with inception-convert-weights"
CALIBRATE = "inception-convert-weights MODEL.onnx --calibrate IMAGE_DIR"
# provenance.calibration: how the 8-bit scales were measured (method, its parameter, the images and their digest)
# and the scales: per tensor (arch names, "image" the input) and per conv output channel (backends/int8_reference)
CALIBRATION_KEYS = ("method", "parameter", "images", "images_sha256", "activation_scales", "weight_scales")
CALIBRATION_METHODS = ("percentile",)
# calibration from an already-quantized ONNX (onnx_qdq.py): method "qdq:<producer>", no parameter or images (the
# source file's digest is the provenance's); the stem's input and weight scales are absent where the file's do not
# apply (the stem then runs in float, as int8_reference.DEFAULT_FLOAT_LAYERS has it)
QDQ_METHOD = "qdq:"
QDQ_STEM = arch.conv_layers()[0].name


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

    @property
    def network(self) -> str:
        """The variant (arch.NETWORKS): "torchvision" or "fid"."""
        return str(self.manifest.get("network", "torchvision"))

    def layers(self) -> list[arch.Layer]:
        return arch.inception_v3(count_include_pad=self.count_include_pad, network=self.network)

    def model_id(self) -> ModelId:
        """The model's name and kind (the module doc's ModelId); from the manifest's checksums where it has them,
        else from the arrays (weights made in memory, such as synthetic_weights)."""
        sums = self.manifest.get("sha256")
        if not isinstance(sums, dict) or set(sums) != set(self.arrays):
            sums = {k: sha256_array(k, a) for k, a in self.arrays.items()}
            self.manifest = {**self.manifest, "sha256": sums}  # computed once
        prov = self.manifest.get("provenance")
        kind = prov["kind"] if isinstance(prov, dict) else "synthetic" if self.manifest.get("synthetic") else "unknown"
        source = prov.get("source_sha256") if isinstance(prov, dict) else None
        return ModelId(model_digest(sums), kind, source)


def model_digest(sums: dict[str, str]) -> str:
    """The short digest of a model whose arrays have the checksums ``sums`` (name -> hex)."""
    h = hashlib.sha256("".join(f"{k}\0{v}\n" for k, v in sorted(sums.items())).encode())
    return h.hexdigest()[:MODEL_DIGEST_HEX]


def provenance_checksum(provenance: Any, sums: dict[str, str]) -> str:
    """``provenance_sha256``: the provenance's canonical JSON bound to the arrays' checksums."""
    text = json.dumps(provenance, sort_keys=True) + "\0" + json.dumps(sums, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def check_provenance(manifest: dict[str, Any]) -> None:
    """The provenance record, where there is one: its fields' types, and its checksum (module doc)."""
    if "provenance" not in manifest and "provenance_sha256" not in manifest:
        return  # converted before provenance was kept
    prov = manifest.get("provenance")
    if not isinstance(prov, dict) or prov.get("kind") not in PROVENANCE_KINDS:
        raise WeightsError(f"the manifest's provenance is {prov!r:.80}, expected an object whose kind is one of "
                           f"{', '.join(PROVENANCE_KINDS)}; {CONVERT_AGAIN}")
    source = prov.get("source_sha256")
    if source is not None and not (isinstance(source, str) and len(source) == 64 and set(source) <= set(HEX)):
        raise WeightsError(f"the manifest's provenance.source_sha256 is {prov['source_sha256']!r:.80}, expected "
                           f"64 hex digits or null")
    if prov.get("calibration") is not None:
        check_calibration(prov["calibration"], manifest)
    if manifest.get("provenance_sha256") != provenance_checksum(prov, manifest["sha256"]):
        raise WeightsError(f"the manifest's provenance fails its checksum (damaged or edited file); {CONVERT_AGAIN}")


def _positive(v: Any) -> bool:
    return _is_number(v) and v > 0


def check_calibration(calib: Any, manifest: dict[str, Any]) -> None:
    """provenance.calibration's fields and scales (finite, positive; one per output channel of every conv)."""
    if not isinstance(calib, dict) or set(calib) != set(CALIBRATION_KEYS):
        raise WeightsError(f"the manifest's calibration record is not an object of {', '.join(CALIBRATION_KEYS)}; "
                           f"calibrate again with {CALIBRATE}")
    qdq = isinstance(calib["method"], str) and calib["method"].startswith(QDQ_METHOD)
    if qdq:
        if any(calib[k] is not None for k in ("parameter", "images", "images_sha256")):
            raise WeightsError("the manifest's calibration from a quantized ONNX has a parameter or images")
    elif calib["method"] not in CALIBRATION_METHODS or not _positive(calib["parameter"]):
        raise WeightsError(f"the manifest's calibration method {calib['method']!r:.40} ({calib['parameter']!r:.40})"
                           f" is not one of {', '.join(CALIBRATION_METHODS)} with a positive parameter")
    elif not (_is_int(calib["images"]) and calib["images"] > 0 and isinstance(calib["images_sha256"], str)):
        raise WeightsError("the manifest's calibration lacks its image count or digest")
    act, ws = calib["activation_scales"], calib["weight_scales"]
    if not (isinstance(act, dict) and all(_positive(v) for v in act.values())):
        raise WeightsError("the manifest's calibration activation scales are not positive numbers by tensor")
    shapes = network_shapes(manifest)
    convs = {k[:-len(".weight")]: s[0] for k, s in shapes.items() if k.endswith(".weight") and len(s) == 4}
    needed = set(convs) - ({QDQ_STEM} if qdq else set())  # a quantized ONNX's stem may have none that apply
    if not isinstance(ws, dict) or not needed <= set(ws) <= set(convs) or not all(
            isinstance(ws[k], list) and len(ws[k]) == convs[k] and all(_positive(v) for v in ws[k]) for k in ws):
        raise WeightsError("the manifest's calibration weight scales are not one positive number per output channel "
                           "of every conv")
    tensors = {arch.INPUT} | {l.name for l in arch.inception_v3(network=manifest.get("network", "torchvision"))
                              if isinstance(l, arch.Conv | arch.Pool | arch.Concat)}
    lacking = tensors - set(act) - ({arch.INPUT} if qdq else set())
    if lacking:
        raise WeightsError(f"the manifest's calibration lacks the activation scale of {min(lacking)}")


def require_calibration(weights: Weights) -> dict[str, Any]:
    """The calibration record of ``weights`` (check_calibration's), or one WeightsError line saying how to add it:
    what an 8-bit precision asks for before it runs."""
    prov = weights.manifest.get("provenance")
    calib = prov.get("calibration") if isinstance(prov, dict) else None
    if calib is None:
        where = f"{weights.path}: " if weights.path else ""
        raise WeightsError(f"{where}no 8-bit calibration in this weight file; add it with {CALIBRATE}")
    check_calibration(calib, weights.manifest)
    return calib


def sha256_array(name: str, a: np.ndarray) -> str:
    """The manifest's checksum of array ``name``: its name, a NUL byte, then its bytes (C order)."""
    h = hashlib.sha256(name.encode() + b"\0")
    h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_arrays(arrays: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]] | None = None) -> None:
    """Every canonical key present with its canonical shape, and nothing else; all values finite float32."""
    expected = arch.weight_shapes() if shapes is None else shapes
    missing = sorted(set(expected) - set(arrays))
    if missing:
        raise WeightsError(f"weights lack {len(missing)} arrays, first {missing[0]}")
    extra = sorted(set(arrays) - set(expected))
    if extra:
        raise WeightsError(f"weights have unexpected arrays, first {extra[0]}")
    for k, shape in expected.items():
        if tuple(arrays[k].shape) != shape:
            raise WeightsError(f"{k}: expected shape {shape}, found {tuple(arrays[k].shape)}")
        if not np.all(np.isfinite(arrays[k])):
            raise WeightsError(f"{k}: holds NaN or Inf values")


# --- the manifest ----------------------------------------------------------------------------------------------

def _is_number(v: Any) -> bool:
    """A JSON number that is finite as a float (not a bool, not an int beyond float range)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def network_shapes(manifest: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The arrays and shapes of the network the manifest names (``network``, default torchvision's)."""
    network = manifest.get("network", "torchvision")
    if not isinstance(network, str) or network not in arch.NETWORKS:
        raise WeightsError(f"the manifest's network is {network!r:.80}, expected one of {', '.join(arch.NETWORKS)}")
    return arch.weight_shapes() if network == "torchvision" else arch.weight_shapes(arch.inception_v3(network=network))


def check_manifest(manifest: Any, shapes: dict[str, tuple[int, ...]] | None = None) -> None:
    """The fields the engine uses have their types and sane values; raises WeightsError saying which does not.
    ``sha256`` must name exactly the arrays of ``shapes`` (default: those of the network the manifest names)."""
    if not isinstance(manifest, dict):
        raise WeightsError(f"the manifest is a JSON {type(manifest).__name__}, not an object")
    expected = network_shapes(manifest) if shapes is None else shapes
    if manifest.get("format") != FORMAT_VERSION or not _is_int(manifest.get("format")):
        raise WeightsError(f"weight format {manifest.get('format')!r} is not {FORMAT_VERSION}; {CONVERT_AGAIN}")
    sums = manifest.get("sha256")
    if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
        raise WeightsError("the manifest's sha256 is not a table of array name -> hex digest")
    if set(sums) != set(expected):
        odd = min(set(sums) ^ set(expected))
        raise WeightsError(f"the manifest's sha256 table does not list the architecture's arrays (first: {odd})")
    check_provenance(manifest)
    layers = manifest.get("layers")
    if layers is not None and layers != {k: list(s) for k, s in expected.items()}:
        raise WeightsError("the manifest's layers table does not match the architecture's shapes")
    for key in ("count_include_pad", "softmax_in_model", "aux_ignored"):
        if key in manifest and not isinstance(manifest[key], bool):
            raise WeightsError(f"the manifest's {key} is {manifest[key]!r}, expected true or false")
    inp = manifest.get("input", {})
    if not isinstance(inp, dict):
        raise WeightsError(f"the manifest's input is {inp!r}, expected an object (mean, std, size, resize)")
    for key, default in (("mean", IMAGENET_MEAN), ("std", IMAGENET_STD)):
        v = inp.get(key, default)
        if not (isinstance(v, list | tuple) and len(v) == 3 and all(_is_number(x) for x in v)):
            raise WeightsError(f"the manifest's input.{key} is {v!r:.80}, expected 3 finite numbers (R, G, B)")
    if not all(abs(m) <= MEAN_LIMIT for m in inp.get("mean", IMAGENET_MEAN)):
        raise WeightsError(f"the manifest's input.mean is {inp['mean']!r}; a pixel mean lies within "
                           f"+-{MEAN_LIMIT:g}")
    if not all(STD_RANGE[0] <= s <= STD_RANGE[1] for s in inp.get("std", IMAGENET_STD)):
        raise WeightsError(f"the manifest's input.std is {inp['std']!r}; every channel's std must be from "
                           f"{STD_RANGE[0]:g} to {STD_RANGE[1]:g}")
    size = inp.get("size", arch.INPUT_SIZE)
    if not (_is_int(size) and SIZE_RANGE[0] <= size <= SIZE_RANGE[1]):
        raise WeightsError(f"the manifest's input.size is {size!r}, expected a whole number from {SIZE_RANGE[0]} "
                           f"to {SIZE_RANGE[1]} (Inception-V3 takes {arch.INPUT_SIZE})")
    resize = inp.get("resize", DEFAULT_RESIZE)
    if not (_is_int(resize) and size <= resize <= RESIZE_MAX):
        raise WeightsError(f"the manifest's input.resize is {resize!r}, expected a whole number from the crop "
                           f"size {size} to {RESIZE_MAX}")


# --- reading -------------------------------------------------------------------------------------------------

READ_THREADS = min(8, os.cpu_count() or 1)  # a weight file's arrays read and checked at once (read_weight_file)


def _npy_header(f: Any, member: str) -> tuple[str, bool, tuple[int, ...], int]:
    """(descr, fortran_order, shape, header bytes) of an npy stream, the header length bounded before it is read
    and parsed as a literal (never numpy's reader, whose errors on damaged headers escape as other types)."""
    magic = f.read(8)
    if len(magic) < 8 or magic[:6] != b"\x93NUMPY" or magic[6] not in (1, 2, 3):
        raise WeightsError(f"member {member} is not an npy array (no npy header)")
    width = 2 if magic[6] == 1 else 4
    length = int.from_bytes(f.read(width), "little")
    if length > MAX_NPY_HEADER:
        raise WeightsError(f"member {member} has an npy header of {length} bytes (damaged)")
    raw = f.read(length)
    try:
        header = ast.literal_eval(raw.decode("utf-8" if magic[6] == 3 else "latin1"))
    except (ValueError, SyntaxError, MemoryError, RecursionError, UnicodeDecodeError):
        raise WeightsError(f"member {member} has a damaged npy header") from None
    if (not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}
            or not isinstance(header["descr"], str) or not isinstance(header["fortran_order"], bool)
            or not isinstance(header["shape"], tuple) or not all(_is_int(d) and d >= 0 for d in header["shape"])):
        raise WeightsError(f"member {member} has a damaged npy header")
    return header["descr"], header["fortran_order"], header["shape"], 8 + width + length


def _read_exact(f: Any, out: memoryview, member: str) -> None:
    got = 0
    while got < len(out):
        chunk = f.read(min(len(out) - got, 1 << 22))
        if not chunk:
            raise WeightsError(f"member {member} is shorter than its header says (truncated)")
        out[got:got + len(chunk)] = chunk
        got += len(chunk)
    if f.read(1):  # also makes zipfile check the member's CRC
        raise WeightsError(f"member {member} is longer than its header says (damaged)")


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, shape: tuple[int, ...] | None) -> np.ndarray:
    """An array member of the canonical ``shape`` as little-endian float32 (None: the manifest, a unicode scalar).
    The declared size is checked against what that array needs before a byte is decompressed."""
    name = info.filename
    if shape is None:
        limit = MAX_NPY_HEADER + 16 + 4 * MAX_MANIFEST_CHARS
    else:
        limit = MAX_NPY_HEADER + 16 + 4 * math.prod(shape)
    if info.file_size > limit:
        raise WeightsError(f"member {name} declares {info.file_size} bytes, more than the {limit} it can hold")
    with zf.open(info) as f:
        descr, fortran, got_shape, header = _npy_header(f, name)
        if shape is None:
            if not (descr.startswith("<U") and descr[2:].isdigit() and got_shape == () and not fortran
                    and int(descr[2:]) <= MAX_MANIFEST_CHARS):
                raise WeightsError(f"member {name} is {descr} {got_shape}, not the manifest's JSON text")
            dtype, count = np.dtype(descr), 1
        else:
            if descr != "<f4" or fortran:
                raise WeightsError(f"array {name[:-4]} is stored as {descr!r}{' (Fortran order)' * fortran}, "
                                   f"expected little-endian float32 '<f4'")
            if got_shape != shape:
                raise WeightsError(f"array {name[:-4]} has shape {got_shape}, the architecture's is {shape}")
            dtype, count = np.dtype("<f4"), math.prod(shape)
        if header + dtype.itemsize * count != info.file_size:
            raise WeightsError(f"member {name} holds {info.file_size} bytes, its header says "
                               f"{header + dtype.itemsize * count}")
        out = np.empty(got_shape, dtype)
        _read_exact(f, memoryview(out).cast("B"), name)
    return out


def read_weight_file(path: Path, shapes: dict[str, tuple[int, ...]] | None = None
                     ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and manifest of the .npz at ``path``, every check of the module docstring done. ``shapes``: the
    architecture's (default: those of the network the manifest names; the member names are every network's)."""
    expected = arch.weight_shapes() if shapes is None else shapes
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise WeightsError(f"{NOT_WEIGHTS}: not a readable .npz ({e}); {CONVERT_AGAIN}") from None
    with zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            raise WeightsError(f"the zip holds two members named {next(n for n in names if names.count(n) > 1)}")
        members = {n[:-4]: i for n, i in zip(names, infos) if n.endswith(".npy")}
        if MANIFEST_KEY not in members:
            raise WeightsError(f"{NOT_WEIGHTS}: a .npz without the engine's manifest; {CONVERT_AGAIN}")
        unknown = sorted(set(names) - {k + ".npy" for k in (*expected, MANIFEST_KEY)})
        if unknown:
            raise WeightsError(f"unexpected member {unknown[0]} (not an array of the architecture)")
        missing = sorted(set(expected) - set(members))
        if missing:
            raise WeightsError(f"weights lack {len(missing)} arrays, first {missing[0]}; {CONVERT_AGAIN}")
        try:
            text = str(_read_member(zf, members[MANIFEST_KEY], None)[()])
            manifest = json.loads(text)
        except WeightsError:
            raise
        except (ValueError, RecursionError) as e:  # JSONDecodeError, huge ints, nesting
            raise WeightsError(f"the manifest is not valid JSON ({e})") from None
        if shapes is None and isinstance(manifest, dict):
            expected = network_shapes(manifest)
        check_manifest(manifest, expected)

        # Each reading thread opens the file for itself: the members of one ZipFile share its file object, and
        # newer zipfiles (3.12's, 3.13's) skip a member header's extra field (numpy's zip64 one) with a seek relative
        # to wherever another thread left that file, so concurrent opens read the wrong bytes ("no npy header",
        # "Overlapped entries").
        local, opened = threading.local(), []

        def own_zip() -> zipfile.ZipFile:
            if not hasattr(local, "zf"):
                local.zf = zipfile.ZipFile(path)
                opened.append(local.zf)
            return local.zf

        def checked(k: str) -> np.ndarray:
            own = own_zip()
            a = _read_member(own, own.getinfo(members[k].filename), expected[k])
            if manifest["sha256"][k] != sha256_array(k, a):
                raise WeightsError(f"array {k} fails its checksum (damaged or edited file); {CONVERT_AGAIN}")
            if not np.all(np.isfinite(a)):
                raise WeightsError(f"array {k} holds NaN or Inf values; {CONVERT_AGAIN}")
            return a.astype(np.float32, copy=False)

        # The arrays on READ_THREADS threads: their checksums and the zip's CRCs (hashlib and zlib release the GIL)
        # are most of a load. The first failing array in the architecture's order is the one said, as a serial
        # read would say it.
        try:
            with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="weights") as pool:
                arrays = dict(zip(expected, pool.map(checked, expected)))
        finally:
            for z in opened:
                z.close()
    return arrays, manifest


def load_weight_file(path: Path) -> Weights:
    """An engine weight file (.npz) at ``path``, every check applied; any problem is one WeightsError."""
    try:
        arrays, manifest = read_weight_file(path)
    except WeightsError as e:
        raise WeightsError(f"{path}: {e}") from None
    except OSError as e:
        raise WeightsError(f"{path}: cannot read it ({e.strerror or e})") from None
    except Exception as e:  # zipfile, zlib, bz2 and lzma raise several types for damaged members
        raise WeightsError(f"{path}: damaged weight file ({type(e).__name__}: {e}); {CONVERT_AGAIN}") from None
    return Weights(arrays, manifest, path)


def save_weights(path: str | Path, arrays: dict[str, np.ndarray], manifest: dict[str, Any],
                 overwrite: bool = True) -> Path:
    """Writes the weight file atomically; refuses what load_weights would refuse (so nothing unloadable is
    written). overwrite=False: an existing file at ``path`` is an error, never replaced."""
    arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}
    check_arrays(arrays, network_shapes(manifest))
    manifest = dict(manifest)
    manifest["format"] = FORMAT_VERSION
    manifest["layers"] = {k: list(v.shape) for k, v in arrays.items()}
    manifest["sha256"] = {k: sha256_array(k, v) for k, v in arrays.items()}
    if "provenance" in manifest:
        manifest["provenance_sha256"] = provenance_checksum(manifest["provenance"], manifest["sha256"])
    check_manifest(manifest)
    payload = {**arrays, MANIFEST_KEY: np.array(json.dumps(manifest, sort_keys=True))}
    return atomic_write(path, lambda f: np.savez(f, **payload), overwrite=overwrite)


# --- ONNX files as --weights ------------------------------------------------------------------------------------

def converted_cache_dir() -> Path:
    return user_cache_dir() / "converted"


# --- where weights are looked for -------------------------------------------------------------------------------

def default_weights_path() -> Path:
    """Where inception-convert-weights writes by default: the user cache, which every run searches."""
    return user_cache_dir() / DEFAULT_NAME


def default_places() -> set[Path]:
    """The places a run finds weights without being told (./weights/, the user cache), resolved: where a synthetic
    model is never written, so that it cannot pass for the real one."""
    return {default_weights_path().resolve(), (Path("weights") / DEFAULT_NAME).resolve()}


def candidate_paths(explicit: str | Path | None = None) -> list[tuple[str, Path]]:
    """Where weights are looked for, in order: --weights, $INCEPTION_WEIGHTS, ./weights/, the user cache dir."""
    if explicit:
        return [("--weights", Path(explicit))]
    out = []
    if os.environ.get(ENV_VAR):
        return [(f"${ENV_VAR}", Path(os.environ[ENV_VAR]))]
    out.append(("./weights", Path("weights") / DEFAULT_NAME))
    out.append(("user cache", default_weights_path()))
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
