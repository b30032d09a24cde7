"""serve/protocol.py without a server: v2 requests parsed (JSON and Triton's binary data), faults refused with the
reason, responses read back as tritonclient reads them; the batcher's lanes."""

from __future__ import annotations

import asyncio
import json
import struct

import numpy as np
import pytest

from inception_engine.labels import imagenet_labels, network_labels
from inception_engine.serve import protocol as p
from inception_engine.serve import wire
from inception_engine.serve.batcher import Batcher, Lane, Pending, Piece

SIZE = 299


def binary(inputs: list[dict], blob: bytes, **extra) -> tuple[bytes, str]:
    head = json.dumps({"inputs": inputs, **extra}).encode()
    return head + blob, str(len(head))


def bytes_blob(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def test_binary_bytes_input_with_outputs():
    blob = bytes_blob([b"one", b"", b"three"])
    body, hl = binary([{"name": "images", "datatype": "BYTES", "shape": [3, 1],
                        "parameters": {"binary_data_size": len(blob)}}], blob, id="x",
                      outputs=[{"name": "probabilities", "parameters": {"classification": 2}},
                               {"name": "logits", "parameters": {"binary_data": True}}])
    req = p.parse_infer(body, hl, SIZE, 8)
    assert req.encoded == [b"one", b"", b"three"] and req.id == "x" and req.count == 3
    assert req.outputs == [p.OutputSpec("probabilities", False, 2), p.OutputSpec("logits", True, 0)]
    assert req.needs_logits and req.top_k == 2


def test_classification_only_skips_logits_and_default_outputs_are_both():
    doc = {"inputs": [{"name": "images", "datatype": "BYTES", "shape": [1], "data": ["abc"]}],
           "outputs": [{"name": "probabilities", "parameters": {"classification": 5, "exact_scores": True}}]}
    req = p.parse_infer(json.dumps(doc).encode(), None, SIZE, 8)
    assert req.encoded == [b"abc"] and not req.needs_logits and req.outputs[0].exact
    doc.pop("outputs")
    doc["parameters"] = {"binary_data_output": True}
    req = p.parse_infer(json.dumps(doc).encode(), None, SIZE, 8)
    assert [(o.name, o.binary, o.classification) for o in req.outputs] == [("probabilities", True, 0),
                                                                             ("logits", True, 0)]


@pytest.mark.parametrize("dtype", ["FP32", "FP16"])
def test_tensor_input_binary_and_json(dtype):
    x = np.random.default_rng(0).standard_normal((2, 3, SIZE, SIZE)).astype(np.float32)
    raw = x.astype(np.float16 if dtype == "FP16" else np.float32).tobytes()
    body, hl = binary([{"name": "input", "datatype": dtype, "shape": list(x.shape),
                        "parameters": {"binary_data_size": len(raw)}}], raw)
    got = p.parse_infer(body, hl, SIZE, 8).tensor
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, x, rtol=1e-3 if dtype == "FP16" else 0, atol=1e-2 if dtype == "FP16" else 0)
    small = x[:1].tolist()  # nested lists are row-major too
    doc = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, SIZE, SIZE], "data": small}]}
    np.testing.assert_array_equal(p.parse_infer(json.dumps(doc).encode(), None, SIZE, 8).tensor, x[:1])


def refused(body: bytes, header: str | None = None, max_images: int = 8) -> p.ProtocolError:
    with pytest.raises(p.ProtocolError) as e:
        p.parse_infer(body, header, SIZE, max_images)
    assert "\n" not in str(e.value)
    return e.value


