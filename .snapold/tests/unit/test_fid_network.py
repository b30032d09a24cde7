"""The FID network as pytorch-fid publishes it, as data (arch.NETWORKS["fid"]) and on the CPU backends."""

from __future__ import annotations

import numpy as np
import pytest

from inception_engine import arch
from inception_engine.backends import cpu_kernels
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.backends.numpy_primitives import conv2d_bias_relu, fc, global_avg_pool, pool2d
from inception_engine.plan import build_plan

from helpers.random_weights import random_weights


def test_the_fid_network_differs_from_torchvision_where_pytorch_fid_does():
    tv, fid = arch.inception_v3(), arch.inception_v3(network="fid")
    pools = {l.name: l for l in fid if isinstance(l, arch.Pool) and l.pad}
    assert {n for n, l in pools.items() if l.kind == "avg"} == {
        f"{m}.avg_pool" for m in ("Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e",
                                  "Mixed_7b")}
    assert not any(l.count_include_pad for l in pools.values() if l.kind == "avg")  # FIDInceptionA/C/E_1
    last = pools["Mixed_7c.max_pool"]  # FIDInceptionE_2: F.max_pool2d(x, 3, stride=1, padding=1)
    assert (last.kind, last.kernel, last.stride, last.pad, last.src) == ("max", 3, 1, 1, "Mixed_7b")
    assert fid[-1] == arch.FC("fc", "avgpool", 2048, 1008) and tv[-1].out_features == 1000
    # everything else as torchvision's: the same convs and weights but the classifier's rows
    assert [(c.name, c.in_ch, c.out_ch, c.kernel, c.stride, c.pad) for c in arch.conv_layers(fid)] == \
        [(c.name, c.in_ch, c.out_ch, c.kernel, c.stride, c.pad) for c in arch.conv_layers(tv)]
    shapes = arch.weight_shapes(fid)
    assert shapes["fc.weight"] == (1008, 2048) and {k: v for k, v in shapes.items() if not k.startswith("fc.")} == \
        {k: v for k, v in arch.weight_shapes(tv).items() if not k.startswith("fc.")}


def walk(weights, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The FID network layer by layer from the architecture's list, float64 primitives: an independent walk."""
    acts = {arch.INPUT: x}
    for l in weights.layers():
        if isinstance(l, arch.Conv):
            w, b = weights.conv(l.name)
            acts[l.name] = conv2d_bias_relu(acts[l.src], w.astype(np.float64), b.astype(np.float64), l.stride, l.pad)
        elif isinstance(l, arch.Pool):
            acts[l.name] = pool2d(acts[l.src], l.kind, l.kernel, l.stride, l.pad, l.count_include_pad)
        elif isinstance(l, arch.Concat):
            acts[l.name] = np.concatenate([acts[s] for s in l.srcs], axis=1)
        elif isinstance(l, arch.GlobalAvgPool):
            acts[l.name] = global_avg_pool(acts[l.src]).reshape(len(x), -1)
        else:
            acts[l.name] = fc(acts[l.src], weights.arrays["fc.weight"].astype(np.float64),
                              weights.arrays["fc.bias"].astype(np.float64))
    return acts["fc"], acts["avgpool"]


@pytest.mark.parametrize("native", [False, True])
def test_cpu_backend_runs_the_fid_network_against_float64(native):
    if native and cpu_kernels.library() is None:
        pytest.skip(f"the C kernels are unavailable: {cpu_kernels.unavailable_reason()}")
    weights = random_weights(seed=4, network="fid")
    plan = build_plan(2, weights.layers(), input_size=139)
    x = np.random.default_rng(5).uniform(-1, 1, plan.input.dims)
    ref_logits, ref_feats = walk(weights, x)
    ref64 = NumpyBackend(weights, plan, dtype=np.float64).forward(x, features=True)
    np.testing.assert_allclose(ref64[0], ref_logits, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ref64[1], ref_feats, rtol=1e-9, atol=1e-9)
    logits, feats = NumpyBackend(weights, plan, native=native).forward(x.astype(np.float32), features=True)
    assert logits.shape == (2, 1008) and feats.shape == (2, 2048)
    for got, ref in ((logits, ref_logits), (feats, ref_feats)):
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-4
    # the variant matters: torchvision's pools on the same weights give other features
    tv = random_weights(seed=4)
    tv.arrays["fc.weight"], tv.arrays["fc.bias"] = weights.arrays["fc.weight"][:1000], weights.arrays["fc.bias"][:1000]
    other = NumpyBackend(tv, build_plan(2, tv.layers(), input_size=139), dtype=np.float64).forward(x, features=True)
    assert np.linalg.norm(other[1] - ref_feats) / np.linalg.norm(ref_feats) > 1e-3
