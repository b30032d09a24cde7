"""A folder of hostile images, generated from a seed, through inception-run in a subprocess: every bad item gets one
line saying what it is, the exit code is 1, every good image is classified, and the results read back the same in
JSONL, CSV, --json and text, file names that are not UTF-8 included; --resume retries the failed ones only."""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine.weights import save_weights

from helpers.fuzz import csv_rows, jsonl_rows, run_cli, stderr_lines, summary
from helpers.random_weights import random_arrays


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """75 x 75 inputs keep the CPU forwards quick."""
    return save_weights(tmp_path_factory.mktemp("w") / "w.npz", random_arrays(11),
                        {"count_include_pad": True, "input": {"size": 75, "resize": 86}})


def fs_name(raw: bytes) -> str:
    return os.fsdecode(raw)


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def declaring(png: bytes, w: int, h: int) -> bytes:
    """The PNG with its header's size changed (CRC made good): a decompression bomb's first bytes."""
    data = bytearray(png)
    data[16:24] = struct.pack(">II", w, h)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def hostile_folder(root: Path, seed: int) -> tuple[Path, list[Path], dict[Path, str], dict[str, str], list[str],
                                                   list[Path]]:
    """(folder, good images, {bad file: words its error must hold}, {skipped entry name: words}, explicit args,
    mutants: good files with a few random bytes changed).
    The folder holds good images of many kinds and bad files; odd entries (a loop, a FIFO, a dangling link, a
    directory named like an image) are in the folder (skipped there) and named as arguments too (errors then)."""
    rng = np.random.default_rng(seed)
    d = root / f"photos{seed}"
    d.mkdir()

    def noise(h: int, w: int, c: int = 3) -> np.ndarray:
        return rng.integers(0, 256, (h, w, c) if c > 1 else (h, w), dtype=np.uint8)

    def size() -> tuple[int, int]:
        return int(rng.integers(20, 400)), int(rng.integers(20, 400))

    good: list[Path] = []

    def keep(name: str) -> Path:
        good.append(d / name)
        return d / name

    Image.fromarray(noise(*size())).save(keep("rgb.jpg"), quality=int(rng.integers(30, 95)))
    Image.fromarray(noise(*size(), 4), "CMYK").save(keep("cmyk.jpg"))
    Image.fromarray(rng.integers(0, 65536, size(), dtype=np.uint16)).save(keep("grey16.png"))
    pal = Image.fromarray(noise(*size())).convert("P")
    pal.info["transparency"] = int(rng.integers(0, 256))
    pal.save(keep("palette.png"), transparency=pal.info["transparency"])
    frames = [Image.fromarray(noise(60, 80)).convert("P") for _ in range(3)]
    frames[0].save(keep("animated.gif"), save_all=True, append_images=frames[1:], duration=50, loop=0)
    Image.fromarray(noise(*size(), 2), "LA").save(keep("grey_alpha.png"))
    long = int(rng.integers(3000, 30000))
    Image.fromarray(noise(1, long) if rng.random() < 0.5 else noise(long, 1)).save(keep("extreme.png"))
    raw = b"good_" + bytes(rng.integers(0x80, 0x100, 3, dtype=np.uint8)) + b".png"  # not UTF-8
    Image.fromarray(noise(*size())).save(keep(fs_name(raw)))

    base = png_bytes(Image.fromarray(noise(120, 130)))
    bad = {d / "empty.jpg": "empty file", d / "random.jpg": "not an image",
           d / "truncated.png": "corrupt or truncated image data",
           d / "bomb.png": "refused", d / fs_name(b"broken_\xff\xfe.jpg"): "not an image"}
    (d / "empty.jpg").write_bytes(b"")
    (d / "random.jpg").write_bytes(bytes(rng.integers(0, 256, int(rng.integers(1, 4000)), dtype=np.uint8)))
    (d / "truncated.png").write_bytes(base[:int(rng.integers(120, len(base) - 20))])
    (d / "bomb.png").write_bytes(declaring(base, 1 << 15, 1 << 15))
    (d / fs_name(b"broken_\xff\xfe.jpg")).write_bytes(b"GIF89a" + bytes(rng.integers(0, 256, 50, dtype=np.uint8)))

    mutants = []  # valid files with random bytes changed: classified or one error line, whichever they decode to
    jpeg = io.BytesIO()
    Image.fromarray(noise(90, 110)).save(jpeg, "JPEG")
    for i, src in enumerate([jpeg.getvalue(), base] * 3):
        data = bytearray(src)
        for _ in range(int(rng.integers(1, 8))):
            data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        mutants.append(d / f"mutant{i}.{'jpg' if i % 2 == 0 else 'png'}")
        mutants[-1].write_bytes(bytes(data))

    odd = root / f"odd{seed}"
    odd.mkdir()
    skipped = {"loop.jpg": "symbolic link loop", "dangling.jpg": "dangling symbolic link",
               "fifo.jpg": "is a FIFO (named pipe)", "dir.jpg": "is a directory"}
    for where in (d, odd):
        (where / "loop.jpg").symlink_to(where / "loop.jpg")
        (where / "dangling.jpg").symlink_to(where / "gone.jpg")
        os.mkfifo(where / "fifo.jpg")
        (where / "dir.jpg").mkdir()
    bad.update({odd / "loop.jpg": "symbolic link loop", odd / "dangling.jpg": "dangling symbolic link",
                odd / "fifo.jpg": "is a FIFO (named pipe), not an image file",
                odd / "dir.jpg": "directory has no image files"})
    explicit = [str(odd / name) for name in ("loop.jpg", "dangling.jpg", "fifo.jpg", "dir.jpg")]
    return d, good, bad, skipped, explicit, mutants