def test_faults_are_one_line_with_the_reason():
    assert "not valid JSON" in str(refused(b"{"))
    assert "not valid JSON" in str(refused(b"\xff\xfe"))
    assert "must be an integer" in str(refused(b"{}", "ten"))
    assert "body has 2 bytes" in str(refused(b"{}", "3"))
    blob = bytes_blob([b"abcdef"])
    body, hl = binary([{"name": "images", "datatype": "BYTES", "shape": [1],
                        "parameters": {"binary_data_size": len(blob)}}], blob)
    assert "truncated" in str(refused(body[:-2], hl))
    assert "past the inputs" in str(refused(body + b"xx", hl))
    body, hl = binary([{"name": "images", "datatype": "BYTES", "shape": [2],
                        "parameters": {"binary_data_size": len(blob)}}], blob)
    assert "before element 1's length" in str(refused(body, hl))
    body, hl = binary([{"name": "images", "datatype": "BYTES", "shape": [1],
                        "parameters": {"binary_data_size": len(blob) + 4}}], blob + b"\0\0\0\0")
    assert "past its 1 elements" in str(refused(body, hl))
    e = refused(json.dumps({"inputs": [{"name": "images", "datatype": "BYTES", "shape": [9],
                                        "data": ["a"] * 9}]}).encode())
    assert e.status == 413
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 3, SIZE, SIZE], "parameters": {"binary_data_size": 8}}
    assert "needs 1072812" in str(refused(*binary([tensor], b"\0" * 8)))
    nan = np.full((1, 3, SIZE, SIZE), np.inf, np.float32).tobytes()
    tensor["parameters"]["binary_data_size"] = len(nan)
    assert "not finite" in str(refused(*binary([tensor], nan)))
    assert "neither 'data'" in str(refused(json.dumps({"inputs": [{"name": "images", "datatype": "BYTES",
                                                                    "shape": [1]}]}).encode()))
    assert "not base64" in str(refused(json.dumps({"inputs": [{"name": "images", "datatype": "BYTES", "shape": [1],
                                                                "parameters": {"content_type": "base64"},
                                                                "data": ["%%%"]}]}).encode()))


@pytest.mark.parametrize("outputs, phrase", [
    ([{"name": "x"}], "unknown output"),
    ([], "non-empty list"),
    ([{"name": "logits"}, {"name": "logits"}], "twice"),
    ([{"name": "logits", "parameters": {"classification": 1001}}], "from 1 to 1000"),
    ([{"name": "logits", "parameters": {"classification": True}}], "from 1 to 1000"),
    ([{"name": "logits", "parameters": {"binary_data": "yes"}}], "true or false"),
    ([{"name": "logits", "parameters": []}], "must be an object"),
])
def test_bad_outputs(outputs, phrase):
    doc = {"inputs": [{"name": "images", "datatype": "BYTES", "shape": [1], "data": ["a"]}], "outputs": outputs}
    assert phrase in str(refused(json.dumps(doc).encode()))


@pytest.mark.parametrize("shape, datatype, phrase", [
    ([1, 3, 224, 224], "FP32", "shape [1, 3, 224, 224]"),
    ([0, 3, SIZE, SIZE], "FP32", "N >= 1"),
    ([1, 3, SIZE, SIZE], "INT8", "datatype 'INT8'"),
    ("1", "FP32", "non-negative integers"),
    ([-1, 3, SIZE, SIZE], "FP32", "non-negative integers"),
])
def test_bad_tensor_declarations(shape, datatype, phrase):
    doc = {"inputs": [{"name": "input", "datatype": datatype, "shape": shape, "data": [0.0]}]}
    assert phrase in str(refused(json.dumps(doc).encode()))


