"""What the 8-bit forward's launches need of the calibration, per plan op: the int8 weights, each conv's epilogue
(bias, multiplier, reciprocal of the output's scale, per output channel), each pool's requantization ratio, the
global average pool's dequantization scale, the stem's output reciprocal, and which average pools run behind their
conv (``moved``: int8_reference.moved_pools) with the epilogue their kernel applies. The arithmetic is int8_reference's
(its module doc): the kernels are checked element-wise against it, so every number here is computed exactly as
the reference computes it (float32 products and reciprocals of the float32 scales).

The plan's op names are the architecture's layer names (a fused conv's members are), so the storage scale of each
tensor is ``int8_reference.storage_scales`` of the weights' layers: a concat's branches at the concat's scale, a
pool at its input's, every other tensor at its own calibrated scale.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ... import arch
from ...plan import ConvOp, FusedConvOp, GlobalAvgPoolOp, PoolOp
from ...weights import Weights, require_calibration
from ..int8_reference import moved_pools, storage_scales
from .families.conv_input_nhwc import inv_scale
from .families.pool_nhwc import requant_ratio


def int8_epilogue(bias: np.ndarray, scale: np.ndarray, inv_out: np.ndarray) -> np.ndarray:
    """The int8 convs' `bias` argument (conv_nhwc.cuh's NhwcStore::column4): float32[3 cout], the bias, then each
    channel's multiplier scale[m] = float32(s_x) * float32(s_w[m]), then inv_out[m] = float32(1) / float32(the
    storage scale of the output tensor channel m is written to), one per channel as a fused conv's parts may be stored
    at different scales."""
    parts = [np.asarray(a, np.float32).reshape(-1) for a in (bias, scale, inv_out)]
    if not parts[0].size == parts[1].size == parts[2].size:
        raise ValueError(f"int8 epilogue: bias, scale and inv_out of {[p.size for p in parts]} channels")
    return np.concatenate(parts)


@dataclass(frozen=True)
class Int8Scales:
    """Storage scale per tensor (layer name), each layer's input tensor, each conv's per-channel weight scales, and
    the average pools that run behind their conv (pool name -> conv name)."""

    store: Mapping[str, float]
    src: Mapping[str, str]
    weight: Mapping[str, np.ndarray]
    moved: Mapping[str, str]

    @classmethod
    def of(cls, weights: Weights) -> Int8Scales:
        """From the weight file's calibration; refuses (one WeightsError line naming the command that adds it) a file
        without one."""
        calib = require_calibration(weights)
        layers = weights.layers()
        store = storage_scales(layers, calib["activation_scales"])
        src = {l.name: l.src for l in layers if not isinstance(l, arch.Concat)}
        weight = {name: np.asarray(s, np.float32) for name, s in calib["weight_scales"].items()}
        return cls(store, src, weight, moved_pools(layers, calib))

    def input_scale(self, layer: str) -> float:
        """The scale a layer reads its input at: the input tensor's storage scale."""
        return self.store[self.src[layer]]

    def inv(self, tensor: str) -> np.float32:
        """float32(1) / float32(storage scale): what a kernel multiplies by to quantize (int8_reference.quantize)."""
        return np.float32(inv_scale(self.store[tensor]))

    def members(self, op: ConvOp) -> tuple[str, ...]:
        return op.members if isinstance(op, FusedConvOp) else (op.name,)

    def conv_weight_scales(self, op: ConvOp) -> np.ndarray:
        """Per output channel of a conv (a fused one's members stacked), its weight scale."""
        return np.concatenate([self.weight[m] for m in self.members(op)])

    def conv_epilogue(self, op: ConvOp, bias: np.ndarray) -> np.ndarray:
        """int8_epilogue's float32[3 Cout]: bias, the multiplier float32(s_x) * float32(s_w[m]), and
        float32(1) / float32(the storage scale of the tensor channel m is written to)."""
        return self.epilogue(self.members(op), bias)

    def moved_pool_epilogue(self, op: PoolOp, bias: np.ndarray) -> np.ndarray:
        """A moved pool's: its conv's (op.bias) epilogue, whose input is the pool's input at the pool's storage
        scale (pool_nhwc.cu's avg_pool_products_nhwc_i8; the division by the window's count is the kernel's)."""
        return self.epilogue((op.bias,), bias)

    def epilogue(self, members: tuple[str, ...], bias: np.ndarray) -> np.ndarray:
        """int8_epilogue of convs that read one input, their channels stacked in member order."""
        s_x = np.float32(self.input_scale(members[0]))
        inv = np.concatenate([np.full(self.weight[m].size, self.inv(m), np.float32) for m in members])
        return int8_epilogue(bias, s_x * np.concatenate([self.weight[m] for m in members]), inv)

    def pool_ratio(self, op: PoolOp) -> np.float32:
        """float32(s_in) / float32(s_out) of a pool (1 where they are equal: no requantization)."""
        return np.float32(requant_ratio(self.input_scale(op.name), self.store[op.name]))

    def gap_scale(self, op: GlobalAvgPoolOp) -> np.float32:
        """The scale the global average pool dequantizes its int8 input at."""
        return np.float32(self.input_scale(op.name))
