"""Every CUDA source compiles warning-free for Hopper, and the cubins hold every kernel the backend will ask for.

Runs without a GPU (nvcc only); skipped with the reason where nvcc is not installed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from inception_engine import cuda_build
from inception_engine.backends.cuda.kernels import all_kernel_names, unit_of

NVCC = cuda_build.find_nvcc()
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) is not on PATH")

SOURCES = sorted(p.name for p in cuda_build.source_dir().glob("*.cu"))


def test_build_list_covers_every_source():
    assert sorted(cuda_build.SOURCES) == SOURCES


@pytest.mark.slow
@pytest.mark.parametrize("name", SOURCES)
def test_compiles_for_sm90_without_warnings(name, tmp_path):
    cubin = tmp_path / (Path(name).stem + ".cubin")
    cmd = [NVCC, "-arch=sm_90", "-Werror", "all-warnings", "-cubin", "-o", str(cubin),
           str(cuda_build.source_dir() / name)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert cubin.stat().st_size > 0


@pytest.mark.parametrize("name", SOURCES)
def test_header_comment_says_what_idea_and_launch(name):
    head = (cuda_build.source_dir() / name).read_text().split("#include")[0]
    assert head.startswith("// " + name + ":"), "first line: '// <file>: what it computes'"
    assert "Idea:" in head and "Launch:" in head


@pytest.fixture(scope="module")
def built(kernel_cubins):
    """cuda_build.build("sm_90") in the user cache, shared with the emulated backend's runs (kernels/conftest.py)."""
    return kernel_cubins


def entry_points(cubin: Path) -> set[str]:
    # extern "C" kernel names appear NUL-terminated in the cubin's ELF string table
    return {s.decode("latin-1") for s in cubin.read_bytes().split(b"\0")}


@pytest.mark.slow
def test_build_caches_and_holds_every_kernel_the_backend_launches(built):
    assert set(built) == set(cuda_build.UNITS)
    assert {source for source, _ in cuda_build.UNITS.values()} == set(cuda_build.SOURCES)
    assert cuda_build.is_cached("sm_90")
    missing = []
    for kernel in all_kernel_names():
        if kernel not in entry_points(built[unit_of(kernel)]):
            missing.append(kernel)
    assert not missing, f"kernels the backend launches but the cubins lack: {missing}"
    # the NHWC conv families' units hold one element type's tiles each: a run compiles only those it launches
    names = {k for k in all_kernel_names() if k.startswith("conv_nhwc_")}
    for unit, (source, _) in cuda_build.UNITS.items():
        if source in cuda_build.PER_ELEMENT:
            held = names & entry_points(built[unit])
            assert held and all(unit_of(k) == unit for k in held), unit
    mtimes = {p: p.stat().st_mtime_ns for p in built.values()}
    assert cuda_build.build("sm_90") == built  # second call: cache hit, nothing rebuilt
    assert {p: p.stat().st_mtime_ns for p in built.values()} == mtimes


def test_wgmma_pipelines_are_not_serialized(built):
    """ptxas reports a serialized wgmma pipeline as information, not as a warning, so -Werror lets it through: C7520
    ("wgmma.mma_async instructions are serialized due to ...") cost the halo tiles 30-50 % of their speed once (a
    branch between two wgmma sequences inside their tap loop, session 5). The build keeps each unit's nvcc output
    beside its cubin; the sm_90a units' are searched for it."""
    outputs = {u: cuda_build.log_path(path).read_text() for u, path in built.items()
               if cuda_build.UNITS[u][0] in ("conv_nhwc_wgmma.cu", "conv_nhwc_ws.cu", "conv_nhwc_halo.cu")}
    assert outputs
    serialized = {u: [l for l in out.splitlines() if "C7520" in l or "serialized" in l] for u, out in outputs.items()}
    assert not any(serialized.values()), serialized


def test_cache_key_changes_with_target_and_flags(monkeypatch):
    key = cuda_build.build_key("sm_90")
    assert cuda_build.build_key("sm_80") != key
    monkeypatch.setattr(cuda_build, "FLAGS", (*cuda_build.FLAGS, "-DEXTRA"))
    assert cuda_build.build_key("sm_90") != key


def test_missing_nvcc_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cuda_build, "find_nvcc", lambda: None)
    with pytest.raises(cuda_build.BackendUnavailable, match="nvcc .* not on PATH") as e:
        cuda_build.build("sm_90")
    assert "\n" not in str(e.value)


def test_compile_error_is_one_clear_line(monkeypatch, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in cuda_build.SOURCES:
        (src / name).write_text("extern \"C\" __global__ void k() {}\n")
    (src / "pool.cu").write_text("this is not CUDA\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cuda_build, "source_dir", lambda: src)
    with pytest.raises(cuda_build.BackendUnavailable, match="could not compile pool.cu for sm_90") as e:
        cuda_build.build("sm_90")
    assert "\n" not in str(e.value)
    leftovers = [p.name for p in (tmp_path / "cache" / "inception-engine" / "kernels").iterdir()
                 if p.name.endswith(".part") or p.name.startswith("pool-")]
    assert not leftovers
