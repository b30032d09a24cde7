"""ONNX -> engine weights: find torchvision's Inception-V3 in a torch.onnx export by its structure and pull out
the 94 convolutions (BatchNorm folded in) and the classifier as canonical arrays (see weights.py).

1. Load, external data checked tensor by tensor, and 2. normalise the graph (schemas, constants folded, aliases):
   onnx_read.py, which holds the checks against damaged and hostile models.
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

An already-quantized model (QuantizeLinear/DequantizeLinear pairs) is first stripped to its float graph, then matched
as above; its scales become the weight file's 8-bit calibration (onnx_qdq.py, which refuses what the scheme cannot
run exactly). The QOperator format is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from . import arch, onnx_qdq
from .errors import ConversionError
from .onnx_read import (PREPROCESSING_OPS, Graph, evaluate, load_external_data, load_onnx, node_attrs, node_axes,
                        normalise)
from .weights import (IMAGENET_MEAN, IMAGENET_STD, default_places, default_weights_path, save_weights, sha256_file,
                      writable_target)

RESIZE = 342  # torchvision's Inception_V3_Weights transforms: resize 342, centre crop 299
SHAPE_OPS = ("Flatten", "Reshape", "Squeeze")  # allowed between the global pool and the classifier
FLOAT32_MAX = float(np.finfo(np.float32).max)
SYNTHETIC_PRODUCER = "inception_engine.synthetic"  # synthetic.py's ONNX models' producer_name
MAX_PROBE_BATCH = 64  # a fixed batch the input preprocessing is evaluated at (probes stay within MAX_VALUES)



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


# --- matching the canonical layers ---------------------------------------------------------------------------

def _ints(at: dict[str, Any], key: str, default: list[int]) -> list[int]:
    return [int(v) for v in at.get(key, default)]


def _check_window(g: Graph, i: int, what: str, at: dict[str, Any], kernel: tuple[int, int], stride: int,
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


def _match_conv(g: Graph, layer: arch.Conv, value: str) -> tuple[str, np.ndarray, np.ndarray]:
    """Relu <- [BatchNormalization <-] Conv: returns the conv's input value and the folded weight and bias."""
    name = layer.name
    _, relu = g.producing(value, f"{name} (Conv + ReLU)", ("Relu",))
    i, node = g.producing(relu.input[0], f"{name} (Conv before its ReLU)", ("Conv", "BatchNormalization"))
    bn = None
    if node.op_type == "BatchNormalization":
        bn = (i, node)
        i, node = g.producing(node.input[0], f"{name} (Conv before its BatchNormalization)", ("Conv",))
    at = node_attrs(node)
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
        bat = node_attrs(bnode)
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


def _match_pool(g: Graph, layer: arch.Pool, value: str) -> tuple[str, int, int | None]:
    """Returns the pool's input value, its node index, and count_include_pad for average pools."""
    op = "MaxPool" if layer.kind == "max" else "AveragePool"
    i, node = g.producing(value, f"{layer.name} ({op})", (op,))
    at = node_attrs(node)
    if int(at.get("ceil_mode", 0)):
        raise g.fail(f"{layer.name}: ceil_mode=1 is not supported (expected 0)", i)
    k = (layer.kernel, layer.kernel)
    if tuple(_ints(at, "kernel_shape", [])) != k:
        raise g.fail(f"{layer.name} expects a {k[0]}x{k[1]} window, found kernel_shape "
                     f"{_ints(at, 'kernel_shape', [])}", i)
    _check_window(g, i, layer.name, at, k, layer.stride, (layer.pad, layer.pad))
    cip = int(at.get("count_include_pad", 0)) if op == "AveragePool" else None  # ONNX default is 0
    return node.input[0], i, cip


def _concat_inputs(g: Graph, value: str, what: str) -> list[str]:
    """Inputs of a channel Concat, nested channel Concats flattened (same channel order)."""
    i, node = g.producing(value, f"{what} (channel Concat)", ("Concat",))
    if node_attrs(node).get("axis") not in (1, -3):
        raise g.fail(f"{what} expects a concatenation over channels (axis 1), found axis "
                     f"{node_attrs(node).get('axis')}", i)
    out = []
    for v in node.input:
        p = g.producer.get(g.real(v))
        inner = g.nodes[p] if p is not None else None
        if inner is not None and inner.op_type == "Concat" and node_attrs(inner).get("axis") in (1, -3):
            out += _concat_inputs(g, v, what)
        else:
            out.append(v)
    return out


