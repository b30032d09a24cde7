"""``inception-run --features OUT.npy``: each image's pool features (float32, 2048 a row) in input order, and the image
list beside them in ``OUT.txt``.

Format. ``OUT.npy`` is one ``(N, 2048)`` float32 array in NumPy's own format: ``np.load(path, mmap_mode="r")`` maps
it without reading it (50,000 images: 400 MB), and it is written the same way, row by row into a memory map of a
file sized once (``np.lib.format.open_memmap``), so the run's memory stays flat in N. A ``.npz`` (a zip) can be
neither written in place nor mapped; Parquet would need pyarrow. Row ``i`` is the image on line ``i + 1`` of
``OUT.txt``; an image that could not be read has a row of NaN (its error is in the run's results). ``OUT.txt``
holds one name a line, as the results name it (the path as given; bytes that are not UTF-8 written as they are, as
output.py's CSV does). A line break inside a file name is the one thing written otherwise: as the two characters
``\\n`` (``\\r`` likewise).

Both files are written to temp files beside their names and renamed into place only when the run finishes: an
interrupted run leaves neither, never a half-written one (atomic.py's rule for part files). An existing
``OUT.npy`` or ``OUT.txt`` is refused before the run starts (RunConfig).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .errors import EngineError
from .atomic import _fsync_folder, _host, remove_stale_parts, writable_target

SUFFIX = ".npy"


def names_path(features: str | os.PathLike) -> Path:
    """The image list beside ``OUT.npy``: ``OUT.txt``."""
    return Path(features).with_suffix(".txt")


def check_features_path(path: str) -> None:
    """A usage error where ``path`` cannot be the features file: not ``.npy``, or it or its list exist already."""
    if Path(path).suffix.lower() != SUFFIX:
        raise EngineError(f"--features writes a NumPy .npy file (and the image list beside it as .txt); got {path}")
    for p in (Path(path), names_path(path)):
        if os.path.lexists(p):
            raise EngineError(f"--features: {p} exists already; remove it or give another name (nothing is "
                              f"overwritten)")
    writable_target(path, overwrite=False)


def list_line(name: str) -> bytes:
    return name.replace("\n", "\\n").replace("\r", "\\r").encode("utf-8", "surrogateescape") + b"\n"


class FeatureFile:
    """The rows of ``names`` (width ``width``) into a memory-mapped temp file as batches finish (``add``, in any
    order), NaN for rows never given; ``commit`` renames it and the list into place, ``discard`` removes them."""

    def __init__(self, path: str | os.PathLike, names: Sequence[str], width: int):
        self.path, self.names = Path(path), names
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise EngineError(f"cannot create the folder {folder}: {e.strerror}") from None
        for p in (self.path, names_path(self.path)):
            remove_stale_parts(folder, p.name)
        token = f"{_host()}.{os.getpid()}.{os.urandom(4).hex()}.part"
        self.tmp = folder / f".{self.path.name}.{token}"
        self.tmp_names = folder / f".{names_path(self.path).name}.{token}"
        try:
            self.rows = np.lib.format.open_memmap(self.tmp, mode="w+", dtype=np.float32, shape=(len(names), width))
        except OSError as e:
            raise EngineError(f"cannot write {self.path}: {e.strerror or e}") from None
        self.filled = 0  # rows below it are written or NaN

    def add(self, indices: list[int], rows: np.ndarray) -> None:
        """Rows for these input indices; rows skipped since the last call (images that failed) become NaN."""
        if not indices:
            return
        top = max(indices) + 1
        if top > self.filled:
            self.rows[self.filled:top] = np.nan
            self.filled = top
        self.rows[indices] = rows

    def commit(self) -> Path:
        """Both files in place (fsynced, then renamed); the features file's path."""
        self.rows[self.filled:] = np.nan
        self.rows.flush()
        del self.rows
        try:
            with open(self.tmp_names, "wb") as f:
                f.write(b"".join(list_line(n) for n in self.names))
                f.flush()
                os.fsync(f.fileno())
            with open(self.tmp, "rb+") as f:
                os.fsync(f.fileno())
            for tmp, final in ((self.tmp_names, names_path(self.path)), (self.tmp, self.path)):
                writable_target(final, overwrite=False)
                os.replace(tmp, final)
            _fsync_folder(self.path.parent)
        except OSError as e:
            self.discard()
            raise EngineError(f"cannot write {self.path}: {e.strerror or e}; nothing was written") from None
        except BaseException:
            self.discard()
            raise
        return self.path

    def discard(self) -> None:
        """Removes the temp files (an interrupted or failed run)."""
        if hasattr(self, "rows"):
            del self.rows
        for p in (self.tmp, self.tmp_names):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
