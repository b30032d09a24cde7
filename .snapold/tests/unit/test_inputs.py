"""ingest/inputs.py: which image files a directory gives with and without --recursive, and the count of what it left
out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inception_engine.ingest import inputs
from inception_engine.ingest.inputs import expand_inputs, list_directory


def touch(root: Path, *names: str) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")


def test_top_level_recursive_hidden_and_the_count_of_what_was_left_out(tmp_path):
    touch(tmp_path, "b.jpg", "A.PNG", "notes.txt", ".hid.jpg", "s/c.jpg", "s/t/d.webp", "s/e.txt", ".h/f.jpg",
          "s/.g/h.jpg")
    top = list_directory(tmp_path, recursive=False)
    assert top.files == [str(tmp_path / "A.PNG"), str(tmp_path / "b.jpg")]
    assert (top.skipped, top.notice()) == (2, "2 images in subfolders not searched (--recursive searches them)")
    every = list_directory(tmp_path, recursive=True)
    assert every.files == [str(tmp_path / n) for n in ("A.PNG", "b.jpg", "s/c.jpg", "s/t/d.webp")]
    assert every.notice() is None
    assert list_directory(tmp_path / "s" / "t", recursive=False).notice() is None


def test_counting_what_was_left_out_stops_early_in_a_large_tree(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "SKIP_COUNT_DIRS", 3)
    touch(tmp_path, "top.jpg", *(f"d{i}/x.jpg" for i in range(6)))
    listing = list_directory(tmp_path, recursive=False)
    assert listing.files == [str(tmp_path / "top.jpg")]
    assert listing.notice() == "3+ images in subfolders not searched (--recursive searches them)"
    touch(tmp_path / "one", "only/x.jpg")
    assert list_directory(tmp_path / "one", recursive=False).notice() == (
        "1 image in subfolders not searched (--recursive searches them)")


def test_globs_and_directories_give_the_same_listing(tmp_path):
    touch(tmp_path, "p/a.jpg", "p/sub/b.jpg", "q/c.png")
    got = expand_inputs([str(tmp_path / "*"), str(tmp_path / "missing*.jpg")])
    assert got.items == [(str(tmp_path / "p" / "a.jpg"), None), (str(tmp_path / "q" / "c.png"), None),
                         (str(tmp_path / "missing*.jpg"), f"{tmp_path / 'missing*.jpg'}: no files match this "
                                                          f"pattern")]
    assert got.notices == [f"{tmp_path / 'p'}: 1 image in subfolders not searched (--recursive searches them)"]
    assert [p for p, _ in expand_inputs([str(tmp_path / "*")], recursive=True).items] == [
        str(tmp_path / n) for n in ("p/a.jpg", "p/sub/b.jpg", "q/c.png")]


@pytest.mark.parametrize("spelling", ["plain", "trailing slash", "double slash", "dot slash", "cwd"])
def test_a_listing_is_in_path_order_and_spells_paths_as_path_does(tmp_path, monkeypatch, spelling):
    """Names that sort differently as strings and as paths ("a-c.jpg" before "a/b.jpg" as strings, after it as
    paths), and the directory written in several ways: the files as str(Path(dir) / name), sorted as Paths."""
    names = ["a/b.jpg", "a-c.jpg", "a.jpg", "a/a-b.jpg", "a b/x.jpg", "A.jpg", "_.jpg", "a.b/c.jpg", "\u00e9.jpg",
             "z/0.jpg", "a/b/c.jpg", "a0.jpg"]
    for n in names:
        (tmp_path / n).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / n).write_bytes(b"x")
    monkeypatch.chdir(tmp_path.parent)
    top = {"plain": str(tmp_path), "trailing slash": f"{tmp_path}/", "double slash": f"{tmp_path}//",
           "dot slash": f"./{tmp_path.name}", "cwd": "."}[spelling]
    if spelling == "cwd":
        monkeypatch.chdir(tmp_path)
    want = [str(p) for p in sorted(Path(top, n) for n in names)]
    assert list_directory(top, recursive=True).files == want


def test_links_and_entries_named_like_images(tmp_path):
    """A link to an image is an image; a link to a directory is listed, never walked into (as os.walk does); a
    directory or a dangling link named like an image is said, not classified; may_hold_images agrees with the
    listing."""
    from inception_engine.ingest.inputs import expand_inputs, list_directory, may_hold_images

    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "deep.png").write_bytes(b"x")
    top = tmp_path / "top"
    top.mkdir()
    (top / "a.jpg").write_bytes(b"x")
    (top / "b.jpg").symlink_to(real / "sub" / "deep.png")
    (top / "dir.jpg").mkdir()
    (top / "gone.jpg").symlink_to(tmp_path / "nothing.jpg")
    (top / "linked").symlink_to(real, target_is_directory=True)
    listing = list_directory(top, recursive=True)
    assert listing.files == [str(top / "a.jpg"), str(top / "b.jpg")]
    said = sorted(listing.not_files)
    assert said[0] == "dir.jpg: is a directory, not an image"
    assert said[1].startswith("gone.jpg: dangling symbolic link (its target ") and len(said) == 2
    assert listing.skipped == 0
    only_sub = tmp_path / "only_sub"
    (only_sub / "inner").mkdir(parents=True)
    (only_sub / "inner" / "x.png").write_bytes(b"x")
    (only_sub / "d.jpg").mkdir()
    assert not may_hold_images([str(only_sub)]) and may_hold_images([str(only_sub)], recursive=True)
    assert list_directory(only_sub, recursive=False).skipped == 1
    only_link = tmp_path / "only_link"
    only_link.mkdir()
    (only_link / "linked").symlink_to(real, target_is_directory=True)
    assert not may_hold_images([str(only_link)], recursive=True)  # links to directories are not followed
    assert expand_inputs([str(only_link)], recursive=True).items[0][1].endswith("directory has no image files")


def fresh_extensions(monkeypatch, cache: Path) -> frozenset[str]:
    from inception_engine.ingest import entries

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    entries.pillow_extensions.cache_clear()
    try:
        return entries.image_extensions()
    finally:
        entries.pillow_extensions.cache_clear()


def test_image_extensions_are_kept_per_pillow_version_and_a_later_process_skips_the_plugins(tmp_path, monkeypatch):
    """The first lookup imports Pillow's plugins and writes the set beside the other caches; a fresh process then
    reads it without importing them (Image.init: ~50 ms of the client's start) and gets the same set. A file that is
    no list of extensions, or a cache that cannot be written, is never trusted or fatal."""
    from PIL import Image

    Image.init()
    want = frozenset(e.lower() for e in Image.registered_extensions())
    got = fresh_extensions(monkeypatch, tmp_path)
    assert got >= want and {".jpg", ".png", ".webp"} <= got
    (written,) = (tmp_path / "inception-engine").glob("pillow-*-extensions.txt")
    assert frozenset(written.read_text().split()) == want
    probe = ("import sys; from inception_engine.ingest.entries import image_extensions as e; x = e(); "
             "print(' '.join(sorted(x))); print('PIL.TiffImagePlugin' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)}).stdout.splitlines()
    assert (frozenset(out[0].split()), out[1]) == (want, "False")

    written.write_text("garbage\n")
    assert fresh_extensions(monkeypatch, tmp_path) == got
    assert frozenset(written.read_text().split()) == want  # rewritten
    blocked = tmp_path / "file"
    blocked.write_text("")  # XDG_CACHE_HOME a file: no folder can be made under it
    assert fresh_extensions(monkeypatch, blocked) == got


@pytest.mark.parametrize("name", ["a.jpg", "A.JPG", "a..jpg", "a.b.png", "..a.jpg", ".jpg", "..jpg", "x", "x.",
                                  "a.jpeg.txt", "jpg", "."])
def test_named_like_image_takes_the_extension_as_splitext_does(name):
    exts = {".jpg", ".png"}
    assert inputs.named_like_image(name, exts) == (os.path.splitext(name)[1].lower() in exts)
