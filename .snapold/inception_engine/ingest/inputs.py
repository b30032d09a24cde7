"""Which image files a command's arguments name: files as given, directories' image files, globs.

A directory gives its image files (by extension, hidden names left out at every level), sorted by path: those of
its top level only, or with ``recursive`` those of every level below it too. What a top-level-only listing leaves
out is counted, so that the command can say so instead of classifying a fraction of the images without a word.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .entries import file_problem, image_extensions, not_a_file

# Counting what a top-level-only listing skips walks the subdirectories: stop after this many, so that pointing the
# command at a large tree without --recursive costs a moment, not a full walk.
SKIP_COUNT_DIRS = 1000


@dataclass
class DirectoryListing:
    files: list[str]
    skipped: int = 0  # image files in subdirectories that were not searched
    more_skipped: bool = False  # the count stopped at SKIP_COUNT_DIRS subdirectories with more to walk
    not_files: list[str] = field(default_factory=list)  # "name: reason" of entries named like images that are not
    # image files (a directory, a FIFO, a dangling or looping link), among those searched

    def notice(self) -> str | None:
        """What was not searched, in a few words, or None."""
        if not self.skipped:
            return None
        n = f"{self.skipped}{'+' if self.more_skipped else ''}"
        return f"{n} image{'s' * (n != '1')} in subfolders not searched (--recursive searches them)"


@dataclass
class Level:
    """One directory of a walk: its path as given, its subdirectories' names (symbolic links to directories
    included, as os.walk lists them), the names of its regular files named like images, and its other entries named
    like images (links, and what is no file), whose type the caller reads (entry_problem)."""

    path: str
    dirs: list[str]
    files: list[str]
    images: list[os.DirEntry]
    links: set[str]  # the subdirectories that are symbolic links: listed, never walked into


def named_like_image(name: str, exts: set[str]) -> bool:
    """Whether a name has one of ``exts`` (lower case, with the dot) as its extension, as os.path.splitext takes it
    (the last dot, after something other than leading dots), without splitext's cost on a listing of thousands."""
    dot = name.rfind(".")
    return dot > 0 and name[dot:].lower() in exts and (name[0] != "." or name[:dot].lstrip(".") != "")


def walk_levels(top: str, exts: set[str]) -> Iterator[Level]:
    """os.walk's walk (top-down, hidden names left out, links to directories not followed, unreadable directories
    skipped) over ``os.scandir``'s entries, so that a caller that needs an entry's file type reads it from the
    directory listing where it can (a regular file: no system call) instead of calling stat on its path."""
    try:
        with os.scandir(top) as it:
            entries = [e for e in it if not e.name.startswith(".")]
    except OSError:
        return
    level = Level(top, [], [], [], set())
    # A folder of images is mostly regular files named like images: each costs a name test and a file type read from
    # the listing (no system call, no function of ours); only the other entries take is_directory and entry_problem.
    for e in entries:
        name = e.name
        named = named_like_image(name, exts)
        if named and e.is_file(follow_symlinks=False):
            level.files.append(name)
        elif is_directory(e):
            level.dirs.append(name)
            if e.is_symlink():
                level.links.add(name)
        elif named:
            level.images.append(e)
    yield level
    for d in level.dirs:  # the caller may prune level.dirs meanwhile, as with os.walk
        if d not in level.links:
            yield from walk_levels(os.path.join(top, d), exts)


