"""What a user classifying a folder sees, every figure of issues 35 and 39 from one run on a GPU machine.

    python dev/bench_folder.py [--images 16384] [--gpus 1,2,4] [--precisions fp16,tf32] [--json out.json]

Rows (each ``inception-run`` a fresh process, as a user runs it; its own images/s line, and the wall time from
start to exit):
- first answer: ``inception-run ONE.jpg`` per precision, the first runs after the install (kernels built at
  install, no tuning cache: the shipped table or the cost model);
- the decoders alone on the same files: nvImageCodec's batched decode, ``GpuJpegDecoder.decode_into`` (header,
  decode, resize) and ``decode_files`` (jpeg_batch.c) at a decode call's size, and Pillow's exact decode on one
  core (x the cores) and on every core at once without the pipeline (the CPU ceiling);
- the folder job per decode mode and precision, ``--decode gpu`` at each of ``--batches``, and (``--ab``, at
  batch 64) the variants named there too, alternated twice: ``python-api`` (nvImageCodec's Python API,
  jpeg_decode.NATIVE off), ``one-chain`` / ``two-chains`` (decode calls in flight), ``one-chain-two-batches``
  (and two batches outstanding on the GPU: the pipeline's earlier shape), ``calls-of-1024`` (decode calls of 1,024
  files);
- ``--first-long``: per precision and batch, a first run on a cache as the install leaves it, then the same
  again (the first long run's share of a repeated run's rate);
- ``--gpus N`` for each N of ``--gpus`` up to the machine's GPUs, wall time including start-up, on ``--many``
  images (the folder's files linked ``--many / --images`` times); with ``--decode gpu``, first the decoders of N
  processes started and run side by side, one a GPU (``decoders_at_once``: each one's start, each one's rate),
  and beside each run the most ``--gpus N`` can gain with those decoders (``speedup_limit``);
- the PyTorch DataLoader script (workers = cores) on the same files (torch from the machine; skipped without it);
on a folder of small JPEGs (~35 KB, 500x375), one of ImageNet-sized ones (~95 KB) and one of small ones half of which
are stored on their side with EXIF orientation 6 (as phones store photos), all generated and cached.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RUN = "from inception_engine.cli import run_main; run_main()"
PYTHON_API = "import inception_engine.ingest.jpeg_decode as j; j.NATIVE = False; " + RUN
ONE_CHAIN = "import inception_engine.ingest.jpeg_decode as j; j.DECODE_CHAINS = 1; "
TWO_CHAINS = "import inception_engine.ingest.jpeg_decode as j; j.DECODE_CHAINS = 2; "
# the pipeline's shape before decode chains: one decode call in flight, two batches outstanding on the GPU
TWO_BATCHES = ("import inception_engine.cuda_runner as s; init = s.CudaRunner.__init__; "
               "s.CudaRunner.__init__ = lambda self, *a, **k: (init(self, *a, **k), setattr(self, 'depth', 2))[0]; ")
# decode calls of 1,024 files instead of images.DECODE_IMAGES (256): one decoder alone +22 % (dev/performance-log.md,
# round five, call AC), not yet measured in inception-run
BIG_CALLS = "import inception_engine.ingest.images as s; s.DECODE_IMAGES = 1024; "
VARIANTS = {"python-api": PYTHON_API, "one-chain": ONE_CHAIN + RUN, "two-chains": TWO_CHAINS + RUN,
            "one-chain-two-batches": ONE_CHAIN + TWO_BATCHES + RUN, "calls-of-1024": BIG_CALLS + RUN}
# (noise, coarse cell): ~35 KB and ~95 KB at quality 90; "turned": the small files as a phone stores photos taken
# upright, each odd file's pixels lying on their side with EXIF orientation 6 (half of a phone's photos, about)
STYLES = {"small": (3, 32), "imagenet": (16, 16), "turned": (3, 32)}


def make_jpeg(args: tuple[Path, int, str]) -> None:
    from PIL import Image

    path, seed, style = args
    noise, cell = STYLES[style]
    rng = np.random.default_rng(seed)
    w, h = (500, 375) if seed % 2 else (375, 500)
    coarse = rng.integers(0, 256, (h // cell + 1, w // cell + 1, 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), np.int16)
    img = np.clip(img + rng.normal(0, noise, img.shape), 0, 255).astype(np.uint8)
    if style == "turned" and seed % 2:
        exif = Image.Exif()
        exif[0x0112] = 6  # EXIF orientation: turn 90 degrees clockwise to see it upright
        Image.fromarray(img).transpose(Image.Transpose.ROTATE_90).save(path, quality=90, exif=exif.tobytes())
        return
    Image.fromarray(img).save(path, quality=90)


def folder(root: Path, style: str, n: int) -> Path:
    d = root / f"jpegs-{style}-{n}"
    if not (d / ".complete").exists():
        d.mkdir(parents=True, exist_ok=True)
        with ProcessPoolExecutor() as pool:
            list(pool.map(make_jpeg, [(d / f"{i:06d}.jpg", i, style) for i in range(n)], chunksize=64))
        (d / ".complete").write_text("ok\n")
    return d


def many(root: Path, d: Path, times: int) -> Path:
    """A folder of d's files linked ``times`` times (distinct names): a long run without generating more. Hard
    links, so that each entry is a regular file as in a user's folder (a symbolic link costs the listing a stat
    apiece: ~45 ms on 16,384); symbolic links where the file system refuses hard links."""
    out = root / f"{d.name}-x{times}-files"
    if not (out / ".complete").exists():
        out.mkdir(exist_ok=True)
        for t in range(times):
            for f in sorted(d.glob("*.jpg")):
                link = out / f"{t:02d}-{f.name}"
                if not link.exists():
                    try:
                        os.link(f, link)
                    except OSError:
                        link.symlink_to(f.resolve())
        (out / ".complete").write_text("ok\n")
    return out


def inception_run(args: list[str], out: Path, code: str = RUN, timeout: int = 300, env: dict | None = None) -> dict:
    """One inception-run in a fresh process: wall seconds, its printed images/s, its stderr's notes."""
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code, *args, "--output", str(out)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    wall = time.perf_counter() - t0
    rate = re.search(r"([0-9]+) images/s", r.stderr)
    steady = re.search(r"([0-9]+) images/s after the first result at ([0-9.]+) s", r.stderr)
    notes = [line for line in r.stderr.splitlines() if line.startswith(("note:", "error:"))]
    return {"wall_s": round(wall, 2), "rate": int(rate.group(1)) if rate else None,
            "steady": int(steady.group(1)) if steady else None,
            "first_result_s": float(steady.group(2)) if steady else None, "rc": r.returncode,
            "notes": notes, "top1": top1(out) if out.exists() else {}}


