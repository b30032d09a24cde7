"""The 8-bit network in NumPy, with integer semantics: what the INT8 GPU kernels are checked against element-wise.

Numbers (weights.calibration holds the scales; the calibration command, calibrate.py, computes them):
- A quantized tensor is int8 ``q`` with one float32 scale ``s`` per tensor: it stands for ``q * s``. Quantizing is
  ``clip(rint(x * (1 / s)), -127, 127)``: multiply by the float32 reciprocal (what a kernel epilogue does), round
  half to even (np.rint; the GPU's cvt.rni), saturate symmetrically. -128 is never used, so that negating a value
  never overflows and the range is the same on both sides of zero, as a symmetric scale assumes (TensorRT's
  convention; Wu et al. 2020, "Integer Quantization for Deep Learning Inference", sec. 3.1).
- Weights: per output channel, the calibration record's ``s_w[o]`` (the calibration command's ``max|w[o]| / 127``;
  an already-quantized ONNX's own, onnx_qdq.py), and ``w_q = clip(rint(w / s_w), -127, 127)``.
- A convolution is int8 x int8 -> int32: zero padding is the integer 0, and the sums are exact. They are computed
  with float64 GEMMs: every product is at most 127^2 and every partial sum at most 127^2 * C*kh*kw < 2^31 < 2^53,
  so every float64 partial sum is an exact integer in any order of summation (checked per layer, ACC_LIMIT).
- Epilogue, in float32: ``y = float32(acc) * (s_x * s_w[o]) + bias[o]``, ReLU, then quantized at the scale of the
  tensor the output is stored in. float32(acc) rounds to nearest even above 2^24, as cvt.rn.f32.s32 does.
- Storage scale: a tensor that feeds a concat is stored at the concat's scale, never its own, so that each branch
  writes its int8 values at its channel offset and the concat needs no copy or rescaling (the GPU plan's concat by
  offset). Every other tensor is stored at its own calibrated scale, except pool outputs (next rule).
- Max pool is exact on int8 (max commutes with a monotone quantization); its output keeps its input's scale. Average
  pool sums the int8 window in integers, divides by the window's count (count_include_pad as the network says) and
  rounds half to even: ``rint(sum / count)``, computed in float64, exact for these sums; same scale as its input.
  A pool feeding a concat is then requantized to the concat's scale (``rint(q * (s_in / s_out))``, float32).
- An average pool moved behind its conv (``moved_pools``: stride 1, its only reader a 1x1 conv of stride 1 and no
  padding, and the calibration not a quantized ONNX's, whose file rounds the pool's output): the pool's output is
  never rounded. The conv's exact int32 sums at every pixel of the pool's input, ``acc``, are window-summed in
  integers (``S``, exact: checked against ACC_LIMIT), and the epilogue scales by the window's count:
  ``y = (float32(S) * (s_x * s_w[o])) * (1 / float32(count)) + bias[o]``, each operation rounded on its own in
  float32 (the reciprocal too), ReLU, quantized at the conv's storage scale. Both are linear, so this is the
  pool-then-conv network without the pool's rounding to the int8 grid (up to half a level of the pool's scale
  closer to the float network), and on the GPU the pool runs on the conv's few output channels (32-192) instead of
  its input's (192-2048).
- Layers in ``float_layers`` (default DEFAULT_FLOAT_LAYERS: the stem's first conv, whose input is the image, and
  the classifier) run in float32 on the dequantized input; their outputs are quantized by whoever reads them. The
  global average pool runs in float32 (its only reader is the classifier).

It runs the architecture's layers (arch), not a Plan: the plan's views and fusions are the GPU's memory layout, and
the reference states the arithmetic once, for any plan to be checked against (a plan's op names are the layers').
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import arch
from ..errors import WeightsError
from ..weights import QDQ_METHOD, Weights, require_calibration
from .numpy_primitives import conv2d_bias_relu, global_avg_pool, pool2d, walk_layers

QMAX = 127
ACC_LIMIT = 2**31 - 1  # an int32 accumulator; also far below 2^53, where float64 sums stop being exact
DEFAULT_FLOAT_LAYERS = frozenset({"Conv2d_1a_3x3", "fc"})


def quantize(x: np.ndarray, scale: float) -> np.ndarray:
    """float -> int8 at ``scale`` (module doc: reciprocal multiply, round half to even, saturate to +-127)."""
    inv = np.float32(1.0) / np.float32(scale)
    return np.clip(np.rint(x.astype(np.float32) * inv), -QMAX, QMAX).astype(np.int8)


def dequantize(q: np.ndarray, scale: float) -> np.ndarray:
    return q.astype(np.float32) * np.float32(scale)


def requantize(q: np.ndarray, s_in: float, s_out: float) -> np.ndarray:
    """int8 at s_in -> int8 at s_out (rint(q * (s_in / s_out)) in float32, saturated); unchanged if equal."""
    if np.float32(s_in) == np.float32(s_out):
        return q
    ratio = np.float32(s_in) / np.float32(s_out)
    return np.clip(np.rint(q.astype(np.float32) * ratio), -QMAX, QMAX).astype(np.int8)


def weight_scales(w: np.ndarray) -> np.ndarray:
    """Per output channel, max|w| / 127 as float32 (an all-zero channel gets 1: its weights quantize to 0)."""
    m = np.abs(w.reshape(w.shape[0], -1)).max(axis=1).astype(np.float32) / np.float32(QMAX)
    return np.where(m > 0, m, np.float32(1.0)).astype(np.float32)


def quantize_weights(w: np.ndarray, scales: np.ndarray) -> np.ndarray:
    s = np.asarray(scales, np.float32).reshape(-1, *([1] * (w.ndim - 1)))
    return np.clip(np.rint(w.astype(np.float32) / s), -QMAX, QMAX).astype(np.int8)


def conv_int32(q: np.ndarray, wq: np.ndarray, stride: int, pad: tuple[int, int]) -> np.ndarray:
    """int8 (N, C, H, W) conv int8 (O, C, kh, kw) -> exact int32 (N, O, Ho, Wo) (module doc: float64 GEMM)."""
    o, c, kh, kw = wq.shape
    if QMAX * QMAX * c * kh * kw > ACC_LIMIT:
        raise ValueError(f"a {c}x{kh}x{kw} int8 dot product may overflow int32")
    x = np.pad(q.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    acc = np.einsum("nchwij,ocij->nohw", win, wq.astype(np.float64), optimize=True)
    return np.rint(acc).astype(np.int32)


def conv_epilogue(acc: np.ndarray, s_x: float, s_w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """float32(acc) * (s_x * s_w[o]) + bias[o], ReLU: the float32 output before requantization."""
    mult = (np.float32(s_x) * np.asarray(s_w, np.float32)).reshape(1, -1, 1, 1)
    y = acc.astype(np.float32) * mult + np.asarray(bias, np.float32).reshape(1, -1, 1, 1)
    return np.maximum(y, np.float32(0))


def window_sums(acc: np.ndarray, layer: arch.Pool) -> tuple[np.ndarray, np.ndarray]:
    """The average pool's exact integer window sums of integer ``acc`` (int8 values, or a moved pool's int32
    products), as int64, and each output's count (float32: kernel^2 with count_include_pad, else the positions
    inside; broadcasts over (N, C, Ho, Wo))."""
    k = layer.kernel
    sums = np.rint(pool2d(acc.astype(np.float64), "avg", k, layer.stride, layer.pad, True) * k * k)
    if layer.count_include_pad or not layer.pad:
        counts = np.full((1, 1, 1, 1), k * k, np.float32)
    else:
        ones = np.ones((1, 1, *acc.shape[2:]))
        counts = np.rint(pool2d(ones, "avg", k, layer.stride, layer.pad, True) * k * k).astype(np.float32)
    return sums.astype(np.int64), counts


def pool_int8(q: np.ndarray, layer: arch.Pool) -> np.ndarray:
    """Max pool exact on int8; average pool: integer window sums / count, rounded half to even (module doc)."""
    if layer.kind == "max":
        return pool2d(q.astype(np.float32), "max", layer.kernel, layer.stride, layer.pad).astype(np.int8)
    sums, counts = window_sums(q, layer)
    return np.rint(sums / counts).astype(np.int8)  # float64: exact sums over exact counts


def moved_pools(layers: list[arch.Layer], calib: dict,
                float_layers: frozenset[str] = DEFAULT_FLOAT_LAYERS) -> dict[str, str]:
    """pool name -> conv name of each average pool that runs behind its conv (module doc): stride 1, read by one
    8-bit 1x1 conv of stride 1 and no padding alone; none where the calibration is a quantized ONNX's (its file
    rounds the pool's output to the int8 grid, which the scheme then honours by pooling first)."""
    if str(calib.get("method", "")).startswith(QDQ_METHOD):
        return {}
    readers: dict[str, list[arch.Layer]] = {}
    for l in layers:
        for s in (l.srcs if isinstance(l, arch.Concat) else (l.src,)):
            readers.setdefault(s, []).append(l)
    out = {}
    for l in layers:
        if isinstance(l, arch.Pool) and l.kind == "avg" and l.stride == 1 and len(readers.get(l.name, [])) == 1:
            conv = readers[l.name][0]
            if (isinstance(conv, arch.Conv) and conv.kernel == (1, 1) and conv.stride == 1 and conv.pad == (0, 0)
                    and conv.name not in float_layers):
                out[l.name] = conv.name
    return out


