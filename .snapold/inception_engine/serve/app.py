"""The HTTP server: an ASGI application (Starlette) speaking the Open Inference Protocol, a plain endpoint for curl,
Prometheus metrics.

Routes: ``GET /v2/health/live``, ``/v2/health/ready`` (200 once every device has warmed up; 503 before, and while
shutting down), ``/v2`` (server metadata), ``/v2/models/inception_v3`` (model metadata), ``.../ready``,
``.../config`` (Triton's model configuration: max_batch_size, and the backend, precision and weight file as
parameters), ``POST /v2/models/inception_v3/infer`` (also under ``/versions/1``), ``POST /v1/classify`` (one image
as the body; ``?top_k=5&name=cat.jpg``: the JSON entry ``inception-run --json`` gives), ``GET /metrics``.

One bad image in a request of many: the whole request gets 400, ``{"error": "...", "errors": [{"index", "error"},
...]}`` naming every image that could not be decoded and why; nothing of it is computed (Triton's answer to a bad
tensor), and every other request goes on. Any fault of a request is a 4xx with the protocol's JSON error; a fault of
the server (a device failing) a 500 with one line, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess, values
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..results import EngineFacts
from ..ingest.images import Preprocess, decode_call_images, network_input
from ..ingest.workers import decode_into
from ..output import as_json
from ..pipeline import Prediction, labelled, softmax
from .batcher import Batcher, BatchStats
from .devices import DeviceError, make_devices
from .frontends import HubClient
from .settings import MULTIPROC_ENV, Limits, ServeOptions
from .protocol import (HEADER_LENGTH, MODEL_NAME, MODEL_VERSION, OUTPUT_PROBS, Answer, InferRequest, OutputSpec,
                       ProtocolError, infer_response, model_config, model_metadata, parse_infer)


def multiprocess_metrics() -> bool:
    """Whether this process's metrics go to prometheus-client's multiprocess files (the directory in
    $PROMETHEUS_MULTIPROC_DIR: with several front-ends, hub.py); every metric made from now on follows it, even where
    prometheus_client was imported before the variable was set (or unset)."""
    on = bool(os.environ.get(MULTIPROC_ENV))
    values.ValueClass = values.MultiProcessValue() if on else values.MutexValue
    return on


class Metrics:
    """The server's Prometheus metrics, in a registry of its own; with several processes (multiprocess_metrics),
    each process's values in the shared files, which ``exposition`` adds up."""

    def __init__(self, max_batch: int):
        self.multiprocess = multiprocess_metrics()
        r = self.registry = CollectorRegistry()
        self.requests = Counter("inception_requests", "Requests answered, by route and HTTP status",
                                ["route", "status"], registry=r)
        self.failures = Counter("inception_request_failures", "Requests answered with an error (4xx, 5xx)",
                                ["route", "status"], registry=r)
        self.request_seconds = Histogram("inception_request_seconds", "Time from a request's arrival to its answer",
                                         ["route"], registry=r)
        self.queue_seconds = Histogram("inception_queue_seconds", "Time images wait for their batch",
                                       registry=r, buckets=(.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 5))
        self.compute_seconds = Histogram("inception_compute_seconds", "Time a device takes for a batch",
                                         ["device"], registry=r,
                                         buckets=(.001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10))
        # a GPU-decoded job may hold a decode call of several batches (devices.py)
        most = decode_call_images(max_batch)
        sizes = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, max_batch, most} & set(range(1, most + 1)))
        self.batch_images = Histogram("inception_batch_images", "Images per batch", ["device"], registry=r,
                                      buckets=sizes)
        self.images = Counter("inception_images", "Images computed, by device", ["device"], registry=r)
        self.ready = Gauge("inception_ready", "1 once every device has warmed up", registry=r,
                           multiprocess_mode="livemax")
        self.in_flight = Gauge("inception_requests_in_flight", "Requests being answered", ["route"], registry=r,
                               multiprocess_mode="livesum")
        # each label set's children looked up once (prometheus_client's labels() checks and locks at every call:
        # half the metrics' time a request)
        self._routes: dict[str, tuple[Any, Any]] = {}
        self._statuses: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._devices: dict[str, tuple[Any, Any, Any]] = {}

    def exposition(self) -> bytes:
        """The metrics as Prometheus text: this process's, or every process's added up."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)

    def batch(self, stats: BatchStats) -> None:
        if stats.device not in self._devices:
            self._devices[stats.device] = (self.images.labels(stats.device), self.batch_images.labels(stats.device),
                                           self.compute_seconds.labels(stats.device))
        images, batch_images, compute_seconds = self._devices[stats.device]
        images.inc(stats.images)
        batch_images.observe(stats.images)
        compute_seconds.observe(stats.compute_seconds)
        for q in stats.queue_seconds:
            self.queue_seconds.observe(q)

    def route(self, route: str) -> tuple[Any, Any]:
        """The route's in-flight gauge and request-seconds histogram."""
        if route not in self._routes:
            self._routes[route] = (self.in_flight.labels(route), self.request_seconds.labels(route))
        return self._routes[route]

    def answered(self, route: str, status: int, seconds: float) -> None:
        if (route, status) not in self._statuses:
            self._statuses[route, status] = (self.requests.labels(route, str(status)),
                                             self.failures.labels(route, str(status)) if status >= 400 else None)
        requests, failures = self._statuses[route, status]
        requests.inc()
        if failures is not None:
            failures.inc()
        self.route(route)[1].observe(seconds)


