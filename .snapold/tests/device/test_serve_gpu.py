"""inception-serve on the GPU: its answers equal the Engine's on the same backend, precision and decode (the runner's
path for the top-k of images; a forward for whole tensors), on one GPU and, where the machine has them, on two."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from inception_engine import backends
from inception_engine.engine import Engine
from inception_engine.ingest.images import load_image

from helpers.serve import jpeg_bytes, png_bytes, serve_weights, start_server, write_images

pytestmark = pytest.mark.gpu
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is in the test extra")
BATCH = 8


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    return serve_weights(tmp_path_factory.mktemp("weights"))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    files = [png_bytes(i) if i % 5 == 4 else jpeg_bytes(i, (500, 375) if i % 2 else (375, 500)) for i in range(12)]
    return write_images(tmp_path_factory.mktemp("images"), files, "{i:02d}")


def top5(served, paths: list[Path]) -> list[list[tuple[int, float]]]:
    client = httpclient.InferenceServerClient(served.host_port, network_timeout=300.0)
    inp = httpclient.InferInput("images", [len(paths)], "BYTES")
    inp.set_data_from_numpy(np.array([p.read_bytes() for p in paths], dtype=np.object_), binary_data=True)
    r = client.infer("inception_v3", [inp], outputs=[httpclient.InferRequestedOutput("probabilities", class_count=5)])
    client.close()
    return [[(int(s.decode().split(":")[1]), float(s.decode().split(":")[0])) for s in row]
            for row in r.as_numpy("probabilities")]


@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_gpu_server_equals_engine(weights_file, images, decode):
    if decode == "gpu":
        pytest.importorskip("nvidia.nvimgcodec", reason="--decode gpu needs the gpu-decode extra")
    served = start_server(weights_file, "--precision", "fp16", "--decode", decode, "--max-batch", str(BATCH),
                          "--gpus", "1", backend="cuda", timeout=600)
    try:
        got = top5(served, images)
        with Engine(weights_file, backend="cuda", precision="fp16", batch_size=BATCH, decode=decode) as engine:
            want = engine.predict([str(p) for p in images], top_k=5)
            x = np.stack([load_image(p) for p in images[:3]])
            logits = engine.forward(x)
        for g, w in zip(got, want):
            assert [i for i, _ in g][:1] == [w.top[0][0]]
            np.testing.assert_allclose([s for _, s in g], [p for _, _, p in w.top], rtol=0, atol=2e-3)
        client = httpclient.InferenceServerClient(served.host_port, network_timeout=300.0)
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        r = client.infer("inception_v3", [inp], outputs=[httpclient.InferRequestedOutput("logits")])
        client.close()
        np.testing.assert_allclose(r.as_numpy("logits"), logits, rtol=0, atol=5e-2)
        # requests at once: with --decode gpu their jobs are decode calls of several batches on the device's decode
        # chains (serve/devices.DecodeChains), several in flight; each request gets its own images' answers
        order = [list(range(len(images)))[k:] + list(range(len(images)))[:k] for k in range(8)]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda o: top5(served, [images[i] for i in o]), order))
        for o, answer in zip(order, answers):
            assert [a[0][0] for a in answer] == [got[i][0][0] for i in o]
            np.testing.assert_allclose([[s for _, s in a] for a in answer], [[s for _, s in got[i]] for i in o],
                                       rtol=0, atol=2e-3)
    finally:
        assert served.stop() == 0, served.drain()


def test_two_gpus_answer_as_one(weights_file, images):
    if backends.usable_gpus() < 2:
        pytest.skip("needs two GPUs")
    served = start_server(weights_file, "--precision", "fp16", "--max-batch", str(BATCH), "--gpus", "2",
                          "--max-queue-delay-ms", "0", backend="cuda", timeout=600)
    try:
        assert "devices gpu0, gpu1" in served.lines[-1]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda k: top5(served, images[k:k + 3]), range(0, 12, 3)))
        with Engine(weights_file, backend="cuda", precision="fp16", batch_size=BATCH) as engine:
            want = engine.predict([str(p) for p in images], top_k=5)
        got = [row for answer in answers for row in answer]
        assert [g[0][0] for g in got] == [w.top[0][0] for w in want]
    finally:
        assert served.stop() == 0, served.drain()
