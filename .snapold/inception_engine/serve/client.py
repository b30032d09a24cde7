"""``inception-run --server URL``: a local run's predictions, computed by a running inception-serve.

The files are read here (the server never reads a path) and sent as binary v2 infer requests of ``batch`` images
(the server's max batch unless --batch-size says otherwise), asking for the classification of the probabilities
with exact scores: the server's runner gives the same top-k a local run's does, and each score comes back as the
shortest decimal of the same double, so the lines written are a local run's. The files are read in input order on
one thread (~60,000 small files/s from the page cache, several times what a GPU server classifies), each chunk sent
as soon as it is read on a thread of a pool that keeps ``inflight`` requests outstanding; predictions come back in
input order, a chunk at a time. Reading in order makes the first request leave after its own files are read, not
after every outstanding chunk's (16 threads each reading its chunk at once held the first result back ~0.5 s with
requests of 256 images).

Per image errors: a file that cannot be read gets its error here, worded as a local run words it; an image the
server cannot decode comes back in the 400's ``errors`` (by its index in the request), re-worded with the path in
place of the server's ``images[i]``, and the chunk's other images are sent again without it. Anything else (no
server, a 5xx, a timeout) ends the run with one line: --resume continues it.

The output equals a local run's on the same backend and precision where the server's batches are the local run's:
each request is a batch of its own unless other clients' images join it. The CPU backend's C kernels compute each
image alone; its NumPy code (where they are unavailable: no AVX-512F) splits a batch's work by images and rows, so
that an image's scores can differ in the last bits of a float with its place in its batch, which a file the server
cannot decode shifts.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import EngineError
from ..ingest.files import read_file
from ..results import EngineFacts, ModelId, Prediction
from .wire import MODEL_NAME, encode_images_request, parse_classification

# Requests outstanding: enough that the server's jobs never wait for this client. A GPU server holds two jobs of a
# whole decode call each (256 images: serve/devices.py), so that its next job is decoded while one is computed: 8
# requests of 64 images filled exactly those two and none was queued behind them (H100: 3.86 s for 16,384 files
# against 3.07 s with jobs of 64); 16 keep two more jobs' worth received and parsed by the front-ends meanwhile.
INFLIGHT = 16
# Chunks read ahead until the first answer comes: one, so that the first request's thread never waits for the GIL
# behind a reader busy with the later chunks' files (which roughly doubled the time to the first result); the server
# has the first chunk to compute meanwhile, and the read-ahead starts with its answer.
FIRST_AHEAD = 1
TIMEOUT = 300.0  # seconds for one request's answer


class Connection:
    """One keep-alive HTTP connection per thread to the server at ``url``."""

    def __init__(self, url: str):
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EngineError(f"--server {url}: give the server's address as http://HOST:PORT")
        self.url, self.scheme = url, parts.scheme
        self.host, self.port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self._local = threading.local()
        self._opened: list[http.client.HTTPConnection] = []  # every thread's, for close

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            conn = self._local.conn = kind(self.host, self.port, timeout=TIMEOUT)
            self._opened.append(conn)
        return conn

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        """(status, JSON body); EngineError in one line where the server cannot be reached or answers no JSON.
        A kept-alive connection the server closed meanwhile is opened again once."""
        for attempt in (0, 1):
            conn = self._conn()
            try:
                conn.request(method, self.prefix + path, body=body, headers=headers or {})
                r = conn.getresponse()
                data = r.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                self._local.conn = None
                if attempt:
                    raise EngineError(f"the server at {self.url} closed the connection ({e})") from None
            except OSError as e:
                conn.close()
                self._local.conn = None
                raise EngineError(f"cannot reach the server at {self.url} ({e.strerror or e})") from None
        try:
            return r.status, json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise EngineError(f"the server at {self.url} answered {path} with {r.status} and no JSON; is it "
                              f"inception-serve?") from None

    def close(self) -> None:
        for conn in self._opened:
            conn.close()
        self._opened = []


def server_facts(conn: Connection, backend: str, precision: str) -> EngineFacts:
    """What the server computes with (its model configuration), checked against --backend and --precision where
    they name one: a server running another is refused rather than quietly used."""
    status, config = conn.request("GET", f"/v2/models/{MODEL_NAME}/config")
    if status != 200:
        raise EngineError(f"the server at {conn.url} is not ready ({config.get('error', status)})")
    try:
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        model = (ModelId(params["model_digest"], params["model_kind"], params.get("model_source_sha256") or None)
                 if "model_digest" in params else None)
        facts = EngineFacts(params["backend"], params["precision"], int(config["max_batch_size"]),
                            Path(params["weights"]) if params.get("weights") not in (None, "None") else None, (),
                            model)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise EngineError(f"the server at {conn.url} did not describe its model as inception-serve does") from None
    for option, asked, runs in (("backend", backend, facts.backend_name), ("precision", precision, facts.precision)):
        if asked != "auto" and asked != runs:
            raise EngineError(f"--{option} {asked}: the server at {conn.url} runs {runs}")
    return facts


class RemoteRun:
    """The predictions of ``classify(paths)`` from the server, in order, as an iterator (what inception-run's
    --gpus run is: ``facts``, ``on_note``, ``close``). The server is asked what it runs at once, on a thread of
    its own, while the caller lists the inputs; ``facts`` waits for the answer (and raises its error)."""

    def __init__(self, url: str, top_k: int, backend: str = "auto", precision: str = "auto",
                 batch_size: int | None = None, on_progress: Callable[[int], None] | None = None,
                 inflight: int = INFLIGHT):
        self.conn = Connection(url)
        self.top_k, self.on_progress, self.batch_size = top_k, on_progress, batch_size
        self.on_note: Callable[[str], None] | None = None  # the server's notes are its own: none come here
        self._pool = ThreadPoolExecutor(inflight, thread_name_prefix="server-request")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="server-read")  # in order: module docstring
        self._asked = self._pool.submit(server_facts, self.conn, backend, precision)
        self._inflight = inflight
        self._it: Iterator[Prediction] | None = None

    def facts(self) -> EngineFacts:
        return self._asked.result()

    @property
    def batch(self) -> int:
        """Images a request: --batch-size, else the server's max batch."""
        return self.batch_size or self.facts().batch_size

    def classify(self, paths: list[str]) -> RemoteRun:
        self._it = self._stream(paths)
        return self

    def __iter__(self) -> RemoteRun:
        return self

    def __next__(self) -> Prediction:
        if self._it is None:
            raise RuntimeError("RemoteRun.classify gives it its inputs first")
        return next(self._it)

    def _stream(self, paths: list[str]) -> Iterator[Prediction]:
        batch = self.batch
        chunks = deque(range(0, len(paths), batch))
        waiting: deque[Future[list[Prediction]]] = deque()
        ahead = FIRST_AHEAD
        while chunks or waiting:
            while chunks and len(waiting) < ahead:  # read ahead, bounded
                start = chunks.popleft()
                chunk = paths[start:start + batch]
                read = self._reader.submit(read_chunk, chunk)
                waiting.append(self._pool.submit(lambda c=chunk, r=read: self.classify_chunk(c, *r.result())))
            preds = waiting.popleft().result()
            ahead = 2 * self._inflight  # the first answer came: read ahead
            if self.on_progress:
                self.on_progress(len(preds))
            yield from preds

    def classify_chunk(self, paths: list[str], out: dict[int, Prediction],
                       todo: list[tuple[int, bytes]]) -> list[Prediction]:
        """One chunk's predictions, from its files as read_chunk read them: sent, and the ones the server could
        not decode left out and the rest sent again, until every image has its prediction or its error."""
        while todo:
            body, headers = encode_images_request([data for _, data in todo], self.top_k)
            status, doc = self.conn.request("POST", f"/v2/models/{MODEL_NAME}/infer", body, headers)
            if status == 400 and doc.get("errors"):
                bad = {int(e["index"]): str(e["error"]) for e in doc["errors"]}
                for j, message in bad.items():
                    i = todo[j][0]
                    out[i] = Prediction(paths[i], error=reworded(message, j, paths[i]))
                todo = [item for j, item in enumerate(todo) if j not in bad]
                continue
            if status != 200:
                raise EngineError(f"the server at {self.conn.url} answered {status}: {doc.get('error', doc)}")
            out.update(self.predictions(doc, paths, [i for i, _ in todo]))
            todo = []
        return [out[i] for i in range(len(paths))]

    def predictions(self, doc: dict[str, Any], paths: list[str], rows: list[int]) -> dict[int, Prediction]:
        try:
            (output,) = doc["outputs"]
            data = output["data"]
            k = output["shape"][1]
            tops = [parse_classification(data[r * k:(r + 1) * k]) for r in range(len(rows))]
        except (KeyError, ValueError, TypeError, IndexError):
            raise EngineError(f"the server at {self.conn.url} answered with outputs inception-serve does not "
                              f"give") from None
        f = self.facts()
        model = f.model.name if f.model is not None else None
        return {i: Prediction(paths[i], top, backend=f.backend_name, precision=f.precision, model=model)
                for i, top in zip(rows, tops)}

    def close(self) -> None:
        if self._it is not None:
            self._it.close()  # type: ignore[attr-defined]  # a generator
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._reader.shutdown(wait=True, cancel_futures=True)
        self.conn.close()


def read_chunk(paths: list[str]) -> tuple[dict[int, Prediction], list[tuple[int, bytes]]]:
    """A chunk's files read: the errors of those that cannot be read (worded as a local run words them), by
    position, and the (position, bytes) of the rest."""
    failed: dict[int, Prediction] = {}
    read: list[tuple[int, bytes]] = []
    for i, path in enumerate(paths):
        data, error = read_file(path)
        if data is None:
            failed[i] = Prediction(path, error=error)
        else:
            read.append((i, data))
    return failed, read


def reworded(message: str, index: int, path: str) -> str:
    """The server's error for image ``images[index]`` of a request, naming the file instead, as a local run does."""
    prefix = f"images[{index}]"
    return path + message[len(prefix):] if message.startswith(prefix) else f"{path}: {message}"

