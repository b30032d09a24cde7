"""The ONNX converter on synthetic Inception-V3 exports: what it accepts, that the arrays are the generator's own
folded weights, that the converted network computes what onnxruntime computes on the ONNX file, and that every
other kind of file is refused with one clear line."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from inception_engine import arch, onnx_convert, onnx_read, synthetic
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.errors import ConversionError
from inception_engine.plan import build_plan
from inception_engine.model_files import load_weights
from inception_engine.weights import IMAGENET_MEAN, IMAGENET_STD, Weights, sha256_file

# (style, transform_input, softmax, aux, batch): each generated file is ~100 MB, so few, each covering several cases.
VARIANTS = {
    "torchscript": ("torchscript", False, False, False, None),
    "dynamo": ("dynamo", False, False, False, None),
    "torchscript+transform+softmax+aux+batch2": ("torchscript", True, True, True, 2),
    "dynamo+transform+aux+batch2": ("dynamo", True, False, True, 2),
}
FIRST = "Conv2d_1a_3x3"


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    return synthetic.synthetic_arrays(0)


def expected_affine() -> tuple[np.ndarray, np.ndarray]:
    """torchvision's transform_input constants, as float32 like in the exported graph."""
    scale = np.array([np.float32(s / 0.5) for s in IMAGENET_STD], np.float64)
    shift = np.array([np.float32((m - 0.5) / 0.5) for m in IMAGENET_MEAN], np.float64)
    return scale, shift


def expected_arrays(reference: dict[str, np.ndarray], transform_input: bool) -> dict[str, np.ndarray]:
    if not transform_input:
        return reference
    scale, shift = expected_affine()
    w, b = reference[FIRST + ".weight"].astype(np.float64), reference[FIRST + ".bias"].astype(np.float64)
    out = dict(reference)
    out[FIRST + ".weight"] = w * scale.reshape(1, 3, 1, 1)  # computed here independently of the converter
    out[FIRST + ".bias"] = b + (w.sum(axis=(2, 3)) * shift).sum(axis=1)
    return out


def assert_arrays_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(arch.weight_shapes())
    for k, v in want.items():
        assert got[k].dtype == np.float32 and got[k].shape == v.shape, k
        np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_accepts_variant_and_arrays_are_the_generators(variant, synthetic_onnx, reference, tmp_path):
    style, transform, softmax, aux, batch = VARIANTS[variant]
    path = synthetic_onnx(style, transform, softmax, aux, batch)
    out = onnx_convert.convert(path, tmp_path / "w.npz")
    w = load_weights(out)
    assert_arrays_equal(w.arrays, expected_arrays(reference, transform))
    m = w.manifest
    assert m["source_sha256"] == sha256_file(path) and m["source_name"] == path.name
    assert m["opset"] == (18 if style == "dynamo" else 17) and m["exporter"] == style
    assert m["count_include_pad"] is True
    assert m["softmax_in_model"] is softmax and m["aux_ignored"] is aux
    assert m["input"]["transform_input"] is transform
    assert m["input"]["mean"] == list(IMAGENET_MEAN) and m["input"]["std"] == list(IMAGENET_STD)
    assert m["input"]["size"] == 299 and m["input"]["resize"] == 342
    if transform:
        scale, shift = expected_affine()
        np.testing.assert_allclose(m["input"]["input_affine"]["scale"], scale, rtol=1e-12)
        np.testing.assert_allclose(m["input"]["input_affine"]["shift"], shift, rtol=1e-12)
    else:
        assert "input_affine" not in m["input"]


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_full_network_matches_onnxruntime(variant, synthetic_onnx):
    ort = pytest.importorskip("onnxruntime")
    style, transform, softmax, aux, batch = VARIANTS[variant]
    path = synthetic_onnx(style, transform, softmax, aux, batch)
    x = synthetic.image_like_batch(2, seed=11)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x})[0].astype(np.float64)

    arrays, manifest = onnx_convert.convert_model(onnx_read.load_onnx(path), path)
    weights = Weights(arrays, manifest)
    got = NumpyBackend(weights, build_plan(2, weights.layers()), np.float64).forward(x.astype(np.float64))
    if softmax:  # the file ends in Softmax; the engine's weights give logits
        got = np.exp(got - got.max(axis=1, keepdims=True))
        got /= got.sum(axis=1, keepdims=True)
    err = rel_l2(got, want)
    print(f"{variant}: relative L2 error numpy float64 vs onnxruntime = {err:.2e}")
    assert err <= 1e-4
    np.testing.assert_array_equal(np.argsort(-got, axis=1)[:, :5], np.argsort(-want, axis=1)[:, :5])


