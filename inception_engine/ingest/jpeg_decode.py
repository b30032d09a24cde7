"""JPEG decoding on the GPU (NVIDIA nvImageCodec) and the exact PIL resize + centre crop on the GPU (resize_pil.cu).

``GpuJpegDecoder.decode_files`` turns a batch of files into the (N, size, size, 3) uint8 RGB crops of torchvision's
Inception-V3 preprocessing, in device memory. Per file, a look at its header (no decode) decides:

- more pixels than Pillow accepts (2 * Image.MAX_IMAGE_PIXELS): an error, as images.open_image says it;
- a complete 8-bit JPEG, RGB or greyscale: decoded by nvImageCodec as stored, all of them in one batched call on
  the caller's stream, then resized on the GPU, read through its EXIF orientation (``upright_views``: the flips and
  turns that Pillow's exif_transpose makes on the CPU path, without a copy), so that photos taken upright or
  sideways alike stay on the GPU;
- anything else (PNG and other formats, CMYK/YCCK JPEGs, truncated ones, whatever Pillow cannot read) and any JPEG
  nvImageCodec fails on: the caller's exact CPU path (``cpu_fallback``), uploaded into its slot.

Two ways lead to nvImageCodec. Where cuda_src/jpeg_batch.c can be built (nvcc, and the header the nvImageCodec wheel
ships), it reads a call's files on its own threads, checks their headers in C and decodes them through
nvImageCodec's C API, with the GIL released throughout (jpeg_batch.py); ``NativeStart`` opens that decoder ahead,
beside the engine's own start-up. Otherwise the files are read and checked here and decoded through nvImageCodec's
Python API (``decode_into``), whose call takes the GIL back per image: about half as fast in a full pipeline.

The resize reproduces Pillow's bytes exactly (pil_resize.py: same coefficients, same rounding, same pass order), so
GPU-decoded crops differ from the CPU path only where nvJPEG's IDCT and chroma upsampling differ from
libjpeg-turbo's: a level or two on some pixels (tests/device/test_gpu_decode.py measures it). nvImageCodec is asked for
libjpeg's "fancy" (smooth) chroma upsampling, which Pillow uses, rather than its default of replicating pixels.

nvImageCodec's Python module is imported only where the C path is unavailable. Its API changed between releases
(``CodecApi`` finds what the installed one offers by looking at it, not at its version number); where it is
missing, or cannot make a decoder, ``load_nvimgcodec`` and ``GpuJpegDecoder`` raise BackendUnavailable with one line.
"""

from __future__ import annotations

import ctypes
import functools
import io
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..backends.cuda.device import driver
from ..backends.cuda.kernels import Kernels, launch_async, spec
from ..errors import BackendUnavailable, EngineError, first_line
from .files import read_file
from .images import Preprocess
from .jpeg_batch import CURRENT_DEVICE, PLAIN, UNREADABLE, JpegBatch, library
from .jpeg_header import gpu_eligible, pillow_eligible
from .pil_resize import Coeffs, plan_resize_crop

CHANNELS = 3
# nvImageCodec's default (":fancy_upsampling=0") replicates chroma samples; libjpeg, hence Pillow, interpolates them.
DECODER_OPTIONS = ":fancy_upsampling=1"
MISSING = "--decode gpu needs nvidia-nvimgcodec-cu13 (pip install -e '.[gpu-decode]')"
SUPPORTED = "0.6.1 to 0.9.0"  # the releases run on the GPU machine; pyproject's gpu-decode extra admits these
# GpuJpegDecoder reads and decodes through cuda_src/jpeg_batch.c where it builds (False: nvImageCodec's Python API)
NATIVE = True
# Through jpeg_batch.c: decode calls in flight at once, each with a decoder, a copy stream and a host thread of its
# own (cuda_runner.CudaRunner). Two lift the decoder beside a busy forward (fp16 on an H100: 14,300 -> 17,600 images/s)
# but not inception-run, whose results thread is the limit there, and the second decoder's start delays the first
# result by ~1.2 s (docs/PERFORMANCE.md, round three): one until that thread is lighter.
DECODE_CHAINS = 1


def load_nvimgcodec() -> Any:
    """The nvidia.nvimgcodec module, or BackendUnavailable in one line."""
    preload_nvjpeg()
    try:  # imported on use: an optional dependency (the gpu-decode extra), needed only off jpeg_batch.c's path
        from nvidia import nvimgcodec
    except Exception as e:  # ImportError, or a broken install failing inside its own import (OSError, ...)
        raise BackendUnavailable(f"{MISSING}: {first_line(e)}") from None
    return nvimgcodec