def moved_pool_epilogue(sums: np.ndarray, counts: np.ndarray, s_x: float, s_w: np.ndarray,
                        bias: np.ndarray) -> np.ndarray:
    """(float32(S) * (s_x * s_w[o])) * (1 / float32(count)) + bias[o], ReLU: a moved pool's float32 output before
    requantization (module doc; each operation rounded on its own)."""
    mult = (np.float32(s_x) * np.asarray(s_w, np.float32)).reshape(1, -1, 1, 1)
    recip = np.float32(1) / np.asarray(counts, np.float32)
    y = (sums.astype(np.float32) * mult) * recip + np.asarray(bias, np.float32).reshape(1, -1, 1, 1)
    return np.maximum(y, np.float32(0))


def storage_scales(layers: list[arch.Layer], act: dict[str, float]) -> dict[str, float]:
    """The scale each tensor is stored at (module doc): a concat's for its branches, its input's for a pool, else
    its own calibrated one."""
    out: dict[str, float] = {}
    concat_of = {s: l.name for l in layers if isinstance(l, arch.Concat) for s in l.srcs}
    for l in layers:
        if l.name in concat_of:
            out[l.name] = act[concat_of[l.name]]
        elif isinstance(l, arch.Pool):
            out[l.name] = out.get(l.src, act.get(l.src, 1.0))
        elif l.name in act:
            out[l.name] = act[l.name]
    return out


