"""inception-serve end to end: a server in a subprocess (the CPU backend, random weights) answering tritonclient and
plain HTTP, against the Engine's own answers on the same images; bad input; metrics; a graceful stop under load."""

from __future__ import annotations

import base64
import http.client
import json
import signal
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from inception_engine.backends import cpu_kernels
from inception_engine.engine import Engine
from inception_engine.ingest.images import load_image

from helpers.result_lines import same_but_last_digits
from helpers.serve import READY, jpeg_bytes, png_bytes, serve_weights, start_server, write_images

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is in the test extra")

MAX_BATCH = 4
MODEL = "inception_v3"


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    return serve_weights(tmp_path_factory.mktemp("weights"))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    return write_images(tmp_path_factory.mktemp("images"), [jpeg_bytes(0), png_bytes(1), jpeg_bytes(2, (400, 330)),
                                                            jpeg_bytes(3), jpeg_bytes(4, (299, 299)), png_bytes(5)])


@pytest.fixture(scope="module")
def engine(weights_file):
    with Engine(weights_file, backend="cpu", batch_size=MAX_BATCH) as e:
        yield e


@pytest.fixture(scope="module")
def server(weights_file):
    served = start_server(weights_file, "--max-batch", str(MAX_BATCH), "--max-queue-delay-ms", "30",
                          "--max-images", "8", "--max-body-mb", "8", "--body-timeout", "1.5")
    yield served
    assert served.stop() == 0, served.drain()


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.host_port, network_timeout=120.0)
    yield c
    c.close()


def bytes_input(paths: list[Path], binary: bool = True):
    inp = httpclient.InferInput("images", [len(paths)], "BYTES")
    inp.set_data_from_numpy(np.array([p.read_bytes() for p in paths], dtype=np.object_), binary_data=binary)
    return inp


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def still_serves(server, path: Path) -> None:
    """A good request after a bad one is answered."""
    status, doc = post(f"{server.url}/v1/classify?top_k=1", path.read_bytes())
    assert status == 200 and doc["top"][0]["index"] >= 0, doc


# --------------------------------------------------------------------------------------------- answers

