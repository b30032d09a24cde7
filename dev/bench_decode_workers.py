"""The host decode side alone: the images of a folder decoded by process workers into a shared ring, as the
pipeline drives them (DecodePool: chunks of images a task, the ring's slots reused as results come back), no
forward; images/s. For A/B of a decode or resize change, run each tree with PYTHONPATH.

    python3 dev/bench_decode_workers.py DIR [--workers N] [--resize pytorch-fid|clean-fid|torchvision] [--slots 64]
                                        [--gpu-resize]

--gpu-resize: an FID tool's images as the cuda runner of a streaming run takes them (Preprocess.gpu_resize: decoded
pixels, the resize left to the GPU), not resized here.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections import deque
from pathlib import Path

from inception_engine.ingest.images import Preprocess
from inception_engine.ingest.ring import HostRing
from inception_engine.ingest.workers import DecodePool, default_workers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--resize", default="pytorch-fid", choices=["pytorch-fid", "clean-fid", "torchvision"])
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--gpu-resize", action="store_true", help="decoded pixels for the GPU's resize (FID modes)")
    a = ap.parse_args()
    files = sorted(str(p) for p in a.folder.iterdir() if not p.name.startswith("."))
    pre = Preprocess.from_manifest({}, mode=a.resize)  # an FID tool's with its network's scaling
    pre = dataclasses.replace(pre, gpu_resize=a.gpu_resize and a.resize != "torchvision")
    ring = HostRing(a.slots, pre, shared=True)
    pool = DecodePool(ring, pre, a.workers, kind="process")
    try:
        warm = [pool.submit(i, files[i % len(files)]) for i in range(a.slots)]  # the workers start
        pool.flush()
        errors = [e for f in warm if (e := f.result()) is not None]
        t0 = time.perf_counter()
        pending: deque = deque()
        for i, path in enumerate(files):
            if len(pending) == a.slots:
                pool.flush()
                errors += [e] if (e := pending.popleft().result()) is not None else []
            pending.append(pool.submit(i % a.slots, path))
        pool.flush()
        errors += [e for f in pending if (e := f.result()) is not None]
        seconds = time.perf_counter() - t0
    finally:
        pool.close()
        ring.close()
    how = f"{a.resize}{', resized on the GPU' if pre.gpu_resize else ''}"
    print(f"{len(files)} images, {a.workers} process workers, {how}: {len(files) / seconds:.0f} images/s"
          + (f", {len(errors)} errors (first: {errors[0]})" if errors else ""))


if __name__ == "__main__":
    main()