def test_synthetic_weights_file_fixture(synthetic_weights_file, reference):
    w = load_weights(synthetic_weights_file)
    assert_arrays_equal(w.arrays, reference)
    assert w.manifest["exporter"] == "torchscript"


# --- edits of the in-memory model ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ts_model(synthetic_onnx) -> onnx.ModelProto:
    return onnx.load(str(synthetic_onnx("torchscript")))


@pytest.fixture
def model(ts_model) -> onnx.ModelProto:
    """A fresh copy of the torchscript-style model to edit."""
    m = onnx.ModelProto()
    m.CopyFrom(ts_model)
    return m


def convert(model: onnx.ModelProto, tmp_path) -> tuple[dict[str, np.ndarray], dict]:
    return onnx_convert.convert_model(model, tmp_path / "edited.onnx")


def refused(model: onnx.ModelProto, tmp_path, *parts: str) -> str:
    with pytest.raises(ConversionError) as e:
        convert(model, tmp_path)
    msg = str(e.value)
    assert "\n" not in msg
    for p in parts:
        assert p in msg, msg
    return msg


def inits(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def convs(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Conv nodes in graph order, which for these files is arch.conv_layers() order."""
    return [n for n in model.graph.node if n.op_type == "Conv"]


def conv_named(model: onnx.ModelProto, layer: str) -> onnx.NodeProto:
    names = [c.name for c in arch.conv_layers()]
    return convs(model)[names.index(layer)]


def set_attr(node: onnx.NodeProto, name: str, value) -> None:
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))


def consumers(model: onnx.ModelProto, value: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if value in n.input]


def test_names_do_not_matter(model, tmp_path, reference):
    """Every tensor and node renamed to a random string and initializers shuffled: same arrays."""
    rng = np.random.default_rng(3)
    names: dict[str, str] = {}

    def new(name: str) -> str:
        if name and name not in names:
            names[name] = "t" + rng.bytes(6).hex()
        return names.get(name, name)

    g = model.graph
    for n in g.node:
        n.name = "n" + rng.bytes(4).hex()
        n.input[:] = [new(v) for v in n.input]
        n.output[:] = [new(v) for v in n.output]
    for v in list(g.input) + list(g.output):
        v.name = new(v.name)
    order = rng.permutation(len(g.initializer))
    tensors = [g.initializer[i] for i in order]
    for t in tensors:
        t.name = new(t.name)
    copies = [onnx.TensorProto() for _ in tensors]
    for c, t in zip(copies, tensors):
        c.CopyFrom(t)
    del g.initializer[:]
    g.initializer.extend(copies)
    arrays, _ = convert(model, tmp_path)
    assert_arrays_equal(arrays, reference)


def test_gemm_as_matmul_plus_add_and_transb0(model, tmp_path, reference):
    g = model.graph
    gemm = next(n for n in g.node if n.op_type == "Gemm")
    w, b = inits(model)[gemm.input[1]], inits(model)[gemm.input[2]]
    wt = numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(w).T), "w_t")
    g.initializer.append(wt)
    # MatMul(x, W^T) + b, the bias first in the Add
    i = list(g.node).index(gemm)
    mm = helper.make_node("MatMul", [gemm.input[0], "w_t"], ["mm_out"])
    add = helper.make_node("Add", [b.name, "mm_out"], [gemm.output[0]])
    g.node.remove(gemm)
    g.node.insert(i, add)
    g.node.insert(i, mm)
    arrays, _ = convert(model, tmp_path)
    assert_arrays_equal(arrays, reference)
    # Gemm again, with transB=0 on the transposed weight
    g.node.remove(add)
    g.node.remove(mm)
    g.node.insert(i, helper.make_node("Gemm", [gemm.input[0], "w_t", b.name], [gemm.output[0]], transB=0))
    arrays, _ = convert(model, tmp_path)
    assert_arrays_equal(arrays, reference)


def test_weights_in_constant_nodes_and_reduce_mean_head(model, tmp_path, reference):
    g = model.graph
    # Two conv weights moved from initializers into Constant nodes.
    for conv in convs(model)[:2]:
        t = inits(model)[conv.input[1]]
        g.node.insert(0, helper.make_node("Constant", [], [t.name], value=t))
        g.initializer.remove(t)
    # GlobalAveragePool + Flatten replaced by ReduceMean(axes=[2, 3], keepdims=0) as an opset-17 attribute.
    gap = next(n for n in g.node if n.op_type == "GlobalAveragePool")
    flat = next(n for n in g.node if n.op_type == "Flatten")
    i = list(g.node).index(gap)
    g.node.remove(gap)
    g.node.remove(flat)
    g.node.insert(i, helper.make_node("ReduceMean", [gap.input[0]], [flat.output[0]], axes=[3, -2], keepdims=0))
    arrays, _ = convert(model, tmp_path)
    assert_arrays_equal(arrays, reference)


def test_head_reshaped_with_a_run_time_shape(model, tmp_path, reference):
    """x.view(x.size(0), -1) as older exports write it: Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    g = model.graph
    flat = next(n for n in g.node if n.op_type == "Flatten")
    i = list(g.node).index(flat)
    g.initializer.extend([numpy_helper.from_array(np.array(0, np.int64), "zero"),
                          numpy_helper.from_array(np.array([0], np.int64), "axis0"),
                          numpy_helper.from_array(np.array([-1], np.int64), "minus1")])
    g.node.remove(flat)
    for node in reversed([helper.make_node("Shape", [flat.input[0]], ["shape"]),
                          helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
                          helper.make_node("Unsqueeze", ["n", "axis0"], ["n1"]),
                          helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
                          helper.make_node("Reshape", [flat.input[0], "target"], [flat.output[0]])]):
        g.node.insert(i, node)
    arrays, _ = convert(model, tmp_path)
    assert_arrays_equal(arrays, reference)


def test_local_functions_are_inlined(model, tmp_path, reference):
    """Some dynamo exporter versions keep modules as local functions: Conv + Relu units called as functions."""
    g = model.graph
    fn = helper.make_function("pkg.test", "ConvRelu", ["x", "w", "b"], ["y"],
                              [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], strides=[1, 1]),
                               helper.make_node("Relu", ["c"], ["y"])],
                              [helper.make_opsetid("", 17)])
    model.functions.append(fn)
    model.opset_import.append(helper.make_opsetid("pkg.test", 1))
    conv = conv_named(model, "Conv2d_2a_3x3")  # 3x3, stride 1, no padding: the function's attributes
    relu = consumers(model, conv.output[0])[0]
    i = list(g.node).index(conv)
    g.node.remove(conv)
    g.node.remove(relu)
    g.node.insert(i, helper.make_node("ConvRelu", list(conv.input), [relu.output[0]], domain="pkg.test"))
    arrays, _ = convert(model, tmp_path)
    assert_arrays_equal(arrays, reference)


