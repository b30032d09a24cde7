"""Reading an ONNX model and checking it before anything is folded: the converter's defences against damaged and
hostile files (onnx_convert.py folds what this module hands it into the engine's arrays).

1. Load, external data checked tensor by tensor: its file must be a regular file inside the model's folder (real
   path, symlinks resolved), offset and length whole numbers that fit the file and the tensor's type and dims, all
   of them together within MAX_EXTERNAL_BYTES.
2. Normalise the graph: every node's attributes must be ones its ONNX schema (at the model's opset) defines, of
   the schema's type, required ones present, as onnxruntime demands; constants come from initializers, Constant
   nodes and every node whose inputs are all constant (a small NumPy interpreter; an op that could grow an array,
   broadcasting, concatenating or gathering, is refused past MAX_VALUES); Identity and inference Dropout are
   aliases.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from . import arch
from .errors import ConversionError

FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
EXTERNAL_KEYS = {"location", "offset", "length", "checksum"}  # what an external_data entry may hold
MAX_VALUES = 1 << 25  # the most values a folded constant may hold (Inception-V3's largest weight has 2M)
MAX_EXTERNAL_BYTES = 1 << 30  # all externally stored tensors together (Inception-V3's weights take ~100 MB)


# --- a small NumPy interpreter: constant folding and the input preprocessing ------------------------------------

def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def node_axes(node: onnx.NodeProto, args: list[Any], rank: int) -> list[int] | None:
    """Axes given as attribute (older opsets) or as second input (newer ones), made non-negative."""
    at = node_attrs(node)
    axes = at.get("axes")
    if axes is None and len(args) > 1 and args[1] is not None:
        axes = [int(a) for a in np.asarray(args[1]).reshape(-1)]
    return None if axes is None else sorted(a % rank for a in axes)


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    at = node_attrs(node)
    if "value" in at:
        return numpy_helper.to_array(at["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in at:
            return np.array(at[key], dtype)
    raise ValueError(f"Constant with unsupported attribute {sorted(at)}")


def _slice(x: np.ndarray, node: onnx.NodeProto, args: list[Any]) -> np.ndarray:
    at = node_attrs(node)
    if "starts" in at:  # opset < 10
        starts, ends, axes, steps = at["starts"], at["ends"], at.get("axes"), None
    else:
        starts, ends = args[1], args[2]
        axes = args[3] if len(args) > 3 else None
        steps = args[4] if len(args) > 4 else None
    starts, ends = [int(s) for s in np.reshape(starts, -1)], [int(e) for e in np.reshape(ends, -1)]
    axes = list(range(len(starts))) if axes is None else [int(a) % x.ndim for a in np.reshape(axes, -1)]
    steps = [1] * len(starts) if steps is None else [int(s) for s in np.reshape(steps, -1)]
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = slice(s, e, st)
    return x[tuple(index)]


def _split(x: np.ndarray, node: onnx.NodeProto, args: list[Any]) -> list[np.ndarray]:
    at = node_attrs(node)
    axis = at.get("axis", 0) % x.ndim
    sizes = at.get("split")
    if sizes is None and len(args) > 1 and args[1] is not None:
        sizes = [int(s) for s in np.reshape(args[1], -1)]
    if sizes is None:  # equal parts; opset 18's num_outputs makes the last one smaller
        n = len(node.output)
        chunk = -(-x.shape[axis] // n)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(n)]
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def _reshape(x: np.ndarray, shape: np.ndarray, allowzero: int) -> np.ndarray:
    dims = [int(d) for d in np.reshape(shape, -1)]
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


def _bounded(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` if an array of it stays within MAX_VALUES (a hostile constant subgraph must not fill memory)."""
    if math.prod(shape) > MAX_VALUES:
        raise ValueError(f"it would hold {math.prod(shape)} values, more than {MAX_VALUES}")
    return shape


def _binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _bounded(np.broadcast_shapes(np.shape(a), np.shape(b)))
    if op == "Div" and np.issubdtype(np.result_type(a, b), np.integer):
        return np.trunc(a / b).astype(np.result_type(a, b))  # ONNX integer division truncates
    return {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op](a, b)


