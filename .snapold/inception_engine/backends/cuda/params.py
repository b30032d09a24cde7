"""The parameters in the layouts the kernels read: ``pack_params`` puts every weight and bias of a plan into one
float32 array (direct convs by ``direct_weights``, Winograd convs as U, each F(m, k)'s transforms once, fused 1x1
groups stacked by ``op_params``) and says where each starts."""

from __future__ import annotations

import numpy as np

from ...errors import EngineError
from ...plan import ConvOp, FCOp, FusedConvOp, Plan, PoolOp, align
from ...weights import Weights
from .cost_model import ConvConfig
from .int8_scales import Int8Scales
from ..int8_reference import quantize_weights
from .tiles import Tile, nhwc_cin
from .winograd import o_pad, winograd_transforms, winograd_weights

INT8_PREFIX = "conv_nhwc_i8"  # the int8 NHWC conv tiles' kernels (conv_nhwc_wgmma.cu's NhwcI8)
# binary16's largest finite value: what rounds to it or below stays finite, 65520 and beyond become infinities
FP16_MAX = 65504.0


def fp16_operands(prefix: str) -> bool:
    """A kernel whose tensor-core operands are fp16: the fp16 tiles, and fp32's on Hopper (conv_mma.cuh's NhwcF32:
    three fp16 products a product), whose weights must therefore lie in fp16's range as well."""
    if prefix.startswith(("conv_nhwc_tf32", INT8_PREFIX)):
        return False
    return prefix == "conv_f16" or prefix.startswith("conv_nhwc")


def transforms_key(op: ConvOp, cfg: ConvConfig) -> str:
    """pack_params' key prefix of the transforms a Winograd conv reads: one pair per F(m, k)."""
    return f"winograd_F{cfg.wino}_{max(op.kernel)}"


