"""How far GPU preprocessing (nvImageCodec decode + resize_pil.cu) is from the exact CPU path, over a folder.

    python dev/gpu_decode_agreement.py DIR [--batch 64] [--backends GPU_ONLY,HW_GPU_ONLY]

Every image directly inside DIR (sorted) goes through GpuJpegDecoder.decode_into and through the CPU path (Pillow
decode, EXIF orientation, RGB, Pillow's bilinear resize, centre crop, as uint8). Prints the mean and max absolute
byte difference over the files the GPU decoded (by their headers), that the CPU-path files agree exactly, the
files that differ most, errors that differ between the two paths, and decode_into's throughput (wall clock, stream
synchronised; the CPU-path files included). Needs a GPU, pycuda and nvidia-nvimgcodec-cu13.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from inception_engine.ingest import jpeg_decode, jpeg_header
from inception_engine.backends import cuda as cb
from inception_engine.errors import EngineError
from inception_engine.ingest.images import Preprocess, decode_u8_bytes, image_extensions


def cpu_path(pre: Preprocess):
    def crop(path: str, data: bytes) -> np.ndarray:
        return decode_u8_bytes(data, path, pre)
    return crop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--backends", help="nvImageCodec backend kinds, comma-separated (default: its own choice)")
    ap.add_argument("--worst", type=int, default=5, help="list this many files with the largest mean difference")
    args = ap.parse_args()
    exts = image_extensions()
    paths = sorted(p for p in args.dir.iterdir() if p.is_file() and p.suffix.lower() in exts)
    if not paths:
        print(f"error: no images in {args.dir}", file=sys.stderr)
        return 2
    pre, cpu = Preprocess(), cpu_path(Preprocess())
    slot = pre.size * pre.size * 3
    gpu = cb.Gpu()
    stats: list[tuple[float, int, str]] = []  # (mean, max, path) of GPU-decoded files
    mismatched: list[str] = []
    seconds = 0.0
    with gpu:
        drv = cb.driver()
        dec = jpeg_decode.GpuJpegDecoder(cb.Kernels(gpu.arch), pre, args.batch,
                                        backends=args.backends.split(",") if args.backends else None)
        stream = drv.Stream()
        dst = drv.mem_alloc(args.batch * slot)
        out = np.empty((args.batch, pre.size, pre.size, 3), np.uint8)
        for b in range(0, len(paths), args.batch):
            items = [(str(p), p.read_bytes()) for p in paths[b:b + args.batch]]
            t0 = time.perf_counter()
            errors = dec.decode_into(items, int(dst), stream, cpu)
            stream.synchronize()
            seconds += time.perf_counter() - t0
            drv.memcpy_dtoh(out, int(dst))
            for (path, data), err, crop in zip(items, errors, out):
                try:
                    ref, ref_err = cpu(path, data), None
                except EngineError as e:
                    ref, ref_err = None, str(e)
                if err != ref_err:
                    mismatched.append(f"{path}: GPU path {err!r}, CPU path {ref_err!r}")
                    continue
                if ref is None:
                    continue
                d = np.abs(crop.astype(np.int16) - ref)
                try:
                    on_gpu = jpeg_header.gpu_eligible(path, data) is not None
                except EngineError:
                    on_gpu = False
                if on_gpu:
                    stats.append((float(d.mean()), int(d.max()), path))
                elif d.any():
                    mismatched.append(f"{path}: CPU-path file differs (max {d.max()})")
        dec.close()
        dst.free()
    gpu.release()
    print(f"{len(paths)} files, {len(stats)} decoded on the GPU, decode_into {len(paths) / seconds:.0f} images/s "
          f"(batch {args.batch})")
    if stats:
        means = np.array([s[0] for s in stats])
        print(f"GPU vs CPU path: mean abs diff {means.mean():.4f} (per file: median {np.median(means):.4f}, "
              f"worst {means.max():.4f}), max abs diff {max(s[1] for s in stats)}")
        for mean, mx, path in sorted(stats, reverse=True)[:args.worst]:
            print(f"  {path}: mean {mean:.4f} max {mx}")
    for line in mismatched:
        print("MISMATCH " + line)
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
