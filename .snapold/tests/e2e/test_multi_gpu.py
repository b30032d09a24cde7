"""inception-run --gpus N without Ray (multi_gpu.py), on the cpu backend: N worker processes, the same file as one
process writes, in input order."""

from __future__ import annotations

import contextlib
import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inception_engine.config import EngineConfig
from PIL import Image

from inception_engine import backends, cli, model_files, multi_gpu
from inception_engine import engine as engine_module
from inception_engine.multi_gpu import deal
from inception_engine.weights import load_weight_file, save_weights

from helpers import gpu_workers
from helpers.cli import cpu_notes_stderr, one_line_error, runner
from helpers.random_weights import random_arrays
from helpers.result_lines import assert_same_results, read_rows


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    return save_weights(tmp_path_factory.mktemp("weights") / "small.npz", random_arrays(7),
                        {"count_include_pad": True, "input": {"size": 75, "resize": 86}})


@pytest.fixture
def two_gpus(monkeypatch) -> None:
    """The parent's GPU count check passes as on a two-GPU machine; the spawned workers run the cpu backend."""
    monkeypatch.setattr(backends, "usable_gpus", lambda: 2)


def test_deal_round_robin():
    paths = [str(i) for i in range(11)]
    assert deal(paths, 3, 2) == [["0", "1", "6", "7"], ["2", "3", "8", "9"], ["4", "5", "10"]]
    assert deal(paths[:3], 4, 2) == [["0", "1"], ["2"], [], []]


def one_process_and_two_workers(weights_file: Path, tmp_path: Path, kind: str, suffix: str) -> tuple[Path, Path]:
    """The files one process and two --gpus workers write for 11 photos and an unreadable 05b.jpg."""
    d = tmp_path / "photos"
    d.mkdir()
    rng = np.random.default_rng(2)
    for i in range(11):
        Image.fromarray(rng.integers(0, 256, (90, 100 + 3 * i, 3), dtype=np.uint8)).save(d / f"{i:02d}.jpg")
    (d / "05b.jpg").write_text("not a picture")
    args = [str(d), "--weights", str(weights_file), "--backend", "cpu", "--batch-size", "2", "--top-k", "3",
            "--worker-kind", kind, "--workers", "2"]
    one = runner().invoke(cli.run_cmd, [*args, "--output", str(tmp_path / f"one{suffix}")])
    two = runner().invoke(cli.run_cmd, [*args, "--gpus", "2", "--output", str(tmp_path / f"two{suffix}")])
    assert one.exit_code == two.exit_code == 1, two.output  # 05b.jpg
    return tmp_path / f"one{suffix}", tmp_path / f"two{suffix}"


@pytest.mark.parametrize("kind", ["thread", "process"])  # process: each worker starts decode processes of its own
def test_two_workers_write_what_one_process_writes(weights_file, tmp_path, kind, two_gpus):
    one, two = one_process_and_two_workers(weights_file, tmp_path, kind, ".jsonl")
    rows = read_rows(two)
    assert len(rows) == 12 and rows[6]["image"].endswith("05b.jpg") and "error" in rows[6]
    assert_same_results(read_rows(one), rows)


def test_two_workers_write_the_csv_one_process_writes(weights_file, tmp_path, two_gpus):
    """The workers render each CSV row themselves (output.Rendered): one header, the rows in input order, the
    unreadable file's error in its place, the same classes as one process."""
    import csv

    a, b = (list(csv.reader(f.open(newline=""))) for f in one_process_and_two_workers(weights_file, tmp_path,
                                                                                       "thread", ".csv"))
    assert a[0] == b[0] and b[0][0] == "image" and sum(row == b[0] for row in b) == 1
    assert len(b) == 13 and b[7][0].endswith("05b.jpg") and b[7][1]  # after the header and 00..05
    assert [(r[0], r[1], r[2], r[5]) for r in a] == [(r[0], r[1], r[2], r[5]) for r in b]  # image, error, classes


def test_gpus_zero_without_ray_is_a_one_line_error(tmp_path):
    result = runner().invoke(cli.run_cmd, [str(tmp_path), "--gpus", "0"])
    assert result.exit_code == 2 and result.stderr.strip().startswith("error: --gpus 0 is for --ray")


def noise_jpegs(folder: Path, n: int, seed: int) -> list[str]:
    """n small noise JPEGs, 00.jpg, 01.jpg, ...: their paths."""
    rng, paths = np.random.default_rng(seed), []
    for i in range(n):
        paths.append(str(folder / f"{i:02d}.jpg"))
        Image.fromarray(rng.integers(0, 256, (80, 90, 3), dtype=np.uint8)).save(paths[-1])
    return paths


