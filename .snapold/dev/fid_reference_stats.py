"""FID statistics of a folder from the NumPy backend's features, in float64 (the reference every backend is checked
against) or float32 (the CPU path): how far a float32 forward moves a FID, measured without a GPU.

    python dev/fid_reference_stats.py {f64,f32} DIR OUT.npz --weights FID.npz [--images N] [--batch 16]

The images are read and resized as inception-fid reads them (the weight file's preprocessing: pytorch-fid's for the
FID network); the statistics are fid.RunningStats' (float64), written as pytorch-fid's .npz. Score two of them with
``inception-fid A.npz B.npz``. Slow by design (float64 NumPy: ~5 images/s on two cores).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inception_engine import fid  # noqa: E402
from inception_engine.backends.numpy_backend import NumpyBackend  # noqa: E402
from inception_engine.ingest.images import Preprocess, load_image  # noqa: E402
from inception_engine.ingest.inputs import list_directory  # noqa: E402
from inception_engine.plan import build_plan  # noqa: E402
from inception_engine.weights import load_weight_file  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dtype", choices=["f64", "f32"])
    ap.add_argument("folder")
    ap.add_argument("out")
    ap.add_argument("--weights", required=True, help="the FID network's weight file")
    ap.add_argument("--images", type=int, default=None, help="the folder's first N images (default: all)")
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    dtype = np.float64 if args.dtype == "f64" else np.float32
    weights = load_weight_file(Path(args.weights))
    pre = Preprocess.from_manifest(weights.manifest)
    backend = NumpyBackend(weights, build_plan(args.batch, weights.layers(), input_size=pre.size), dtype=dtype)
    files = list_directory(args.folder, recursive=False).files[:args.images]
    stats = fid.RunningStats()
    t0 = time.perf_counter()
    for i in range(0, len(files), args.batch):
        chunk = files[i:i + args.batch]
        x = np.zeros((args.batch, 3, pre.size, pre.size), dtype)
        x[:len(chunk)] = np.stack([load_image(f, pre) for f in chunk])
        _, feats = backend.forward(x, features=True)
        stats.add(np.asarray(feats[:len(chunk)], np.float64))
    mu, sigma = stats.result()
    fid.save_stats(args.out, mu, sigma)
    print(f"{args.out}: {len(files)} images, {args.dtype}, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