class Server:
    """The devices, their batcher and the decode threads, behind the routes; or, in a front-end process of several
    (``hub``: frontends.HubClient), the decode threads and the link to the process that holds the devices."""

    def __init__(self, options: ServeOptions, on_ready: Callable[[EngineFacts | None, list[str]], Any] | None = None,
                 hub: HubClient | None = None):
        self.options, self.limits = options, options.limits
        self.metrics = Metrics(options.max_batch)
        self.devices: list[Any] = []
        self.device_names: list[str] = []
        self.hub = hub
        self.batcher: Batcher | HubClient | None = None
        self.facts: EngineFacts | None = None
        self.ready = False
        self.failed: str | None = None  # why the devices could not start
        self.on_ready = on_ready
        self.decode_pool = ThreadPoolExecutor(options.decode_workers, thread_name_prefix="decode")
        self.pre = Preprocess()  # the weight file's, once a device has read it
        self.size = self.pre.size

    async def start(self) -> None:
        """Build and warm up every device, then serve (``ready``)."""
        loop = asyncio.get_running_loop()
        try:
            if self.hub is not None:
                self.facts, self.pre, self.device_names = await self.hub.ready()
                self.batcher = self.hub
            else:
                self.devices = make_devices(self.options.spec, self.options.gpus, loop)
                all_facts = await asyncio.gather(*(d.ready() for d in self.devices))
                self.facts, self.pre = all_facts[0]
                self.device_names = [d.name for d in self.devices]
                self.batcher = Batcher(self.devices, self.options.max_batch, self.options.max_delay,
                                       self.metrics.batch)
        except Exception as e:
            self.failed = str(e)
            if self.on_ready is not None:
                self.on_ready(None, [])
            return
        self.size = self.pre.size
        self.ready = True
        self.metrics.ready.set(1)
        if self.on_ready is not None:
            self.on_ready(self.facts, self.device_names)

    async def stop(self) -> None:
        self.ready = False
        self.metrics.ready.set(0)
        if self.hub is not None:  # the hub's devices: it ends them, once every front-end has stopped
            self.hub.close()
        elif self.batcher is not None:
            assert isinstance(self.batcher, Batcher)
            await self.batcher.close()
        await asyncio.get_running_loop().run_in_executor(None, self._close_devices)
        self.decode_pool.shutdown(wait=True, cancel_futures=True)

    def _close_devices(self) -> None:
        for d in self.devices:
            d.close()

    # ------------------------------------------------------------------------------------------- the computation

    async def decode(self, encoded: list[bytes], names: list[str]) -> np.ndarray:
        """Each image decoded on the host (Pillow: the weight file's preprocessing exactly) in the decode threads,
        into (n, *Preprocess.decoded_shape): ProtocolError naming every image that could not be."""
        loop = asyncio.get_running_loop()
        pre, n = self.pre, len(encoded)
        pixels = np.empty((n, *pre.decoded_shape), pre.pixel_dtype)
        step = -(-n // self.options.decode_workers)  # one task a thread: a future per image costs the loop more

        def decode_part(first: int) -> list[str | None]:
            return [decode_into(pixels, i, names[i], pre, encoded[i]) for i in range(first, min(first + step, n))]

        parts = await asyncio.gather(*(loop.run_in_executor(self.decode_pool, decode_part, first)
                                       for first in range(0, n, step)))
        bad_images([error for part in parts for error in part])
        return pixels

    async def compute(self, req: InferRequest, names: list[str]) -> Answer:
        """The request's answer from the batcher: top-k only (the runner's path) where that is all it asks for."""
        assert self.batcher is not None
        if req.encoded is not None and not req.needs_logits:
            if self.options.spec.decode == "gpu":
                tops = await self.batcher.run("encoded", req.encoded, names, req.top_k)
            else:
                tops = await self.batcher.run("pixels", await self.decode(req.encoded, names), names, req.top_k)
            bad_images(tops)
            return Answer(top=tops)
        if req.encoded is not None:
            pixels = await self.decode(req.encoded, names)
            x = await asyncio.get_running_loop().run_in_executor(self.decode_pool, network_input, pixels,
                                                                 self.pre)
        else:
            x = req.tensor
        logits = np.stack(await self.batcher.run("tensor", x, names))
        return Answer(logits=logits, probs=softmax(logits))


class GracefulServer:
    """uvicorn's server, whose SIGTERM and SIGINT stop it gracefully and end the process with 0 (uvicorn raises the
    signal again once stopped, which would end it with the signal's status)."""

    def __init__(self, app: Any, sock: socket.socket, timeout: float):
        import uvicorn

        class Quiet(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                super().handle_exit(sig, frame)
                self._captured_signals.clear()  # the stop it asked for is done: exit 0, not by the signal

        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=timeout, timeout_keep_alive=5)
        self.server, self.sock = Quiet(config), sock

    def run(self) -> None:
        self.server.run(sockets=[self.sock])

    def stop(self) -> None:
        self.server.should_exit = True


def bad_images(results: list[Any]) -> None:
    """ProtocolError (400) naming every image whose result is an error message."""
    errors = [(i, r) for i, r in enumerate(results) if isinstance(r, str)]
    if errors:
        first = errors[0][1]
        more = f" (and {len(errors) - 1} more: see 'errors')" if len(errors) > 1 else ""
        raise ProtocolError(f"{len(errors)} of {len(results)} images could not be decoded: {first}{more}",
                            errors=errors)


# ------------------------------------------------------------------------------------------------------- routes

async def read_body(request: Request, limits: Limits) -> bytes:
    """The request's body within the limits (size, time), decompressed where it says gzip or deflate."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limits.max_body_bytes):
        raise ProtocolError(f"the body is larger than this server takes ({limits.max_body_bytes} bytes)"
                            if declared.isdigit() else "Content-Length is not a number", status=413)
    chunks, total = [], 0
    try:
        async with asyncio.timeout(limits.body_seconds):
            async for chunk in request.stream():
                total += len(chunk)
                if total > limits.max_body_bytes:
                    raise ProtocolError(f"the body is larger than this server takes ({limits.max_body_bytes} "
                                        f"bytes)", status=413)
                chunks.append(chunk)
    except TimeoutError:
        raise ProtocolError(f"the body did not arrive within {limits.body_seconds:g} s", status=408) from None
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding in ("gzip", "deflate"):
        inflate = zlib.decompressobj(47 if encoding == "gzip" else 15)
        try:
            body = inflate.decompress(body, limits.max_body_bytes + 1)
        except zlib.error as e:
            raise ProtocolError(f"the body is not valid {encoding} ({e})") from None
        if len(body) > limits.max_body_bytes or inflate.unconsumed_tail:
            raise ProtocolError(f"the body inflates past {limits.max_body_bytes} bytes", status=413)
    elif encoding != "identity":
        raise ProtocolError(f"Content-Encoding {encoding!r} is not supported (gzip, deflate)", status=415)
    return body


def error(message: str, status: int, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def make_app(server: Server) -> Starlette:
    """The ASGI application: the routes above, each answer counted in the metrics."""

    def counted(route: str, handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            t0 = time.perf_counter()
            in_flight = server.metrics.route(route)[0]
            in_flight.inc()
            try:
                response = await handler(request)
            except ProtocolError as e:
                response = JSONResponse(e.body(), status_code=e.status)
            except ClientDisconnect:  # nobody to answer; counted as the 499 nginx logs for it
                response = Response(status_code=499)
            except DeviceError as e:
                response = error(f"the engine failed on this request's batch: {e}", 500)
            finally:
                in_flight.dec()
            server.metrics.answered(route, response.status_code, time.perf_counter() - t0)
            return response

        return endpoint

    def model_route(path: str, handler: Callable[[Request], Any], methods: list[str], name: str) -> list[Route]:
        base = "/v2/models/{model}"
        return [Route(base + path, counted(name, handler), methods=methods),
                Route(base + "/versions/{version}" + path, counted(name, handler), methods=methods)]

    routes = [Route("/v2/health/live", counted("live", lambda r: live(server, r))),
              Route("/v2/health/ready", counted("ready", lambda r: ready(server, r))),
              Route("/v2", counted("server", lambda r: server_metadata(server, r))),
              *model_route("", lambda r: metadata(server, r), ["GET"], "metadata"),
              *model_route("/ready", lambda r: model_ready(server, r), ["GET"], "model_ready"),
              *model_route("/config", lambda r: config(server, r), ["GET"], "config"),
              *model_route("/infer", lambda r: infer(server, r), ["POST"], "infer"),
              Route("/v1/classify", counted("classify", lambda r: classify(server, r)), methods=["POST"]),
              Route("/metrics", counted("metrics", lambda r: metrics(server, r)))]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        started = asyncio.create_task(server.start())
        yield
        started.cancel()
        await server.stop()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error(f"{request.method} {request.url.path}: {exc.detail}", exc.status_code)

    async def internal(request: Request, exc: Exception) -> Response:
        return error(f"internal error: {type(exc).__name__}", 500)

    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: http_error, Exception: internal})


async def live(server: Server, request: Request) -> Response:
    return JSONResponse({"live": True})


async def ready(server: Server, request: Request) -> Response:
    if server.ready:
        return JSONResponse({"ready": True})
    return error(server.failed or "not ready: the engines are warming up", 503)


async def server_metadata(server: Server, request: Request) -> Response:
    return JSONResponse({"name": "inception-serve", "version": __version__,
                         "extensions": ["classification", "binary_tensor_data", "model_configuration"]})


def check_model(server: Server, request: Request, need_ready: bool = True) -> None:
    model, version = request.path_params.get("model"), request.path_params.get("version")
    if model != MODEL_NAME:
        raise ProtocolError(f"unknown model {model!r}; this server serves {MODEL_NAME!r}", status=404)
    if version not in (None, "", MODEL_VERSION):
        raise ProtocolError(f"model {MODEL_NAME!r} has version {MODEL_VERSION} only, not {version!r}", status=404)
    if need_ready and not server.ready:
        raise ProtocolError(server.failed or "not ready: the engines are warming up", status=503)


async def metadata(server: Server, request: Request) -> Response:
    check_model(server, request)
    # the network's classes, known once its engines are ready
    return JSONResponse(model_metadata(server.size, len(server.facts.labels) if server.facts is not None else -1))


async def model_ready(server: Server, request: Request) -> Response:
    check_model(server, request)
    return JSONResponse({"name": MODEL_NAME, "ready": True})


async def config(server: Server, request: Request) -> Response:
    check_model(server, request)
    f = server.facts
    assert f is not None
    facts = {"backend": f.backend_name, "precision": f.precision, "weights": str(f.weights_path),
             "decode": server.options.spec.decode, "devices": ",".join(server.device_names)}
    if f.model is not None:  # what every result names the model by (results.ModelId), as inception-run's
        facts |= {"model_digest": f.model.digest, "model_kind": f.model.kind,
                  "model_source_sha256": f.model.source_sha256 or ""}
    return JSONResponse(model_config(server.size, server.options.max_batch, facts, f.labels))


async def infer(server: Server, request: Request) -> Response:
    check_model(server, request)
    body = await read_body(request, server.limits)
    header_length = request.headers.get(HEADER_LENGTH)
    req = await off_loop(parse_is_long(len(body), header_length), parse_infer, body, header_length, server.size,
                         server.limits.max_images)
    names = [f"images[{i}]" for i in range(req.count)]
    answer = await answered_in_time(server, server.compute(req, names))
    # whole tensors as JSON: ~20 bytes a value to format
    as_json = req.needs_logits and any(not o.binary and not o.classification for o in req.outputs)
    assert server.facts is not None  # ready before it answers
    content, headers = await off_loop(as_json and req.count * 1000 * 20 > OFF_LOOP_BYTES, infer_response, req,
                                      answer, server.facts.labels)
    return Response(content, headers=headers)


# A request's JSON parsed, or a response's JSON formatted, on a thread where it is larger than this: a large one
# takes the event loop for longer than a batch (json.loads of a 64-image FP32 tensor: seconds), a small one less
# than the trip to a thread and back.
OFF_LOOP_BYTES = 1 << 20
# Binary data after the JSON, the same: an FP32 tensor's values are checked (finite) at ~5 GB/s, a few ms at this
# size; a BYTES tensor's elements are only delimited (views of the body), microseconds however large its images.
OFF_LOOP_BINARY_BYTES = 16 << 20


def parse_is_long(body_bytes: int, header_length: str | None) -> bool:
    """Whether parsing a request body would hold the event loop long enough to go to a thread: its JSON part
    larger than OFF_LOOP_BYTES or its binary part larger than OFF_LOOP_BINARY_BYTES (the HTTP header, checked by
    the parser, tells them apart; where it is not a number the whole body counts as JSON)."""
    text = min(int(header_length), body_bytes) if header_length is not None and header_length.isdigit() else body_bytes
    return text > OFF_LOOP_BYTES or body_bytes - text > OFF_LOOP_BINARY_BYTES


async def off_loop(big: bool, fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args) if big else fn(*args)


async def answered_in_time(server: Server, work: Any) -> Any:
    try:
        async with asyncio.timeout(server.limits.request_seconds):
            return await work
    except TimeoutError:
        raise ProtocolError(f"not answered within {server.limits.request_seconds:g} s (the server is overloaded)",
                            status=503) from None


async def classify(server: Server, request: Request) -> Response:
    """One image as the body; its top-k as inception-run --json gives each result."""
    if not server.ready:
        raise ProtocolError(server.failed or "not ready: the engines are warming up", status=503)
    name = request.query_params.get("name", "image")
    top_k = request.query_params.get("top_k", "5")
    if not top_k.isdigit() or not 1 <= int(top_k) <= 1000:
        raise ProtocolError(f"top_k must be an integer from 1 to 1000, got {top_k[:20]!r}")
    body = await read_body(request, server.limits)
    req = InferRequest(None, [OutputSpec(OUTPUT_PROBS, classification=int(top_k))], encoded=[body])
    try:
        answer = await answered_in_time(server, server.compute(req, [name]))
    except ProtocolError as e:
        if not e.errors:
            raise
        return JSONResponse({"image": name, "error": e.errors[0][1]}, status_code=400)
    assert server.facts is not None and answer.top is not None
    f = server.facts
    p = Prediction(name, labelled(answer.top[0][:int(top_k)], f.labels), backend=f.backend_name,
                   precision=f.precision, model=f.model.name if f.model is not None else None)
    return JSONResponse(as_json(p))


async def metrics(server: Server, request: Request) -> Response:
    return Response(server.metrics.exposition(), headers={"content-type": CONTENT_TYPE_LATEST})
