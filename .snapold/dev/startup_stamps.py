"""Where an inception-run's (or inception-fid's) time goes: its steps, stamped in every process of the run (spawned
--gpus workers and decode processes too), in seconds from the command's start.

    python3 dev/startup_stamps.py -- photos/ --decode gpu --precision fp16 --output /tmp/labels.jsonl [--gpus 2]
    python3 dev/startup_stamps.py --command fid -- generated/ ref-stats.npz --weights fid.npz

Runs ``inception-run ARGS`` (``--command fid``: ``inception-fid ARGS``) once in a fresh interpreter with
dev/stamps/ on its PYTHONPATH (its sitecustomize.py stamps the steps named in its STAMPED) and prints, per process,
each step's start and end (a step repeated back to back on one thread as one line: first start, last end, count),
then the wall time from start to exit. dev/performance-log.md (round four, "where a run's time goes") has a run of it
on 65,536 files."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

STAMPS = Path(__file__).resolve().parent / "stamps"
COMMANDS = {"run": "from inception_engine.cli import run_main; run_main()",
            "fid": "from inception_engine.fid_command import fid_main; fid_main()"}


def stamps(args: list[str], command: str = "run") -> tuple[float, int, str, list[dict]]:
    """(wall seconds, exit code, its stderr, each process's stamps relative to the start) of one inception-run
    ARGS (or the other COMMANDS)."""
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, IE_STAMPS=folder,
                   PYTHONPATH=os.pathsep.join(p for p in (str(STAMPS), os.environ.get("PYTHONPATH")) if p))
        t0 = time.time()
        done = subprocess.run([sys.executable, "-c", COMMANDS[command], *args], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        wall = time.time() - t0
        procs = []
        for path in sorted(Path(folder).glob("*.json")):
            p = json.loads(path.read_text())
            procs.append({"pid": p["pid"], "gpu": p["gpu"], "start": p["start"] - t0,
                          "events": sorted(((step, a - t0, b - t0, thread) for step, a, b, thread in p["events"]),
                                           key=lambda e: e[1])})
    return wall, done.returncode, done.stderr, sorted(procs, key=lambda p: p["start"])


def collapsed(events: list) -> list[tuple[str, float, float, str, int]]:
    """(step, first start, last end, thread, count): a step repeated back to back on one thread as one entry."""
    out: list[tuple[str, float, float, str, int]] = []
    for step, a, b, thread in events:
        if out and out[-1][0] == step and out[-1][3] == thread:
            out[-1] = (step, out[-1][1], b, thread, out[-1][4] + 1)
        else:
            out.append((step, a, b, thread, 1))
    return out


def step_lines(steps: list, indent: str = "  ") -> list[str]:
    """``collapsed`` steps as printed: start - end, the step (x count where repeated), its thread where not the main
    one."""
    return [f"{indent}{a:7.3f} - {b:7.3f}  {step}{f' x{count}' if count > 1 else ''}"
            + (f"  [{thread}]" if thread != "MainThread" else "") for step, a, b, thread, count in steps]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--command", choices=sorted(COMMANDS), default="run", help="inception-run or inception-fid")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the command's arguments (after --)")
    opts = ap.parse_args()
    args = [a for a in opts.args if a != "--"] or ap.error("give the command's arguments after --")
    wall, code, said, procs = stamps(args, opts.command)
    for p in procs:
        if not p["events"] or [e[0] for e in p["events"]] == ["exit"]:
            continue  # a helper process (resource tracker, forkserver) that ran no stamped step
        who = f"GPU {p['gpu']} worker" if p["gpu"] is not None else "process"
        print(f"{who} (pid {p['pid']}), started at {p['start']:.3f} s")
        print("\n".join(step_lines(collapsed(p["events"]))))
    print(f"wall {wall:.3f} s from start to exit, exit code {code}; inception-{opts.command} said:")
    print(textwrap.indent(said.rstrip(), "  "))


if __name__ == "__main__":
    main()
