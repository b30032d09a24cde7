"""Result files under attack, from seeds: damaged files given to --resume (each damaged line's image is done again,
one line per image after), a second writer of the same file, targets that are not regular files, and runs killed
with SIGKILL then resumed (no process, shared memory or semaphore left; the file completes)."""

from __future__ import annotations

import contextlib
import csv
import fcntl
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine.output import csv_bytes, read_lines
from inception_engine.weights import save_weights

from helpers.fuzz import ROOT, csv_rows, jsonl_rows, run_cli, start_cli, stderr_lines, summary
from helpers.random_weights import random_arrays

TOP_K = 3


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    return save_weights(tmp_path_factory.mktemp("w") / "w.npz", random_arrays(12),
                        {"count_include_pad": True, "input": {"size": 75, "resize": 86}})


def write_photos(d: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (int(rng.integers(40, 120)), int(rng.integers(40, 120)), 3),
                                     dtype=np.uint8)).save(d / f"p{i:03d}.jpg")
    return d


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return write_photos(tmp_path_factory.mktemp("photos"), 10, 5)


@pytest.fixture(scope="module")
def clean(tmp_path_factory, weights, photos) -> dict[str, Path]:
    """A whole result file of the photos in each format."""
    d = tmp_path_factory.mktemp("clean")
    out = {}
    for fmt in ("jsonl", "csv"):
        out[fmt] = d / f"r.{fmt}"
        r = run_cli([str(photos), "--output", str(out[fmt])], weights)
        assert r.returncode == 0, r.stderr
    return out


READERS = {"jsonl": jsonl_rows, "csv": csv_rows}


# ------------------------------------------------------------------------------------------- damaged files


def damage_line(line: bytes, kind: str, fmt: str, rng: np.random.Generator) -> bytes:
    """One result line made invalid in the way ``kind`` says (newline kept)."""
    body = line[:-1]
    if kind == "nul":
        at = int(rng.integers(1, len(body)))
        return body[:at] + b"\x00GARBAGE" + body[at:] + b"\n"
    if fmt == "jsonl":
        obj = json.loads(body)
        if kind == "label":
            obj["top"][int(rng.integers(0, TOP_K))]["label"] = "not a class"
        elif kind == "prob":
            obj["top"][0]["prob"] = 1.5
        elif kind == "top_k":
            obj["top"] = obj["top"][:-1]
        return json.dumps(obj).encode() + b"\n"
    row = next(csv.reader([body.decode()]))
    if kind == "label":
        row[3 + 3 * int(rng.integers(0, TOP_K))] = "not a class"
    elif kind == "prob":
        row[4] = "1.5"
    elif kind == "top_k":
        row = row[:-3]
    return csv_bytes([row])


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
@pytest.mark.parametrize("seed", range(3))
def test_a_damaged_file_is_resumed_to_one_valid_line_per_image(tmp_path, weights, photos, clean, fmt, seed):
    rng = np.random.default_rng(seed)
    data = clean[fmt].read_bytes()
    lines = data.splitlines(keepends=True)
    header, lines = (lines[:1], lines[1:]) if fmt == "csv" else ([], lines)
    images = [r["image"] for r in READERS[fmt](clean[fmt])]
    kinds = list(rng.choice(["nul", "label", "prob", "top_k"], size=int(rng.integers(1, 4)), replace=False))
    targets = rng.choice(len(lines) - 1, size=len(kinds), replace=False)  # not the last line: it may be torn
    redo = set()
    for kind, t in zip(kinds, targets):
        lines[t] = damage_line(lines[t], kind, fmt, rng)
        redo.add(images[t])
    damaged, duplicates = len(kinds), 0
    for _ in range(int(rng.integers(0, 3))):  # copies of whole lines, anywhere: the later one wins, same content
        i = int(rng.choice([i for i in range(len(lines) - 1) if images[i] not in redo]))
        lines.insert(int(rng.integers(i + 1, len(lines))), lines[i])
        images.insert(lines.index(lines[i]) + 1, images[i])
        duplicates += 1
    if rng.random() < 0.5:  # a line of junk
        lines.insert(int(rng.integers(0, len(lines))), bytes(rng.integers(32, 127, 40, dtype=np.uint8)) + b"\n")
        damaged += 1
    if rng.random() < 0.5:  # the last line torn by a crash
        lines[-1] = lines[-1][:int(rng.integers(1, len(lines[-1]) - 1))]
        redo.add(READERS[fmt](clean[fmt])[-1]["image"])
        damaged += 1
    out = tmp_path / f"r.{fmt}"
    out.write_bytes(b"".join(header + lines))

    r = run_cli([str(photos), "--output", str(out), "--resume"], weights)
    assert r.returncode == 0, r.stderr
    resume = [line for line in stderr_lines(r) if line.startswith("resume: ")]
    expected = (f"resume: {10 - len(redo)} of 10 images are in {out} already; {damaged} damaged "
                f"line{'s' if damaged > 1 else ''} dropped (their images run again)")
    if duplicates:
        expected += f"; {duplicates} duplicate line{'s' if duplicates > 1 else ''} dropped (an image's last line is " \
                    "kept)"
    assert resume == [expected], kinds
    after = read_lines(out.read_bytes(), fmt, out)
    assert after.damaged == after.duplicates == 0 and len(after.records) == 10 == len(after.done)
    assert sorted(summary(READERS[fmt](out))) == sorted(summary(READERS[fmt](clean[fmt])))