def evaluate(node: onnx.NodeProto, args: list[Any]) -> list[np.ndarray]:
    """Outputs of ``node`` for the input arrays ``args`` (None for an omitted optional input)."""
    op, at = node.op_type, node_attrs(node)
    x = args[0] if args else None
    if op == "Constant":
        return [_constant_value(node)]
    if op in ("Identity", "Dropout"):
        return [x]
    if op in ("Add", "Sub", "Mul", "Div"):
        return [_binary(op, args[0], args[1])]
    if op == "Neg":
        return [-x]
    if op == "Sqrt":
        return [np.sqrt(x)]
    if op == "Reciprocal":
        return [1 / x]
    if op == "Cast":
        return [x.astype(onnx.helper.tensor_dtype_to_np_dtype(at["to"]))]
    if op == "CastLike":
        return [x.astype(args[1].dtype)]
    if op == "Shape":
        return [np.array(x.shape[at.get("start", 0):at.get("end", x.ndim)], np.int64)]
    if op == "Reshape":
        return [_reshape(x, args[1], at.get("allowzero", 0))]
    if op == "Flatten":
        axis = at.get("axis", 1)
        axis = axis + x.ndim if axis < 0 else axis
        return [x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))]
    if op == "Expand":
        shape = _bounded(np.broadcast_shapes(x.shape, tuple(int(d) for d in np.reshape(args[1], -1))))
        return [np.broadcast_to(x, shape).copy()]
    if op == "Concat":
        _bounded((sum(np.size(a) for a in args if a is not None),))
        return [np.concatenate([a for a in args if a is not None], axis=at["axis"])]
    if op == "Unsqueeze":
        axes = at.get("axes") or [int(a) for a in np.reshape(args[1], -1)]
        for a in sorted(a % (x.ndim + len(axes)) for a in axes):
            x = np.expand_dims(x, a)
        return [x]
    if op == "Squeeze":
        axes = node_axes(node, args, x.ndim)
        return [np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(axes))]
    if op == "Gather":
        _bounded((np.size(x) // max(1, np.shape(x)[at.get("axis", 0)]) * np.size(args[1]),))
        return [np.take(x, args[1], axis=at.get("axis", 0))]
    if op == "Slice":
        return [_slice(x, node, args)]
    if op == "Split":
        return _split(x, node, args)
    if op == "Transpose":
        return [np.transpose(x, at.get("perm"))]
    raise ValueError(f"no evaluator for {op}")


# Ops the interpreter folds when all inputs are constant; the input preprocessing may use the elementwise and
# indexing ones among them (never Shape-dependent tricks on the image itself).
FOLDABLE = {"Identity", "Dropout", "Add", "Sub", "Mul", "Div", "Neg", "Sqrt", "Reciprocal", "Cast", "CastLike",
            "Shape", "Reshape", "Flatten", "Expand", "Concat", "Unsqueeze", "Squeeze", "Gather", "Slice", "Split",
            "Transpose"}
PREPROCESSING_OPS = {"Identity", "Add", "Sub", "Mul", "Div", "Neg", "Cast", "Concat", "Unsqueeze", "Squeeze",
                     "Gather", "Slice", "Split", "Reshape"}


# --- the normalised graph --------------------------------------------------------------------------------------

@dataclass
class Graph:
    source: str
    nodes: list[onnx.NodeProto]
    consts: dict[str, np.ndarray]
    alias: dict[str, str]  # value -> the value it is an alias of (Identity, inference Dropout)
    producer: dict[str, int]  # non-constant value -> index of the node that computes it
    input_name: str
    input_batch: int | None
    input_dtype: np.dtype  # the element type of the image, which every weight must share (ONNX's type T)

    def fail(self, msg: str, node: int | None = None) -> ConversionError:
        return _not_understood(self.source, self.nodes, msg, node)

    def real(self, value: str) -> str:
        while value in self.alias:
            value = self.alias[value]
        return value

    def const(self, value: str) -> np.ndarray | None:
        return self.consts.get(self.real(value)) if value else None

    def producing(self, value: str, what: str, ops: tuple[str, ...]) -> tuple[int, onnx.NodeProto]:
        """The node computing ``value``, which must be one of ``ops``; ``what`` is the canonical layer."""
        v = self.real(value)
        expected = " or ".join(ops)
        if v == self.input_name:
            raise self.fail(f"{what} expects {expected}, found the graph input")
        if v in self.consts:
            raise self.fail(f"{what} expects {expected}, found a constant")
        i = self.producer.get(v)
        if i is None:
            raise self.fail(f"{what} expects {expected}, found '{v}', which no node computes")
        if self.nodes[i].op_type not in ops or self.nodes[i].domain not in ("", "ai.onnx"):
            raise self.fail(f"{what} expects {expected}, found {self.nodes[i].op_type}", i)
        return i, self.nodes[i]

    def weight(self, value: str, what: str, node: int) -> np.ndarray:
        a = self.const(value)
        if a is None:
            raise self.fail(f"{what} is computed at run time, expected a constant", node)
        if not np.issubdtype(a.dtype, np.floating):
            raise self.fail(f"{what} has type {a.dtype}, expected floating point", node)
        if a.dtype != self.input_dtype:
            raise self.fail(f"{what} is {a.dtype} but the graph input is {self.input_dtype}; onnxruntime refuses "
                            f"an operator whose inputs differ in type", node)
        if not np.all(np.isfinite(a)):
            raise self.fail(f"{what} contains NaN or Inf (corrupt file?)", node)
        return a.astype(np.float64)


def _dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in vi.type.tensor_type.shape.dim]


def _default_opset(model: onnx.ModelProto, source: str) -> int:
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if len(versions) != 1 or not 1 <= versions[0] <= onnx.defs.onnx_opset_version():
        raise ConversionError(f"{source}: the model imports ONNX opset {versions or 'none'}; an export names one "
                              f"opset from 1 to {onnx.defs.onnx_opset_version()} (damaged file?)")
    return versions[0]


def _not_understood(source: str, nodes: Sequence[onnx.NodeProto], msg: str, node: int | None = None
                    ) -> ConversionError:
    where = "" if node is None else f"node {node} ({nodes[node].op_type}): "
    return ConversionError(f"{source}: not an Inception-V3 export this converter understands: {where}{msg}")


def check_schema(fail: Callable[[str, int], ConversionError], i: int, node: onnx.NodeProto, opset: int) -> None:
    """The node is what its ONNX schema allows, as onnxruntime checks it before running anything: a known
    operator of the opset, its number of inputs and outputs, and only the attributes it defines, each once, of
    its type, the required ones present. (A misspelt attribute is an error, never silently a default.)"""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        raise fail(f"{node.op_type} is not an operator of ONNX opset {opset}", i) from None
    if not (schema.min_input <= len(node.input) <= schema.max_input
            and schema.min_output <= len(node.output) <= schema.max_output):
        raise fail(f"{len(node.input)} inputs and {len(node.output)} outputs, where {node.op_type} takes "
                   f"{schema.min_input}-{schema.max_input} and gives {schema.min_output}-{schema.max_output}", i)
    seen: set[str] = set()
    for a in node.attribute:
        spec = schema.attributes.get(a.name)
        if spec is None:
            known = ", ".join(sorted(schema.attributes)) or "none"
            raise fail(f"unknown attribute '{a.name}' ({node.op_type} has {known}); onnxruntime refuses it", i)
        if a.name in seen:
            raise fail(f"attribute '{a.name}' is given twice", i)
        seen.add(a.name)
        if a.type != spec.type.value:
            raise fail(f"attribute '{a.name}' has attribute type {a.type}, where {node.op_type}'s is "
                       f"{spec.type.name}", i)
    missing = sorted(n for n, spec in schema.attributes.items() if spec.required and n not in seen)
    if missing:
        raise fail(f"required attribute '{missing[0]}' is missing", i)


def normalise(model: onnx.ModelProto, source: str) -> Graph:
    g = model.graph
    if not g.node:
        raise ConversionError(f"{source}: the ONNX model has no graph nodes (not an exported network)")
    opset = _default_opset(model, source)
    for i, node in enumerate(g.node):  # before any tensor is read: cheap, and what onnxruntime checks first
        if node.domain in ("", "ai.onnx"):
            check_schema(lambda msg, i: _not_understood(source, g.node, msg, i), i, node, opset)
    consts: dict[str, np.ndarray] = {}
    for t in g.initializer:
        if t.name in consts:
            raise ConversionError(f"{source}: two initializers are named '{t.name}' (onnxruntime refuses it); the "
                                  f"file is damaged, export it again")
        try:
            consts[t.name] = numpy_helper.to_array(t)
        except Exception as e:  # numpy_helper raises several types for short or malformed tensors
            raise ConversionError(f"{source}: initializer '{t.name}' is unreadable ({e}); the file is corrupt"
                                  ) from None
    inputs = [i for i in g.input if i.name not in consts]
    if len(inputs) != 1:
        raise ConversionError(f"{source}: expected one image input, found {len(inputs)} "
                              f"({', '.join(i.name for i in inputs) or 'none'})")
    inp = inputs[0]
    dims = _dims(inp)
    if inp.type.tensor_type.elem_type not in FLOAT_TYPES:
        raise ConversionError(f"{source}: graph input '{inp.name}' is not a floating-point tensor")
    if len(dims) != 4 or dims[1:] != [3, arch.INPUT_SIZE, arch.INPUT_SIZE] or dims[0] == 0:
        shown = "[" + ", ".join(str(d) for d in dims) + "]"
        raise ConversionError(f"{source}: graph input '{inp.name}' has shape {shown}; Inception-V3 takes "
                              f"[N, 3, {arch.INPUT_SIZE}, {arch.INPUT_SIZE}]")
    batch = dims[0] if isinstance(dims[0], int) else None

    graph = Graph(source, list(g.node), consts, {}, {}, inp.name, batch,
                  np.dtype(onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)))
    defined = set(consts) | {inp.name}
    for i, node in enumerate(g.node):
        for name in node.input:
            if name and name not in defined:
                raise graph.fail(f"input '{name}' is not produced by any earlier node, initializer or graph input "
                                 f"(truncated or edited graph?)", i)
        twice = [name for name in node.output if name and name in defined]
        if twice:
            raise graph.fail(f"output '{twice[0]}' is computed a second time (each value has one producer)", i)
        defined.update(node.output)
        args = [graph.const(n) if n else None for n in node.input]
        if node.op_type == "CastLike" and args and args[0] is not None and args[1] is None:
            # A constant cast to the type of an activation (the dynamo exporter's zero conv biases): every
            # activation has the image's element type.
            args[1] = np.empty(0, graph.input_dtype)
        foldable = node.op_type == "Constant" or (node.op_type in FOLDABLE and all(
            a is not None for a, n in zip(args, node.input) if n))
        if foldable and node.domain in ("", "ai.onnx"):
            try:
                outs = evaluate(node, args)
            except Exception as e:  # malformed constant subgraph: say where
                raise graph.fail(f"cannot evaluate constant expression ({e})", i) from None
            for name, value in zip(node.output, outs):
                consts[name] = np.asarray(value)
            for name in node.output[len(outs):]:  # Dropout's mask: not a constant the interpreter knows
                graph.producer[name] = i
        elif node.op_type in ("Identity", "Dropout") and node.domain in ("", "ai.onnx"):
            # Dropout is the identity at inference unless asked to train (third input true).
            training = graph.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            if training is not None and bool(np.any(training)):
                raise graph.fail("Dropout in training mode", i)
            graph.alias[node.output[0]] = node.input[0]
            for name in node.output[1:]:
                graph.producer[name] = i
        else:
            for name in node.output:
                graph.producer[name] = i
    return graph


