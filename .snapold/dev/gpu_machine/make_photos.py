"""A folder of photo-like test images for the GPU machine (no data set can be downloaded there): smooth colour
fields with noise, JPEGs of several sizes and qualities, some stored on their side (EXIF orientation 6, as phones
store them), a few PNGs. Deterministic: the same folder every time.

    python3 dev/gpu_machine/make_photos.py DIR [--count N]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image


def photo(rng: np.random.Generator, h: int, w: int) -> Image.Image:
    small = rng.integers(0, 256, (max(2, h // 64), max(2, w // 64), 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC), dtype=np.int16)
    noisy = np.clip(base + rng.integers(-20, 21, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(noisy)


def make(folder: Path, count: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2026)
    sizes = [(375, 500), (500, 375), (299, 299), (480, 640), (1080, 1440), (333, 517)]
    written = []
    for i in range(count):
        h, w = sizes[i % len(sizes)]
        img = photo(rng, h, w)
        if i % 16 == 15:
            path = folder / f"img{i:05d}.png"
            img.save(path)
        else:
            path = folder / f"img{i:05d}.jpg"
            exif = Image.Exif()
            if i % 8 == 7:
                exif[0x0112] = 6  # stored on its side: turned upright by the decode
            img.save(path, quality=int(70 + 25 * rng.random()), exif=exif)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--count", type=int, default=64)
    args = parser.parse_args()
    print(f"{len(make(args.folder, args.count))} images in {args.folder}")


if __name__ == "__main__":
    main()
