"""The NHWC conv tiles (conv_nhwc.cuh): conv_nhwc_mma.cu's mma.sync tiles (and their max-pool twins) and split-K
reduction, and on sm_90a conv_nhwc_wgmma.cu's wgmma tiles (int8's with max-pool twins), conv_nhwc_ws.cu's
warp-specialized persistent ones (cp.async, TMA, TMA ping-pong) and conv_nhwc_halo.cu's halo ones: one signature,
one launch builder. Each file compiles once per element type it holds (cuda_build.UNITS); the tiles are tiles.py's
``NHWC_ELEMS[precision]``."""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import partial

from ....plan import ConvOp, FusedConvOp, View, writes
from ..cost_model import ConvConfig
from ..tensor_maps import Im2colMap, TensorMap, TiledMap
from ..tiles import (INPUT_MMA_TILE, INPUT_TILE, MAX_SHARED_BYTES, MAXPOOL_KERNEL, MAXPOOL_PREFIXES, NHWC_ELEMS,
                     THREADS, WGMMA_PREFIX, Tile, blocks, conv_kernel, halo_conv_smem_bytes, halo_fits, is_halo,
                     is_tma, is_ws, nhwc_cin, tile_fits, wgmma_ring_bytes)
from .conv_input_nhwc import input_conv_specs
from .spec import ConvShared, KernelSpec, LaunchSpec, Signature, registry

SOURCES = ("conv_nhwc_mma.cu", "conv_nhwc_wgmma.cu", "conv_nhwc_ws.cu", "conv_nhwc_halo.cu")
NHWC_PARTS = Signature.of("i: start1 offset1 cstride1 start2 offset2 cstride2 start3 offset3 cstride3 relu_end")
NHWC_CONV = Signature.of("P: x wr bias out", "i: batch cin h w x_cstride cout ho wo y_cstride kh kw stride pad_h pad_w "
                         "k_split") + NHWC_PARTS  # the parts: nhwc_parts
NHWC_TMA = NHWC_CONV + Signature.of("P: maps")  # ... and the tensor maps' address (the TMA tiles)
NHWC_REDUCE = Signature.of("P: ws bias y", "i: splits p_total cout y_cstride") + NHWC_PARTS
SPLIT_WEIGHTS = "conv_nhwc_f32_split_weights"  # the fp32 tiles' weights into fp16 halves, once after the upload


def nhwc_conv_source(kernel: str) -> str:
    """The file of an NHWC conv kernel (conv_nhwc_...): its tile family's."""
    if is_halo(kernel):
        return "conv_nhwc_halo.cu"
    if is_ws(kernel):
        return "conv_nhwc_ws.cu"
    return "conv_nhwc_wgmma.cu" if "_wgmma_" in kernel else "conv_nhwc_mma.cu"


def tile_shared(tile: Tile) -> int | ConvShared:
    """A conv tile's dynamic shared memory: the wgmma and warp-specialized tiles' ring, the halo tiles' by the conv,
    none for the others (static arrays)."""
    if is_halo(tile.prefix):
        return ConvShared(partial(halo_conv_smem_bytes, tile), MAX_SHARED_BYTES)
    return wgmma_ring_bytes(f"{tile.prefix}_{tile.name}")


def entries() -> Iterator[KernelSpec]:
    for precision, e in NHWC_ELEMS.items():
        for t in e.tiles(wgmma=True):
            name = f"{t.prefix}_{t.name}"
            yield KernelSpec(name, nhwc_conv_source(name), NHWC_TMA if is_tma(name) else NHWC_CONV, t.threads,
                             tile_shared(t))
        for t in e.tiles(wgmma=True):
            if t.prefix in MAXPOOL_PREFIXES:
                name = f"{t.prefix}_maxpool{MAXPOOL_KERNEL}_{t.name}"
                yield KernelSpec(name, nhwc_conv_source(name), NHWC_CONV, t.threads, tile_shared(t))
        if precision == "fp32":
            yield KernelSpec(SPLIT_WEIGHTS, "conv_nhwc_wgmma.cu", Signature.of("P: w", "i: pieces"), THREADS)
        # int8's sums are int32 and its reduction requantizes: next to its tiles, in their unit
        yield KernelSpec(f"conv_nhwc{e.suffix}_splitk_reduce",
                         "conv_nhwc_wgmma.cu" if precision == "int8" else "conv_nhwc_mma.cu", NHWC_REDUCE, THREADS)