@dataclass(frozen=True)
class CodecApi:
    """The parts of an installed nvImageCodec that GpuJpegDecoder uses, in the shape that release has them.

    Three shapes are handled, told apart by what the module holds (a release not seen here works where it keeps
    one of them):
    - 0.6: ``ColorSpec.RGB``; ``Decoder`` takes ``backends`` (a list of ``Backend``) or ``backend_kinds``.
    - 0.7, 0.8: ``ColorSpec.SRGB`` replaces ``RGB``; ``Decoder`` takes only ``backends``; ``decode``'s ``params``
      and ``cuda_stream`` are keyword-only (always passed so here).
    - 0.9: as 0.7, and ``DecodeParams`` takes a ``sample_format`` whose default (``I_AUTO_COMPONENTS``) gives a
      greyscale JPEG one channel: ``I_RGB`` asks for the three that the resize reads.
    Backends are always given as ``Backend`` objects (or not at all), the one form every shape takes."""

    module: Any
    version: str
    rgb: Any  # the ColorSpec member for RGB output
    interleaved_rgb: Any | None  # SampleFormat.I_RGB where DecodeParams takes a sample format, else None

    @classmethod
    def of(cls, module: Any) -> CodecApi:
        version = str(getattr(module, "__version__", "unknown"))
        missing = [name for name in ("Decoder", "DecodeParams", "CodeStream", "Backend", "BackendKind", "ColorSpec")
                   if not hasattr(module, name)]
        color_spec = getattr(module, "ColorSpec", None)
        rgb = getattr(color_spec, "SRGB", None) or getattr(color_spec, "RGB", None)
        if missing or rgb is None:
            what = ", ".join(missing) or "ColorSpec.SRGB or ColorSpec.RGB"
            raise BackendUnavailable(f"nvImageCodec {version} lacks {what}, which --decode gpu needs; install a "
                                     f"release this engine was run with ({SUPPORTED})")
        sample_format = getattr(module, "SampleFormat", None)
        interleaved = getattr(sample_format, "I_RGB", None) if sample_format is not None else None
        if interleaved is not None:
            try:
                module.DecodeParams(sample_format=interleaved)
            except TypeError:  # 0.7 and 0.8 have SampleFormat but DecodeParams takes none
                interleaved = None
        return cls(module, version, rgb, interleaved)

    def decode_params(self) -> Any:
        """Orientation as stored (the resize reads it upright: upright_views), 8-bit RGB."""
        kwargs: dict[str, Any] = {"apply_exif_orientation": False, "color_spec": self.rgb, "allow_any_depth": False}
        if self.interleaved_rgb is not None:
            kwargs["sample_format"] = self.interleaved_rgb
        return self.module.DecodeParams(**kwargs)

    def decoder(self, backends: Sequence[str] | None, options: str, threads: int = 0) -> Any:
        """threads: its host threads (0: one per CPU, nvImageCodec's default)."""
        kwargs: dict[str, Any] = {"options": options, "max_num_cpu_threads": threads}
        if backends is not None:
            kwargs["backends"] = [self.module.Backend(getattr(self.module.BackendKind, b)) for b in backends]
        return self.module.Decoder(**kwargs)


def preload_nvjpeg() -> None:
    """Load libnvjpeg.so.13 from the nvidia-nvjpeg wheel, if installed, before nvImageCodec looks for it.

    nvImageCodec 0.6's nvJPEG extension dlopens "libnvjpeg.so.13" with a search path of its own directory's
    neighbours and /usr/local/cuda/lib64, which misses the wheel's nvidia/cu13/lib; a library already loaded under
    that name is what dlopen returns. Without the wheel nothing happens here (the CUDA toolkit's copy may serve)."""
    for entry in sys.path:
        lib = Path(entry or ".") / "nvidia" / "cu13" / "lib" / "libnvjpeg.so.13"
        if lib.is_file():
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            return


@dataclass(frozen=True)
class DeviceImage:
    """A decoded HWC uint8 RGB image in device memory."""

    ptr: int  # address of pixel (0, 0)
    height: int
    width: int
    pitch: int  # bytes from one row to the next


# EXIF orientation -> how its upright view O (what Pillow's exif_transpose makes) reads the stored image S of h rows
# and w columns: O[0][0] is S[(h - 1) * a][(w - 1) * b], a step down O's rows moves (dy, dx) in S, a step along a row
# (dy', dx'). Rows: (a, b, dy, dx, dy', dx'), checked against Pillow's transposes (tests/kernels/test_resize_pil.py).
ORIENTATION_STEPS = np.array([
    (0, 0, 1, 0, 0, 1),  # 0: not an EXIF value; never given (as 1)
    (0, 0, 1, 0, 0, 1),  # 1: upright
    (0, 1, 1, 0, 0, -1),  # 2: mirrored left to right
    (1, 1, -1, 0, 0, -1),  # 3: turned 180 degrees
    (1, 0, -1, 0, 0, 1),  # 4: mirrored top to bottom
    (0, 0, 0, 1, 1, 0),  # 5: transposed
    (1, 0, 0, 1, -1, 0),  # 6: turned 90 degrees clockwise to be upright (Pillow's ROTATE_270)
    (1, 1, 0, -1, -1, 0),  # 7: transversed
    (0, 1, 0, -1, 1, 0),  # 8: turned 90 degrees counter-clockwise (ROTATE_90)
], np.int64)


