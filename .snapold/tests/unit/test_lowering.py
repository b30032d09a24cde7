"""Lowering (backends/cuda/lowering.py) as the pure function it is: the real plan lowered for a few (GPU, precision,
layout) pairs on the CPU. Every op of the plan has its launches, every launch names buffers that exist and lies within
them where it points at a start, its arguments match its kernel's signature, two lowerings are the same, and resolved
with the buffers' addresses it is exactly what the layout's plan walk gives from plain addresses."""

from __future__ import annotations

import numpy as np
import pytest

from inception_engine import arch
from inception_engine.backends.cuda import device, families, kernels, tensor_maps
from inception_engine.backends.cuda.cost_model import choose_configs
from inception_engine.backends.cuda.launch import launch_specs
from inception_engine.backends.cuda.launch_nhwc import nhwc_launch_specs, nhwc_side
from inception_engine.backends.cuda.lowering import GpuFacts, Ref, lower, resolve_spec
from inception_engine.backends.cuda.params import direct_weights, op_params, pack_params
from inception_engine.backends.cuda.tiles import folds_max_pools
from inception_engine.backends.cuda.families.spec import LaunchSpec, Signature
from inception_engine.plan import build_plan, fused_plan
from inception_engine.weights import Weights

H100, A100 = GpuFacts(132, True), GpuFacts(108, False)
# (GPU, precision, NHWC, batch, softmax, fixup): the default layouts (NHWC but fp32 before sm_90a) and NCHW tf32
CASES = [(H100, "fp16", True, 8, True, False), (H100, "tf32", True, 1, False, False),
         (H100, "fp32", True, 8, False, False), (A100, "fp32", False, 8, True, True),
         (A100, "fp32", False, 1, False, False), (H100, "tf32", False, 8, False, False)]
BASES = {name: (i + 1) << 40 for i, name in enumerate(("arena", "side", "params", "ws", "probs", "counters", "maps"))}


@pytest.fixture(scope="module")
def weights() -> Weights:
    rng = np.random.default_rng(0)
    return Weights({k: rng.standard_normal(s).astype(np.float32) for k, s in arch.weight_shapes().items()}, {})


def lowered(weights, gpu, precision, nhwc, batch, softmax, fixup):
    plan = (fused_plan(batch, arch.inception_v3(), max_pools=folds_max_pools(precision)) if nhwc
            else build_plan(batch))
    configs = choose_configs(plan, gpu.num_sms, fixup, precision, True, nhwc=nhwc, wgmma=gpu.wgmma)
    params, offsets = pack_params(weights, plan, configs)
    return plan, configs, offsets, lower(plan, configs, precision, nhwc, gpu, offsets, params.size, softmax, fixup)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].num_sms}sm-{c[1]}-{'nhwc' if c[2] else 'nchw'}-{c[3]}")
def test_lowering_covers_the_plan_with_launches_of_its_kernels(weights, case):
    gpu, precision, nhwc, batch, softmax, fixup = case
    plan, configs, offsets, low = lowered(weights, *case)
    assert [op.name for op in plan.ops] == list(dict.fromkeys(s.op for s in low.specs if s.op != "softmax"))
    assert any(s.op == "softmax" for s in low.specs) == softmax
    for s in low.specs:
        k = kernels.spec(s.kernel)
        assert len(s.args) == len(k.signature.params) and s.block == k.block, s
        for (name, code), a in zip(k.signature.params, s.args):
            assert isinstance(a, Ref) == (code == "P" and a != 0), (s.kernel, name, a)  # pointers, or a null one
            if isinstance(a, Ref):
                assert a.buffer in low.words and 0 <= a.offset < 4 * max(low.words[a.buffer], 1), (s.kernel, name)
    assert {low.input.buffer, low.output.buffer} <= set(low.words)
    # the features are where the global average pool writes them, and nothing after it writes there
    gap = next(s for s in low.specs if s.kernel.startswith("global_avg_pool"))
    assert gap.arg("y", kernels.spec(gap.kernel)) == low.features
    later = low.specs[low.specs.index(gap) + 1:]
    assert all(a != low.features for s in later for (name, _), a in zip(kernels.spec(s.kernel).signature.params,
                                                                         s.args) if name == "y")
    assert ("probs" in low.words) == softmax and ("maps" in low.words) == any(s.maps for s in low.specs)
    assert lowered(weights, *case)[3] == low  # deterministic