KERNELS = registry(entries())


def nhwc_ptr(base: int, v: View, precision: str = "fp16") -> int:
    """Device address of the view's first channel of pixel 0, in an NHWC arena of the precision's elements."""
    return base + NHWC_ELEMS[precision].bytes * (v.offset + v.c_offset)


def nhwc_parts(op: ConvOp) -> tuple[int, ...]:
    """conv_nhwc.cuh's parts arguments (its header): start, element offset from part 0 and pixel stride of parts
    1-3, then relu_end. A plain conv has one part; a fused conv's (plan.FusedConvOp) follow its members."""
    cout = op.dst.channels
    if not isinstance(op, FusedConvOp):
        return (cout, 0, 0) * 3 + (cout,)
    assert 1 <= len(op.parts) <= 4, f"{op.name}: conv_nhwc.cuh writes at most 4 parts, not {len(op.parts)}"
    base, start, rest = op.parts[0].offset + op.parts[0].c_offset, op.parts[0].channels, []
    for v in op.parts[1:]:
        rest.append((start, v.offset + v.c_offset - base, v.c_total))
        start += v.channels
    rest += [(cout, 0, 0)] * (3 - len(rest))
    relu_end = sum(v.channels for v in op.parts[:len(op.parts) - op.pooled])
    return tuple(x for part in rest for x in part) + (relu_end,)