def upright_views(ptr: np.ndarray, height: np.ndarray, width: np.ndarray, pitch: np.ndarray,
                  orientation: np.ndarray) -> tuple[np.ndarray, ...]:
    """Stored images (address, height, width, row pitch) seen upright as their EXIF orientation says: the address of
    the upright view's first pixel, its height and width, and its row and column steps in bytes (resize_pil.cu's
    in_row, in_col), per image."""
    a, b, dy, dx, dy2, dx2 = ORIENTATION_STEPS[orientation].T
    transposed = dx != 0
    origin = ptr + a * (height - 1) * pitch + b * (width - 1) * CHANNELS
    return (origin, np.where(transposed, width, height), np.where(transposed, height, width),
            dy * pitch + dx * CHANNELS, dy2 * pitch + dx2 * CHANNELS)


@dataclass(frozen=True)
class Pass:
    """One image's pass by resize_pil_h or resize_pil_v (resize_pil.cu): its coefficients and output shape."""

    kernel: str
    coeffs: Coeffs
    out_rows: int
    out_cols: int


@dataclass(frozen=True)
class Schedule:
    """The two passes for an image of one size: the first reads source rows (or columns) lo .. lo + n - 1 into
    the intermediate (out_rows x out_cols), the second writes the crop."""

    first: Pass
    second: Pass
    lo: int
    vertical_first: bool

    @property
    def tmp_bytes(self) -> int:
        return self.first.out_rows * self.first.out_cols * CHANNELS


@functools.lru_cache(maxsize=512)
def schedule(h: int, w: int, resize: int, size: int) -> Schedule:
    """The two passes of an h x w image (cached: a data set has few distinct sizes)."""
    plan = plan_resize_crop(h, w, resize, size)
    lo, n = plan.first_span()
    if plan.vertical_first:
        return Schedule(Pass("resize_pil_v", plan.y, size, n), Pass("resize_pil_h", plan.x.shifted(lo), size, size),
                        lo, True)
    return Schedule(Pass("resize_pil_h", plan.x, n, size), Pass("resize_pil_v", plan.y.shifted(lo), size, size),
                    lo, False)


class Staged:
    """A pinned host array and its device copy, both grown to fit (by the caller's leave: after the last use)."""

    def __init__(self, dtype: type):
        self.dtype = np.dtype(dtype)
        self.host = np.empty(0, self.dtype)
        self.dev: Any = None

    def upload(self, parts: Sequence[np.ndarray], stream: Any) -> int:
        """The parts, concatenated, copied to the device on stream (one copy); their device address."""
        drv = driver()
        n = sum(p.size for p in parts)
        if n > self.host.size:
            self.free()
            self.host = drv.pagelocked_empty((2 * n,), self.dtype)
            self.dev = drv.mem_alloc(self.dtype.itemsize * 2 * n)
        np.concatenate([p.ravel() for p in parts], out=self.host[:n])
        drv.memcpy_htod_async(int(self.dev), self.host[:n], stream)
        return int(self.dev)

    def free(self) -> None:
        if self.dev is not None:
            self.dev.free()
            self.host.base.free()  # pagelocked_empty's array base is its host allocation
            self.dev, self.host = None, np.empty(0, self.dtype)


# The most device memory a decode call's whole decoded images take at once: a call of larger images (256 photos of
# 12 megapixels are 9 GB, of 48 megapixels 37 GB) is decoded in parts of at most this much (one image larger than it
# alone), each part resized before the next is decoded into the same memory.
ARENA_BYTES = 1 << 30


def arena_parts(nbytes: np.ndarray, limit: int) -> list[slice]:
    """Consecutive runs of images whose sizes (``nbytes``) add up to at most ``limit``; an image larger than it
    alone."""
    if int(nbytes.sum()) <= limit:  # a call of photos of usual sizes
        return [slice(0, len(nbytes))] if len(nbytes) else []
    parts, start, total = [], 0, 0
    for i, n in enumerate(nbytes.tolist()):
        if i > start and total + n > limit:
            parts.append(slice(start, i))
            start, total = i, 0
        total += n
    if start < len(nbytes):
        parts.append(slice(start, len(nbytes)))
    return parts


# resize_pil.cu's RESIZE_PIL_JOB: src, dst, start, weights, taps, out_rows, out_cols, the source's row and column steps,
# the destination's row pitch
JOB_FIELDS = 10


