"""The Open Inference Protocol's names as inception-serve speaks them (the model, its tensors, Triton's binary data
header) and a client's side of a request: encoded images out, the classification's strings back. NumPy-free: all
that ``inception-run --server`` needs of the protocol (protocol.py parses and answers requests on the server)."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

MODEL_NAME = "inception_v3"
MODEL_VERSION = "1"
PLATFORM = "inception_engine"
INPUT_BYTES, INPUT_TENSOR = "images", "input"
OUTPUT_PROBS, OUTPUT_LOGITS = "probabilities", "logits"
OUTPUTS = (OUTPUT_PROBS, OUTPUT_LOGITS)
HEADER_LENGTH = "Inference-Header-Content-Length"  # Triton's binary data extension's HTTP header
LENGTH = struct.Struct("<I")  # a BYTES element's length prefix in binary data


def encode_images_request(images: Sequence[bytes], top_k: int, exact: bool = True) -> tuple[bytes, dict[str, str]]:
    """A binary infer request of encoded images asking for their top_k classes (classification of the
    probabilities): its body and headers, as tritonclient would make it."""
    size = sum(len(b) for b in images) + LENGTH.size * len(images)
    head = json.dumps({
        "inputs": [{"name": INPUT_BYTES, "datatype": "BYTES", "shape": [len(images)],
                    "parameters": {"binary_data_size": size}}],
        "outputs": [{"name": OUTPUT_PROBS, "parameters": {"classification": top_k, "exact_scores": exact,
                                                          "binary_data": False}}]}).encode()
    parts = [head]
    for b in images:  # the body joined once: each image copied once, not into its element and then the body
        parts += (LENGTH.pack(len(b)), b)
    return b"".join(parts), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(head))}


def bytes_tensor_raw(items: Sequence[bytes]) -> bytes:
    return b"".join([LENGTH.pack(len(b)) + b for b in items])


def parse_classification(strings: Sequence[str]) -> list[tuple[int, str, float]]:
    """"score:index:label" elements back to (index, label, score); ValueError where one is not that."""
    out = []
    for s in strings:
        score, index, label = s.split(":", 2)
        out.append((int(index), label, float(score)))
    return out