@pytest.mark.parametrize("binary", [True, False])
def test_fp32_input_equals_engine_forward(client, engine, images, binary):
    x = np.stack([load_image(p) for p in images[:3 if binary else 1]])  # as JSON an image is ~3 MB
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    outs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("logits", "probabilities")]
    r = client.infer(MODEL, [inp], outputs=outs)
    want = engine.forward(x)
    np.testing.assert_allclose(r.as_numpy("logits"), want, rtol=0, atol=1e-5)
    probs = np.exp(want - want.max(1, keepdims=True))
    np.testing.assert_allclose(r.as_numpy("probabilities"), probs / probs.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_bytes_input_equals_engine_predict(client, engine, images):
    paths = images[:3]
    r = client.infer(MODEL, [bytes_input(paths)],
                     outputs=[httpclient.InferRequestedOutput("probabilities", binary_data=True, class_count=5),
                              httpclient.InferRequestedOutput("logits", binary_data=True)])
    preds = engine.predict([str(p) for p in paths], top_k=5)
    got = r.as_numpy("probabilities")
    assert got.shape == (3, 5)
    for row, p in zip(got, preds):
        scores = [s.decode().split(":", 2) for s in row]
        assert [(int(i), label) for _, i, label in scores] == [(i, label) for i, label, _ in p.top]
        assert [f"{prob:f}" for _, _, prob in p.top] == [score for score, _, _ in scores]  # Triton's %f
    np.testing.assert_allclose(r.as_numpy("logits"), engine.forward(np.stack([load_image(p) for p in paths])),
                               rtol=0, atol=1e-5)


def test_bytes_top_k_only_takes_the_classify_path_with_exact_scores(server, engine, images):
    """Classification alone (the runner's path), scores as exact decimals: the predictions' own floats."""
    paths = images[:4]
    blob = b"".join(len(d).to_bytes(4, "little") + d for d in (p.read_bytes() for p in paths))
    head = json.dumps({"inputs": [{"name": "images", "datatype": "BYTES", "shape": [4, 1],
                                   "parameters": {"binary_data_size": len(blob)}}],
                       "outputs": [{"name": "probabilities",
                                    "parameters": {"classification": 3, "exact_scores": True}}]}).encode()
    status, doc = post(f"{server.url}/v2/models/{MODEL}/infer", head + blob,
                       {"Inference-Header-Content-Length": str(len(head))})
    assert status == 200, doc
    (out,) = doc["outputs"]
    assert out["datatype"] == "BYTES" and out["shape"] == [4, 3]
    want = [f"{prob!r}:{i}:{label}" for p in engine.predict([str(p) for p in paths], top_k=3)
            for i, label, prob in p.top]
    assert out["data"] == want


def test_gzip_request(client, engine, images):
    """tritonclient's request_compression_algorithm: the body inflated before it is read."""
    r = client.infer(MODEL, [bytes_input(images[:2])], outputs=[httpclient.InferRequestedOutput("logits")],
                     request_compression_algorithm="gzip")
    np.testing.assert_allclose(r.as_numpy("logits"), engine.forward(np.stack([load_image(p) for p in images[:2]])),
                               rtol=0, atol=1e-5)


def test_bytes_in_json_as_base64(server, engine, images):
    paths = images[3:5]
    doc = {"id": "req-7", "inputs": [{"name": "images", "datatype": "BYTES", "shape": [2],
                                      "parameters": {"content_type": "base64"},
                                      "data": [base64.b64encode(p.read_bytes()).decode() for p in paths]}],
           "outputs": [{"name": "logits"}]}
    status, got = post(f"{server.url}/v2/models/{MODEL}/versions/1/infer", json.dumps(doc).encode(),
                       {"Content-Type": "application/json"})
    assert status == 200, got
    assert got["id"] == "req-7" and got["outputs"][0]["shape"] == [2, 1000]
    logits = np.asarray(got["outputs"][0]["data"], np.float32).reshape(2, 1000)
    np.testing.assert_allclose(logits, engine.forward(np.stack([load_image(p) for p in paths])), rtol=0, atol=1e-5)


def test_plain_endpoint_gives_inception_run_json_entry(server, engine, images):
    from inception_engine.output import as_json

    status, doc = post(f"{server.url}/v1/classify?top_k=3&name=cat.jpg", images[1].read_bytes())
    assert status == 200
    (p,) = engine.predict([str(images[1])], top_k=3)
    assert doc == {**as_json(p), "image": "cat.jpg"}


def test_large_request_is_split_and_several_clients_get_their_own_answers(server, engine, images):
    """Requests of 1 to 6 images from six threads at once (batches of 4 joined across them, a 6-image request split):
    each gets its own images' classes."""
    want = {str(p): pr.top[0][0] for p, pr in zip(images, engine.predict([str(p) for p in images], top_k=1))}
    batches_before = batch_count(server)

    def one(k: int) -> list[tuple[str, int]]:
        paths = [images[(k + j) % len(images)] for j in range(1 + k)]
        c = httpclient.InferenceServerClient(server.host_port, network_timeout=120.0)
        try:
            r = c.infer(MODEL, [bytes_input(paths)],
                        outputs=[httpclient.InferRequestedOutput("probabilities", class_count=1)])
        finally:
            c.close()
        return [(str(p), int(s.decode().split(":")[1])) for p, (s,) in zip(paths, r.as_numpy("probabilities"))]

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(one, range(6)))
    for answer in answers:
        assert [i for _, i in answer] == [want[p] for p, _ in answer]
    assert batch_count(server) - batches_before < 6 + 5, "no requests were joined into a batch"


def batch_count(server) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    return sum(s.value for s in families["inception_batch_images"].samples if s.name.endswith("_count"))


