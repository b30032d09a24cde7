"""The Open Inference Protocol (KServe v2) over HTTP, as Triton speaks it: requests parsed and checked, responses
built, with Triton's binary tensor data and classification extensions. No server here: bytes in, bytes out.

The model, ``inception_v3`` version ``1``, has two inputs, of which a request gives exactly one:

- ``images``: BYTES ``[N]`` (or ``[N, 1]``), each element an encoded image file (JPEG, PNG, ...). In JSON each
  element is a string: its UTF-8 bytes (Triton's rule), or base64 where the input's parameters say
  ``"content_type": "base64"``; with the binary extension each is a 4-byte little-endian length and the bytes.
- ``input``: FP32 (FP16 accepted) ``[N, 3, 299, 299]``, images already preprocessed as ``images.load_image`` does.

and two outputs, FP32 ``[N, 1000]``: ``probabilities`` (softmax of the logits) and ``logits``. Either may ask for the
classification extension (output parameter ``"classification": K``): then it is BYTES ``[N, K]``, each element
``"score:index:label"``, most likely first, the score formatted as Triton does (``std::to_string``: ``%f``), or with
the output parameter ``"exact_scores": true`` (this server's own) as the shortest decimal that reads back as the
same double, which ``inception-run --server`` uses so that its lines equal a local run's. No ``outputs`` in a
request: both, as tensors.

Binary data (Triton's extension): the JSON header is followed by the inputs' bytes, in the order of the inputs that
carry ``parameters.binary_data_size``; the header's length is the HTTP header ``Inference-Header-Content-Length``.
An output is sent that way where its parameters say ``"binary_data": true``, or the request's parameters say
``"binary_data_output": true``; the response then has the same header and its outputs' bytes after the JSON.

Every fault in a request is a ProtocolError: HTTP 400 and ``{"error": "..."}`` saying what was wrong and where.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..labels import Labels, imagenet_labels
from .wire import (HEADER_LENGTH, INPUT_BYTES, INPUT_TENSOR, LENGTH, MODEL_NAME, MODEL_VERSION, OUTPUT_LOGITS,
                   OUTPUT_PROBS, OUTPUTS, PLATFORM, bytes_tensor_raw)

TENSOR_TYPES = {"FP32": np.dtype("<f4"), "FP16": np.dtype("<f2")}


class ProtocolError(Exception):
    """A request the protocol refuses: its HTTP status (4xx) and one line saying what was wrong. ``errors``: per
    image of a BYTES input that could not be decoded, (its index, why), for clients that retry the others."""

    def __init__(self, message: str, status: int = 400, errors: Sequence[tuple[int, str]] = ()):
        super().__init__(message)
        self.status, self.errors = status, list(errors)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": str(self)}
        if self.errors:
            out["errors"] = [{"index": i, "error": e} for i, e in self.errors]
        return out


@dataclass(frozen=True)
class OutputSpec:
    name: str
    binary: bool = False
    classification: int = 0  # K of the classification extension; 0: the whole tensor
    exact: bool = False  # classification scores as the shortest round-tripping decimal instead of %f


@dataclass
class InferRequest:
    """A checked request: its images' encoded bytes or its preprocessed tensor (float32), and what to send back."""

    id: str | None
    outputs: list[OutputSpec]
    encoded: list[bytes] | list[memoryview] | None = None  # views of the body where it came as binary data
    tensor: np.ndarray | None = None

    @property
    def count(self) -> int:
        return len(self.encoded) if self.encoded is not None else len(self.tensor)  # type: ignore[arg-type]

    @property
    def needs_logits(self) -> bool:
        """Whether the answer needs every class's logit, or only the top-k probabilities (the classify path)."""
        return self.tensor is not None or any(o.name == OUTPUT_LOGITS or not o.classification for o in self.outputs)

    @property
    def top_k(self) -> int:
        return max((o.classification for o in self.outputs), default=0)


# ----------------------------------------------------------------------------------------------------- requests

