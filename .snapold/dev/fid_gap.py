"""Where our FID and pytorch-fid's part: in the features (the forward, the decode, the resize) or in the arithmetic
(statistics, the matrix square root). bench_fid.py's folders and random FID weights; both tools' statistics of both
folders saved (``inception-fid --save-stats``, pytorch-fid's own ``--save-stats`` through bench_fid's shim, TF32 off
unless --tf32), then each pair of statistics scored by both FID formulas (ours: fid.frechet_distance; pytorch-fid's
calculate_frechet_distance, scipy.linalg.sqrtm), and the statistics compared. ``--float64``: the referee, pytorch-fid's
own modules (its resize included) run in float64 on the same device, its FID beside each tool's.

    python3 dev/fid_gap.py [--images 20000] [--ref-images 5000] [--format jpeg] [--precision fp32] [--decode cpu]
                           [--float64]

On the GPU machine, after ``source dev/gpu_machine/fid_kit.sh install``. Prints one line per comparison.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "dev")]

import bench_fid  # noqa: E402


def stats_ours(folder: Path, out: Path, weights: Path, precision: str, decode: str) -> float:
    t0 = time.perf_counter()
    argv = [sys.executable, "-c", bench_fid.FID_CLI, str(folder), "--save-stats", str(out), "--weights", str(weights),
            "--precision", precision, "--decode", decode]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"inception-fid failed ({r.returncode}): {r.stderr[-2000:]}")
    for line in r.stderr.splitlines():
        if line.startswith("note:"):
            print(f"  {line}")
    return time.perf_counter() - t0


def stats_pytorch_fid(folder: Path, out: Path, state_dict: Path, tf32: bool, device: str) -> float:
    t0 = time.perf_counter()
    argv = [sys.executable, "-c", bench_fid.PYTORCH_FID_SHIM, "--save-stats", str(folder), str(out), "--device", device]
    r = subprocess.run(argv, capture_output=True, text=True, env=bench_fid.pytorch_fid_env(state_dict, not tf32))
    if r.returncode != 0:
        raise SystemExit(f"pytorch-fid failed ({r.returncode}): {r.stderr[-2000:]}")
    return time.perf_counter() - t0


def stats_float64(folder: Path, state_dict: Path, device: str, workers: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """pytorch-fid's network with the random state dict, in float64 (weights, resize, every layer), over the
    folder's images as pytorch-fid reads them: (mu, sigma) as it computes them."""
    import torch
    import torchvision.transforms.functional as TF
    from pytorch_fid import inception as inc
    from pytorch_fid.fid_score import IMAGE_EXTENSIONS, ImagePathDataset

    inc.load_state_dict_from_url = lambda *a, **k: torch.load(state_dict, map_location="cpu", weights_only=True)
    model = inc.InceptionV3([inc.InceptionV3.BLOCK_INDEX_BY_DIM[2048]]).double().to(device).eval()
    files = sorted(str(p) for p in folder.iterdir() if p.suffix.lower().lstrip(".") in IMAGE_EXTENSIONS)
    loader = torch.utils.data.DataLoader(ImagePathDataset(files, transforms=TF.to_tensor), batch_size=50,
                                         num_workers=workers)
    rows = []
    with torch.no_grad():
        for batch in loader:
            rows.append(model(batch.double().to(device))[0].squeeze(3).squeeze(2).cpu().numpy())
    act = np.concatenate(rows)
    return act.mean(axis=0), np.cov(act, rowvar=False)


