"""helpers.build_cache, which the kernel tests' compiled libraries and the synthetic models rely on: one build per
key however many workers ask at once, nothing left behind by a failed build, a new key for changed inputs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from helpers import build_cache
from helpers.build_cache import cached_build, content_key


def test_workers_asking_at_once_share_one_build(tmp_path):
    calls = []

    def build(path: Path) -> None:
        calls.append(path)
        time.sleep(0.2)  # long enough for the other threads to reach the lock
        path.write_bytes(b"built")

    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(cached_build(tmp_path, "lib", ".so", "k1", build)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results == [tmp_path / "lib-k1.so"] * 4
    assert (tmp_path / "lib-k1.so").read_bytes() == b"built"
    assert cached_build(tmp_path, "lib", ".so", "k1", build) == tmp_path / "lib-k1.so" and len(calls) == 1


def test_a_failed_build_leaves_nothing_and_the_next_one_builds(tmp_path):
    def fail(path: Path) -> None:
        path.write_bytes(b"half")
        raise AssertionError("compiler error")

    with pytest.raises(AssertionError, match="compiler error"):
        cached_build(tmp_path, "lib", ".so", "k1", fail)
    assert not [p for p in tmp_path.iterdir() if p.suffix != ".lock"]
    path = cached_build(tmp_path, "lib", ".so", "k1", lambda p: p.write_bytes(b"ok"))
    assert path.read_bytes() == b"ok"


def test_the_key_covers_parts_file_names_and_contents(tmp_path):
    (tmp_path / "a.h").write_text("int a;")
    key = content_key(["-O2", "source"], [tmp_path])
    assert content_key(["-O2", "source"], [tmp_path]) == key
    assert content_key(["-O3", "source"], [tmp_path]) != key
    (tmp_path / "a.h").write_text("int b;")
    assert content_key(["-O2", "source"], [tmp_path]) != key
    (tmp_path / "a.h").rename(tmp_path / "b.h")
    changed = content_key(["-O2", "source"], [tmp_path])
    (tmp_path / "b.h").rename(tmp_path / "a.h")
    assert changed != content_key(["-O2", "source"], [tmp_path])


def test_the_tests_keep_to_the_cache_the_user_chose(tmp_path, monkeypatch):
    """Generated models and compiled libraries go under $INCEPTION_TEST_CACHE, else the user's cache as the engine
    finds it ($XDG_CACHE_HOME), never ~/.cache when XDG_CACHE_HOME says otherwise."""
    monkeypatch.delenv(build_cache.TEST_CACHE_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build_cache.cache_for_tests("models") == tmp_path / "xdg" / "inception-engine" / "test-models"
    assert build_cache.cache_for_tests("builds") == tmp_path / "xdg" / "inception-engine" / "test-builds"
    monkeypatch.setenv(build_cache.TEST_CACHE_VAR, str(tmp_path / "mine"))
    assert build_cache.cache_for_tests("models") == tmp_path / "mine"
    assert build_cache.cache_for_tests("builds") == tmp_path / "mine" / "builds"
