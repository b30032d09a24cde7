"""Concurrent branches: which stream each op of a plan runs on and which earlier ops it waits for (``schedule``),
from the ops' reads and writes (``depends``). CudaBackend turns this into streams and events and captures them,
forks and joins included, into its CUDA graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...plan import Plan, View, writes


@dataclass(frozen=True)
class Scheduled:
    """Where one op runs in a concurrent forward."""

    stream: int  # 0 is the main stream, which forks every stage to the others and joins them at its end
    waits: tuple[int, ...]  # earlier ops of the same stage, on other streams, that must finish first


def _overlap(a: View, b: View) -> bool:
    return a.buffer == b.buffer and bool(range(max(a.c_offset, b.c_offset),
                                              min(a.c_offset + a.channels, b.c_offset + b.channels)))


def depends(later: Any, earlier: Any) -> bool:
    """Whether op ``later`` must wait for op ``earlier``: it reads what ``earlier`` writes, or writes what it reads
    or writes. By buffer name and channels, which is exact within a stage of a concurrent plan (no two buffers
    used in one stage share memory)."""
    return any(_overlap(later.src, w) for w in writes(earlier)) or any(
        _overlap(w, earlier.src) or any(_overlap(w, e) for e in writes(earlier)) for w in writes(later))


def schedule(plan: Plan) -> list[Scheduled]:
    """Streams for the ops of each stage, one per op of ``plan.ops``. An op with no dependency in its stage starts
    a new stream (the stage's first op takes the main stream); an op whose latest dependency is the last op so far
    on that op's stream continues that stream (a branch's chain of convs stays on one stream); any other op starts
    a new stream and waits for its dependencies by events. Streams are numbered afresh in each stage."""
    out: list[Scheduled] = []
    start = 0
    tails: dict[int, int] = {}  # stream -> last op placed on it in this stage
    for i, op in enumerate(plan.ops):
        if i and plan.stages[i] != plan.stages[i - 1]:
            start, tails = i, {}
        deps = [j for j in range(start, i) if depends(op, plan.ops[j])]
        stream = len(tails)
        if deps and tails[out[deps[-1]].stream] == deps[-1]:
            stream = out[deps[-1]].stream
        tails[stream] = i
        out.append(Scheduled(stream, tuple(j for j in deps if out[j].stream != stream)))
    return out