Act = tuple[np.ndarray, float | None]  # int8 with its scale, or float32 with None


def _as_float(a: Act) -> np.ndarray:
    return a[0] if a[1] is None else dequantize(a[0], a[1])


def _as_int8(a: Act, scale: float) -> np.ndarray:
    return quantize(a[0], scale) if a[1] is None else requantize(a[0], a[1], scale)


def _layer(l: arch.Layer, weights: Weights, acts: dict[str, Act], calib: dict, store: dict[str, float],
           float_layers: frozenset[str], moved: dict[str, arch.Pool]) -> Act:
    if isinstance(l, arch.Conv):
        w, b = weights.conv(l.name)
        if l.name in float_layers:
            return conv2d_bias_relu(_as_float(acts[l.src]), w, b, l.stride, l.pad), None
        s_x = store.get(l.src, calib["activation_scales"].get(l.src))
        s_w = np.asarray(calib["weight_scales"][l.name], np.float32)
        pool = moved.get(l.src)
        src = acts[pool.src if pool else l.src]
        acc = conv_int32(_as_int8(src, s_x), quantize_weights(w, s_w), l.stride, l.pad)
        if pool is None:
            return quantize(conv_epilogue(acc, s_x, s_w, b), store[l.name]), store[l.name]
        if pool.kernel ** 2 * np.abs(acc).max(initial=0) > ACC_LIMIT:
            raise ValueError(f"{pool.name}: the window sums of {l.name}'s products may overflow int32")
        y = moved_pool_epilogue(*window_sums(acc, pool), s_x, s_w, b)
        return quantize(y, store[l.name]), store[l.name]
    if isinstance(l, arch.Pool):
        src = acts[l.src]
        s_in = src[1] if src[1] is not None else store.get(l.src, calib["activation_scales"][l.src])
        q = pool_int8(_as_int8(src, s_in), l)
        return requantize(q, s_in, store[l.name]), store[l.name]
    if isinstance(l, arch.Concat):
        return np.concatenate([_as_int8(acts[s], store[l.name]) for s in l.srcs], axis=1), store[l.name]
    if isinstance(l, arch.GlobalAvgPool):
        return global_avg_pool(_as_float(acts[l.src])).reshape(acts[l.src][0].shape[0], -1), None
    w, b = weights.arrays[l.name + ".weight"], weights.arrays[l.name + ".bias"]
    return (_as_float(acts[l.src]) @ w.T + b).astype(np.float32), None


