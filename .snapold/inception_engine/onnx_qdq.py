"""An already-quantized ONNX (QuantizeLinear/DequantizeLinear pairs, "QDQ", as onnxruntime's ``quantize_static``
and NVIDIA's ModelOpt write them) read as its float graph plus the scales it quantizes with, which become the weight
file's calibration record (weights.CALIBRATION_KEYS, method "qdq:<producer>"), so that ``--precision int8`` runs
with exactly those scales (backends/int8_reference.py states the 8-bit scheme).

1. ``strip``: every Q/DQ node is checked against the scheme, symmetric int8: an int8 zero point of 0, one positive
   float scale per tensor, per output channel (axis 0) or per tensor for a weight. A QuantizeLinear of a run-time
   tensor and its DequantizeLinear(s) (the same scale) are removed and the tensor keeps its scale. A weight stored
   as int8 (onnxruntime) or int32 (a bias) and dequantized, or stored as float and quantized then dequantized
   (ModelOpt), becomes the float constant the file computes, (q - 0) * scale in float32, ONNX's arithmetic; its
   scales are kept. What remains is recognised exactly as a float export (onnx_convert.py).
2. ``calibration``: the scales mapped onto arch's tensors through the converter's match. A conv's output scale is
   its ReLU output's (a Q/DQ between the conv and its ReLU must have that same scale: rounding before or after a
   ReLU at one symmetric scale is the same, any other scale would be a second rounding the scheme does not have).
   Every tensor the 8-bit network stores must have its scale in the file, except that
   - a branch of a concat is stored at the concat's scale (the scheme's concat by offset): a branch the file leaves
     in float records the concat's scale; a branch the file quantizes at its own scale keeps it in the record, and
     the branch's values are written at the concat's scale directly: one rounding where the file has two (Q at the
     branch's scale, then at the concat's); it is the scheme's, as for ``--calibrate``, and differs from the file
     by at most one step of the concat's scale where the two roundings part, or where the branch's range clips;
   - a pool's output has its input's scale (the file's, if it gives one, must be the same, as onnxruntime makes it);
     a max pool the file leaves in float is exact at its input's scale, an average pool is refused;
   - the stem's first conv and the classifier run in float (int8_reference.DEFAULT_FLOAT_LAYERS): the file's
     Q/DQ there (the image, the stem's weights, the pooled features, the classifier's weights and logits) need not
     be there; the image's and the stem's weight scales are recorded where they apply (not after a folded input
     preprocessing, which rescales the stem's input channels), so that the stem can also run in 8 bits with them.
   Anything else (another scale, a Q/DQ on a value no tensor of the scheme is, a BatchNormalization after a
   quantized conv) is refused in one line naming the node and what to do; nothing is approximated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from . import arch
from .errors import ConversionError
from .onnx_read import Graph, check_schema, node_attrs

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# QOperator format: the quantized operators themselves, which onnxruntime's QuantFormat.QOperator writes
QOPERATOR_OPS = ("QLinearConv", "ConvInteger", "QLinearMatMul", "MatMulInteger", "QLinearAdd", "QLinearMul",
                 "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool", "QGemm", "QLinearSoftmax")
REQUANTIZE = ("quantize the float export again with onnxruntime.quantization.quantize_static(..., "
              "quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, "
              "per_channel=True, extra_options={\"ActivationSymmetric\": True})")
FP8_TYPES = {getattr(TensorProto, n) for n in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ",
                                               "FLOAT8E8M0") if hasattr(TensorProto, n)}
INT4_TYPES = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(TensorProto, n)}
QMAX = 127  # int8_reference.QMAX: symmetric int8 never holds -128


@dataclass
class WeightScale:
    scales: np.ndarray  # float32, one per index of ``axis`` (or one, per tensor)
    axis: int
    full_range: bool  # some value is -128, which symmetric int8 (+-127) cannot hold
    node: int


@dataclass
class Scales:
    """What ``strip`` found: float value -> (scale, node of its QuantizeLinear); dequantized weight -> its scales."""

    producer: str
    source: str
    nodes: list[onnx.NodeProto]  # the quantized graph's, which node indices in messages count
    activations: dict[str, tuple[float, int]] = field(default_factory=dict)
    weights: dict[str, WeightScale] = field(default_factory=dict)

    def fail(self, i: int, msg: str) -> ConversionError:
        return _fail(self.source, self.nodes, i, msg)


def _fail(source: str, nodes: Any, i: int, msg: str) -> ConversionError:
    n = nodes[i]
    name = f" '{n.name}'" if n.name else ""
    return ConversionError(f"{source}: node {i} ({n.op_type}{name}): {msg}")


def refuse_qoperator(model: onnx.ModelProto, source: str) -> None:
    """QOperator format (QLinearConv and kin) is refused by name: the scheme reads QDQ only."""
    for i, n in enumerate(model.graph.node):
        if n.op_type in QOPERATOR_OPS or (n.domain == "com.microsoft" and n.op_type in QDQ_OPS):
            what = ("onnxruntime's contrib QuantizeLinear/DequantizeLinear (16-bit or 4-bit QDQ)"
                    if n.op_type in QDQ_OPS else "QOperator format (quantized operators)")
            raise _fail(source, model.graph.node, i, f"{what} is not read; {REQUANTIZE}")


class _Reader:
    """Constants of the raw graph (initializers, Constant nodes, through Identity) and the checks of one Q/DQ."""

    def __init__(self, model: onnx.ModelProto, source: str):
        self.source, self.nodes = source, list(model.graph.node)
        self.protos: dict[str, TensorProto] = {t.name: t for t in model.graph.initializer}
        self.identity: dict[str, str] = {}
        for n in self.nodes:
            if (n.op_type == "Constant" and n.output and n.attribute
                    and n.attribute[0].type == onnx.AttributeProto.TENSOR):
                self.protos[n.output[0]] = n.attribute[0].t
            elif n.op_type == "Identity" and n.domain in ("", "ai.onnx") and n.input and n.output:
                self.identity[n.output[0]] = n.input[0]
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)

    def proto(self, name: str) -> TensorProto | None:
        while name in self.identity and name not in self.protos:
            name = self.identity[name]
        return self.protos.get(name)

    def array(self, name: str, i: int) -> np.ndarray:
        try:
            return numpy_helper.to_array(self.proto(name))
        except Exception as e:  # numpy_helper raises several types for malformed tensors
            raise self.fail(i, f"'{name}' is unreadable ({e}); the file is corrupt") from None

    def fail(self, i: int, msg: str) -> ConversionError:
        return _fail(self.source, self.nodes, i, msg)

    def qtype(self, i: int) -> int:
        """The integer type node i quantizes to or from (ONNX: the zero point's, else the input's or uint8)."""
        n = self.nodes[i]
        zp = self.proto(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        if zp is not None:
            return zp.data_type
        if n.op_type == "DequantizeLinear":
            x = self.proto(n.input[0])
            return x.data_type if x is not None else TensorProto.INT8  # its QuantizeLinear's, checked there
        return int(node_attrs(n).get("output_dtype", 0)) or TensorProto.UINT8

    def check(self, i: int, allowed: tuple[int, ...]) -> tuple[np.ndarray, int]:
        """Node i's scale (float32, 0-D or 1-D) and axis, after the scheme's checks (module doc)."""
        n = self.nodes[i]
        check_schema(lambda msg, j: self.fail(j, msg), i, n, self.opset)
        at = node_attrs(n)
        if int(at.get("block_size", 0)):
            raise self.fail(i, f"block-wise scales (block_size {at['block_size']}) are not supported: the 8-bit "
                               f"scheme has one scale per weight output channel; {REQUANTIZE}")
        t = self.qtype(i)
        if t not in allowed:
            raise self.fail(i, self._type_message(t))
        if len(n.input) > 2 and n.input[2]:
            zp = self.array(n.input[2], i)
            if np.any(zp != 0):
                raise self.fail(i, f"zero point {zp.reshape(-1)[np.argmax(zp.reshape(-1) != 0)]} (asymmetric "
                                   f"quantization); the 8-bit scheme is symmetric, zero point 0: {REQUANTIZE}")
        if self.proto(n.input[1]) is None:
            raise self.fail(i, "the scale is computed at run time, expected a constant")
        s = self.array(n.input[1], i)
        if len(n.input) > 2 and n.input[2] and self.array(n.input[2], i).shape != s.shape:
            raise self.fail(i, f"a zero point of shape {list(self.array(n.input[2], i).shape)} for a scale of shape "
                               f"{list(s.shape)} (onnxruntime refuses it; damaged file?)")
        if s.ndim > 1 or not np.issubdtype(s.dtype, np.floating):
            raise self.fail(i, f"a scale of shape {list(s.shape)} and type {s.dtype}: expected one float per tensor "
                               f"or per channel; {REQUANTIZE}")
        s32 = s.astype(np.float32)
        if not (np.all(np.isfinite(s32)) and np.all(s32 > 0)):
            raise self.fail(i, "a scale that is not a positive finite float32 (damaged file?)")
        return (s32.reshape(()) if s32.size == 1 else s32), int(at.get("axis", 1))

    @staticmethod
    def _type_message(t: int) -> str:
        name = TensorProto.DataType.Name(t) if t in TensorProto.DataType.values() else str(t)
        if t == TensorProto.UINT8:
            return (f"uint8 quantization (asymmetric, as onnxruntime's default QUInt8 activations), where the 8-bit "
                    f"scheme is symmetric int8; {REQUANTIZE}")
        if t in FP8_TYPES:
            return f"FP8 QDQ ({name}) is not supported, the 8-bit scheme is int8; {REQUANTIZE}"
        if t in INT4_TYPES:
            return f"4-bit QDQ ({name}) is not supported, the 8-bit scheme is int8; {REQUANTIZE}"
        return f"{name} quantization is not supported, the 8-bit scheme is int8; {REQUANTIZE}"


def _along(s: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A per-tensor or per-axis scale shaped to broadcast against a tensor of ``ndim`` dims."""
    if s.ndim == 0:
        return s
    shape = [1] * ndim
    shape[axis % ndim] = s.size
    return s.reshape(shape)


