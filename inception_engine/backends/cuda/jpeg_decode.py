"""JPEG decoding on the GPU (NVIDIA nvImageCodec) and the exact PIL resize + centre crop on the GPU (resize_pil.cu).

``GpuJpegDecoder.decode_into`` turns a batch of files into the (N, size, size, 3) uint8 RGB crops of torchvision's
Inception-V3 preprocessing, in device memory. Per file, a look at its header with Pillow (no decode) decides:

- more pixels than Pillow accepts (2 * Image.MAX_IMAGE_PIXELS): an error, as images.open_image says it;
- a complete 8-bit JPEG, RGB or greyscale, stored upright (EXIF orientation 1 or none): decoded by nvImageCodec,
  all of them in one batched call on the caller's stream, then resized on the GPU;
- anything else (PNG and other formats, CMYK/YCCK JPEGs, rotated ones, truncated ones, whatever Pillow cannot
  read) and any JPEG nvImageCodec fails on: the caller's exact CPU path (``cpu_fallback``), uploaded into its slot.

The resize reproduces Pillow's bytes exactly (pil_resize.py: same coefficients, same rounding, same pass order), so
GPU-decoded crops differ from the CPU path only where nvJPEG's IDCT and chroma upsampling differ from
libjpeg-turbo's: a level or two on some pixels (tests/device/test_gpu_decode.py measures it). nvImageCodec is asked for
libjpeg's "fancy" (smooth) chroma upsampling, which Pillow uses, rather than its default of replicating pixels.

nvImageCodec is imported on first use. Its Python API changed between releases (``CodecApi`` finds what the
installed one offers by looking at it, not at its version number); where it is missing, or cannot make a decoder,
``load_nvimgcodec`` and ``GpuJpegDecoder`` raise BackendUnavailable with one line.
"""

from __future__ import annotations

import ctypes
import functools
import io
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ...errors import BackendUnavailable, EngineError
from ...images import Preprocess, first_line
from ...pil_resize import Coeffs, plan_resize_crop
from .device import driver
from .kernels import Kernels, spec

CHANNELS = 3
EXIF_ORIENTATION = 0x0112
GPU_MODES = ("RGB", "L")  # JPEG modes nvImageCodec decodes to what Pillow + to_rgb give (CMYK it would not)
# nvImageCodec's default (":fancy_upsampling=0") replicates chroma samples; libjpeg, hence Pillow, interpolates them.
DECODER_OPTIONS = ":fancy_upsampling=1"
MISSING = "--decode gpu needs nvidia-nvimgcodec-cu13 (pip install -e '.[gpu-decode]')"
SUPPORTED = "0.6.1 to 0.9.0"  # the releases run on the GPU machine; pyproject's gpu-decode extra admits these


def load_nvimgcodec() -> Any:
    """The nvidia.nvimgcodec module, or BackendUnavailable in one line."""
    preload_nvjpeg()
    try:
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
        spec = getattr(module, "ColorSpec", None)
        rgb = getattr(spec, "SRGB", None) or getattr(spec, "RGB", None)
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
        """Orientation as stored (files with EXIF orientation other than 1 go to the CPU path), 8-bit RGB."""
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