class GpuResizeCrop:
    """Enqueues resize_pil.cu's passes for decoded device images into slots of a (N, size, size, 3) uint8 batch.

    A batch is at most four launches, whatever its size: the first passes taken horizontally, those taken
    vertically, then the second passes likewise, each launch running one job (an image's pass) per grid row. The
    coefficient tables and the jobs of a batch travel in two pinned buffers, one copy each; each image has its own
    part of the intermediate buffer. Buffers grow when a batch needs more (after the previous batch's work is done);
    ``wait`` blocks until the last enqueued batch no longer needs them (its tables copied, its source images read)."""

    def __init__(self, kernels: Kernels, pre: Preprocess):
        self.kernels, self.pre = kernels, pre
        self._done: Any = None  # event after the last batch's last launch
        self._tables = Staged(np.int32)
        self._jobs = Staged(np.int64)
        self._tmp: Any = None
        self._tmp_bytes = 0

    def enqueue(self, jobs: Sequence[tuple[DeviceImage, int, int]], dst_ptr: int, stream: Any) -> None:
        """For each (image, slot, EXIF orientation): the crop of the image as it stands upright into slot `slot` of
        the batch at dst_ptr."""
        self.enqueue_arrays(*(np.array([getattr(img, f) for img, _, _ in jobs], np.int64)
                              for f in ("ptr", "height", "width", "pitch")),
                            np.array([slot for _, slot, _ in jobs], np.int64), dst_ptr, stream,
                            np.array([o for _, _, o in jobs], np.int64))

    def enqueue_arrays(self, ptr: np.ndarray, height: np.ndarray, width: np.ndarray, pitch: np.ndarray,
                       slots: np.ndarray, dst_ptr: int, stream: Any, orientation: np.ndarray | None = None) -> None:
        """``enqueue`` with the images as arrays (address, height, width, row pitch as stored, slot, EXIF orientation:
        all 1 where None): Python work per distinct image size, not per image."""
        self.wait()
        if len(ptr) == 0:
            return
        drv, size = driver(), self.pre.size
        if orientation is None:
            orientation = np.ones(len(ptr), np.int64)
        ptr, height, width, row, col = upright_views(ptr.astype(np.int64), height.astype(np.int64),
                                                     width.astype(np.int64), pitch.astype(np.int64), orientation)
        sizes, image_size = np.unique(height << 32 | width, return_inverse=True)
        scheds = [schedule(int(k >> 32), int(k & 0xFFFFFFFF), self.pre.resize, size) for k in sizes]
        pieces, offsets, pos = [], [], 0  # each size's coefficient tables, once
        for s in scheds:
            for p in (s.first, s.second):
                offsets.append((pos, pos + len(p.coeffs.start)))
                pieces += [p.coeffs.start, p.coeffs.weights]
                pos += len(p.coeffs.start) + p.coeffs.weights.size
        tables = self._tables.upload(pieces, stream)
        per_size = np.array([(s.lo, s.vertical_first, s.tmp_bytes, *(x for p in (s.first, s.second) for x in (
            p.coeffs.taps, p.out_rows, p.out_cols))) for s in scheds], np.int64)[image_size]
        table_at = tables + 4 * np.array(offsets, np.int64).reshape(len(scheds), 4)[image_size]
        lo, vertical, tmp_bytes = per_size[:, 0], per_size[:, 1].astype(bool), per_size[:, 2]
        need = int(tmp_bytes.sum())
        if need > self._tmp_bytes:
            if self._tmp is not None:
                self._tmp.free()
            self._tmp, self._tmp_bytes = drv.mem_alloc(need), need
        # each image has its part of the intermediate buffer; the first pass reads the upright view from its row (or
        # column) lo
        mid = int(self._tmp) + np.cumsum(tmp_bytes) - tmp_bytes
        mid_pitch = per_size[:, 5] * CHANNELS
        first = np.stack([ptr + np.where(vertical, lo * col, lo * row), mid, table_at[:, 0], table_at[:, 1],
                          per_size[:, 3], per_size[:, 4], per_size[:, 5], row, col, mid_pitch], axis=1)
        second = np.stack([mid, dst_ptr + slots * (size * size * CHANNELS), table_at[:, 2], table_at[:, 3],
                           per_size[:, 6], per_size[:, 7], per_size[:, 8], mid_pitch, np.full_like(mid, CHANNELS),
                           np.full_like(mid, size * CHANNELS)], axis=1)
        assert first.shape[1] == second.shape[1] == JOB_FIELDS
        # every first pass before any second pass (one stream: in this order), each pass by its kernel
        launches = [(name, table) for name, table in (
            ("resize_pil_h", first[~vertical]), ("resize_pil_v", first[vertical]),
            ("resize_pil_h", second[vertical]), ("resize_pil_v", second[~vertical])) if len(table)]
        base = self._jobs.upload([np.ascontiguousarray(t) for _, t in launches], stream)
        for kernel, table in launches:
            most = int((table[:, 5] * table[:, 6]).max()) * CHANNELS
            k = spec(kernel)
            launch_async(self.kernels[kernel], (k.blocks(most), len(table), 1), k.block, stream, base)
            base += table.nbytes
        self._done = drv.Event(drv.event_flags.DISABLE_TIMING)
        self._done.record(stream)

    def wait(self) -> None:
        if self._done is not None:
            self._done.synchronize()
            self._done = None

    def close(self) -> None:
        self.wait()
        self._tables.free()
        self._jobs.free()
        if self._tmp is not None:
            self._tmp.free()
            self._tmp = None


