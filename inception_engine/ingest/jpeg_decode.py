"""JPEG decoding on the GPU (NVIDIA nvImageCodec) into the exact PIL resize + centre crop on the GPU (gpu_resize.py).

``GpuJpegDecoder.decode_files`` turns a batch of files into the (N, size, size, 3) uint8 RGB crops of torchvision's
Inception-V3 preprocessing, in device memory. Per file, a look at its header (no decode) decides:

- more pixels than the run's limit (Preprocess.max_pixels): an error, as images.open_image says it;
- a complete 8-bit JPEG, RGB or greyscale: decoded by nvImageCodec as stored, all of them in one batched call on
  the caller's stream, then resized on the GPU, read through its EXIF orientation (gpu_resize.upright_views: the
  flips and turns that Pillow's exif_transpose makes on the CPU path, without a copy), so that photos taken upright
  or sideways alike stay on the GPU;
- anything else (PNG and other formats, CMYK/YCCK JPEGs, truncated ones, whatever Pillow cannot read) and any JPEG
  nvImageCodec fails on: the caller's exact CPU path (``cpu_fallback``), uploaded into its slot.

Two ways lead to nvImageCodec. Where cuda_src/jpeg_batch.c can be built (nvcc, and the header the nvImageCodec wheel
ships), it reads a call's files on its own threads, checks their headers in C and decodes them through
nvImageCodec's C API, with the GIL released throughout (jpeg_batch.py); ``NativeStart`` opens that decoder ahead,
beside the engine's own start-up. Otherwise the files are read and checked here and decoded through nvImageCodec's
Python API (``decode_into``), whose call takes the GIL back per image: about half as fast in a full pipeline.

The resize reproduces Pillow's bytes exactly, so GPU-decoded crops differ from the CPU path only where nvJPEG's IDCT
and chroma upsampling differ from libjpeg-turbo's: a level or two on some pixels (tests/device/test_gpu_decode.py
measures it). nvImageCodec is asked for libjpeg's "fancy" (smooth) chroma upsampling, which Pillow uses, rather than
its default of replicating pixels (nvimgcodec.DECODER_OPTIONS).

nvImageCodec's Python module is imported only where the C path is unavailable (nvimgcodec.py: its API as each
release has it); where it is missing, or cannot make a decoder, ``GpuJpegDecoder`` raises BackendUnavailable with one
line.

With an FID tool's preprocessing (Preprocess.mode "pytorch-fid" or "clean-fid") the slots are instead the
network's float32 (3, size, size) input: the decoded images resized as that tool resizes them (gpu_fid_resize.py),
read as stored, since both tools ignore EXIF orientation; ``cpu_fallback`` then gives that input too.
"""

from __future__ import annotations

import functools
import io
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from PIL import Image

from ..backends.cuda.device import driver
from ..backends.cuda.kernels import Kernels
from ..errors import BackendUnavailable, EngineError, first_line
from .files import read_file
from .gpu_fid_resize import FID_RESIZES, GpuCleanFidResize, GpuFidResize
from .gpu_resize import CHANNELS, DeviceImage, GpuResizeCrop
from .images import Preprocess
from .jpeg_batch import CURRENT_DEVICE, PLAIN, UNREADABLE, JpegBatch, library
from .jpeg_header import gpu_eligible, pillow_eligible
from .nvimgcodec import DECODER_OPTIONS, SUPPORTED, CodecApi, load_nvimgcodec, preload_nvjpeg, quiet_stderr

# GpuJpegDecoder reads and decodes through cuda_src/jpeg_batch.c where it builds (False: nvImageCodec's Python API)
NATIVE = True
# Through jpeg_batch.c: decode calls in flight at once, each with a decoder, a copy stream and a host thread of its
# own (cuda_runner.CudaRunner). Two lift the decoder beside a busy forward (fp16 on an H100: 14,300 -> 17,600 images/s)
# but not inception-run, whose results thread is the limit there, and the second decoder's start delays the first
# result by ~1.2 s (docs/PERFORMANCE.md, round three): one until that thread is lighter.
DECODE_CHAINS = 1


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
        with quiet_stderr():  # nvImageCodec's extensions load here, printing about codecs no run of JPEGs uses
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
        # the slots it fills: torchvision's uint8 (size, size, 3) crops, or an FID tool's resize as the network's
        # float32 (3, size, size) input (gpu_fid_resize.py; cpu_fallback then gives that too)
        self.fid = pre.mode != "torchvision"
        resize = FID_RESIZES.get(pre.mode)
        self._resize: GpuResizeCrop | GpuFidResize | GpuCleanFidResize = (
            GpuResizeCrop(kernels, pre) if resize is None else resize(kernels, pre.mean, pre.std, pre.size))
        self.slot_shape = (CHANNELS, pre.size, pre.size) if self.fid else (pre.size, pre.size, CHANNELS)
        self.slot_dtype = np.dtype(np.float32 if self.fid else np.uint8)
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
        got = self._native.read([os.fsencode(p) for p in paths], self.pre.max_pixels)
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
                layout = pillow_eligible(path, data, self.pre.max_pixels)
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
        # the FID tools open images as stored (no EXIF orientation)
        orientation = np.ones(len(turns), np.int64) if self.fid else np.array(turns, np.int64)
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
                layout = gpu_eligible(path, data, self.pre.max_pixels)
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
                jobs.append((dev, rows[i], 1 if self.fid else turn))  # the FID tools: no EXIF orientation
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
        """For each (slot, path, bytes): the CPU path's result (a slot's shape and type) uploaded into its slot, or
        its error in errors[slot]."""
        if not jobs:
            return
        drv = driver()
        shape = self.slot_shape
        if self._staging is None:
            self._staging = drv.pagelocked_empty((self.max_batch, *shape), self.slot_dtype)

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
            if crop.shape != shape or crop.dtype != self.slot_dtype:
                raise ValueError(f"cpu_fallback gave {crop.dtype} {crop.shape} for {path}, expected "
                                 f"{self.slot_dtype} {shape}")
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
