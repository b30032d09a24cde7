"""The Python API: batching (full and partial batches), order of results, probabilities, errors per image."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from inception_engine import backends, multi_gpu
from inception_engine.backends import cpu_kernels
from inception_engine.backends.numpy_backend import NumpyBackend
from inception_engine.config import NO_GPU_NOTE, EngineConfig, RunConfig, resolve
from inception_engine.engine import Engine, EngineFacts, softmax
from inception_engine.errors import BackendUnavailable, EngineError, OptionError, WeightsError
from inception_engine.ingest.images import load_image
from inception_engine.labels import NUMBERED_NOTE, imagenet_labels
from inception_engine.pipeline import labelled
from inception_engine.plan import build_plan

from helpers.cli import cpu_notes
from helpers.random_weights import random_weights, write_random_weights


@pytest.fixture(scope="module")
def weights():
    return random_weights(seed=1)


def reference_logits(weights, x: np.ndarray) -> np.ndarray:
    """float64 NumPy forward, one image at a time (so batching in the engine cannot hide in it)."""
    backend = NumpyBackend(weights, build_plan(1, weights.layers()), dtype=np.float64)
    return np.concatenate([backend.forward(x[i:i + 1].astype(np.float64)) for i in range(len(x))])


def images(n: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (300 + 10 * i, 340, 3), dtype=np.uint8)) for i in range(n)]


def test_forward_full_and_partial_batches_match_reference(weights):
    x = np.stack([load_image(im) for im in images(4)])
    with Engine(weights, backend="cpu", batch_size=3) as engine:
        got = engine.forward(x)
        assert sorted(engine._backends) == [1, 3]  # one full batch of 3, a partial batch of 1 with its own plan
    ref = reference_logits(weights, x)
    assert got.shape == (4, 1000) and got.dtype == np.float32
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
    assert not np.allclose(ref[0], ref[1], rtol=1e-3)  # rows differ, so a mixed-up order would show


def test_predict_keeps_order_reports_bad_images_and_matches_softmax(weights, tmp_path):
    ims = images(3, seed=5)
    good = tmp_path / "good.png"
    ims[0].save(good)
    bad = tmp_path / "bad.jpg"
    bad.write_text("not an image")
    sources = [good, bad, ims[1], tmp_path / "missing.png", ims[2]]
    with Engine(weights, backend="cpu", batch_size=2) as engine:
        done = []
        preds = engine.predict(sources, top_k=4, on_progress=done.append)
    assert sum(done) == len(sources)
    assert [p.ok for p in preds] == [True, False, True, False, True]
    assert preds[0].image == str(good) and preds[2].image == "<PIL.Image 2>"
    assert "not an image" in preds[1].error and str(bad) in preds[1].error
    assert "no such file" in preds[3].error

    x = np.stack([load_image(im) for im in (ims[0], ims[1], ims[2])])
    probs = softmax(reference_logits(weights, x))
    labels = imagenet_labels()
    for p, row in zip([preds[0], preds[2], preds[4]], probs):
        want = np.argsort(-row, kind="stable")[:4]
        assert [i for i, _, _ in p.top] == list(want)
        assert [l for _, l, _ in p.top] == [labels[i] for i in want]
        np.testing.assert_allclose([q for _, _, q in p.top], row[want], rtol=1e-4)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_predict_iter_renders_the_lines_of_its_predictions(weights, tmp_path, fmt):
    """render="jsonl" / "csv": each classified image comes as its line (output.Rendered), the bytes ResultFile
    writes for the Prediction that would have come instead; an unreadable file stays that Prediction."""
    from inception_engine.output import Rendered, render

    ims = images(5, seed=6)
    paths = []
    for i, im in enumerate(ims):
        paths.append(tmp_path / f"{i}.png")
        im.save(paths[-1])
    (tmp_path / "bad.jpg").write_text("not an image")
    paths.insert(2, tmp_path / "bad.jpg")
    with Engine(weights, backend="cpu", batch_size=2) as engine:
        preds = list(engine.predict_iter(paths, 3))
        lines = list(engine.predict_iter(paths, 3, render=fmt))
    assert [type(x) for x in lines] == [Rendered, Rendered, type(preds[2]), Rendered, Rendered, Rendered]
    assert lines[2] == preds[2] and not preds[2].ok
    assert [x.image for x in lines] == [p.image for p in preds]
    assert [x.line for x in lines if isinstance(x, Rendered)] == [
        r.line for r in render([p for p in preds if p.ok], fmt, 3)]


def test_closing_predict_iter_closes_the_pipeline_at_once(weights, monkeypatch):
    """inception-run closes its prediction stream inside the engine's with-block: the pipeline generator (its decode
    workers, the runner) must end then, even while something else still refers to it (a reference cycle, on the GPU
    path: it was left to the garbage collector, which closed it after the backend and printed an ignored
    EngineError's traceback; H100, session 7), not when it is collected."""
    import inception_engine.engine as engine_module

    held = []

    def classify(*args, **kwargs):
        g = real(*args, **kwargs)
        held.append(g)
        return g

    real = engine_module.classify
    monkeypatch.setattr(engine_module, "classify", classify)
    with Engine(weights, backend="cpu", batch_size=1) as engine:
        preds = engine.predict_iter(images(3, seed=7), top_k=1)
        assert next(preds).ok
        preds.close()
        assert held and held[0].gi_frame is None, "the pipeline generator is still open"


def test_softmax_is_stable_and_normalised():
    logits = np.array([[1000.0, 1001.0, 999.0], [0.0, 0.0, 0.0]], np.float32)
    p = softmax(logits)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    e = np.exp([-1.0, 0.0, -2.0])
    np.testing.assert_allclose(p[0], e / e.sum())
    np.testing.assert_allclose(p[1], 1 / 3)


def test_weights_from_path(tmp_path):
    path = write_random_weights(tmp_path / "w.npz", seed=2)
    with Engine(path, backend="cpu", batch_size=1) as engine:
        assert engine.weights.path == path and engine.backend_name == "cpu"


def test_no_weights_found_says_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("INCEPTION_WEIGHTS", raising=False)
    with pytest.raises(WeightsError, match="inception-convert-weights"):
        Engine(None, backend="cpu")


def test_bad_arguments_are_engine_errors_worded_for_python(weights):
    with pytest.raises(OptionError, match=r"^backend='tpu': choose one of auto, cpu, cuda, cudnn, torch$"):
        Engine(weights, backend="tpu")
    with pytest.raises(OptionError, match=r"^batch_size=0: must be at least 1$"):
        Engine(weights, backend="cpu", batch_size=0)
    engine = Engine(weights, backend="cpu")
    with pytest.raises(OptionError, match=r"^top_k=0: must be between 1 and 1000$") as e:
        engine.predict([], top_k=0)
    assert e.value.as_flag() == "--top-k 0: must be between 1 and 1000"  # the CLI's wording of the same
    with pytest.raises(OptionError, match=r"^weights='/nonexistent/w.npz': no such file \(inception-convert-weights"):
        Engine("/nonexistent/w.npz", backend="cpu")
    with pytest.raises(EngineError, match="shape"):
        engine.forward(np.zeros((2, 3, 224, 224), np.float32))
    assert engine.predict([], top_k=5) == []


@pytest.mark.parametrize("name", ["cuda", "cudnn", "torch"])
def test_unavailable_backend_is_one_clear_line(weights, name):
    ok, reason = backends.is_available(name)
    if ok:
        pytest.skip(f"{name} is usable here")
    with pytest.raises(BackendUnavailable) as e:
        Engine(weights, backend=name)
    assert str(e.value) == reason and name in reason and "\n" not in reason


def test_auto_picks_cpu_without_a_gpu(weights):
    if backends.is_available("cuda")[0]:
        pytest.skip("a GPU is usable here; auto means cuda")
    engine = Engine(weights, backend="auto")
    assert (engine.backend_name, engine.precision, engine.batch_size) == ("cpu", "fp32", 8)
    assert engine.notes == ["no usable GPU: running on the CPU", *cpu_notes()]



def test_the_cpu_backend_says_when_it_runs_its_numpy_code(weights, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "load", lambda: (None, "the CPU lacks AVX-512F or FMA"))
    notes = Engine(weights, backend="cpu").notes
    assert notes == ["the CPU backend's C kernels are unavailable (the CPU lacks AVX-512F or FMA): it runs its NumPy "
                     "code, about half their speed"]
    monkeypatch.setattr(cpu_kernels, "load", lambda: (object(), None))
    assert Engine(weights, backend="cpu").notes == []


def no_gpu(monkeypatch) -> None:
    """As on a machine without a usable GPU, wherever the test runs."""
    real = backends.is_available
    monkeypatch.setattr(backends, "is_available", lambda name: (False, "no GPU") if name != "cpu" else real(name))


@pytest.mark.parametrize("backend", ["auto", "cpu"])
@pytest.mark.parametrize("precision", ["tf32", "fp16"])
def test_a_precision_the_backend_lacks_is_refused_not_replaced(weights, monkeypatch, backend, precision):
    no_gpu(monkeypatch)
    with pytest.raises(OptionError) as e:
        Engine(weights, backend=backend, precision=precision)
    where = " (no usable GPU here)" if backend == "auto" else ""
    assert str(e.value) == (f"precision={precision!r}: the cpu backend{where} computes in fp32 only; give fp32, "
                            f"or auto")
    assert "--" not in str(e.value)  # worded for Python; the CLI names its flag (as_flag)


def test_auto_precision_picks_per_backend(weights, monkeypatch):
    no_gpu(monkeypatch)
    assert Engine(weights, precision="auto").precision == "fp32"
    monkeypatch.setattr(backends, "backend_class", lambda name: type("Tf32Backend", (), {"PRECISIONS": ("fp32", "tf32",
                                                                                                        "fp16")}))
    assert Engine(weights, backend="cudnn", precision="auto").precision == "tf32"
    assert Engine(weights, backend="cudnn", precision="fp16").precision == "fp16"


def test_backend_name_and_precision_are_read_only_and_results_record_them(weights):
    with Engine(weights, backend="cpu", batch_size=2) as engine:
        with pytest.raises(AttributeError):
            engine.precision = "fp16"  # type: ignore[misc]
        with pytest.raises(AttributeError):
            engine.backend_name = "cuda"  # type: ignore[misc]
        good, bad = engine.predict([images(1)[0], "/nonexistent/x.jpg"], top_k=1)
    assert (good.backend, good.precision) == ("cpu", "fp32")
    assert not bad.ok and (bad.backend, bad.precision) == (None, None)  # nothing computed it


def test_decode_gpu_on_the_cpu_backend_is_refused(weights, monkeypatch):
    no_gpu(monkeypatch)
    with pytest.raises(OptionError, match=r"^decode='gpu': needs the cuda backend; this engine runs on cpu \(no "
                                          r"usable GPU here\)$"):
        Engine(weights, decode="gpu")


def test_the_config_checks_and_resolve_probes_without_reading_the_weights(tmp_path, monkeypatch):
    """What inception-run --gpus's parent checks before its workers start: every refusal Engine makes but a weight
    file it cannot read, which only reading finds. EngineConfig makes the checks that probe nothing, resolve the
    rest."""
    no_gpu(monkeypatch)
    bad = tmp_path / "w.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    s = resolve(EngineConfig(bad))
    assert (s.backend_name, s.precision, s.batch_size, s.notes) == ("cpu", "fp32", 8, (NO_GPU_NOTE,))
    assert EngineConfig(bad).weights_path == bad
    assert (resolve(EngineConfig(bad, backend="cpu", batch_size=3)).batch_size,
            resolve(EngineConfig(bad, backend="cpu")).notes) == (3, ())
    with pytest.raises(WeightsError, match=str(bad)):
        Engine(bad, backend="cpu")  # reading is the engine's
    with pytest.raises(OptionError, match=r"^precision='fp16': the cpu backend \(no usable GPU here\)"):
        resolve(EngineConfig(bad, precision="fp16"))
    with pytest.raises(OptionError, match=r"^decode='gpu': needs the cuda backend"):
        resolve(EngineConfig(bad, backend="cpu", decode="gpu"))
    with pytest.raises(OptionError, match=r"^weights='/nonexistent/w.npz': no such file"):
        EngineConfig("/nonexistent/w.npz", backend="cpu")
    with pytest.raises(OptionError, match=r"^worker_kind='fiber': choose one of auto, thread, process$"):
        EngineConfig(bad, worker_kind="fiber")
    assert EngineConfig(random_weights(0), backend="cpu").weights_path is None  # Weights given: nothing to read


def test_a_pickled_config_is_not_checked_again(tmp_path, monkeypatch):
    """A --gpus worker receives its parent's config: unpickling it looks at no file."""
    import pickle

    path = tmp_path / "w.npz"
    path.write_bytes(b"PK\x03\x04")
    data = pickle.dumps(EngineConfig(path, backend="cpu"))
    path.unlink()
    assert pickle.loads(data).weights_path == path  # unpickling checked no file: it is gone


def test_run_config_refuses_options_that_exclude_each_other(tmp_path):
    engine = EngineConfig(random_weights(0), backend="cpu")
    with pytest.raises(EngineError, match=r"^--resume continues an --output FILE"):
        RunConfig(engine, ("a.jpg",), resume=True)
    with pytest.raises(EngineError, match=r"^--json prints to the terminal"):
        RunConfig(engine, ("a.jpg",), output="o.jsonl", as_json=True)
    with pytest.raises(EngineError, match=r"^--gpus 0 is for --ray"):
        RunConfig(engine, ("a.jpg",), gpus=0)
    with pytest.raises(EngineError, match=r"^--ray writes its results to a directory"):
        RunConfig(engine, ("a.jpg",), ray="")
    with pytest.raises(OptionError, match=r"^top_k=0: must be between 1 and 1000$"):
        RunConfig(engine, ("a.jpg",), top_k=0)
    assert [RunConfig(engine, ("a.jpg",), gpus=g).driver for g in (None, 1, 2)] == ["local", "local", "gpus"]
    assert RunConfig(engine, ("a.jpg",), ray="local", output=str(tmp_path / "out")).driver == "ray"


def test_facts_are_what_the_engine_runs_with_and_survive_a_queue(tmp_path, monkeypatch):
    """EngineFacts: what a --gpus worker sends its parent, pickled, for the header and the summary line."""
    import pickle

    no_gpu(monkeypatch)
    path = write_random_weights(tmp_path / "w.npz", seed=2)
    with Engine(path, batch_size=2) as engine:
        facts = engine.facts()
    from inception_engine.weights import load_weight_file

    model = load_weight_file(path).model_id()
    assert facts == EngineFacts("cpu", "fp32", 2, path, (NO_GPU_NOTE, *cpu_notes()), model) and model.kind == "unknown"
    assert pickle.loads(pickle.dumps(facts)) == facts


def test_more_gpus_than_the_machine_has_are_refused_by_the_api(monkeypatch, tmp_path):
    """At the call, not at next(); the workers, started before the GPUs are counted, are ended."""
    from inception_engine.multi_gpu import predict_on_gpus

    monkeypatch.setattr(backends, "usable_gpus", lambda: 1)
    started, close = [], multi_gpu.GpuRun.close
    monkeypatch.setattr(multi_gpu.GpuRun, "close", lambda self: (started.extend(self.procs), close(self)))
    (tmp_path / "w.npz").write_bytes(b"PK\x03\x04")  # a weight file to the parent, which reads no further
    with pytest.raises(OptionError, match=r"^gpus=2: this machine has 1 usable GPU$"):
        predict_on_gpus(["x.jpg"], 2, 1, EngineConfig(tmp_path / "w.npz", "auto", "auto", 1, None, "thread"))
    assert len(started) == 2 and not any(p.is_alive() for p in started)
    monkeypatch.setattr(backends, "usable_gpus", lambda: 0)
    with pytest.raises(OptionError, match=r"^gpus=1: this machine has no usable GPU$"):
        backends.require_gpus(1)
    backends.require_gpus(0)


class TunableStandIn:
    """A backend class with the cuda backend's tune option, counting constructions; tuned as tune_configs would
    leave it: measured configs when asked to tune, or when the tuning cache (here: `cache`) has them."""

    PRECISIONS = ("fp32",)
    cache: set[int] = set()
    built: list[tuple[int, bool | str]] = []

    def __init__(self, weights, plan, tune: bool | str = False, precision: str = "fp32"):
        self.batch = plan.batch
        TunableStandIn.built.append((plan.batch, tune))
        if tune is True:
            TunableStandIn.cache.add(plan.batch)
        self.tuned = bool(tune) and plan.batch in TunableStandIn.cache
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_engine_keeps_a_tuned_backend_across_short_and_long_runs(weights, monkeypatch):
    """Runs of different lengths ask for tune=True or "cached"; a backend whose configs are measured serves both,
    and only one on the cost model's configs is rebuilt when a long run asks to tune."""
    monkeypatch.setattr(backends, "backend_class", lambda name: TunableStandIn)
    monkeypatch.setitem(backends.DEFAULT_OPTIONS, "cpu", {"tune": False})
    TunableStandIn.cache, TunableStandIn.built = set(), []
    with Engine(weights, backend="cpu", batch_size=4) as engine:
        short = engine.backend_for(4, "cached")  # nothing cached yet: the cost model's configs
        assert not short.tuned
        long = engine.backend_for(4, True)  # a long run: worth tuning, so rebuilt
        assert long is not short and short.closed and long.tuned
        assert engine.backend_for(4, "cached") is long  # a short run again: the tuned backend serves it
        assert engine.backend_for(4, True) is long
    assert TunableStandIn.built == [(4, "cached"), (4, True)]
    TunableStandIn.built = []
    with Engine(weights, backend="cpu", batch_size=4) as engine:  # a later process: the cache has batch 4
        cached = engine.backend_for(4, "cached")
        assert cached.tuned and engine.backend_for(4, True) is cached
    assert TunableStandIn.built == [(4, "cached")]


def reference_features(weights, x: np.ndarray) -> np.ndarray:
    backend = NumpyBackend(weights, build_plan(1, weights.layers()), dtype=np.float64)
    return np.concatenate([backend.forward(x[i:i + 1].astype(np.float64), features=True)[1] for i in range(len(x))])


def test_features_come_from_the_same_forward_in_input_order(weights, tmp_path):
    """forward(features=True) and Engine.features: the pool's output beside the logits, in order, NaN for a file
    that cannot be read; the logits unchanged by asking."""
    ims = images(3, seed=7)
    bad = tmp_path / "bad.png"
    bad.write_text("no")
    x = np.stack([load_image(im) for im in ims])
    ref = reference_features(weights, x)
    with Engine(weights, backend="cpu", batch_size=2) as engine:
        logits, feats = engine.forward(x, features=True)
        assert feats.shape == (3, 2048) and feats.dtype == np.float32
        np.testing.assert_array_equal(logits, engine.forward(x))
        got, preds = engine.features([ims[0], bad, ims[1], ims[2]], top_k=2)
    assert np.linalg.norm(feats - ref) / np.linalg.norm(ref) < 1e-5
    assert [p.ok for p in preds] == [True, False, True, True]
    assert np.isnan(got[1]).all() and not np.isnan(got[[0, 2, 3]]).any()
    assert np.linalg.norm(got[[0, 2, 3]] - ref) / np.linalg.norm(ref) < 1e-5
    assert not np.allclose(ref[0], ref[1], rtol=1e-3)  # rows differ, so a mixed-up order would show


def test_features_refused_by_a_backend_without_them(weights, monkeypatch):
    with Engine(weights, backend="cpu") as engine:
        monkeypatch.setattr(engine, "backend_class", type("NoFeatures", (), {}))
        with pytest.raises(OptionError, match="no features"):
            engine.features([images(1)[0]])


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_fid_network_features_through_the_pipeline_with_its_preprocessing(kind, tmp_path):
    """The FID network's weight file defaults to pytorch-fid's preprocessing; its float pixels go through the ring
    (shared with decode processes too) and give the features of forward(load_image(...))."""
    fid = random_weights(seed=2, network="fid")
    paths = []
    for i, im in enumerate(images(3, seed=9)):
        paths.append(tmp_path / f"{i}.png")
        im.save(paths[-1])
    with Engine(fid, backend="cpu", batch_size=2, worker_kind=kind, workers=2) as engine:
        assert engine.preprocess.mode == "pytorch-fid" and engine.classes == 1008
        got, preds = engine.features(paths, top_k=3)
        x = np.stack([load_image(p, engine.preprocess) for p in paths])
        _, want = engine.forward(x, features=True)
    assert all(p.ok for p in preds) and got.shape == (3, 2048)
    # its classes are TF's, not ImageNet's: every one numbered, said once in the notes
    assert all(label == f"class {i}" for p in preds for i, label, _ in p.top)
    assert engine.facts().labels == engine.labels == tuple(f"class {i}" for i in range(1008))
    assert engine.notes.count(NUMBERED_NOTE) == 1
    assert labelled([(1003, 0.5), (7, 0.25)], engine.labels) == [(1003, "class 1003", 0.5), (7, "class 7", 0.25)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(OptionError, match="resize"):
        Engine(fid, backend="cpu", resize="tf")


def test_classify_pixels_refuses_an_fid_preprocessing_in_one_line():
    """The FID tools' preprocessing decodes to the network's input, not to uint8 pixels (Preprocess.decoded_shape):
    classify_pixels, which takes uint8 pixels decoded elsewhere (Ray Data's workers), says so before any work."""
    with Engine(random_weights(0, "fid"), backend="cpu", batch_size=2) as engine:
        with pytest.raises(EngineError, match="pytorch-fid preprocessing decodes to the network's input") as e:
            engine.classify_pixels(np.zeros((1, 299, 299, 3), np.uint8))
        assert "\n" not in str(e.value)