# ------------------------------------------------------------------------------------- writers and targets


def test_a_second_writer_is_refused_and_the_file_left_alone(tmp_path, weights, photos, clean):
    out = tmp_path / "r.jsonl"
    shutil.copy(clean["jsonl"], out)
    before = out.read_bytes()
    with open(out, "ab") as held:  # another run holds the file
        fcntl.flock(held, fcntl.LOCK_EX)
        r = run_cli([str(photos), "--output", str(out), "--resume"], weights)
    assert r.returncode == 2 and out.read_bytes() == before
    expected = f"error: {out}: another inception-run is writing it; wait for that run to end, or choose another file"
    assert stderr_lines(r) == [expected]


def test_two_runs_on_one_new_file_write_each_image_once(tmp_path, weights, photos):
    out = tmp_path / "r.csv"
    args = [sys.executable, "-c", "from inception_engine.cli import run_main; run_main()", str(photos), "--output",
            str(out), "--weights", str(weights), "--backend", "cpu", "--top-k", str(TOP_K)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    runs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read().decode()) for p in runs]
    assert sorted(code for code, _ in results) == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert refused.count("\n") == 1 and ("another inception-run is writing it" in refused
                                         or "exists; pass --resume" in refused), refused
    rows = csv_rows(out)
    assert sorted(r["image"] for r in rows) == sorted(str(p) for p in photos.iterdir())


def test_targets_that_are_not_regular_files_are_refused(tmp_path, weights, photos):
    (tmp_path / "fifo.jsonl").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "fifo.jsonl")
    (tmp_path / "dir.csv").mkdir()
    (tmp_path / "null.jsonl").symlink_to("/dev/null")
    before = sorted(os.listdir(tmp_path))
    for name, words in [("fifo.jsonl", "is a FIFO (named pipe)"), ("dir.csv", "is a directory"),
                        ("null.jsonl", "is a character device")]:
        for resume in ([], ["--resume"]):
            r = run_cli([str(photos), "--output", str(tmp_path / name), *resume], weights)
            assert r.returncode == 2
            expected = f"error: {tmp_path / name}: {words}, not a regular file; --output takes a file name"
            assert stderr_lines(r) == [expected]
    r = run_cli([str(photos), "--output", str(tmp_path / "new.csv")], tmp_path / "missing.npz")
    assert r.returncode == 2 and len(stderr_lines(r)) == 1
    assert sorted(os.listdir(tmp_path)) == before  # nothing created, not even an empty file or a header


# ------------------------------------------------------------------------------------------- kill and resume


