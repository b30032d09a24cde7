"""The C side of every kernel against the host's table of it (backends/cuda/kernels.py): each entry point the backend
launches is declared in the file ``source_of`` names, with the parameters of its ``signature``, name for name and
type for type (pointer: P, int: i, long long: q), and no file declares an entry point the table lacks.

The sources are read after the preprocessor (g++ -E with the CPU emulator's headers, which leaves every tile in, the
sm_90a ones too), as the macros that stamp out the tiles write them; nothing is compiled, so this runs in seconds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from inception_engine import cuda_build
from inception_engine.backends.cuda import kernels

GXX = shutil.which("g++")
EMU = Path(__file__).resolve().parents[1] / "cuda_emu"
pytestmark = pytest.mark.skipif(GXX is None, reason="g++ is not installed (it preprocesses the sources)")

ENTRY = re.compile(r'extern\s+"C"\s+void\s+(\w+)\s*\(([^)]*)\)\s*\{')


def c_params(declaration: str) -> tuple[tuple[str, str], ...]:
    """'const float* __restrict x, int n, long long t' -> (("x", "P"), ("n", "i"), ("t", "q"))."""
    params = []
    for param in filter(None, (p.strip() for p in declaration.split(","))):
        name = re.findall(r"(\w+)$", param)[0]
        code = "P" if "*" in param else "q" if re.search(r"\blong\s+long\b", param) else "i"
        assert code != "i" or re.fullmatch(r"(const\s+)?(unsigned\s+)?int\s+\w+", param), param
        params.append((name, code))
    return tuple(params)


def entry_points(text: str) -> dict[str, tuple[tuple[str, str], ...]]:
    return {m.group(1): c_params(m.group(2)) for m in ENTRY.finditer(text)}


@pytest.fixture(scope="module")
def declared() -> dict[str, dict[str, tuple[tuple[str, str], ...]]]:
    """source -> {entry point: its parameters}, after the preprocessor."""
    found = {}
    for source in cuda_build.SOURCES:
        cmd = [GXX, "-x", "c++", "-std=c++20", "-E", "-P", "-include", str(EMU / "emu.h"), "-include",
               str(EMU / "tf32_emu.h"), "-I", str(cuda_build.source_dir()), str(cuda_build.source_dir() / source)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        found[source] = entry_points(r.stdout)
    return found


def test_the_parser_reads_types_and_names():
    text = ('extern "C" void k(const NhwcF16::T *__restrict x, unsigned* __restrict c, int n, long long t) {}\n'
            'extern "C" void j() {}')
    assert entry_points(text) == {"k": (("x", "P"), ("c", "P"), ("n", "i"), ("t", "q")), "j": ()}


def test_every_kernel_is_declared_with_its_signature(declared):
    wrong = []
    for kernel in kernels.all_kernel_names():
        source = kernels.source_of(kernel)
        got = declared[source].get(kernel)
        want = kernels.signature(kernel).params
        if got != want:
            wrong.append(f"{kernel} ({source}): C {got}, kernels.signature {want}")
    assert not wrong, "\n".join(wrong)


def test_no_source_declares_a_kernel_the_table_lacks(declared):
    names = set(kernels.all_kernel_names())
    extra = {source: sorted(set(entries) - names) for source, entries in declared.items() if set(entries) - names}
    assert not extra, extra
    assert sum(len(e) for e in declared.values()) == len(names)