def _match_global_pool(g: Graph, layer: arch.GlobalAvgPool, value: str) -> str:
    i, node = g.producing(value, f"{layer.name} (global average pool)",
                          ("GlobalAveragePool", "ReduceMean", "AveragePool"))
    at = node_attrs(node)
    if node.op_type == "ReduceMean":
        args = [g.const(v) if v else None for v in node.input]
        axes = node_axes(node, args, 4)
        if axes != [2, 3]:
            raise g.fail(f"{layer.name} expects a mean over the spatial axes [2, 3], found axes {axes}", i)
    elif node.op_type == "AveragePool":  # adaptive pooling exported as a fixed 8x8 window
        _check_window(g, i, layer.name, at, (8, 8), _ints(at, "strides", [1, 1])[0], (0, 0))
    return node.input[0]


def _match_fc(g: Graph, layer: arch.FC, value: str) -> tuple[str, np.ndarray, np.ndarray]:
    """Gemm, or MatMul [+ Add], after optional Flatten/Reshape/Squeeze: returns the pooled features' value."""
    what = f"{layer.name} (classifier)"
    i, node = g.producing(value, what, ("Gemm", "Add", "MatMul"))
    bias = None
    if node.op_type == "Gemm":
        at = node_attrs(node)
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
        raise OtherClassifier(g.fail(f"{what} expects a weight of {layer.out_features} classes x "
                                     f"{layer.in_features} features, found {w.shape[0]} x "
                                     f"{w.shape[1] if w.ndim > 1 else '?'}", i))
    bias = np.zeros(layer.out_features) if bias is None else bias.reshape(-1)
    if bias.shape != (layer.out_features,):
        raise g.fail(f"{what} expects a bias of {layer.out_features}, found {bias.size} values", i)
    # Flatten the pooled (N, C, 1, 1) features: Flatten(axis 1), Reshape to (N, C) or Squeeze of axes 2 and 3.
    while True:
        p = g.producer.get(g.real(src))
        node = g.nodes[p] if p is not None else None
        if node is None or node.op_type not in SHAPE_OPS:
            return src, w, bias
        at = node_attrs(node)
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
        if node.op_type == "Squeeze" and node_axes(node, args, 4) != [2, 3]:
            raise g.fail(f"{what}: Squeeze of axes {node_axes(node, args, 4)} before the classifier "
                         f"(expected [2, 3])", p)
        src = node.input[0]


class OtherClassifier(ConversionError):
    """The classifier has another shape than the network being matched has: another network may match."""


@dataclass
class _Match:
    arrays: dict[str, np.ndarray]  # float64, canonical keys
    input_value: str  # the ONNX value Conv2d_1a_3x3 reads
    tensors: dict[str, str]  # canonical tensor -> ONNX value
    count_include_pad: bool
    softmax: bool


def _match_network(g: Graph, output: str, network: str = "torchvision") -> _Match:
    layers = arch.inception_v3(network=network)
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
        axis = node_attrs(g.nodes[p]).get("axis", 1)
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
    if network == "fid" and cips and cips[0][1]:
        raise g.fail("the FID network's average pools exclude padding (count_include_pad=0), as pytorch-fid's "
                     "FIDInception blocks; these include it", cips[0][0])
    return _Match(arrays, bound[arch.INPUT][0], {t: v for t, (v, _) in bound.items()},
                  bool(cips[0][1]) if cips else True, softmax)


# --- the input preprocessing ---------------------------------------------------------------------------------

def _input_affine(g: Graph, value: str) -> tuple[np.ndarray, np.ndarray]:
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
                outs = evaluate(node, args)
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


# --- the public API ----------------------------------------------------------------------------------------------