def _weight(r: _Reader, i: int, q: np.ndarray, s: np.ndarray, axis: int) -> tuple[np.ndarray, WeightScale]:
    """The float32 a DequantizeLinear of constant int8/int32 ``q`` computes, (q - 0) * scale, and its scales."""
    if s.ndim == 1 and not (q.ndim and -q.ndim <= axis < q.ndim and q.shape[axis] == s.size):
        raise r.fail(i, f"{s.size} scales along axis {axis} of a weight of shape {list(q.shape)}")
    w = q.astype(np.float32) * _along(s, axis, q.ndim)
    full = bool(q.dtype == np.int8 and q.size and q.min() < -QMAX)
    return w.astype(np.float32), WeightScale(s.reshape(-1), axis % max(q.ndim, 1), full, i)


def _consumers(nodes: list[onnx.NodeProto]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for v in n.input:
            out.setdefault(v, []).append(i)
    return out


def _pairs(r: _Reader, graph_outputs: set[str]) -> Iterator[tuple[int, list[int]]]:
    """Each QuantizeLinear with the DequantizeLinear nodes that read it (the only readers it may have)."""
    readers = _consumers(r.nodes)
    for i, n in enumerate(r.nodes):
        if n.op_type != "QuantizeLinear":
            continue
        dqs = readers.get(n.output[0], [])
        other = [j for j in dqs if r.nodes[j].op_type != "DequantizeLinear" or r.nodes[j].input[0] != n.output[0]]
        if other or n.output[0] in graph_outputs or not dqs:
            what = (f"node {other[0]} ({r.nodes[other[0]].op_type})" if other else
                    "a graph output" if n.output[0] in graph_outputs else "nothing")
            raise r.fail(i, f"its int8 output is read by {what}, not by a DequantizeLinear (QDQ pairs only); "
                            f"{REQUANTIZE}")
        yield i, dqs


def strip(model: onnx.ModelProto, source: str) -> tuple[onnx.ModelProto, Scales]:
    """The float graph of a QDQ model (module doc, 1) and the scales its Q/DQ nodes held."""
    refuse_qoperator(model, source)
    r = _Reader(model, source)
    for i, n in enumerate(r.nodes):  # inputs and outputs as the schema has them, before any is looked at
        if n.op_type in QDQ_OPS:
            check_schema(lambda msg, j: r.fail(j, msg), i, n, r.opset)
    scales = Scales(f"{model.producer_name} {model.producer_version}".strip()[:200] or "unknown", source, r.nodes)
    rename: dict[str, str] = {}  # DequantizeLinear output -> the float value it stands for
    folded: dict[str, np.ndarray] = {}  # DequantizeLinear output -> the float constant it computes
    done: set[int] = set()
    for i, dqs in _pairs(r, {o.name for o in model.graph.output}):
        s, axis = r.check(i, (TensorProto.INT8,))
        x = rename.get(r.nodes[i].input[0], r.nodes[i].input[0])  # a pair on a pair's output: the same tensor
        weight = r.proto(x)
        q = None
        if weight is not None:  # ModelOpt: a float weight, quantized with the given scale as ONNX does
            w = r.array(x, i).astype(np.float32)
            if not np.all(np.isfinite(w)):
                raise r.fail(i, f"the weight '{x}' contains NaN or Inf (corrupt file?)")
            if s.ndim == 1 and not (w.ndim and -w.ndim <= axis < w.ndim and w.shape[axis] == s.size):
                raise r.fail(i, f"{s.size} scales along axis {axis} of a weight of shape {list(w.shape)}")
            q = np.clip(np.rint(w / _along(s, axis, w.ndim)), -128, 127).astype(np.int8)
        elif s.ndim:
            raise r.fail(i, f"per-channel scales on the run-time tensor '{x}': the 8-bit scheme has one scale per "
                            f"activation tensor; {REQUANTIZE}")
        elif x in scales.activations and scales.activations[x][0] != float(s):
            j = scales.activations[x][1]
            raise r.fail(i, f"'{x}' is quantized at scale {float(s):.8g} here and {scales.activations[x][0]:.8g} by "
                            f"node {j}: the 8-bit scheme has one scale per tensor")
        else:
            scales.activations[x] = (float(s), i)
        for j in dqs:
            s2, axis2 = r.check(j, (TensorProto.INT8,))
            if s2.shape != s.shape or np.any(s2 != s) or (s.ndim and axis2 % max(q.ndim, 1) != axis % max(q.ndim, 1)):
                raise r.fail(j, f"it dequantizes with another scale than its QuantizeLinear (node {i}) quantized "
                                f"with; a QDQ pair has one scale")
            if q is None:
                rename[r.nodes[j].output[0]] = x
            else:
                folded[r.nodes[j].output[0]], scales.weights[r.nodes[j].output[0]] = _weight(r, i, q, s, axis)
            done.add(j)
        done.add(i)
    for j, n in enumerate(r.nodes):  # onnxruntime: int8 weights and int32 biases stored, dequantized at run time
        if n.op_type == "DequantizeLinear" and j not in done:
            if r.proto(n.input[0]) is None:
                raise r.fail(j, f"it dequantizes '{n.input[0]}', which is neither a constant nor a QuantizeLinear's "
                                f"output")
            s, axis = r.check(j, (TensorProto.INT8, TensorProto.INT32))
            folded[n.output[0]], ws = _weight(r, j, r.array(n.input[0], j), s, axis)
            if r.qtype(j) == TensorProto.INT8:
                scales.weights[n.output[0]] = ws
            done.add(j)
    return _rebuilt(model, done, rename, folded), scales


def _rebuilt(model: onnx.ModelProto, drop: set[int], rename: dict[str, str], folded: dict[str, np.ndarray]
             ) -> onnx.ModelProto:
    """``model`` without the nodes ``drop``, reads of ``rename``'s keys redirected, ``folded`` as initializers."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    nodes = [n for i, n in enumerate(g.node) if i not in drop]
    for n in nodes:
        for k, v in enumerate(n.input):
            n.input[k] = rename.get(v, v)
    del g.node[:]
    g.node.extend(nodes)
    for o in g.output:
        o.name = rename.get(o.name, o.name)
    g.initializer.extend(numpy_helper.from_array(a, name) for name, a in folded.items())
    return out


# --- the scales on arch's tensors --------------------------------------------------------------------------------

def _inner(g: Graph, value: str, op: str) -> list[str]:
    """Values inside a canonical tensor's producer: a conv's output before its ReLU (and before a BatchNorm),
    or a concat's nested Concats."""
    i = g.producer.get(g.real(value))
    if i is None or g.nodes[i].op_type != op:
        return []
    out = []
    for v in g.nodes[i].input[:1] if op == "Relu" else g.nodes[i].input:
        v = g.real(v)
        j = g.producer.get(v)
        if op == "Relu":
            out.append(v)
            if j is not None and g.nodes[j].op_type == "BatchNormalization":
                out.append(g.real(g.nodes[j].input[0]))
        elif j is not None and g.nodes[j].op_type == "Concat":
            out += [v, *_inner(g, v, "Concat")]
    return out


def _ancestors(g: Graph, value: str) -> set[str]:
    seen: set[str] = set()
    todo = [g.real(value)]
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        i = g.producer.get(v)
        if i is not None:
            todo += [g.real(x) for x in g.nodes[i].input if x]
    return seen


def _through_identity(g: Graph, value: str) -> str:
    """``value`` before any Identity nodes (normalise folds an Identity of a constant into a new constant)."""
    ident = {n.output[0]: n.input[0] for n in g.nodes if n.op_type == "Identity" and n.input and n.output}
    while value in ident:
        value = ident[value]
    return value


def _conv_node(g: Graph, value: str) -> tuple[onnx.NodeProto, bool]:
    """The Conv node behind a conv tensor (Relu <- [BatchNormalization <-] Conv, as matched) and whether a
    BatchNormalization was folded into it."""
    relu = g.nodes[g.producer[g.real(value)]]
    node = g.nodes[g.producer[g.real(relu.input[0])]]
    if node.op_type == "BatchNormalization":
        return g.nodes[g.producer[g.real(node.input[0])]], True
    return node, False


def _named(g: Graph, node: onnx.NodeProto) -> str:
    return f"'{node.name}'" if node.name else f"computing '{node.output[0]}'"


@dataclass
class _Found:
    """The file's activation scales looked up on the float graph's values; ``used`` collects those mapped."""

    g: Graph
    scales: Scales
    at: dict[str, tuple[float, int]] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        for v, (s, i) in self.scales.activations.items():
            rv = self.g.real(v)
            if rv in self.at and self.at[rv][0] != s:
                raise self.scales.fail(i, f"'{v}' is quantized at scale {s:.8g} here and {self.at[rv][0]:.8g} by "
                                          f"node {self.at[rv][1]}: the 8-bit scheme has one scale per tensor")
            self.at[rv] = (s, i)

    def get(self, value: str) -> float | None:
        rv = self.g.real(value)
        if rv not in self.at:
            return None
        self.used.add(rv)
        return self.at[rv][0]

    def conv(self, name: str, value: str) -> float | None:
        """A conv's output scale: its ReLU output's, which a Q/DQ before the ReLU must equal (module doc)."""
        post = self.get(value)
        for v in _inner(self.g, value, "Relu"):
            pre = self.get(v)
            if pre is not None and post is not None and pre != post:
                raise self.scales.fail(self.at[self.g.real(v)][1], f"{name}'s conv output is quantized at "
                                       f"{pre:.8g} before its ReLU and at {post:.8g} after it; the 8-bit scheme "
                                       f"rounds once, after the ReLU, so the two scales must be equal")
            post = pre if post is None else post
        return post


def _activation_scales(found: _Found, layers: list[arch.Layer], tensors: dict[str, str], affine: bool
                       ) -> dict[str, float]:
    """The activation_scales record (module doc, 2)."""
    g, sc = found.g, found.scales
    concat_of = {s: l.name for l in layers if isinstance(l, arch.Concat) for s in l.srcs}
    own: dict[str, float | None] = {}
    for l in layers:
        v = tensors[l.name]
        if isinstance(l, arch.Conv):
            own[l.name] = found.conv(l.name, v)
        elif isinstance(l, arch.Pool | arch.Concat):
            own[l.name] = found.get(v)
            for inner in _inner(g, v, "Concat"):  # a nested concat: a branch's rounding, as a branch's own
                found.get(inner)
    act: dict[str, float] = {}
    image = found.get(tensors[arch.INPUT])
    if image is not None and not affine:
        act[arch.INPUT] = image
    missing = "the file leaves it in float, but the 8-bit network stores it in int8: quantize it too"
    for l in layers:  # concats first: their branches may take their scale
        if isinstance(l, arch.Concat):
            if own[l.name] is None:
                node = g.nodes[g.producer[g.real(tensors[l.name])]]
                raise ConversionError(f"{sc.source}: {l.name} (Concat {_named(g, node)}): {missing}")
            act[l.name] = own[l.name]
    for l in layers:
        if isinstance(l, arch.Conv):
            s = own[l.name] if own[l.name] is not None else act.get(concat_of.get(l.name, ""))
            if s is None:
                node, _ = _conv_node(g, tensors[l.name])
                raise ConversionError(f"{sc.source}: {l.name} (Conv {_named(g, node)}): {missing}")
            act[l.name] = s
        elif isinstance(l, arch.Pool):
            s_in = act[concat_of[l.src]] if l.src in concat_of else act[l.src]
            node = g.nodes[g.producer[g.real(tensors[l.name])]]
            if own[l.name] is not None and own[l.name] != s_in:
                raise sc.fail(found.at[g.real(tensors[l.name])][1], f"{l.name}'s output is quantized at "
                              f"{own[l.name]:.8g}, its input at {s_in:.8g}; the 8-bit scheme keeps a pool's input "
                              f"scale (onnxruntime does): quantize both at one scale")
            if own[l.name] is None and l.kind == "avg":
                raise ConversionError(f"{sc.source}: {l.name} (AveragePool {_named(g, node)}): the file leaves its "
                                      f"output in float; the 8-bit scheme rounds it at its input's scale: quantize it")
            act[l.name] = s_in
    return act


def _weight_scales(found: _Found, layers: list[arch.Layer], tensors: dict[str, str], affine: bool
                   ) -> dict[str, list[float]]:
    """The weight_scales record: every int8 conv's, per output channel (module doc, 2)."""
    g, sc = found.g, found.scales
    first = arch.conv_layers()[0].name
    out: dict[str, list[float]] = {}
    for l in layers:
        if not isinstance(l, arch.Conv):
            continue
        node, bn = _conv_node(g, tensors[l.name])
        w = sc.weights.get(_through_identity(g, node.input[1]))
        if l.name == first and (w is None or bn or affine):  # a float layer: its weights are what the file says
            continue
        if w is None:
            raise ConversionError(f"{sc.source}: {l.name} (Conv {_named(g, node)}): its weight is not quantized in "
                                  f"the file, but the 8-bit network runs it in int8: quantize every conv's weight")
        if bn:
            raise sc.fail(w.node, f"{l.name}'s quantized weight is followed by a BatchNormalization, which rescales "
                                  f"it off its int8 grid; fold BatchNorm into the convs before quantizing "
                                  f"(onnxruntime.quantization.shape_inference.quant_pre_process)")
        if w.full_range:
            raise sc.fail(w.node, f"{l.name}'s int8 weight holds -128, which symmetric int8 (+-127) cannot hold; "
                                  f"quantize weights symmetrically (onnxruntime: WeightSymmetric, the default)")
        if w.scales.size > 1 and (w.axis != 0 or w.scales.size != l.out_ch):
            raise sc.fail(w.node, f"{l.name}'s weight scales run along axis {w.axis}; the 8-bit scheme has one "
                                  f"per output channel (axis 0) or one per tensor")
        out[l.name] = [float(s) for s in np.broadcast_to(w.scales, (l.out_ch,))]
    return out


def calibration(g: Graph, scales: Scales, layers: list[arch.Layer], tensors: dict[str, str], affine: bool
                ) -> dict[str, Any]:
    """provenance.calibration (weights.CALIBRATION_KEYS) of a stripped QDQ model: ``g`` its normalised float graph,
    ``tensors`` the converter's match (arch tensor -> value), ``affine`` whether an input preprocessing was folded
    into the stem. Refuses (module doc) a Q/DQ the scheme cannot honour."""
    found = _Found(g, scales)
    ws = _weight_scales(found, layers, tensors, affine)  # first: a BatchNorm after a conv says why its scales part
    act = _activation_scales(found, layers, tensors, affine)
    pooled = next(l.src for l in layers if isinstance(l, arch.GlobalAvgPool))
    body = _ancestors(g, tensors[pooled]) - _ancestors(g, tensors[arch.INPUT])
    for rv, (s, i) in found.at.items():  # the head, the aux classifier and the preprocessing run in float
        if rv in body and rv not in found.used:
            raise scales.fail(i, f"'{rv}' is quantized (scale {s:.8g}), but it is no tensor the 8-bit network "
                                 f"stores (a conv, pool or concat output), so that rounding cannot be honoured")
    return {"method": f"qdq:{scales.producer}", "parameter": None, "images": None, "images_sha256": None,
            "activation_scales": act, "weight_scales": ws}
