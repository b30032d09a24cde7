"""The conventions every command keeps (issue 50): --version, ``python -m inception_engine``, one placeholder style,
help on every option, the commands counted right in README and pyproject, inception-bench honest on a CPU machine."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import click
import pytest

from inception_engine import bench, cli, fid_command

from helpers.cli import runner

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {"inception-run": cli.run_cmd, "inception-convert-weights": cli.convert_cmd,
            "inception-bench": cli.bench_cmd, "inception-tune": cli.tune_cmd}
# commands this checkout has that an older install may not list yet (test_python_m_lists_the_installed_commands)
NEWER = {"inception-fid": fid_command.fid_cmd}


@pytest.mark.parametrize("name", [*COMMANDS, *NEWER])
def test_every_command_says_its_version(name):
    r = runner().invoke({**COMMANDS, **NEWER}[name], ["--version"], prog_name=name)
    assert r.exit_code == 0 and r.stdout == f"{name} {metadata.version('inception-engine')}\n"


@pytest.mark.parametrize("name", [*COMMANDS, *NEWER])
def test_one_placeholder_style_and_help_on_every_option(name):
    command = {**COMMANDS, **NEWER}[name]
    text = runner().invoke(command, ["--help"], prog_name=name).stdout
    assert not re.search(r"\b(INTEGER|TEXT|PATH|FLOAT|RANGE|FILENAME|DIRECTORY)\b", text), text
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"{name} {param.opts[0]} has no help"
            assert param.metavar is None or re.fullmatch(r"\[?[A-Z]+(\.[a-z]+)?\]?", param.metavar), param.metavar


def test_the_options_say_what_they_take():
    helps = {(name, p.opts[-1]): p.help or "" for name, c in COMMANDS.items() for p in c.params
             if isinstance(p, click.Option)}
    for name in ("inception-run", "inception-bench", "inception-tune"):
        assert ".onnx" in helps[(name, "--weights")] and ".npz" in helps[(name, "--weights")]
    assert "failed" in helps[("inception-run", "--resume")]
    for option in ("--peak-tflops", "--peak-gbs", "--per-layer"):  # what only a GPU computes says so
        assert "GPU" in helps[("inception-bench", option)], option
    assert "GPU" in helps[("inception-bench", "--backends")] and "GPU" in (cli.tune_cmd.help or "")


def test_python_m_lists_the_installed_commands():
    r = subprocess.run([sys.executable, "-m", "inception_engine"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0 and r.stderr == ""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    listed = re.findall(r"^  (inception-[a-z-]+) ", r.stdout, re.MULTILINE)
    installed = {ep.name for ep in metadata.distribution("inception-engine").entry_points
                 if ep.group == "console_scripts"}
    assert listed == sorted(installed) and set(COMMANDS) <= set(listed) <= set(scripts) | installed


def test_readme_and_pyproject_count_no_commands_wrong():
    """They name the commands instead of counting them, so a new one cannot make them wrong; README names each."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    readme, pyproject = (ROOT / "README.md").read_text(), (ROOT / "pyproject.toml").read_text()
    for text in (readme, pyproject):
        assert not re.search(r"\b(two|three|four|five|\d) (console )?commands\b", text)
    assert all(f"`{name}`" in readme for name in scripts if name in COMMANDS or name in NEWER)


def test_bench_without_onnxruntime_has_no_row_only_to_say_so(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError, as on a base install
    notes: list[str] = []
    assert bench.onnxruntime_peer(None, True, tmp_path, notes) is None
    assert notes == ["no onnxruntime row: onnxruntime is not installed (pip install onnxruntime adds it, and the "
                     "cpu/ort column)"]
