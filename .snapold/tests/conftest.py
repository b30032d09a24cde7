"""Shared fixtures. GPU tests (marked ``gpu``) skip with the reason when no GPU is usable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.build_cache import TEST_CACHE_VAR, cache_for_tests
from helpers.gpu_present import gpu_unavailable_reason


@pytest.fixture(scope="module")
def gpu():
    """(Gpu, Kernels) for kernel tests: device 0's context, current for the module, and every compiled cuda_src
    kernel (cuda_build.SOURCES) loaded through the backend's own loader."""
    from inception_engine.backends.cuda.device import Gpu
    from inception_engine.backends.cuda.kernels import Kernels

    g = Gpu()
    with g:
        yield g, Kernels(g.arch)
    g.release()


@pytest.fixture(scope="module")
def weights():
    """The model of the whole-network tests (helpers.network.network_model), on the GPU and the emulator."""
    from helpers.network import network_model

    return network_model()


@pytest.fixture
def decode_pool_kinds(monkeypatch) -> list[str]:
    """The worker kind of every decode pool the pipeline starts during the test, in order."""
    from inception_engine.ingest.workers import DecodePool

    kinds: list[str] = []
    real = DecodePool.__init__

    def spy(self, ring, pre, workers, kind="thread"):
        kinds.append(kind)
        real(self, ring, pre, workers, kind)

    monkeypatch.setattr(DecodePool, "__init__", spy)
    return kinds


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"no GPU: {reason}"))
    items[:] = run_order(items)


# Fixtures of tests/kernels/conftest.py whose first user builds them (minutes) while any other waits for the build.
SHARED_BUILDS = {"backend_emu_lib", "kernel_cubins"}


def run_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The tests marked slow first: pytest-xdist hands tests out in this order, and a long test handed out last keeps
    one worker busy after the others have finished. Of those, one that needs a shared build leads, so that the build
    starts at once, and the slow tests that need none follow it: the other workers run them meanwhile instead of
    waiting for the build. Otherwise collection order."""
    slow = [item for item in items if item.get_closest_marker("slow")]
    builds = [item for item in slow if SHARED_BUILDS & set(item.fixturenames)]
    independent = [item for item in slow if not SHARED_BUILDS & set(item.fixturenames)]
    rest = [item for item in items if not item.get_closest_marker("slow")]
    return builds[:1] + independent + builds[1:] + rest


# --- Synthetic Inception-V3 models ------------------------------------------------------------------------------
# Stable fixture names, for any test that needs a whole model without real weights:
#
#   model_cache_dir         (session) Path where generated models are kept between runs: $INCEPTION_TEST_CACHE,
#                           else the user cache's test-models/v<GENERATOR_VERSION> (build_cache.cache_for_tests:
#                           $XDG_CACHE_HOME/inception-engine, else ~/.cache/inception-engine; a temp dir if that
#                           cannot be created). Files appear atomically, so an interrupted run leaves nothing half.
#   synthetic_onnx          (session) factory: synthetic_onnx(style="torchscript" | "dynamo", transform_input=False,
#                           softmax=False, aux=False, batch=None, seed=0) -> Path of that synthetic ONNX model,
#                           generated on first use (a few seconds; ~100 MB; dynamo style with its .data file).
#   build_cache_dir         (session) Path where compiled test libraries are kept (helpers.build_cache):
#                           $INCEPTION_TEST_CACHE/builds, else the user cache's test-builds.
#   export_like_onnx        (session) Path of synthetic_onnx() named as produced by PyTorch, as torchvision's real
#                           export is: for tests that convert "the real weights" to the default places.
#   synthetic_weights_file  (session) Path of synthetic_onnx() converted to an engine weight file (.npz); its arrays
#                           equal inception_engine.synthetic.synthetic_weights(0).arrays.


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory) -> Path:
    from inception_engine.synthetic import GENERATOR_VERSION

    path = cache_for_tests("models")
    if not os.environ.get(TEST_CACHE_VAR):
        path /= f"v{GENERATOR_VERSION}"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        path = tmp_path_factory.mktemp("test-models")
    return path


@pytest.fixture(scope="session")
def build_cache_dir(tmp_path_factory) -> Path:
    """Where compiled test libraries are kept (helpers.build_cache names each by a hash of its inputs):
    $INCEPTION_TEST_CACHE/builds, else the user cache's test-builds (helpers.build_cache.cache_for_tests); else
    the run's temp root, which the workers of a parallel run share."""
    path = cache_for_tests("builds")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        path = tmp_path_factory.getbasetemp().parent / "test-builds"
        path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def synthetic_onnx(model_cache_dir):
    from inception_engine.synthetic import GENERATOR_VERSION, write_synthetic_onnx

    from helpers.build_cache import file_lock

    def make(style: str = "torchscript", transform_input: bool = False, softmax: bool = False, aux: bool = False,
             batch: int | None = None, seed: int = 0) -> Path:
        # The generator version is in the name too, for caches shared through $INCEPTION_TEST_CACHE.
        name = (f"inception_v3_g{GENERATOR_VERSION}_{style}_t{int(transform_input)}_s{int(softmax)}_a{int(aux)}"
                f"_b{batch or 'N'}_seed{seed}.onnx")
        path = model_cache_dir / name
        with file_lock(model_cache_dir / (name + ".lock")):  # parallel workers: one writes, the others wait for it
            complete = path.is_file() and (style != "dynamo" or path.with_name(name + ".data").is_file())
            if not complete:
                write_synthetic_onnx(path, style, transform_input, softmax, aux, batch, seed)
        return path

    return make


@pytest.fixture(scope="session")
def export_like_onnx(synthetic_onnx, model_cache_dir) -> Path:
    """synthetic_onnx() with the producer a torch.onnx export names ("pytorch"): the stand-in for torchvision's real
    export where a test follows its path to the default places, which the converter keeps a synthetic model out of."""
    import onnx

    from inception_engine.synthetic import GENERATOR_VERSION
    from inception_engine.weights import atomic_write

    from helpers.build_cache import file_lock

    path = model_cache_dir / f"inception_v3_g{GENERATOR_VERSION}_as_pytorch_export.onnx"
    with file_lock(model_cache_dir / (path.name + ".lock")):
        if not path.is_file():
            model = onnx.load(synthetic_onnx())
            model.producer_name, model.producer_version = "pytorch", "2.5.0"
            atomic_write(path, lambda f: f.write(model.SerializeToString()))
    return path


@pytest.fixture(scope="session")
def synthetic_weights_file(synthetic_onnx, tmp_path_factory) -> Path:
    from inception_engine.onnx_convert import convert

    return convert(synthetic_onnx(), tmp_path_factory.mktemp("weights") / "inception_v3.npz")
