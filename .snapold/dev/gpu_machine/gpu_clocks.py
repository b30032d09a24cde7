"""The SM clock and board power while a command runs on the GPU machine: a tree that runs faster may owe it to the
clock it kept, not to its code (the tensor cores draw less power on zero or repeated operands, and an H100 under
its power limit lowers its clock).

    python3 dev/gpu_machine/gpu_clocks.py run LOG.csv -- COMMAND...   # samples nvidia-smi every 100 ms while COMMAND
                                                                      # runs; its exit status is COMMAND's
    python3 dev/gpu_machine/gpu_clocks.py summary LOG.csv [LABEL]     # one line: medians over the busy samples

A sample is busy when the board draws more than BUSY_WATTS (an idle H100 draws ~70-120 W). dev/gpu_machine/
ab_bench.sh runs each bench through ``run`` with CLOCKS=1 and prints the summaries under the rows.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

BUSY_WATTS = 150.0
QUERY = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "100"]


@dataclass(frozen=True)
class Clocks:
    samples: int  # all of them
    busy: int  # drawn above BUSY_WATTS
    sm_mhz: float  # medians and extremes over the busy samples
    sm_mhz_min: float
    watts: float
    watts_max: float

    def describe(self) -> str:
        if not self.busy:
            return f"no busy samples of {self.samples}"
        return (f"SM clock {self.sm_mhz:.0f} MHz (min {self.sm_mhz_min:.0f}), power {self.watts:.0f} W "
                f"(max {self.watts_max:.0f}), medians of {self.busy} busy samples of {self.samples}")

    def line(self, label: str) -> str:
        return f"{label}: {self.describe()}"


def parse(text: str) -> Clocks:
    """nvidia-smi's rows "MHz, W" (a row with N/A or anything else unreadable is skipped)."""
    rows = []
    for line in text.splitlines():
        try:
            mhz, watts = (float(v) for v in line.split(","))
        except ValueError:
            continue
        rows.append((mhz, watts))
    busy = [r for r in rows if r[1] > BUSY_WATTS]
    if not busy:
        return Clocks(len(rows), 0, 0.0, 0.0, 0.0, 0.0)
    return Clocks(len(rows), len(busy), statistics.median(r[0] for r in busy), min(r[0] for r in busy),
                  statistics.median(r[1] for r in busy), max(r[1] for r in busy))


def run(log: Path, command: list[str], cwd: Path | None = None, output: IO[str] | None = None) -> int:
    """COMMAND's exit status, nvidia-smi's samples in LOG meanwhile; COMMAND's stdout and stderr go to output if
    given (else where this process's go), and it runs in cwd."""
    def command_status() -> int:
        return subprocess.call(command, cwd=cwd, stdout=output, stderr=subprocess.STDOUT if output else None)

    with log.open("w") as out:
        try:
            sampler = subprocess.Popen(QUERY, stdout=out, stderr=subprocess.DEVNULL)
        except FileNotFoundError:
            print("gpu_clocks: nvidia-smi is not on PATH; the command runs without samples", file=sys.stderr)
            return command_status()
        try:
            return command_status()
        finally:
            sampler.terminate()
            sampler.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The SM clock and board power while a command runs on the GPU.")
    sub = parser.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="sample nvidia-smi into LOG while COMMAND runs; exit with COMMAND's status")
    r.add_argument("log", type=Path)
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    s = sub.add_parser("summary", help="one line: the medians over LOG's busy samples")
    s.add_argument("log", type=Path)
    s.add_argument("label", nargs="?")
    args = parser.parse_args(argv)
    if args.what == "run":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("run: no command after --")
        return run(args.log, command)
    print(parse(args.log.read_text()).line(args.label or str(args.log)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
