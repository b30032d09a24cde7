"""Every developer tool in dev/ still runs on today's code: each script answers --help (without PyTorch, pycuda, Ray,
onnxruntime or nvImageCodec, which CI lacks and which the scripts import only where they measure), every name a
script imports from inception_engine, at the top or inside a function, still exists where the script looks for it
(and takes the keyword arguments the script passes it), the shell kits parse, and the parts of the scripts that need
no GPU give the right answers. A refactor that moves a module out from under a script fails here, not on the GPU
machine.

Pure parts tested elsewhere: bench_folder.speedup_limit (test_bench_folder.py), bench_multi_gpu's report
(test_bench_multi_gpu.py), startup_stamps (test_startup_stamps.py), bench_kernels on the emulator
(tests/kernels/test_cuda_emulated.py)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "dev"
# Every Python tool in dev/ (stamps/sitecustomize.py is loaded by startup_stamps.py's runs, not run itself).
SCRIPTS = sorted([*DEV.glob("*.py"), *DEV.glob("gpu_machine/*.py")])
SHELL_KITS = sorted(DEV.glob("gpu_machine/*.sh"))
# User scripts whose --help must answer without what they export from (they import it after parsing)
USER_SCRIPTS = [ROOT / "scripts" / "export_pytorch_fid_onnx.py"]
HEAVY = ("torch", "torchvision", "pycuda", "ray", "onnxruntime", "nvidia", "triton", "pytorch_fid")

# Runs a script as `python SCRIPT --help` does, with the heavy optional packages made unimportable, so that a
# script which needs one for --help fails here even on a machine that has it.
HELP_RUNNER = """
import importlib.abc, runpy, sys
HEAVY = {heavy!r}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused by test_dev_tools)")
        return None
