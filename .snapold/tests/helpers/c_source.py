"""cuda_src/ read as text after the preprocessor, for the tests that hold the C side to the kernel registry
(backends/cuda/kernels.py): each entry point's parameters and ``__launch_bounds__``, the values of the
``constexpr int`` constants those name, and which names each entry point's code reaches through the functions it
calls.

A source is preprocessed by g++ with the CPU emulator's headers (tests/cuda_emu), which leaves every tile in (the
sm_90a ones too), with ``__launch_bounds__`` kept as written (the emulator's header would drop it) and the macros
that stamp out the tiles expanded. Only the text of cuda_src's own files is kept; nothing is compiled.
"""

from __future__ import annotations

import ast
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from inception_engine import cuda_build

EMU = Path(__file__).resolve().parents[1] / "cuda_emu"
# Included after the emulator's headers: __launch_bounds__ expands to itself (a macro is not expanded again inside
# its own expansion), its arguments macro-expanded.
KEEP_LAUNCH_BOUNDS = "#undef __launch_bounds__\n#define __launch_bounds__(...) __launch_bounds__(__VA_ARGS__)\n"
LINE_MARKER = re.compile(r'^# \d+ "([^"]*)".*$', re.M)
ENTRY = re.compile(r'extern\s+"C"\s+void\s+(?:__launch_bounds__\s*\((?P<bounds>[^()]*(?:\([^()]*\)[^()]*)*)\)\s*)?'
                   r'(?P<name>\w+)\s*\((?P<params>[^)]*)\)\s*\{')
CONSTEXPR_INT = re.compile(r"\bconstexpr\s+int\s+([^;()]+);")
DYNAMIC_SHARED = re.compile(r"extern\s+__shared__[^;\[]*?(\w+)\s*\[\s*\]")
IDENT = re.compile(r"[A-Za-z_]\w*")
NOT_A_FUNCTION = {"if", "for", "while", "switch", "catch", "return", "sizeof", "alignas", "decltype", "__attribute__"}
QUALIFIERS = ("const", "noexcept", "override", "mutable")


@dataclass(frozen=True)
class Entry:
    """An extern "C" entry point as declared: its parameters (name, P/i/q) and its __launch_bounds__ arguments
    (None where it has none)."""

    params: tuple[tuple[str, str], ...]
    bounds: tuple[str, ...] | None


