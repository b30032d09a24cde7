"""Each CUDA kernel against the float64 NumPy reference primitives, on fresh random data.

Every convolution shape of the network (deduplicated, batch 1, with the config the backend picks on this GPU), every
conv tile with and without split-K on edge cases (batch 3, odd sizes, channel-slice source and destination views,
no ReLU), pools, global average pool, the FC (gemv and GEMM) and softmax. Launches are built by the backend's own
spec functions, so argument order and view arithmetic are tested too. Every device buffer starts as NaN: an output
element never written fails the comparison, and a write outside the destination view shows as a non-NaN where only
NaN may be. Inputs must come back bit for bit unchanged.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from inception_engine.backends.cuda.cost_model import ConvConfig, choose_configs, conv_config, uses_gemv
from inception_engine.backends.cuda.device import driver
from inception_engine.backends.cuda.kernels import Kernels
from inception_engine.backends.cuda.launch import conv_specs, fc_specs, gap_spec, pool_spec, softmax_spec
from inception_engine.backends.cuda.tiles import NAN_BITS, TILES, Tile
from inception_engine.backends.numpy_primitives import conv2d_bias_relu, fc, global_avg_pool, pool2d
from inception_engine.plan import ConvOp, FCOp, GlobalAvgPoolOp, PoolOp, build_plan

from helpers.gpu_buffers import Arena, Params, check_view, rng_for, run


pytestmark = pytest.mark.gpu

def conv_case(kernels: Kernels, n: int, cin: int, cout: int, h: int, w: int, kernel: tuple[int, int],
              stride: int, pad: tuple[int, int], cfg: ConvConfig, relu: bool = True,
              src_extra: tuple[int, int] = (0, 0),
              dst_extra: tuple[int, int] = (0, 0), fixup: bool = True) -> np.ndarray:
    """src_extra / dst_extra: (channels before, channels after) the view in its buffer. fixup: split-K reduced in
    the conv kernel (run twice: the tile counters must come back zeroed and the result the same), else by
    conv_splitk_reduce. Returns the destination buffer."""
    ho, wo = (h + 2 * pad[0] - kernel[0]) // stride + 1, (w + 2 * pad[1] - kernel[1]) // stride + 1
    arena = Arena((n, src_extra[0] + cin + src_extra[1], h, w), (n, dst_extra[0] + cout + dst_extra[1], ho, wo))
    src, dst = arena.view(0, src_extra[0], cin), arena.view(1, dst_extra[0], cout)
    rng = rng_for(n, cin, cout, h, w, kernel, stride, pad, cfg, relu, src_extra, dst_extra)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    wt = (rng.standard_normal((cout, cin, *kernel)) / np.sqrt(cin * kernel[0] * kernel[1])).astype(np.float32)
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    params = Params(wt.reshape(cout, -1).T, b)  # the backend's layout: wt[K][Cout]
    ws = driver().mem_alloc(4 * max(1, cfg.splits * cout * n * ho * wo))
    driver().memset_d32(int(ws), NAN_BITS, max(1, cfg.splits * cout * n * ho * wo))
    tiles = -(-cout // cfg.tile.bm) * -(-n * ho * wo // cfg.tile.bn)
    counters = driver().mem_alloc(4 * tiles)
    driver().memset_d32(int(counters), 0, tiles)
    try:
        arena.put(src, x)
        before = arena.buffer(0)
        specs = conv_specs("conv", src, dst, kernel, stride, pad, relu, cfg, arena.ptr, *params.ptrs, int(ws),
                              int(counters) if fixup else None)
        assert len(specs) == (2 if cfg.splits > 1 and not fixup else 1)
        run(kernels, specs)
        ref = conv2d_bias_relu(x.astype(np.float64), wt.astype(np.float64), b.astype(np.float64), stride, pad, relu)
        check_view(arena, dst, ref)
        np.testing.assert_array_equal(arena.buffer(0), before)  # the source is read-only (NaN compares equal)
        out = arena.buffer(1)
        if fixup and cfg.splits > 1:
            left = np.empty(tiles, np.uint32)
            driver().memcpy_dtoh(left, int(counters))
            assert not left.any(), f"{np.count_nonzero(left)} tile counters not reset"
            run(kernels, specs)
            np.testing.assert_array_equal(arena.buffer(1), out)
        return out
    finally:
        arena.free()
        params.free()
        ws.free()
        counters.free()


def network_convs() -> list[ConvOp]:
    seen: dict[tuple, ConvOp] = {}
    for op in build_plan(1).conv_ops:
        seen.setdefault((op.src.channels, op.dst.channels, op.src.h, op.src.w, op.kernel, op.stride, op.pad), op)
    return list(seen.values())


@pytest.mark.parametrize("op", network_convs(), ids=lambda op: op.name)
def test_conv_every_network_shape_batch1(gpu, op):
    g, kernels = gpu
    # The direct kernel's own config for every layer: the Winograd path has its own tests (test_cuda_winograd.py).
    cfg = choose_configs(build_plan(1), g.num_sms, winograd=False)[op.name]
    conv_case(kernels, 1, op.src.channels, op.dst.channels, op.src.h, op.src.w, op.kernel, op.stride, op.pad, cfg)


def forced(tile: Tile, splits: int, k_total: int) -> ConvConfig:
    """A config with this tile and about this many K slices, whatever the cost model would pick."""
    k_split = math.ceil(math.ceil(k_total / splits) / tile.bk) * tile.bk
    return ConvConfig(tile, math.ceil(k_total / k_split), k_split, 0.0)


EDGE_CASES = [  # n, cin, cout, h, w, kernel, stride, pad, src_extra, dst_extra
    (3, 37, 70, 17, 13, (3, 3), 2, (0, 0), (5, 8), (9, 11)),
    (1, 19, 130, 9, 11, (3, 3), 1, (1, 1), (0, 3), (64, 0)),
    (2, 12, 33, 10, 9, (5, 5), 1, (2, 2), (7, 0), (0, 5)),
    (3, 24, 48, 9, 7, (1, 7), 1, (0, 3), (0, 0), (17, 1)),
    (1, 20, 65, 11, 6, (7, 1), 1, (3, 0), (2, 2), (3, 0)),
    (2, 40, 31, 5, 7, (1, 3), 1, (0, 1), (1, 0), (0, 0)),
    (3, 40, 29, 7, 5, (3, 1), 1, (1, 0), (0, 9), (4, 4)),
    (3, 100, 72, 5, 5, (1, 1), 1, (0, 0), (28, 0), (0, 56)),
    (2, 15, 40, 12, 12, (3, 3), 2, (1, 1), (0, 0), (0, 0)),
    (3, 9, 135, 7, 9, (1, 1), 1, (0, 0), (2, 1), (5, 3)),  # an M tail of 7; odd Ho*Wo
]


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.name)
@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: f"{c[5][0]}x{c[5][1]}-n{c[0]}-{c[3]}x{c[4]}")
def test_conv_edge_cases_every_tile(gpu, case, tile, splits):
    """Split-K both ways, the fixup kernel and conv_splitk_reduce, which add the slices in the same order: the
    results must agree bit for bit."""
    n, cin, cout, h, w, kernel, stride, pad, src_extra, dst_extra = case
    cfg = forced(tile, splits, cin * kernel[0] * kernel[1])
    outs = [conv_case(gpu[1], n, cin, cout, h, w, kernel, stride, pad, cfg, True, src_extra, dst_extra, fixup)
            for fixup in ((True, False) if splits > 1 else (True,))]
    np.testing.assert_array_equal(outs[0], outs[-1])


@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.name)
def test_conv_without_relu_keeps_negatives(gpu, tile):
    for splits, fixup in ((1, True), (2, True), (2, False)):
        conv_case(gpu[1], 2, 33, 45, 6, 6, (3, 3), 1, (1, 1), forced(tile, splits, 33 * 9), relu=False, fixup=fixup)


POOL_CASES = [  # n, c, h, w, kind, kernel, stride, pad, count_include_pad, src_extra, dst_extra
    (1, 64, 147, 147, "max", 3, 2, 0, True, (0, 0), (0, 0)),  # stem maxpool1
    (1, 192, 71, 71, "max", 3, 2, 0, True, (0, 0), (0, 0)),
    (3, 30, 35, 35, "max", 3, 2, 0, True, (4, 2), (480, 7)),  # Mixed_6a: into the concat buffer
    (2, 20, 17, 17, "max", 3, 2, 0, True, (0, 0), (320, 0)),
    (1, 192, 35, 35, "avg", 3, 1, 1, True, (0, 0), (0, 0)),
    (3, 24, 17, 17, "avg", 3, 1, 1, True, (8, 0), (0, 3)),
    (3, 24, 8, 8, "avg", 3, 1, 1, False, (0, 5), (2, 2)),
    (1, 7, 9, 6, "avg", 3, 1, 1, False, (0, 0), (0, 0)),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"{c[4]}-n{c[0]}-c{c[1]}-{c[2]}x{c[3]}-cip{int(c[8])}")
def test_pool(gpu, case):
    n, c, h, w, kind, k, s, p, cip, src_extra, dst_extra = case
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    arena = Arena((n, sum(src_extra) + c, h, w), (n, sum(dst_extra) + c, ho, wo))
    src, dst = arena.view(0, src_extra[0], c), arena.view(1, dst_extra[0], c)
    x = rng_for(case).standard_normal((n, c, h, w)).astype(np.float32)
    try:
        arena.put(src, x)
        run(gpu[1], [pool_spec(PoolOp("pool", src, dst, kind, k, s, p, cip), arena.ptr)])
        check_view(arena, dst, pool2d(x.astype(np.float64), kind, k, s, p, cip), tol=1e-6)
    finally:
        arena.free()


@pytest.mark.parametrize("n", [1, 3])
def test_global_avg_pool(gpu, n):
    arena = Arena((n, 2048 + 64, 8, 8), (n, 2048 + 16, 1, 1))
    src, dst = arena.view(0, 64, 2048), arena.view(1, 0, 2048)
    x = rng_for("gap", n).standard_normal((n, 2048, 8, 8)).astype(np.float32)
    try:
        arena.put(src, x)
        run(gpu[1], [gap_spec(GlobalAvgPoolOp("gap", src, dst), arena.ptr)])
        check_view(arena, dst, global_avg_pool(x.astype(np.float64)), tol=1e-6)
    finally:
        arena.free()


@pytest.mark.parametrize("n,gemm", [(1, False), (3, False), (1, True), (5, True), (32, True)])
def test_fc(gpu, n, gemm):
    g, kernels = gpu
    fin, fout = 2048, 1000
    arena = Arena((n, fin, 1, 1), (n, fout, 1, 1))
    src, dst = arena.view(0), arena.view(1)
    rng = rng_for("fc", n, gemm)
    x = rng.standard_normal((n, fin)).astype(np.float32)
    w = (rng.standard_normal((fout, fin)) / np.sqrt(fin)).astype(np.float32)
    b = rng.standard_normal(fout).astype(np.float32)
    op = FCOp("fc", src, dst)
    cfg = conv_config(fout, n, fin, g.num_sms) if gemm else None
    assert uses_gemv(op) == (n == 1)
    params = Params(w.T if gemm else w, b)
    ws = driver().mem_alloc(4 * max(1, (cfg.splits if cfg else 1) * fout * n))
    counters = driver().mem_alloc(4 * 1024)
    driver().memset_d32(int(counters), 0, 1024)
    try:
        arena.put(src, x.reshape(n, fin, 1, 1))
        run(kernels, fc_specs(op, cfg, arena.ptr, *params.ptrs, int(ws), int(counters)))
        ref = fc(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)).reshape(n, fout, 1, 1)
        check_view(arena, dst, ref)
    finally:
        arena.free()
        params.free()
        ws.free()
        counters.free()


@pytest.mark.parametrize("n", [1, 5])
def test_softmax(gpu, n):
    arena = Arena((n, 1000, 1, 1), (n, 1000, 1, 1))
    logits = arena.view(0)
    z = (30 * rng_for("softmax", n).standard_normal((n, 1000))).astype(np.float32)  # large: exp would overflow
    try:
        arena.put(logits, z.reshape(n, 1000, 1, 1))
        run(gpu[1], [softmax_spec(logits, arena.ptr, arena.ptr + 4 * arena.offsets[1])])
        zz = z.astype(np.float64)
        e = np.exp(zz - zz.max(axis=1, keepdims=True))
        check_view(arena, arena.view(1), (e / e.sum(axis=1, keepdims=True)).reshape(n, 1000, 1, 1), tol=1e-6)
    finally:
        arena.free()
