"""File-system entries as images are read from them: which names are images (the extensions Pillow reads), what an
entry is where it is no regular file, an unreadable file's error in words, the pixel limits. NumPy-free: the listing
and the reading of files (inputs.py, files.py) are all that ``inception-run --server`` does with images."""

from __future__ import annotations

import errno
import functools
import os
import stat
import sys
from typing import BinaryIO

import PIL

from ..atomic import atomic_write
from ..errors import EngineError, first_line
from ..paths import user_cache_dir

# The most pixels an image may declare unless the run says otherwise (--max-pixels, $INCEPTION_MAX_PIXELS):
# Pillow's own default bomb limit, 89,478,485 (a 256 MB picture at 3 bytes a pixel).
DEFAULT_MAX_PIXELS = 1024 * 1024 * 1024 // 4 // 3
MAX_PIXELS_ENV = "INCEPTION_MAX_PIXELS"
# What decoding one image may hold at once, per decode worker: Pillow keeps 4 bytes a pixel (RGB padded to 32 bits),
# and turning it upright or converting its mode copies it; the resize adds only a small multiple of the crop.
DECODE_BYTES_PER_PIXEL = 12


def image_extensions() -> frozenset[str]:
    """Lower-case file extensions Pillow can open (".jpg", ".png", ...): those of its own plugins (pillow_extensions),
    and any a plugin registered in this process (a HEIF opener the caller imported), from Pillow's registry as it
    stands, which costs nothing. A plugin registers through PIL.Image, so where no one imported it (an
    ``inception-run --server`` client, which never decodes) there is none to add and it is not imported here."""
    image = sys.modules.get("PIL.Image")
    return pillow_extensions() | {ext.lower() for ext in (image.EXTENSION if image is not None else ())}


@functools.cache
def pillow_extensions() -> frozenset[str]:
    """The extensions of Pillow's own plugins. Pillow learns them by importing every plugin (``Image.init``: ~50 ms,
    a sixth of an ``inception-run --server`` client's start before its first request), and they are the same for a
    Pillow version, so the set is kept in the user cache under that version and a later process reads one small
    file. The cache is only a cache: unreadable, unwritable or not a list this wrote, the plugins are imported."""
    path = user_cache_dir() / f"pillow-{PIL.__version__}-extensions.txt"
    try:
        cached = frozenset(path.read_text().split())
    except (OSError, UnicodeDecodeError):
        cached = frozenset()
    if ".jpg" in cached and all(e.startswith(".") and e == e.lower() for e in cached):
        return cached
    from PIL import Image

    Image.init()
    found = frozenset(ext.lower() for ext in Image.registered_extensions())
    try:
        atomic_write(path, lambda f: f.write("\n".join(sorted(found)).encode() + b"\n"))
    except EngineError:  # a read-only home: the next process imports the plugins again
        pass
    return found


def open_regular(path: str | os.PathLike, buffered: bool = True) -> BinaryIO:
    """The file at path opened for reading, if it is a non-empty regular file (symbolic links followed); else an
    EngineError saying what it is instead. A FIFO or a device is never read: opening one could block or consume it;
    the check is made on the opened descriptor too, so a file swapped in between is caught."""
    try:
        kind = not_a_file(os.stat(path).st_mode)
        if kind is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise EngineError(file_error(path, e)) from None
    if kind is not None:
        raise EngineError(f"{path}: {kind}, not an image file")
    try:
        st = os.fstat(fd)
        kind = not_a_file(st.st_mode)
        if kind is not None:
            raise EngineError(f"{path}: {kind}, not an image file")
        if st.st_size == 0:
            raise EngineError(f"{path}: empty file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=-1 if buffered else 0)
    except BaseException:
        os.close(fd)
        raise


def not_a_file(mode: int) -> str | None:
    """What a file-system entry is, for those that are not regular files (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    for test, what in ((stat.S_ISDIR, "is a directory"), (stat.S_ISFIFO, "is a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "is a socket"), (stat.S_ISCHR, "is a character device"),
                       (stat.S_ISBLK, "is a block device")):
        if test(mode):
            return what
    return "is not a regular file"


def file_error(name: object, e: OSError) -> str:
    """The one-line message for a file that cannot be read (not for bad image data: see pillow_errors)."""
    return f"{name}: {file_problem(name, e)}"


def file_problem(name: object, e: OSError) -> str:
    """What is wrong with the file system entry ``name`` that gave the error e, in words."""
    if e.errno == errno.ENOENT:
        if isinstance(name, (str, os.PathLike)) and os.path.islink(name):
            try:
                return f"dangling symbolic link (its target {os.readlink(name)} does not exist)"
            except OSError:  # gone since
                return "dangling symbolic link"
        return "no such file"
    if e.errno == errno.ELOOP:
        return "symbolic link loop (too many levels of symbolic links)"
    if e.errno == errno.EISDIR:
        return "is a directory, not an image file"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if e.errno == errno.ENOTDIR:
        return "no such file (a part of the path is not a directory)"
    if e.errno == errno.ENAMETOOLONG:
        return "file name too long"
    return f"cannot read ({e.strerror or first_line(e)})"