def test_metrics_parse(server, client, images):
    from prometheus_client.parser import text_string_to_metric_families

    client.infer(MODEL, [bytes_input(images[:1])])
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as r:
        assert r.headers["content-type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    for name in ("inception_requests", "inception_request_failures", "inception_requests_in_flight",
                 "inception_queue_seconds",
                 "inception_compute_seconds", "inception_batch_images", "inception_images", "inception_ready"):
        assert name in families, sorted(families)
    images_done = {s.labels["device"]: s.value for s in families["inception_images"].samples
                   if s.name == "inception_images_total"}
    assert images_done["cpu"] >= 1
    infer = [s for s in families["inception_requests"].samples
             if s.name == "inception_requests_total" and s.labels == {"route": "infer", "status": "200"}]
    assert infer and infer[0].value >= 1


def test_metadata_and_health(client, server):
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    meta = client.get_model_metadata(MODEL)
    assert meta["name"] == MODEL and meta["versions"] == ["1"]
    assert {i["name"]: (i["datatype"], i["shape"]) for i in meta["inputs"]} == {
        "images": ("BYTES", [-1]), "input": ("FP32", [-1, 3, 299, 299])}
    assert [(o["name"], o["shape"]) for o in meta["outputs"]] == [("probabilities", [-1, 1000]),
                                                                   ("logits", [-1, 1000])]
    config = client.get_model_config(MODEL)
    assert config["max_batch_size"] == MAX_BATCH and config["parameters"]["backend"]["string_value"] == "cpu"
    assert "classification" in client.get_server_metadata()["extensions"]


# ------------------------------------------------------------------------------------------------- bad input

def infer_url(server) -> str:
    return f"{server.url}/v2/models/{MODEL}/infer"


def binary_request(blob: bytes, declared: int | None = None, shape: list[int] | None = None) -> tuple[bytes, dict]:
    head = json.dumps({"inputs": [{"name": "images", "datatype": "BYTES", "shape": shape or [1],
                                   "parameters": {"binary_data_size": declared if declared is not None
                                                  else len(blob)}}]}).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head))}


def json_input(name: str, datatype: str, shape: list[int], data: list) -> bytes:
    return json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}).encode()


def bad_requests(images: list[Path]) -> dict[str, tuple[bytes, dict, int, str]]:
    """name -> (body, headers, status, a phrase of the error)"""
    good = images[0].read_bytes()
    one = len(good).to_bytes(4, "little") + good
    cut = binary_request(one[:-100], declared=len(one))
    return {
        "malformed JSON": (b'{"inputs": [', {}, 400, "not valid JSON"),
        "not an object": (b"[1, 2]", {}, 400, "JSON object"),
        "no inputs": (b"{}", {}, 400, "'inputs'"),
        "unknown input": (json_input("pixels", "FP32", [1], [1.0]), {}, 400, "unknown input 'pixels'"),
        "wrong datatype": (json_input("input", "INT8", [1, 3, 299, 299], [1]), {}, 400, "datatype 'INT8'"),
        "wrong shape": (json_input("input", "FP32", [1, 3, 224, 224], [0.0]), {}, 400, "shape [1, 3, 224, 224]"),
        "data of another size": (json_input("input", "FP32", [1, 3, 299, 299], [0.0] * 10), {}, 400,
                                 "holds 10 elements"),
        "not numbers": (json_input("input", "FP32", [1, 3, 299, 299], ["a"] * (3 * 299 * 299)), {}, 400,
                        "numbers only"),
        "truncated binary body": (*cut, 400, "truncated"),
        "header length past the body": (b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}, 400,
                                        "Inference-Header-Content-Length is 999"),
        "too many images": (json_input("images", "BYTES", [9], ["x"] * 9), {}, 413, "at most 8"),
        "unknown output": (json.dumps({"inputs": json.loads(json_input("images", "BYTES", [1], ["x"]))["inputs"],
                                       "outputs": [{"name": "features"}]}).encode(), {}, 400, "unknown output"),
        "bad classification": (json.dumps({"inputs": json.loads(json_input("images", "BYTES", [1], ["x"]))["inputs"],
                                           "outputs": [{"name": "logits", "parameters": {"classification": 0.5}}]}
                                          ).encode(), {}, 400, "'classification'"),
        "not an image": (*binary_request(len(b"hello").to_bytes(4, "little") + b"hello"), 400,
                         "images[0]: not an image"),
        "bad gzip": (b"\x1f\x8bnot gzip", {"Content-Encoding": "gzip"}, 400, "not valid gzip"),
    }