def is_directory(entry: os.DirEntry) -> bool:
    """Whether the entry is a directory or a link to one, as os.walk tells them (an entry that cannot be read: no)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def entry_problem(entry: os.DirEntry) -> str | None:
    """None for a regular file (links followed), else what the listed entry is instead, in words: how a listing
    tells images from entries merely named like them. A file type is read from the listing where the entry is no
    link (no system call)."""
    try:
        if entry.is_file(follow_symlinks=False):
            return None
        return not_a_file(entry.stat().st_mode)
    except OSError as e:
        return file_problem(entry.path, e)


def list_directory(directory: str | os.PathLike, recursive: bool, exts: set[str] | None = None) -> DirectoryListing:
    """The directory's image files (``exts``: by default every extension Pillow reads), and without ``recursive``
    the count of those its subfolders hold."""
    exts = image_extensions() if exts is None else exts
    top = Path(directory)
    listing = DirectoryListing([])
    found: list[str] = []  # as str(Path(root) / name) writes them
    walked = 0
    walk = walk_levels(str(top), exts)
    for level in walk:
        base = Path(level.path)
        prefix = "" if str(base) == "." else str(base).rstrip(os.sep) + os.sep  # str(base / name) is prefix + name
        if recursive or base == top:
            for d in level.dirs:
                if named_like_image(d, exts):
                    listing.not_files.append(f"{Path(level.path, d).relative_to(top)}: is a directory, not an image")
            found += [prefix + name for name in level.files] if prefix else level.files
            for entry in level.images:
                why = entry_problem(entry)
                if why is None:
                    found.append(prefix + entry.name)
                else:
                    name = str((base / entry.name).relative_to(top))
                    listing.not_files.append(f"{name if name.isprintable() else repr(name)[1:-1]}: {why}")
            continue
        listing.skipped += len(level.files) + len(level.images)
        walked += 1
        if walked >= SKIP_COUNT_DIRS:
            listing.more_skipped = next(walk, None) is not None  # a directory left unwalked: the count is a floor
            break
    # in Path order (component by component, the same first ones for all), by a key: comparing Path objects costs
    # seconds on 100,000 files. The top level's files share every component but the last: plain string order is it.
    listing.files = sorted(found, key=lambda p: p.split(os.sep)) if recursive else sorted(found)
    return listing


@dataclass
class Inputs:
    items: list[tuple[str, str | None]]  # (path, None) per image to classify, (argument, error) per unusable one
    notices: list[str] = field(default_factory=list)  # one line each: what directories' listings left out


def may_hold_images(args: tuple[str, ...] | list[str], recursive: bool = False) -> bool:
    """Whether the arguments could give expand_inputs an image to classify: a file as given (even a missing one,
    which the loader reports with the others), a glob with a match, a directory with a file named as an image
    (at its top level, or with ``recursive`` anywhere below). Stops at the first one, so that a run can refuse
    inputs that hold no image at all before it loads anything, at the cost of a moment."""
    exts = image_extensions()

    def in_directory(d: str) -> bool:
        subdirs = []
        try:
            with os.scandir(d) as it:
                for e in it:  # a file type is read only for names that could answer
                    named = named_like_image(e.name, exts)
                    if e.name.startswith(".") or not (named or recursive):
                        continue
                    is_dir = is_directory(e)
                    if not is_dir and named:
                        return True
                    if is_dir and recursive and not e.is_symlink():
                        subdirs.append(e.path)
        except OSError:
            return False
        return any(in_directory(sub) for sub in subdirs)

    for arg in args:
        if os.path.isdir(arg):
            if in_directory(arg):
                return True
        elif os.path.exists(arg) or not glob.has_magic(arg):
            return True
        elif any(not os.path.isdir(m) or in_directory(m) for m in glob.iglob(arg, recursive=True)):
            return True
    return False


def no_images_line(args: tuple[str, ...] | list[str], recursive: bool) -> str:
    """What a run says of inputs that hold no image at all: what each argument gave (its listing's words, with what
    its subfolders hold) and the extensions looked for."""
    said = [err for _, err in expand_inputs(args, recursive).items if err is not None][:3]
    exts = sorted(image_extensions())
    return (f"no image files to classify ({'; '.join(said) or ', '.join(args)}); looked for the {len(exts)} "
            f"extensions Pillow reads: {' '.join(exts)}")


def expand_inputs(args: tuple[str, ...] | list[str], recursive: bool = False) -> Inputs:
    """Files as given (a missing one is reported by the image loader with the others), directories' image files,
    and an argument that does not exist tried as a glob."""
    exts = image_extensions()
    out = Inputs([])

    def directory(d: str) -> None:
        listing = list_directory(d, recursive, exts)
        out.items.extend((p, None) for p in listing.files)
        notice = listing.notice()
        if not listing.files:  # the error entry says it all
            out.items.append((d, f"{d}: directory has no image files" + (f" at its top level; {notice}"
                                                                          if notice else "")))
        elif notice:
            out.notices.append(f"{d}: {notice}")
        if listing.not_files:  # the note stays one line: names are escaped, and five at most are listed
            odd = listing.not_files
            more = f" and {len(odd) - 5} more" if len(odd) > 5 else ""
            out.notices.append(f"{d}: skipped {len(odd)} {'entry' if len(odd) == 1 else 'entries'} named like images "
                               f"that are not image files: {'; '.join(odd[:5])}{more}")

    for arg in args:
        if os.path.isdir(arg):
            directory(arg)
        elif os.path.exists(arg) or not glob.has_magic(arg):
            out.items.append((arg, None))
        else:
            matches = sorted(glob.glob(arg, recursive=True))
            for m in matches:
                if os.path.isdir(m):
                    directory(m)
                else:
                    out.items.append((m, None))
            if not matches:
                out.items.append((arg, f"{arg}: no files match this pattern"))
    return out