JOB_FIELDS = 9  # resize_pil.cu's RESIZE_PIL_JOB: src, dst, start, weights, taps, out_rows, out_cols, pitches


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

    def enqueue(self, jobs: Sequence[tuple[DeviceImage, int]], dst_ptr: int, stream: Any) -> None:
        """For each (image, slot): the image's crop into slot `slot` of the batch at dst_ptr."""
        self.wait()
        if not jobs:
            return
        drv = driver()
        scheds = [schedule(img.height, img.width, self.pre.resize, self.pre.size) for img, _ in jobs]
        offsets, pieces, pos = [], [], 0
        for s in scheds:
            offs = []
            for p in (s.first, s.second):
                offs.append((pos, pos + len(p.coeffs.start)))
                pieces += [p.coeffs.start, p.coeffs.weights]
                pos += len(p.coeffs.start) + p.coeffs.weights.size
            offsets.append(offs)
        tables = self._tables.upload(pieces, stream)
        need = sum(s.tmp_bytes for s in scheds)
        if need > self._tmp_bytes:
            if self._tmp is not None:
                self._tmp.free()
            self._tmp, self._tmp_bytes = drv.mem_alloc(need), need
        size = self.pre.size
        slot_bytes = size * size * CHANNELS
        groups: dict[tuple[int, str], list[tuple[int, ...]]] = {}  # (pass, kernel) -> its jobs
        mid = int(self._tmp)
        for (img, slot), s, ((s1, w1), (s2, w2)) in zip(jobs, scheds, offsets):
            # the first pass reads from source row (or column) lo on: its start[] is relative to that
            src = img.ptr + (s.lo * CHANNELS if s.vertical_first else s.lo * img.pitch)
            mid_pitch = s.first.out_cols * CHANNELS
            groups.setdefault((0, s.first.kernel), []).append(
                (src, mid, tables + 4 * s1, tables + 4 * w1, s.first.coeffs.taps, s.first.out_rows,
                 s.first.out_cols, img.pitch, mid_pitch))
            groups.setdefault((1, s.second.kernel), []).append(
                (mid, dst_ptr + slot * slot_bytes, tables + 4 * s2, tables + 4 * w2, s.second.coeffs.taps,
                 s.second.out_rows, s.second.out_cols, mid_pitch, size * CHANNELS))
            mid += s.tmp_bytes
        order = sorted(groups)  # every first pass before any second pass (one stream: in this order)
        tables_of = [np.asarray(groups[g], np.int64).reshape(-1, JOB_FIELDS) for g in order]
        base = self._jobs.upload(tables_of, stream)
        for (_, kernel), table in zip(order, tables_of):
            most = int((table[:, 5] * table[:, 6]).max()) * CHANNELS
            k = spec(kernel)
            self.kernels[kernel].prepared_async_call((k.blocks(most), len(table), 1), k.block, stream, base)
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


def jpeg_complete(data: bytes) -> bool:
    """Whether an end-of-image marker follows the last start-of-scan. Entropy-coded data cannot hold FF D9, so a
    JPEG cut short fails this and goes to Pillow, which reports truncation as the CPU path does (nvJPEG might
    decode it with grey filler). An EXIF thumbnail's markers come before the main image's last scan."""
    if data.endswith(b"\xff\xd9"):  # the usual case, without scanning the file back to its last scan
        return True
    return data.rfind(b"\xff\xd9") > data.rfind(b"\xff\xda")


SOF_HUFFMAN = (0xC0, 0xC1, 0xC2)  # baseline, extended sequential, progressive: what Pillow and nvJPEG both read
STANDALONE = set(range(0xD0, 0xD8)) | {0x01}  # markers without a length