@pytest.mark.parametrize("case", list(bad_requests([Path(__file__)])))  # names only; bodies made per test
def test_bad_input_gets_its_4xx_json_error_and_the_server_goes_on(server, images, case):
    body, headers, status, phrase = bad_requests(images)[case]
    got, doc = post(infer_url(server), body, headers)
    assert (got, list(doc)) == (status, ["error"]) or (got == status and "errors" in doc), doc
    assert phrase in doc["error"], doc["error"]
    still_serves(server, images[0])


def test_one_bad_image_among_many_names_it(server, images):
    datas = [images[0].read_bytes(), b"\xff\xd8 not a jpeg", images[1].read_bytes(), images[2].read_bytes()[:300]]
    blob = b"".join(len(d).to_bytes(4, "little") + d for d in datas)
    status, doc = post(infer_url(server), *binary_request(blob, shape=[4]))
    assert status == 400
    assert [e["index"] for e in doc["errors"]] == [1, 3]
    assert doc["error"].startswith("2 of 4 images could not be decoded: images[1]: ")
    assert doc["errors"][1]["error"].startswith("images[3]: ")


def test_unknown_model_and_route(server):
    status, doc = post(f"{server.url}/v2/models/resnet50/infer", b"{}")
    assert status == 404 and "unknown model 'resnet50'" in doc["error"]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{server.url}/v2/nothing", timeout=30)
    assert e.value.code == 404 and "error" in json.loads(e.value.read())


def test_oversized_body_is_refused_before_it_is_read(server, images):
    """A Content-Length past --max-body-mb: 413 at once, the body never sent."""
    conn = http.client.HTTPConnection(server.host_port, timeout=30)
    conn.putrequest("POST", f"/v2/models/{MODEL}/infer")
    conn.putheader("Content-Length", str(9 << 20))
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 413 and "larger than" in json.loads(r.read())["error"]
    conn.close()
    still_serves(server, images[0])


def test_chunked_body_past_the_limit(server, images):
    conn = http.client.HTTPConnection(server.host_port, timeout=30)
    chunks = (b"x" * (1 << 20) for _ in range(12))
    conn.request("POST", f"/v2/models/{MODEL}/infer", body=chunks, encode_chunked=True)
    r = conn.getresponse()
    assert r.status == 413, r.read()
    conn.close()
    still_serves(server, images[0])


