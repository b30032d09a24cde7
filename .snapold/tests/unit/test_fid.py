"""fid.py: statistics, the Frechet distance against SciPy's sqrtm (pytorch-fid's computation), KID and IS."""

from __future__ import annotations

import numpy as np
import pytest

from inception_engine.errors import EngineError
from inception_engine.fid import (RunningStats, covariance_root, frechet_distance, inception_score,
                                  kernel_inception_distance, load_stats, save_stats, trace_sqrt_product)

linalg = pytest.importorskip("scipy.linalg")


def pytorch_fid_distance(mu1, sigma1, mu2, sigma2, eps=1e-6) -> float:
    """pytorch-fid's calculate_frechet_distance, written from its description: sqrtm of the product, an eps * I
    retry where the result is not finite, the real part after checking the imaginary one is negligible."""
    diff = mu1 - mu2
    covmean = linalg.sqrtm(sigma1 @ sigma2)
    if not np.isfinite(covmean).all():
        offset = np.eye(len(mu1)) * eps
        covmean = linalg.sqrtm((sigma1 + offset) @ (sigma2 + offset))
    if np.iscomplexobj(covmean):
        assert np.allclose(np.diagonal(covmean).imag, 0, atol=1e-3)
        covmean = covmean.real
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean))


def features(n: int, d: int, seed: int, shift: float = 0.0) -> np.ndarray:
    """Pool-feature-like rows: non-negative, correlated, about 0.1..1."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((d, d)) / np.sqrt(d)
    return np.abs(rng.standard_normal((n, d)) @ mix * 0.3 + 0.5 + shift).astype(np.float32)


def test_running_stats_in_batches_are_numpys_mean_and_cov():
    x = features(1000, 32, 0)
    stats = RunningStats()
    for part in np.array_split(x, [1, 7, 300, 301, 999]):
        stats.add(part)
    mu, sigma = stats.result()
    np.testing.assert_allclose(mu, x.astype(np.float64).mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(sigma, np.cov(x.astype(np.float64), rowvar=False), rtol=1e-10, atol=1e-14)
    with pytest.raises(EngineError, match="at least 2"):
        RunningStats().result()


def test_running_stats_sum_the_rows_left_with_the_blas_as_it_is():
    """Full blocks are summed on the statistics thread inside the ``blas`` context (one BLAS thread while decode
    processes hold the cores); the rows left at ``result`` on the caller's thread outside it, once those are done."""
    import threading

    entered: list[str] = []

    class Recorded:
        def __enter__(self) -> None:
            entered.append(threading.current_thread().name)

        def __exit__(self, *exc: object) -> None:
            pass

    x = features(2 * 64 + 10, 16, 3)
    stats = RunningStats(block=64, blas=Recorded)
    for part in np.array_split(x, 9):
        stats.add(part)
    mu, sigma = stats.result()
    assert len(entered) == 2 and all(name.startswith("fid-stats") for name in entered)
    np.testing.assert_allclose(sigma, np.cov(x.astype(np.float64), rowvar=False), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(mu, x.astype(np.float64).mean(axis=0), rtol=1e-12)


@pytest.mark.parametrize("n", [300, 40])  # positive definite (Cholesky), singular (the symmetric root)
def test_covariance_root_factors_and_serves_the_distance(n):
    a, b = features(n, 64, 4), features(n, 64, 5, shift=0.05)
    (mu1, s1), (mu2, s2) = ((x.astype(np.float64).mean(0), np.cov(x.astype(np.float64), rowvar=False)) for x in (a, b))
    r = covariance_root(s1)
    np.testing.assert_allclose(r @ r.T, s1, rtol=0, atol=1e-12 * np.abs(s1).max())
    assert frechet_distance(mu1, s1, mu2, s2, r) == frechet_distance(mu1, s1, mu2, s2)
    # symmetric: factoring the other side gives the same distance, to rounding where both are positive definite, to
    # the noise of the zero eigenvalues (~1e-9) where they are singular
    rel = 1e-12 if n > 64 else 1e-8
    assert frechet_distance(mu2, s2, mu1, s1) == pytest.approx(frechet_distance(mu1, s1, mu2, s2), rel=rel)


# full rank; singular (fewer images than dimensions); the pool features' 2048 dimensions (scipy's sqrtm ~8 s there;
# the two agreed to 4e-15 relative when written)
@pytest.mark.parametrize("n,d", [(2000, 512), (100, 256), pytest.param(3000, 2048, marks=pytest.mark.slow)])
def test_frechet_distance_agrees_with_scipys_sqrtm(n, d):
    a, b = features(n, d, 1), features(n, d, 2, shift=0.05)
    (mu1, s1), (mu2, s2) = ((x.astype(np.float64).mean(0), np.cov(x.astype(np.float64), rowvar=False)) for x in (a, b))
    got, want = frechet_distance(mu1, s1, mu2, s2), pytorch_fid_distance(mu1, s1, mu2, s2)
    assert got > 0 and abs(got - want) <= 1e-6 * abs(want), (got, want)
    # a distribution from itself: 0, up to the square roots of rounding noise in the zero eigenvalues (singular)
    assert abs(frechet_distance(mu1, s1, mu1, s1)) < 1e-6 * np.trace(s1)


def test_trace_sqrt_product_hand_computed():
    # diagonal: tr sqrt(diag(a) diag(b)) = sum sqrt(a_i b_i)
    assert trace_sqrt_product(np.diag([4.0, 9.0, 0.0]), np.diag([1.0, 4.0, 5.0])) == pytest.approx(2 + 6)  # singular
    assert trace_sqrt_product(np.diag([4.0, 9.0, 1.0]), np.diag([1.0, 4.0, 5.0])) == pytest.approx(8 + 5 ** 0.5)
    # 1-d Gaussians: (m1 - m2)^2 + (s1 - s2)^2
    assert frechet_distance(np.array([1.0]), np.array([[4.0]]), np.array([3.0]), np.array([[9.0]])) == \
        pytest.approx(4 + 1)


def unbiased_mmd2(x: np.ndarray, y: np.ndarray) -> float:
    """Binkowski et al.'s unbiased MMD^2 with the cubic polynomial kernel, as explicit sums over pairs."""
    d = x.shape[1]

    def k(a, b):
        return (float(a @ b) / d + 1) ** 3
    m = len(x)
    xx = sum(k(x[i], x[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    yy = sum(k(y[i], y[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    xy = sum(k(x[i], y[j]) for i in range(m) for j in range(m)) / (m * m)
    return xx + yy - 2 * xy


def test_kid_is_the_unbiased_polynomial_mmd():
    x, y = features(12, 5, 3).astype(np.float64), features(12, 5, 4, shift=0.2).astype(np.float64)
    mean, std = kernel_inception_distance(x, y, subsets=3, subset_size=12)  # every subset is all of both sides
    assert mean == pytest.approx(unbiased_mmd2(x, y), rel=1e-10) and std == pytest.approx(0, abs=1e-12)
    same, _ = kernel_inception_distance(features(3000, 16, 5), features(3000, 16, 6), subsets=20)
    apart, _ = kernel_inception_distance(features(3000, 16, 5), features(3000, 16, 6, shift=0.3), subsets=20)
    assert abs(same) < 0.1 * apart and apart > 0


def test_inception_score_hand_computed():
    assert inception_score(np.zeros((20, 7)))[0] == pytest.approx(1.0)  # every p(y|x) uniform: IS 1
    confident = np.full((40, 4), -1e3)
    confident[np.arange(40), np.arange(40) % 4] = 0  # one sure class per image, each split holding all four
    mean, std = inception_score(confident)
    assert mean == pytest.approx(4.0) and std == pytest.approx(0, abs=1e-9)
    with pytest.raises(EngineError, match="at least 10"):
        inception_score(np.zeros((5, 3)))


def test_stats_files_round_trip_as_pytorch_fid_writes_them(tmp_path):
    mu, sigma = np.arange(3.0), np.eye(3) * 2
    save_stats(tmp_path / "s.npz", mu, sigma)
    got = load_stats(tmp_path / "s.npz")
    np.testing.assert_array_equal(got[0], mu) and np.testing.assert_array_equal(got[1], sigma)
    np.savez(tmp_path / "theirs.npz", mu=mu.astype(np.float32), sigma=sigma)  # pytorch-fid's own call
    assert load_stats(tmp_path / "theirs.npz")[0].dtype == np.float64
    np.savez(tmp_path / "other.npz", m=mu)
    with pytest.raises(EngineError, match="mu and sigma"):
        load_stats(tmp_path / "other.npz")
    (tmp_path / "bad.npz").write_text("no")
    with pytest.raises(EngineError, match="not a readable"):
        load_stats(tmp_path / "bad.npz")
