"""serve/client.py's streaming without a server: the order in which RemoteRun reads and sends its chunks (the HTTP
side is tests/e2e/test_serve.py's, against a real server)."""

from __future__ import annotations

import threading

import pytest

from inception_engine.results import EngineFacts, Prediction
from inception_engine.serve import client


@pytest.fixture
def recorded(monkeypatch):
    """A RemoteRun whose server is stubbed: what it asks the server is answered at once, each chunk is "classified"
    as its paths, and every read and send is logged in order."""
    log: list[tuple[str, int]] = []
    lock = threading.Lock()
    facts = EngineFacts("cpu", "fp32", 4, None, ())  # a batch of 4: a chunk is 4 paths
    monkeypatch.setattr(client, "server_facts", lambda conn, backend, precision: facts)

    def read_chunk(paths):
        with lock:
            log.append(("read", int(paths[0])))
        return {}, [(i, b"x") for i in range(len(paths))]

    def classify_chunk(self, paths, out, todo):
        with lock:
            log.append(("send", int(paths[0])))
        return [Prediction(p) for p in paths]

    monkeypatch.setattr(client, "read_chunk", read_chunk)
    monkeypatch.setattr(client.RemoteRun, "classify_chunk", classify_chunk)
    run = client.RemoteRun("http://127.0.0.1:9", top_k=1)
    yield run, log
    run.close()


def test_the_first_chunk_is_read_and_sent_alone(recorded):
    """Until the first answer, nothing but the first chunk is read: a read-ahead beside it held the first request's
    thread off the GIL. After it, the later chunks stream, and the predictions come back in input order."""
    run, log = recorded
    paths = [str(i) for i in range(40)]  # 10 chunks of the server's batch of 4
    got = []
    for p in run.classify(paths):
        if not got:
            first_answer = list(log)
        got.append(p.image)
    assert got == paths
    assert first_answer == [("read", 0), ("send", 0)]
    assert sorted(e for e in log if e[0] == "read") == [("read", i) for i in range(0, 40, 4)]