def marked(marker: str) -> list[int]:
    """Processes whose environment holds the marker: the run and everything it started."""
    pids = []
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(path, "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(path.split("/")[2]))
        except OSError:  # gone, or not ours to read
            pass
    return pids


KILL_PHOTOS = 96


def dev_shm(since: float, until: float) -> set[str]:
    """Names in /dev/shm made between two moments (time.time()) that no live process maps or holds open: what a
    dead run in that window left. (Other tests' processes, running meanwhile on other xdist workers, make and hold
    their own, multiprocessing's semaphores among them, until they end.)"""
    found = {}
    for entry in os.scandir("/dev/shm") if os.path.isdir("/dev/shm") else []:
        with contextlib.suppress(FileNotFoundError):
            st = entry.stat()
            if since <= st.st_ctime <= until:
                found[entry.name] = st.st_ino
    used = shm_inodes_in_use() if found else set()
    return {name for name, ino in found.items() if ino not in used}


def shm_inodes_in_use() -> set[int]:
    """Inodes of /dev/shm files that a live process maps (/proc/PID/maps: by inode, since a POSIX semaphore is
    mapped under the temporary name it was made with before its link to the final one) or has open."""
    used = set()
    for pid in (d for d in os.listdir("/proc") if d.isdigit()):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                used.update(int(line.split()[4]) for line in f if " /dev/shm/" in line)
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                        used.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
    return used


@pytest.mark.parametrize("seed", range(2))
def test_sigkill_leaves_nothing_behind_and_resume_completes(tmp_path_factory, weights, seed):
    rng = np.random.default_rng(seed)
    # enough photos that the run is still going after its first results and the random wait (24 finished within it
    # on an idle machine)
    photos = write_photos(tmp_path_factory.mktemp("kill"), KILL_PHOTOS, 100 + seed)
    out = photos.parent / f"kill{seed}.{['jsonl', 'csv'][seed % 2]}"
    marker = f"INCEPTION_FUZZ_KILL_{os.getpid()}_{seed}"
    started = time.time()
    run = start_cli([str(photos), "--output", str(out), "--worker-kind", "process", "--workers", "2"], weights,
                    {marker: "1"})
    deadline = time.monotonic() + 90
    while not (out.exists() and out.stat().st_size > 0) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(float(rng.uniform(0, 0.5)))
    os.kill(run.pid, signal.SIGKILL)
    killed = time.time()
    try:
        run.communicate(timeout=15)  # its pipes close: nothing it started still holds them
        pipes_closed = True
    except subprocess.TimeoutExpired:
        pipes_closed = False
    deadline = time.monotonic() + 10
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = marked(marker)
    for pid in left:  # not to leave them running past a failed test
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert left == [] and pipes_closed, "processes of the killed run are still alive"
    assert run.wait() == -signal.SIGKILL  # killed mid-run, not finished already
    deadline = time.monotonic() + 5
    while dev_shm(started, killed) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert dev_shm(started, killed) == set()

    r = run_cli([str(photos), "--output", str(out), "--resume"], weights)
    assert r.returncode == 0, r.stderr
    fmt = out.suffix[1:]
    after = read_lines(out.read_bytes(), fmt, out)
    assert after.damaged == after.duplicates == 0 and len(after.done) == KILL_PHOTOS
    assert sorted(row["image"] for row in READERS[fmt](out)) == sorted(str(p) for p in photos.iterdir())


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("mode", [[], ["--json"]])
def test_standard_output_that_takes_nothing_is_one_line(weights, photos, mode):
    """Results printed into a full disk (/dev/full): one line and exit 2, not a traceback."""
    with open("/dev/full", "wb") as full:
        r = subprocess.run([sys.executable, "-c", "from inception_engine.cli import run_main; run_main()", str(photos),
                            *mode, "--weights", str(weights), "--backend", "cpu"], stdout=full,
                           stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=False)
    assert r.returncode == 2
    expected = "error: cannot write the results to standard output (No space left on device); write them to a file " \
               "with --output"
    assert r.stderr.decode().splitlines() == [expected]
