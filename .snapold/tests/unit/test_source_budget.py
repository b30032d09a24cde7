"""Size as a habit: no package Python file grows past PYTHON_BUDGET lines, no CUDA or C source past NATIVE_BUDGET, and
no function or method of the package past FUNCTION_BUDGET lines. A file that long holds more than one thing a reader
can keep in mind, and is split by what it holds (as conv_nhwc.cuh and the conv_nhwc_*.cu families were, or
onnx_read.py from onnx_convert.py) before it grows further; a function that long does several steps, each of which
can be named.

A function's length runs from its ``def`` line to its last line (``end_lineno - lineno + 1``; decorators are not
counted, a nested function counts in its own length and in the one around it).

Exceptions are listed in OVER_BUDGET (files) and LONG_FUNCTIONS (functions), each with its reason and its own
ceiling, so that they do not grow either; an entry for something gone or back within the budget fails too, so that
the lists only shrink."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON_BUDGET = 600
NATIVE_BUDGET = 800
FUNCTION_BUDGET = 80
PACKAGE = "inception_engine/**/*.py"
# glob -> the most lines a file it matches may have
BUDGETS = {PACKAGE: PYTHON_BUDGET, "cuda_src/*.cu": NATIVE_BUDGET, "cuda_src/*.cuh": NATIVE_BUDGET,
           "cuda_src/*.h": NATIVE_BUDGET, "cpu_src/*.c": NATIVE_BUDGET, "cpu_src/*.h": NATIVE_BUDGET}
# path -> (ceiling, reason): none today
OVER_BUDGET: dict[str, tuple[int, str]] = {}
# "path::qualified name" -> (ceiling, reason): none today
LONG_FUNCTIONS: dict[str, tuple[int, str]] = {}


def line_counts() -> dict[str, tuple[int, int]]:
    """path -> (lines, budget) of every source file the budget covers."""
    return {str(p.relative_to(ROOT)): (len(p.read_text().splitlines()), budget)
            for pattern, budget in BUDGETS.items() for p in sorted(ROOT.glob(pattern))}


def function_lengths(source: str, filename: str = "<source>") -> dict[str, int]:
    """Qualified name (``Class.method``, ``outer.inner``) -> lines, from the ``def`` line to the last, of every
    function and method in ``source``."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename), "")
    return lengths


def package_function_lengths() -> dict[str, int]:
    """"path::qualified name" -> lines of every function and method of the package."""
    return {f"{p.relative_to(ROOT)}::{name}": n for p in sorted(ROOT.glob(PACKAGE))
            for name, n in function_lengths(p.read_text(), str(p)).items()}


def over_budget(sizes: dict[str, tuple[int, int]], exceptions: dict[str, tuple[int, str]]
                ) -> tuple[dict[str, int], list[str]]:
    """From ``sizes`` (name -> (size, budget)): those over their budget, or over their exception's ceiling where
    they have one, and the exceptions that are stale (their name gone, or its size back within the budget)."""
    over = {k: n for k, (n, budget) in sizes.items() if n > exceptions.get(k, (budget, ""))[0]}
    stale = [k for k in exceptions if k not in sizes or sizes[k][0] <= sizes[k][1]]
    return over, stale


def test_the_budget_covers_the_sources():
    counts = line_counts()
    assert counts["inception_engine/backends/cuda/backend.py"][1] == PYTHON_BUDGET
    assert counts["cuda_src/conv_nhwc.cuh"][1] == NATIVE_BUDGET
    assert len([p for p in counts if p.startswith("cuda_src/")]) >= 15
    assert len([p for p in counts if p.startswith("cpu_src/")]) >= 2
    functions = package_function_lengths()
    assert "inception_engine/backends/numpy_backend.py::NumpyBackend.forward" in functions
    assert len(functions) > 500


def test_no_source_file_is_over_its_budget():
    over, stale = over_budget(line_counts(), OVER_BUDGET)
    assert not over, (f"over {PYTHON_BUDGET} lines (Python) or {NATIVE_BUDGET} (CUDA, C): split the file by what it "
                      f"holds, or list it in OVER_BUDGET with the reason: {over}")
    assert not stale, f"OVER_BUDGET entries for files gone or back within the budget: {stale}"


def test_no_function_is_over_its_budget():
    sizes = {k: (n, FUNCTION_BUDGET) for k, n in package_function_lengths().items()}
    over, stale = over_budget(sizes, LONG_FUNCTIONS)
    assert not over, (f"functions over {FUNCTION_BUDGET} lines: give their steps functions of their own, or list "
                      f"them in LONG_FUNCTIONS with the reason: {over}")
    assert not stale, f"LONG_FUNCTIONS entries for functions gone or back within the budget: {stale}"


def test_the_checks_on_made_up_sources():
    """The measure on a made-up module (a decorated function, a method, a nested and an async function, a
    one-liner) and the verdicts at and past a budget, with exceptions kept, exceeded and stale."""
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    source = (f"import functools\n\n\n@functools.cache\n@functools.wraps(print)\ndef long():\n{body}\n\n\n"
              f"class A:\n    def method(self):\n        def inner():\n            return 1\n\n        return inner\n\n"
              f"    async def fetch(self):\n        pass\n\n\ndef short(): return 2\n")
    assert function_lengths(source) == {"long": 80, "A.method": 5, "A.method.inner": 2, "A.fetch": 2, "short": 1}
    longer = source.replace("def long():\n", "def long():\n    x = 0\n")
    assert function_lengths(longer)["long"] == 81

    def sizes(src: str) -> dict[str, tuple[int, int]]:
        return {f"m.py::{k}": (n, FUNCTION_BUDGET) for k, n in function_lengths(src).items()}

    assert over_budget(sizes(source), {}) == ({}, [])
    assert over_budget(sizes(longer), {}) == ({"m.py::long": 81}, [])
    assert over_budget(sizes(longer), {"m.py::long": (81, "why")}) == ({}, [])
    assert over_budget(sizes(longer), {"m.py::long": (80, "why")}) == ({"m.py::long": 81}, [])
    assert over_budget(sizes(source), {"m.py::long": (81, "why"), "m.py::gone": (90, "why")}) == (
        {}, ["m.py::long", "m.py::gone"])
    assert over_budget({"big.cu": (801, NATIVE_BUDGET), "big.py": (601, PYTHON_BUDGET)}, {}) == (
        {"big.cu": 801, "big.py": 601}, [])
    assert over_budget({"big.cu": (800, NATIVE_BUDGET), "big.py": (600, PYTHON_BUDGET)}, {}) == ({}, [])
