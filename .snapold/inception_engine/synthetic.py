"""A deterministic stand-in for Inception-V3's trained weights, and ONNX files laid out like torch.onnx exports of
torchvision's model, for tests and for benchmarking where no real weights are at hand.

Random weights alone make activations explode or die over 94 layers, and make every image look alike. So the
weights are He-initialised convolutions whose BatchNorm statistics are *calibrated*: the network is run layer by
layer on a few image-like inputs and each BatchNorm gets the batch mean and variance of its convolution's output,
with random gamma/beta, which keeps every layer's activations O(1) and image-dependent. The classifier is centred
on the calibration images' pooled features and scaled so logits spread over a few units and the top-1 class
changes from image to image.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from . import arch
from .backends.numpy_primitives import conv2d_bias_relu, walk_layers
from .onnx_convert import SYNTHETIC_PRODUCER, fold_batchnorm
from .weights import IMAGENET_MEAN, IMAGENET_STD, Weights, atomic_write, default_file_mode

GENERATOR_VERSION = 1  # bump when the weights or the ONNX layout change (cache keys use it)
BN_EPS = 1e-3  # torchvision's BasicConv2d
FOLD_EPS = float(np.float32(BN_EPS))  # the value an ONNX epsilon attribute (float32) holds, so folds agree bit for bit
CALIBRATION_IMAGES = 4
LOGIT_STD = 1.0  # spread of the logits over classes and images

Forward = Callable[[arch.Layer, np.ndarray], np.ndarray]


def image_like_batch(n: int, seed: int = 0, size: int = arch.INPUT_SIZE) -> np.ndarray:
    """(n, 3, size, size) float32 of smooth random images (upsampled coarse noise, per-image brightness and colour,
    a little fine grain), normalised with the ImageNet mean and std like real preprocessed photos.

    Brightness, which moves a random network's deep features most, is drawn stratified (one value per n-th of its
    range, in random order), so that even a small batch covers dark and bright images."""
    rng = np.random.default_rng(seed)
    mean = np.array(IMAGENET_MEAN).reshape(3, 1, 1)
    std = np.array(IMAGENET_STD).reshape(3, 1, 1)
    brightness = -0.15 + 0.3 * (rng.permutation(n) + rng.uniform(size=n)) / n
    out = np.empty((n, 3, size, size), np.float32)
    for k in range(n):
        res = int(rng.integers(3, 17))
        coarse = rng.standard_normal((1, res, res)) + 0.5 * rng.standard_normal((3, res, res))  # luma + chroma
        up = _bilinear_matrix(res, size)
        img = (0.5 + brightness[k] + rng.uniform(-0.1, 0.1, (3, 1, 1))
               + 0.2 * np.einsum("pi,cij,qj->cpq", up, coarse, up) + 0.03 * rng.standard_normal((3, size, size)))
        out[k] = (np.clip(img, 0, 1) - mean) / std
    return out


def _bilinear_matrix(src: int, dst: int) -> np.ndarray:
    """(dst, src) matrix of bilinear interpolation weights, pixel centres aligned."""
    pos = np.clip((np.arange(dst) + 0.5) * src / dst - 0.5, 0, src - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, src - 1)
    m = np.zeros((dst, src))
    np.add.at(m, (np.arange(dst), lo), 1 - (pos - lo))
    np.add.at(m, (np.arange(dst), hi), pos - lo)
    return m


def walk(x: np.ndarray, conv: Forward, fc: Forward, count_include_pad: bool = True,
         network: str = "torchvision") -> np.ndarray:
    """Runs arch.inception_v3() (of ``network``) on ``x`` with ``conv(layer, input)`` and ``fc(layer, features)``
    supplied by the caller (pools and concats done here), freeing each activation after its last reader. Returns
    the logits."""
    return walk_layers(arch.inception_v3(count_include_pad, network), x, conv, fc)


def _round_stat(a: np.ndarray) -> np.ndarray:
    # Statistics are kept to float16 precision so that the last-bit differences of BLAS libraries between
    # machines do not change the generated weights.
    return a.astype(np.float16).astype(np.float32)


@functools.lru_cache(maxsize=2)
def _calibrated(seed: int, network: str = "torchvision") -> dict[str, np.ndarray]:
    rng = np.random.default_rng([GENERATOR_VERSION, seed])
    params: dict[str, np.ndarray] = {}

    def conv(layer: arch.Conv, x: np.ndarray) -> np.ndarray:
        o, c, (kh, kw) = layer.out_ch, layer.in_ch, layer.kernel
        w = (rng.standard_normal((o, c, kh, kw)) * np.sqrt(2.0 / (c * kh * kw))).astype(np.float32)
        z = conv2d_bias_relu(x, w, np.zeros(o, np.float32), layer.stride, layer.pad, relu=False)
        mean, var = _round_stat(z.mean(axis=(0, 2, 3))), _round_stat(z.var(axis=(0, 2, 3)) + 1e-4)
        gamma = rng.uniform(0.6, 1.4, o).astype(np.float32)
        beta = rng.uniform(-0.2, 0.6, o).astype(np.float32)  # mostly positive: most units stay alive
        p = layer.name + "."
        params[p + "conv.weight"], params[p + "bn.weight"], params[p + "bn.bias"] = w, gamma, beta
        params[p + "bn.running_mean"], params[p + "bn.running_var"] = mean, var
        s = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + FOLD_EPS)  # BN as scale and shift
        t = beta - mean * s
        return np.maximum(z * s.astype(np.float32).reshape(1, o, 1, 1) + t.astype(np.float32).reshape(1, o, 1, 1), 0)

    def fc(layer: arch.FC, f: np.ndarray) -> np.ndarray:
        w = rng.standard_normal((layer.out_features, layer.in_features)) / np.sqrt(layer.in_features)
        centre = f.mean(axis=0).astype(np.float64)
        w *= LOGIT_STD / ((f - centre) @ w.T).std()
        b = -w @ centre + rng.normal(0, 0.1 * LOGIT_STD, layer.out_features)
        params["fc.weight"], params["fc.bias"] = w.astype(np.float32), b.astype(np.float32)
        return f @ params["fc.weight"].T + params["fc.bias"]

    x = image_like_batch(CALIBRATION_IMAGES, seed=seed)
    if network == "fid":  # its input: [0, 1] pixels scaled to [-1, 1], from the same images
        x = ((x * np.array(IMAGENET_STD, np.float32).reshape(3, 1, 1) + np.array(IMAGENET_MEAN, np.float32)
              .reshape(3, 1, 1)) * 2 - 1).astype(np.float32)
    walk(x, conv, fc, network=network)
    for a in params.values():
        a.setflags(write=False)
    return params


def synthetic_bn_params(seed: int = 0, network: str = "torchvision") -> dict[str, np.ndarray]:
    """torchvision-style state dict (float32, read-only arrays): ``<conv>.conv.weight``, ``<conv>.bn.weight`` /
    ``.bn.bias`` / ``.bn.running_mean`` / ``.bn.running_var`` (eps BN_EPS) for the 94 convolutions, and
    ``fc.weight`` / ``fc.bias``. Calibrated once per process, seed and network (a few seconds)."""
    return dict(_calibrated(seed, network))


def synthetic_arrays(seed: int = 0, network: str = "torchvision") -> dict[str, np.ndarray]:
    """The canonical folded float32 arrays (``<conv>.weight`` / ``.bias``, ``fc.*``) of the synthetic model."""
    p = _calibrated(seed, network)
    arrays = {}
    for c in arch.conv_layers():
        n = c.name + "."
        w, b = fold_batchnorm(p[n + "conv.weight"], np.zeros(c.out_ch), p[n + "bn.weight"], p[n + "bn.bias"],
                              p[n + "bn.running_mean"], p[n + "bn.running_var"], FOLD_EPS)
        arrays[n + "weight"], arrays[n + "bias"] = w.astype(np.float32), b.astype(np.float32)
    arrays["fc.weight"], arrays["fc.bias"] = p["fc.weight"], p["fc.bias"]
    return arrays


def synthetic_weights(seed: int = 0, network: str = "torchvision") -> Weights:
    """The synthetic model as engine weights (manifest marks it ``synthetic``: its classes mean nothing)."""
    fid = network == "fid"  # pytorch-fid's input scaling (x - 0.5) / 0.5 and its 299x299 resize
    manifest = {
        "synthetic": True, "seed": seed, "generator_version": GENERATOR_VERSION,
        "source_sha256": None, "source_name": f"synthetic (seed {seed})", "opset": None, "exporter": "synthetic",
        "input": {"mean": [0.5] * 3 if fid else list(IMAGENET_MEAN), "std": [0.5] * 3 if fid else list(IMAGENET_STD),
                  "size": arch.INPUT_SIZE, "resize": arch.INPUT_SIZE if fid else 342, "transform_input": False},
        "count_include_pad": not fid, "network": network, "softmax_in_model": False, "aux_ignored": False,
        "provenance": {"kind": "synthetic", "source_sha256": None, "source_name": f"synthetic (seed {seed})",
                       "producer": f"{SYNTHETIC_PRODUCER} {GENERATOR_VERSION}", "calibration": None},
    }
    return Weights(synthetic_arrays(seed, network), manifest)


# --- ONNX files shaped like torch.onnx exports ---------------------------------------------------------------

class _Graph:
    """Nodes and initializers under opaque names (v<n>, p<n>): the converter must not need meaningful ones."""

    def __init__(self, style: str):
        self.style = style
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.count = 0

    def param(self, a: np.ndarray) -> str:
        name = f"p{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(a), name))
        return name

    def const(self, a: np.ndarray) -> str:
        """Small constants: Constant nodes in TorchScript exports, initializers in dynamo ones."""
        if self.style == "dynamo":
            return self.param(a)
        return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(a)))

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        self.count += 1
        out = f"v{self.count}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"n{self.count}", **attrs))
        return out

    def window(self, kernel: tuple[int, int], stride: int, pad: tuple[int, int]) -> dict:
        attrs = dict(kernel_shape=list(kernel), strides=[stride, stride], pads=[pad[0], pad[1], pad[0], pad[1]])
        if self.style == "dynamo":
            attrs["auto_pad"] = "NOTSET"
        return attrs

    def conv_unit(self, x: str, w: np.ndarray, gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray,
                  var: np.ndarray, stride: int, pad: tuple[int, int], share_bias: bool = False) -> str:
        """Conv -> BatchNorm -> ReLU: BN folded into the conv (TorchScript, bias through an Identity where the
        exporter deduplicates initializers) or a BatchNormalization node (dynamo)."""
        attrs = dict(dilations=[1, 1], group=1, **self.window(w.shape[2:], stride, pad))
        if self.style == "dynamo":
            y = self.op("Conv", [x, self.param(w)], **attrs)
            y = self.op("BatchNormalization", [y, self.param(gamma), self.param(beta), self.param(mean),
                                               self.param(var)], epsilon=BN_EPS, momentum=0.9)
        else:
            wf, bf = fold_batchnorm(w, np.zeros(w.shape[0]), gamma, beta, mean, var, FOLD_EPS)
            wp, bp = self.param(wf.astype(np.float32)), self.param(bf.astype(np.float32))
            y = self.op("Conv", [x, wp, self.op("Identity", [bp]) if share_bias else bp], **attrs)
        return self.op("Relu", [y])

    def pool(self, x: str, kind: str, kernel: int, stride: int, pad: int, count_include_pad: bool = True) -> str:
        attrs = dict(ceil_mode=0, **self.window((kernel, kernel), stride, (pad, pad)))
        if kind == "avg":
            return self.op("AveragePool", [x], count_include_pad=int(count_include_pad), **attrs)
        if self.style == "dynamo":
            attrs.update(dilations=[1, 1], storage_order=0)
        return self.op("MaxPool", [x], **attrs)

    def head(self, x: str, w: np.ndarray, b: np.ndarray, batch: int | None) -> str:
        """Global average pool, flatten, fully connected."""
        if self.style == "dynamo":
            x = self.op("ReduceMean", [x, self.param(np.array([-1, -2], np.int64))], keepdims=1,
                        noop_with_empty_axes=0)
            x = self.op("Reshape", [x, self.param(np.array([batch or -1, w.shape[1]], np.int64))], allowzero=1)
            return self.op("Gemm", [x, self.param(w), self.param(b)], alpha=1.0, beta=1.0, transA=0, transB=1)
        x = self.op("Flatten", [self.op("GlobalAveragePool", [x])], axis=1)
        return self.op("Gemm", [x, self.param(w), self.param(b)], alpha=1.0, beta=1.0, transB=1)


def _transform_input(g: _Graph, x: str) -> str:
    """torchvision's transform_input: channel c of an ImageNet-normalised image becomes x_c * std_c/0.5 +
    (mean_c - 0.5)/0.5, one Gather/Unsqueeze/Mul/Add chain per channel, then Concat."""
    chans = []
    for c in range(3):
        y = g.op("Gather", [x, g.const(np.array(c, np.int64))], axis=1)
        y = g.op("Unsqueeze", [y, g.const(np.array([1], np.int64))])
        y = g.op("Mul", [y, g.const(np.array(IMAGENET_STD[c] / 0.5, np.float32))])
        chans.append(g.op("Add", [y, g.const(np.array((IMAGENET_MEAN[c] - 0.5) / 0.5, np.float32))]))
    return g.op("Concat", chans, axis=1)


def _aux_classifier(g: _Graph, x: str, seed: int, batch: int | None) -> str:
    """torchvision's InceptionAux on Mixed_6e: avg pool 5/3, 1x1 conv 128, 5x5 conv 768, pool, fc. Its weights are
    plain random (the converter drops this branch)."""
    rng = np.random.default_rng([GENERATOR_VERSION, seed, 1])
    one, zero = np.ones, np.zeros
    y = g.op("AveragePool", [x], ceil_mode=0, count_include_pad=1, **g.window((5, 5), 3, (0, 0)))
    for cin, cout, k in ((768, 128, 1), (128, 768, 5)):
        w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)
        y = g.conv_unit(y, w, one(cout, np.float32), zero(cout, np.float32), zero(cout, np.float32),
                        one(cout, np.float32), 1, (0, 0))
    w = (rng.standard_normal((arch.NUM_CLASSES, 768)) / np.sqrt(768)).astype(np.float32)
    return g.head(y, w, np.zeros(arch.NUM_CLASSES, np.float32), batch)


def synthetic_onnx_model(style: str = "torchscript", transform_input: bool = False, softmax: bool = False,
                         aux: bool = False, batch: int | None = None, seed: int = 0,
                         network: str = "torchvision") -> onnx.ModelProto:
    """The synthetic model as an in-memory ONNX graph in the layout of torch.onnx's ``style`` exporter:

    torchscript: opset 17, BN folded into conv biases, some biases shared through Identity, Constant nodes,
    E modules' concats flattened, GlobalAveragePool + Flatten + Gemm.
    dynamo: opset 18, BatchNormalization nodes, constants as initializers, nested Concat in E modules,
    ReduceMean(keepdims) + Reshape + Gemm, value_info for every tensor (weights go to a .data file when saved).
    network "fid": pytorch-fid's FID Inception instead (arch.NETWORKS: average pools without padding, Mixed_7c's
    max pool, 1008 classes), as torch.onnx exports ``pytorch_fid.inception.fid_inception_v3()``.
    """
    if style not in ("torchscript", "dynamo"):
        raise ValueError(f"style must be 'torchscript' or 'dynamo', not {style!r}")
    p = _calibrated(seed, network)
    classes = arch.NETWORKS[network].classes
    g = _Graph(style)
    n_dim = batch if batch else "N"
    x_in = helper.make_tensor_value_info("input", TensorProto.FLOAT, [n_dim, 3, arch.INPUT_SIZE, arch.INPUT_SIZE])
    values = {arch.INPUT: _transform_input(g, "input") if transform_input else "input"}
    aux_out = None
    for layer in arch.inception_v3(network=network):
        if isinstance(layer, arch.Conv):
            n = layer.name + "."
            values[layer.name] = g.conv_unit(values[layer.src], p[n + "conv.weight"], p[n + "bn.weight"],
                                             p[n + "bn.bias"], p[n + "bn.running_mean"], p[n + "bn.running_var"],
                                             layer.stride, layer.pad, share_bias=layer.src.endswith("avg_pool"))
        elif isinstance(layer, arch.Pool):
            values[layer.name] = g.pool(values[layer.src], layer.kind, layer.kernel, layer.stride, layer.pad,
                                        layer.count_include_pad)
        elif isinstance(layer, arch.Concat):
            srcs = [values[s] for s in layer.srcs]
            if style == "dynamo" and len(srcs) == 6:  # torchvision's InceptionE concatenates the pairs first
                srcs = [srcs[0], g.op("Concat", srcs[1:3], axis=1), g.op("Concat", srcs[3:5], axis=1), srcs[5]]
            values[layer.name] = g.op("Concat", srcs, axis=1)
            if layer.name == "Mixed_6e" and aux:
                aux_out = _aux_classifier(g, values[layer.name], seed, batch)
        elif isinstance(layer, arch.FC):
            values[layer.name] = g.head(values["Mixed_7c"], p["fc.weight"], p["fc.bias"], batch)
    logits = values["fc"]
    if softmax:
        logits = g.op("Softmax", [logits], axis=1)
    outputs = [helper.make_tensor_value_info(logits, TensorProto.FLOAT, [n_dim, classes])]
    if aux_out:
        outputs.append(helper.make_tensor_value_info(aux_out, TensorProto.FLOAT, [n_dim, arch.NUM_CLASSES]))
    graph = helper.make_graph(g.nodes, "inception_v3", [x_in], outputs, initializer=g.inits)
    opset, ir = (18, 10) if style == "dynamo" else (17, 8)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir,
                              producer_name=SYNTHETIC_PRODUCER, producer_version=str(GENERATOR_VERSION))
    if style == "dynamo":
        model = onnx.shape_inference.infer_shapes(model)
    return model


def write_synthetic_onnx(path: str | Path, style: str = "torchscript", transform_input: bool = False,
                         softmax: bool = False, aux: bool = False, batch: int | None = None, seed: int = 0,
                         network: str = "torchvision") -> Path:
    """Writes the synthetic model (of ``network``) as ONNX at ``path`` (dynamo style: weights in ``<path>.data``
    beside it). Both files appear complete or not at all."""
    path = Path(path)
    model = synthetic_onnx_model(style, transform_input, softmax, aux, batch, seed, network)
    if style == "torchscript":
        return atomic_write(path, lambda f: f.write(model.SerializeToString()))
    path.parent.mkdir(parents=True, exist_ok=True)
    data = path.name + ".data"
    tmp = Path(tempfile.mkdtemp(prefix="." + path.name + ".", dir=path.parent))
    try:  # save into a fresh folder (onnx appends to an existing .data file), then move both into place
        onnx.save_model(model, str(tmp / path.name), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data, size_threshold=1024)
        for f in (tmp / data, tmp / path.name):  # onnx writes the data file 0600
            os.chmod(f, default_file_mode())
        os.replace(tmp / data, path.parent / data)
        os.replace(tmp / path.name, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
