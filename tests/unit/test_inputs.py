"""inputs.py: which image files a directory gives with and without --recursive, and the count of what it left out."""

from __future__ import annotations

from pathlib import Path

from inception_engine import inputs
from inception_engine.inputs import expand_inputs, list_directory


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
