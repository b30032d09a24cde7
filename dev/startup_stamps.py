"""Where an inception-run's time goes: its steps, stamped in every process of the run (spawned --gpus workers too),
in seconds from the command's start.

    python3 dev/startup_stamps.py -- photos/ --decode gpu --precision fp16 --output /tmp/labels.jsonl [--gpus 2]

Runs ``inception-run ARGS`` once in a fresh interpreter with dev/stamps/ on its PYTHONPATH (its sitecustomize.py
stamps the steps named in its STAMPED) and prints, per process, each step's start and end, then the wall time from
start to exit. dev/performance-log.md (round four, "where a run's time goes") has a run of it on 65,536 files."""

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
RUN = "from inception_engine.cli import run_main; run_main()"


def stamps(args: list[str]) -> tuple[float, int, str, list[dict]]:
    """(wall seconds, exit code, its stderr, each process's stamps relative to the start) of one inception-run
    ARGS."""
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, IE_STAMPS=folder,
                   PYTHONPATH=os.pathsep.join(p for p in (str(STAMPS), os.environ.get("PYTHONPATH")) if p))
        t0 = time.time()
        done = subprocess.run([sys.executable, "-c", RUN, *args], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        wall = time.time() - t0
        procs = []
        for path in sorted(Path(folder).glob("*.json")):
            p = json.loads(path.read_text())
            procs.append({"pid": p["pid"], "gpu": p["gpu"], "start": p["start"] - t0,
                          "events": sorted(((step, a - t0, b - t0, thread) for step, a, b, thread in p["events"]),
                                           key=lambda e: e[1])})
    return wall, done.returncode, done.stderr, sorted(procs, key=lambda p: p["start"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("args", nargs=argparse.REMAINDER, help="inception-run's arguments (after --)")
    args = [a for a in ap.parse_args().args if a != "--"] or ap.error("give inception-run's arguments after --")
    wall, code, said, procs = stamps(args)
    for p in procs:
        who = f"GPU {p['gpu']} worker" if p["gpu"] is not None else "process"
        print(f"{who} (pid {p['pid']}), started at {p['start']:.3f} s")
        for step, a, b, thread in p["events"]:
            print(f"  {a:7.3f} - {b:7.3f}  {step}" + (f"  [{thread}]" if thread != "MainThread" else ""))
    print(f"wall {wall:.3f} s from start to exit, exit code {code}; inception-run said:")
    print(textwrap.indent(said.rstrip(), "  "))


if __name__ == "__main__":
    main()