sys.meta_path.insert(0, Refuse())
script = sys.argv[1]
sys.argv = [script, "--help"]
sys.path.insert(0, __import__("os").path.dirname(script))
runpy.run_path(script, run_name="__main__")
"""


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def load(path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The script as a module (its folder on sys.path, as `python3 dev/NAME.py` has it)."""
    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location(f"dev_tool_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


def test_the_tools_are_found():
    names = {rel(p) for p in SCRIPTS}
    assert {"dev/bench_folder.py", "dev/gpu_decode_agreement.py", "dev/gpu_machine/slim_nvimgcodec_wheel.py"} <= names
    assert "dev/gpu_machine/gpu_check.sh" in {rel(p) for p in SHELL_KITS}


@pytest.mark.parametrize("script", SCRIPTS + USER_SCRIPTS, ids=rel)
def test_help_answers_without_the_heavy_packages(script: Path, tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", HELP_RUNNER.format(heavy=HEAVY), str(script)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("usage: "), done.stdout[:500]
    assert list(tmp_path.iterdir()) == []  # --help made nothing


def inception_imports(tree: ast.AST) -> list[tuple[str, str | None, str | None, int]]:
    """(module, imported name or None, the name it is bound to, line) of every import of inception_engine, wherever
    it stands (at the top or inside a function); bound to None where ``import a.b.c`` binds only ``a``."""
    found: list[tuple[str, str | None, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "inception_engine":
            found += [(node.module, a.name, a.asname or a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None, a.asname or (None if "." in a.name else a.name), node.lineno)
                      for a in node.names if a.name.split(".")[0] == "inception_engine"]
    return found


def submodule(package: ModuleType, name: str) -> bool:
    return hasattr(package, "__path__") and importlib.util.find_spec(f"{package.__name__}.{name}") is not None


@pytest.mark.parametrize("script", SCRIPTS, ids=rel)
def test_what_it_imports_from_the_package_is_there(script: Path):
    """Each inception_engine module and name a script imports exists, and so does each attribute it reads off a
    module it imported by name (``cb.Kernels`` after ``from inception_engine.backends import cuda as cb``); the same
    for the code it hands to ``python -c`` in strings (bench_folder's --ab variants)."""
    tree = ast.parse(script.read_text(), str(script))
    missing = problems(tree, rel(script))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "inception_engine" in node.value:
            try:
                code = ast.parse(node.value)
            except SyntaxError:
                continue  # prose, or a fragment joined to others before it runs
            missing += problems(code, f"{rel(script)}:{node.lineno} (code in a string)")
    assert not missing, "\n".join(missing)


def problems(tree: ast.AST, where: str) -> list[str]:
    missing: list[str] = []
    modules: dict[str, ModuleType] = {}
    callables: dict[str, Any] = {}
    for module, name, alias, line in inception_imports(tree):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            if e.name is not None and e.name.split(".")[0] in HEAVY:
                continue  # a module that needs the GPU's packages at import: its existence is what counts here
            missing.append(f"{where}:{line}: {module} ({e})")
            continue
        if name is None:
            if alias is not None:
                modules[alias] = mod
        elif callable(getattr(mod, name, None)) and not isinstance(getattr(mod, name), ModuleType):
            callables[alias] = getattr(mod, name)
        elif submodule(mod, name):
            modules[alias] = importlib.import_module(f"{module}.{name}")
        elif hasattr(mod, name):
            if isinstance(getattr(mod, name), ModuleType):
                modules[alias] = getattr(mod, name)
        else:
            missing.append(f"{where}:{line}: {module} has no {name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            mod = modules[node.value.id]
            if not hasattr(mod, node.attr) and not submodule(mod, node.attr):
                missing.append(f"{where}:{node.lineno}: {mod.__name__} has no {node.attr}")
        if isinstance(node, ast.Call):
            fn = called(node.func, modules, callables)
            missing += [f"{where}:{node.lineno}: {ast.unparse(node.func)}() takes no {k}="
                        for k in unknown_keywords(fn, node)] if fn is not None else []
    return missing


def called(func: ast.expr, modules: dict[str, ModuleType], callables: dict[str, Any]) -> Any:
    """What a call's ``NAME(...)`` or ``MODULE.NAME(...)`` calls, where NAME came from the package; else None."""
    if isinstance(func, ast.Name):
        return callables.get(func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in modules:
        got = getattr(modules[func.value.id], func.attr, None)
        return got if callable(got) and not isinstance(got, ModuleType) else None
    return None


def unknown_keywords(fn: Any, call: ast.Call) -> list[str]:
    """The keyword arguments of the call that fn's signature has no parameter for (Engine(weights, decode=...)
    after a change of Engine's arguments)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return []
    names = {p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    return [k.arg for k in call.keywords if k.arg is not None and k.arg not in names]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("kit", SHELL_KITS, ids=rel)
def test_shell_kit_parses(kit: Path):
    done = subprocess.run(["bash", "-n", str(kit)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------------------------ the parts without a GPU

def jpeg(path: Path, seed: int = 0, size: tuple[int, int] = (120, 90)) -> Path:
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
    Image.fromarray(coarse).resize(size, Image.BICUBIC).save(path, quality=90)
    return path


def test_gpu_decode_agreement_compares_a_file_with_the_exact_cpu_path(tmp_path, monkeypatch):
    agreement = load(DEV / "gpu_decode_agreement.py", monkeypatch)
    cpu = agreement.cpu_path(agreement.Preprocess())
    same, off = str(jpeg(tmp_path / "a.jpg")), str(jpeg(tmp_path / "b.jpg", seed=1))
    found = agreement.Agreement()
    found.compare(same, None, cpu(same, Path(same).read_bytes()), cpu)
    ref = cpu(off, Path(off).read_bytes())
    crop = ref.copy()
    crop[0, 0, 0] = 255 if ref[0, 0, 0] < 128 else 0  # one byte as far off as it can be
    step = abs(int(crop[0, 0, 0]) - int(ref[0, 0, 0]))
    found.compare(off, None, crop, cpu)
    assert found.stats == [(0.0, 0, same), (pytest.approx(step / crop.size), step, off)]
    assert step >= 128 and found.mismatched == []
    assert found.report(worst=1) == [
        f"GPU vs CPU path: mean abs diff {step / crop.size / 2:.4f} (per file: median {step / crop.size / 2:.4f}, "
        f"worst {step / crop.size:.4f}), max abs diff {step}", f"  {off}: mean {step / crop.size:.4f} max {step}"]


def test_gpu_decode_agreement_reports_what_the_two_paths_disagree_on(tmp_path, monkeypatch):
    agreement = load(DEV / "gpu_decode_agreement.py", monkeypatch)
    cpu = agreement.cpu_path(agreement.Preprocess())
    photo, png, gone = str(jpeg(tmp_path / "a.jpg")), tmp_path / "c.png", str(tmp_path / "gone.jpg")
    Image.open(photo).save(png)
    found = agreement.Agreement()
    found.compare(photo, "decode failed", np.zeros((299, 299, 3), np.uint8), cpu)  # GPU failed, CPU did not
    wrong = cpu(str(png), png.read_bytes()) ^ 1
    found.compare(str(png), None, wrong, cpu)  # a CPU-path file (not JPEG) must match exactly
    _, read_error = agreement.read_file(gone)
    found.compare(gone, read_error, np.zeros((299, 299, 3), np.uint8), cpu)  # same error both ways: agreed
    assert found.stats == []
    assert found.mismatched == [f"{photo}: GPU path 'decode failed', CPU path None",
                                f"{png}: CPU-path file differs (max 1)"]
    assert found.report(worst=5) == [f"MISMATCH {line}" for line in found.mismatched]


def test_slim_nvimgcodec_wheel_keeps_one_python_and_rewrites_record(tmp_path, monkeypatch):
    slim = load(DEV / "gpu_machine" / "slim_nvimgcodec_wheel.py", monkeypatch)
    whl_dir = tmp_path / ".whl"
    whl_dir.mkdir()
    wheel = whl_dir / "nvidia_nvimgcodec_cu13-0.9.0-py3-none-manylinux.whl"
    files = {"nvidia/nvimgcodec/nvimgcodec_impl.cpython-312-x86_64-linux-gnu.so": b"312",
             "nvidia/nvimgcodec/nvimgcodec_impl.cpython-311-x86_64-linux-gnu.so": b"311",
             "nvidia/nvimgcodec/extensions/libnvjpeg_ext.so": b"jpeg",
             "nvidia/nvimgcodec/extensions/libnvjpeg2k_ext.so": b"j2k",
             "nvidia/nvimgcodec/extensions/libtiff_ext.so": b"tiff",
             "nvidia/nvimgcodec/lib/libnvimgcodec.so.0": b"lib"}
    record = "nvidia_nvimgcodec_cu13-0.9.0.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(record, "stale\n")
    original = wheel.read_bytes()
    slim.main([str(wheel)])
    kept = [n for n in files if slim.keep(n)]
    assert kept == ["nvidia/nvimgcodec/nvimgcodec_impl.cpython-312-x86_64-linux-gnu.so",
                    "nvidia/nvimgcodec/extensions/libnvjpeg_ext.so", "nvidia/nvimgcodec/lib/libnvimgcodec.so.0"]
    with zipfile.ZipFile(wheel) as z:
        assert sorted(z.namelist()) == sorted([*kept, record])
        assert all(z.read(n) == files[n] for n in kept)
        assert z.read(record).decode().splitlines() == [slim.record_line(n, files[n]) for n in kept] + [f"{record},,"]
    assert (tmp_path / ".whl-orig" / wheel.name).read_bytes() == original  # the original kept beside


def test_bench_folder_top1_and_agreement(tmp_path, monkeypatch):
    bench_folder = load(DEV / "bench_folder.py", monkeypatch)
    rows = [{"image": "/x/a.jpg", "top": [{"index": 3}]}, {"image": "/x/b.jpg", "error": "bad"},
            {"image": "/x/c.jpg", "top": [{"index": 7}]}]
    out = tmp_path / "out.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = bench_folder.top1(out)
    assert first == {"a.jpg": 3, "b.jpg": -1, "c.jpg": 7}
    assert bench_folder.agree(first, {"a.jpg": 3, "b.jpg": -1, "c.jpg": 8, "d.jpg": 1}) == "2/3"


def test_bench_folder_turned_photos_are_stored_on_their_side(tmp_path, monkeypatch):
    bench_folder = load(DEV / "bench_folder.py", monkeypatch)
    bench_folder.make_jpeg((tmp_path / "odd.jpg", 1, "turned"))
    bench_folder.make_jpeg((tmp_path / "even.jpg", 2, "turned"))
    with Image.open(tmp_path / "odd.jpg") as img:
        assert img.size == (375, 500) and img.getexif()[0x0112] == 6
        assert ImageOps.exif_transpose(img).size == (500, 375)
    with Image.open(tmp_path / "even.jpg") as img:
        assert img.size == (375, 500) and 0x0112 not in img.getexif()


def test_bench_e2e_agreement_matches_by_path(tmp_path, monkeypatch):
    bench_e2e = load(DEV / "bench_e2e.py", monkeypatch)
    a = {"paths": ["p1", "p2", "p3"], "top1": [1, 2, 3]}
    b = {"paths": ["p3", "p2", "p1"], "top1": [3, 9, 1]}
    assert bench_e2e.agreement(a, b) == "2/3"
    assert bench_e2e.agreement(a, {"error": "no GPU"}) == "-"
    for name in ("b.JPG", "a.png", "c.txt", "d.jpeg"):
        (tmp_path / name).write_bytes(b"")
    assert [Path(p).name for p in bench_e2e.images_in(tmp_path, None)] == ["a.png", "b.JPG", "d.jpeg"]
    assert len(bench_e2e.images_in(tmp_path, 2)) == 2


def test_gemm_floor_counts_the_forwards_work(monkeypatch):
    gemm_floor = load(DEV / "gemm_floor.py", monkeypatch)
    # At 1 TFLOP/s an op's compute floor in ms is its GFLOP: the forward's 11.43 GFLOP an image (dev/README).
    one = gemm_floor.op_floors("fp16", 1, 1.0, 1.0)
    two = gemm_floor.op_floors("fp16", 2, 1.0, 1.0)
    assert sum(c for c, _ in one.values()) == pytest.approx(11.43, abs=0.005)
    assert sum(c for c, _ in two.values()) == pytest.approx(2 * sum(c for c, _ in one.values()))
    # int8's plan moves the average pools behind their convs and folds MaxPool_3a as fp16's does: the same ops
    int8 = gemm_floor.op_floors("int8", 1, 1.0, 1.0)
    assert int8.keys() == one.keys() and sum(c for c, _ in int8.values()) == pytest.approx(11.43, abs=0.005)
    conv = next(op for op in gemm_floor.the_plan("fp16", 2, gemm_floor.cb.he_weights(0)).conv_ops
                if op.name == "Conv2d_1a_3x3")
    assert gemm_floor.gemm_shape(conv) == (2 * 149 * 149, 32, 3 * 3 * 3)


def test_bench_fid_measures_a_command_and_reads_both_tools_fids(tmp_path, monkeypatch):
    """bench_fid.py without torch: its images are deterministic, varied and the size asked; a timed command's wall
    time, memory peaks and printed FID (inception-fid --json's or pytorch-fid's line) are read back; the table says
    each run's ratio to pytorch-fid and its relative difference."""
    bench = load(DEV / "bench_fid.py", monkeypatch)
    a, b = bench.generated(3), bench.generated(3)
    assert a.shape == (256, 256, 3) and a.dtype == np.uint8 and np.array_equal(a, b)
    assert not np.array_equal(a, bench.generated(4)) and a.std() > 10
    assert [bench.image_name(i, "both") for i in range(2)] == ["000000.png", "000001.jpg"]
    folder = bench.image_folder(tmp_path, "gen", 4, "both", 0, 1.0)
    assert sorted(p.name for p in folder.iterdir()) == [".complete", "000000.png", "000001.jpg", "000002.png",
                                                        "000003.jpg"]
    assert len(list(bench.subset(folder, 2).glob("0*"))) == 2
    assert bench.parse_fid('{\n  "fid": 12.5,\n  "model": "x"\n}\n') == 12.5
    assert bench.parse_fid("100%|####| 2/2\nFID:  269.923705707366\n") == 269.923705707366
    assert bench.parse_fid("Traceback ...\n") is None
    script = "import numpy; x = bytearray(64 << 20); print('FID:  2.0')"
    run = bench.timed(bench.Run("ours-x", [sys.executable, "-c", script]), tmp_path)
    assert run.rc == 0 and run.fid == 2.0 and run.wall_s > 0 and run.peak_rss_mib >= 64
    base = bench.Run("pytorch-fid", [], wall_s=10.0, rc=0, fid=2.0002)
    rows = bench.table([run, base], base, base).splitlines()
    assert rows[2].startswith(f"| ours-x | {run.wall_s:.2f} | {10.0 / run.wall_s:.2f} |") and "1.00e-04" in rows[2]


def test_bench_fid_limits_floors_and_the_bench_rate(monkeypatch):
    """bench_fid --limits: a floor is the fixed cost plus the images over the forward's rate, fp32's accuracy at best
    three fp16 forwards; a precision without a rate (no GPU) has no floor; the rate is the cuda row's; the fixed cost
    is a run less its forward."""
    bench = load(DEV / "bench_fid.py", monkeypatch)
    got = bench.floors(20000, 2.5, {"fp32": 4000.0, "fp16": 30000.0, "tf32": None})
    assert got == pytest.approx({"fp32": 7.5, "fp16": 2.5 + 2 / 3, bench.FP32_AT_BEST: 4.5})
    assert bench.floors(100, 1.0, {"fp32": None}) == {}
    # the fixed cost: the run less its images' forward at the rate alone, or the whole run without a rate
    assert bench.fixed_cost(3.0, 2560, 5120.0) == pytest.approx(2.5) and bench.fixed_cost(3.0, 2560, None) == 3.0
    assert bench.FIXED_IMAGES > 2048  # a full-rank covariance, as a real job's
    rows = [{"backend": "cudnn", "images_per_s": 9.0}, {"backend": "cuda", "images_per_s": 4375.1}]
    assert bench.cuda_rate({"rows": rows}) == 4375.1
    assert bench.cuda_rate({"rows": [{"backend": "cuda", "images_per_s": None}]}) is None


def test_bench_cpu_layer_table_groups_and_sorts(monkeypatch):
    bench_cpu = load(DEV / "bench_cpu.py", monkeypatch)
    labels = [("conv a", 2e9), ("pool", 0.0), ("conv a", 2e9), ("conv b", 1e9)]
    table = bench_cpu.layer_table(labels, [1.0, 0.5, 3.0, 2.0])
    assert table == [("conv a", 2, 4.0, pytest.approx(1000.0)), ("conv b", 1, 2.0, pytest.approx(500.0)),
                     ("pool", 1, 0.5, 0.0)]


def test_gpu_clocks_summarises_the_busy_samples_and_runs_without_nvidia_smi(tmp_path, monkeypatch):
    clocks = load(DEV / "gpu_machine" / "gpu_clocks.py", monkeypatch)
    got = clocks.parse("1980, 70.1\n1755, 650.0\n[N/A], [N/A]\n1700, 690.5\n1800, 600.0\n")
    assert got == clocks.Clocks(samples=4, busy=3, sm_mhz=1755.0, sm_mhz_min=1700.0, watts=650.0, watts_max=690.5)
    assert "SM clock 1755 MHz (min 1700), power 650 W (max 690)" in got.line("main")
    assert clocks.parse("1980, 70\n").line("idle") == "idle: no busy samples of 1"
    # without nvidia-smi the command still runs, its status is the run's, and the log is empty
    monkeypatch.setenv("PATH", str(tmp_path))
    log = tmp_path / "clocks.csv"
    assert clocks.main(["run", str(log), "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert log.read_text() == ""


def test_fp32_tile_ablation_edits_are_in_the_kernel_and_compile(tmp_path, monkeypatch):
    """Each variant's edit finds its text in conv_nhwc_wgmma.cu once, so a kernel change that moves it fails here and
    not on the GPU machine; each edited kernel compiles for sm_90a where nvcc is on PATH (CI's is)."""
    ablation = load(DEV / "gpu_machine" / "fp32_tile_ablation.py", monkeypatch)
    kernel = (ROOT / ablation.KERNEL).read_text()
    assert set(ablation.VARIANTS) == {"main", *ablation.EDITS}
    for variant, (old, _) in ablation.EDITS.items():
        assert kernel.count(old) == 1, variant
    tree = ablation.make_tree("onewg", tmp_path)
    edited = (tree / ablation.KERNEL).read_text()
    assert "a_lo, b_hi" not in edited and (tree / "cuda_src" / "conv_nhwc.cuh").is_file()
    assert (ablation.make_tree("main", tmp_path) / ablation.KERNEL).read_text() == kernel
    Run = ablation.Run
    lines = ablation.table([Run("main", 20.0, "a"), Run("nowg", 16.0, "b"), Run("main", 20.2, "c"),
                            Run("nowg", None, "d")])
    assert lines[1].split()[:3] == ["main", "20.10", "+0.0"] and lines[1].endswith("20.00 / 20.20; c")
    assert lines[2].split()[:3] == ["nowg", "16.00", "-20.4"] and lines[2].endswith("16.00; d")
    # a run's median is the cuda row's of the bench's --json report (here a stand-in that writes one)
    args = SimpleNamespace(work=tmp_path / "runs", batch=128, iters=1)
    args.work.mkdir()
    with monkeypatch.context() as m:
        m.setattr(ablation, "BENCH", "import json, sys; json.dump({'rows': [{'backend': 'cuda', 'median_ms': 19.5}]}, "
                  "open(sys.argv[sys.argv.index('--json') + 1], 'w'))")
        m.setenv("PATH", str(tmp_path))  # no nvidia-smi: the run goes on without samples
        assert ablation.bench(tree, "onewg_1", args) == Run("onewg", 19.5, "no busy samples of 0")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return
    for variant, (old, new) in ablation.EDITS.items():
        src = tmp_path / "cuda_src"
        shutil.copytree(ROOT / "cuda_src", src, dirs_exist_ok=True)
        (src / "conv_nhwc_wgmma.cu").write_text(kernel.replace(old, new))
        done = subprocess.run([nvcc, "-gencode", "arch=compute_90a,code=sm_90a", "-DIE_NHWC_FP32", "-cubin", "-o",
                               str(tmp_path / f"{variant}.cubin"), str(src / "conv_nhwc_wgmma.cu")],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (variant, done.stderr[-2000:])
