"""Per-layer GPU time of the TF32 tensor-core conv kernels (conv_tf32.cu) next to the fp32 ones (conv.cu).

    python3 scripts/bench_tf32.py [--batch-sizes 1,128] [--iters 50] [--json FILE]

For every distinct convolution of the network (and the FC as a 1x1 GEMM at batch > 1) at each batch size: the fp32
kernel with the backend's chosen config, and every TF32 tile with every split count in SPLITS (k_split >= 64),
each the mean of --iters back-to-back launches behind gpu_sleep (so the host's launch latency is not counted).
Prints per layer the fp32 time, the fastest TF32 (tile, splits) and the speed-up, the sums, and per TF32 tile the
best multiply-adds per microsecond per SM reached on a launch of at least two waves: the numbers the backend's
cost model (cuda_backend.Tile.macs_per_us) wants. Needs a GPU, pycuda and nvcc.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inception_engine import cuda_build  # noqa: E402
from inception_engine.backends import cuda_backend as cb  # noqa: E402
from inception_engine.plan import View, build_plan  # noqa: E402

# (bm, bn, bk, resident blocks per SM): conv_tf32.cu's CONV_TF32_TILES (__launch_bounds__ minimum as resident).
TF32_TILES = ((128, 128, 16, 2), (128, 64, 16, 2), (64, 64, 16, 3))
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


@dataclass(frozen=True)
class Layer:
    name: str
    n: int
    cin: int
    cout: int
    h: int
    w: int
    kernel: tuple[int, int]
    stride: int
    pad: tuple[int, int]

    @property
    def out_hw(self) -> tuple[int, int]:
        return ((self.h + 2 * self.pad[0] - self.kernel[0]) // self.stride + 1,
                (self.w + 2 * self.pad[1] - self.kernel[1]) // self.stride + 1)

    @property
    def k_total(self) -> int:
        return self.cin * self.kernel[0] * self.kernel[1]

    @property
    def n_total(self) -> int:
        return self.n * math.prod(self.out_hw)

    @property
    def macs(self) -> int:
        return self.cout * self.n_total * self.k_total


def layers(batch: int) -> list[Layer]:
    plan = build_plan(batch)
    seen: dict[tuple, Layer] = {}
    for op in plan.conv_ops:
        layer = Layer(op.name, batch, op.src.channels, op.dst.channels, op.src.h, op.src.w, op.kernel, op.stride,
                      op.pad)
        seen.setdefault((layer.cin, layer.cout, layer.h, layer.w, layer.kernel, layer.stride, layer.pad), layer)
    out = list(seen.values())
    if batch > 1:
        out.append(Layer("fc", batch, 2048, 1000, 1, 1, (1, 1), 1, (0, 0)))
    return out


def tf32_module(arch: str, tmp: Path):
    cubin = tmp / "conv_tf32.cubin"
    cmd = [cuda_build.find_nvcc() or "nvcc", f"-arch={arch}", *cuda_build.FLAGS, "-cubin", "-o", str(cubin),
           str(cuda_build.source_dir() / "conv_tf32.cu")]
    subprocess.run(cmd, check=True)
    return cb.driver().module_from_file(str(cubin))


class Timer:
    def __init__(self, kernels: cb.Kernels, iters: int):
        drv = cb.driver()
        self.sleep, self.iters = kernels["gpu_sleep"], iters
        self.stream = drv.Stream()
        self.start, self.end = drv.Event(), drv.Event()

    def ms(self, launches: list[tuple]) -> float:
        """Mean ms of one pass over launches: (prepared function, LaunchSpec) pairs."""
        self.sleep.prepared_async_call((1, 1, 1), (1, 1, 1), self.stream, 10_000 * len(launches) * self.iters)
        self.start.record(self.stream)
        for _ in range(self.iters):
            for fn, spec in launches:
                fn.prepared_async_call(spec.grid, spec.block, self.stream, *spec.args)
        self.end.record(self.stream)
        self.end.synchronize()
        return self.end.time_since(self.start) / self.iters


def aligned(address: int) -> int:
    return (address + 255) // 256 * 256


def bench(batch: int, iters: int, kernels: cb.Kernels, module, num_sms: int) -> dict:
    drv = cb.driver()
    timer = Timer(kernels, iters)
    rows = []
    for layer in layers(batch):
        ho, wo = layer.out_hw
        src = View("x", 0, (layer.n, layer.cin, layer.h, layer.w), 0, layer.cin)
        dst = View("y", 0, (layer.n, layer.cout, ho, wo), 0, layer.cout)
        x_elems, y_elems = layer.n * layer.cin * layer.h * layer.w, layer.cout * layer.n_total
        ws_elems = max(SPLITS) * y_elems
        mem = drv.mem_alloc(4 * (x_elems + y_elems + layer.k_total * layer.cout + layer.cout + ws_elems + 4 * 64))
        drv.memset_d32(int(mem), 0, (x_elems + y_elems + layer.k_total * layer.cout + layer.cout + ws_elems))
        base = int(mem)  # x at base, then y, weights, bias, workspace, each on a 256-byte boundary as in the backend
        yp = aligned(base + 4 * x_elems)
        wp = aligned(yp + 4 * y_elems)
        bp = aligned(wp + 4 * layer.k_total * layer.cout)
        wsp = aligned(bp + 4 * layer.cout)
        y_view = View("y", (yp - base) // 4, dst.shape, 0, layer.cout)

        def specs(cfg: cb.ConvConfig, name: str | None) -> list[tuple]:
            out = cb.conv_specs(layer.name, src, y_view, layer.kernel, layer.stride, layer.pad, True, cfg, base,
                                wp, bp, wsp)
            if name:
                out[0] = cb.LaunchSpec(out[0].op, name, out[0].grid, out[0].block, out[0].args)
            return [(module.get_function(s.kernel) if s.kernel.startswith("conv_tf32_") else kernels[s.kernel], s)
                    for s in out]

        cfg32 = cb.conv_config(layer.cout, layer.n_total, layer.k_total, num_sms)
        fp32_ms = timer.ms(specs(cfg32, None))
        best = None
        per_tile = {}
        for bm, bn, bk, resident in TF32_TILES:
            tile = cb.Tile(bm, bn, bk, resident, 1.0)
            for want in SPLITS:
                k_split = math.ceil(math.ceil(layer.k_total / want) / bk) * bk
                splits = math.ceil(layer.k_total / k_split)
                if splits != want or (splits > 1 and k_split < 64):
                    continue
                launches = specs(cb.ConvConfig(tile, splits, k_split, 0.0),
                                 f"conv_tf32_{layer.kernel[0]}x{layer.kernel[1]}_{bm}x{bn}")
                for fn, s in launches:
                    fn.prepare(cb.arg_format(s.kernel))
                ms = timer.ms(launches)
                blocks = math.ceil(layer.cout / bm) * math.ceil(layer.n_total / bn) * splits
                if splits == 1 and blocks >= 2 * num_sms * resident:
                    rate = layer.macs / (ms * 1e3) / num_sms
                    per_tile[tile.name] = max(per_tile.get(tile.name, 0.0), rate)
                if best is None or ms < best[0]:
                    best = (ms, tile.name, splits)
        mem.free()
        assert best is not None
        rows.append({"layer": layer.name, "fp32_cfg": f"{cfg32.tile.name}/{cfg32.splits}", "fp32_ms": fp32_ms,
                     "tf32_ms": best[0], "tf32_cfg": f"{best[1]}/{best[2]}", "macs": layer.macs,
                     "per_tile_macs_per_us_per_sm": per_tile})
    return {"batch": batch, "rows": rows}


def report(result: dict) -> str:
    lines = [f"batch {result['batch']}", f"{'layer':30s} {'fp32 cfg':>12s} {'fp32 ms':>9s} {'tf32 cfg':>12s} "
             f"{'tf32 ms':>9s} {'speedup':>8s}"]
    for r in result["rows"]:
        lines.append(f"{r['layer']:30s} {r['fp32_cfg']:>12s} {r['fp32_ms']:9.4f} {r['tf32_cfg']:>12s} "
                     f"{r['tf32_ms']:9.4f} {r['fp32_ms'] / r['tf32_ms']:8.2f}")
    f32, t32 = sum(r["fp32_ms"] for r in result["rows"]), sum(r["tf32_ms"] for r in result["rows"])
    lines.append(f"{'sum of distinct layers':30s} {'':12s} {f32:9.3f} {'':12s} {t32:9.3f} {f32 / t32:8.2f}")
    rates: dict[str, float] = {}
    for r in result["rows"]:
        for name, v in r["per_tile_macs_per_us_per_sm"].items():
            rates[name] = max(rates.get(name, 0.0), v)
    lines.append("best MACs/us/SM per TF32 tile (>= 2 waves, no split): "
                 + ", ".join(f"{k} {v:.3g}" for k, v in rates.items()))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1,128")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    gpu = cb.Gpu()
    results = []
    with gpu, tempfile.TemporaryDirectory() as tmp:
        kernels = cb.Kernels(gpu.arch)
        module = tf32_module(gpu.arch, Path(tmp))
        print(f"{gpu.device.name()}, {gpu.num_sms} SMs")
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            results.append(bench(batch, args.iters, kernels, module, gpu.num_sms))
            print(report(results[-1]), flush=True)
        del kernels, module
    gpu.release()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
