"""Rewrite nvImageCodec's wheel for the GPU (device) machine with only what ``--decode gpu`` loads there.

    python dev/gpu_machine/slim_nvimgcodec_wheel.py .whl/nvidia_nvimgcodec_cu13-*.whl
                                                    # in place; the original is kept as .whl-orig/NAME

The wheel (26 MB) holds the Python binding once per CPython version (3.8 to 3.13t) and codec extensions for JPEG
2000, TIFF and OpenCV. The device machine runs CPython 3.12, and jpeg_decode.py sends only baseline and
progressive JPEGs to nvImageCodec (anything else goes the CPU way), so the slim wheel keeps the 3.12 binding, the
library, and the nvJPEG and libjpeg-turbo extensions: ~9 MB, which leaves room beside the Ray kit (.raykit, 39
MiB) in one device call's 64 MiB. nvImageCodec loads whatever extensions its folder holds; a missing one is a
codec it does not offer. RECORD is rewritten to list what is left, with the hashes pip checks.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import shutil
import zipfile
from pathlib import Path

KEEP_PYTHON = "cpython-312-"
DROP_EXTENSIONS = re.compile(r"extensions/lib(nvtiff|nvjpeg2k|opencv|tiff)_ext\.so")


def keep(name: str) -> bool:
    if ".cpython-" in name and KEEP_PYTHON not in name:
        return False
    return not DROP_EXTENSIONS.search(name)


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(wheel: Path) -> None:
    keep_dir = wheel.parent.parent / ".whl-orig"
    keep_dir.mkdir(exist_ok=True)
    original = keep_dir / wheel.name
    if not original.exists():
        shutil.copy2(wheel, original)
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(original) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in src.infolist():
            if info.filename == record or not keep(info.filename):
                continue
            data = src.read(info)
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            lines.append(record_line(info.filename, data))
        dst.writestr(record, "\n".join(lines + [f"{record},,"]) + "\n")
    tmp.replace(wheel)
    print(f"{wheel}: {original.stat().st_size / 2**20:.1f} -> {wheel.stat().st_size / 2**20:.1f} MiB "
          f"(original kept as {original})")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheels", nargs="+", type=Path, help="nvidia_nvimgcodec_cu13-*.whl, rewritten in place")
    for wheel in ap.parse_args(argv).wheels:
        slim(wheel)


if __name__ == "__main__":
    main()