def trace_sqrt_forms(s1: np.ndarray, s2: np.ndarray) -> dict[str, float]:
    """tr sqrt(S1 S2) computed four ways, equal in exact arithmetic: their spread is the arithmetic's error."""
    from scipy import linalg

    from inception_engine import fid

    root = linalg.sqrtm(s1 @ s2)
    root = root[0] if isinstance(root, tuple) else root
    eig = np.linalg.eigvals(s1 @ s2)
    return {"ours (S1's Cholesky, eigvalsh)": fid.trace_sqrt_product(s1, s2),
            "ours with S1 and S2 swapped": fid.trace_sqrt_product(s2, s1),
            "eigvals of S1 S2 (general), sqrt of re": float(np.sqrt(np.clip(eig.real, 0, None)).sum()),
            "scipy.linalg.sqrtm (pytorch-fid's)": float(np.trace(root).real)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--ref-images", type=int, default=5000)
    ap.add_argument("--format", choices=["png", "jpeg"], default="jpeg")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--decode", default="cpu")
    ap.add_argument("--device", default="cuda", help="pytorch-fid's --device")
    ap.add_argument("--float64", action="store_true", help="also pytorch-fid's modules in float64, the referee")
    ap.add_argument("--tf32", action="store_true", help="pytorch-fid with its default TF32 convolutions")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-fid-work"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    gen = bench_fid.image_folder(args.work, "gen", args.images, args.format, 0, 1.0)
    ref = bench_fid.image_folder(args.work, "ref", args.ref_images, args.format, 10_000_000, 1.15)
    state_dict, weights = bench_fid.random_weights(args.work, 0)

    from pytorch_fid import fid_score

    sys.path.insert(0, str(ROOT / "scripts"))
    from export_pytorch_fid_onnx import pytorch_fid_on_this_scipy

    from inception_engine import fid

    pytorch_fid_on_this_scipy()
    stats = {}
    for name, folder in (("gen", gen), ("ref", ref)):
        ours, theirs = args.work / f"gap-ours-{name}.npz", args.work / f"gap-torch-{name}.npz"
        ours.unlink(missing_ok=True)
        theirs.unlink(missing_ok=True)  # pytorch-fid refuses to overwrite
        t_ours = stats_ours(folder, ours, weights, args.precision, args.decode)
        t_theirs = stats_pytorch_fid(folder, theirs, state_dict, args.tf32, args.device)
        print(f"{name}: statistics in {t_ours:.1f} s (ours) and {t_theirs:.1f} s (pytorch-fid)", flush=True)
        stats[name] = fid.load_stats(ours), fid.load_stats(theirs)
        (mu_o, s_o), (mu_t, s_t) = stats[name]
        print(f"  mu: max |ours - theirs| {np.abs(mu_o - mu_t).max():.3e} (max |mu| {np.abs(mu_t).max():.3e}); "
              f"sigma: |ours - theirs|_F / |theirs|_F {np.linalg.norm(s_o - s_t) / np.linalg.norm(s_t):.3e}")
    pairs = {"ours/ours": (stats["gen"][0], stats["ref"][0]), "torch/torch": (stats["gen"][1], stats["ref"][1]),
             "ours-gen/torch-ref": (stats["gen"][0], stats["ref"][1]),
             "torch-gen/ours-ref": (stats["gen"][1], stats["ref"][0])}
    ours_formula = {label: fid.frechet_distance(*a, *b) for label, (a, b) in pairs.items()}
    if args.float64:
        t0 = time.perf_counter()
        f64 = [stats_float64(folder, state_dict, args.device) for folder in (gen, ref)]
        referee = fid.frechet_distance(*f64[0], *f64[1])
        print(f"float64 (pytorch-fid's modules, {time.perf_counter() - t0:.1f} s): FID {referee:.10f}")
        for label, i in (("ours", 0), ("pytorch-fid", 1)):
            got = ours_formula[("ours/ours", "torch/torch")[i]]
            print(f"  {label:12} FID {got:.10f}  rel. to float64 {abs(got - referee) / referee:.2e}")
            for name, k in (("gen", 0), ("ref", 1)):
                (mu, sigma), (mu64, sigma64) = stats[name][i], f64[k]
                print(f"    {name}: mu max |d| {np.abs(mu - mu64).max():.3e}, sigma |d|_F / |S|_F "
                      f"{np.linalg.norm(sigma - sigma64) / np.linalg.norm(sigma64):.3e}")
    theirs_formula = {}
    for label, ((mu1, s1), (mu2, s2)) in pairs.items():
        a, b = ours_formula[label], float(fid_score.calculate_frechet_distance(mu1, s1, mu2, s2))
        theirs_formula[label] = b
        print(f"{label:20} FID ours {a:.8f}  pytorch-fid's formula {b:.8f}  rel {abs(a - b) / b:.2e}", flush=True)
    (mu1, s1), (mu2, s2) = stats["gen"][1], stats["ref"][1]
    print(f"torch/torch terms: |mu1 - mu2|^2 {float((mu1 - mu2) @ (mu1 - mu2)):.6f}, tr S1 + tr S2 "
          f"{float(np.trace(s1) + np.trace(s2)):.6f}; tr sqrt(S1 S2) by:")
    for label, value in trace_sqrt_forms(s1, s2).items():
        print(f"  {label:40} {value:.10f}")
    ref_fid = theirs_formula["torch/torch"]  # pytorch-fid end to end: its statistics, its formula
    for label, a in ours_formula.items():
        print(f"{label:20} our formula vs pytorch-fid end to end: rel {abs(a - ref_fid) / ref_fid:.2e}")


if __name__ == "__main__":
    main()