def top1(path: Path) -> dict[str, int]:
    rows = (json.loads(line) for line in path.read_text().splitlines())
    return {r["image"].rsplit("/", 1)[-1]: (r["top"][0]["index"] if "top" in r else -1) for r in rows}


def agree(a: dict, b: dict) -> str:
    common = set(a) & set(b)
    return f"{sum(a[k] == b[k] for k in common)}/{len(common)}"


def decoder_alone(d: Path, batch: int, limit: int) -> dict:
    """images/s of: nvImageCodec's batched decode through its Python API on files in memory ("nvimgcodec"), the
    whole of that path (header, decode, resize: "decode_into"), and the engine's path from the files on disk
    (jpeg_batch.c: read, header, decode; then the resize: "decode_files")."""
    from inception_engine.ingest import jpeg_decode
    from inception_engine.backends.cuda.device import Gpu, driver
    from inception_engine.backends.cuda.kernels import Kernels
    from inception_engine.ingest.images import Preprocess, decode_u8

    paths = [str(p) for p in sorted(d.glob("*.jpg"))[:limit]]
    items = [(p, Path(p).read_bytes()) for p in paths]
    batches = [items[i:i + batch] for i in range(0, len(items), batch)]
    pre, gpu, out = Preprocess(), Gpu(), {}
    with gpu:
        drv = driver()
        stream = drv.Stream(1)
        dst = drv.mem_alloc(batch * pre.size * pre.size * 3)
        kernels = Kernels(gpu.arch)

        def timed(label: str, step) -> None:
            step(batches[0])  # warm-up
            stream.synchronize()
            t0 = time.perf_counter()
            for b in batches:
                step(b)
            stream.synchronize()
            out[label] = round(len(items) / (time.perf_counter() - t0))

        native, jpeg_decode.NATIVE = jpeg_decode.NATIVE, False
        dec = jpeg_decode.GpuJpegDecoder(kernels, pre, batch)
        jpeg_decode.NATIVE = native
        timed("nvimgcodec", lambda b: dec._decode([x for _, x in b], stream))
        timed("decode_into", lambda b: dec.decode_into(b, int(dst), stream, lambda p, x: decode_u8(p, pre)))
        dec.close()
        dec = jpeg_decode.GpuJpegDecoder(kernels, pre, batch)
        if dec.native_unavailable is None:
            timed("decode_files", lambda b: dec.decode_files([p for p, _ in b], int(dst), stream,
                                                             lambda p, x: decode_u8(p, pre)))
            out["decode_files_chains"] = round(chains_alone(gpu, kernels, pre, batches, dec, dst, stream))
        dec.close()
        dst.free()
    gpu.release()
    return out


