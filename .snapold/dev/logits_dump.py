"""Bit-identity across a refactor: every GPU backend's logits, and inception-run's output files, on fixed inputs.

    python3 dev/logits_dump.py dump OUT.npz [--files DIR]   # on the GPU machine, once per tree (PYTHONPATH=TREE)
    python3 dev/logits_dump.py compare A.npz B.npz          # anywhere: identical bits, or where they differ

``dump`` runs the deterministic synthetic model (synthetic.synthetic_weights(0)) through each backend variant of
``VARIANTS`` that the tree has, in each precision, at batch 1 and 8, on fresh-but-seeded inputs, with the package's
tuning table (tune="cached": a fresh machine measures nothing, so two trees get the same kernels), and stores the
logits under ``variant/precision/batch``; a variant that cannot run stores its error. ``--files DIR`` also runs
inception-run (fp32, tf32, fp16; --decode cpu and gpu) over DIR's images into JSON-lines files and stores their bytes.
``compare`` says, per key, whether the two dumps hold the same bits.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

VARIANTS = ("cuda", "cuda-eager", "cuda-nchw", "cuda-unfused", "cuda-untuned", "cuda-direct", "cuda-model", "cudnn")
PRECISIONS = ("fp32", "tf32", "fp16")
BATCHES = (1, 8)


def dump_logits(out: dict[str, np.ndarray], variants: tuple[str, ...] = VARIANTS) -> None:
    from inception_engine import backends
    from inception_engine.plan import build_plan
    from inception_engine.synthetic import synthetic_weights

    weights = synthetic_weights(0)
    for name in variants:
        for precision in PRECISIONS:
            for batch in BATCHES:
                key = f"{name}/{precision}/{batch}"
                x = np.random.default_rng(batch).standard_normal((batch, 3, 299, 299)).astype(np.float32)
                try:
                    backend_name, options = backends.variant(name)
                    if "tune" in options or backend_name == "cuda":
                        options["tune"] = "cached"
                    backend = backends.backend_class(backend_name)(weights, build_plan(batch, weights.layers()),
                                                                   precision=precision, **options)
                    try:
                        out[key] = backend.forward(x)
                    finally:
                        backend.close()
                except Exception as e:  # recorded: a variant the tree lacks, a precision it refuses
                    out[key + "/error"] = np.array(f"{type(e).__name__}: {e}".splitlines()[0])
                print(key, "error" if key + "/error" in out else "ok", flush=True)


def dump_files(out: dict[str, np.ndarray], folder: Path) -> None:
    from inception_engine.synthetic import synthetic_weights
    from inception_engine.weights import save_weights

    with tempfile.TemporaryDirectory() as tmp:
        w = synthetic_weights(0)
        weights = save_weights(Path(tmp) / "synthetic.npz", w.arrays, w.manifest)
        for precision in PRECISIONS:
            for decode in ("cpu", "gpu"):
                target = Path(tmp) / f"{precision}-{decode}.jsonl"
                cmd = [sys.executable, "-c", "from inception_engine.cli import run_main; run_main()", str(folder),
                       "--weights", str(weights), "--precision", precision, "--decode", decode, "--output",
                       str(target)]
                done = subprocess.run(cmd, capture_output=True, text=True)
                key = f"run/{precision}/{decode}"
                out[key] = np.frombuffer(target.read_bytes() if target.exists() else b"", np.uint8)
                out[key + "/rc"] = np.array(done.returncode)
                print(key, done.returncode, done.stderr.strip().splitlines()[-1:], flush=True)


def compare(a: Path, b: Path) -> int:
    one, two = np.load(a), np.load(b)
    differ = 0
    for key in sorted(set(one.files) | set(two.files)):
        if key not in one.files or key not in two.files:
            print(f"{key}: only in {a if key in one.files else b}")
            differ += 1
            continue
        x, y = one[key], two[key]
        same = x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()
        if not same:
            differ += 1
            detail = (f"max |diff| {np.max(np.abs(x.astype(np.float64) - y)):.3g}"
                      if x.dtype.kind == "f" and x.shape == y.shape else f"{x!r} vs {y!r}"[:200])
            print(f"{key}: DIFFERENT ({detail})")
    print(f"{len(set(one.files) | set(two.files)) - differ} keys identical, {differ} different")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    d = sub.add_parser("dump", help="run every GPU variant and store its logits (GPU machine)")
    d.add_argument("out", type=Path)
    d.add_argument("--files", type=Path, help="also run inception-run over this folder's images")
    d.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: %(default)s")
    c = sub.add_parser("compare", help="compare two dumps bit for bit")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.verb == "compare":
        return compare(args.a, args.b)
    out: dict[str, np.ndarray] = {}
    dump_logits(out, tuple(v for v in args.variants.split(",") if v))
    if args.files:
        dump_files(out, args.files)
    np.savez(args.out, **out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