def check_results(rows: list[dict], good: list[Path], bad: dict[Path, str], mutants: list[Path], top_k: int) -> None:
    """Each input once; good ones classified (top_k entries), bad ones one error line naming the file and why,
    mutants either."""
    by_image = {r["image"]: r for r in rows}
    assert len(by_image) == len(rows) == len(good) + len(bad) + len(mutants)
    for p in mutants:
        r = by_image[str(p)]
        assert len(r.get("top", [])) == top_k if "error" not in r else r["error"].startswith(f"{p}: "), r
    for p in good:
        r = by_image[str(p)]
        assert "error" not in r and len(r["top"]) == top_k, r
    for p, words in bad.items():
        error = by_image[str(p)]["error"]
        assert error.startswith(str(p)) and words in error and "\n" not in error, (p, error)


def check_stderr(lines: list[str], skipped: dict[str, str], folder: Path, failed: int, total: int) -> None:
    """One note naming every skipped entry of the folder, the count of failures, nothing else unexpected."""
    notes = [line for line in lines if line.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith(f"note: {folder}: skipped {len(skipped)} entries")
    for name, words in skipped.items():
        assert f"{name}: {words}" in notes[0]
    assert lines[-1] == f"error: {failed} of {total} inputs could not be classified"


@pytest.mark.parametrize("seed,kind,formats", [(0, "thread", ("jsonl", "csv", "json", "text")),
                                               (1, "process", ("jsonl",))])
def test_hostile_folder_in_every_output_format(tmp_path, weights, seed, kind, formats):
    folder, good, bad, skipped, explicit, mutants = hostile_folder(tmp_path, seed)
    args = [str(folder), *explicit, "--worker-kind", kind, "--workers", "2"]
    total = len(good) + len(bad) + len(mutants)

    jsonl = tmp_path / "r.jsonl"
    r = run_cli([*args, "--output", str(jsonl)], weights)
    assert r.returncode == 1 and r.stdout == b""
    lines = stderr_lines(r)
    rows = jsonl_rows(jsonl)
    failed = sum("error" in r for r in rows)
    check_stderr(lines, skipped, folder, failed, total)
    assert len(lines) == 3  # the note, the summary, the count of failures
    check_results(rows, good, bad, mutants, 3)
    files = [(jsonl, jsonl_rows)]

    if "csv" in formats:
        csv_path = tmp_path / "r.csv"
        r = run_cli([*args, "--output", str(csv_path)], weights)
        assert r.returncode == 1
        assert summary(csv_rows(csv_path)) == summary(rows)
        files.append((csv_path, csv_rows))

    if "json" in formats:
        r = run_cli([*args, "--json"], weights)
        assert r.returncode == 1
        assert summary(json.loads(r.stdout)["results"]) == summary(rows)
        check_stderr(stderr_lines(r), skipped, folder, failed, total)

    if "text" in formats:
        r = run_cli(args, weights)
        assert r.returncode == 1
        for row in rows:  # the text names every image by its bytes, then its classes or its error
            assert os.fsencode(row["image"]) + b"\n" in r.stdout
            if "error" in row:
                assert b"  error: " + os.fsencode(row["error"]) + b"\n" in r.stdout

    for path, read in files:  # every name read back by --resume: only the failures run again
        r = run_cli([*args, "--output", str(path), "--resume"], weights)
        assert r.returncode == 1
        resume = [line for line in stderr_lines(r) if line.startswith("resume: ")]
        expected = f"resume: {total - failed} of {total} images are in {path} already; {failed} that failed run again"
        assert resume == [expected]
        assert sorted(summary(read(path))) == sorted(summary(rows))  # one line per image still