@dataclass
class Source:
    """One cuda_src file after the preprocessor (its own text only)."""

    text: str
    entries: dict[str, Entry] = field(init=False)
    _calls: dict[str, set[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.entries = {m["name"]: Entry(c_params(m["params"]), None if m["bounds"] is None
                                         else tuple(split_top_level(m["bounds"])))
                        for m in ENTRY.finditer(self.text)}
        self._calls = function_identifiers(blank_literals(self.text))

    def constant(self, expr: str) -> int:
        """The value of an integer expression of literals and this file's ``constexpr int`` constants."""
        return evaluate(expr, constants(self.text))

    def reaches(self, entry: str, names: set[str]) -> set[str]:
        """Those of ``names`` that entry point's code names, or the code of a function it calls (by name:
        overloads and templates count as one, so this may over-approximate, never under-)."""
        seen, todo, found = set(), [entry], set()
        while todo:
            f = todo.pop()
            if f in seen:
                continue
            seen.add(f)
            ids = self._calls.get(f, set())
            found |= ids & names
            todo += [i for i in ids if i in self._calls and i not in seen]
        return found


def preprocess(source: str, tmp: Path) -> Source:
    probe = tmp / "keep_launch_bounds.h"
    probe.write_text(KEEP_LAUNCH_BOUNDS)
    src = cuda_build.source_dir()
    cmd = ["g++", "-x", "c++", "-std=c++20", "-E", "-include", str(EMU / "emu.h"), "-include",
           str(EMU / "tf32_emu.h"), "-include", str(probe), "-I", str(src), str(src / source)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return Source(own_text(r.stdout, src))


def own_text(out: str, src: Path) -> str:
    """The parts of g++ -E's output that come from files in src (its line markers say which)."""
    parts, keep, pos = [], False, 0
    for m in LINE_MARKER.finditer(out):
        if keep:
            parts.append(out[pos:m.start()])
        keep, pos = Path(m.group(1)).resolve().parent == src.resolve(), m.end()
    if keep:
        parts.append(out[pos:])
    return "".join(parts)


def c_params(declaration: str) -> tuple[tuple[str, str], ...]:
    """'const float* __restrict x, int n, long long t, float s' -> (("x", "P"), ("n", "i"), ("t", "q"), ("s", "f"))."""
    params = []
    for param in filter(None, (p.strip() for p in declaration.split(","))):
        name = re.findall(r"(\w+)$", param)[0]
        code = ("P" if "*" in param else "q" if re.search(r"\blong\s+long\b", param)
                else "f" if re.fullmatch(r"(const\s+)?float\s+\w+", param) else "i")
        assert code != "i" or re.fullmatch(r"(const\s+)?(unsigned\s+)?int\s+\w+", param), param
        params.append((name, code))
    return tuple(params)


def dynamic_shared_arrays() -> dict[str, str]:
    """Every ``extern __shared__`` array of cuda_src (the launch's dynamic shared memory): name -> file."""
    return {name: p.name for p in sorted(cuda_build.source_dir().glob("*.cu*"))
            for name in DYNAMIC_SHARED.findall(p.read_text())}


def split_top_level(text: str) -> list[str]:
    """'a(b, c), d' -> ['a(b, c)', 'd']: split at the commas outside parentheses and brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c in "([{") - (c in ")]}")
        if c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return parts + [text[start:].strip()]


def constants(text: str) -> dict[str, list[str]]:
    """name -> the expressions every ``constexpr int`` declaration of that name gives it (a function's local
    constants too: a name given two values cannot be evaluated)."""
    found: dict[str, list[str]] = {}
    for m in CONSTEXPR_INT.finditer(text):
        for declarator in split_top_level(m.group(1)):
            name, _, expr = declarator.partition("=")
            if expr:
                found.setdefault(name.strip(), []).append(expr.strip())
    return found


def evaluate(expr: str, consts: dict[str, list[str]]) -> int:
    """A C integer expression of + - * / (truncating), parentheses, literals and constants, evaluated."""
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            exprs = set(consts.get(node.id, ()))
            assert len(exprs) == 1, f"{node.id}: {'no' if not exprs else 'more than one'} constexpr int value"
            return evaluate(exprs.pop(), consts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = value(node.left), value(node.right)
            if isinstance(node.op, ast.Div):
                return int(a / b)
            ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
            if type(node.op) in ops:
                return ops[type(node.op)]
        raise AssertionError(f"cannot evaluate {ast.unparse(node)!r} of {expr!r}")

    return value(ast.parse(expr.strip(), mode="eval").body)


def blank_literals(text: str) -> str:
    """String and character literals emptied, so that their braces and names do not count as code."""
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", re.sub(r'"(\\.|[^"\\\n])*"', '""', text))


def function_identifiers(code: str) -> dict[str, set[str]]:
    """function name -> the identifiers of its bodies: every ``name(...) [qualifiers] {`` whose name is not a
    keyword opens a body (functions, member functions, entry points; a lambda's or a block's braces lie within
    one), read up to its matching brace."""
    close_of, paren_of, braces, parens = {}, {}, [], []
    for i, c in enumerate(code):
        if c == "{":
            braces.append(i)
        elif c == "}":
            close_of[braces.pop()] = i
        elif c == "(":
            parens.append(i)
        elif c == ")":
            paren_of[i] = parens.pop()
    def before_space(j: int) -> int:
        while j > 0 and code[j - 1].isspace():
            j -= 1
        return j

    bodies: dict[str, set[str]] = {}
    for open_, close in close_of.items():
        j = before_space(open_)
        while True:  # step back over trailing qualifiers: f() const {
            word = next((q for q in QUALIFIERS if code.endswith(q, 0, j)), None)
            if word is None:
                break
            j = before_space(j - len(word))
        if j == 0 or code[j - 1] != ")":
            continue
        name = re.search(r"(\w+)\s*(<[^<>(){};]*>)?\s*$", code[max(0, paren_of[j - 1] - 200):paren_of[j - 1]])
        if name and name.group(1) not in NOT_A_FUNCTION:
            bodies.setdefault(name.group(1), set()).update(IDENT.findall(code[open_:close]))
    return bodies
