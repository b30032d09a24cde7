"""Where --decode gpu spends its time: the host's header check, nvImageCodec's decode per backend, the resize.

    python scripts/profile_gpu_decode.py DIR [--images 1024] [--batch 128]
    python scripts/profile_gpu_decode.py --cprofile DIR [--images 4096] [--batch 128]


Each stage is timed alone on the same files (already in memory), synchronised, as images/s: the slowest stage is the
pipeline's ceiling. nvImageCodec's backends: its default choice, the H100's hardware JPEG engines (HW_GPU_ONLY), CUDA
(GPU_ONLY) and CPU Huffman + GPU IDCT (HYBRID_CPU_GPU); a backend this GPU or build lacks reads "unavailable".

--cprofile instead runs the whole `--decode gpu` pipeline (Engine.predict_iter, tf32, synthetic weights) under
cProfile and prints its rate and the main thread's 30 costliest functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inception_engine.backends.cuda import jpeg_decode  # noqa: E402
from inception_engine.backends.cuda.device import Gpu, driver  # noqa: E402
from inception_engine.backends.cuda.kernels import Kernels  # noqa: E402
from inception_engine.images import Preprocess, decode_u8  # noqa: E402


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:8.0f} images/s"


def profile_pipeline(paths: list[Path], batch: int) -> None:
    from inception_engine.engine import Engine
    from inception_engine.synthetic import synthetic_weights
    from inception_engine.weights import save_weights

    with tempfile.TemporaryDirectory() as tmp:
        w = synthetic_weights(0)
        weights = str(save_weights(Path(tmp) / "synthetic.npz", w.arrays, w.manifest))
        files = [str(p) for p in paths]
        with Engine(weights, backend="cuda", batch_size=batch, precision="tf32", decode="gpu") as engine:
            sum(1 for _ in engine.predict_iter(files[:2 * batch]))  # untimed: kernels, graph, decoder
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            n = sum(1 for p in engine.predict_iter(files) if p.ok)
            prof.disable()
            print(f"--decode gpu pipeline under cProfile, tf32, batch {batch}: {rate(n, time.perf_counter() - t0)}")
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--images", type=int, help="default: 1,024; with --cprofile every file")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--cprofile", action="store_true", help="profile the whole pipeline instead of its stages")
    args = ap.parse_args()
    paths = sorted(p for p in Path(args.dir).iterdir() if p.suffix.lower() in (".jpg", ".jpeg"))
    if args.cprofile:
        profile_pipeline(paths[:args.images], args.batch)
        return
    paths = paths[:args.images or 1024]
    items = [(str(p), p.read_bytes()) for p in paths]
    batches = [items[i:i + args.batch] for i in range(0, len(items), args.batch)]
    pre = Preprocess()
    t0 = time.perf_counter()
    for path, data in items:
        jpeg_decode.gpu_eligible(path, data)
    print(f"header check (one thread)           {rate(len(items), time.perf_counter() - t0)}")
    gpu = Gpu()
    with gpu:
        drv = driver()
        kernels = Kernels(gpu.arch)
        stream = drv.Stream(1)
        dst = drv.mem_alloc(args.batch * pre.size * pre.size * 3)
        for backends in (None, ("HW_GPU_ONLY",), ("GPU_ONLY",), ("HYBRID_CPU_GPU",)):
            name = "default" if backends is None else backends[0]
            try:
                dec = jpeg_decode.GpuJpegDecoder(kernels, pre, args.batch, backends=backends)
                dec._decode([b for _, b in batches[0]], stream)  # warm-up
                stream.synchronize()
                t0 = time.perf_counter()
                for batch in batches:
                    dec._decode([b for _, b in batch], stream)
                stream.synchronize()
                t_decode = time.perf_counter() - t0
                t0 = time.perf_counter()
                fallbacks = 0
                for batch in batches:
                    errors = dec.decode_into(batch, int(dst), stream, lambda p, d: decode_u8(p, pre))
                    fallbacks += sum(e is not None for e in errors)
                stream.synchronize()
                t_all = time.perf_counter() - t0
                dec.close()
                print(f"nvImageCodec {name:15} decode {rate(len(items), t_decode)}, decode_into (header, decode, "
                      f"resize) {rate(len(items), t_all)}, {fallbacks} errors")
            except Exception as e:  # a backend this GPU or build does not have
                print(f"nvImageCodec {name:15} unavailable ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
        dst.free()
    gpu.release()


if __name__ == "__main__":
    main()