def direct_weights(w: np.ndarray, tile: Tile, scales: np.ndarray | None = None) -> np.ndarray:
    """A direct conv's (or the FC-as-GEMM's) weights (Cout, Cin[, kh, kw]) as its kernel reads them, as float32
    words: wt[K][Cout] (K = Cin*kh*kw in (c, r, s) order) for conv.cu and conv_tf32.cu, whose A tiles are rows
    along Cout; for conv_f16.cu IEEE binary16 (rounded to nearest even) w16[Cout][K8], K8 = K rounded up to a
    multiple of 8 with zeros, so each row is whole 16-byte pieces for its cp.async loads; for conv_nhwc.cuh
    w16[Cout][KH][KW][Cin8] ((r, s, c) order, Cin padded to 8 with zeros), binary16 or, for its tf32 tiles, float32
    rounded to TF32 (``round_tf32``), for its fp32 tiles float32, which conv_nhwc_f32_split_weights splits into
    fp16 halves on the GPU once they are uploaded (lowering's setup launches);
    conv_input_nhwc.cu reads wt as conv.cu. The int8 tiles (``scales``: the per-output-channel weight scales,
    required): ``int8_rows`` of ``clip(rint(w / scales[o]), -127, 127)``, int8_reference.quantize_weights."""
    if tile.prefix.startswith(INT8_PREFIX):
        if scales is None:
            raise ValueError(f"{tile.prefix}: int8 weights need their per-channel scales")
        return int8_rows(quantize_weights(w, scales))
    if tile.prefix.startswith("conv_nhwc"):
        cout, cin, kh, kw = w.shape
        tf32, f32 = tile.prefix.startswith("conv_nhwc_tf32"), tile.prefix.startswith("conv_nhwc_f32")
        w16 = np.zeros((cout, kh, kw, nhwc_cin(cin)), np.float32 if tf32 or f32 else np.float16)
        with np.errstate(over="ignore"):
            w16[..., :cin] = w.transpose(0, 2, 3, 1)
        w16 = w16.reshape(cout, -1)
        return round_tf32(w16) if tf32 else w16 if f32 else w16.view(np.float32)
    w = w.reshape(w.shape[0], -1)
    if tile.prefix != "conv_f16":
        return np.ascontiguousarray(w.T, dtype=np.float32)
    w16 = np.zeros((w.shape[0], -(-w.shape[1] // 8) * 8), np.float16)
    with np.errstate(over="ignore"):
        w16[:, :w.shape[1]] = w
    return w16.view(np.float32)


def round_tf32(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 as cvt.rna.tf32.f32 does: 10 mantissa bits, to nearest, ties away from zero
    (half of the dropped range added to the magnitude bits); infinities and NaNs unchanged."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    return np.where(finite, (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000), bits).view(np.float32)


def op_params(weights: Weights, op: ConvOp | FCOp) -> tuple[np.ndarray, np.ndarray]:
    """(weight, bias) of a conv or FC; a fused conv's stacked in member order, with zero bias for the members whose
    moved pool adds theirs (plan.FusedConvOp)."""
    if not isinstance(op, FusedConvOp):
        return weights.arrays[op.name + ".weight"], weights.arrays[op.name + ".bias"]
    first_pooled = len(op.members) - op.pooled
    w = np.concatenate([weights.arrays[m + ".weight"] for m in op.members])
    b = np.concatenate([weights.arrays[m + ".bias"] * (i < first_pooled) for i, m in enumerate(op.members)])
    return w, b.astype(np.float32)


def int8_rows(wq: np.ndarray) -> np.ndarray:
    """int8 conv weights (Cout, Cin, kh, kw) as conv_nhwc.cuh's int8 tiles read them: rows w8[Cout][KH][KW][Cin16]
    ((r, s, c) order, Cin padded to 16 with zeros: whole 16-byte pieces), as float32 words (bytes padded to 4)."""
    cout, cin, kh, kw = wq.shape
    rows = np.zeros((cout, kh, kw, -(-cin // 16) * 16), np.int8)
    rows[..., :cin] = wq.transpose(0, 2, 3, 1)
    flat = rows.ravel()
    return np.concatenate([flat, np.zeros(-flat.size % 4, np.int8)]).view(np.float32)


def pack_params(weights: Weights, plan: Plan, configs: dict[str, ConvConfig | None],
                int8: Int8Scales | None = None) -> tuple[np.ndarray, dict[str, int]]:
    """Every parameter in the layout its kernel reads, in one float32 array, and each key's element offset
    (ALIGN-aligned, so every array starts on a 256-byte boundary as arena buffers do).

    A direct conv's weights are laid out by ``direct_weights`` for its kernel; a Winograd conv's become U
    (``winograd_weights``), and the transforms it uses are stored once under "<transforms_key>.bt" / ".at". The FC
    weight stays (out, in) for fc_gemv and takes its kernel's ``direct_weights`` layout when the FC runs as a
    1x1-conv GEMM. With ``int8`` (--precision int8), the convs on int8 tiles take int8 weights (``int8_rows``) and,
    as their "bias", the epilogue's three per-channel arrays (Int8Scales.conv_epilogue; a moved pool's, of its
    conv: Int8Scales.moved_pool_epilogue).
    """
    parts: list[np.ndarray] = []
    offsets: dict[str, int] = {}
    pos = 0

    def add(key: str, a: np.ndarray) -> None:
        nonlocal pos
        a = np.ascontiguousarray(a, dtype=np.float32).ravel()
        offsets[key] = pos
        padded = align(a.size)
        parts.extend([a, np.zeros(padded - a.size, np.float32)])
        pos += padded

    for op in plan.ops:
        if isinstance(op, PoolOp) and op.bias:
            b = weights.arrays[op.bias + ".bias"]
            add(op.bias + ".bias", b if int8 is None else int8.moved_pool_epilogue(op, b))
        if not isinstance(op, (ConvOp, FCOp)):
            continue
        w, b = op_params(weights, op)
        cfg = configs[op.name]
        if cfg is not None and cfg.wino:
            w = winograd_weights(w, cfg.wino, o_pad(op.dst.channels, cfg.tile))
            key = transforms_key(op, cfg)
            if f"{key}.bt" not in offsets:
                bt, at = winograd_transforms(cfg.wino, max(op.kernel))
                add(f"{key}.bt", bt)
                add(f"{key}.at", at)
        elif cfg is not None and int8 is not None and cfg.tile.prefix.startswith(INT8_PREFIX):
            w, b = direct_weights(w, cfg.tile, int8.conv_weight_scales(op)), int8.conv_epilogue(op, b)
        elif cfg is not None:
            largest = float(np.abs(w).max()) if fp16_operands(cfg.tile.prefix) and w.size else 0.0
            if largest > FP16_MAX:
                raise EngineError(f"{op.name}: a weight of magnitude {largest:.6g} is beyond fp16's range "
                                  f"({FP16_MAX:g}), which this precision's tensor-core kernels ({cfg.tile.prefix}) "
                                  f"take their operands in: use --precision tf32, or the CPU")
            w = direct_weights(w, cfg.tile)
        add(op.name + ".weight", w)
        add(op.name + ".bias", b)
    return np.concatenate(parts), offsets