def device_image(img: Any, h: int, w: int) -> DeviceImage | None:
    """An nvImageCodec Image as a DeviceImage if it is the (h, w, 3) uint8 device array expected, else None."""
    try:
        cai = img.__cuda_array_interface__
    except Exception:  # an image in host memory (nvImageCodec's CPU backend) has none: the CPU path takes it
        return None
    if tuple(cai["shape"]) != (h, w, CHANNELS) or cai["typestr"] != "|u1":
        return None
    strides = cai.get("strides")
    if strides is not None and tuple(strides[1:]) != (CHANNELS, 1):
        return None
    return DeviceImage(int(cai["data"][0]), h, w, int(strides[0]) if strides else w * CHANNELS)


TAKEN = "taken"  # NativeStart.take's reason once its decoder is given out


def open_native(threads: int) -> tuple[JpegBatch | None, str | None]:
    """jpeg_batch.c's context with its nvImageCodec decoder open on the current device: (it, None), or (None, why
    not in one line: no nvcc, no header, a compile error, no decoder)."""
    preload_nvjpeg()
    try:
        native = JpegBatch()
    except (OSError, MemoryError) as e:
        return None, first_line(e)
    try:
        native.open_decoder(CURRENT_DEVICE, threads, DECODER_OPTIONS)
    except OSError as e:
        native.close()
        return None, first_line(e)
    return native, None


@functools.cache
def warm_up_jpeg() -> bytes:
    """A small plain JPEG (64 x 48, 4:2:0, as most photos): what NativeStart's warm-up decodes."""
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(out, "JPEG",
                                                                                                 quality=90)
    return out.getvalue()


class NativeStart:
    """jpeg_batch.c's decoders (``count`` of them: one per decode chain) being opened, and warmed up by a first
    decode each, on threads of their own: nvImageCodec's start-up (about 1.5 s: its extensions, nvJPEG, the hardware
    decoder) overlaps the engine's (weights, kernels, graph) instead of following it. ``take`` waits for them and
    gives one at a time: (an opened JpegBatch, None), or (None, why none could be opened)."""

    def __init__(self, threads: int, count: int | None = None):
        self.threads = threads
        self._opened: list[JpegBatch] = []
        self._why: str | None = TAKEN
        self._thread = threading.Thread(target=self._open, args=(count or DECODE_CHAINS,), name="nvimgcodec-start",
                                        daemon=True)
        self._thread.start()

    def _open(self, count: int) -> None:
        for _ in range(count):  # the first opens nvImageCodec and the CUDA context; the others take ~30 ms
            native, why = open_native(self.threads)
            if native is None:
                self._why = why if not self._opened else TAKEN  # the ones opened serve; the caller opens the rest
                break
            self._opened.append(native)
        warming = [threading.Thread(target=warm_up, args=(n,), daemon=True) for n in self._opened]
        for t in warming:
            t.start()
        for t in warming:
            t.join()

    def take(self) -> tuple[JpegBatch | None, str | None]:
        """An opened decoder (once each; then none, to be opened afresh), or why none could be opened."""
        self._thread.join()
        if self._opened:
            return self._opened.pop(0), None
        got, self._why = self._why, TAKEN
        return None, got

    def close(self) -> None:
        self._thread.join()
        for native in self._opened:
            native.close()
        self._opened = []


def warm_up(native: JpegBatch) -> None:
    """A first decode: nvImageCodec starts nvJPEG and the hardware decoder there, rather than at a run's first batch."""
    try:
        native.warm_up(warm_up_jpeg())
    except OSError:  # not needed for decoding: the first batch pays nvImageCodec's start instead
        pass


def check_gpu_decode() -> bool:
    """Whether --decode gpu can run, and how: True through jpeg_batch.c (its library built, once a machine, with
    nvcc, and loaded), False through nvImageCodec's Python module (imported now). BackendUnavailable in one line
    where neither is there."""
    if NATIVE:
        try:
            library()
            return True
        except OSError:
            pass  # the Python API's path; GpuJpegDecoder says why (native_unavailable)
    load_nvimgcodec()
    return False


