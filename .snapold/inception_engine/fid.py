"""The arithmetic of the generative-model scores, in float64: FID (Heusel et al. 2017), KID (Binkowski et al. 2018)
and the Inception Score (Salimans et al. 2016), and the statistics files pytorch-fid writes.

FID = |mu1 - mu2|^2 + tr(S1) + tr(S2) - 2 tr sqrt(S1 S2). The trace of the matrix square root is taken from a
symmetric form: with S1 = R R^T, S1 S2 is similar to R^T S2 R (conjugate by R), which is symmetric positive
semi-definite, so tr sqrt(S1 S2) = sum of the square roots of its eigenvalues (numpy.linalg.eigvalsh, LAPACK's
syevd, values only). R is S1's Cholesky factor where S1 is positive definite (n^3 / 3 flops: the whole score about
7x faster than through S1's eigenvectors at 2048 dimensions, equal to 1e-16); where it is singular (fewer images
than 2048 dimensions) Cholesky fails and R is sqrt(S1) from S1's eigendecomposition (eigh), its eigenvalues that
should be 0 but come out as tiny +-1e-12 clipped to 0. No complex arithmetic, no iteration, no failure on singular
covariances; scipy.linalg.sqrtm, which pytorch-fid calls on the non-symmetric S1 S2, needs an eps * I retry when the
product is singular and discards an imaginary part it has to check. Both compute the same number: the tests check
this one against scipy's on synthetic features, positive definite and singular.

Statistics are accumulated as rows arrive (``RunningStats``: sums of the rows and of their outer products about a
fixed shift, the first rows' mean), so memory is the 2048 x 2048 float64 matrix whatever the number of images; the
covariance is the unbiased one (N - 1), as numpy.cov and pytorch-fid take it. A statistics file is pytorch-fid's
``.npz``: ``mu`` (2048,) and ``sigma`` (2048, 2048).
"""

from __future__ import annotations

import contextlib
import math
import zipfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_write
from .errors import EngineError

# KID: subsets as clean-fid's kernel_distance and torch-fidelity's kid take them by default: 100 subsets of
# min(1000, n1, n2) images of each side, drawn without replacement.
KID_SUBSETS, KID_SUBSET_SIZE = 100, 1000
IS_SPLITS = 10  # Salimans et al.'s, torch-fidelity's and every Inception Score table's


class RunningStats:
    """Mean and covariance of feature rows added a batch at a time, in float64.

    Kept as sums about a shift s, the first rows' mean: with y = x - s, sum(y) and sum(y y^T), and at the end
    mean = s + sum(y) / n and cov = (sum(y y^T) - n d d^T) / (n - 1), d = sum(y) / n. With s near the mean the final
    subtraction cancels little (float64 keeps ~13 digits of covariances of pool features; the test checks 1e-10
    against numpy.cov). Rows are gathered into blocks of ``block`` rows and each block's y^T y, the whole cost
    (2 * 2048^2 flops a row), is one matrix product (NumPy's BLAS, which releases the GIL) on a thread of its own, so
    that the caller, the forward's result loop, never waits for it: one block is filled while the last is summed.
    ``result`` waits for the last product and sums the rows left itself. ``blas``: a context each block's product
    runs in on that thread (the command gives
    backends.blas_threads.single_threaded_blas where decode worker processes hold every core: a multi-threaded
    OpenBLAS among them spins for cores it does not get and slows the decoders; one core sums ~10,000 rows/s, more
    than host decoding gives).
    """

    def __init__(self, block: int = 1024,
                 blas: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext):
        self.block, self.blas = block, blas
        self.count = 0
        self.shift: np.ndarray | None = None
        self.sum: np.ndarray | None = None
        self.m2: np.ndarray | None = None  # sum over rows of y y^T
        self._buffers: list[np.ndarray] = []
        self._filled = 0  # rows of self._buffers[0] filled
        self._pending: Future | None = None
        self._pool: ThreadPoolExecutor | None = None

    def add(self, rows: np.ndarray) -> None:
        x = np.asarray(rows)
        if len(x) == 0:
            return
        if self.shift is None:
            d = x.shape[1]
            self.shift = x.mean(axis=0, dtype=np.float64)
            self.sum, self.m2 = np.zeros(d), np.zeros((d, d))
            self._buffers = [np.empty((self.block, d)), np.empty((self.block, d))]
        while len(x):
            take = min(len(x), self.block - self._filled)
            np.subtract(x[:take], self.shift, out=self._buffers[0][self._filled:self._filled + take])
            self._filled += take
            self.count += take
            x = x[take:]
            if self._filled == self.block:
                self._submit()

    def _submit(self) -> None:
        """Sum the filled block on the thread, once the previous block's sum is done (one in flight, so the two
        buffers alternate and the sums are never written by two threads)."""
        y = self._buffers[0][:self._filled]
        self._wait()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="fid-stats")
        self._pending = self._pool.submit(self._accumulate, y, self.blas)
        self._buffers.reverse()
        self._filled = 0

    def _accumulate(self, y: np.ndarray, blas: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        assert self.sum is not None and self.m2 is not None
        self.sum += y.sum(axis=0)
        with blas():
            self.m2 += y.T @ y

    def _wait(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(mu, sigma); at least two rows are needed for a covariance. The rows not summed yet are summed here, on
        this thread with the BLAS's own threads: whoever held the cores while rows arrived is done by now."""
        if self.count < 2 or self.shift is None or self.sum is None or self.m2 is None:
            raise EngineError(f"the statistics need at least 2 images, got {self.count}")
        self._wait()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._filled:
            self._accumulate(self._buffers[0][:self._filled], contextlib.nullcontext)
            self._filled = 0
        d = self.sum / self.count
        return self.shift + d, (self.m2 - self.count * np.outer(d, d)) / (self.count - 1)


def covariance_root(sigma: np.ndarray) -> np.ndarray:
    """R with sigma = R R^T: Cholesky's lower factor where sigma is positive definite, else (singular) the symmetric
    square root from its eigendecomposition, its eigenvalues clipped at 0."""
    sigma = np.asarray(sigma, np.float64)
    try:
        return np.linalg.cholesky(sigma)
    except np.linalg.LinAlgError:
        w, v = np.linalg.eigh(sigma)
        return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def trace_sqrt_product(sigma1: np.ndarray, sigma2: np.ndarray, root1: np.ndarray | None = None) -> float:
    """tr sqrt(sigma1 sigma2) for symmetric positive semi-definite matrices, from the symmetric form (module doc);
    ``root1``: sigma1's covariance_root where it was computed already."""
    root1 = covariance_root(sigma1) if root1 is None else root1
    inner = root1.T @ np.asarray(sigma2, np.float64) @ root1
    eig = np.linalg.eigvalsh((inner + inner.T) / 2)  # symmetric up to rounding: make it exactly so
    return float(np.sqrt(np.clip(eig, 0, None)).sum())


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray,
                     root1: np.ndarray | None = None) -> float:
    """The Frechet distance of two Gaussians, float64; ``root1``: sigma1's covariance_root where it was computed
    already."""
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    sigma1, sigma2 = np.asarray(sigma1, np.float64), np.asarray(sigma2, np.float64)
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape or sigma1.shape != (len(mu1), len(mu1)):
        raise EngineError(f"the two statistics differ in shape: mu {mu1.shape} and {mu2.shape}, sigma {sigma1.shape} "
                          f"and {sigma2.shape}")
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * trace_sqrt_product(sigma1, sigma2, root1))


