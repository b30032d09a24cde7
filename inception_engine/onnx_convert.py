"""ONNX -> engine weights: find torchvision's Inception-V3 in a torch.onnx export by its structure and pull out
the 94 convolutions (BatchNorm folded in) and the classifier as canonical arrays (see weights.py).

1. Load, external data checked tensor by tensor: its file must be a regular file inside the model's folder (real
   path, symlinks resolved), offset and length whole numbers that fit the file and the tensor's type and dims.
2. Normalise the graph: every node's attributes must be ones its ONNX schema (at the model's opset) defines, of
   the schema's type, required ones present, as onnxruntime demands; constants come from initializers, Constant
   nodes and every node whose inputs are all constant (a small NumPy interpreter); Identity and inference Dropout
   are aliases.
3. Match backward from the logits against ``arch.inception_v3()``, last layer first: each canonical tensor is the
   ONNX value its consumer reads, and its producer must have the canonical form (Relu <- [BatchNormalization <-]
   Conv, MaxPool/AveragePool, channel Concat with nested Concats flattened, global pool, Gemm or MatMul+Add). Concat
   input order tells equal-shaped branches apart; a tensor read by several layers must be one ONNX value. Names of
   nodes and tensors are never looked at.
4. Whatever sits between the graph input and Conv2d_1a_3x3 (torchvision's ``transform_input``) must be a
   per-channel affine map y_c = a_c * x_c + t_c. It is measured numerically and folded into that convolution,
   which has no padding, so the fold is exact: w'[o,c] = w[o,c] * a_c, b'[o] = b[o] + sum_{c,i,j} w[o,c,i,j] * t_c.
5. Every folded array must be finite and within float32's range (a BatchNorm variance + epsilon must be
   positive); the weight file never holds a value onnxruntime would not compute.
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
from .weights import (IMAGENET_MEAN, IMAGENET_STD, default_weights_path, save_weights, sha256_file,
                      writable_target)

RESIZE = 342  # torchvision's Inception_V3_Weights transforms: resize 342, centre crop 299
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
SHAPE_OPS = ("Flatten", "Reshape", "Squeeze")  # allowed between the global pool and the classifier
EXTERNAL_KEYS = {"location", "offset", "length", "checksum"}  # what an external_data entry may hold
FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_VALUES = 1 << 25  # the most values a folded constant may hold (Inception-V3's largest weight has 2M)
MAX_PROBE_BATCH = 64  # a fixed batch the input preprocessing is evaluated at (probes stay within MAX_VALUES)
MAX_EXTERNAL_BYTES = 1 << 30  # all externally stored tensors together (Inception-V3's weights take ~100 MB)


def fold_batchnorm(w: np.ndarray, b: np.ndarray, gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray,
                   var: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Conv then inference BatchNorm as one conv, in float64: w' = w*g/sqrt(v+eps), b' = (b-m)*g/sqrt(v+eps)+beta."""
    s = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    w2 = w.astype(np.float64) * s.reshape(-1, *([1] * (w.ndim - 1)))
    return w2, (b.astype(np.float64) - mean.astype(np.float64)) * s + beta.astype(np.float64)


