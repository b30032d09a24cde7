"""A calibrated weight file for the int8 path on the GPU machine (no real weights or data set can be downloaded
there): inception_engine.synthetic's model, saved, then calibrated (calibrate.calibrate_file, as
`inception-convert-weights --calibrate` does) on a folder of generated photos (dev/gpu_machine/make_photos.py).

    python3 dev/make_calibrated_weights.py OUT.npz [--images N] [--photos DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "dev" / "gpu_machine")]
from inception_engine.calibrate import calibrate_file  # noqa: E402
from inception_engine.synthetic import synthetic_weights  # noqa: E402
from inception_engine.weights import save_weights  # noqa: E402
from make_photos import make  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--images", type=int, default=64, help="calibration images (default 64)")
    p.add_argument("--photos", type=Path, help="a folder of images to calibrate on (default: generated)")
    a = p.parse_args()
    w = synthetic_weights(0)
    save_weights(a.out, w.arrays, w.manifest, overwrite=True)
    with tempfile.TemporaryDirectory() as tmp:
        photos = a.photos or Path(tmp)
        if a.photos is None:
            make(photos, a.images)
        record = calibrate_file(a.out, photos, a.images)
    print(f"{a.out}: calibrated on {record['images']} images ({record['method']})")


if __name__ == "__main__":
    main()