def kernel_inception_distance(feats1: np.ndarray, feats2: np.ndarray, subsets: int = KID_SUBSETS,
                              subset_size: int = KID_SUBSET_SIZE, seed: int = 0) -> tuple[float, float]:
    """KID's (mean, std) over ``subsets`` random subsets of m = min(subset_size, n1, n2) rows of each side: the
    unbiased MMD^2 estimator with the polynomial kernel k(x, y) = (x.y / d + 1)^3 (Binkowski et al. 2018). The
    subsets are drawn with numpy's generator seeded ``seed``, so the value is the tools' up to their own draws."""
    n1, n2, d = len(feats1), len(feats2), feats1.shape[1]
    m = min(subset_size, n1, n2)
    if m < 2:
        raise EngineError(f"KID needs at least 2 images on each side, got {n1} and {n2}")
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(subsets):
        x = np.asarray(feats1[np.sort(rng.choice(n1, m, replace=False))], np.float64)
        y = np.asarray(feats2[np.sort(rng.choice(n2, m, replace=False))], np.float64)
        kxx, kyy, kxy = ((a @ b.T / d + 1) ** 3 for a, b in ((x, x), (y, y), (x, y)))
        off = (kxx.sum() - np.trace(kxx) + kyy.sum() - np.trace(kyy)) / (m * (m - 1))
        values.append(off - 2 * kxy.mean())
    return float(np.mean(values)), float(np.std(values))


def inception_score(logits: np.ndarray, splits: int = IS_SPLITS) -> tuple[float, float]:
    """(mean, std) over ``splits`` consecutive parts of exp(E_x KL(p(y|x) || p(y))), p(y|x) the softmax of each
    row of logits and p(y) the part's mean (Salimans et al. 2016; parts in input order, as their code takes them)."""
    n = len(logits)
    if n < splits:
        raise EngineError(f"the Inception Score takes {splits} splits: it needs at least {splits} images, got {n}")
    scores = []
    for k in range(splits):
        z = np.asarray(logits[k * n // splits:(k + 1) * n // splits], np.float64)
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        p = np.exp(logp)
        logpy = np.log(p.mean(axis=0))
        scores.append(math.exp(float((p * (logp - logpy)).sum(axis=1).mean())))
    return float(np.mean(scores)), float(np.std(scores))


def load_stats(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(mu, sigma) of a statistics file as pytorch-fid writes it (``np.savez(path, mu=..., sigma=...)``)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            if "mu" not in f or "sigma" not in f:
                raise EngineError(f"{path}: a statistics file holds the arrays mu and sigma (pytorch-fid's "
                                  f"format); this one has {', '.join(sorted(f.files)) or 'none'}")
            mu, sigma = np.asarray(f["mu"], np.float64), np.asarray(f["sigma"], np.float64)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise EngineError(f"{path}: not a readable .npz of statistics ({e})") from None
    if mu.ndim != 1 or sigma.shape != (len(mu), len(mu)):
        raise EngineError(f"{path}: mu {mu.shape} and sigma {sigma.shape} are not a mean and its covariance")
    if not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
        raise EngineError(f"{path}: the statistics hold NaN or Inf values")
    return mu, sigma


def save_stats(path: str | Path, mu: np.ndarray, sigma: np.ndarray) -> Path:
    """Writes ``mu`` and ``sigma`` (float64) as pytorch-fid's statistics file, atomically."""
    return atomic_write(path, lambda f: np.savez(f, mu=np.asarray(mu, np.float64),
                                                 sigma=np.asarray(sigma, np.float64)))
