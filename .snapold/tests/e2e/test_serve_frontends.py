"""inception-serve --http-workers 2: two HTTP front-end processes before one engine process (serve/hub.py), on the
CPU backend with random weights: tritonclient's answers equal the Engine's, several clients at once, the metrics of
every process added up, a bad request refused by a front-end, and a graceful stop under load."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from inception_engine.engine import Engine
from inception_engine.ingest.images import load_image

from helpers.serve import jpeg_bytes, png_bytes, serve_weights, start_server, write_images

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is in the test extra")

MAX_BATCH = 4
MODEL = "inception_v3"


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    return serve_weights(tmp_path_factory.mktemp("weights"))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    return write_images(tmp_path_factory.mktemp("images"), [jpeg_bytes(10), png_bytes(11), jpeg_bytes(12, (400, 330)),
                                                            jpeg_bytes(13), jpeg_bytes(14, (299, 299))])


@pytest.fixture(scope="module")
def engine(weights_file):
    with Engine(weights_file, backend="cpu", batch_size=MAX_BATCH) as e:
        yield e


@pytest.fixture(scope="module")
def server(weights_file):
    served = start_server(weights_file, "--http-workers", "2", "--max-batch", str(MAX_BATCH),
                          "--max-queue-delay-ms", "20", "--max-images", "8", timeout=240)
    assert "2 HTTP front-ends" in served.lines[-1]
    yield served
    assert served.stop() == 0, served.drain()


def children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def bytes_input(paths: list[Path]):
    inp = httpclient.InferInput("images", [len(paths)], "BYTES")
    inp.set_data_from_numpy(np.array([p.read_bytes() for p in paths], dtype=np.object_), binary_data=True)
    return inp


def families(server) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as r:
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


def sample(fams: dict, family: str, name: str, **labels: str) -> float:
    """The sum of the family's samples of that name and labels (0 where nothing has written it yet)."""
    return sum(s.value for s in (fams[family].samples if family in fams else []) if s.name == name and
               all(s.labels.get(k) == v for k, v in labels.items()))


def test_two_front_end_processes_answer_as_the_engine(server, engine, images):
    """BYTES (top-k and logits) and FP32 inputs through tritonclient, against the Engine on the same images."""
    assert len(children(server.proc.pid)) >= 2  # the front-ends (and the multiprocessing helpers)
    c = httpclient.InferenceServerClient(server.host_port, network_timeout=120.0)
    try:
        r = c.infer(MODEL, [bytes_input(images[:3])],
                    outputs=[httpclient.InferRequestedOutput("probabilities", binary_data=True, class_count=3),
                             httpclient.InferRequestedOutput("logits", binary_data=True)])
        preds = engine.predict([str(p) for p in images[:3]], top_k=3)
        for row, p in zip(r.as_numpy("probabilities"), preds):
            assert [tuple(s.decode().split(":", 2)) for s in row] == [(f"{prob:f}", str(i), label)
                                                                     for i, label, prob in p.top]
        x = np.stack([load_image(p) for p in images[:3]])
        np.testing.assert_allclose(r.as_numpy("logits"), engine.forward(x), rtol=0, atol=1e-5)
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        r = c.infer(MODEL, [inp], outputs=[httpclient.InferRequestedOutput("logits", binary_data=True)])
        np.testing.assert_allclose(r.as_numpy("logits"), engine.forward(x), rtol=0, atol=1e-5)
    finally:
        c.close()


