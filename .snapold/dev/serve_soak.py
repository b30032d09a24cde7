"""A soak of inception-serve (``dev/bench_serve.py --soak SECONDS``): an open loop at a fixed rate (``--rate``
requests/s, or ``--soak-load`` of the saturated rate, measured first with a closed loop of ``--soak-concurrency``
after as long a closed loop to warm the server), for SECONDS, while the server's memory is sampled every
``--sample-every`` seconds: the resident memory of its processes (the command's process and every one below it:
front-ends, device processes; RSS summed, and PSS, which counts shared pages once) and the GPUs' used memory
(nvidia-smi, where there is one). Then: failed requests (the first messages), the memory's trend (the mean of the
first window against the last, a window being a minute or a fifth of the soak, whichever is shorter; and the
least-squares slope after the first window) and a verdict:

    PASS where no request failed, the host's memory grew by at most max(64 MiB, 5 %) and the GPUs' by at most
    32 MiB between the first window and the last.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

HOST_SLACK_MIB, HOST_SLACK_SHARE, GPU_SLACK_MIB = 64.0, 0.05, 32.0


def host_memory(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MiB of ``pid`` and every process below it; PSS 0 where smaps_rollup cannot be read."""
    from bench_serve import process_tree

    rss = pss = 0.0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) / 1024
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) / 1024
        except OSError:  # it ended meanwhile, or smaps_rollup is not ours to read
            continue
    return rss, pss


def gpu_memory() -> float | None:
    """MiB used on all GPUs together (nvidia-smi), None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return sum(float(v) for v in out.stdout.split())


def server_answers(url: str) -> tuple[int, int] | None:
    """(infer requests answered, of which errors) so far, from the server's /metrics; None where it does not answer."""
    from bench_serve import metric_families

    try:
        families = metric_families(url)
    except OSError:
        return None
    counts = {"inception_requests": 0.0, "inception_request_failures": 0.0}
    for family in families:
        for sample in family.samples:
            if sample.name.removesuffix("_total") in counts and sample.labels.get("route") == "infer":
                counts[sample.name.removesuffix("_total")] += sample.value
    return int(counts["inception_requests"]), int(counts["inception_request_failures"])


