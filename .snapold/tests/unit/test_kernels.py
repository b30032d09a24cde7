"""The kernel registry (backends/cuda/kernels.py) as the launches use it, without a GPU: every launch of the NCHW and
NHWC forwards, over precisions and tiles, has its kernel's block and a dynamic shared memory within what the kernel
is allowed at load (its spec's ``max_shared``, opted in past 48 KB), and ``Kernels`` opts in exactly the kernels
that need it. The C side of the registry is tests/kernels/test_kernel_signatures.py's."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from inception_engine import arch
from inception_engine.backends.cuda import kernels
from inception_engine.backends.cuda.cost_model import ConvConfig, choose_configs
from inception_engine.backends.cuda.kernels import SHARED_WITHOUT_OPT_IN, ConvShared, Kernels, spec
from inception_engine.backends.cuda.launch import LaunchSpec, launch_specs
from inception_engine.backends.cuda.launch_nhwc import nhwc_launch_specs
from inception_engine.backends.cuda.params import pack_params
from inception_engine.backends.cuda.tiles import MAX_SHARED_BYTES, NHWC_ELEMS, folds_max_pools, tile_fits
from inception_engine.errors import EngineError
from inception_engine.plan import ConvOp, build_plan, fused_plan
from inception_engine.weights import Weights

ARENA, SIDE, PARAMS, WS, PROBS, MAPS = (1 << b for b in range(40, 46))  # fake device addresses


@pytest.fixture(scope="module")
def weights() -> Weights:
    rng = np.random.default_rng(0)
    return Weights({k: rng.standard_normal(s).astype(np.float32) for k, s in arch.weight_shapes().items()}, {})


def on_tile(op: ConvOp, tile) -> ConvConfig:
    k = op.src.channels * op.kernel[0] * op.kernel[1]
    return ConvConfig(tile, 1, math.ceil(k / tile.bk) * tile.bk, 0.0)


def assert_from_registry(specs: list[LaunchSpec]) -> set[str]:
    for s in specs:
        k = spec(s.kernel)
        assert s.block == k.block, s
        assert 0 <= s.shared <= k.max_shared <= MAX_SHARED_BYTES, s
        assert s.shared == k.max_shared or isinstance(k.shared, ConvShared), s
    return {s.kernel for s in specs}


@pytest.mark.parametrize("precision", ["fp16", "fp32", "tf32"])
def test_a_weight_beyond_fp16s_range_is_refused_where_the_tensor_cores_take_fp16(weights, precision):
    """fp16's tiles and fp32's (three fp16 products a product) take fp16 operands: a weight past 65504 would become
    an infinity, so the packing refuses it in one line naming the layer; tf32's TF32 operands have float32's range."""
    plan = fused_plan(8, arch.inception_v3(), max_pools=folds_max_pools(precision))
    configs = choose_configs(plan, 132, False, precision, False, nhwc=True, wgmma=True)
    big = {**weights.arrays, "Conv2d_2a_3x3.weight": weights.arrays["Conv2d_2a_3x3.weight"].copy()}
    big["Conv2d_2a_3x3.weight"][3, 1, 2, 0] = -70000.0
    if precision == "tf32":
        pack_params(Weights(big, {}), plan, configs)
        return
    with pytest.raises(EngineError, match=r"^Conv2d_2a_3x3: a weight of magnitude 70000 is beyond fp16's range"):
        pack_params(Weights(big, {}), plan, configs)
    pack_params(weights, plan, configs)  # N(0, 1) weights are far inside it


@pytest.mark.parametrize("precision", ["fp16", "tf32", "fp32"])
def test_every_nhwc_launch_has_its_kernels_block_and_shared_memory(weights, precision):
    """Each NHWC tile on every conv it computes (batch 8; the first conv on its input kernel)."""
    plan = fused_plan(8, arch.inception_v3(), max_pools=folds_max_pools(precision))
    base = choose_configs(plan, 132, False, precision, False, nhwc=True, wgmma=True)
    _, offsets = pack_params(weights, plan, base)  # where the weights are does not matter here
    launched: set[str] = set()
    for tile in NHWC_ELEMS[precision].tiles(wgmma=True):
        configs = {**base, **{op.name: on_tile(op, tile) for op in plan.conv_ops
                              if op.src.buffer != plan.input.buffer and tile_fits(op, tile)}}
        launched |= assert_from_registry(nhwc_launch_specs(plan, configs, ARENA, SIDE, PARAMS, offsets, WS, PROBS,
                                                           precision, 132, MAPS))
    assert {f"{t.prefix}_{t.name}" for t in NHWC_ELEMS[precision].tiles(wgmma=True)} <= launched
    by_conv = {k for k in launched if isinstance(spec(k).shared, ConvShared)}  # the halo tiles, the input-mma conv
    assert len(by_conv) == (0 if precision == "fp32" else 6), by_conv


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize("batch", [1, 8])
def test_every_nchw_launch_has_its_kernels_block(weights, precision, batch):
    plan = build_plan(batch)
    configs = choose_configs(plan, 132, True, precision, True)
    _, offsets = pack_params(weights, plan, configs)
    launched = assert_from_registry(launch_specs(plan, configs, ARENA, PARAMS, offsets, WS, PROBS, 1 << 46))
    assert all(spec(k).max_shared == 0 for k in launched)  # the NCHW kernels' shared memory is static


def test_kernels_opt_in_exactly_past_48_kb(monkeypatch):
    """Kernels sets MAX_DYNAMIC_SHARED_SIZE_BYTES to the spec's max_shared where it passes 48 KB, and leaves the
    others at the default."""
    set_to: dict[str, int] = {}

    class Function:
        def __init__(self, name: str):
            self.name = name

        def prepare(self, fmt: str) -> None:
            assert fmt == spec(self.name).arg_format

        def set_attribute(self, attribute: str, value: int) -> None:
            assert attribute == "max dynamic shared"
            set_to[self.name] = value

    monkeypatch.setattr(kernels, "driver", lambda: SimpleNamespace(
        function_attribute=SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES="max dynamic shared")))
    loaded = Kernels("sm_90", units=())
    module = SimpleNamespace(get_function=Function)
    loaded._modules = {unit: module for unit in {spec(k).unit for k in kernels.all_kernel_names()}}
    names = kernels.all_kernel_names()
    assert all(loaded[k].name == k for k in names)
    want = {k: spec(k).max_shared for k in names if spec(k).max_shared > SHARED_WITHOUT_OPT_IN}
    assert set_to == want
    assert any(k.startswith("conv_nhwc_halo_") for k in want) and any("_ws_" in k for k in want)
    assert "conv_input_mma_nhwc" not in want and "conv_nhwc_128x128" not in want
