"""What the server runs with: its limits and options (no HTTP stack imported: the command reads the defaults before
it knows that starlette and uvicorn are installed)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import EngineConfig

# prometheus-client's multiprocess directory (several HTTP front-ends: each process's metrics in its files there)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 256 << 20  # a request's body (after decompression)
    max_images: int = 1024  # images a request may hold
    request_seconds: float = 60.0  # from the body's arrival to the answer
    body_seconds: float = 30.0  # for the body to arrive (a slow client is cut off at this)


@dataclass(frozen=True)
class ServeOptions:
    spec: EngineConfig
    gpus: int
    max_batch: int
    max_delay: float  # seconds
    decode_workers: int
    limits: Limits = Limits()