def _check_scales(layers: list[arch.Layer], calib: dict, float_layers: frozenset[str]) -> None:
    """Every conv run in int8 has its weight and input scales: a calibration from a quantized ONNX may lack the
    stem's (weights.QDQ_STEM), which then runs in float only (one WeightsError line)."""
    for l in layers:
        if isinstance(l, arch.Conv) and l.name not in float_layers and (
                l.name not in calib["weight_scales"] or l.src not in calib["activation_scales"]):
            raise WeightsError(f"the 8-bit calibration ({calib['method']}) has no scales for {l.name} (the quantized "
                               f"ONNX's do not apply to it): it runs in float only")


def forward_int8(weights: Weights, x: np.ndarray, float_layers: frozenset[str] = DEFAULT_FLOAT_LAYERS,
                 visit: Callable[[str, np.ndarray, float | None], None] | None = None) -> np.ndarray:
    """Logits (N, classes) float32 of the 8-bit network on normalised images ``x`` (N, 3, H, W). ``visit(name,
    array, scale)`` sees every layer's output as stored (int8 with its scale, or float32 with None), for element-wise
    checks of a kernel (not a moved pool's: it has none of its own). Refuses (WeightsError, one line) weights
    without calibration."""
    calib = require_calibration(weights)
    layers = weights.layers()
    _check_scales(layers, calib, float_layers)
    store = storage_scales(layers, calib["activation_scales"])
    moving = moved_pools(layers, calib, float_layers)
    moved = {l.name: l for l in layers if l.name in moving}
    # a moved pool's reader reads the pool's input; the pool itself computes nothing
    srcs = {l.name: (l.srcs if isinstance(l, arch.Concat) else (moved[l.src].src,) if l.src in moved else (l.src,))
            for l in layers if l.name not in moved}
    last_read = {s: i for i, l in enumerate(layers) if l.name in srcs for s in srcs[l.name]}
    acts: dict[str, Act] = {arch.INPUT: (np.asarray(x, np.float32), None)}
    out: Act = acts[arch.INPUT]
    for i, l in enumerate(layers):
        if l.name in moved:
            continue
        out = acts[l.name] = _layer(l, weights, acts, calib, store, float_layers, moved)
        if visit is not None:
            visit(l.name, *out)
        for s in srcs[l.name]:
            if last_read[s] == i:
                del acts[s]
    return out[0]


def float_walk(weights: Weights, x: np.ndarray, visit: Callable[[str, np.ndarray], None],
               dtype: type = np.float32) -> np.ndarray:
    """The float network (``dtype``: float32, the fp32 network; float64, the reference both 8-bit networks are
    judged by; direct convolutions) on ``x``; ``visit(name, tensor)`` sees the input and every layer's output
    before the global pool: what calibration gathers statistics of. Returns the logits."""
    x = np.asarray(x, dtype)
    visit(arch.INPUT, x)
    return walk_layers(weights.layers(), x,
                       lambda l, a: conv2d_bias_relu(a, *weights.conv(l.name), l.stride, l.pad),
                       lambda l, a: a @ weights.arrays[l.name + ".weight"].T + weights.arrays[l.name + ".bias"],
                       visit)