def tritonclient_reads(body: bytes, headers: dict[str, str]) -> dict[str, np.ndarray]:
    """The response's outputs as tritonclient.http.InferResult.as_numpy gives them."""
    pytest.importorskip("tritonclient.http")
    from tritonclient.http import InferResult

    n = headers.get(p.HEADER_LENGTH)
    result = InferResult.from_response_body(body, header_length=int(n) if n else None)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def test_response_json_and_binary_read_back_by_tritonclient():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((2, 1000)).astype(np.float32)
    probs = np.exp(logits.astype(np.float64))
    probs /= probs.sum(1, keepdims=True)
    answer = p.Answer(logits=logits, probs=probs)
    for binary_out in (False, True):
        req = p.InferRequest("r1", [p.OutputSpec("logits", binary_out), p.OutputSpec("probabilities", binary_out, 3)])
        body, headers = p.infer_response(req, answer, imagenet_labels())
        assert (p.HEADER_LENGTH in headers) == binary_out
        got = tritonclient_reads(body, headers)
        np.testing.assert_array_equal(got["logits"], logits)
        labels = imagenet_labels()
        order = np.argsort(-probs, axis=1, kind="stable")[:, :3]
        want = [[f"{probs[r, i]:f}:{i}:{labels[i]}" for i in order[r]] for r in range(2)]
        # tritonclient gives a JSON output's strings as str, a binary one's as bytes
        assert [[s.decode() if binary_out else s for s in row] for row in got["probabilities"].tolist()] == want


def test_top_from_the_runner_and_exact_scores_read_back():
    top = [[(5, 0.25), (7, 0.125)], [(1, 1 / 3), (2, 0.1)]]
    req = p.InferRequest(None, [p.OutputSpec("probabilities", False, 2, exact=True)])
    body, _ = p.infer_response(req, p.Answer(top=top), imagenet_labels())
    data = json.loads(body)["outputs"][0]["data"]
    assert [(i, s) for i, _, s in wire.parse_classification(data)] == [(5, 0.25), (7, 0.125), (1, 1 / 3), (2, 0.1)]


@pytest.mark.parametrize("from_runner", [True, False])
def test_classification_names_classes_by_the_labels_given(from_runner):
    """The FID network's labels are numbered: "score:index:class index" for every class, ImageNet's indices
    included, from the runner's top-k and from whole probability rows alike."""
    fid = network_labels("fid")
    probs = np.full((1, 1008), 1e-4)
    probs[0, [1005, 7]] = (0.5, 0.25)
    answer = p.Answer(top=[[(1005, 0.5), (7, 0.25)]]) if from_runner else p.Answer(logits=probs, probs=probs)
    req = p.InferRequest(None, [p.OutputSpec("probabilities", False, 2, exact=True)])
    data = json.loads(p.infer_response(req, answer, fid)[0])["outputs"][0]["data"]
    assert [(i, label) for i, label, _ in wire.parse_classification(data)] == [(1005, "class 1005"), (7, "class 7")]


def test_client_request_parses_as_the_server_reads_it():
    body, headers = wire.encode_images_request([b"a", b"bc"], 4)
    req = p.parse_infer(body, headers[p.HEADER_LENGTH], SIZE, 8)
    assert req.encoded == [b"a", b"bc"] and req.top_k == 4 and not req.needs_logits and req.outputs[0].exact


def test_metadata_and_config():
    meta = p.model_metadata(SIZE, 1000)
    assert meta["name"] == "inception_v3" and [i["name"] for i in meta["inputs"]] == ["images", "input"]
    config = p.model_config(SIZE, 64, {"backend": "cpu"}, imagenet_labels())
    assert config["max_batch_size"] == 64 and config["parameters"] == {"backend": {"string_value": "cpu"}}
    assert [(o["dims"], o["label_filename"]) for o in config["output"]] == [([1000], "imagenet_classes.txt")] * 2
    # the FID network: its 1008 classes, and no label file (ImageNet's names are not its classes')
    fid = p.model_config(SIZE, 64, {}, network_labels("fid"))
    assert [o["dims"] for o in fid["output"]] == [[1008]] * 2 and not any("label_filename" in o for o in fid["output"])


# ---------------------------------------------------------------------------------------------------- batcher

def test_lane_splits_the_last_piece_to_fill_a_batch():
    async def go() -> None:
        lane = Lane()
        fut = asyncio.get_running_loop().create_future()
        a = Pending("tensor", list(range(5)), ["n"] * 5, 0, fut)
        lane.add(Piece(a, 0, 5))
        lane.add(Piece(a, 5, 5))
        taken = lane.take(3)
        assert [(x.start, x.stop) for x in taken] == [(0, 3)] and lane.count == 2
        assert [(x.start, x.stop) for x in lane.take(8)] == [(3, 5), (5, 5)] and lane.count == 0

    asyncio.run(go())