class GpuJpegDecoder:
    """Batches of files -> (N, size, size, 3) uint8 crops in device memory; see the module doc.

    Create and use inside the CUDA context the kernels were loaded in (the backend's ``with gpu:``).
    backends: names of nvidia.nvimgcodec.BackendKind members to allow (e.g. ("GPU_ONLY",)); None: its default.
    threads: nvImageCodec's host threads (0: one per CPU; a process sharing the CPUs with others gets its share)."""

    def __init__(self, kernels: Kernels, pre: Preprocess, max_batch: int, *,
                 backends: Sequence[str] | None = None, threads: int = 0, started: NativeStart | None = None):
        """started: jpeg_batch.c's decoder opened ahead (start_decoder), taken where it is for these threads."""
        self.pre, self.max_batch, self.threads = pre, max_batch, threads
        self._native: JpegBatch | None = None  # cuda_src/jpeg_batch.c, for decode_files; None: the Python API
        self.native_unavailable: str | None = None  # why decode_files reads and decodes through Python
        if NATIVE and backends is None:
            native, why = started.take() if started is not None and started.threads == threads else (None, TAKEN)
            if why == TAKEN:  # none opened ahead for these threads: open one now
                native, why = open_native(threads)
            self._native, self.native_unavailable = native, why
        if self._native is None:
            api = CodecApi.of(load_nvimgcodec())
            try:
                self._decoder = api.decoder(backends, DECODER_OPTIONS, threads)
                self._params = api.decode_params()
            except Exception as e:  # whatever the library raises (TypeError for a signature, RuntimeError, ...)
                raise BackendUnavailable(f"nvImageCodec {api.version} could not make a JPEG decoder "
                                         f"({type(e).__name__}: {first_line(e)}); use --decode cpu, or install "
                                         f"nvImageCodec {SUPPORTED}") from None
            self._codec = api.module
        self._resize = GpuResizeCrop(kernels, pre)
        self._decoded: list[Any] = []  # the last batch's nvImageCodec images, alive until its resize has run
        self._staging: np.ndarray | None = None  # pinned (max_batch, size, size, 3) for CPU-path results
        self._arena: Any = None  # device memory decode_files decodes whole images into
        self._arena_bytes = 0
        self._done: Any = None  # event after the last batch's uploads
        self._cpu_pool: ThreadPoolExecutor | None = None  # the CPU path's threads, made at the first batch needing two

    @property
    def reads_files(self) -> bool:
        """Whether this decoder goes through jpeg_batch.c, which reads the files (decode_files only)."""
        return self._native is not None

    def decode_files(self, paths: Sequence[str], dst_ptr: int, stream: Any,
                     cpu_fallback: Callable[[str, bytes], np.ndarray]) -> list[str | None]:
        """``decode_into`` for files named, read here: file i into slot i; a file that cannot be read gets its
        error (worded as files.read_file words it). Through cuda_src/jpeg_batch.c where it could be built: the
        files read on its threads, the plain JPEGs among them decoded in one call, no Python per file."""
        if len(paths) > self.max_batch:
            raise ValueError(f"{len(paths)} files for a decoder of max_batch {self.max_batch}")
        if self._native is None:
            errors: list[str | None] = [None] * len(paths)
            items, rows = [], []
            for i, path in enumerate(paths):
                data, errors[i] = read_file(path)
                if data is not None:
                    items.append((path, data))
                    rows.append(i)
            for row, error in zip(rows, self.decode_into(items, dst_ptr, stream, cpu_fallback, rows)):
                errors[row] = error
            return errors
        return self._decode_native(paths, dst_ptr, stream, cpu_fallback)

    def _decode_native(self, paths: Sequence[str], dst_ptr: int, stream: Any,
                       cpu_fallback: Callable[[str, bytes], np.ndarray]) -> list[str | None]:
        assert self._native is not None
        self.wait()  # the previous batch's arena and staged results are free to go
        self._decoded = []
        errors: list[str | None] = [None] * len(paths)
        got = self._native.read([os.fsencode(p) for p in paths], Image.MAX_IMAGE_PIXELS)
        plain = got.kind == PLAIN
        which, sizes, turns = list(np.flatnonzero(plain)), [got.hw[plain]], list(got.orientation[plain])
        to_cpu: list[tuple[int, str, bytes]] = []
        for i in np.flatnonzero(~plain):  # the rare files: Python per file
            path = str(paths[i])
            if got.kind[i] == UNREADABLE:
                data, errors[i] = read_file(path)  # worded as the CPU path words it (or readable by now)
                if data is not None:
                    to_cpu.append((i, path, data))
                continue
            data = self._native.data(int(i), int(got.length[i]))
            try:
                layout = pillow_eligible(path, data)
            except EngineError as e:
                errors[i] = str(e)
                continue
            if layout is None:
                to_cpu.append((i, path, data))
            else:
                which.append(i)
                sizes.append(np.array([layout[:2]], np.int32))
                turns.append(layout[2])
        files = np.array(which, np.int64)
        orientation = np.array(turns, np.int64)
        hw = np.concatenate(sizes).astype(np.int64)
        nbytes = (hw[:, 0] * hw[:, 1] * CHANNELS + 255) // 256 * 256
        offsets = np.cumsum(nbytes) - nbytes
        ok = np.zeros(len(files), bool)
        for k, part in enumerate(arena_parts(nbytes, ARENA_BYTES)):  # one part unless the images are large
            if k:
                stream.synchronize()  # the previous part's resize has read the arena
            arena, at = self._arena_for(int(nbytes[part].sum())), offsets[part] - offsets[part.start]
            try:
                ok[part] = self._native.decode(files[part], hw[part], arena, at, stream.handle).astype(bool)
            except OSError:  # the batch call failed: every file to the CPU path, which says what is wrong
                pass
            done = ok[part]
            self._resize.enqueue_arrays(arena + at[done], hw[part][done, 0], hw[part][done, 1],
                                        hw[part][done, 1] * CHANNELS, files[part][done], dst_ptr, stream,
                                        orientation[part][done])
        to_cpu += [(int(i), str(paths[i]), self._native.data(int(i), int(got.length[i]))) for i in files[~ok]]
        self._upload_cpu_results(sorted(to_cpu), dst_ptr, stream, cpu_fallback, errors)
        drv = driver()
        self._done = drv.Event(drv.event_flags.DISABLE_TIMING)
        self._done.record(stream)
        return errors

    def _arena_for(self, nbytes: int) -> int:
        """Device memory for a batch's whole images (grown, with room up to ARENA_BYTES, where a batch needs more)."""
        if nbytes > self._arena_bytes:
            if self._arena is not None:
                self._arena.free()
            self._arena_bytes = max(nbytes, min(2 * nbytes, ARENA_BYTES))
            self._arena = driver().mem_alloc(self._arena_bytes)
        return int(self._arena)

    def decode_into(self, items: Sequence[tuple[str, bytes]], dst_ptr: int, stream: Any,
                    cpu_fallback: Callable[[str, bytes], np.ndarray],
                    rows: Sequence[int] | None = None) -> list[str | None]:
        """Decode items[i] = (path, file bytes) into slot rows[i] (default: i) of the (N, size, size, 3) uint8 batch
        at dst_ptr, everything enqueued on stream, through nvImageCodec's Python API. Returns one error message per
        item (None: decoded); a failed item's slot holds anything. cpu_fallback(path, data) gives the exact CPU
        result or raises EngineError."""
        rows = list(range(len(items))) if rows is None else list(rows)
        if len(items) > self.max_batch or max(rows, default=0) >= self.max_batch:
            raise ValueError(f"{len(items)} items for a decoder of max_batch {self.max_batch}")
        if self._native is not None:
            raise RuntimeError("this decoder decodes through jpeg_batch.c: use decode_files")
        self.wait()  # the previous batch's decoded images and staged results are free to go
        self._decoded = []
        errors: list[str | None] = [None] * len(items)
        to_gpu: list[tuple[int, int, int, int]] = []  # (item, height, width, EXIF orientation)
        to_cpu: list[int] = []
        for i, (path, data) in enumerate(items):
            try:
                layout = gpu_eligible(path, data)
            except EngineError as e:
                errors[i] = str(e)
                continue
            if layout is None:
                to_cpu.append(i)
            else:
                to_gpu.append((i, *layout))
        jobs: list[tuple[DeviceImage, int, int]] = []
        for (i, h, w, turn), img in zip(to_gpu, self._decode([items[i][1] for i, *_ in to_gpu], stream)):
            dev = None if img is None else device_image(img, h, w)
            if dev is None:
                to_cpu.append(i)
            else:
                jobs.append((dev, rows[i], turn))
                self._decoded.append(img)
        self._resize.enqueue(jobs, dst_ptr, stream)
        row_errors: list[str | None] = [None] * self.max_batch
        self._upload_cpu_results([(rows[i], *items[i]) for i in sorted(to_cpu)], dst_ptr, stream, cpu_fallback,
                                 row_errors)
        for i in to_cpu:
            errors[i] = row_errors[rows[i]]
        drv = driver()
        self._done = drv.Event(drv.event_flags.DISABLE_TIMING)
        self._done.record(stream)
        return errors

    def wait(self) -> None:
        """Until the last batch's decoded images and staged uploads are no longer needed."""
        if self._done is not None:
            self._done.synchronize()
            self._done = None

    def release(self) -> None:
        """Waits, then frees the last batch's decoded images now: nvImageCodec frees an image on the stream it was
        decoded on, so they must go before the caller destroys that stream (freed later, they crashed the
        process)."""
        self.wait()
        self._decoded = []

    def _decode(self, blobs: list[bytes], stream: Any) -> list[Any]:
        """nvImageCodec's images (None where it failed), one batched call; should the batch call itself raise,
        one call per file, so that one bad file does not send the whole batch to the CPU."""
        if not blobs:
            return []
        try:
            return list(self._decoder.decode([self._codec.CodeStream(b) for b in blobs], params=self._params,
                                             cuda_stream=stream.handle))
        except Exception:  # nvImageCodec raises RuntimeError and others for a stream it cannot parse
            return [self._decode_one(b, stream) for b in blobs]

    def _decode_one(self, blob: bytes, stream: Any) -> Any:
        try:
            return self._decoder.decode(self._codec.CodeStream(blob), params=self._params, cuda_stream=stream.handle)
        except Exception:  # this file goes to the CPU path, which reports what is wrong with it
            return None

    def _upload_cpu_results(self, jobs: Sequence[tuple[int, str, bytes]], dst_ptr: int, stream: Any,
                            cpu_fallback: Callable[[str, bytes], np.ndarray], errors: list[str | None]) -> None:
        """For each (slot, path, bytes): the CPU path's crop uploaded into its slot, or its error in errors[slot]."""
        if not jobs:
            return
        drv = driver()
        shape = (self.pre.size, self.pre.size, CHANNELS)
        if self._staging is None:
            self._staging = drv.pagelocked_empty((self.max_batch, *shape), np.uint8)

        def crop_of(job: tuple[int, str, bytes]) -> np.ndarray | str:
            try:
                return cpu_fallback(job[1], job[2])
            except EngineError as e:
                return str(e)

        # Pillow decodes and resizes with the GIL released: a batch's files for the CPU path (PNGs, CMYK, ...) are
        # decoded side by side on up to this decoder's host threads rather than one after another here
        crops: Iterator[np.ndarray | str] = map(crop_of, jobs)
        if len(jobs) > 1:
            if self._cpu_pool is None:
                self._cpu_pool = ThreadPoolExecutor(self.threads or os.cpu_count() or 1, "gpu-decode-cpu-path")
            crops = self._cpu_pool.map(crop_of, jobs)
        for (row, path, _), crop in zip(jobs, crops):
            row = int(row)  # a numpy index would not pass as an address below
            if isinstance(crop, str):
                errors[row] = crop
                continue
            if crop.shape != shape or crop.dtype != np.uint8:
                raise ValueError(f"cpu_fallback gave {crop.dtype} {crop.shape} for {path}, expected uint8 {shape}")
            self._staging[row] = crop
            drv.memcpy_htod_async(dst_ptr + row * crop.nbytes, self._staging[row], stream)

    def close(self) -> None:
        self.wait()
        self._resize.close()
        self._decoded = []
        if self._cpu_pool is not None:
            self._cpu_pool.shutdown()
            self._cpu_pool = None
        if self._native is not None:
            self._native.close()
            self._native = None
        if self._arena is not None:
            self._arena.free()
            self._arena, self._arena_bytes = None, 0
        if self._staging is not None:
            self._staging.base.free()
            self._staging = None


def reuse_decoders(made: list[GpuJpegDecoder], kernels: Kernels, pre: Preprocess, threads: int, max_batch: int,
                   chains: int = 1, started: NativeStart | None = None) -> list[GpuJpegDecoder]:
    """GPU JPEG decoders for calls of up to max_batch files, kept in ``made`` (a backend's ``jpeg_decoders``, closed
    with it) and made only where it holds none that fit, the context current: nvImageCodec's start-up is paid by
    the first run that decodes on the GPU, not by every run of that backend. ``chains`` of them where they read
    files through jpeg_batch.c (one decoder per decode call in flight); one through nvImageCodec's Python API, whose
    per-image GIL traffic a second thread would only contend with. threads: each one's host threads (0: one per
    CPU); started: NativeStart's."""
    if made and (made[0].pre != pre or made[0].threads != threads or made[0].max_batch < max_batch):
        for d in made:
            d.close()
        made.clear()
    if not made:
        made.append(GpuJpegDecoder(kernels, pre, max_batch, threads=threads, started=started))
    while made[0].reads_files and len(made) < chains:
        made.append(GpuJpegDecoder(kernels, pre, max_batch, threads=threads, started=started))
    return made[:chains] if made[0].reads_files else made[:1]