def convert_model(model: onnx.ModelProto, source_path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """Canonical float32 arrays and the manifest for an Inception-V3 export. External data still referenced by
    ``model`` is read from ``source_path``'s folder (and filled into ``model``)."""
    source = Path(source_path)
    external = load_external_data(model, source)
    if model.functions:  # module-level functions, as some dynamo exporter versions leave them: one flat graph
        try:
            from onnx import inliner  # onnx >= 1.15

            model = inliner.inline_local_functions(model)
        except Exception as e:  # the inliner's own error says what is wrong with the function
            raise ConversionError(f"{source}: cannot inline the model's local functions ({e})") from None
    qdq = None  # an already-quantized model: its float graph, matched as any other, and its scales (onnx_qdq.py)
    onnx_qdq.refuse_qoperator(model, str(source))
    if any(n.op_type in onnx_qdq.QDQ_OPS for n in model.graph.node):
        model, qdq = onnx_qdq.strip(model, str(source))
    g = normalise(model, str(source))
    outputs = [o.name for o in model.graph.output]
    if not outputs:
        raise ConversionError(f"{source}: the model has no outputs")
    match, first_error, network = None, None, "torchvision"
    # the logits are normally the first output; the aux classifier, if any, another. torchvision's classifier
    # first, then the FID network (pytorch-fid's: told apart by its 1008 classes and Mixed_7c's max pool)
    for out, network in ((o, n) for o in outputs for n in arch.NETWORKS):
        try:
            match = _match_network(g, out, network)
            break
        except ConversionError as e:  # the first network's error, unless only its classifier's size was wrong
            if first_error is None or isinstance(first_error, OtherClassifier) and not isinstance(e, OtherClassifier):
                first_error = e
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

    calibration = None if qdq is None else onnx_qdq.calibration(
        g, qdq, arch.inception_v3(match.count_include_pad, network), match.tensors, affine is not None)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    inp = {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD), "size": arch.INPUT_SIZE, "resize": RESIZE,
           "transform_input": affine is not None}
    if network == "fid":  # pytorch-fid's input: [0, 1] pixels scaled to 2x - 1 = (x - 0.5) / 0.5, unless the export
        # holds that scaling itself (folded into Conv2d_1a_3x3 above: then the pixels go in as they are)
        inp.update(mean=[0.0] * 3 if affine else [0.5] * 3, std=[1.0] * 3 if affine else [0.5] * 3,
                   resize=arch.INPUT_SIZE)
    if affine is not None:
        inp["input_affine"] = affine
    source_sha256 = sha256_file(source) if source.is_file() else None
    manifest = {
        "source_sha256": source_sha256,
        "source_name": source.name,
        "opset": opset,
        "exporter": "dynamo" if external or (opset or 0) >= 18 else "torchscript",
        "input": inp,
        "count_include_pad": match.count_include_pad,
        "network": network,
        "softmax_in_model": match.softmax,
        "aux_ignored": bool(aux),
        "provenance": {"kind": provenance_kind(model, network), "source_sha256": source_sha256,
                       "source_name": source.name,
                       "producer": f"{model.producer_name} {model.producer_version}".strip()[:200] or None,
                       "calibration": calibration},
    }
    _check_range(arrays, source)
    return {k: v.astype(np.float32) for k, v in arrays.items()}, manifest


def provenance_kind(model: onnx.ModelProto, network: str = "torchvision") -> str:
    """"synthetic" for synthetic.py's models (their producer); for a PyTorch export, the network its structure has
    just matched: "torchvision" (the classifier) or "fid" (pytorch-fid's FID Inception); "other" for any other
    producer."""
    if model.producer_name == SYNTHETIC_PRODUCER:
        return "synthetic"
    return network if model.producer_name == "pytorch" else "other"


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


def _check_aux(g: Graph, output: str, match: _Match) -> None:
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
    if provenance_kind(model) == "synthetic" and out.resolve() in default_places():
        raise ConversionError(f"{onnx_path} is the synthetic model (random weights); it is never written to {out}, "
                              f"where runs find the real weights: write it elsewhere with -o FILE.npz")
    arrays, manifest = convert_model(model, onnx_path)
    return save_weights(out, arrays, manifest, overwrite=overwrite)
