"""How far GPU preprocessing (nvImageCodec decode + resize_pil.cu) is from the exact CPU path, over a folder.

    python dev/gpu_decode_agreement.py DIR [--batch 64] [--backends GPU_ONLY,HW_GPU_ONLY]

Every image directly inside DIR (sorted) goes through GpuJpegDecoder.decode_files, the path `--decode gpu` takes
(cuda_src/jpeg_batch.c where it builds; nvImageCodec's Python API where it does not, or where --backends is given),
and through the CPU path (Pillow decode, EXIF orientation, RGB, Pillow's bilinear resize, centre crop, as uint8).
Prints the mean and max absolute byte difference over the files the GPU decoded (by their headers), that the
CPU-path files agree exactly, the files that differ most, errors that differ between the two paths, and
decode_files' throughput (wall clock, stream synchronised; reading the files and the CPU-path files included).
Needs a GPU, pycuda and nvidia-nvimgcodec-cu13.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from inception_engine.backends import cuda as cb
from inception_engine.errors import EngineError
from inception_engine.ingest import jpeg_decode, jpeg_header
from inception_engine.ingest.files import read_file
from inception_engine.ingest.entries import image_extensions
from inception_engine.ingest.images import Preprocess, decode_u8_bytes

CpuPath = Callable[[str, bytes], np.ndarray]


def cpu_path(pre: Preprocess) -> CpuPath:
    def crop(path: str, data: bytes) -> np.ndarray:
        return decode_u8_bytes(data, path, pre)
    return crop


@dataclass
class Agreement:
    """What the files compared so far showed: (mean, max, path) of each GPU-decoded file, and the lines for files
    whose two paths disagree beyond the GPU decoder's rounding (errors that differ, CPU-path files not exact)."""
    stats: list[tuple[float, int, str]] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)

    def compare(self, path: str, gpu_error: str | None, crop: np.ndarray, cpu: CpuPath) -> None:
        """One file's GPU result (its error, or its crop) against the exact CPU path's, read from disk again."""
        data, ref_err = read_file(path)
        ref = None
        if data is not None:
            try:
                ref = cpu(path, data)
            except EngineError as e:
                ref_err = str(e)
        if gpu_error != ref_err:
            self.mismatched.append(f"{path}: GPU path {gpu_error!r}, CPU path {ref_err!r}")
            return
        if ref is None or data is None:
            return
        d = np.abs(crop.astype(np.int16) - ref)
        try:
            on_gpu = jpeg_header.gpu_eligible(path, data) is not None
        except EngineError:
            on_gpu = False
        if on_gpu:
            self.stats.append((float(d.mean()), int(d.max()), path))
        elif d.any():
            self.mismatched.append(f"{path}: CPU-path file differs (max {d.max()})")

    def report(self, worst: int) -> list[str]:
        lines = []
        if self.stats:
            means = np.array([s[0] for s in self.stats])
            lines.append(f"GPU vs CPU path: mean abs diff {means.mean():.4f} (per file: median "
                         f"{np.median(means):.4f}, worst {means.max():.4f}), max abs diff "
                         f"{max(s[1] for s in self.stats)}")
            ranked = sorted(self.stats, reverse=True)[:worst]
            lines += [f"  {path}: mean {mean:.4f} max {mx}" for mean, mx, path in ranked]
        return lines + ["MISMATCH " + line for line in self.mismatched]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--backends", help="nvImageCodec backend kinds, comma-separated (default: its own choice; "
                                       "given, the decoder goes through nvImageCodec's Python API)")
    ap.add_argument("--worst", type=int, default=5, help="list this many files with the largest mean difference")
    return ap.parse_args(argv)


def main() -> int:
    args = parse_args()
    exts = image_extensions()
    paths = sorted(p for p in args.dir.iterdir() if p.is_file() and p.suffix.lower() in exts)
    if not paths:
        print(f"error: no images in {args.dir}", file=sys.stderr)
        return 2
    pre, cpu = Preprocess(), cpu_path(Preprocess())
    slot = pre.size * pre.size * 3
    gpu = cb.Gpu()
    found = Agreement()
    seconds = 0.0
    with gpu:
        drv = cb.driver()
        dec = jpeg_decode.GpuJpegDecoder(cb.Kernels(gpu.arch), pre, args.batch,
                                        backends=args.backends.split(",") if args.backends else None)
        stream = drv.Stream()
        dst = drv.mem_alloc(args.batch * slot)
        out = np.empty((args.batch, pre.size, pre.size, 3), np.uint8)
        way = "jpeg_batch.c" if dec.reads_files else f"nvImageCodec's Python API ({dec.native_unavailable})"
        for b in range(0, len(paths), args.batch):
            names = [str(p) for p in paths[b:b + args.batch]]
            t0 = time.perf_counter()
            errors = dec.decode_files(names, int(dst), stream, cpu)
            stream.synchronize()
            seconds += time.perf_counter() - t0
            drv.memcpy_dtoh(out, int(dst))
            for path, err, crop in zip(names, errors, out):
                found.compare(path, err, crop, cpu)
        dec.close()
        dst.free()
    gpu.release()
    print(f"{len(paths)} files, {len(found.stats)} decoded on the GPU, decode_files {len(paths) / seconds:.0f} "
          f"images/s (batch {args.batch}, through {way})")
    for line in found.report(args.worst):
        print(line)
    return 1 if found.mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
