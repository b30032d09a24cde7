"""An input as the pipeline sees it (a path or an in-memory image), its name in the results, and reading files whole
(--decode gpu's path: the decoder takes bytes)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Union

from ..errors import EngineError
from .entries import file_error, open_regular

if TYPE_CHECKING:
    from PIL import Image

# PIL.Image by name: reading files (an inception-run --server client) never imports it
ImageSource = Union[str, os.PathLike, "Image.Image"]


def source_name(i: int, src: ImageSource) -> str:
    """Input number ``i``'s name in the results: its path as given, or "<PIL.Image i>" for an in-memory image."""
    return str(src) if isinstance(src, (str, os.PathLike)) else f"<PIL.Image {i}>"


def read_file(source: str | os.PathLike) -> tuple[bytes | None, str | None]:
    """(bytes, None), or (None, the error line) for a file that cannot be read, worded as images.open_image."""
    try:
        with open_regular(source, buffered=False) as f:  # unbuffered: one read, no BufferedReader copy
            return f.readall(), None
    except EngineError as e:  # missing, empty, or not a regular file (a FIFO is never read: it would block)
        return None, str(e)
    except OSError as e:
        return None, file_error(source, e)


def read_batch(sources: Sequence[ImageSource], first: int, end: int
               ) -> tuple[list[int], list[tuple[str, bytes]], dict[int, str]]:
    """Files first .. end - 1 read: the readable ones' seqs and (name, bytes), the others' error lines by seq."""
    seqs, items, failed = [], [], {}
    for seq in range(first, end):
        data, error = read_file(sources[seq])  # type: ignore[arg-type]  # PIL images were refused
        if data is None:
            failed[seq] = error
        else:
            seqs.append(seq)
            items.append((source_name(seq, sources[seq]), data))
    return seqs, items, failed