def fold_input_affine(w: np.ndarray, b: np.ndarray, scale: np.ndarray, shift: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """conv(a*x + t) as conv'(x), exact for an unpadded conv: w' = w*a_c, b' = b + sum_{c,i,j} w[o,c,i,j]*t_c."""
    w = w.astype(np.float64)
    return (w * scale.reshape(1, -1, 1, 1),
            b.astype(np.float64) + np.einsum("ocij,c->o", w, shift.astype(np.float64)))


# --- a small NumPy interpreter: constant folding and the input preprocessing ------------------------------------

def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _axes(node: onnx.NodeProto, args: list[Any], rank: int) -> list[int] | None:
    """Axes given as attribute (older opsets) or as second input (newer ones), made non-negative."""
    at = _attrs(node)
    axes = at.get("axes")
    if axes is None and len(args) > 1 and args[1] is not None:
        axes = [int(a) for a in np.asarray(args[1]).reshape(-1)]
    return None if axes is None else sorted(a % rank for a in axes)


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    at = _attrs(node)
    if "value" in at:
        return numpy_helper.to_array(at["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in at:
            return np.array(at[key], dtype)
    raise ValueError(f"Constant with unsupported attribute {sorted(at)}")


def _slice(x: np.ndarray, node: onnx.NodeProto, args: list[Any]) -> np.ndarray:
    at = _attrs(node)
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
    at = _attrs(node)
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


def _evaluate(node: onnx.NodeProto, args: list[Any]) -> list[np.ndarray]:
    """Outputs of ``node`` for the input arrays ``args`` (None for an omitted optional input)."""
    op, at = node.op_type, _attrs(node)
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
        axes = _axes(node, args, x.ndim)
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
class _Graph:
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


def _check_schema(fail: Callable[[str, int], ConversionError], i: int, node: onnx.NodeProto, opset: int) -> None:
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


def _normalise(model: onnx.ModelProto, source: str) -> _Graph:
    g = model.graph
    if not g.node:
        raise ConversionError(f"{source}: the ONNX model has no graph nodes (not an exported network)")
    opset = _default_opset(model, source)
    for i, node in enumerate(g.node):  # before any tensor is read: cheap, and what onnxruntime checks first
        if node.domain in ("", "ai.onnx"):
            _check_schema(lambda msg, i: _not_understood(source, g.node, msg, i), i, node, opset)
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

    graph = _Graph(source, list(g.node), consts, {}, {}, inp.name, batch,
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
                outs = _evaluate(node, args)
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


# --- matching the canonical layers ---------------------------------------------------------------------------

def _ints(at: dict[str, Any], key: str, default: list[int]) -> list[int]:
    return [int(v) for v in at.get(key, default)]


def _check_window(g: _Graph, i: int, what: str, at: dict[str, Any], kernel: tuple[int, int], stride: int,
                  pad: tuple[int, int]) -> None:
    """Attributes shared by Conv and the pools: explicit pads, no dilation, the canonical window."""
    if at.get("auto_pad", "NOTSET") != "NOTSET":
        raise g.fail(f"{what}: auto_pad={at['auto_pad']} is not supported (expected NOTSET with explicit pads)", i)
    if _ints(at, "dilations", [1, 1]) != [1, 1]:
        raise g.fail(f"{what}: dilations {_ints(at, 'dilations', [])} are not supported (expected [1, 1])", i)
    if "kernel_shape" in at and tuple(_ints(at, "kernel_shape", [])) != kernel:
        raise g.fail(f"{what} expects a {kernel[0]}x{kernel[1]} window, found kernel_shape "
                     f"{_ints(at, 'kernel_shape', [])}", i)
    strides = _ints(at, "strides", [1, 1])
    if strides != [stride, stride]:
        raise g.fail(f"{what} expects stride {stride}, found strides {strides}", i)
    pads = _ints(at, "pads", [0, 0, 0, 0])
    if pads != [pad[0], pad[1], pad[0], pad[1]]:
        raise g.fail(f"{what} expects padding {pad[0]}x{pad[1]}, found pads {pads}", i)


def _match_conv(g: _Graph, layer: arch.Conv, value: str) -> tuple[str, np.ndarray, np.ndarray]:
    """Relu <- [BatchNormalization <-] Conv: returns the conv's input value and the folded weight and bias."""
    name = layer.name
    _, relu = g.producing(value, f"{name} (Conv + ReLU)", ("Relu",))
    i, node = g.producing(relu.input[0], f"{name} (Conv before its ReLU)", ("Conv", "BatchNormalization"))
    bn = None
    if node.op_type == "BatchNormalization":
        bn = (i, node)
        i, node = g.producing(node.input[0], f"{name} (Conv before its BatchNormalization)", ("Conv",))
    at = _attrs(node)
    if int(at.get("group", 1)) != 1:
        raise g.fail(f"{name}: group={at['group']} is not supported (expected 1)", i)
    w = g.weight(node.input[1], f"{name} weight", i)
    if w.ndim != 4:
        raise g.fail(f"{name} expects a 4-D weight, found shape {list(w.shape)}", i)
    if w.shape[1] != layer.in_ch:
        raise g.fail(f"{name} expects {layer.in_ch} input channels, found {w.shape[1]}", i)
    if w.shape[0] != layer.out_ch:
        raise g.fail(f"{name} expects {layer.out_ch} output channels, found {w.shape[0]}", i)
    if w.shape[2:] != layer.kernel:
        raise g.fail(f"{name} expects a {layer.kernel[0]}x{layer.kernel[1]} kernel, found "
                     f"{w.shape[2]}x{w.shape[3]}", i)
    _check_window(g, i, name, at, layer.kernel, layer.stride, layer.pad)
    b = np.zeros(layer.out_ch)
    if len(node.input) > 2 and node.input[2]:
        b = g.weight(node.input[2], f"{name} bias", i).reshape(-1)
        if b.shape != (layer.out_ch,):
            raise g.fail(f"{name} expects a bias of {layer.out_ch}, found shape {list(b.shape)}", i)
    if bn is not None:
        j, bnode = bn
        bat = _attrs(bnode)
        if int(bat.get("training_mode", 0)):
            raise g.fail(f"{name}: BatchNormalization in training mode", j)
        params = [g.weight(v, f"{name} BatchNormalization {k}", j).reshape(-1)
                  for k, v in zip(("scale", "bias", "mean", "var"), bnode.input[1:5])]
        if len(params) != 4 or any(p.shape != (layer.out_ch,) for p in params):
            raise g.fail(f"{name}: BatchNormalization expects 4 parameters of {layer.out_ch} channels", j)
        eps = float(bat.get("epsilon", 1e-5))
        denominator = params[3] + eps
        if not (np.isfinite(eps) and np.all(denominator > 0)):
            c = int(np.argmin(denominator)) if np.isfinite(eps) else 0
            raise g.fail(f"{name}: BatchNormalization variance + epsilon is {denominator[c]:.3g} on channel {c} "
                         f"(variance {params[3][c]:.3g}, epsilon {eps:.3g}); it must be positive", j)
        w, b = fold_batchnorm(w, b, *params, eps=eps)
    return node.input[0], w, b


def _match_pool(g: _Graph, layer: arch.Pool, value: str) -> tuple[str, int, int | None]:
    """Returns the pool's input value, its node index, and count_include_pad for average pools."""
    op = "MaxPool" if layer.kind == "max" else "AveragePool"
    i, node = g.producing(value, f"{layer.name} ({op})", (op,))
    at = _attrs(node)
    if int(at.get("ceil_mode", 0)):
        raise g.fail(f"{layer.name}: ceil_mode=1 is not supported (expected 0)", i)
    k = (layer.kernel, layer.kernel)
    if tuple(_ints(at, "kernel_shape", [])) != k:
        raise g.fail(f"{layer.name} expects a {k[0]}x{k[1]} window, found kernel_shape "
                     f"{_ints(at, 'kernel_shape', [])}", i)
    _check_window(g, i, layer.name, at, k, layer.stride, (layer.pad, layer.pad))
    cip = int(at.get("count_include_pad", 0)) if op == "AveragePool" else None  # ONNX default is 0
    return node.input[0], i, cip


def _concat_inputs(g: _Graph, value: str, what: str) -> list[str]:
    """Inputs of a channel Concat, nested channel Concats flattened (same channel order)."""
    i, node = g.producing(value, f"{what} (channel Concat)", ("Concat",))
    if _attrs(node).get("axis") not in (1, -3):
        raise g.fail(f"{what} expects a concatenation over channels (axis 1), found axis {_attrs(node).get('axis')}",
                     i)
    out = []
    for v in node.input:
        p = g.producer.get(g.real(v))
        inner = g.nodes[p] if p is not None else None
        if inner is not None and inner.op_type == "Concat" and _attrs(inner).get("axis") in (1, -3):
            out += _concat_inputs(g, v, what)
        else:
            out.append(v)
    return out


def _match_global_pool(g: _Graph, layer: arch.GlobalAvgPool, value: str) -> str:
    i, node = g.producing(value, f"{layer.name} (global average pool)",
                          ("GlobalAveragePool", "ReduceMean", "AveragePool"))
    at = _attrs(node)
    if node.op_type == "ReduceMean":
        args = [g.const(v) if v else None for v in node.input]
        axes = _axes(node, args, 4)
        if axes != [2, 3]:
            raise g.fail(f"{layer.name} expects a mean over the spatial axes [2, 3], found axes {axes}", i)
    elif node.op_type == "AveragePool":  # adaptive pooling exported as a fixed 8x8 window
        _check_window(g, i, layer.name, at, (8, 8), _ints(at, "strides", [1, 1])[0], (0, 0))
    return node.input[0]


def _match_fc(g: _Graph, layer: arch.FC, value: str) -> tuple[str, np.ndarray, np.ndarray]:
    """Gemm, or MatMul [+ Add], after optional Flatten/Reshape/Squeeze: returns the pooled features' value."""
    what = f"{layer.name} (classifier)"
    i, node = g.producing(value, what, ("Gemm", "Add", "MatMul"))
    bias = None
    if node.op_type == "Gemm":
        at = _attrs(node)
        if int(at.get("transA", 0)):
            raise g.fail(f"{what}: Gemm with transA=1 is not supported", i)
        w = g.weight(node.input[1], f"{layer.name} weight", i) * float(at.get("alpha", 1.0))
        w = w if int(at.get("transB", 0)) else w.T
        if len(node.input) > 2 and node.input[2]:
            bias = g.weight(node.input[2], f"{layer.name} bias", i) * float(at.get("beta", 1.0))
        src = node.input[0]
    else:
        if node.op_type == "Add":
            consts = [k for k, v in enumerate(node.input) if g.const(v) is not None]
            if len(consts) != 1:
                raise g.fail(f"{what} expects MatMul + constant bias", i)
            bias = g.weight(node.input[consts[0]], f"{layer.name} bias", i)
            i, node = g.producing(node.input[1 - consts[0]], what, ("MatMul",))
        w = g.weight(node.input[1], f"{layer.name} weight", i).T
        src = node.input[0]
    if w.shape != (layer.out_features, layer.in_features):
        raise g.fail(f"{what} expects a weight of {layer.out_features} classes x {layer.in_features} features, "
                     f"found {w.shape[0]} x {w.shape[1] if w.ndim > 1 else '?'}", i)
    bias = np.zeros(layer.out_features) if bias is None else bias.reshape(-1)
    if bias.shape != (layer.out_features,):
        raise g.fail(f"{what} expects a bias of {layer.out_features}, found {bias.size} values", i)
    # Flatten the pooled (N, C, 1, 1) features: Flatten(axis 1), Reshape to (N, C) or Squeeze of axes 2 and 3.
    while True:
        p = g.producer.get(g.real(src))
        node = g.nodes[p] if p is not None else None
        if node is None or node.op_type not in SHAPE_OPS:
            return src, w, bias
        at = _attrs(node)
        args = [g.const(v) if v else None for v in node.input]
        if node.op_type == "Flatten" and at.get("axis", 1) != 1:
            raise g.fail(f"{what}: Flatten(axis={at['axis']}) before the classifier (expected axis 1)", p)
        if node.op_type == "Reshape" and args[1] is not None:
            # A shape computed at run time (x.view(x.size(0), -1)) is accepted: feeding a Gemm of 2048 input
            # features, (N, 2048) is the only shape a valid model can reshape (N, 2048, 1, 1) to.
            shape = [int(d) for d in args[1].reshape(-1)]
            if len(shape) != 2 or not (shape[1] == layer.in_features or (shape[1] == -1 and shape[0] != -1)):
                raise g.fail(f"{what}: Reshape to {shape} before the classifier (expected [N, "
                             f"{layer.in_features}])", p)
        if node.op_type == "Squeeze" and _axes(node, args, 4) != [2, 3]:
            raise g.fail(f"{what}: Squeeze of axes {_axes(node, args, 4)} before the classifier "
                         f"(expected [2, 3])", p)
        src = node.input[0]


@dataclass
class _Match:
    arrays: dict[str, np.ndarray]  # float64, canonical keys
    input_value: str  # the ONNX value Conv2d_1a_3x3 reads
    tensors: dict[str, str]  # canonical tensor -> ONNX value
    count_include_pad: bool
    softmax: bool


def _match_network(g: _Graph, output: str) -> _Match:
    layers = arch.inception_v3()
    bound: dict[str, tuple[str, str]] = {}  # canonical tensor -> (ONNX value, the layer that read it first)
    owner: dict[str, str] = {}  # ONNX value -> canonical tensor

    def bind(tensor: str, value: str, reader: str) -> None:
        v = g.real(value)
        if tensor in bound:
            if bound[tensor][0] != v:
                raise g.fail(f"{reader} and {bound[tensor][1]} should both read {tensor}, but read different "
                             f"tensors ('{v}' and '{bound[tensor][0]}')")
            return
        if v in owner:
            raise g.fail(f"tensor '{v}' would be both {owner[v]} and {tensor} (read by {reader})")
        bound[tensor], owner[v] = (v, reader), tensor

    softmax = False
    p = g.producer.get(g.real(output))
    if p is not None and g.nodes[p].op_type == "Softmax":
        axis = _attrs(g.nodes[p]).get("axis", 1)
        if axis not in (1, -1):
            raise g.fail(f"Softmax over axis {axis} after the classifier (expected the class axis 1)", p)
        softmax, output = True, g.nodes[p].input[0]
    bind(layers[-1].name, output, "the graph output")

    arrays: dict[str, np.ndarray] = {}
    cips: list[tuple[int, int]] = []  # (node, count_include_pad) of every average pool
    for layer in reversed(layers):
        value = bound[layer.name][0]
        if isinstance(layer, arch.FC):
            src, w, b = _match_fc(g, layer, value)
            arrays[layer.name + ".weight"], arrays[layer.name + ".bias"] = w, b
            bind(layer.src, src, layer.name)
        elif isinstance(layer, arch.GlobalAvgPool):
            bind(layer.src, _match_global_pool(g, layer, value), layer.name)
        elif isinstance(layer, arch.Concat):
            srcs = _concat_inputs(g, value, layer.name)
            if len(srcs) != len(layer.srcs):
                raise g.fail(f"{layer.name} expects {len(layer.srcs)} concatenated branches, found {len(srcs)}",
                             g.producer[g.real(value)])
            for tensor, v in zip(layer.srcs, srcs):
                bind(tensor, v, layer.name)
        elif isinstance(layer, arch.Conv):
            src, w, b = _match_conv(g, layer, value)
            arrays[layer.name + ".weight"], arrays[layer.name + ".bias"] = w, b
            bind(layer.src, src, layer.name)
        elif isinstance(layer, arch.Pool):
            src, i, cip = _match_pool(g, layer, value)
            if cip is not None:
                cips.append((i, cip))
            bind(layer.src, src, layer.name)
    if len({c for _, c in cips}) > 1:
        i, c = next((i, c) for i, c in cips if c != cips[0][1])
        raise g.fail(f"count_include_pad={c} here but {cips[0][1]} on node {cips[0][0]}; all average pools must "
                     f"agree", i)
    return _Match(arrays, bound[arch.INPUT][0], {t: v for t, (v, _) in bound.items()},
                  bool(cips[0][1]) if cips else True, softmax)


# --- the input preprocessing ---------------------------------------------------------------------------------

def _input_affine(g: _Graph, value: str) -> tuple[np.ndarray, np.ndarray]:
    """The per-channel (scale, shift) the subgraph from the graph input to ``value`` applies, measured by
    evaluating it on probe images; refuses anything that is not such a map."""
    first = arch.conv_layers()[0].name
    needed: set[int] = set()
    todo = [g.real(value)]
    reaches_input = False
    while todo:
        v = todo.pop()
        if v == g.input_name:
            reaches_input = True
            continue
        if v in g.consts:
            continue
        i = g.producer[v]
        if i in needed:
            continue
        node = g.nodes[i]
        if node.op_type not in PREPROCESSING_OPS or node.domain not in ("", "ai.onnx"):
            raise g.fail(f"{node.op_type} between the graph input and {first}: only a per-channel scale and "
                         f"shift of the image is supported there", i)
        needed.add(i)
        todo += [g.real(n) for n in node.input if n]
    if not reaches_input:
        raise g.fail(f"{first} does not read the graph input")

    n = g.input_batch or 1
    if n > MAX_PROBE_BATCH:
        raise g.fail(f"a fixed batch of {n} with preprocessing in front of {first}; export with a dynamic batch "
                     f"(or one of at most {MAX_PROBE_BATCH})")
    shape = (n, 3, arch.INPUT_SIZE, arch.INPUT_SIZE)

    def run(x: np.ndarray) -> np.ndarray:
        env: dict[str, np.ndarray] = {g.input_name: x}
        for i in sorted(needed):
            node = g.nodes[i]
            args = [None if not a else env.get(g.real(a), g.const(a)) for a in node.input]
            try:
                outs = _evaluate(node, args)
            except Exception as e:  # shapes that do not fit an image batch
                raise g.fail(f"cannot evaluate the input preprocessing on a [{n}, 3, 299, 299] batch ({e})", i) \
                    from None
            env.update(zip(node.output, outs))
        y = np.asarray(env[g.real(value)], np.float64)
        if y.shape != shape:
            raise g.fail(f"the input preprocessing yields shape {list(y.shape)}, expected {list(shape)}")
        return y

    shift = run(np.zeros(shape))[0, :, 0, 0]
    scale = run(np.ones(shape))[0, :, 0, 0] - shift
    probe = np.random.default_rng(0).uniform(-3, 3, shape)
    expect = probe * scale.reshape(1, 3, 1, 1) + shift.reshape(1, 3, 1, 1)
    got = run(probe)
    if not (np.all(np.isfinite(got)) and np.allclose(got, expect, rtol=1e-5, atol=1e-5)) or np.any(scale == 0):
        raise g.fail(f"the preprocessing in front of {first} is not a per-channel scale and shift of the image")
    return scale, shift


# --- external data and the public API ------------------------------------------------------------------------

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


def _load_external_data(model: onnx.ModelProto, source: Path) -> bool:
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


def convert_model(model: onnx.ModelProto, source_path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """Canonical float32 arrays and the manifest for an Inception-V3 export. External data still referenced by
    ``model`` is read from ``source_path``'s folder (and filled into ``model``)."""
    source = Path(source_path)
    external = _load_external_data(model, source)
    if model.functions:  # module-level functions, as some dynamo exporter versions leave them: one flat graph
        try:
            from onnx import inliner  # onnx >= 1.15

            model = inliner.inline_local_functions(model)
        except Exception as e:  # the inliner's own error says what is wrong with the function
            raise ConversionError(f"{source}: cannot inline the model's local functions ({e})") from None
    g = _normalise(model, str(source))
    outputs = [o.name for o in model.graph.output]
    if not outputs:
        raise ConversionError(f"{source}: the model has no outputs")
    match, first_error = None, None
    for out in outputs:  # the logits are normally the first output; the aux classifier, if any, another
        try:
            match = _match_network(g, out)
            break
        except ConversionError as e:
            first_error = first_error or e
    if match is None:
        raise first_error
    aux = [o for o in outputs if o != out]
    for o in aux:
        _check_aux(g, o, match)

    arrays = match.arrays
    affine = None
    if match.input_value != g.input_name:
        scale, shift = _input_affine(g, match.input_value)
        first = arch.conv_layers()[0].name
        arrays[first + ".weight"], arrays[first + ".bias"] = fold_input_affine(
            arrays[first + ".weight"], arrays[first + ".bias"], scale, shift)
        affine = {"scale": [float(s) for s in scale], "shift": [float(t) for t in shift]}

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    inp = {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD), "size": arch.INPUT_SIZE, "resize": RESIZE,
           "transform_input": affine is not None}
    if affine is not None:
        inp["input_affine"] = affine
    manifest = {
        "source_sha256": sha256_file(source) if source.is_file() else None,
        "source_name": source.name,
        "opset": opset,
        "exporter": "dynamo" if external or (opset or 0) >= 18 else "torchscript",
        "input": inp,
        "count_include_pad": match.count_include_pad,
        "softmax_in_model": match.softmax,
        "aux_ignored": bool(aux),
    }
    _check_range(arrays, source)
    return {k: v.astype(np.float32) for k, v in arrays.items()}, manifest


def _check_range(arrays: dict[str, np.ndarray], source: Path) -> None:
    """Every folded value finite and representable in float32, the weight file's type."""
    for k, a in arrays.items():
        if not np.all(np.isfinite(a)):
            raise ConversionError(f"{source}: {k} comes out NaN or Inf after folding (a damaged parameter?); "
                                  f"export the model again")
        largest = float(np.max(np.abs(a)))
        if largest > FLOAT32_MAX:
            raise ConversionError(f"{source}: {k} holds values up to {largest:.3g}, beyond float32's range "
                                  f"({FLOAT32_MAX:.3g}); the weight file cannot hold them, export the model again")


def _check_aux(g: _Graph, output: str, match: _Match) -> None:
    """Another graph output is accepted only as the auxiliary classifier: it must read nothing of the main
    network but Mixed_6e's output (the branch itself is not checked further; it is dropped)."""
    known = {v: t for t, v in match.tensors.items()}
    reads: set[str] = set()
    todo, seen = [g.real(output)], set()
    while todo:
        v = todo.pop()
        if v in seen or v in g.consts:
            continue
        seen.add(v)
        if v in known:
            reads.add(known[v])
            continue
        if v == g.input_name:
            reads.add("the graph input")
            continue
        if v not in g.producer:
            raise g.fail(f"graph output '{output}' reads '{v}', which no node computes")
        todo += [g.real(n) for n in g.nodes[g.producer[v]].input if n]
    if reads != {"Mixed_6e"}:
        raise g.fail(f"graph output '{output}' is neither the logits nor the auxiliary classifier "
                     f"(it reads {', '.join(sorted(reads)) or 'only constants'})")


def convert(onnx_path: str | Path, out_path: str | Path | None = None, overwrite: bool = False) -> Path:
    """Converts an ONNX export of torchvision's Inception-V3 into the engine's weight file, written atomically to
    ``out_path`` (default: the user cache, where every run looks). An existing file is replaced only with
    overwrite=True; that is checked before converting, and again when the file is put in place."""
    out = default_weights_path() if out_path is None else Path(out_path)
    writable_target(out, overwrite)
    model = load_onnx(onnx_path)
    arrays, manifest = convert_model(model, onnx_path)
    return save_weights(out, arrays, manifest, overwrite=overwrite)