# --- external data and loading -----------------------------------------------------------------------------------

def _tensors(model: onnx.ModelProto):
    """Initializers and Constant-node tensors of the main graph: where weights can live."""
    yield from model.graph.initializer
    for node in model.graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t


# Element types an external tensor may have: whole bytes per value, so offset + length arithmetic is exact.
EXTERNAL_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                  onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
                  onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32,
                  onnx.TensorProto.UINT64, onnx.TensorProto.BOOL}


def _external_info(t: onnx.TensorProto, source: Path) -> dict[str, str]:
    info: dict[str, str] = {}
    for e in t.external_data:
        if e.key not in EXTERNAL_KEYS or e.key in info:
            what = "repeats" if e.key in info else "has the unknown"
            raise ConversionError(f"{source}: tensor '{t.name}' {what} external-data key '{e.key}' (known: "
                                  f"{', '.join(sorted(EXTERNAL_KEYS))}); the file is damaged, export it again")
        info[e.key] = e.value
    return info


def _external_path(source: Path, t: onnx.TensorProto, loc: str) -> Path:
    """The real path of external data file ``loc``: it must resolve (symlinks followed) to a regular file inside
    the model's folder, so that a model can never make the converter read anything else."""
    if not loc or Path(loc).is_absolute() or ".." in Path(loc).parts or "\0" in loc:
        raise ConversionError(f"{source}: tensor '{t.name}' points to external data '{loc}' outside the model's "
                              f"folder; refusing to read it")
    folder = source.parent.resolve()
    real = (source.parent / loc).resolve()
    if not real.is_relative_to(folder):
        raise ConversionError(f"{source}: external data file '{loc}' is a link to {real}, outside the model's "
                              f"folder {folder}; refusing to read it (copy the data next to the .onnx file)")
    try:
        st = os.stat(real)
    except OSError:
        raise ConversionError(f"{source}: external data file '{loc}' is missing (it holds the weights and must sit "
                              f"next to the .onnx file, as {source.parent / loc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConversionError(f"{source}: external data '{loc}' is not a regular file; refusing to read it")
    return real


def external_files(model: onnx.ModelProto, source: str | Path) -> list[tuple[str, Path]]:
    """(location, real path) of every external data file the model's tensors name, each checked as
    _external_path does."""
    source = Path(source)
    files: dict[str, Path] = {}
    for t in _tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = _external_info(t, source).get("location", "")
            if loc not in files:
                files[loc] = _external_path(source, t, loc)
    return sorted(files.items())


def _whole_number(text: str, key: str, t: onnx.TensorProto, source: Path) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ConversionError(f"{source}: tensor '{t.name}' has external-data {key} '{text[:40]}', not a whole "
                              f"number of bytes; the file is damaged, export it again")
    return int(text)


def load_external_data(model: onnx.ModelProto, source: Path) -> bool:
    """Reads every externally stored tensor from its file next to the model; True if there were any. Offset and
    length must be whole numbers, the length that of the tensor's dims and type (as onnxruntime requires), and
    the range inside the file."""
    files = dict(external_files(model, source))
    handles: dict[str, Any] = {}
    total = 0
    try:
        for t in _tensors(model):
            if t.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = _external_info(t, source)
            loc = info.get("location", "")
            if t.data_type not in EXTERNAL_TYPES or any(d < 0 for d in t.dims):
                raise ConversionError(f"{source}: tensor '{t.name}' has data type {t.data_type} and dims "
                                      f"{list(t.dims)}, not a numeric tensor; the file is damaged, export it again")
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
            size = math.prod(t.dims) * itemsize
            offset = _whole_number(info.get("offset", "0"), "offset", t, source)
            if "length" in info and _whole_number(info["length"], "length", t, source) != size:
                raise ConversionError(f"{source}: tensor '{t.name}' has external-data length {info['length']}, but "
                                      f"its dims {list(t.dims)} of {onnx.TensorProto.DataType.Name(t.data_type)} "
                                      f"take {size} bytes; the file is damaged, export it again")
            total += size
            if total > MAX_EXTERNAL_BYTES:
                raise ConversionError(f"{source}: the externally stored tensors add up to more than "
                                      f"{MAX_EXTERNAL_BYTES >> 20} MiB (at tensor '{t.name}'); Inception-V3's "
                                      f"weights take about 100 MB, so the file is damaged, export it again")
            if loc not in handles:
                try:
                    handles[loc] = open(files[loc], "rb")  # noqa: SIM115  # closed below, with the others
                except OSError as e:
                    raise ConversionError(f"{source}: cannot read external data file '{loc}' ({e.strerror})") \
                        from None
            f = handles[loc]
            data = b""
            if offset + size <= os.fstat(f.fileno()).st_size:
                f.seek(offset)
                data = f.read(size)
            if len(data) != size:
                raise ConversionError(f"{source}: external data file '{loc}' is too short for tensor '{t.name}' "
                                      f"(truncated?); copy or export it again")
            t.raw_data = data
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
    finally:
        for f in handles.values():
            f.close()
    return bool(files)


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Parses the file without its external data (``convert_model`` reads that, checking it)."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path}: no such ONNX file")
    if path.stat().st_size >= 1 << 31:
        raise ConversionError(f"{path}: {path.stat().st_size >> 20} MiB, larger than an ONNX file can be (2 GiB; "
                              f"bigger models keep their weights in external data); not an ONNX model")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf reports truncation and garbage with several exception types
        raise ConversionError(f"{path}: not a readable ONNX file ({type(e).__name__}: {e}); it is truncated or "
                              f"corrupt, export it again") from None