class Sampler(threading.Thread):
    """Samples (seconds since start, RSS, PSS, GPU MiB) every ``every`` seconds until ``stop``, and prints each with
    the server's count of answered and failed requests so far (its /metrics): a soak cut short before its report
    still says whether the server failed any request, and whether it kept up with the rate."""

    def __init__(self, pid: int, every: float, url: str):
        super().__init__(daemon=True)
        self.pid, self.every, self.url = pid, every, url
        self.samples: list[tuple[float, float, float, float | None]] = []
        self.done = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        before = server_answers(self.url)
        while not self.done.is_set():
            rss, pss = host_memory(self.pid)
            t = time.monotonic() - self.t0
            self.samples.append((t, rss, pss, gpu_memory()))
            gpu = self.samples[-1][3]
            now = server_answers(self.url)
            answers = (f"; server: {now[0] - before[0]} requests answered, {now[1] - before[1]} failed"
                       if now is not None and before is not None else "")
            print(f"soak {t:7.1f} s: host RSS {rss:8.1f} MiB, PSS {pss:8.1f} MiB"
                  + (f", GPU {gpu:8.1f} MiB" if gpu is not None else "") + answers, flush=True)
            self.done.wait(self.every)

    def stop(self) -> list[tuple[float, float, float, float | None]]:
        self.done.set()
        self.join()
        return self.samples


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB a minute (0 with fewer than two)."""
    if len(points) < 2:
        return 0.0
    mt = statistics.fmean(t for t, _ in points)
    mv = statistics.fmean(v for _, v in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return 60 * sum((t - mt) * (v - mv) for t, v in points) / den if den else 0.0


def trend(samples: list[tuple[float, ...]], column: int, seconds: float) -> dict[str, float] | None:
    """first- and last-window means, their difference and the slope after the first window, of one column."""
    window = min(60.0, seconds / 5)
    points = [(s[0], s[column]) for s in samples if s[column] is not None]
    if not points:
        return None
    end = points[-1][0]
    first = [v for t, v in points if t <= window] or [points[0][1]]
    last = [v for t, v in points if t >= end - window] or [points[-1][1]]
    after = [(t, v) for t, v in points if t > window]
    a, b = statistics.fmean(first), statistics.fmean(last)
    return {"first": round(a, 1), "last": round(b, 1), "growth": round(b - a, 1),
            "slope_mib_min": round(slope_per_minute(after), 2)}


def soak(args: argparse.Namespace, pid: int, url: str, files: list[Path]) -> dict[str, Any]:
    """The soak against the server ``pid`` at ``url``: its report (also printed), with ``verdict``."""
    from bench_serve import load_point

    size = args.sizes[-1]
    rate = args.rate
    if not rate:
        # load first, then probe: on a server fresh from its warm-up the probe measured 7,806 images/s where the
        # sweep's same row, after ~15 s of other rows, measured 11,595 (H100, 2026-12-06)
        load_point("inception", url, files, size, "closed", args.soak_concurrency, args.seconds, args.client_procs)
        probe = load_point("inception", url, files, size, "closed", args.soak_concurrency, args.seconds,
                           args.client_procs)
        rate = args.soak_load * probe["requests_s"]
        print(f"soak: saturated at {probe['images_s']} images/s ({probe['requests_s']} requests/s of {size} images, "
              f"c={args.soak_concurrency}); the soak runs at {rate:.1f} requests/s "
              f"({args.soak_load:.0%})", flush=True)
    sampler = Sampler(pid, args.sample_every, url)
    sampler.start()
    row = load_point("inception", url, files, size, "open", rate, args.soak, args.client_procs)
    samples = sampler.stop()
    host, pss = trend(samples, 1, args.soak), trend(samples, 2, args.soak)
    gpu = trend(samples, 3, args.soak)
    host_ok = host is not None and host["growth"] <= max(HOST_SLACK_MIB, HOST_SLACK_SHARE * host["first"])
    gpu_ok = gpu is None or gpu["growth"] <= GPU_SLACK_MIB
    verdict = "PASS" if row["failed"] == 0 and host_ok and gpu_ok else "FAIL"
    report = {"rate_requests_s": round(rate, 2), "size": size, "seconds": args.soak, **row, "host_rss": host,
              "host_pss": pss, "gpu": gpu, "samples": samples, "verdict": verdict}
    print(f"soak: {row['images_s']} images/s at {rate:.1f} requests/s for {row['seconds']} s, p50 {row['p50_ms']} "
          f"ms, p99 {row['p99_ms']} ms, failed requests {row['failed']}"
          + "".join(f"\n  {e}" for e in row.get("errors", [])), flush=True)
    for name, t in (("host RSS", host), ("host PSS", pss), ("GPU", gpu)):
        if t is not None:
            print(f"  {name}: first window {t['first']} MiB, last {t['last']} MiB, growth {t['growth']} MiB, "
                  f"slope {t['slope_mib_min']} MiB/min", flush=True)
    print(f"soak verdict: {verdict} (no failed request; growth at most max({HOST_SLACK_MIB:g} MiB, "
          f"{HOST_SLACK_SHARE:.0%}) on the host, {GPU_SLACK_MIB:g} MiB on the GPUs)", flush=True)
    return report


def soak_command(args: argparse.Namespace, files: list[Path], report: dict[str, Any]) -> None:
    """``bench_serve.py --soak``: one server (the last of --http-workers) soaked, stopped; exit 1 where the verdict
    is FAIL or the server did not stop with 0."""
    import json

    from bench_serve import start_inception

    proc, url = start_inception(args, http_workers=args.http_workers[-1],
                                decode_images=args.decode_images[-1] if args.decode_images else None)
    try:
        report["soak"] = soak(args, proc.pid, url, files)
    finally:
        proc.terminate()
        code = proc.wait(timeout=120)
        print(f"inception-serve exit code {code}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")
    if report["soak"]["verdict"] != "PASS" or code != 0:
        raise SystemExit(1)


if __name__ == "__main__":  # a module of bench_serve.py: run as a script, it only says so
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                            epilog="Run it through dev/bench_serve.py --soak SECONDS.").parse_args()
    raise SystemExit("dev/serve_soak.py is bench_serve.py's soak: run dev/bench_serve.py --soak SECONDS")