def test_several_clients_get_their_own_answers_and_the_metrics_add_up(server, engine, images):
    """Eight clients, each on connections of its own (the kernel deals them to both front-ends), requests of 1 to 5
    images: each its own classes; then /metrics, from either front-end, counts every request and image once."""
    want = {str(p): pr.top[0][0] for p, pr in zip(images, engine.predict([str(p) for p in images], top_k=1))}
    before = families(server)

    def one(k: int) -> list[tuple[str, int]]:
        paths = [images[(k + j) % len(images)] for j in range(1 + k % 5)]
        c = httpclient.InferenceServerClient(server.host_port, network_timeout=120.0)
        try:
            r = c.infer(MODEL, [bytes_input(paths)],
                        outputs=[httpclient.InferRequestedOutput("probabilities", class_count=1)])
        finally:
            c.close()
        return [(str(p), int(s.decode().split(":")[1])) for p, (s,) in zip(paths, r.as_numpy("probabilities"))]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(8)))
    for answer in answers:
        assert [i for _, i in answer] == [want[p] for p, _ in answer]
    sent = sum(1 + k % 5 for k in range(8))
    for _ in range(4):  # several scrapes, new connections each: whichever front-end answers, the same sums
        after = families(server)
        infer_ok = ("inception_requests", "inception_requests_total", {"route": "infer", "status": "200"})
        assert sample(after, *infer_ok[:2], **infer_ok[2]) - sample(before, *infer_ok[:2], **infer_ok[2]) == 8
        done = ("inception_images", "inception_images_total")
        assert sample(after, *done, device="cpu") - sample(before, *done, device="cpu") == sent
        assert sample(after, "inception_ready", "inception_ready") == 1
        assert sample(after, "inception_requests_in_flight", "inception_requests_in_flight", route="infer") == 0


def test_a_bad_request_is_refused_by_its_front_end_and_the_others_go_on(server, images):
    conn = http.client.HTTPConnection(server.host_port, timeout=60)
    conn.request("POST", f"/v2/models/{MODEL}/infer", body=b"{not json", headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 400 and "not valid JSON" in json.loads(r.read())["error"]
    conn.request("POST", "/v1/classify?top_k=1", body=b"no image at all")
    r = conn.getresponse()
    doc = json.loads(r.read())
    assert r.status == 400 and doc["image"] == "image", doc
    conn.request("POST", "/v1/classify?top_k=1", body=images[0].read_bytes())
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["top"][0]["index"] >= 0
    conn.close()


def test_sigterm_under_load_answers_every_request_and_exits_0(weights_file, images, engine):
    """Requests in flight on both front-ends when the engine process gets SIGTERM: each answered, every process
    gone, exit 0."""
    served = start_server(weights_file, "--http-workers", "2", "--max-batch", "1", "--max-queue-delay-ms", "0",
                          timeout=240)
    try:
        fronts = children(served.proc.pid)
        conns = []
        for k in range(6):  # six one-image requests on a device of batch 1: each waits for the others
            conn = http.client.HTTPConnection(served.host_port, timeout=120)
            conn.request("POST", f"/v1/classify?top_k=1&name=r{k}", body=images[k % len(images)].read_bytes())
            conns.append(conn)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # every request read by a front-end, not all answered
            fams = families(served)
            flying = sample(fams, "inception_requests_in_flight", "inception_requests_in_flight", route="classify")
            answered = sample(fams, "inception_requests", "inception_requests_total", route="classify")
            if flying + answered >= 6:
                break
            time.sleep(0.01)
        served.proc.send_signal(signal.SIGTERM)
        assert flying >= 1, "every request was answered before SIGTERM: nothing was in flight"
        answers = [conn.getresponse() for conn in conns]
        assert [a.status for a in answers] == [200] * 6
        docs = [json.loads(a.read()) for a in answers]
        want = engine.predict([str(images[k % len(images)]) for k in range(6)], top_k=1)
        assert [d["top"][0]["index"] for d in docs] == [p.top[0][0] for p in want]
        assert served.proc.wait(timeout=90) == 0
        assert "inception-serve: stopped" in served.drain()
        for pid in fronts:
            assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
    finally:
        served.stop()


def test_devices_that_cannot_start_end_the_server_in_one_line(weights_file, monkeypatch):
    """The engine process's failure is the command's one line and exit status, its front-ends ended with it."""
    from inception_engine.errors import EngineError
    from inception_engine.serve import command, devices

    from helpers.cli import one_line_error, runner

    def fails(spec):
        raise EngineError("the GPU decoder could not open (a test's)")

    monkeypatch.setattr(devices, "build_engine", fails)
    r = runner().invoke(command.serve_cmd, ["--weights", str(weights_file), "--backend", "cpu", "--port", "0",
                                            "--http-workers", "2"])
    assert r.exit_code == 2 and one_line_error(r) == "error: the GPU decoder could not open (a test's)"
