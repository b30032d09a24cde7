"""inception-serve started in a subprocess on a free loopback port (``--port 0``: the port is read from its ready
line), for the end-to-end tests."""

from __future__ import annotations

import io
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from helpers.random_weights import write_random_weights

READY = "inception-serve: ready at "


@dataclass
class Served:
    proc: subprocess.Popen
    url: str = ""  # http://127.0.0.1:PORT
    lines: list[str] = field(default_factory=list)  # its stderr so far
    _queue: queue.Queue = field(default_factory=queue.Queue)

    @property
    def host_port(self) -> str:
        return self.url.removeprefix("http://")

    def wait_line(self, starts: str, timeout: float = 120.0) -> str:
        """The first stderr line starting with ``starts`` (AssertionError with what it printed where the process
        ends or time runs out first)."""
        end = time.monotonic() + timeout
        for line in self.lines:
            if line.startswith(starts):
                return line
        while time.monotonic() < end:
            try:
                line = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if line is None:
                break
            self.lines.append(line)
            if line.startswith(starts):
                return line
        raise AssertionError(f"no line {starts!r} from inception-serve; it printed: {''.join(self.lines)}")

    def drain(self) -> str:
        """Its whole stderr, once it has ended."""
        while True:
            line = self._queue.get(timeout=30)
            if line is None:
                return "".join(self.lines)
            self.lines.append(line)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_server(weights: Path, *args: str, wait: bool = True, backend: str = "cpu", timeout: float = 120.0) -> Served:
    """inception-serve on ``backend`` with ``weights``, its stderr read on a thread; waits for its ready line
    (``wait``)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "inception_engine.serve.command", "--weights", str(weights), "--backend", backend,
           "--host", "127.0.0.1", "--port", "0", *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    served = Served(proc)

    def read() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            served._queue.put(line)
        served._queue.put(None)

    threading.Thread(target=read, daemon=True).start()
    if wait:
        line = served.wait_line(READY, timeout)
        served.url = line[len(READY):].split()[0]
    return served


def jpeg_bytes(seed: int, size: tuple[int, int] = (320, 300)) -> bytes:
    """A random RGB JPEG."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def png_bytes(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (310, 330), dtype=np.uint8), "L").save(buf, "PNG")
    return buf.getvalue()


PNG = b"\x89PNG"  # a PNG file's first bytes


def serve_weights(directory: Path) -> Path:
    """The random weight file the serve tests start their servers with, in ``directory``."""
    return write_random_weights(directory / "w.npz", seed=3)


def write_images(directory: Path, files: list[bytes], name: str = "img{i}") -> list[Path]:
    """Each encoded image in ``files`` as a file of ``directory``, named ``name`` (formatted with its index ``i``)
    with .png or .jpg as its bytes are, in order."""
    out = []
    for i, data in enumerate(files):
        out.append(directory / f"{name.format(i=i)}.{'png' if data.startswith(PNG) else 'jpg'}")
        out[-1].write_bytes(data)
    return out
