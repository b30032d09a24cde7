"""dev/bench_folder.py's speed-up limit: what --gpus N can gain on one GPU's run with the decoders measured beside
it (their start side by side, their rate together). The figure docs/PERFORMANCE.md holds the runs to."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench_folder(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "dev"))
    import bench_folder

    return bench_folder


def decoders(starts: dict[int, float], rates: dict[int, float]) -> dict[int, dict]:
    return {g: {"start_s": [starts[g]] * g, "total_rate": rates[g]} for g in starts}


def test_one_gpu_is_its_own_limit(bench_folder):
    one = {"wall_s": 7.0, "steady": 20000}
    assert bench_folder.speedup_limit(one, decoders({1: 2.0}, {1: 25000}), 1, 65536) == 1.0


def test_decoders_that_neither_slow_nor_start_later_leave_only_the_streaming_to_share(bench_folder):
    one = {"wall_s": 6.0, "steady": 16384}  # 4 s of streaming, 2 s of the rest
    at_once = decoders({1: 2.0, 4: 2.0}, {1: 20000, 4: 80000})
    assert bench_folder.speedup_limit(one, at_once, 4, 65536) == round(6.0 / (2.0 + 1.0), 2)


def test_the_slower_of_the_gpus_and_the_decoders_side_by_side_sets_the_streaming(bench_folder):
    one = {"wall_s": 6.0, "steady": 16384}
    at_once = decoders({1: 2.0, 4: 2.0}, {1: 20000, 4: 32768})  # the four decoders make 2x one GPU's rate
    assert bench_folder.speedup_limit(one, at_once, 4, 65536) == round(6.0 / (2.0 + 2.0), 2)


def test_a_later_start_side_by_side_comes_off_the_gain(bench_folder):
    one = {"wall_s": 6.0, "steady": 16384}
    at_once = decoders({1: 2.0, 4: 3.5}, {1: 20000, 4: 80000})  # each of four starts 1.5 s later
    assert bench_folder.speedup_limit(one, at_once, 4, 65536) == round(6.0 / (2.0 + 1.5 + 1.0), 2)


def test_no_steady_rate_no_limit(bench_folder):
    assert bench_folder.speedup_limit({"wall_s": 1.0, "steady": None}, decoders({1: 2.0}, {1: 1}), 1, 10) is None