class FakeDevice:
    """A device that answers each tensor job with its rows' first values, recording batch sizes."""

    name, depth, encoded_batch = "fake", 1, 4

    def __init__(self) -> None:
        self.batches: list[int] = []

    def run(self, job):
        fut = asyncio.get_running_loop().create_future()
        self.batches.append(len(job.data))
        asyncio.get_running_loop().call_later(0.01, fut.set_result, [row[0] for row in job.data])
        return fut


def test_batcher_joins_requests_splits_large_ones_and_answers_each_its_own():
    async def go() -> tuple[list, list[int]]:
        dev = FakeDevice()
        batcher = Batcher([dev], max_batch=4, max_delay=0.05)
        reqs = [np.arange(n, dtype=np.float32)[:, None] + 100 * k for k, n in enumerate([1, 2, 9, 1])]
        answers = await asyncio.gather(*(batcher.run("tensor", r, ["x"] * len(r)) for r in reqs))
        await batcher.close()
        return [list(map(float, a)) for a in answers], dev.batches

    answers, batches = asyncio.run(go())
    assert answers == [[0.0], [100.0, 101.0], [200.0 + i for i in range(9)], [300.0]]
    assert sum(batches) == 13 and max(batches) == 4 and len(batches) == 4  # 13 images in 4 batches of up to 4


class RecordingDevice:
    """Answers each image with (job number, its name); records every job's size. ``gate`` holds the first job
    until released, so that requests queue behind it as they do behind a busy GPU."""

    def __init__(self, encoded_batch: int):
        self.name, self.depth, self.encoded_batch = "gpu0", 1, encoded_batch
        self.jobs: list[tuple[str, int]] = []
        self.gate = asyncio.Event()

    def run(self, job) -> asyncio.Future:
        number = len(self.jobs)
        self.jobs.append((job.kind, len(job.names)))

        async def answer():
            if number == 0:
                await self.gate.wait()
            if job.kind == "tensor":
                return list(np.asarray(job.data)[:, :1])
            return [(number, name) for name in job.names]

        return asyncio.ensure_future(answer())


def run_requests(device: RecordingDevice, kind: str, sizes: list[int], max_batch: int = 64):
    async def main():
        batcher = Batcher([device], max_batch, 0.0)
        first = asyncio.create_task(batcher.run(kind, data(1, 0), ["first"], 1))
        await asyncio.sleep(0.01)  # the first job holds the device: the rest queue
        reqs = [asyncio.create_task(batcher.run(kind, data(n, r), [f"r{r}i{i}" for i in range(n)], 1))
                for r, n in enumerate(sizes)]
        await asyncio.sleep(0.01)
        device.gate.set()
        out = await asyncio.gather(first, *reqs)
        await batcher.close()
        return out[1:]

    def data(n: int, r: int):
        return [b"x"] * n if kind == "encoded" else np.full((n, 1, 1, 3), r, np.uint8)

    return asyncio.run(main())


def test_encoded_jobs_fill_to_the_devices_decode_call_and_answers_stay_in_order():
    device = RecordingDevice(encoded_batch=256)
    sizes = [64, 64, 100, 30, 200]
    results = run_requests(device, "encoded", sizes)
    assert [n for _, n in device.jobs[1:]] == [256, 202]  # 458 queued images: a whole decode call, then the rest
    for r, (n, got) in enumerate(zip(sizes, results)):
        assert [name for _, name in got] == [f"r{r}i{i}" for i in range(n)]
    # request 3 (images 228..257) ends past the job's 256: its images come from two jobs, back in order
    assert [{job for job, _ in got} for got in results] == [{1}, {1}, {1}, {1, 2}, {2}]


def test_other_lanes_take_max_batch_jobs():
    device = RecordingDevice(encoded_batch=256)
    run_requests(device, "pixels", [64, 64, 100])
    assert [n for _, n in device.jobs[1:]] == [64, 64, 64, 36]


