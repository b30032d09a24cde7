"""What the FID's distance costs on this machine: fid.trace_sqrt_product on two full-rank 2048-dimensional
covariances (statistics of more images than dimensions, as a real job's), and each of its parts, with OpenBLAS at its
default thread count and at one thread (backends.blas_threads), best of ``--repeat``.

    python3 dev/fid_distance_cost.py [--repeat 3] [--dims 2048]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from inception_engine.backends.blas_threads import openblas_threads, single_threaded_blas
from inception_engine.fid import trace_sqrt_product


def covariance(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """A full-rank covariance with a few strong directions, as pool features have."""
    x = rng.standard_normal((n, 256)) @ rng.standard_normal((256, d)) + 0.1 * rng.standard_normal((n, d))
    return np.cov(x, rowvar=False)


def best(f: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dims", type=int, default=2048)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    s1, s2 = covariance(rng, 2 * args.dims + 1000, args.dims), covariance(rng, 2 * args.dims, args.dims)
    r1 = np.linalg.cholesky(s1)
    inner = r1.T @ s2 @ r1
    parts = {
        "cholesky(S1)": lambda: np.linalg.cholesky(s1),
        "R^T S2 R (two products)": lambda: r1.T @ s2 @ r1,
        "eigvalsh(R^T S2 R)": lambda: np.linalg.eigvalsh(inner),
        "trace_sqrt_product, whole": lambda: trace_sqrt_product(s1, s2),
    }
    control = openblas_threads()
    threads = control[0]() if control else None
    print(f"numpy {np.__version__}; OpenBLAS threads: {threads if threads is not None else 'not controllable'}")
    for name, f in parts.items():
        row = f"{name:28s} {best(f, args.repeat):7.3f} s"
        if control is not None:
            with single_threaded_blas():
                row += f"   one thread {best(f, args.repeat):7.3f} s"
        print(row)


if __name__ == "__main__":
    main()