def test_slow_client_gets_408_and_disconnecting_client_is_dropped(server, images):
    slow = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=30)
    slow.sendall(f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{{".encode())
    gone = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=30)
    gone.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"\xff" * 500)
    gone.close()
    still_serves(server, images[0])  # while the slow one is still sending
    reply = b""
    while b'"}' not in reply:  # after --body-timeout (1.5 s): the status line, then the JSON body
        got = slow.recv(65536)
        assert got, reply
        reply += got
    slow.close()
    reply = reply.decode()
    assert reply.startswith("HTTP/1.1 408") and '"error"' in reply, reply
    still_serves(server, images[0])


def test_non_finite_tensor(server, images):
    x = np.zeros((1, 3, 299, 299), np.float32)
    x[0, 1, 2, 3] = np.nan
    head = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                                   "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    status, doc = post(infer_url(server), head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and "not finite" in doc["error"]


# ----------------------------------------------------------------------------------------------- start and stop

def test_ready_only_after_warm_up_and_sigterm_under_load(weights_file, images, engine):
    """Live at once, ready (and answering) only once its engine has warmed up; SIGTERM with requests in flight:
    each is answered, and the server exits with 0."""
    served = start_server(weights_file, "--max-batch", "2", "--max-queue-delay-ms", "0", wait=False)
    port = None
    try:
        seen: list[int] = []
        while not any(line.startswith(READY) for line in served.lines):
            if served.proc.poll() is not None:
                raise AssertionError(served.drain())
            port = port or listening_port(served)
            if port is not None:
                seen.append(status_of(f"http://127.0.0.1:{port}/v2/health/ready"))
            try:
                served.wait_line(READY, timeout=0.02)
            except AssertionError:
                pass
        assert 503 in seen and 200 not in seen[:seen.index(503) + 1], seen
        served.url = served.wait_line(READY)[len(READY):].split()[0]
        assert status_of(f"{served.url}/v2/health/ready") == 200
        conns = []
        for k in range(4):  # 4 one-image requests on one device of batch 2: ~0.2 s of work queued
            conn = http.client.HTTPConnection(served.host_port, timeout=120)
            conn.request("POST", f"/v1/classify?top_k=1&name=r{k}", body=images[k].read_bytes())
            conns.append(conn)
        while sum(counts := route_counts(served, "classify")) < 4:  # every request read (most not yet answered)
            time.sleep(0.01)
        served.proc.send_signal(signal.SIGTERM)
        assert counts[0] >= 1, "every request was answered before SIGTERM: nothing was in flight"
        answers = [conn.getresponse() for conn in conns]
        assert [a.status for a in answers] == [200] * 4
        docs = [json.loads(a.read()) for a in answers]
        want = engine.predict([str(p) for p in images[:4]], top_k=1)
        assert [d["top"][0]["index"] for d in docs] == [p.top[0][0] for p in want]
        assert served.proc.wait(timeout=60) == 0
        assert "inception-serve: stopped" in served.drain()
    finally:
        served.stop()


def route_counts(served, route: str) -> tuple[float, float]:
    """(requests in flight, requests answered) on ``route``, from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{served.url}/metrics", timeout=30) as r:
        samples = [s for f in text_string_to_metric_families(r.read().decode()) for s in f.samples]
    return (sum(s.value for s in samples if s.name == "inception_requests_in_flight" and s.labels == {"route": route}),
            sum(s.value for s in samples if s.name == "inception_requests_total" and s.labels.get("route") == route))


def listening_port(served) -> int | None:
    """The port the server listens on, from /proc (it prints it only once ready)."""
    import os

    pid = served.proc.pid
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                  if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")}
        with open("/proc/net/tcp") as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                    return int(cols[1].split(":")[1], 16)
    except OSError:
        return None
    return None


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def test_usage_error_is_one_line(weights_file):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "inception_engine.serve.command", "--weights", str(weights_file),
                        "--backend", "cpu", "--precision", "fp16"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: --precision fp16") and r.stderr.count("\n") == 1, \
        r.stderr


def test_several_devices_worker_process(weights_file, images, engine):
    """devices.ProcessDevice (one per GPU where there are several), here on the CPU backend: its batches come back
    equal to the engine's."""
    import asyncio

    from inception_engine.config import EngineConfig
    from inception_engine.serve.devices import Job, ProcessDevice

    async def run() -> tuple[np.ndarray, list]:
        dev = ProcessDevice(EngineConfig(weights_file, "cpu", "fp32", MAX_BATCH), 0,
                            asyncio.get_running_loop())
        try:
            await dev.ready()
            x = np.stack([load_image(p) for p in images[:2]])
            logits = await dev.run(Job("tensor", x, ["a", "b"]))
            tops = await dev.run(Job("pixels", pixels, ["a", "b"], 2))
            return logits, tops
        finally:
            await asyncio.get_running_loop().run_in_executor(None, dev.close)

    from inception_engine.ingest.images import decode_u8

    pixels = np.stack([decode_u8(p) for p in images[2:4]])
    logits, tops = asyncio.run(run())
    np.testing.assert_allclose(logits, engine.forward(np.stack([load_image(p) for p in images[:2]])), atol=1e-5)
    want = engine.classify_pixels(pixels, top_k=2)
    assert [[i for i, _ in top] for top in tops] == [[i for i, _, _ in top] for top in want]
    np.testing.assert_allclose([[p for _, p in top] for top in tops], [[p for _, _, p in top] for top in want],
                               rtol=1e-6)


# ------------------------------------------------------------------------------------------- inception-run --server

@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory, images) -> Path:
    """Six images, a file that is no image and a truncated PNG, in one folder."""
    d = tmp_path_factory.mktemp("run")
    for p in images:
        (d / p.name).write_bytes(p.read_bytes())
    (d / "text.png").write_text("hello")
    (d / "cut.png").write_bytes(images[1].read_bytes()[:200])
    return d