def plain_jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) of a plain JPEG, read from its markers without Pillow (a tenth of Pillow's ~130 µs, which
    capped --decode gpu's host side, docs/PERFORMANCE.md); None for anything else, which gpu_eligible then asks
    Pillow about. Plain: 8-bit Huffman-coded, grey or JFIF YCbCr (component ids 1, 2, 3), no Adobe colour transform
    0, no EXIF orientation other than 1, no XMP (Pillow reads orientation there too), a single EXIF block, within
    Pillow's pixel limit, and complete."""
    if data[:2] != b"\xff\xd8":
        return None
    pos, n, size, exif_seen = 2, len(data), None, False
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in STANDALONE:
            return None
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        seg = data[pos + 4:pos + 2 + length]
        if length < 2 or len(seg) != length - 2:
            return None
        if marker == 0xDA:  # start of scan: the header is over
            break
        if marker == 0xE1:
            if seg.startswith(b"Exif\x00\x00"):
                if exif_seen or exif_orientation(seg[6:]) != 1:
                    return None
                exif_seen = True
            elif seg.startswith(b"http://ns.adobe.com/xap/"):
                return None
        elif marker == 0xEE and seg.startswith(b"Adobe") and len(seg) >= 12 and seg[11] == 0:
            return None
        elif marker in SOF_HUFFMAN:
            if size is not None or len(seg) < 6 or seg[0] != 8:
                return None
            h, w, components = int.from_bytes(seg[1:3], "big"), int.from_bytes(seg[3:5], "big"), seg[5]
            if components == 3:
                if len(seg) < 15 or (seg[6], seg[9], seg[12]) != (1, 2, 3):
                    return None
            elif components != 1:
                return None
            size = (h, w)
        elif 0xC3 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # other SOFs: lossless, arithmetic
            return None
        pos += 2 + length
    else:
        return None
    if size is None or min(size) < 1:
        return None
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and size[0] * size[1] > limit:
        return None  # Pillow's own check words the warning or the refusal
    return size if jpeg_complete(data) else None


def exif_orientation(tiff: bytes) -> int | None:
    """The orientation tag of an EXIF block's first IFD (1 where it has none), None where the block is malformed."""
    order = {b"II": "little", b"MM": "big"}.get(tiff[:2])
    if order is None or len(tiff) < 8 or int.from_bytes(tiff[2:4], order) != 42:
        return None
    ifd = int.from_bytes(tiff[4:8], order)
    if ifd + 2 > len(tiff):
        return None
    count = int.from_bytes(tiff[ifd:ifd + 2], order)
    if ifd + 2 + 12 * count > len(tiff):
        return None
    for e in range(ifd + 2, ifd + 2 + 12 * count, 12):
        if int.from_bytes(tiff[e:e + 2], order) == EXIF_ORIENTATION:
            if int.from_bytes(tiff[e + 2:e + 4], order) != 3 or int.from_bytes(tiff[e + 4:e + 8], order) != 1:
                return None  # not one SHORT: let Pillow make sense of it
            return int.from_bytes(tiff[e + 8:e + 10], order)
    return 1


def gpu_eligible(path: str, data: bytes) -> tuple[int, int] | None:
    """(height, width) for a file nvImageCodec should decode, None for one the CPU path should take. Raises
    EngineError for more pixels than Pillow accepts (images.open_image's wording)."""
    size = plain_jpeg_size(data)
    return size if size is not None else pillow_eligible(path, data)


def pillow_eligible(path: str, data: bytes) -> tuple[int, int] | None:
    """gpu_eligible by Pillow's reading of the header, for the files plain_jpeg_size leaves to it."""
    try:
        with Image.open(io.BytesIO(data)) as img:  # parses the header only
            fmt, mode, (w, h) = img.format, img.mode, img.size
            orientation = img.getexif().get(EXIF_ORIENTATION, 1)  # what ImageOps.exif_transpose reads
            # An Adobe marker with transform 0 stores R, G, B as they are (libjpeg, hence Pillow, leaves them
            # unconverted); leave such files to Pillow rather than trust another decoder with the flag.
            stored_rgb = img.info.get("adobe_transform") == 0
    except Image.DecompressionBombError as e:
        raise EngineError(f"{path}: refused, too many pixels ({e})") from None
    except Exception:  # unidentified, corrupt header, malformed EXIF: the CPU path says what in its own words
        return None
    if fmt != "JPEG" or mode not in GPU_MODES or orientation != 1 or stored_rgb or not jpeg_complete(data):
        return None
    return h, w


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


class GpuJpegDecoder:
    """Batches of files -> (N, size, size, 3) uint8 crops in device memory; see the module doc.

    Create and use inside the CUDA context the kernels were loaded in (the backend's ``with gpu:``).
    backends: names of nvidia.nvimgcodec.BackendKind members to allow (e.g. ("GPU_ONLY",)); None: its default.
    threads: nvImageCodec's host threads (0: one per CPU; a process sharing the CPUs with others gets its share)."""

    def __init__(self, kernels: Kernels, pre: Preprocess, max_batch: int, *,
                 backends: Sequence[str] | None = None, threads: int = 0):
        api = CodecApi.of(load_nvimgcodec())
        try:
            self._decoder = api.decoder(backends, DECODER_OPTIONS, threads)
            self._params = api.decode_params()
        except Exception as e:  # whatever the library raises (TypeError for a signature, RuntimeError, ...)
            raise BackendUnavailable(f"nvImageCodec {api.version} could not make a JPEG decoder "
                                     f"({type(e).__name__}: {first_line(e)}); use --decode cpu, or install "
                                     f"nvImageCodec {SUPPORTED}") from None
        self._codec = api.module
        self.pre, self.max_batch, self.threads = pre, max_batch, threads
        self._resize = GpuResizeCrop(kernels, pre)
        self._decoded: list[Any] = []  # the last batch's nvImageCodec images, alive until its resize has run
        self._staging: np.ndarray | None = None  # pinned (max_batch, size, size, 3) for CPU-path results
        self._done: Any = None  # event after the last batch's uploads

    def decode_into(self, items: Sequence[tuple[str, bytes]], dst_ptr: int, stream: Any,
                    cpu_fallback: Callable[[str, bytes], np.ndarray]) -> list[str | None]:
        """Decode items[i] = (path, file bytes) into slot i of the (len(items), size, size, 3) uint8 batch at
        dst_ptr, everything enqueued on stream. Returns one error message per item (None: decoded); a failed
        item's slot holds anything. cpu_fallback(path, data) gives the exact CPU result or raises EngineError."""
        if len(items) > self.max_batch:
            raise ValueError(f"{len(items)} items for a decoder of max_batch {self.max_batch}")
        self.wait()  # the previous batch's decoded images and staged results are free to go
        self._decoded = []
        errors: list[str | None] = [None] * len(items)
        to_gpu: list[tuple[int, int, int]] = []  # (item, height, width)
        to_cpu: list[int] = []
        for i, (path, data) in enumerate(items):
            try:
                hw = gpu_eligible(path, data)
            except EngineError as e:
                errors[i] = str(e)
                continue
            if hw is None:
                to_cpu.append(i)
            else:
                to_gpu.append((i, *hw))
        jobs: list[tuple[DeviceImage, int]] = []
        for (i, h, w), img in zip(to_gpu, self._decode([items[i][1] for i, _, _ in to_gpu], stream)):
            dev = None if img is None else device_image(img, h, w)
            if dev is None:
                to_cpu.append(i)
            else:
                jobs.append((dev, i))
                self._decoded.append(img)
        self._resize.enqueue(jobs, dst_ptr, stream)
        self._upload_cpu_results(items, sorted(to_cpu), dst_ptr, stream, cpu_fallback, errors)
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

    def _upload_cpu_results(self, items: Sequence[tuple[str, bytes]], which: list[int], dst_ptr: int, stream: Any,
                            cpu_fallback: Callable[[str, bytes], np.ndarray], errors: list[str | None]) -> None:
        if not which:
            return
        drv = driver()
        shape = (self.pre.size, self.pre.size, CHANNELS)
        if self._staging is None:
            self._staging = drv.pagelocked_empty((self.max_batch, *shape), np.uint8)
        for i in which:
            path, data = items[i]
            try:
                crop = cpu_fallback(path, data)
            except EngineError as e:
                errors[i] = str(e)
                continue
            if crop.shape != shape or crop.dtype != np.uint8:
                raise ValueError(f"cpu_fallback gave {crop.dtype} {crop.shape} for {path}, expected uint8 {shape}")
            self._staging[i] = crop
            drv.memcpy_htod_async(dst_ptr + i * crop.nbytes, self._staging[i], stream)

    def close(self) -> None:
        self.wait()
        self._resize.close()
        self._decoded = []
        if self._staging is not None:
            self._staging.base.free()
            self._staging = None