def chains_alone(gpu, kernels, pre, batches: list, first, dst, stream, chains: int = 2) -> float:
    """images/s of ``decode_files`` on ``chains`` threads at once, each with its decoder, stream and buffer (the
    pipeline's decode chains), call c on chain c % chains."""
    import threading

    from inception_engine.ingest import jpeg_decode
    from inception_engine.backends.cuda.device import driver
    from inception_engine.ingest.images import decode_u8

    drv = driver()
    decs = [first] + [jpeg_decode.GpuJpegDecoder(kernels, pre, len(batches[0])) for _ in range(chains - 1)]
    streams = [stream] + [drv.Stream(1) for _ in range(chains - 1)]
    dsts = [dst] + [drv.mem_alloc(len(batches[0]) * pre.size * pre.size * 3) for _ in range(chains - 1)]

    def run(j: int, todo: list) -> None:
        with gpu:
            for b in todo:
                decs[j].decode_files([p for p, _ in b], int(dsts[j]), streams[j], lambda p, x: decode_u8(p, pre))
            streams[j].synchronize()

    for j in range(chains):  # warm-up: each decoder's first call starts nvJPEG
        run(j, batches[:1])
    threads = [threading.Thread(target=run, args=(j, batches[j::chains])) for j in range(chains)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = sum(map(len, batches)) / (time.perf_counter() - t0)
    for d in decs[1:]:
        d.close()
    for x in dsts[1:]:
        x.free()
    return rate


def one_core(d: Path, n: int = 512) -> float:
    from inception_engine.ingest.images import Preprocess, decode_u8

    files, pre = sorted(d.glob("*.jpg"))[:n], Preprocess()
    t0 = time.perf_counter()
    for f in files:
        decode_u8(str(f), pre)
    return len(files) / (time.perf_counter() - t0)


def decode_files(files: list[Path]) -> int:
    from inception_engine.ingest.images import Preprocess, decode_u8

    pre = Preprocess()
    for f in files:
        decode_u8(str(f), pre)
    return len(files)


def all_cores(d: Path, n: int = 4096) -> tuple[float, int]:
    """(images/s, processes) of Pillow's exact decode on every usable CPU at once, one process each with no
    pipeline around it (the files decoded once untimed first: process start-up, imports, page cache): the
    ceiling the CPU-decode pipeline is held to, SMT and shared caches included, which one core x cores is not."""
    files = sorted(d.glob("*.jpg"))[:n]
    cores = len(os.sched_getaffinity(0))
    shares = [files[i::cores] for i in range(cores)]
    with ProcessPoolExecutor(cores) as pool:
        sum(pool.map(decode_files, shares))
        t0 = time.perf_counter()
        done = sum(pool.map(decode_files, shares))
        return done / (time.perf_counter() - t0), cores


def decoder_child(d: Path, start_at: float, seconds: float, gpu: int, gpus: int, call: int = 0) -> dict:
    """One of ``decoders_at_once``'s processes, on the one GPU it sees: nvImageCodec's start as a ``--gpus`` worker
    makes it (jpeg_decode.NativeStart on the worker's share of the CPUs: CUDA context, open, first decode), then,
    from the wall-clock time ``start_at`` on, ``decode_files``' rate over the folder (``call`` files a call, 0: a
    decode call's files as the pipeline makes them) for ``seconds``."""
    from inception_engine.ingest import jpeg_decode
    from inception_engine.backends.cuda.device import Gpu, driver
    from inception_engine.backends.cuda.kernels import Kernels
    from inception_engine.ingest.images import DECODE_IMAGES
    from inception_engine.ingest.images import Preprocess, decode_u8
    from inception_engine.multi_gpu import cpu_share

    cpus = cpu_share(gpu, gpus)
    if cpus:
        os.sched_setaffinity(0, cpus)
    pre, paths, call = Preprocess(), [str(p) for p in sorted(d.glob("*.jpg"))], call or DECODE_IMAGES
    t0 = time.perf_counter()
    started = jpeg_decode.NativeStart(len(cpus))  # as Engine: nvImageCodec opens while the context is made
    gpu_ = Gpu()
    with gpu_:
        stream = driver().Stream(1)
        dst = driver().mem_alloc(call * pre.size * pre.size * 3)
        dec = jpeg_decode.GpuJpegDecoder(Kernels(gpu_.arch), pre, call, threads=len(cpus), started=started)
        start_s = time.perf_counter() - t0
        calls = [paths[i:i + call] for i in range(0, len(paths) - call + 1, call)]
        fallback = lambda p, x: decode_u8(p, pre)  # noqa: E731
        dec.decode_files(calls[0], int(dst), stream, fallback)
        dec.wait()
        stream.synchronize()
        time.sleep(max(0.0, start_at - time.time()))
        t, n, c = time.perf_counter(), 0, 0
        while time.perf_counter() - t < seconds:
            dec.decode_files(calls[c % len(calls)], int(dst), stream, fallback)
            n, c = n + len(calls[c % len(calls)]), c + 1
        dec.wait()
        stream.synchronize()
        rate = n / (time.perf_counter() - t)
        dec.close()
        dst.free()
    return {"start_s": round(start_s, 2), "rate": round(rate)}


def decoders_at_once(d: Path, gpus: int, seconds: float = 4.0, call: int = 0) -> dict:
    """``gpus`` processes at once, one per GPU, as ``--gpus`` starts its workers (decoder_child): each one's
    nvImageCodec start when they all start together, and each one's decode rate while all decode at once. The
    limits of ``--gpus`` that no change to the pipeline moves: a worker's decoder start (its first result comes no
    earlier) and the decoders' rate side by side (the workers stream no faster)."""
    start_at = time.time() + 12 + 3 * gpus  # past every process's start (~4 s, more side by side): all decode together
    procs = [subprocess.Popen([sys.executable, __file__, "--decoder-child", str(d), str(start_at), str(seconds),
                               str(g), str(gpus), str(call)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": str(g)}) for g in range(gpus)]
    each = [json.loads(p.communicate(timeout=120 + 10 * gpus)[0].strip().splitlines()[-1]) for p in procs]
    return {"start_s": [e["start_s"] for e in each], "rates": [e["rate"] for e in each],
            "total_rate": sum(e["rate"] for e in each)}


def speedup_limit(one: dict, at_once: dict[int, dict], g: int, images: int) -> float | None:
    """The most ``--gpus g`` can gain on one GPU's wall time (``one``: that run) with the decoders measured beside
    it (``decoders_at_once``): one GPU's run, with its decoder start replaced by the slowest of g started together
    and its streaming (images at its steady rate) by the images at the lesser of g x that rate and the g decoders'
    rate side by side. Everything else (imports, listing, the end) is taken to cost what it did on one GPU."""
    if not one.get("steady"):
        return None
    stream_1 = images / one["steady"]
    stream_g = images / min(g * one["steady"], at_once[g]["total_rate"])
    wall_g = one["wall_s"] + max(at_once[g]["start_s"]) - max(at_once[1]["start_s"]) - stream_1 + stream_g
    return round(one["wall_s"] / wall_g, 2)


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    except OSError:
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=16384)
    ap.add_argument("--imagenet-images", type=int, default=4096)
    ap.add_argument("--precisions", default="fp16,tf32")
    ap.add_argument("--batches", default="64", help="batch sizes of the --decode gpu rows")
    ap.add_argument("--gpus", default="", help="GPU counts for --gpus rows (e.g. 1,2,4)")
    ap.add_argument("--many", type=int, default=65536, help="images of the --gpus rows")
    ap.add_argument("--gpus-decode", default="gpu,cpu", help="decode modes of the --gpus rows")
    ap.add_argument("--ab", default="", help=f"--decode gpu variants to alternate with, of {','.join(VARIANTS)}")
    ap.add_argument("--first", action="store_true", help="first answers (run first, on a fresh machine)")
    ap.add_argument("--first-long", default="", help="precisions of first-long-run rows: each --decode gpu run "
                    "on a fresh cache (kernels only), then again (e.g. fp16,tf32,fp32)")
    ap.add_argument("--only-first-long", action="store_true", help="skip the per-set rows")
    ap.add_argument("--sets", default="small,imagenet,turned", help="folders of the per-set rows, of small, "
                    "imagenet, turned")
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--weights", default="/tmp/bench-weights.npz")
    ap.add_argument("--root", default="/tmp/bench-folder")
    ap.add_argument("--json")
    args = ap.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    def row(**kw: object) -> None:
        rows.append(kw)
        print(json.dumps(kw, default=str)[:400], flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1, default=str))

    if not Path(args.weights).exists():
        from inception_engine.synthetic import synthetic_weights
        from inception_engine.weights import save_weights

        w = synthetic_weights(0)
        save_weights(args.weights, w.arrays, w.manifest)
    precisions = args.precisions.split(",")
    small = folder(root, "small", args.images)
    if args.first:
        photo = str(sorted(small.glob("*.jpg"))[0])
        for p in ("tf32", "fp16", "fp32"):
            r = inception_run([photo, "--weights", args.weights, "--precision", p], root / "first.jsonl")
            row(what="first answer", precision=p, wall_s=r["wall_s"], notes=r["notes"])
    made = {"small": lambda: small, "imagenet": lambda: folder(root, "imagenet", args.imagenet_images),
            "turned": lambda: folder(root, "turned", args.imagenet_images)}
    sets = {} if args.only_first_long else {name: made[name]() for name in args.sets.split(",")}
    for name, d in sets.items():
        for b in map(int, args.batches.split(",")):
            from inception_engine.ingest.images import decode_call_images

            calls = decode_call_images(b)  # the files of one decode call at this batch
            row(what="decoder alone", files=name, batch=calls, **decoder_alone(d, calls, 4096))
        core = one_core(d)
        together, cores = all_cores(d)
        row(what="CPU decode, one core", files=name, rate=round(core), cores=cores,
            one_core_x_cores=round(core * cores), all_cores_at_once=round(together))
        ref: dict[str, dict] = {}
        for p in precisions:
            for b in map(int, args.batches.split(",")):
                ab = [(v, VARIANTS[v]) for v in args.ab.split(",") if v] if b == 64 else []
                variants = [("jpeg_batch.c", RUN), *ab]
                for rnd in range(2 if ab else 1):
                    for label, code in variants:
                        r = inception_run([str(d), "--weights", args.weights, "--precision", p, "--decode", "gpu",
                                           "--batch-size", str(b)], root / "o.jsonl", code)
                        ref.setdefault(f"gpu-{p}", r["top1"])
                        row(what=f"--decode gpu ({label})", files=name, precision=p, batch=b, round=rnd,
                            rate=r["rate"], steady=r["steady"], first_result_s=r["first_result_s"],
                            wall_s=r["wall_s"], rc=r["rc"], notes=r["notes"][:2],
                            top1_vs_first=agree(r["top1"], ref[f"gpu-{p}"]))
            if not args.no_cpu:
                r = inception_run([str(d), "--weights", args.weights, "--precision", p], root / "o.jsonl")
                row(what="CPU decode", files=name, precision=p, batch=64, rate=r["rate"], steady=r["steady"],
                    wall_s=r["wall_s"], rc=r["rc"], top1_vs_gpu_decode=agree(r["top1"], ref.get(f"gpu-{p}", {})))
        if not args.no_torch:
            for fp16 in (False, True):
                cmd = [sys.executable, str(ROOT / "dev/torch_dataloader_baseline.py"), str(d), args.weights,
                       "--batch-size", "64", "--workers", str(os.cpu_count())] + (["--fp16"] if fp16 else [])
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                got = json.loads(r.stdout.splitlines()[-1]) if r.returncode == 0 and r.stdout else {}
                row(what="PyTorch DataLoader script", files=name, fp16=fp16, rate=got.get("images_per_s"),
                    rc=r.returncode, err=r.stderr.strip().splitlines()[-1:] if r.returncode else None)
    if args.first_long:
        # a first run on a cache as the install leaves it (kernels, no tuning), then the same command again
        from inception_engine.paths import user_cache_dir

        kernels = user_cache_dir() / "kernels"
        for p in args.first_long.split(","):
            for b in map(int, args.batches.split(",")):
                fresh = root / f"cache-{p}-{b}"
                shutil.rmtree(fresh, ignore_errors=True)
                (fresh / "inception-engine").mkdir(parents=True)
                shutil.copytree(kernels, fresh / "inception-engine" / "kernels")
                env = {**os.environ, "XDG_CACHE_HOME": str(fresh)}
                runs = [inception_run([str(small), "--weights", args.weights, "--precision", p, "--decode", "gpu",
                                       "--batch-size", str(b)], root / "o.jsonl", env=env) for _ in range(2)]
                row(what="first long run, then again", files="small", precision=p, batch=b,
                    rate=runs[0]["rate"], steady=runs[0]["steady"], again_rate=runs[1]["rate"],
                    again_steady=runs[1]["steady"], first_over_again=round(runs[0]["rate"] / runs[1]["rate"], 3),
                    notes=runs[0]["notes"][:1])
    counts = [int(g) for g in args.gpus.split(",") if g] if args.gpus else []
    if counts:
        big = many(root, small, max(1, args.many // args.images))
        have = gpu_count()
        at_once = {}
        if "gpu" in args.gpus_decode.split(","):
            for g in (g for g in counts if g <= have):
                at_once[g] = decoders_at_once(small, g)
                row(what="decoders at once (one process a GPU)", gpus=g, **at_once[g])
        for decode in args.gpus_decode.split(","):
            for p in precisions[:1]:
                first: dict | None = None
                for g in counts:
                    if g > have:
                        row(what="--gpus", gpus=g, skipped=f"this machine has {have} GPUs")
                        continue
                    r = inception_run([str(big), "--weights", args.weights, "--precision", p, "--decode", decode,
                                       "--gpus", str(g)], root / "o.jsonl", timeout=580)
                    first = first or r
                    row(what="--gpus", decode=decode, precision=p, gpus=g, images=len(r["top1"]), wall_s=r["wall_s"],
                        rate=r["rate"], steady=r["steady"], first_result_s=r["first_result_s"],
                        speedup=round(first["wall_s"] / r["wall_s"], 2), rc=r["rc"], notes=r["notes"][:2],
                        **({"speedup_limit": speedup_limit(first, at_once, g, len(r["top1"]))}
                           if decode == "gpu" and g in at_once and 1 in at_once else {}))
    print("what | files | precision | batch | gpus | images/s | wall s | extra")
    for r in rows:
        extra = {k: v for k, v in r.items() if k not in ("what", "files", "precision", "batch", "gpus", "rate",
                                                            "wall_s", "notes", "round")}
        print(f"{r['what']} | {r.get('files', '')} | {r.get('precision', '')} | {r.get('batch', '')} | "
              f"{r.get('gpus', '')} | {r.get('rate', '')} | {r.get('wall_s', '')} | {json.dumps(extra)[:120]}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--decoder-child"]:
        folder_, start_at, seconds, gpu, gpus, call = sys.argv[2:]
        print(json.dumps(decoder_child(Path(folder_), float(start_at), float(seconds), int(gpu), int(gpus),
                                       int(call))))
    else:
        main()