@pytest.mark.parametrize("fmt", ["text", "json", "jsonl", "csv"])
def test_inception_run_server_output_equals_a_local_run(server, weights_file, run_inputs, tmp_path, fmt):
    from inception_engine import cli

    from helpers.cli import runner

    def run(*extra: str, out: str | None = None) -> tuple[int, str]:
        args = [str(run_inputs), "--top-k", "3", *extra]
        args += ["--json"] if fmt == "json" else ["--output", str(tmp_path / out)] if out else []
        r = runner().invoke(cli.run_cmd, args, catch_exceptions=False)
        return r.exit_code, (tmp_path / out).read_text() if out else r.stdout

    out = (lambda name: f"{name}.{fmt}") if fmt in ("jsonl", "csv") else (lambda name: None)
    local = run("--weights", str(weights_file), "--backend", "cpu", "--batch-size", str(MAX_BATCH), out=out("local"))
    remote = run("--server", server.url, out=out("remote"))
    assert local[0] == remote[0] == 1  # two images could not be read
    if cpu_kernels.library() is not None:
        assert remote[1] == local[1]
    else:  # the NumPy code's sums depend on an image's place in its batch, which differs here (client.py's docstring)
        assert same_but_last_digits(remote[1], local[1])
    assert "cut.png: " in remote[1] and "text.png: not an image" in remote[1]


def test_same_but_last_digits_tells_the_text_and_the_numbers_apart():
    assert same_but_last_digits('{"score": 0.0500847, "x": 1}', '{"score": 0.0500846, "x": 1}')
    assert not same_but_last_digits('{"score": 0.0500847}', '{"score": 0.0501847}')
    assert not same_but_last_digits('{"score": 0.0500847, "label": "a"}', '{"score": 0.0500847, "label": "b"}')


def test_inception_run_server_resume(server, run_inputs, tmp_path):
    from inception_engine import cli

    from helpers.cli import runner

    out = tmp_path / "r.jsonl"
    first = sorted(run_inputs.glob("img*"))[:3]
    assert runner().invoke(cli.run_cmd, [*map(str, first), "--server", server.url, "--output", str(out)]).exit_code == 0
    r = runner().invoke(cli.run_cmd, [str(run_inputs), "--server", server.url, "--output", str(out), "--resume"])
    assert r.exit_code == 1 and "resume: 3 of 8 images are in" in r.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(Path(d["image"]).name for d in lines) == sorted(p.name for p in run_inputs.iterdir())


def test_inception_run_server_files_that_cannot_be_read_keep_their_place(server, run_inputs, tmp_path):
    """A file that cannot be read (missing, a directory) gets a local run's error line in its place among the
    server's predictions; requests of 2 images, so that the chunks read in order on the reader thread are several."""
    from inception_engine import cli

    from helpers.cli import runner

    images = sorted(map(str, run_inputs.glob("img*")))
    (tmp_path / "dir.png").mkdir()
    args = [images[0], str(tmp_path / "missing.png"), *images[1:3], str(tmp_path / "dir.png"), images[3]]
    out = tmp_path / "r.jsonl"
    r = runner().invoke(cli.run_cmd, [*args, "--server", server.url, "--batch-size", "2", "--output", str(out)])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert r.exit_code == 1 and [d["image"] for d in lines] == args
    assert [("error" in d) for d in lines] == [False, True, False, False, True, False]
    assert "missing.png" in lines[1]["error"] and "dir.png" in lines[4]["error"]


