"""Atomic file writes: a file is written to a temp file in its own folder, fsynced, then renamed into place, so a
reader never sees half a file (weights, tuning tables, reports, features all write so).

The temp file is named .<name>.<host>.<pid>.<token>.part: a writer killed outright (SIGKILL, power loss) cannot
remove its own, so the next write of that name removes every part file of a process of this host that is no longer
running, and any part file untouched for STALE_PART_SECONDS (a write takes seconds; another host's process cannot
be asked whether it runs). Only a regular file, or nothing, is ever replaced at the path.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path
from typing import Any

from .errors import EngineError

EXAMPLE_NAME = "inception_v3.npz"  # named in the message for a directory given as a file to write

STALE_PART_SECONDS = 24 * 3600


def default_file_mode() -> int:
    """The mode a plain open() gives a new file: 0666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _host() -> str:
    import socket  # on use: the host's name only where a file is written

    return "".join(c if c.isalnum() or c == "-" else "-" for c in socket.gethostname()) or "host"


def _process_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: beyond any pid
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_parts(folder: Path, name: str) -> None:
    """Removes part files of ``name`` in ``folder`` left by dead writers (see the rule above)."""
    prefix = "." + name + "."
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for e in entries:
        if not (e.name.startswith(prefix) and e.name.endswith(".part")):
            continue
        fields = e.name[len(prefix):-len(".part")].rsplit(".", 2)
        try:
            dead = (len(fields) == 3 and fields[0] == _host() and fields[1].isdigit()
                    and int(fields[1]) != os.getpid() and not _process_running(int(fields[1])))
            if dead or time.time() - e.stat(follow_symlinks=False).st_mtime > STALE_PART_SECONDS:
                os.unlink(e.path)
        except OSError:
            pass  # another writer removed it first, or no permission: not ours to insist


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def writable_target(path: str | Path, overwrite: bool = True) -> Path:
    """The file a write to ``path`` replaces: symlinks followed to their target, which must be a regular file or
    not exist yet (overwrite=False: must not exist). Raises EngineError with what is in the way."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target
    except NotADirectoryError:
        raise EngineError(f"cannot write {path}: {_blocking_file(target)} is a file, not a folder") from None
    except OSError as e:
        raise EngineError(f"cannot write {path}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise EngineError(f"{path} is a directory; give the path of a file to write (such as {path / EXAMPLE_NAME})")
    if not stat.S_ISREG(st.st_mode):
        raise EngineError(f"{path} is {_kind(st.st_mode)}; only a regular file is ever replaced, give another path")
    if not overwrite:
        raise EngineError(f"{path} exists already; nothing was written (overwrite=True replaces it)")
    return target


def _blocking_file(path: Path) -> Path:
    """The first ancestor of ``path`` that exists but is not a folder."""
    for p in reversed(path.parents):
        if p.exists() and not p.is_dir():
            return p
    return path.parent


def atomic_write(path: str | Path, write: Any, overwrite: bool = True) -> Path:
    """Call ``write(file_object)`` on a temp file in the destination's folder, fsync, then rename it into place,
    so an interrupted run never leaves a partial file at ``path`` (see the rule above). overwrite=False: an
    existing file is an error, also one that appears while writing. Failures are EngineErrors naming the path."""
    path = Path(path)
    target = writable_target(path, overwrite)
    folder = target.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise EngineError(f"cannot write {path}: {_blocking_file(target)} is a file, not a folder") from None
    except OSError as e:
        raise EngineError(f"cannot create the folder {folder}: {e.strerror}") from None
    remove_stale_parts(folder, target.name)
    tmp = folder / f".{target.name}.{_host()}.{os.getpid()}.{os.urandom(4).hex()}.part"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to open()
    except OSError as e:
        raise EngineError(f"cannot write {path}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            writable_target(target)  # what appeared meanwhile must be a regular file too
            os.replace(tmp, target)
        else:
            _publish_new(tmp, target)
        _fsync_folder(folder)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, FileExistsError):
            raise EngineError(f"{path} appeared while it was written; nothing was replaced") from None
        if isinstance(e, OSError):
            raise EngineError(f"cannot write {path}: {e.strerror or e}; nothing was written") from None
        raise
    return path


def _publish_new(tmp: Path, target: Path) -> None:
    """Gives the finished temp file the name ``target`` only if nothing has it (FileExistsError otherwise): a hard
    link does that atomically; on a file system without hard links, a check just before the rename."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
            raise
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, "exists", str(target)) from None
        os.replace(tmp, target)
        return
    os.unlink(tmp)


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