def test_stopping_early_ends_the_workers(weights_file, tmp_path, two_gpus):
    """A consumer that stops after the first result (an error elsewhere, Ctrl-C): the workers, each with decode
    processes and results it can no longer hand over, are ended within seconds."""
    import multiprocessing
    import time

    from inception_engine.multi_gpu import predict_on_gpus

    paths = noise_jpegs(tmp_path, 48, seed=3)
    stream = predict_on_gpus(paths, 2, 1, EngineConfig(weights_file, "cpu", "auto", 2, 2, "process"))
    assert next(stream).ok
    t0 = time.perf_counter()
    stream.close()
    assert time.perf_counter() - t0 < 25 and multiprocessing.active_children() == []


def test_a_run_read_to_its_last_result_lets_the_workers_leave_by_themselves(weights_file, tmp_path, two_gpus):
    """The caller takes exactly as many results as there are images (never asking past the last): the workers then
    shut their decode processes down and exit with 0, not with the SIGTERM of a run stopped early."""
    from inception_engine.multi_gpu import predict_on_gpus

    paths = noise_jpegs(tmp_path, 10, seed=4)
    stream = predict_on_gpus(paths, 2, 1, EngineConfig(weights_file, "cpu", "auto", 2, 2, "process"))
    got = [next(stream) for _ in paths]
    procs = list(stream.procs)
    stream.close()
    assert [p.image for p in got] == paths and all(p.ok for p in got)
    assert [p.exitcode for p in procs] == [0, 0]


@pytest.fixture
def photos(tmp_path) -> Path:
    d = tmp_path / "photos"
    d.mkdir()
    rng = np.random.default_rng(5)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (80, 90 + 7 * i, 3), dtype=np.uint8)).save(d / f"{i}.jpg")
    return d


@contextlib.contextmanager
def no_hang(seconds: float) -> Iterator[None]:
    """A wait past ``seconds`` fails the test (TimeoutError) instead of stalling the suite."""

    def expire(*_: object) -> None:
        raise TimeoutError(f"still waiting after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def no_engine_in_this_process(monkeypatch) -> None:
    """From here on this process can neither build an Engine nor read a weight file; spawned workers still can."""

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the parent built an Engine or read the weights")

    monkeypatch.setattr(engine_module, "Engine", refuse)
    monkeypatch.setattr(engine_module, "load_weights", refuse)
    monkeypatch.setattr(model_files, "load_weight_file", refuse)


def same_but_probabilities(text: str) -> str:
    """Text results with each probability masked: the cpu backend's come out a few ulp apart in another process
    (result_lines.assert_same_results), which may move the 4th decimal."""
    return re.sub(r"\b\d\.\d{4}\b", "p.pppp", text)


@pytest.mark.parametrize("mode", ["text", "json", "output"])
def test_the_parent_builds_no_engine_and_prints_what_worker_0_ran_with(weights_file, photos, tmp_path, monkeypatch,
                                                                        two_gpus, mode):
    """--gpus 2's parent makes no Engine and reads no weights; the header, the JSON's fields, the fallback note and
    the --output summary's backend and precision are worker 0's, and read as one process's run prints them."""
    if backends.is_available("cuda")[0]:
        pytest.skip("a GPU is usable here: auto runs on it, without the fallback note")
    args = [str(photos), "--weights", str(weights_file), "--batch-size", "1", "--top-k", "2", "--workers", "1",
            "--worker-kind", "thread"]  # --backend auto: the cpu, and its note
    extra = {"text": [], "json": ["--json"], "output": ["--output"]}[mode]

    def run(cache: str, *more: str):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / cache))  # the note is new to each run
        out = [str(tmp_path / f"{cache}.jsonl")] if mode == "output" else []
        return runner().invoke(cli.run_cmd, [*args, *extra, *out, *more])

    one = run("one")
    no_engine_in_this_process(monkeypatch)
    two = run("two", "--gpus", "2")
    model = load_weight_file(weights_file).model_id()
    assert one.exit_code == two.exit_code == 0, two.output
    note = ("note: no usable GPU: running on the CPU (--backend cuda says why)\n"
            + cpu_notes_stderr())  # the NumPy code's note where the machine has no AVX-512F
    assert one.stderr.startswith(note) and two.stderr.startswith(note)
    if mode == "text":
        assert two.stdout.splitlines()[0] == f"# cpu backend, fp32, weights {weights_file}, {model.describe()}"
        assert same_but_probabilities(two.stdout) == same_but_probabilities(one.stdout)
        assert two.stderr == one.stderr == note
    elif mode == "json":
        head = {k: v for k, v in json.loads(two.stdout).items() if k != "results"}
        assert head == {"weights": str(weights_file), "backend": "cpu", "precision": "fp32", "model": model.name,
                        "provenance": {"kind": "unknown", "source_sha256": None}, "complete": True, "done": 3,
                        "inputs": 3}
        assert same_but_probabilities(two.stdout) == same_but_probabilities(one.stdout)
        assert two.stderr == one.stderr == note
    else:
        summary = two.stderr.splitlines()[-1]
        assert re.fullmatch(r"3 images \(0 errors\) in [\d.]+ s on the cpu backend, fp32, \d+ images/s, \d+ images/s "
                            rf"after the first result at [\d.]+ s -> {re.escape(str(tmp_path / 'two.jsonl'))}",
                            summary), summary
        numbers = re.compile(r"\d+(\.\d+)?")
        assert numbers.sub("n", two.stderr.replace("two.jsonl", "one.jsonl")) == numbers.sub("n", one.stderr)
        assert_same_results(read_rows(tmp_path / "one.jsonl"), read_rows(tmp_path / "two.jsonl"))