def test_inception_run_server_refusals(server, run_inputs):
    from inception_engine import cli

    from helpers.cli import one_line_error, runner

    r = runner().invoke(cli.run_cmd, [str(run_inputs), "--server", server.url, "--precision", "fp16"])
    assert r.exit_code == 2 and "the server at" in one_line_error(r) and "runs fp32" in r.stderr
    r = runner().invoke(cli.run_cmd, [str(run_inputs), "--server", "http://127.0.0.1:9", "--top-k", "1"])
    assert r.exit_code == 2 and "cannot reach the server" in one_line_error(r)
    r = runner().invoke(cli.run_cmd, [str(run_inputs), "--server", server.url, "--gpus", "2"])
    assert r.exit_code == 2 and "--ray and --gpus do not apply" in one_line_error(r)


def test_an_engine_that_cannot_start_is_one_line_exit_2(weights_file, monkeypatch):
    """The devices are built after the server listens: a failure there still ends the command with one line."""
    from inception_engine.errors import EngineError
    from inception_engine.serve import command, devices

    from helpers.cli import one_line_error, runner

    def fails(spec):
        raise EngineError("the GPU decoder could not open (a test's)")

    monkeypatch.setattr(devices, "build_engine", fails)
    r = runner().invoke(command.serve_cmd, ["--weights", str(weights_file), "--backend", "cpu", "--port", "0"])
    assert r.exit_code == 2 and one_line_error(r) == "error: the GPU decoder could not open (a test's)"


def test_a_server_of_the_fid_network_numbers_its_classes(tmp_path, images):
    """The FID network's classes are TF's, not ImageNet's: /v1/classify and the classification extension label
    every one "class N" (ImageNet's indices too), as inception-run with its weights does, and the server says so."""
    from inception_engine.labels import NUMBERED_NOTE
    from inception_engine.weights import save_weights

    from helpers.random_weights import random_arrays

    manifest = {"network": "fid", "count_include_pad": False, "input": {"mean": [0.5] * 3, "std": [0.5] * 3,
                                                                       "size": 75, "resize": 75}}
    weights = save_weights(tmp_path / "fid.npz", random_arrays(7, "fid"), manifest)
    served = start_server(weights, "--max-batch", "4")
    try:
        status, doc = post(f"{served.url}/v1/classify?top_k=40", images[0].read_bytes())
        assert status == 200, doc
        named = [(t["index"], t["label"]) for t in doc["top"]]
        # the server's host decoding gives the network pytorch-fid's fractional pixels, as a local run does
        with Engine(weights, backend="cpu", batch_size=1) as engine:
            want = engine.predict([images[0]], top_k=40)[0].top
        assert [t["index"] for t in doc["top"]] == [i for i, _, _ in want]
        np.testing.assert_allclose([t["prob"] for t in doc["top"]], [p for _, _, p in want], rtol=1e-5)
        client = httpclient.InferenceServerClient(served.host_port, network_timeout=120.0)
        try:
            assert [o["shape"] for o in client.get_model_metadata(MODEL)["outputs"]] == [[-1, 1008]] * 2
            result = client.infer(MODEL, [bytes_input(images[:2])],
                                  outputs=[httpclient.InferRequestedOutput("probabilities", class_count=40)])
        finally:
            client.close()
        for s in result.as_numpy("probabilities").ravel():
            _, index, label = s.decode().split(":", 2)
            named.append((int(index), label))
        assert len(named) == 120 and min(i for i, _ in named) < 1000
        assert all(label == f"class {i}" for i, label in named), named
        assert f"note: {NUMBERED_NOTE}\n" in served.lines
    finally:
        assert served.stop() == 0, served.drain()