@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: c[1])
def test_setup_splits_each_fp32_tiles_weights_once_and_nothing_else(weights, case):
    """The setup launches: on the NHWC path in fp32, one conv_nhwc_f32_split_weights per conv on an fp32 tile, over
    exactly its weight rows (a thread a piece of four float32 words), none for the first conv (its FFMA tile reads
    float32) nor in fp16 or tf32."""
    gpu, precision, nhwc, batch, softmax, fixup = case
    plan, configs, offsets, low = lowered(weights, *case)
    on_f32 = [op for op in plan.conv_ops if configs[op.name].tile.prefix == "conv_nhwc_f32_wgmma"]
    assert len(on_f32) == (len(plan.conv_ops) - 1 if precision == "fp32" else 0)
    assert [s.op for s in low.setup] == [op.name for op in on_f32]
    packed = pack_params(weights, plan, configs)[0] if on_f32 else None
    for s in low.setup:
        k = kernels.spec(s.kernel)
        w, pieces = s.arg("w", k), s.arg("pieces", k)
        assert s.kernel == "conv_nhwc_f32_split_weights" and w == Ref("params", 4 * offsets[s.op + ".weight"])
        assert s.grid[0] * s.block[0] >= pieces > (s.grid[0] - 1) * s.block[0]
        op = next(o for o in on_f32 if o.name == s.op)
        rows = direct_weights(op_params(weights, op)[0], configs[s.op].tile)
        # the pieces end where the rows do: the bias starts at the next aligned offset
        assert 4 * pieces == rows.size
        assert np.array_equal(packed[offsets[s.op + ".weight"]:][:rows.size], rows.ravel())


@pytest.mark.parametrize("case", CASES[:1] + CASES[3:4], ids=["fp16-nhwc", "fp32-nchw"])
def test_resolved_lowering_is_the_plan_walk_on_addresses(weights, case):
    gpu, precision, nhwc, batch, softmax, fixup = case
    plan, configs, offsets, low = lowered(weights, *case)
    got = [resolve_spec(s, BASES) for s in low.specs]
    probs = BASES["probs"] if softmax else None
    if nhwc:
        want = nhwc_launch_specs(plan, configs, BASES["arena"], BASES["side"], BASES["params"], offsets, BASES["ws"],
                                 probs, precision, gpu.num_sms, BASES["maps"])
        assert low.input.resolve(BASES) == BASES["side"] + 4 * nhwc_side(plan).input
    else:
        want = launch_specs(plan, configs, BASES["arena"], BASES["params"], offsets, BASES["ws"], probs,
                            BASES["counters"] if fixup else None)
    assert got == want


def test_lowering_calls_no_driver(weights, monkeypatch):
    """Pure: with every module's way to the driver cut, the fp16 NHWC forward still lowers."""
    def no_driver():
        raise AssertionError("lowering called the driver")

    for module in (device, kernels, tensor_maps):
        monkeypatch.setattr(module, "driver", no_driver)
    assert lowered(weights, *CASES[0])[3].specs


def test_arguments_are_packed_by_name_in_the_signatures_order():
    sig = Signature.of("P: x y", "i: n")
    assert sig.pack("k", {"n": 3, "y": 2, "x": 1}) == (1, 2, 3)
    with pytest.raises(ValueError, match=r"missing \['n'\], extra \['m'\]"):
        sig.pack("k", {"x": 1, "y": 2, "m": 3})
    k = kernels.spec("softmax_rows")
    s = LaunchSpec.of("softmax", k, (1, 1, 1), dict(z=5, p=6, cols=7, z_bstride=8, p_bstride=9))
    assert s.args == (5, 6, 7, 8, 9) and s.arg("cols", k) == 7


def test_the_registry_is_the_families_table():
    assert list(kernels.REGISTRY) == [s.name for s in kernels.registry(families.entries()).values()]
    owned = [s for f in families.FAMILIES for s in f.SOURCES]
    assert len(owned) == len(set(owned))  # a source belongs to one family
    assert {kernels.spec(k).source for k in kernels.all_kernel_names()} == set(owned)
    for family in families.FAMILIES:
        assert {s.source for s in family.entries()} <= set(family.SOURCES), family.__name__