def test_preprocessing_as_broadcast_mul_add_is_folded(model, tmp_path, reference):
    """A per-channel scale/shift written differently from torchvision (one Mul and one Sub of (1,3,1,1)
    constants) is still recognised and folded."""
    g = model.graph
    x = g.input[0].name
    scale, shift = np.array([2.0, 0.5, -1.0]), np.array([0.1, -0.2, 0.3])
    g.initializer.extend([numpy_helper.from_array(scale.reshape(1, 3, 1, 1).astype(np.float32), "pre_s"),
                          numpy_helper.from_array((-shift).reshape(1, 3, 1, 1).astype(np.float32), "pre_t")])
    first = convs(model)[0]
    first.input[0] = "pre_out"
    g.node.insert(0, helper.make_node("Sub", ["pre_mul", "pre_t"], ["pre_out"]))
    g.node.insert(0, helper.make_node("Mul", [x, "pre_s"], ["pre_mul"]))
    arrays, manifest = convert(model, tmp_path)
    aff = manifest["input"]["input_affine"]
    np.testing.assert_allclose(aff["scale"], scale, rtol=1e-7)
    np.testing.assert_allclose(aff["shift"], shift, rtol=1e-7)
    w = reference[FIRST + ".weight"].astype(np.float64)
    np.testing.assert_allclose(arrays[FIRST + ".weight"], w * scale.reshape(1, 3, 1, 1), rtol=1e-6)
    want_bias = reference[FIRST + ".bias"] + (w.sum(axis=(2, 3)) * shift).sum(axis=1)
    np.testing.assert_allclose(arrays[FIRST + ".bias"], want_bias, rtol=1e-5, atol=1e-6)


