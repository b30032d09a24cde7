"""Where ``inception-run --server`` spends its wall time: one run of it in this process, with the clock read at each
phase (interpreter start to the CLI imported, the run's options checked, the server asked what it runs, the inputs
listed, the first result, the results written, the exit), printed as one line on stderr.

    python dev/client_phases.py [--inflight N] -- --server URL DIR --output out.jsonl [inception-run options]

``--inflight N``: requests the client keeps outstanding (serve/client.INFLIGHT), for a sweep. The marks are read from
the process's own start (``time.perf_counter`` at the first line here, after the interpreter's own start-up, which
``python -X importtime`` and ``python -c pass`` time apart).
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

MARKS: list[tuple[str, float]] = []


def mark(name: str) -> None:
    MARKS.append((name, time.perf_counter() - T0))


def timed(module: Any, name: str) -> None:
    """module.name marked at its start and end."""
    inner: Callable[..., Any] = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        mark(f"{name}<")
        try:
            return inner(*args, **kwargs)
        finally:
            mark(f"{name}>")

    setattr(module, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inflight", type=int, default=None, metavar="N",
                    help="requests kept outstanding (serve/client.INFLIGHT) [default: the client's]")
    ap.add_argument("run", nargs=argparse.REMAINDER, help="-- then inception-run's arguments")
    args = ap.parse_args()
    argv, inflight = args.run[1:] if args.run[:1] == ["--"] else args.run, args.inflight
    import inception_engine.cli as cli

    mark("imports")
    if inflight is not None:
        from inception_engine.serve import client

        client.INFLIGHT = inflight
        client.RemoteRun.__init__.__defaults__ = (*client.RemoteRun.__init__.__defaults__[:-1], inflight)
    for name in ("run_config", "start_driver", "list_inputs", "make_sink", "write_results"):
        timed(cli, name)
    first_timed = cli.first_timed

    def first_and_last(preds: Iterator[Any], first_at: list[float]) -> Iterator[Any]:
        for n, p in enumerate(first_timed(preds, first_at)):
            if not n:
                mark("first")
            yield p

    cli.first_timed = first_and_last
    sys.argv = ["inception-run", *argv]
    try:
        cli.run_main()
    except SystemExit as e:
        mark(f"exit({e.code})")
    finally:
        print("phases: " + "  ".join(f"{n} {t:.3f}" for n, t in MARKS), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
