"""README.md's examples run as written: every line of its ```bash blocks and every ```python block, in order, in a
scratch directory with the files they name (cat.jpg, photos/, ...), the commands of this checkout on PATH and a
synthetic model standing in for torchvision's export (its producer PyTorch's, as the real export's). Lines that
cannot run here are skipped, each with its reason (printed). Also: README still shows the set-up commands CI runs
(.ci/run).

The examples build on each other (an export carries on, a converted file is used by the next line), so they run
in one test rather than one test each: pytest-xdist's --dist loadgroup, which kept such tests on one worker in
order, no longer groups anything with pytest 9.2 (it sets a node id that pytest 9.2 derives instead)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inception_engine import backends, synthetic

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# command -> (module of inception_engine, its entry function)
COMMANDS = {"inception-run": ("cli", "run_main"), "inception-convert-weights": ("cli", "convert_main"),
            "inception-bench": ("cli", "bench_main"), "inception-fid": ("fid_command", "fid_main")}

# (pattern, reason): README lines that cannot run inside the test suite, whatever the machine
NEVER_HERE = [
    (r"^pip install", "installs packages: the suite runs in the environment they made"),
    (r"^python -m pytest", "runs the test suite, of which this test is part"),
    (r"export_torchvision_onnx\.py", "needs PyTorch and the download of torchvision's pretrained weights"),
    (r"export_pytorch_fid_onnx\.py", "needs PyTorch, pytorch-fid and the download of its FID weights"),
]
GPU_ONLY = r"--precision (fp16|tf32)|--decode gpu|--gpus|cuda_build"


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every ```bash and ```python block, in order."""
    return re.findall(r"^```(bash|python)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def examples() -> list[tuple[str, str]]:
    """("bash", one command line) or ("python", a whole block), in README order."""
    out = []
    for lang, code in blocks(README.read_text()):
        if lang == "python":
            out.append((lang, code))
        else:
            out += [(lang, line) for line in code.splitlines() if line.strip() and not line.startswith("#")]
    return out


def skip_reason(line: str) -> str | None:
    for pattern, reason in NEVER_HERE:
        if re.search(pattern, line):
            return reason
    if re.search(GPU_ONLY, line) and not backends.is_available("cuda")[0]:
        return f"needs a GPU: {backends.is_available('cuda')[1]}"
    return None


@pytest.fixture
def scratch(tmp_path_factory, export_like_onnx) -> dict:
    """The directory the examples run in, with what they name, and the environment they run with (updated by
    each bash line, so that an `export` carries on to the next)."""
    d = tmp_path_factory.mktemp("readme")
    rng = np.random.default_rng(11)

    def image(name: str) -> None:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (320, 300, 3), dtype=np.uint8)).save(d / name)

    for name in ("cat.jpg", "dog.png", "photos/a.jpg", "photos/b.png", "photos/trip/c.jpg", "more/d.png"):
        image(name)
    os.symlink(export_like_onnx, d / "inception_v3.onnx")  # what scripts/export_torchvision_onnx.py would write
    for k in range(10):  # inception-fid's folders (--isc takes 10 splits)
        for folder in ("real", "generated"):
            (d / folder).mkdir(exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(d / folder / f"{k}.png")
    fid = synthetic.synthetic_onnx_model(network="fid")  # what scripts/export_pytorch_fid_onnx.py would write
    fid.producer_name, fid.producer_version = "pytorch", "2.5.0"
    (d / "pt_inception_fid.onnx").write_bytes(fid.SerializeToString())
    bin_dir = d / ".bin"
    bin_dir.mkdir()
    for command, (module, entry) in COMMANDS.items():  # this checkout's commands, installed or not
        script = bin_dir / command
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "from inception_engine.{module} import {entry}; '
                          f'{entry}()" "$@"\n')
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "INCEPTION_WEIGHTS"}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "PYTHONPATH": str(ROOT), "HOME": str(d / "home"),
            "XDG_CACHE_HOME": str(d / "home" / ".cache")}
    return {"dir": d, "env": env}


def run_example(scratch: dict, lang: str, code: str) -> None:
    """One example in the scratch directory with the environment the ones before it left; fails with its output."""
    if lang == "python":
        r = subprocess.run([sys.executable, "-c", code], cwd=scratch["dir"], env=scratch["env"], capture_output=True,
                           text=True, timeout=600, check=False)
        assert r.returncode == 0, f"{code}\n{r.stderr}"
        return
    env_file = scratch["dir"] / ".env"
    r = subprocess.run(["bash", "-c", f"set -e\n{code}\nenv -0 > {env_file}"], cwd=scratch["dir"],
                       env=scratch["env"], capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, f"{code}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    scratch["env"] = dict(kv.split("=", 1) for kv in env_file.read_text().split("\0") if "=" in kv)


def test_readme_examples_run_in_order(scratch):
    ran, skipped = 0, []
    for lang, code in examples():
        reason = skip_reason(code) if lang == "bash" else None
        if reason:
            skipped.append(f"{code.strip()}: {reason}")
            continue
        run_example(scratch, lang, code)
        ran += 1
    print("\nREADME lines not run here:\n  " + "\n  ".join(skipped))
    assert ran >= 8, f"only {ran} examples ran"


def test_readme_shows_the_set_up_ci_runs():
    ci = [line.strip().removeprefix("python -m ") for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if re.match(r"(python -m )?(pip install|pytest)", line.strip())]
    shown = {line.strip().removeprefix("python -m ") for lang, code in blocks(README.read_text()) if lang == "bash"
             for line in code.splitlines()}
    assert ci and all(c in shown for c in ci), (ci, shown)


def test_the_examples_are_found():
    found = examples()
    assert sum(lang == "python" for lang, _ in found) >= 1
    assert sum(code.startswith("inception-run ") for lang, code in found) >= 5
    assert shutil.which("bash")