def test_count_include_pad_comes_from_the_model(model, tmp_path):
    for n in model.graph.node:
        if n.op_type == "AveragePool":
            set_attr(n, "count_include_pad", 0)
    _, manifest = convert(model, tmp_path)
    assert manifest["count_include_pad"] is False
    pools = [n for n in model.graph.node if n.op_type == "AveragePool"]
    set_attr(pools[4], "count_include_pad", 1)
    refused(model, tmp_path, "count_include_pad=", "must agree")


# --- refusals --------------------------------------------------------------------------------------------------

def test_refuses_removed_node(model, tmp_path):
    relu = [n for n in model.graph.node if n.op_type == "Relu"][10]
    model.graph.node.remove(relu)
    refused(model, tmp_path, f"input '{relu.output[0]}' is not produced by any earlier node")


def test_refuses_missing_relu(model, tmp_path):
    relu = [n for n in model.graph.node if n.op_type == "Relu"][1]  # Conv2d_2a_3x3's
    for n in consumers(model, relu.output[0]):
        n.input[list(n.input).index(relu.output[0])] = relu.input[0]
    model.graph.node.remove(relu)
    refused(model, tmp_path, "Conv2d_2a_3x3 (Conv + ReLU) expects Relu, found Conv")


def test_refuses_a_dequantize_of_what_no_quantize_made(model, tmp_path):
    """A DequantizeLinear of a run-time tensor must read a QuantizeLinear (QDQ pairs; test_onnx_qdq.py); a well-formed
    one (with its scale), so that the refusal is this one and not its schema's."""
    node = next(n for n in model.graph.node if n.op_type == "Relu")
    node.op_type = "DequantizeLinear"
    node.input.append("dq_scale")
    model.graph.initializer.append(numpy_helper.from_array(np.array(0.05, np.float32), "dq_scale"))
    refused(model, tmp_path, "(DequantizeLinear", "which is neither a constant nor a QuantizeLinear's output")


def test_refuses_other_activation(model, tmp_path):
    relu = conv_named(model, "Mixed_6c.branch7x7dbl_3")
    act = next(n for n in model.graph.node if n.op_type == "Relu" and n.input[0] == relu.output[0])
    act.op_type = "LeakyRelu"
    refused(model, tmp_path, "Mixed_6c.branch7x7dbl_3 (Conv + ReLU) expects Relu, found LeakyRelu")


def test_refuses_changed_channel_count(model, tmp_path):
    conv = conv_named(model, "Mixed_5b.branch5x5_2")
    t = inits(model)[conv.input[1]]
    t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t)[:, :32].copy(), t.name))
    msg = refused(model, tmp_path, "Mixed_5b.branch5x5_2 expects 48 input channels, found 32")
    assert msg.split(": ")[1].startswith("not an Inception-V3 export") and "(Conv)" in msg


def test_refuses_swapped_concat_branches(model, tmp_path):
    """Mixed_7b's 1x3 and 3x1 branches have equal shapes: only the Concat order tells them apart."""
    cat = [n for n in model.graph.node if n.op_type == "Concat"][-2]
    ins = list(cat.input)
    ins[1], ins[2] = ins[2], ins[1]
    cat.input[:] = ins
    refused(model, tmp_path, "Mixed_7b.branch3x3_2b expects a 3x1 kernel, found 1x3")


