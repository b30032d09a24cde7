"""The package's imports only look down: every module of inception_engine belongs to one layer of ``LAYERS``, may
import modules of its own layer or of a layer below, never of one above, and no chain of imports comes back to where
it started. Imports inside functions count too: they run as soon as the function does.

The imports are read with ast (nothing is imported), so a new module without a layer fails here until it is given
one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "inception_engine"

# Bottom to top. A module's layer is that of the longest entry that is its name or a package above it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation: no imports from the package beyond this layer",
     ("errors", "arch", "native_build", "paths", "data", "atomic")),
    ("core: weights, plans, the kernel build, the native APIs",
     ("weights", "results", "model_files", "labels", "plan", "onnx_read", "onnx_qdq", "onnx_convert", "cuda_build",
      "cuda_graph", "fid", "cudnn_api")),
    ("backends: what runs a plan", ("backends",)),
    ("ingest: the input side, from names to decoded crops (host or GPU)", ("ingest",)),
    ("pipeline: the result streams, joining the input side to a backend",
     ("pipeline", "cuda_runner", "output", "output_read", "features_file")),
    ("applications: what puts backends to work",
     ("config", "engine", "synthetic", "calibrate", "bench", "bench_report", "multi_gpu", "drivers", "sinks",
      "ray_data", "tune", "serve")),
    ("the command line", ("commands", "cli", "entry", "__main__", "serve.command", "fid_command")),
)


# What the input side may import of the backends: the CUDA kernel layer its GPU resize runs on (pycuda's driver, the
# kernel registry and launches), never a backend itself (ingest/__init__.py states the rule).
INGEST_FROM_BACKENDS = {"backends.cuda.device", "backends.cuda.kernels"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = PACKAGE.joinpath(*name.split(".")) if name else PACKAGE
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """The package's modules that this file imports (names relative to the package; "" is the package itself)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name.removeprefix("inception_engine").lstrip(".") for a in node.names
                      if a.name.split(".")[0] == "inception_engine"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = package.split(".") if package else []
                base = up[:len(up) - (node.level - 1)] if node.level > 1 else up
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "inception_engine":
                target = node.module.removeprefix("inception_engine").lstrip(".")
            else:
                continue
            for alias in node.names:  # `from . import x` imports module x where there is one
                sub = f"{target}.{alias.name}".lstrip(".")
                found.add(sub if is_module(sub) else target)
    return found - {name}


def layer_of(name: str) -> int | None:
    matches = [(len(entry), i) for i, (_, entries) in enumerate(LAYERS) for entry in entries
               if name == entry or name.startswith(entry + ".")]
    return max(matches)[1] if matches else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    def layer(m: str) -> str:
        return LAYERS[layer_of(m)][0].split(":")[0]

    return [f"{m} ({layer(m)}) imports {d} ({layer(d)})" for m, deps in sorted(graph.items()) if m
            for d in sorted(deps) if d and layer_of(d) is not None and layer_of(d) > layer_of(m)]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A chain of imports that comes back to its start, by depth-first search for a back edge; a package importing
    its own submodules is none unless one of them imports the package back."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (cycle := visit(d)):
                return cycle
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_has_a_layer(graph):
    missing = sorted(m for m in graph if m and layer_of(m) is None)
    assert not missing, f"modules without a layer in LAYERS: {missing}"


def test_no_module_imports_from_a_layer_above(graph):
    upward = upward_imports(graph)
    assert not upward, "\n".join(upward)


def in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def side_crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports that break the input side's rule: a backend importing ingest, ingest importing a module of the
    pipeline's layer or above, or a part of the backends other than INGEST_FROM_BACKENDS."""
    pipeline = next(i for i, (title, _) in enumerate(LAYERS) if title.startswith("pipeline:"))
    found = []
    for m, deps in sorted(graph.items()):
        for d in sorted(deps):
            if in_package(m, "backends") and in_package(d, "ingest"):
                found.append(f"{m} (a backend) imports {d} (the input side)")
            elif in_package(m, "ingest") and layer_of(d) is not None and layer_of(d) >= pipeline:
                found.append(f"{m} (the input side) imports {d} (the pipeline or above)")
            elif in_package(m, "ingest") and in_package(d, "backends") and d not in INGEST_FROM_BACKENDS:
                found.append(f"{m} (the input side) imports {d} (a backend beyond the kernel layer)")
    return found


def test_the_backends_never_import_the_input_side_nor_it_the_pipeline(graph):
    assert any(in_package(m, "ingest") for m in graph) and any(in_package(m, "backends") for m in graph)
    crossings = side_crossings(graph)
    assert not crossings, "\n".join(crossings)


def test_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(m or "inception_engine" for m in cycle)


def test_the_reader_and_the_checks():
    """The imports as read from two real files, and the checks on made-up graphs: core importing a backend, two
    modules importing each other (through a third), a package importing its submodules."""
    assert imports_of(PACKAGE / "cuda_build.py") == {"errors", "native_build", "paths"}
    assert imports_of(PACKAGE / "backends" / "cuda" / "device.py") == {"cuda_build", "errors"}
    assert upward_imports({"cuda_build": {"backends.cuda.device", "errors"}, "cli": {"engine"}}) == [
        "cuda_build (core) imports backends.cuda.device (backends)"]
    assert find_cycle({"plan": {"arch"}, "arch": {"weights"}, "weights": {"plan"}}) == [
        "arch", "weights", "plan", "arch"]
    assert find_cycle({"backends.cuda": {"backends.cuda.device"}, "backends.cuda.device": {"cuda_build"}}) is None
    assert side_crossings({"backends.cuda.backend": {"ingest.jpeg_decode"}, "ingest.files": {"pipeline"},
                           "ingest.jpeg_decode": {"backends.cuda.kernels", "backends.cuda.backend"},
                           "cuda_runner": {"ingest.ring", "backends.cuda.backend"}}) == [
        "backends.cuda.backend (a backend) imports ingest.jpeg_decode (the input side)",
        "ingest.files (the input side) imports pipeline (the pipeline or above)",
        "ingest.jpeg_decode (the input side) imports backends.cuda.backend (a backend beyond the kernel layer)"]


def test_test_files_have_unique_names():
    """pytest imports test files by their base name (no packages under tests/): two files of one name in different
    folders make the second fail to collect."""
    from collections import Counter

    names = Counter(p.name for p in Path(__file__).resolve().parents[1].rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []


def test_the_command_line_and_the_server_client_load_no_numpy():
    """inception-run starts without NumPy, the engine or tqdm: a --server run (serve/client.py, results.py,
    ingest/entries.py, serve/wire.py) never needs them, and every command's --help answers sooner. The local paths
    import them where they start an engine. Nor do Pillow's Image, the architecture's tables, tempfile (through
    importlib.resources) or difflib load before a --server client's first request: each is imported where it is
    used. A module the interpreter's start already loaded (a site .pth file may import tempfile) is not ours."""
    import subprocess
    import sys

    code = ("import sys; started = set(sys.modules); "
            "import inception_engine.cli, inception_engine.serve.client, inception_engine.drivers; "
            "print(sorted(m for m in ('numpy', 'tqdm', 'inception_engine.engine', 'inception_engine.plan', "
            "'inception_engine.pipeline', 'inception_engine.weights', 'PIL.Image', 'inception_engine.arch', "
            "'tempfile', 'difflib') if m in sys.modules and m not in started))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