def test_a_device_without_decode_calls_gets_max_batch_encoded_jobs():
    device = RecordingDevice(encoded_batch=64)
    run_requests(device, "encoded", [100, 100])
    assert [n for _, n in device.jobs[1:]] == [64, 64, 64, 8]


def test_lane_drops_the_images_of_requests_nobody_waits_for():
    async def go() -> None:
        lane = Lane()
        loop = asyncio.get_running_loop()
        gone, kept = loop.create_future(), loop.create_future()
        lane.add(Piece(Pending("tensor", [0] * 3, ["n"] * 3, 0, gone), 0, 3))
        lane.add(Piece(Pending("tensor", [0] * 2, ["n"] * 2, 0, kept), 0, 2))
        gone.cancel()  # its request timed out
        taken = lane.take(4)
        assert [p.request.future for p in taken] == [kept] and lane.count == 0

    asyncio.run(go())


def test_memory_files_are_readable_by_path_and_errors_name_the_image():
    """--decode gpu's jpeg_batch.c reads files by name: the images go to it as the server's own memory files, and
    its errors come back naming the image."""
    from inception_engine.ingest.files import read_file
    from inception_engine.serve.devices import MemoryFiles, renamed

    files = MemoryFiles()
    items = [b"\xff\xd8 first", b"", b"x" * 300_000]
    paths = files.hold(items)
    got = [read_file(p) for p in paths]  # opened by path as jpeg_batch.c opens them (a regular file)
    names = dict(zip(paths, ["images[0]", "images[1]", "images[2]"]))
    assert [data for data, _ in got] == [items[0], None, items[2]]
    assert renamed(got[1][1], names) == "images[1]: empty file"
    assert renamed([(1, 0.5)], names) == [(1, 0.5)] and renamed("other: x", names) == "other: x"
    # the next batch rewrites the same files: shorter and longer contents, views of a body, read back exactly
    body = memoryview(b"..abc" + b"y" * 70_000)
    again = [b"z" * 400_000, body[2:5], body[5:]]
    assert files.hold(again) == paths
    assert [read_file(p)[0] for p in paths] == [again[0], b"abc", b"y" * 70_000]
    assert files.hold(again[:1]) == paths[:1]
    files.close()
    assert read_file(paths[0])[0] is None  # closed: nothing left behind


def test_a_job_of_body_views_goes_to_a_worker_process_as_bytes():
    """Images are views of the request body (no copy) on the server; a worker process (several GPUs) gets bytes."""
    import pickle

    from inception_engine.serve.devices import Job, picklable

    body = memoryview(b"\x05\x00\x00\x00hello")
    job = Job("encoded", [body[4:]], ["images[0]"], 5)
    with pytest.raises(TypeError):
        pickle.dumps(job)
    sent = pickle.loads(pickle.dumps(picklable(job)))
    assert sent.data == [b"hello"] and sent.names == ["images[0]"] and sent.top_k == 5
    pixels = Job("pixels", np.zeros((1, 2, 2, 3), np.uint8), ["x"])
    assert picklable(pixels) is pixels


def test_which_bodies_are_parsed_off_the_event_loop():
    """A large JSON part or a large binary tensor goes to a thread; a BYTES request's binary images (only delimited)
    of a few MB, and small bodies, are parsed in place."""
    pytest.importorskip("starlette")
    from inception_engine.serve.app import OFF_LOOP_BINARY_BYTES, OFF_LOOP_BYTES, parse_is_long

    assert not parse_is_long(3 << 20, "200")  # 64 JPEGs after a small header
    assert parse_is_long(OFF_LOOP_BINARY_BYTES + 300, "200")  # an FP32 tensor of 16+ images
    assert parse_is_long(OFF_LOOP_BYTES + 1, None)  # all JSON
    assert parse_is_long(OFF_LOOP_BYTES + 10, "x")  # a header the parser refuses: the body counted as JSON
    assert not parse_is_long(1000, None)