@pytest.mark.parametrize("attr,value,message", [
    ("group", 2, "group=2 is not supported"),
    ("dilations", [2, 2], "dilations [2, 2] are not supported"),
    ("dilations", [1], "dilations [1] are not supported"),
    ("auto_pad", "SAME_UPPER", "auto_pad=SAME_UPPER is not supported"),
    ("strides", [2, 2], "Mixed_6b.branch7x7_2 expects stride 1, found strides [2, 2]"),
    ("pads", [0, 2, 0, 2], "Mixed_6b.branch7x7_2 expects padding 0x3, found pads [0, 2, 0, 2]"),
])
def test_refuses_conv_attributes(model, tmp_path, attr, value, message):
    set_attr(conv_named(model, "Mixed_6b.branch7x7_2"), attr, value)
    refused(model, tmp_path, message, "(Conv)")


def test_refuses_ceil_mode(model, tmp_path):
    set_attr(next(n for n in model.graph.node if n.op_type == "MaxPool"), "ceil_mode", 1)
    refused(model, tmp_path, "maxpool1: ceil_mode=1 is not supported")


def test_refuses_other_input_size(model, tmp_path):
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 224
    refused(model, tmp_path, "has shape [N, 3, 224, 299]", "[N, 3, 299, 299]")


def test_refuses_nan_weights(model, tmp_path):
    t = inits(model)[conv_named(model, "Mixed_6e.branch_pool").input[1]]
    a = numpy_helper.to_array(t).copy()
    a[0, 0, 0, 0] = np.nan
    t.CopyFrom(numpy_helper.from_array(a, t.name))
    refused(model, tmp_path, "Mixed_6e.branch_pool weight contains NaN")


def test_refuses_channel_mixing_preprocessing(model, tmp_path):
    """A channel swap in front of the first conv is not a per-channel scale and shift."""
    g = model.graph
    g.initializer.append(numpy_helper.from_array(np.array([2, 1, 0], np.int64), "bgr"))
    g.node.insert(0, helper.make_node("Gather", [g.input[0].name, "bgr"], ["swapped"], axis=1))
    convs(model)[0].input[0] = "swapped"
    refused(model, tmp_path, "not a per-channel scale and shift")


def test_refuses_nonlinear_preprocessing(model, tmp_path):
    g = model.graph
    g.node.insert(0, helper.make_node("Relu", [g.input[0].name], ["clipped"]))
    convs(model)[0].input[0] = "clipped"
    refused(model, tmp_path, "Relu between the graph input and Conv2d_1a_3x3")


def test_refuses_unknown_extra_output(model, tmp_path):
    """A second output that is not the aux classifier (here: a pooled Mixed_5b) is not silently dropped."""
    g = model.graph
    mixed_5b = [n for n in g.node if n.op_type == "Concat"][0].output[0]
    g.node.append(helper.make_node("GlobalAveragePool", [mixed_5b], ["extra"]))
    g.output.append(helper.make_tensor_value_info("extra", onnx.TensorProto.FLOAT, None))
    refused(model, tmp_path, "graph output 'extra' is neither the logits nor the auxiliary classifier", "Mixed_5b")