def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """The JSON header and the binary data after it (empty without the extension's HTTP header)."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        n = int(header_length)
    except ValueError:
        raise ProtocolError(f"{HEADER_LENGTH} must be an integer, got {header_length[:40]!r}") from None
    if not 0 < n <= len(body):
        raise ProtocolError(f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes")
    return body[:n], memoryview(body)[n:]


def load_json(text: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ProtocolError(f"the request is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"the request must be a JSON object, got {type(doc).__name__}")
    return doc


def parse_infer(body: bytes, header_length: str | None, size: int, max_images: int) -> InferRequest:
    """A v2 infer request's body (and its Inference-Header-Content-Length, None without one) checked and read:
    ProtocolError for anything wrong. ``size``: the model's input side; ``max_images``: images a request may hold."""
    text, binary = split_body(body, header_length)
    doc = load_json(text)
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError("'id' must be a string")
    params = parameters(doc, "the request")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise ProtocolError(f"'inputs' must be a list of one input, {INPUT_BYTES!r} (BYTES, encoded images) or "
                            f"{INPUT_TENSOR!r} (FP32 [N,3,{size},{size}])")
    binary_out = flag(params, "binary_data_output", "the request")
    outputs = parse_outputs(doc.get("outputs"), binary_out)
    req = InferRequest(rid, outputs)
    used = read_input(inputs[0], binary, size, max_images, req)
    if used != len(binary):
        raise ProtocolError(f"the body holds {len(binary) - used} bytes of binary data past the inputs' "
                            f"binary_data_size")
    return req


