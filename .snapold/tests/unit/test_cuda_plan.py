"""The CUDA backend's planning half, which needs no GPU: kernel configs, parameter packing, launch specs.

The kernels themselves are checked on a GPU (test_cuda_kernels.py); here the numbers handed to them are: every
config covers K exactly within launch limits, every launch's arguments match its kernel's parameter list and
fit int32, pointers land on the right views and parameters.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from inception_engine import arch, backends, cuda_build
from inception_engine.backends.cuda.backend import CudaBackend
from inception_engine.backends.cuda.cost_model import MAX_SPLITS, MIN_K_SPLIT, choose_configs
from inception_engine.backends.cuda.kernels import all_kernel_names, arg_format, conv_kernel_name, source_of
from inception_engine.backends.cuda.launch import launch_specs
from inception_engine.backends.cuda.params import pack_params
from inception_engine.backends.cuda.schedule import schedule
from inception_engine.backends.cuda.tiles import (KERNEL_SIZES, PRECISIONS, TF32_TILES, THREADS, TILES, TILES_OF,
                                                  WINO_TILES)
from inception_engine.backends.cuda.tuning import (config_from_json, config_to_json, pick_fastest, tuning_candidates,
                                                   tuning_key)
from inception_engine.backends.cuda.winograd import winograd_eligible
from inception_engine.backends.cuda.workspace import counter_layout, workspace_elems, workspace_layout
from inception_engine.errors import BackendUnavailable, EngineError
from inception_engine.plan import ALIGN, ConvOp, FCOp, GlobalAvgPoolOp, PoolOp, build_plan, fuse_pointwise, writes
from inception_engine.weights import Weights

ARENA, PARAMS, WS, PROBS = 1 << 40, 1 << 41, 1 << 42, 1 << 43  # fake device addresses


@pytest.fixture(scope="module")
def weights() -> Weights:
    rng = np.random.default_rng(0)
    return Weights({k: rng.standard_normal(s).astype(np.float32) for k, s in arch.weight_shapes().items()}, {})


@pytest.mark.parametrize("num_sms", [132, 114, 8])
@pytest.mark.parametrize("batch", [1, 3, 8, 128])
def test_configs_cover_k_exactly_within_launch_limits(batch, num_sms):
    plan = build_plan(batch)
    configs = choose_configs(plan, num_sms)
    assert set(configs) == {op.name for op in plan.ops if isinstance(op, (ConvOp, FCOp))}
    for op in plan.ops:
        cfg = configs.get(op.name)
        if cfg is None or cfg.wino:  # Winograd convs: test_cuda_winograd.py
            continue
        k_total = op.src.channels * (op.kernel[0] * op.kernel[1] if isinstance(op, ConvOp) else 1)
        assert cfg.k_split % cfg.tile.bk == 0
        assert (cfg.splits - 1) * cfg.k_split < k_total <= cfg.splits * cfg.k_split, op.name
        assert 1 <= cfg.splits <= MAX_SPLITS
        assert cfg.splits == 1 or cfg.k_split >= MIN_K_SPLIT


def test_small_grids_at_batch1_are_split_to_fill_the_gpu():
    """17x17 and 8x8 layers at batch 1 (N = 289, 64) would give a handful of blocks without split-K: they get at
    least 64 blocks, or as many K slices as MIN_K_SPLIT allows."""
    plan = build_plan(1)
    configs = choose_configs(plan, 132)
    for op in plan.conv_ops:
        if op.dst.h <= 17:
            cfg = configs[op.name]
            tiles = -(-op.dst.channels // cfg.tile.bm) * -(-op.dst.h * op.dst.w // cfg.tile.bn)
            k_total = op.src.channels * op.kernel[0] * op.kernel[1]
            assert tiles * cfg.splits >= min(64, tiles * (k_total // MIN_K_SPLIT)), (op.name, cfg)


def test_fc_is_gemv_at_batch1_and_gemm_above():
    assert choose_configs(build_plan(1), 132)["fc"] is None
    assert choose_configs(build_plan(2), 132)["fc"] is not None


@pytest.mark.parametrize("batch", [1, 8])
def test_params_are_packed_in_the_kernels_layout(weights, batch):
    plan = build_plan(batch)
    configs = choose_configs(plan, 132, winograd=False)  # Winograd's U: test_cuda_winograd.py
    flat, offsets = pack_params(weights, plan, configs)
    assert flat.dtype == np.float32 and len(offsets) == len(weights.arrays)
    assert all(off % ALIGN == 0 for off in offsets.values())
    for op in plan.ops:
        if not isinstance(op, (ConvOp, FCOp)):
            continue
        w, b = weights.conv(op.name)
        m, k = w.shape[0], w[0].size
        got_w = flat[offsets[op.name + ".weight"]:][:m * k]
        if isinstance(op, FCOp) and configs["fc"] is None:
            np.testing.assert_array_equal(got_w.reshape(m, k), w)
        else:  # wt[K][M]
            np.testing.assert_array_equal(got_w.reshape(k, m).T, w.reshape(m, k))
        np.testing.assert_array_equal(flat[offsets[op.name + ".bias"]:][:m], b)


@pytest.mark.parametrize("batch,softmax", [(1, False), (8, True), (128, False)])
def test_launch_specs_match_kernel_signatures_and_views(weights, batch, softmax):
    plan = build_plan(batch)
    configs = choose_configs(plan, 132)
    _, offsets = pack_params(weights, plan, configs)
    specs = launch_specs(plan, configs, ARENA, PARAMS, offsets, WS, PROBS if softmax else None)
    kernels = set(all_kernel_names())
    for s in specs:
        assert s.kernel in kernels
        fmt = arg_format(s.kernel)
        assert len(s.args) == len(fmt), s
        for c, a in zip(fmt, s.args):
            assert isinstance(a, int) and (c != "i" or -2**31 <= a < 2**31), (s.kernel, a)
        assert s.block == (THREADS, 1, 1)
        assert 1 <= s.grid[0] < 2**31 and 1 <= s.grid[1] < 2**16 and 1 <= s.grid[2] < 2**16
    # ops in plan order, each with its launches, then the softmax
    names = [s.op for s in specs]
    assert list(dict.fromkeys(names)) == [op.name for op in plan.ops] + (["softmax"] if softmax else [])
    by_op = {op.name: op for op in plan.ops}
    ws_offsets = workspace_layout(plan, configs)[1]
    for s in specs:
        op = by_op.get(s.op)
        if isinstance(op, ConvOp) and s.kernel.startswith("conv_") and s.kernel != "conv_splitk_reduce":
            x, w, b, y = s.args[:4]
            assert x == ARENA + 4 * (op.src.offset + op.src.c_offset * op.src.h * op.src.w)
            assert w == PARAMS + 4 * offsets[op.name + ".weight"] and b == PARAMS + 4 * offsets[op.name + ".bias"]
            split = configs[op.name].splits > 1
            dst = ARENA + 4 * (op.dst.offset + op.dst.c_offset * op.dst.h * op.dst.w)
            assert y == (WS + 4 * ws_offsets[op.name] if split else dst)
            assert s.args[4:9] == (batch, op.src.channels, op.src.h, op.src.w, op.src.c_total * op.src.h * op.src.w)
            assert s.kernel == f"conv_{op.kernel[0]}x{op.kernel[1]}_{configs[op.name].tile.name}"
            assert s.args[-1] == 1  # ReLU on every conv
        elif s.kernel == "conv_splitk_reduce":
            assert s.args[2] == ARENA + 4 * (op.dst.offset + op.dst.c_offset * op.dst.h * op.dst.w)
        elif isinstance(op, PoolOp):
            assert s.args[-2:] == (int(op.kind == "max"), int(op.count_include_pad))
        elif isinstance(op, GlobalAvgPoolOp):
            assert s.grid[0] * THREADS // 32 >= batch * 2048
    ws_need, ws_offsets = workspace_layout(plan, configs)
    for op in plan.conv_ops:
        cfg = configs[op.name]
        if cfg.splits > 1:
            assert ws_offsets[op.name] + cfg.splits * op.dst.channels * batch * op.dst.h * op.dst.w <= ws_need
    if softmax:
        assert specs[-1].kernel == "softmax_rows" and specs[-1].args[1] == PROBS


def test_unsupported_kernel_size_is_one_clear_line():
    layers = [arch.Conv("odd", arch.INPUT, 3, 8, (2, 2)), arch.GlobalAvgPool("gap", "odd"),
              arch.FC("fc", "gap", 8, 4)]
    with pytest.raises(EngineError, match="no CUDA kernel for a 2x2 convolution"):
        choose_configs(build_plan(1, layers), 132)


def test_unavailable_without_pycuda_is_one_line():
    try:
        import pycuda.driver  # noqa: F401  (only whether it imports)
    except ImportError:
        ok, why = backends.is_available("cuda")
        assert not ok and "pycuda" in why and "\n" not in why
    else:
        pytest.skip("pycuda is installed here")


def test_graph_without_driver_is_one_line():
    from inception_engine import cuda_graph

    try:
        cuda_graph.libcuda()
    except BackendUnavailable as e:
        assert "libcuda.so.1" in str(e) and "\n" not in str(e)
    else:
        pytest.skip("the CUDA driver is installed here")


def view_ranges(v) -> list[tuple[int, int]]:
    """Arena element ranges [a, b) a view covers: one run of channels * H * W per image."""
    hw = v.h * v.w
    return [(v.offset + (n * v.c_total + v.c_offset) * hw, v.offset + (n * v.c_total + v.c_offset + v.channels) * hw)
            for n in range(v.n)]


def clash(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(x0 < y1 and y0 < x1 for x0, x1 in a for y0, y1 in b)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_concurrent_schedule_orders_every_memory_conflict(batch, fused):
    """Independently of the names the scheduler reasons with: any two ops of one stage whose arena or split-K
    workspace ranges overlap, one of them writing, must be ordered by stream order or event waits (transitively).
    Ops of different stages are ordered by the join at each stage's end. fused: with the 1x1 convs of each module
    as one op writing several views (plan.fuse_pointwise)."""
    plan = build_plan(batch, concurrent=True)
    plan = fuse_pointwise(plan) if fused else plan
    assert plan.concurrent and len(plan.stages) == len(plan.ops)
    configs = choose_configs(plan, 132)
    _, ws_offsets = workspace_layout(plan, configs)
    sched = schedule(plan)
    reads, written = [], []
    for op in plan.ops:
        w = [r for v in writes(op) for r in view_ranges(v)]
        cfg = configs.get(op.name)
        if cfg is not None and workspace_elems(op, cfg):  # the workspace, as a range far above the arena
            base = plan.arena_elems + ws_offsets[op.name]
            w.append((base, base + workspace_elems(op, cfg)))
        reads.append(view_ranges(op.src))
        written.append(w)
    before: dict[int, set[int]] = {}  # op -> ops of its stage that finish before it starts
    last_on: dict[tuple[int, int], int] = {}
    for i, s in enumerate(sched):
        prev = last_on.get((plan.stages[i], s.stream))
        direct = set(s.waits) | ({prev} if prev is not None else set())
        assert all(plan.stages[j] == plan.stages[i] for j in direct)
        before[i] = set().union(direct, *(before[j] for j in direct))
        last_on[(plan.stages[i], s.stream)] = i
    conflicts = 0
    for i in range(len(plan.ops)):
        for j in range(i):
            if plan.stages[i] != plan.stages[j]:
                continue
            if clash(written[i], written[j]) or clash(written[i], reads[j]) or clash(reads[i], written[j]):
                conflicts += 1
                assert j in before[i], f"{plan.ops[j].name} and {plan.ops[i].name} may run at once"
    assert conflicts > 0  # the branch chains themselves
    streams = max(s.stream for s in sched) + 1
    assert streams >= 4, "every module's branches should run side by side"


@pytest.mark.parametrize("batch", [1, 8])
def test_concurrent_plan_never_shares_memory_within_a_stage(batch):
    plan = build_plan(batch, concurrent=True)
    stage_of = {}
    for i, op in enumerate(plan.ops):
        for v in (op.src, op.dst):
            stage_of.setdefault(v.buffer, set()).add(plan.stages[i])
    bufs = list(plan.buffers.values())
    for a in bufs:
        for b in bufs:
            if a.name < b.name and stage_of.get(a.name, set()) & stage_of.get(b.name, set()):
                assert a.offset + a.elems <= b.offset or b.offset + b.elems <= a.offset, (a.name, b.name)
    # reuse still works across stages: far below one buffer per tensor
    assert plan.arena_elems < build_plan(batch, reuse=False).arena_elems / 2


@pytest.mark.parametrize("num_sms", [132, 8])
@pytest.mark.parametrize("batch", [1, 3, 8, 128])
def test_tf32_uses_only_tensor_core_kernels_and_reduces_split_k_separately(weights, batch, num_sms):
    """precision="tf32": every direct conv and the FC-as-GEMM on a conv_tf32 tile, K slices multiples of its BK of
    16, and split-K through conv_splitk_reduce (conv_tf32.cu has no _fixup kernels), even when fixup is asked for.
    (Winograd, which stays FFMA in every precision, is off here: test_cuda_winograd.py covers it with tf32.)"""
    plan = build_plan(batch)
    configs = choose_configs(plan, num_sms, fixup=True, precision="tf32", winograd=False)
    assert set(configs) == {op.name for op in plan.ops if isinstance(op, (ConvOp, FCOp))}
    assert (configs["fc"] is None) == (batch == 1)
    for op in plan.ops:
        cfg = configs.get(op.name)
        if cfg is None:
            continue
        assert cfg.tile in TF32_TILES and not cfg.tile.fixup, op.name
        k_total = op.src.channels * (op.kernel[0] * op.kernel[1] if isinstance(op, ConvOp) else 1)
        assert cfg.k_split % 16 == 0 and (cfg.splits - 1) * cfg.k_split < k_total <= cfg.splits * cfg.k_split
        assert cfg.splits == 1 or cfg.k_split >= MIN_K_SPLIT
    assert counter_layout(plan, configs) == (0, {})
    _, offsets = pack_params(weights, plan, configs)
    specs = launch_specs(plan, configs, ARENA, PARAMS, offsets, WS, counters=1 << 44)
    kernels = set(all_kernel_names())
    gemms = [s for s in specs if s.kernel.startswith("conv_") and s.kernel != "conv_splitk_reduce"]
    assert gemms and all(s.kernel.startswith("conv_tf32_") and not s.kernel.endswith("_fixup") for s in gemms)
    assert all(s.kernel in kernels and len(s.args) == len(arg_format(s.kernel)) for s in specs)
    assert all(source_of(s.kernel) == "conv_tf32.cu" for s in gemms)
    reduces = {s.op for s in specs if s.kernel == "conv_splitk_reduce"}
    assert reduces == {name for name, cfg in configs.items() if cfg is not None and cfg.splits > 1}
    if batch == 1:
        assert reduces, "batch 1 should split K somewhere"


def test_fp32_never_picks_tf32_kernels_and_names_are_distinct():
    configs = choose_configs(build_plan(8), 132)
    assert all(c.tile in TILES + WINO_TILES for c in configs.values() if c is not None)
    names = all_kernel_names()
    assert len(names) == len(set(names))
    tf32 = [n for n in names if n.startswith("conv_tf32_")]
    assert len(tf32) == len(KERNEL_SIZES) * len(TF32_TILES) == 21
    assert conv_kernel_name((1, 7), TF32_TILES[1]) == "conv_tf32_1x7_128x64"
    assert source_of("conv_3x3_64x64_fixup") == "conv.cu" and source_of("conv_tf32_3x3_64x64") == "conv_tf32.cu"


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_unknown_precision_is_one_clear_line(weights, precision):
    with pytest.raises(EngineError, match=f"no '{precision}' mode; choose one of fp32, tf32, fp16, int8") as e:
        CudaBackend(weights, build_plan(1), precision=precision)
    assert "\n" not in str(e.value)
    with pytest.raises(EngineError, match="choose one of fp32, tf32, fp16, int8"):
        choose_configs(build_plan(1), 132, precision=precision)
    assert CudaBackend.PRECISIONS == ("fp32", "tf32", "fp16", "int8")


def test_fp16_uses_the_f16_kernels():
    configs = choose_configs(build_plan(8), 132, precision="fp16")
    prefixes = {c.tile.prefix for c in configs.values() if c is not None and not c.wino}
    assert prefixes == {"conv_f16"}
    assert source_of("conv_f16_3x3_64x64") == "conv_f16.cu"
    assert all(source_of(name) in cuda_build.SOURCES for name in all_kernel_names())


# --- measured tuning (tune_configs): the planning half ---------------------------------------------------------------


@pytest.mark.parametrize("precision", PRECISIONS)
def test_tuning_candidates_are_one_set_per_tile_and_one_winograd_set(precision):
    plan = build_plan(4)
    sets = tuning_candidates(plan, 132, False, precision, winograd=True)
    tiles = TILES_OF[precision]
    assert len(sets) == len(tiles) + 1
    for tile, configs in zip(tiles, sets):
        assert all(c.tile == tile and not c.wino for op in plan.conv_ops for c in [configs[op.name]])
    assert {op.name for op in plan.conv_ops if sets[-1][op.name].wino} == \
        {op.name for op in plan.conv_ops if winograd_eligible(op)}
    assert len(tuning_candidates(plan, 132, False, precision, winograd=False)) == len(tiles)


def test_pick_fastest_takes_each_ops_fastest_set_and_keeps_the_rest():
    plan = build_plan(4)
    default = choose_configs(plan, 132, precision="fp16", winograd=None)
    sets = tuning_candidates(plan, 132, False, "fp16", winograd=True)
    rng = np.random.default_rng(1)
    times = [{op.name: float(rng.uniform(1, 2)) for op in plan.conv_ops} for _ in sets]
    best = pick_fastest(default, sets, times)
    for op in plan.conv_ops:
        fastest = min(range(len(sets)), key=lambda i: times[i][op.name])
        assert best[op.name] == sets[fastest][op.name]
    assert best["fc"] == default["fc"]  # not timed: unchanged


class NoContextDevice:
    """A pycuda Device whose attributes answer and whose primary context must not be retained."""

    count = staticmethod(lambda: 1)

    def __init__(self, index: int):
        self.index = index

    def name(self) -> str:
        return "FAKE H100"

    def compute_capability(self) -> tuple[int, int]:
        return 9, 0

    def get_attribute(self, attribute: str) -> int:
        assert attribute == "sms"
        return 132

    def retain_primary_context(self):
        raise AssertionError("a context was created to read the device's facts")


class NoContextDriver:
    Device = NoContextDevice
    Error = RuntimeError

    class device_attribute:  # noqa: N801 (pycuda's name)
        MULTIPROCESSOR_COUNT = "sms"

    @staticmethod
    def init() -> None:
        pass


def test_cached_tuning_is_found_without_a_cuda_context(monkeypatch, tmp_path):
    """tune_configs reads the device's name and SM count for its cache key without retaining the primary context:
    retained and released at once, the context would be created and destroyed before the backend creates it again."""
    from inception_engine.backends.cuda import backend as backend_module
    from inception_engine.backends.cuda import device as device_module
    from inception_engine.backends.cuda.tuning import tuning_cache_dir, tuning_key

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(device_module, "driver", lambda: NoContextDriver)
    plan = build_plan(4)
    arch_ = cuda_build.target((9, 0))
    configs = choose_configs(plan, 132, precision="fp16", winograd=None)
    path = tuning_cache_dir() / f"{tuning_key('FAKE H100', arch_, 132, plan, 'fp16', False, True, False)}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({name: config_to_json(c) for name, c in configs.items()}))
    got, source = backend_module.tune_configs(Weights({}, {}), plan, "fp16", measure=False)
    assert source == "cache" and {k: config_to_json(v) for k, v in got.items()} == \
        {k: config_to_json(v) for k, v in configs.items()}


def test_tuned_configs_survive_json_and_the_key_sees_what_matters():
    plan = build_plan(4)
    for configs in tuning_candidates(plan, 132, False, "fp32", winograd=True):
        for cfg in configs.values():
            back = config_from_json(config_to_json(cfg))
            assert back is None if cfg is None else (back.tile, back.splits, back.k_split, back.wino) == \
                (cfg.tile, cfg.splits, cfg.k_split, cfg.wino)
    key = tuning_key("H100", "sm_90", 132, plan, "fp16", False, True)
    assert key == tuning_key("H100", "sm_90", 132, plan, "fp16", False, None)  # both let Winograd compete
    others = [tuning_key("H200", "sm_90", 132, plan, "fp16", False, True),
              tuning_key("H100", "sm_90", 114, plan, "fp16", False, True),
              tuning_key("H100", "sm_90", 132, build_plan(8), "fp16", False, True),
              tuning_key("H100", "sm_90", 132, plan, "tf32", False, True),
              tuning_key("H100", "sm_90", 132, plan, "fp16", False, False)]
    assert len({key, *others}) == 6