def test_refuses_other_network(tmp_path):
    """A small classifier with the right input: found out at the head."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"], axis=1),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    tensors = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
               for n, s in (("w", (8, 3, 3, 3)), ("b", (8,)), ("fw", (10, 8)), ("fb", (10,)))]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", 1, ["N", 3, 299, 299])],
                              [helper.make_tensor_value_info("y", 1, ["N", 10])], initializer=tensors)
    path = tmp_path / "small.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(ConversionError) as e:
        onnx_convert.convert(path, tmp_path / "w.npz")
    assert "fc (classifier) expects a weight of 1000 classes x 2048 features, found 10 x 8" in str(e.value)
    assert str(path) in str(e.value) and not (tmp_path / "w.npz").exists()


# --- damaged files ---------------------------------------------------------------------------------------------

def convert_refused(path, tmp_path, *parts: str) -> str:
    with pytest.raises(ConversionError) as e:
        onnx_convert.convert(path, tmp_path / "w.npz")
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    for p in parts:
        assert p in msg, msg
    assert not (tmp_path / "w.npz").exists()
    return msg


def test_refuses_truncated_file(synthetic_onnx, tmp_path):
    data = synthetic_onnx().read_bytes()
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(data[:len(data) // 2])
    convert_refused(bad, tmp_path, "not a readable ONNX file", "truncated or corrupt")


def test_refuses_corrupt_bytes(synthetic_onnx, tmp_path):
    data = bytearray(synthetic_onnx().read_bytes())
    data[:64] = b"\xff" * 64
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(bytes(data))
    convert_refused(bad, tmp_path, "truncated or corrupt")


def test_refuses_missing_and_short_external_data(synthetic_onnx, tmp_path):
    src = synthetic_onnx("dynamo")
    model = tmp_path / src.name
    shutil.copy(src, model)
    data_name = src.name + ".data"
    convert_refused(model, tmp_path, f"external data file '{data_name}' is missing")
    data = src.with_name(data_name).read_bytes()
    (tmp_path / data_name).write_bytes(data[:len(data) - 1000])
    convert_refused(model, tmp_path, f"external data file '{data_name}' is too short")


def test_refuses_missing_file(tmp_path):
    convert_refused(tmp_path / "nope.onnx", tmp_path, "no such ONNX file")


# --- the FID network (pytorch-fid's FIDInception blocks) -----------------------------------------------------------

@pytest.fixture(scope="module")
def fid_model() -> onnx.ModelProto:
    return synthetic.synthetic_onnx_model(network="fid")


@pytest.mark.parametrize("style", ["torchscript", "dynamo"])
def test_fid_network_is_recognised_by_its_graph_and_matches_onnxruntime(style, tmp_path):
    """pytorch-fid's graph (1008 classes, average pools without padding, Mixed_7c's max pool): network "fid" in the
    manifest, input scaled to [-1, 1], and the engine's float64 forward what onnxruntime computes on the file."""
    ort = pytest.importorskip("onnxruntime")
    path = synthetic.write_synthetic_onnx(tmp_path / "fid.onnx", style=style, network="fid")
    arrays, manifest = onnx_convert.convert_model(onnx_read.load_onnx(path), path)
    assert manifest["network"] == "fid" and manifest["count_include_pad"] is False
    assert manifest["input"]["mean"] == [0.5] * 3 and manifest["input"]["std"] == [0.5] * 3
    assert manifest["provenance"]["kind"] == "synthetic" and arrays["fc.weight"].shape == (1008, 2048)
    x = np.random.default_rng(3).uniform(-1, 1, (2, 3, 299, 299)).astype(np.float32)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x})[0].astype(np.float64)
    weights = Weights(arrays, manifest)
    got = NumpyBackend(weights, build_plan(2, weights.layers()), np.float64).forward(x.astype(np.float64))
    assert rel_l2(got, want) <= 1e-4
    # read as torchvision's network, the same weights compute something else: the pools are what tells them apart
    tv = Weights({**arrays, "fc.weight": arrays["fc.weight"][:1000], "fc.bias": arrays["fc.bias"][:1000]}, {})
    other = NumpyBackend(tv, build_plan(2, tv.layers()), np.float64).forward(x.astype(np.float64))
    assert rel_l2(other, want[:, :1000]) > 1e-3


def test_fid_provenance_kind_of_a_pytorch_export(fid_model, model, tmp_path):
    fid_model = onnx.ModelProto.FromString(fid_model.SerializeToString())
    fid_model.producer_name, model.producer_name = "pytorch", "pytorch"
    assert convert(fid_model, tmp_path)[1]["provenance"]["kind"] == "fid"
    _, manifest = convert(model, tmp_path)
    assert manifest["provenance"]["kind"] == "torchvision" and manifest["network"] == "torchvision"


def test_fid_network_with_padding_counted_is_refused(fid_model, tmp_path):
    fid_model = onnx.ModelProto.FromString(fid_model.SerializeToString())
    for n in fid_model.graph.node:
        if n.op_type == "AveragePool":
            set_attr(n, "count_include_pad", 1)
    refused(fid_model, tmp_path, "exclude padding")


def test_a_1008_class_network_without_the_max_pool_is_refused(fid_model, tmp_path):
    """Mixed_7c's pool branch must be the max pool for 1008 classes (and the average pool for 1000)."""
    fid_model = onnx.ModelProto.FromString(fid_model.SerializeToString())
    for n in fid_model.graph.node:
        if n.op_type == "MaxPool" and [a.ints for a in n.attribute if a.name == "strides"][0] == [1, 1]:
            n.op_type = "AveragePool"
            set_attr(n, "count_include_pad", 0)
    refused(fid_model, tmp_path, "expects")
