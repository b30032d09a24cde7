"""``inception-serve``: the resident server (serve/app.py) on the given GPUs, or on the CPU backend where none.

It listens at once (``/v2/health/live`` answers), builds and warms up an engine per device (weights read, kernels
chosen, CUDA graphs captured, GPU decoders opened: devices.DeviceWorker.warm_up), and only then is ready
(``/v2/health/ready`` 200) and says so in one line on stderr. SIGTERM or SIGINT: it stops accepting connections,
answers the requests it has, ends the engines and exits with 0. Usage errors: one line, exit 2, as the other
commands.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import click
from PIL import Image

from .. import backends
from ..commands import CONTEXT, Command, user_errors, version_option
from ..config import BACKEND_CHOICES, DECODE_CHOICES, PRECISION_CHOICES, EngineConfig, resolve
from ..results import EngineFacts
from ..errors import EngineError, OptionError
from ..ingest.entries import DEFAULT_MAX_PIXELS, MAX_PIXELS_ENV
from ..ingest.workers import default_workers
from ..model_files import weight_file_path
from .settings import MULTIPROC_ENV, Limits, ServeOptions


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound now: a port in use is one line here rather than uvicorn's log."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise EngineError(f"--host {host}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise EngineError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def engine_spec(weights: str | None, backend: str, precision: str, batch_size: int | None, decode: str,
                gpus: int | None, max_pixels: int | None = None) -> tuple[EngineConfig, int]:
    """The engines' config, checked and resolved once (one line each where refused; ``auto`` made what it stands
    for, so that no device process probes again), and the number of devices: ``gpus`` (default every usable GPU),
    1 on the CPU backend."""
    if gpus == 0:
        raise OptionError("gpus", 0, "the server needs a device; the CPU is --backend cpu")
    config = EngineConfig(weights, backend, precision, batch_size, None, "thread", decode, max_pixels)
    if config.weights_path is not None and weights is not None:  # an ONNX export: converted (or found) once, here
        config = config.replace(weights=weight_file_path(config.weights_path))
    resolved = resolve(config)
    if resolved.backend_name == "cpu":
        if gpus is not None and gpus > 1:
            raise OptionError("gpus", gpus, "runs one engine a GPU; the cpu backend is one device")
        count = 1
    else:
        count = gpus if gpus is not None else max(1, backends.usable_gpus())
        backends.require_gpus(count)
    return config.replace(backend=resolved.backend_name, precision=resolved.precision,
                          batch_size=resolved.batch_size), count


@click.command(name="inception-serve", cls=Command, context_settings=CONTEXT)
@click.option("--weights", "weights_path", metavar="PATH",
              help="Weight file (default: $INCEPTION_WEIGHTS, then weights/inception_v3.npz, then the user cache).")
@click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True,
              help="auto = cuda when a GPU and pycuda are usable, else cpu.")
@click.option("--precision", type=click.Choice(PRECISION_CHOICES), default="auto", show_default=True,
              help="auto = tf32 on the GPU, fp32 on the CPU; one the backend lacks is refused.")
@click.option("--decode", type=click.Choice(DECODE_CHOICES), default="cpu", show_default=True,
              help="cpu: Pillow, torchvision's preprocessing exactly. gpu: JPEGs decoded by nvImageCodec and resized "
                   "on the GPU (cuda backend).")
@click.option("--max-batch", "--batch-size", "max_batch", type=click.IntRange(1, 4096), default=None,
              show_default="64 on the GPU, 8 on the CPU", help="Images per batch, joined from all requests.")
@click.option("--max-queue-delay-ms", type=click.FloatRange(0, 10_000), default=0.0, show_default=True,
              help="How long a batch waits for more images before it runs part-full (0, as Triton's: batches "
                   "still fill while the devices are busy).")
@click.option("--gpus", type=click.IntRange(0), default=None, metavar="N",
              help="GPUs to serve on, one engine each [default: all; the CPU backend where there are none].")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every one).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port (0: any free one, said in the ready line).")
@click.option("--max-images", type=click.IntRange(1), default=Limits.max_images, show_default=True,
              help="Images a request may hold.")
@click.option("--max-body-mb", type=click.FloatRange(0, min_open=True), default=Limits.max_body_bytes / 2**20,
              show_default=True, help="Largest request body, in MiB.")
@click.option("--request-timeout", type=click.FloatRange(0, min_open=True), default=Limits.request_seconds,
              show_default=True, help="Seconds a request may take, from its body's arrival to its answer.")
@click.option("--body-timeout", type=click.FloatRange(0, min_open=True), default=Limits.body_seconds,
              show_default=True, help="Seconds a request's body may take to arrive (a slower client gets 408).")
@click.option("--max-pixels", type=click.IntRange(1), default=None, metavar="N",
              help=f"Refuse an image that declares more than N pixels, before decoding it [default: "
                   f"${MAX_PIXELS_ENV}, else {DEFAULT_MAX_PIXELS:,}, Pillow's decompression-bomb limit].")
@click.option("--decode-workers", type=click.IntRange(1, 1024), default=None, metavar="N",
              help="Threads decoding images on the host [default: one per usable CPU; shared out among the "
                   "front-ends].")
@click.option("--http-workers", type=click.IntRange(1, 256), default=1, show_default=True, metavar="N",
              help="HTTP front-end processes receiving requests for the one engine process (more than 1: requests "
                   "are received and parsed on as many cores; the images reach the engine through shared memory).")
@version_option
@user_errors
def serve_cmd(weights_path: str | None, backend: str, precision: str, decode: str, max_batch: int | None,
              max_queue_delay_ms: float, gpus: int | None, host: str, port: int, max_images: int, max_body_mb: float,
              request_timeout: float, body_timeout: float, max_pixels: int | None, decode_workers: int | None,
              http_workers: int) -> None:
    """Serve Inception-V3 over HTTP (the Open Inference Protocol, as Triton speaks it) until SIGTERM or Ctrl-C."""
    warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # images.open_image refuses those itself
    spec, devices = engine_spec(weights_path, backend, precision, max_batch, decode, gpus, max_pixels)
    limits = Limits(int(max_body_mb * 2**20), max_images, request_timeout, body_timeout)
    options = ServeOptions(spec, devices, spec.batch_size, max_queue_delay_ms / 1000.0,
                           decode_workers or default_workers(), limits)
    sock = listening_socket(host, port)
    bound = sock.getsockname()
    address = f"http://{'[' + bound[0] + ']' if ':' in bound[0] else bound[0]}:{bound[1]}"
    failed: list[str] = []
    server: Any = None
    runner: Any = None  # app.GracefulServer, once made

    def on_ready(facts: EngineFacts | None, names: list[str]) -> None:
        if facts is None:
            if runner is not None:  # the one-process server stops here; the hub returns why itself
                failed.append(server.failed or "the engines could not start")
                runner.stop()
            return
        for note in facts.notes:
            click.echo(f"note: {note}", err=True)
        front = f", {http_workers} HTTP front-ends" if http_workers > 1 else ""
        click.echo(f"inception-serve: ready at {address} (devices {', '.join(names)}; {facts.backend_name} backend, "
                   f"{facts.precision}, decode {spec.decode}, max batch {spec.batch_size}{front}, weights "
                   f"{facts.weights_path})", err=True)

    if http_workers > 1:
        with metrics_directory():
            why = run_with_frontends(options, sock, http_workers, on_ready)
        if why is not None:
            raise EngineError(why)
        click.echo("inception-serve: stopped", err=True)
        return
    try:
        from .app import GracefulServer, Server, make_app
    except ImportError as e:
        raise EngineError(f"inception-serve needs {e.name} (pip install -e '.[serve]')") from None
    server = Server(options, on_ready)
    runner = GracefulServer(make_app(server), sock, timeout=request_timeout + 5)
    runner.run()
    if failed:
        raise EngineError(failed[0])
    click.echo("inception-serve: stopped", err=True)


@contextlib.contextmanager
def metrics_directory() -> Iterator[None]:
    """A directory of its own for prometheus-client's multiprocess files, named in the environment that the
    front-ends inherit; removed at the end."""
    d = tempfile.mkdtemp(prefix="inception-serve-metrics-")
    os.environ[MULTIPROC_ENV] = d
    try:
        yield
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(d, ignore_errors=True)


def run_with_frontends(options: ServeOptions, sock: socket.socket, count: int,
                       on_ready: Callable[[EngineFacts | None, list[str]], Any]) -> str | None:
    """The engine here, ``count`` HTTP front-end processes before it (hub.py): why it could not serve, or None."""
    try:
        from .hub import serve_with_frontends
    except ImportError as e:
        raise EngineError(f"inception-serve needs {e.name} (pip install -e '.[serve]')") from None
    return serve_with_frontends(options, sock, count, on_ready)


def serve_main() -> None:
    """Serve the model over HTTP (the Open Inference Protocol, as Triton speaks it) on every GPU, until stopped."""
    serve_cmd.main(prog_name="inception-serve")


if __name__ == "__main__":  # python -m inception_engine.serve.command
    serve_main()
    sys.exit(0)