def test_nothing_to_classify_still_prints_worker_0s_header(weights_file, tmp_path, monkeypatch, two_gpus):
    """Every input an error: no image goes to a worker, but worker 0 still builds its engine and tells the parent
    what it runs with, for the header; the output is one process's."""
    args = [str(tmp_path / "missing.jpg"), "--weights", str(weights_file), "--backend", "cpu"]
    one = runner().invoke(cli.run_cmd, args)
    no_engine_in_this_process(monkeypatch)
    with no_hang(60):
        two = runner().invoke(cli.run_cmd, [*args, "--gpus", "2"])
    assert one.exit_code == two.exit_code == 1  # the missing file
    model = load_weight_file(weights_file).model_id()
    assert two.stdout == one.stdout and two.stdout.startswith(f"# cpu backend, fp32, weights {weights_file}, "
                                                              f"{model.describe()}\n")
    assert two.stderr == one.stderr


@pytest.mark.parametrize("args,line", [
    (["--backend", "cpu", "--precision", "fp16"], "--precision fp16: the cpu backend computes in fp32 only; give "
                                                  "fp32, or auto"),
    (["--backend", "cpu", "--decode", "gpu"], "--decode gpu: needs the cuda backend; this engine runs on cpu"),
    (["--weights", "{tmp}/nope.npz"], "--weights {tmp}/nope.npz: no such file (inception-convert-weights makes one "
                                      "from torchvision's ONNX export)"),
])
def test_arguments_engine_refuses_are_refused_before_any_worker_starts(weights_file, photos, tmp_path, monkeypatch,
                                                                       two_gpus, args, line):
    """The parent checks what Engine checks (its EngineConfig, config.resolve) without building one: the same line
    as one process's run, exit code 2, and no worker started."""
    args = [str(photos), "--weights", str(weights_file), *[a.format(tmp=tmp_path) for a in args]]
    one = runner().invoke(cli.run_cmd, args)

    def no_workers(*_: object) -> None:
        raise AssertionError("a worker was started")

    no_engine_in_this_process(monkeypatch)
    monkeypatch.setattr(multi_gpu.multiprocessing, "get_context", no_workers)
    two = runner().invoke(cli.run_cmd, [*args, "--gpus", "2"])
    assert one.exit_code == two.exit_code == 2 and two.stdout == ""
    assert one_line_error(two) == one_line_error(one) == "error: " + line.format(tmp=tmp_path)


def test_weights_that_cannot_be_read_are_worker_0s_one_line(photos, tmp_path, monkeypatch, two_gpus):
    """A weight file that is there but is no weight file passes the parent's checks (it reads none); worker 0's
    engine refuses it, and that is the one line, exit code 2, nothing on stdout."""
    bad = tmp_path / "w.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    no_engine_in_this_process(monkeypatch)
    with no_hang(60):
        r = runner().invoke(cli.run_cmd, [str(photos), "--weights", str(bad), "--backend", "cpu", "--gpus", "2"])
    assert r.exit_code == 2 and r.stdout == ""
    assert one_line_error(r).startswith(f"error: GPU 0: {bad}: ")


def test_notes_a_worker_takes_mid_run_reach_the_parent_once(weights_file, photos, monkeypatch, two_gpus):
    """Both workers' engines take the same note as their runs start: the parent prints it once, on stderr, and the
    results are the usual ones."""
    monkeypatch.setattr(multi_gpu, "_worker", gpu_workers.notes_mid_run)
    for i in range(3, 10):  # both workers get images
        (photos / f"{i}.jpg").write_bytes((photos / "0.jpg").read_bytes())
    with no_hang(120):
        r = runner().invoke(cli.run_cmd, [str(photos), "--weights", str(weights_file), "--backend", "cpu",
                                          "--gpus", "2", "--batch-size", "2"])
    assert r.exit_code == 0, r.stderr
    assert r.stderr.count("note: this engine took a note mid-run\n") == 1
    assert len([line for line in r.stdout.splitlines() if line.startswith(str(photos))]) == 10