def parameters(obj: dict[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters", {})
    if not isinstance(params, dict):
        raise ProtocolError(f"'parameters' of {where} must be an object")
    return params


def flag(params: dict[str, Any], key: str, where: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError(f"parameter {key!r} of {where} must be true or false")
    return value


def parse_outputs(outputs: Any, binary_default: bool) -> list[OutputSpec]:
    if outputs is None:
        return [OutputSpec(name, binary_default) for name in OUTPUTS]
    if not isinstance(outputs, list) or not outputs:
        raise ProtocolError(f"'outputs' must be a non-empty list; the outputs are {', '.join(OUTPUTS)}")
    specs: list[OutputSpec] = []
    for o in outputs:
        name = o.get("name") if isinstance(o, dict) else None
        if name not in OUTPUTS:
            raise ProtocolError(f"unknown output {name!r}; the outputs are {', '.join(OUTPUTS)}")
        if any(s.name == name for s in specs):
            raise ProtocolError(f"output {name!r} is asked for twice")
        where = f"output {name!r}"
        params = parameters(o, where)
        k = params.get("classification", 0)
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= len(imagenet_labels()):
            raise ProtocolError(f"'classification' of {where} must be an integer from 1 to {len(imagenet_labels())}")
        binary = flag(params, "binary_data", where) if "binary_data" in params else binary_default
        specs.append(OutputSpec(name, binary, k, flag(params, "exact_scores", where)))
    return specs


def tensor_shape(inp: dict[str, Any], name: str) -> list[int]:
    shape = inp.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise ProtocolError(f"input {name!r}: 'shape' must be a list of non-negative integers")
    return shape


def read_input(inp: dict[str, Any], binary: memoryview, size: int, max_images: int, req: InferRequest) -> int:
    """Fill ``req`` with the input's data (from JSON, or ``binary``); returns the binary bytes it took."""
    name, datatype = inp.get("name"), inp.get("datatype")
    if name not in (INPUT_BYTES, INPUT_TENSOR):
        raise ProtocolError(f"unknown input {name!r}; give {INPUT_BYTES!r} (BYTES) or {INPUT_TENSOR!r} (FP32)")
    shape = tensor_shape(inp, name)
    want = (["BYTES"] if name == INPUT_BYTES else list(TENSOR_TYPES))
    if datatype not in want:
        raise ProtocolError(f"input {name!r} has datatype {datatype!r}; it takes {' or '.join(want)}")
    expect = "[N] or [N, 1]" if name == INPUT_BYTES else f"[N, 3, {size}, {size}]"
    ok = (len(shape) in (1, 2) and shape[1:] in ([], [1]) if name == INPUT_BYTES else
          len(shape) == 4 and shape[1:] == [3, size, size])
    if not ok or shape[0] < 1:
        raise ProtocolError(f"input {name!r} has shape {shape}; it takes {expect} with N >= 1")
    if shape[0] > max_images:
        raise ProtocolError(f"input {name!r} holds {shape[0]} images; this server takes at most {max_images} a "
                            f"request", status=413)
    params = parameters(inp, f"input {name!r}")
    nbytes = params.get("binary_data_size")
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0):
        raise ProtocolError(f"input {name!r}: 'binary_data_size' must be a non-negative integer")
    if nbytes is not None and nbytes > len(binary):
        raise ProtocolError(f"input {name!r}: binary_data_size is {nbytes} but the body holds {len(binary)} bytes "
                            f"after the JSON header (truncated?)")
    data = binary[:nbytes] if nbytes is not None else None
    if data is None and "data" not in inp:
        raise ProtocolError(f"input {name!r} has neither 'data' nor parameters.binary_data_size")
    count = math.prod(shape)  # not np.prod: microseconds a request on a list of two
    if name == INPUT_BYTES:
        req.encoded = (split_bytes(data, count, name) if data is not None else
                       json_bytes(inp["data"], count, name, params.get("content_type") == "base64"))
    else:
        dtype = TENSOR_TYPES[datatype]
        x = (binary_tensor(data, dtype, count, name) if data is not None else json_tensor(inp["data"], count, name))
        x = x.reshape(shape).astype(np.float32, copy=False)
        if not np.isfinite(x).all():
            raise ProtocolError(f"input {name!r} holds values that are not finite (NaN or infinity)")
        req.tensor = x
    return nbytes or 0


def split_bytes(data: memoryview, count: int, name: str) -> list[memoryview]:
    """The elements of a BYTES tensor's binary data: each a 4-byte little-endian length, then that many bytes. Each
    element a view of the body, not a copy of it: a request's images are read from the body where they arrived (a
    copy of each JPEG was a quarter of the server's time with 64-image requests)."""
    out: list[memoryview] = []
    at = 0
    for i in range(count):
        if at + 4 > len(data):
            raise ProtocolError(f"input {name!r}: binary data ends before element {i}'s length (truncated?)")
        (n,) = LENGTH.unpack_from(data, at)
        if at + 4 + n > len(data):
            raise ProtocolError(f"input {name!r}: element {i} says {n} bytes but {len(data) - at - 4} are left "
                                f"(truncated?)")
        out.append(data[at + 4:at + 4 + n])
        at += 4 + n
    if at != len(data):
        raise ProtocolError(f"input {name!r}: binary_data_size holds {len(data) - at} bytes past its {count} "
                            f"elements")
    return out


def flat(data: Any) -> list[Any]:
    """A JSON tensor's elements: a flat list, or nested lists in row-major order."""
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    for d in data:
        out += flat(d) if isinstance(d, list) else [d]
    return out


def json_bytes(data: Any, count: int, name: str, b64: bool) -> list[bytes]:
    items = flat(data)
    if len(items) != count:
        raise ProtocolError(f"input {name!r}: 'data' holds {len(items)} elements, its shape {count}")
    out = []
    for i, s in enumerate(items):
        if not isinstance(s, str):
            raise ProtocolError(f"input {name!r}: element {i} of 'data' is not a string")
        try:
            out.append(base64.b64decode(s, validate=True) if b64 else s.encode("utf-8", "surrogatepass"))
        except (binascii.Error, ValueError):
            raise ProtocolError(f"input {name!r}: element {i} is not base64") from None
    return out


def binary_tensor(data: memoryview, dtype: np.dtype, count: int, name: str) -> np.ndarray:
    if len(data) != count * dtype.itemsize:
        raise ProtocolError(f"input {name!r}: binary_data_size is {len(data)} bytes; its shape needs "
                            f"{count * dtype.itemsize} ({count} x {dtype.itemsize})")
    return np.frombuffer(data, dtype)


def json_tensor(data: Any, count: int, name: str) -> np.ndarray:
    items = flat(data)
    if len(items) != count:
        raise ProtocolError(f"input {name!r}: 'data' holds {len(items)} elements, its shape {count}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        raise ProtocolError(f"input {name!r}: 'data' must hold numbers only")
    return np.asarray(items, dtype=np.float32)


# ---------------------------------------------------------------------------------------------------- responses

def classification(scores: np.ndarray, k: int, exact: bool, labels: Labels,
                   order: np.ndarray | None = None) -> list[list[str]]:
    """Triton's classification extension: per row its top k as "score:index:label", highest first (ties: lower
    index), the label the class's name in ``labels`` (the engine's network's). ``order``: the rows' indices in that
    order where known already."""
    if order is None:
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    fmt = repr if exact else (lambda v: f"{v:f}")
    return [[f"{fmt(float(row[i]))}:{int(i)}:{labels[i]}" for i in idx[:k]] for row, idx in zip(scores, order)]


def bytes_tensor(strings: Iterable[str]) -> bytes:
    """A BYTES tensor's binary data: each element's 4-byte little-endian length, then its UTF-8 bytes."""
    return bytes_tensor_raw([s.encode("utf-8") for s in strings])


@functools.cache
def label_suffixes(labels: Labels) -> tuple[str, ...]:
    """Per class of ``labels`` the end of its classification element, ":index:label" (formatted once, not per
    image)."""
    return tuple(f":{i}:{label}" for i, label in enumerate(labels))


@dataclass
class Answer:
    """What the engine gave for a request: logits and probabilities (float32) of every class, where the request
    needs them, and per image its top classes as (index, probability) pairs, most likely first."""

    logits: np.ndarray | None = None
    probs: np.ndarray | None = None  # float64 where computed from logits on the host
    top: list[list[tuple[int, float]]] | None = None


def output_tensor(spec: OutputSpec, answer: Answer, labels: Labels) -> tuple[str, list[int], Any]:
    """(datatype, shape, values) of one output: a float32 array or a list of strings (classes named by
    ``labels``)."""
    if spec.classification and spec.name == OUTPUT_PROBS and answer.top is not None:
        suffix, k, shape = label_suffixes(labels), spec.classification, [len(answer.top), spec.classification]
        if spec.exact:
            return "BYTES", shape, [repr(p) + suffix[i] for top in answer.top for i, p in top[:k]]
        return "BYTES", shape, [f"{p:f}{suffix[i]}" for top in answer.top for i, p in top[:k]]
    values = answer.probs if spec.name == OUTPUT_PROBS else answer.logits
    assert values is not None, f"{spec.name} was not computed"
    if spec.classification:
        rows = classification(values, spec.classification, spec.exact, labels)
        return "BYTES", [len(rows), spec.classification], [s for row in rows for s in row]
    return "FP32", list(values.shape), np.ascontiguousarray(values, dtype="<f4")


def infer_response(req: InferRequest, answer: Answer, labels: Labels) -> tuple[bytes, dict[str, str]]:
    """The response body and its HTTP headers: JSON, or with binary outputs the JSON header then their bytes;
    classes named by ``labels`` (the engine's network's: EngineFacts.labels)."""
    outputs, blobs = [], []
    for spec in req.outputs:
        datatype, shape, values = output_tensor(spec, answer, labels)
        entry: dict[str, Any] = {"name": spec.name, "datatype": datatype, "shape": shape}
        if spec.binary:
            blob = bytes_tensor(values) if datatype == "BYTES" else values.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = values if datatype == "BYTES" else values.ravel().tolist()
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": MODEL_NAME, "model_version": MODEL_VERSION, "outputs": outputs}
    if req.id is not None:
        doc["id"] = req.id
    head = json.dumps(doc).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(head))}


def model_metadata(size: int, classes: int) -> dict[str, Any]:
    """Triton's model metadata: ``classes`` outputs a row (the network's; -1 where not known yet)."""
    return {"name": MODEL_NAME, "versions": [MODEL_VERSION], "platform": PLATFORM,
            "inputs": [{"name": INPUT_BYTES, "datatype": "BYTES", "shape": [-1]},
                       {"name": INPUT_TENSOR, "datatype": "FP32", "shape": [-1, 3, size, size]}],
            "outputs": [{"name": name, "datatype": "FP32", "shape": [-1, classes]}
                        for name in OUTPUTS]}


def model_config(size: int, max_batch: int, facts: dict[str, str], labels: Labels) -> dict[str, Any]:
    """Triton's model configuration (GET .../config), with what computes the answers as string parameters; an
    output's label file only where the network's labels are ImageNet's (the FID network's are not shipped)."""
    meta = model_metadata(size, len(labels))
    label_file = {"label_filename": "imagenet_classes.txt"} if labels == imagenet_labels() else {}
    dims = {INPUT_BYTES: [1], INPUT_TENSOR: [3, size, size]}
    return {"name": MODEL_NAME, "platform": PLATFORM, "max_batch_size": max_batch,
            "input": [{"name": i["name"], "data_type": f"TYPE_{i['datatype'].replace('BYTES', 'STRING')}",
                       "dims": dims[i["name"]], "optional": True} for i in meta["inputs"]],
            "output": [{"name": o["name"], "data_type": "TYPE_FP32", "dims": [len(labels)], **label_file}
                       for o in meta["outputs"]],
            "dynamic_batching": {},
            "parameters": {k: {"string_value": v} for k, v in facts.items()}}


# ------------------------------------------------------------------------------------------ the client's requests
