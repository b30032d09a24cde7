"""cuda_src/jpeg_batch.c from Python: a batch of files read, sorted by header and decoded by nvImageCodec in two
calls, with the GIL released throughout (ctypes) and no Python per file.

The library is built at first use with nvcc against the installed nvImageCodec's own header (the wheel ships
``include/nvimgcodec.h``), so each release's structure layouts are what the code is compiled with, and linked to
that wheel's ``libnvimgcodec.so.0``. It is cached as ``ie_jpeg-<key>.so`` in ``~/.cache/inception-engine/jpeg/``,
the key hashing the source, the header, the library's place and the flags; it appears atomically. Without
nvImageCodec (``with_decoder=False``) it reads and sorts only: what the tests of the header rule use.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import cuda_build, native_build
from ..paths import user_cache_dir

SOURCE = "jpeg_batch.c"
FLAGS = ("-O2", "-shared", "-Xcompiler", "-fPIC,-pthread")
PLAIN, OTHER, UNREADABLE = 0, 1, 2  # jpeg_batch.c's kinds of file
CPU_ONLY = -99999  # nvImageCodec's device id for its CPU-only mode (decodes into host memory)
CURRENT_DEVICE = -1
# the oldest nvImageCodec this C path has run on the GPU (older ones take the Python API path, which has run 0.6.1 on)
MIN_RELEASE = (0, 9, 0)
READ_THREADS = 4  # files read at once: enough to hide a disk's latency, few beside nvImageCodec's own threads


def nvimgcodec_dir() -> Path | None:
    """The installed nvidia.nvimgcodec package's folder where it has the header and the library, else None (found
    without importing it)."""
    try:
        spec = importlib.util.find_spec("nvidia.nvimgcodec")
    except (ImportError, ValueError):
        return None
    for place in (spec.submodule_search_locations or []) if spec else []:
        d = Path(place)
        if (d / "include" / "nvimgcodec.h").is_file() and (d / "libnvimgcodec.so.0").is_file():
            return d
    return None


def header_version(codec: Path) -> tuple[int, int, int]:
    """The nvImageCodec release whose header is in ``codec``, from nvimgcodec_version.h ((0, 0, 0) if unreadable)."""
    try:
        text = (codec / "include" / "nvimgcodec_version.h").read_text()
    except OSError:
        return (0, 0, 0)
    found = re.finditer(r"#define NVIMGCODEC_VER_(MAJOR|MINOR|PATCH) (\d+)", text)
    parts = {m.group(1): int(m.group(2)) for m in found}
    return parts.get("MAJOR", 0), parts.get("MINOR", 0), parts.get("PATCH", 0)


def build(codec: Path | None) -> Path:
    """The compiled library (with nvImageCodec's decoder where ``codec`` is its folder); compiled first if not
    cached. Raises OSError with the reason."""
    nvcc = cuda_build.find_nvcc()
    if nvcc is None:
        raise OSError("no nvcc (the CUDA toolkit) to compile cuda_src/jpeg_batch.c")
    src = cuda_build.source_dir() / SOURCE
    h = hashlib.sha256(src.read_bytes() + "\0".join((nvcc, *FLAGS, str(codec))).encode())
    extra: list[str] = []
    if codec is not None:
        for header in ("nvimgcodec.h", "nvimgcodec_version.h"):
            h.update((codec / "include" / header).read_bytes() if (codec / "include" / header).is_file() else b"")
        extra = ["-DIE_WITH_NVIMGCODEC", f"-I{codec / 'include'}", f"-L{codec}", "-l:libnvimgcodec.so.0",
                 "-Xlinker", f"-rpath,{codec}"]
    path = user_cache_dir() / "jpeg" / f"ie_jpeg-{h.hexdigest()[:20]}.so"
    if path.is_file():
        return path
    return native_build.compile_library([nvcc, *FLAGS, str(src), *extra], path, SOURCE, timeout=300)


P = ctypes.c_void_p


@functools.cache
def library(with_decoder: bool = True) -> ctypes.CDLL:
    """The loaded library (cached: one build and load a process). Raises OSError with the reason."""
    codec = nvimgcodec_dir() if with_decoder else None
    if with_decoder and codec is None:
        raise OSError("nvImageCodec's header and library are not installed (pip install -e '.[gpu-decode]')")
    if codec is not None and header_version(codec) < MIN_RELEASE:
        have, want = (".".join(map(str, v)) for v in (header_version(codec), MIN_RELEASE))
        raise OSError(f"nvImageCodec {have} is older than {want}, the first release it was run with")
    lib = ctypes.CDLL(str(build(codec)))
    lib.ie_jpeg_new.restype = P
    lib.ie_jpeg_free.argtypes = [P]
    lib.ie_jpeg_read.argtypes = [P, ctypes.c_int, P, ctypes.c_int, ctypes.c_int64, P, P, P]
    lib.ie_jpeg_bytes.argtypes, lib.ie_jpeg_bytes.restype = [P, ctypes.c_int], P
    lib.ie_jpeg_plain_size.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int64, P]
    if with_decoder:
        lib.ie_jpeg_open_decoder.argtypes = [P, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                                             ctypes.c_size_t]
        lib.ie_jpeg_decode.argtypes = [P, ctypes.c_int, P, P, ctypes.c_uint64, P, P, P, ctypes.c_char_p,
                                       ctypes.c_size_t]
        lib.ie_jpeg_warm_up.argtypes = [P, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p,
                                        ctypes.c_size_t]
    return lib


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


@dataclass(frozen=True)
class ReadBatch:
    """What ``JpegBatch.read`` found per file: its kind (PLAIN, OTHER, UNREADABLE), (height, width, EXIF orientation)
    where plain, and its length in bytes."""

    kind: np.ndarray  # (n,) int32
    layout: np.ndarray  # (n, 3) int32: height, width, orientation
    length: np.ndarray  # (n,) int64

    @property
    def hw(self) -> np.ndarray:
        return self.layout[:, :2]

    @property
    def orientation(self) -> np.ndarray:
        return self.layout[:, 2]


class JpegBatch:
    """One jpeg_batch.c context: the last read's bytes, and (``open_decoder``) an nvImageCodec decoder."""

    def __init__(self, with_decoder: bool = True):
        self._lib = library(with_decoder)
        self._ctx = self._lib.ie_jpeg_new()
        if not self._ctx:
            raise MemoryError("jpeg_batch: no memory for a context")

    def open_decoder(self, device: int = CURRENT_DEVICE, threads: int = 0, options: str = "") -> None:
        """nvImageCodec's decoder on the current CUDA device (or CPU_ONLY); raises OSError with its message."""
        err = ctypes.create_string_buffer(256)
        if self._lib.ie_jpeg_open_decoder(self._ctx, device, threads, options.encode(), err, len(err)) != 0:
            raise OSError(err.value.decode(errors="replace"))

    def read(self, paths: Sequence[bytes], max_pixels: int | None, threads: int = READ_THREADS) -> ReadBatch:
        n = len(paths)
        kind, layout, length = np.empty(n, np.int32), np.zeros((n, 3), np.int32), np.empty(n, np.int64)
        names = (ctypes.c_char_p * n)(*paths)
        if self._lib.ie_jpeg_read(self._ctx, n, names, threads, max_pixels or 0, ptr(kind), ptr(layout),
                                  ptr(length)):
            raise MemoryError("jpeg_batch: out of memory reading a batch of files")
        return ReadBatch(kind, layout, length)

    def data(self, i: int, length: int) -> bytes:
        """File i's bytes, as the last read found them."""
        return ctypes.string_at(self._lib.ie_jpeg_bytes(self._ctx, i), length)

    def decode(self, which: np.ndarray, hw: np.ndarray, out: int, offsets: np.ndarray, stream: int) -> np.ndarray:
        """Files ``which`` of the last read, of sizes ``hw``, decoded to interleaved RGB at out + offsets (rows of
        width * 3 bytes) on CUDA stream ``stream``: 1 per file decoded, 0 per file nvImageCodec failed on. Raises
        OSError where the batch call itself failed."""
        which = np.ascontiguousarray(which, np.int32)
        hw = np.ascontiguousarray(hw, np.int32)
        offsets = np.ascontiguousarray(offsets, np.int64)
        ok = np.zeros(len(which), np.int32)
        err = ctypes.create_string_buffer(256)
        if self._lib.ie_jpeg_decode(self._ctx, len(which), ptr(which), ptr(hw), out, ptr(offsets), stream or None,
                                    ptr(ok), err, len(err)) != 0:
            raise OSError(err.value.decode(errors="replace"))
        return ok

    def warm_up(self, data: bytes, copies: int = 32) -> None:
        """Decode ``copies`` copies of a small plain JPEG and wait (nvImageCodec's start at its first decode: nvJPEG,
        the hardware decoder), so that a run's first batch does not pay it. The last read's bytes are gone after.
        Raises OSError with the reason."""
        err = ctypes.create_string_buffer(256)
        if self._lib.ie_jpeg_warm_up(self._ctx, data, len(data), copies, err, len(err)) != 0:
            raise OSError(err.value.decode(errors="replace"))

    def close(self) -> None:
        if self._ctx:
            self._lib.ie_jpeg_free(self._ctx)
            self._ctx = None


def plain_size(data: bytes, max_pixels: int | None) -> tuple[int, int, int] | None:
    """jpeg_batch.c's header rule on one file's bytes: (height, width, EXIF orientation) of a plain JPEG, else
    None."""
    layout = np.zeros(3, np.int32)
    plain = library(False).ie_jpeg_plain_size(data, len(data), max_pixels or 0, ptr(layout))
    return tuple(int(x) for x in layout) if plain else None  # type: ignore[return-value]