def persistent_grid(op: ConvOp, t: Tile, kernel: str, grid: tuple[int, int, int],
                    num_sms: int | None) -> tuple[int, int, int]:
    """A warp-specialized or halo tile's blocks loop over the tiles: num_sms of them (one an SM; a halo tile's split
    between its channel tiles, grid.y), or one per tile where there are fewer or num_sms is None."""
    if is_halo(kernel):  # tiles of t.bm positions of each image's padded-width grid, by channel tiles
        wg, channel_tiles = op.src.w + 2 * op.pad[1], blocks(op.dst.channels, t.bn)
        tiles = op.src.n * blocks(op.dst.h * wg, t.bm)
        per_channel_tile = tiles if num_sms is None else max(1, num_sms // channel_tiles)
        return (min(tiles, per_channel_tile), channel_tiles, 1)
    if is_ws(kernel):
        tiles = math.prod(grid)
        return (min(tiles, num_sms or tiles), 1, 1)
    return grid


def nhwc_conv_specs(op: ConvOp, cfg: ConvConfig, x: int, x_cstride: int, cin: int, y: int, w: int, b: int,
                    ws: int, precision: str = "fp16", num_sms: int | None = None, maps: int = 0,
                    inv_out: float = 1.0) -> list[LaunchSpec]:
    """conv_nhwc_*.cu's launch (x, y: ``nhwc_ptr`` addresses; y that of the first part of a fused conv; x that of the
    pool's input for a conv that reads through a max pool, its stride the pool's), and its split-K reduction when
    cfg.splits > 1; for INPUT_TILE and INPUT_MMA_TILE conv_input_nhwc.cu's, x then the float32 NCHW input (x_cstride
    unused). The persistent tiles' grid: ``persistent_grid``. A TMA tile reads its two tensor maps (the spec's
    ``maps``, which the caller encodes there) from `maps`. int8: the stem quantizes its output at ``inv_out``
    (float32(1) / its storage scale); the int8 tiles (conv_mma.cuh's NhwcI8) take for b the float32[3 cout] of
    ``int8_scales.int8_epilogue`` (Int8Scales.conv_epilogue), and split K into int32 partial sums, which
    conv_nhwc_i8_splitk_reduce requantizes."""
    if cfg.tile in (INPUT_TILE, INPUT_MMA_TILE):
        if precision == "int8":
            return input_conv_specs(op, cfg, x, cin, y, w, b, precision, num_sms, inv_out=inv_out)
        return input_conv_specs(op, cfg, x, cin, y, w, b, precision, num_sms)
    n, _, h, wd = op.src.dims
    _, cout, ho, wo = op.dst.dims
    y_cstride = writes(op)[0].c_total
    p_total, t, suffix = n * ho * wo, cfg.tile, NHWC_ELEMS[precision].suffix
    split = cfg.splits > 1
    parts = dict(zip(NHWC_PARTS.names, nhwc_parts(op)))
    args = dict(x=x, wr=w, bias=b, out=ws if split else y, batch=n, cin=cin, h=h, w=wd, x_cstride=x_cstride,
                cout=cout, ho=ho, wo=wo, y_cstride=y_cstride, kh=op.kernel[0], kw=op.kernel[1], stride=op.stride,
                pad_h=op.pad[0], pad_w=op.pad[1], k_split=cfg.k_split, **parts)
    assert t in NHWC_ELEMS[precision].tiles(True), f"{op.name}: {t.prefix} {t.name} is not a {precision} NHWC tile"
    assert tile_fits(op, t), f"{op.name}: {t.prefix} {t.name} does not compute it"
    kernel = conv_kernel(op, t)
    if is_halo(kernel):
        assert halo_fits(op, t) and not split and cin == op.src.channels, f"{op.name}: not a conv for {kernel}"
    grid = persistent_grid(op, t, kernel, (blocks(p_total, t.bm), blocks(cout, t.bn), cfg.splits), num_sms)
    tensor_maps: tuple[TensorMap, ...] = ()
    if is_tma(kernel):
        assert maps, f"{op.name}: a TMA tile needs the address of its tensor maps"
        args["maps"] = maps
        tensor_maps = tma_maps(op, cfg, x, x_cstride, w, NHWC_ELEMS[precision].bytes)
    specs = [LaunchSpec.of(op.name, KERNELS[kernel], grid, args, op, tensor_maps)]
    if split:
        reduce = KERNELS[f"conv_nhwc{suffix}_splitk_reduce"]  # a thread a pair of channels
        specs.append(LaunchSpec.of(op.name, reduce, (reduce.blocks(p_total * cout // 2), 1, 1),
                                   dict(ws=ws, bias=b, y=y, splits=cfg.splits, p_total=p_total, cout=cout,
                                        y_cstride=y_cstride, **parts)))
    return specs


def weight_setup_specs(op: ConvOp, tile: Tile, w: int) -> list[LaunchSpec]:
    """What a conv's weights at `w` (params.direct_weights' rows for `tile`) need once uploaded, before any forward:
    on an fp32 tile, their split into fp16 halves in place (conv_nhwc_f32_split_weights, a thread a 16-byte piece of
    the Cout x KH x KW x nhwc_cin(Cin) float32 words); nothing on every other tile."""
    if not tile.prefix.startswith(WGMMA_PREFIX["fp32"]):
        return []
    pieces = op.dst.channels * op.kernel[0] * op.kernel[1] * nhwc_cin(op.src.channels) // 4
    k = KERNELS[SPLIT_WEIGHTS]
    return [LaunchSpec.of(op.name, k, (k.blocks(pieces), 1, 1), dict(w=w, pieces=pieces))]


def tma_maps(op: ConvOp, cfg: ConvConfig, x: int, x_cstride: int, w: int, elem_bytes: int) -> tuple[TensorMap, ...]:
    """A TMA tile's two maps (conv_nhwc_ws.cu's header): the input view as im2col boxes of BM window corners x BK
    channels, the weights w[Cout][K] as boxes of BN rows x BK."""
    (n, cin, h, wd), (_, cout, ho, wo) = op.src.dims, op.dst.dims
    (kh, kw), s, (ph, pw), t = op.kernel, op.stride, op.pad, cfg.tile
    im2col = Im2colMap(x, elem_bytes, (cin, wd, h, n), x_cstride, (-pw, -ph),
                       ((wo - 1) * s - pw - (wd - 1), (ho - 1) * s - ph - (h - 1)), t.bk, t.bm, s)
    return im2col, TiledMap(w, elem_bytes, kh * kw * cin, cout, t.bk, t.bn)