def test_a_worker_that_dies_before_its_facts_is_one_line(weights_file, photos, monkeypatch, two_gpus):
    """Worker 0 dies before its engine's facts come: one line, exit code 2, no output, no hang."""
    monkeypatch.setattr(multi_gpu, "_worker", gpu_workers.dies_at_once)
    with no_hang(60):
        r = runner().invoke(cli.run_cmd, [str(photos), "--weights", str(weights_file), "--backend", "cpu",
                                          "--gpus", "2"])
    assert r.exit_code == 2 and r.stdout == ""
    assert one_line_error(r) == "error: the worker for GPU 0 died (exit code 3)"


def test_ctrl_c_while_worker_0_starts_is_one_line_and_ends_the_workers(weights_file, photos, tmp_path, monkeypatch,
                                                                        two_gpus):
    """Ctrl-C while the parent waits for worker 0's engine (kernels may be compiling): the line and exit code 130
    that Ctrl-C gives mid-run, nothing on stdout, and the workers ended."""
    import multiprocessing

    def ctrl_c(self) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(multi_gpu.GpuRun, "facts", ctrl_c)
    out = tmp_path / "labels.jsonl"
    with no_hang(60):
        r = runner().invoke(cli.run_cmd, [str(photos), "--weights", str(weights_file), "--backend", "cpu", "--gpus",
                                          "2", "--output", str(out)])
    assert r.exit_code == 130 and r.stdout == ""
    assert r.stderr == "interrupted after 0 of 3 images\n" and not out.exists()  # no file named that was never made
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("gpus", [1, 2])
def test_start_up_begins_before_the_inputs_are_listed(weights_file, photos, monkeypatch, gpus, two_gpus):
    """Listing a large folder overlaps the start-up: when inception-run lists its inputs, one process has its
    engine made already, and --gpus 2 has both workers started."""
    import multiprocessing

    seen: dict[str, int] = {}
    made = []
    engine_start = engine_module.Engine._start

    def making(self, *a, **k):
        made.append(1)
        engine_start(self, *a, **k)

    def listing(images, recursive=False):
        seen["engines"], seen["workers"] = len(made), len(multiprocessing.active_children())
        return list_inputs(images, recursive)

    list_inputs = cli.expand_inputs
    monkeypatch.setattr(engine_module.Engine, "_start", making)
    monkeypatch.setattr(cli, "expand_inputs", listing)
    with no_hang(120):
        r = runner().invoke(cli.run_cmd, [str(photos), "--weights", str(weights_file), "--backend", "cpu",
                                          "--gpus", str(gpus)])
    assert r.exit_code == 0, r.stderr
    assert seen == ({"engines": 1, "workers": 0} if gpus == 1 else {"engines": 0, "workers": 2})


class RecordingContext:
    """multiprocessing's spawn context as start_on_gpus uses it, starting nothing: each Process's arguments kept."""

    def __init__(self) -> None:
        import multiprocessing

        self.real, self.started = multiprocessing.get_context("spawn"), []

    def Queue(self):  # noqa: N802  # multiprocessing's name
        return self.real.Queue()

    def Process(self, target, args):  # noqa: N802
        started = self.started

        class Recorded:
            exitcode = 0

            def start(self) -> None:
                started.append(args)

            def is_alive(self) -> bool:
                return False

            def join(self, timeout=None) -> None:
                pass

        return Recorded()


def test_an_onnx_export_is_converted_once_by_the_parent_not_by_each_worker(synthetic_onnx, tmp_path, monkeypatch,
                                                                           two_gpus, capfd):
    """--weights model.onnx with --gpus 2: the parent converts it (one note) before the workers start, and gives them
    the converted weight file; the next run finds it converted and says nothing."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for run in range(2):
        ctx = RecordingContext()
        monkeypatch.setattr(multi_gpu.multiprocessing, "get_context", lambda kind, ctx=ctx: ctx)
        config = EngineConfig(synthetic_onnx(), "cpu", "auto", 2, 1, "thread")
        gpu_run = multi_gpu.start_on_gpus(2, 1, config)
        gpu_run.close()
        given = {args[2].weights for args in ctx.started}
        assert len(ctx.started) == 2 and len(given) == 1
        (weights,) = given
        assert weights.suffix == ".npz" and weights.parent == tmp_path / "cache" / "inception-engine" / "converted"
        notes = [line for line in capfd.readouterr().err.splitlines() if "converted" in line]
        assert len(notes) == (1 if run == 0 else 0), notes
