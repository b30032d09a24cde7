"""``CudaBackend``: a plan and its weights turned into prepared launches once, then each forward is upload, replay
(one CUDA graph, or eager launches), download. The launches are lowering.py's (``lower``: a pure function of the
plan, the configs and the GPU's facts); the backend allocates the buffers they name, uploads the parameters
(params.py), loads the kernels (kernels.py), puts branches on concurrent streams (schedule.py), captures and
replays. The configs come from the cost model or from measured tuning (``tune_configs``, here because it times
candidates with a CudaBackend)"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import cuda_build
from ...errors import BackendUnavailable, EngineError
from ...plan import GlobalAvgPoolOp, Plan, PoolOp, build_plan, fused_plan, is_fused
from ...plan import fuse as fuse_plan
from ...weights import Weights, atomic_write
from .. import event_timed_ms
from .cost_model import ConvConfig, choose_configs
from .device import Gpu, driver, gpu_facts, probe
from .kernels import Kernels, spec, unit_of
from .launch import Launch
from .launch_nhwc import check_nhwc, nhwc_fits
from .lowering import GpuFacts, lower, resolve_spec
from .tensor_maps import encode_all
from .params import pack_params
from .schedule import schedule
from .families.pool_nhwc import PRODUCT_BYTES
from .int8_scales import Int8Scales
from .tiles import NHWC_PIECE, PRECISIONS, Tile, check_nhwc_precision, folds_max_pools
from .tuning import (config_from_json, config_to_json, pick_fastest, shape_key, table_configs, tuning_cache_dir,
                     tuning_candidates, tuning_key)

WGMMA_ONLY = ("fp32", "int8")  # the precisions whose NHWC tiles are wgmma only (sm_90a)
INT8_PIECE = 16  # int8 channels a 16-byte piece: the int8 path's channel counts and offsets are multiples of it


def settle_layout(plan: Plan, precision: str, nhwc: bool | None, device: int) -> bool:
    """Whether activations are NHWC: as asked (checked: the plan's channel counts, and for fp32 the GPU's wgmma), or
    by default wherever the plan allows it and, for fp32, the GPU has wgmma. int8 runs on NHWC wgmma tiles only."""
    wgmma = cuda_build.has_wgmma(probe(device)[1]) if precision in WGMMA_ONLY and nhwc is not False else True
    if precision == "int8":
        if nhwc is False:
            raise EngineError("int8 runs on the NHWC layout only; leave the layout to its default")
        nhwc = True
    if nhwc:
        check_nhwc_precision(precision, wgmma)
        check_nhwc(plan, INT8_PIECE if precision == "int8" else NHWC_PIECE)
        return True
    return nhwc_fits(plan) and (precision != "fp32" or wgmma) if nhwc is None else False


# arena elements of a raw product that a moved pool reads (plan.fuse_pointwise): int8's are int32 sums in a byte arena
PRODUCT_ELEMS = {"int8": PRODUCT_BYTES}


def prepare_plan(plan: Plan, precision: str, nhwc: bool, concurrent: bool, fuse: bool,
                 int8: Int8Scales | None = None) -> Plan:
    """The plan as the backend runs it: fused (plan.fused_plan: stages, the pools' inputs live for their readers)
    or concurrent where asked and not made so already; checked for what the precision's kernels and 32-bit indexing
    take. int8: the average pools moved behind their convs are the 8-bit network's (``int8.moved``), no others."""
    if fuse and not nhwc:
        raise EngineError("fused 1x1 convolutions run on the NHWC layout only")
    if (concurrent or fuse) and not plan.concurrent and not plan.layers:
        raise ValueError("a concurrent or fused cuda backend needs a plan from build_plan (it has no layers)")
    max_pools, move_pools = folds_max_pools(precision), int8 is None or bool(int8.moved)
    product_elems = PRODUCT_ELEMS.get(precision, 1)
    if fuse and not is_fused(plan):
        plan = (fused_plan(plan.batch, list(plan.layers), plan.input.h, max_pools, move_pools, product_elems)
                if plan.layers else fuse_plan(plan, max_pools, move_pools, product_elems))
    moved = {op.name for op in plan.ops if isinstance(op, PoolOp) and op.bias}
    if int8 is not None and moved != set(int8.moved):
        raise EngineError(f"the 8-bit network computes {', '.join(sorted(int8.moved)) or 'no average pool'} behind "
                          f"its convolution, this plan {', '.join(sorted(moved)) or 'none'}; give a plan made by "
                          f"plan.fuse_pointwise(move_pools={bool(int8.moved)}, product_elems={product_elems})")
    if concurrent and not plan.concurrent:
        plan = build_plan(plan.batch, list(plan.layers), input_size=plan.input.h, concurrent=True)
    if not max_pools and any(op.max_pool for op in plan.conv_ops):
        raise EngineError(f"{precision} has no kernel for a 1x1 convolution that reads through a max pool; "
                          f"give a plan made without plan.fuse_max_pools")
    if plan.arena_elems >= 2**31:
        raise EngineError(f"batch {plan.batch} is too large for the cuda backend (32-bit indexing); "
                          f"use a smaller batch")
    return plan


class CudaBackend:
    """A plan and its weights as prepared launches on one GPU (see the module docstring). The options:

    softmax: forward returns probabilities (softmax on the GPU) instead of logits.
    concurrent: run the branches of each Inception module on several streams (``schedule``); default: with the
    graph only, where the fork/join events cost no host time. A plan not built for that
    (``build_plan(concurrent=True)``) is rebuilt so.
    fixup: split-K convs reduce inside the conv kernel (one launch), else in conv_splitk_reduce (the default: the
    separate reduction is the faster of the two); the tensor-core kernels have no such variant, so in tf32/fp16
    split-K always uses conv_splitk_reduce.
    precision: "fp32" (float32 accuracy: on NCHW the FFMA kernels, on NHWC 3xFP16 tensor-core GEMMs), "tf32" or
    "fp16" (tensor-core GEMMs for the convs and the batched FC, with TF32 or fp16 operands), "int8" (sm_90a, NHWC:
    int8 activations and weights at the weight file's calibrated scales, int8 wgmma GEMMs with int32 sums, the
    stem and the classifier in float32; backends/int8_reference.py is its arithmetic, element for element).
    winograd: the stride-1 3x3, 5x5, 1x7, 7x1 convs by Winograd (winograd.cu) always (True, the default), where
    the cost model expects it to be faster (None) or never (False); in every precision (the Winograd GEMMs are
    FFMA). The default is every eligible conv because that is as fast as the model's choice or faster at every
    batch size: the model assumes V and M miss L2, which at batch 1 and 8 they do not.
    tiles: restrict the direct GEMMs to these tiles of the precision (tuning).
    tune: each conv's tile, split-K and Winograd-or-not measured on this GPU instead of the cost model's guess
    (``tune_configs``: from the tuning cache or the package's table for this GPU, else measured now, seconds);
    "cached": the cache's or the table's configs, else the cost model's (no measuring); "fresh": measured now
    whatever the cache or table hold (inception-tune), ``tune_progress(done, total)`` after each candidate.
    configs: use exactly these.
    nhwc: activations in NHWC buffers (conv_nhwc_*.cu, pool_nhwc.cu; no Winograd), fp16, TF32-rounded float32
    or (fp32, sm_90a only) float32: no per-element gather in the convs, and for fp16 half the activation bytes.
    Default (None): wherever the plan's channel counts allow it (``check_nhwc``), and for fp32 where the GPU
    has wgmma (NHWC is the faster layout at every batch size: docs/PERFORMANCE.md); False: conv.cu /
    conv_f16.cu / conv_tf32.cu and Winograd on fp32 NCHW activations.
    fuse (NHWC only; default: with NHWC): each module's 1x1 convs that read its input as one GEMM, with the
    average pool of the pool branch moved behind its conv, and in fp16 and tf32 MaxPool_3a folded into Conv2d_3b
    (plan.fuse), which needs a plan whose buffers live for whole stages (rebuilt so, as for concurrent). A plan
    fused already is taken as it is.
    sm_margin: SMs the persistent (warp-specialized and halo) tiles leave free, for other work on the GPU beside
    the forward (nvImageCodec's kernels when JPEGs are decoded on the GPU); 0: a block on every SM."""

    name = "cuda"
    PRECISIONS = PRECISIONS

    @classmethod
    def check_available(cls) -> None:
        _, arch = probe()
        if not cuda_build.is_cached(arch) and cuda_build.find_nvcc() is None:
            raise BackendUnavailable(f"nvcc (the CUDA compiler) is not on PATH and no compiled kernels for "
                                     f"{arch} are cached; install the CUDA toolkit or put its bin/ on PATH")

    def __init__(self, weights: Weights, plan: Plan, graph: bool = True, softmax: bool = False, device: int = 0,
                 concurrent: bool | None = None, fixup: bool = False, precision: str = "fp32",
                 winograd: bool | None = True, tiles: tuple[Tile, ...] | None = None, tune: bool | str = False,
                 configs: dict[str, ConvConfig | None] | None = None, nhwc: bool | None = None,
                 fuse: bool | None = None, sm_margin: int = 0,
                 tune_progress: Callable[[int, int], None] | None = None):
        if precision not in PRECISIONS:
            raise EngineError(f"the cuda backend has no {precision!r} mode; choose one of {', '.join(PRECISIONS)}")
        # int8: the calibration's scales, refused first (one line naming the command that adds them)
        self.int8 = Int8Scales.of(weights) if precision == "int8" else None
        self.nhwc = nhwc = settle_layout(plan, precision, nhwc, device)
        self.precision = precision
        self.sm_margin = sm_margin
        self.fixup = fixup
        self.winograd = winograd
        self.tiles = tiles
        self.concurrent = graph if concurrent is None else concurrent
        self.fuse = is_fused(plan) or (nhwc if fuse is None else fuse)
        plan = prepare_plan(plan, precision, nhwc, self.concurrent, self.fuse, self.int8)
        # where the convs' configs come from: "given", "measured" now, the tuning "cache", the shipped "table", or
        # the cost "model"
        self.tuning_source = "given" if configs is not None else "model"
        if tune and configs is None:
            configs, self.tuning_source = tune_configs(weights, plan, precision, fixup, winograd, device, nhwc=nhwc,
                                                       measure=tune != "cached", fresh=tune == "fresh",
                                                       progress=tune_progress)
        # measured configs (tuned now, read from the tuning cache or the shipped table): what tuning would give too
        self.tuned = bool(tune) and configs is not None
        self._given_configs = configs
        drv = driver()
        self.plan = plan
        self.graph_mode = graph
        self._gpu = Gpu(device)
        self._allocs: list[Any] = []
        self._device_bytes = 0
        self._graph: Any = None
        self._sleep: Any = None
        self._launches: list[Launch] = []
        self._streams: list[Any] = []
        self._stages: list[tuple[Any, list[tuple[Any, Any, list[Any], list[Launch]]], list[tuple[Any, Any]]]] = []
        self._tail: list[Launch] = []
        self._host: list[Any] = []
        # the input side's GPU JPEG decoders for this backend's context (ingest.jpeg_decode.reuse_decoders fills it at
        # the first --decode gpu run), kept across runs and closed with the backend; this module never makes one
        self.jpeg_decoders: list[Any] = []
        self._closed = False
        try:
            with self._gpu:
                try:
                    self._setup(weights, softmax, drv)
                except BaseException:
                    self._free()
                    raise
        except BaseException:
            self._gpu.release()
            self._closed = True
            raise

    def _alloc(self, elems: int) -> int:
        drv = driver()
        nbytes = 4 * max(elems, 1)
        try:
            a = drv.mem_alloc(nbytes)
        except drv.MemoryError:
            need = self._device_bytes + nbytes
            raise BackendUnavailable(f"not enough GPU memory for batch {self.plan.batch} (needs ~{need >> 20} MiB); "
                                     f"use a smaller batch") from None
        self._allocs.append(a)
        self._device_bytes += nbytes
        return int(a)

    def _setup(self, weights: Weights, softmax: bool, drv: Any) -> None:
        """Allocate and fill the buffers ``lower`` names, upload the parameters, resolve its launches."""
        plan = self.plan
        self.configs = self._given_configs or choose_configs(plan, self._gpu.num_sms, self.fixup, self.precision,
                                                             self.winograd, self.tiles, self.nhwc,
                                                             cuda_build.has_wgmma(self._gpu.arch))
        params, offsets = pack_params(weights, plan, self.configs, self.int8)
        gpu = GpuFacts(self._gpu.num_sms - self.sm_margin, cuda_build.has_wgmma(self._gpu.arch))
        low = lower(plan, self.configs, self.precision, self.nhwc, gpu, offsets, params.size, softmax, self.fixup,
                    self.int8)
        self._buffers = bases = {name: self._alloc(words) for name, words in low.words.items()}
        self._buffer_words = dict(low.words)
        for name, word in low.fill.items():
            drv.memset_d32(bases[name], word, low.words[name])
        drv.memcpy_htod(bases["params"], params)
        drv.Context.synchronize()
        self._stream = drv.Stream(1)  # CU_STREAM_NON_BLOCKING: no implicit sync with the legacy stream
        self._x_host = drv.pagelocked_empty(plan.input.dims, np.float32)
        self._y_host = drv.pagelocked_empty((plan.batch, plan.output.channels), np.float32)
        gap = next(op for op in plan.ops if isinstance(op, GlobalAvgPoolOp))
        self._f_host = drv.pagelocked_empty((plan.batch, gap.dst.channels), np.float32)
        self._host = [self._x_host, self._y_host, self._f_host]
        self._in_ptr, self._out_ptr = low.input.resolve(bases), low.output.resolve(bases)
        self._features_ptr = low.features.resolve(bases)
        self.specs = [resolve_spec(s, bases) for s in low.specs]
        setup = [resolve_spec(s, bases) for s in low.setup]
        for launch in self.specs:  # the TMA tiles' tensor maps, at the address each takes as `maps`
            if launch.maps:
                drv.memcpy_htod(launch.arg("maps", spec(launch.kernel)), encode_all(launch.maps))
        # Only the units these launches need (a first run compiles one precision's), plus gpu_sleep (time_layers)
        # and the streaming pipeline's ends: all built in parallel.
        kernels = Kernels(self._gpu.arch, {unit_of(k) for k in {s.kernel for s in self.specs + setup} | {
            "gpu_sleep", "normalize_u8_nchw", "softmax_topk_rows"}})
        self.kernels = kernels
        for s in setup:  # what the uploaded parameters need once (fp32's weights split into fp16 halves)
            Launch(s, kernels[s.kernel])(self._stream)
        self._stream.synchronize()
        self._launches = [Launch(s, kernels[s.kernel]) for s in self.specs]
        self._sleep = kernels["gpu_sleep"]
        if self.concurrent:
            self._setup_streams(drv)
        if self.graph_mode:
            from ...cuda_graph import CudaGraph

            self._graph = CudaGraph(self._stream.handle, self._launch_all)

    def _setup_streams(self, drv: Any) -> None:
        """Streams and events for ``schedule(plan)``: per op its launches, stream and the events it waits for;
        per stage a fork event and the join events of its side streams. Events are recorded anew each forward."""
        plan, sched = self.plan, schedule(self.plan)
        by_op: dict[str, list[Launch]] = {}
        for launch in self._launches:
            by_op.setdefault(launch.spec.op, []).append(launch)
        self._streams = [self._stream] + [drv.Stream(1) for _ in range(max(s.stream for s in sched))]
        flags = drv.event_flags.DISABLE_TIMING
        done = {j: drv.Event(flags) for s in sched for j in s.waits}
        for stage in sorted(set(plan.stages)):
            ops = [i for i, st in enumerate(plan.stages) if st == stage]
            side = sorted({sched[i].stream for i in ops} - {0})
            steps = [(self._streams[sched[i].stream], done.get(i), [done[j] for j in sched[i].waits],
                      by_op.get(plan.ops[i].name, [])) for i in ops]
            self._stages.append((drv.Event(flags), steps, [(self._streams[k], drv.Event(flags)) for k in side]))
        self._tail = [launch for launch in self._launches if launch.spec.op not in {op.name for op in plan.ops}]

    def _launch_all(self) -> None:
        if not self.concurrent:
            for launch in self._launches:
                launch(self._stream)
            return
        main = self._stream
        for fork, steps, joins in self._stages:
            if joins:
                fork.record(main)
                for stream, _ in joins:
                    stream.wait_for_event(fork)
            for stream, done, waits, launches in steps:
                for event in waits:
                    stream.wait_for_event(event)
                for launch in launches:
                    launch(stream)
                if done is not None:
                    done.record(stream)
            for stream, join in joins:
                join.record(stream)
                main.wait_for_event(join)
        for launch in self._tail:
            launch(main)

    # What a caller that drives the GPU itself (cuda_runner.py: CudaRunner) needs: the context, the stream
    # every forward runs on, where the (batch, 3, size, size) float32 input goes and the (batch, classes) output
    # comes out.
    @property
    def gpu(self) -> Gpu:
        self._check_open()
        return self._gpu

    @property
    def stream(self) -> Any:
        return self._stream

    @property
    def input_ptr(self) -> int:
        return self._in_ptr

    @property
    def output_ptr(self) -> int:
        return self._out_ptr

    def replay(self) -> None:
        """Enqueue one forward on ``stream`` (the context current), reading input_ptr, writing output_ptr."""
        self._run()

    def _run(self) -> None:
        if self._graph is not None:
            self._graph.launch()
        else:
            self._launch_all()

    def _check_open(self) -> None:
        """Before entering the context: a closed backend has released it, so it must not push or pop it."""
        if self._closed:
            raise EngineError("this cuda backend was closed; create a new one")

    def _upload(self, x: np.ndarray) -> None:
        if tuple(x.shape) != self.plan.input.dims:
            raise ValueError(f"input shape {tuple(x.shape)} does not match the plan's {self.plan.input.dims}")
        np.copyto(self._x_host, x, casting="same_kind")
        driver().memcpy_htod_async(self._in_ptr, self._x_host, self._stream)

    FEATURES = True

    @property
    def features_width(self) -> int:
        """Features per image: the global average pool's channels."""
        return self._f_host.shape[1]

    @property
    def features_ptr(self) -> int:
        """Where the global average pool's (batch, channels) float32 output is after a forward."""
        return self._features_ptr

    def forward(self, x: np.ndarray, features: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """The logits (probabilities where built with softmax); with ``features``, (those, the global average
        pool's output of the same forward, copied back from where the arena or the side buffer holds it)."""
        drv = driver()
        self._check_open()
        with self._gpu:
            self._upload(x)
            self._run()
            drv.memcpy_dtoh_async(self._y_host, self._out_ptr, self._stream)
            if features:
                drv.memcpy_dtoh_async(self._f_host, self._features_ptr, self._stream)
            self._stream.synchronize()
        return (self._y_host.copy(), self._f_host.copy()) if features else self._y_host.copy()

    def time_forward(self, x: np.ndarray, iters: int, warmup: int) -> list[float]:
        """Milliseconds per forward on the GPU's clock (CUDA events around the launches; the input is uploaded
        once before). Each forward starts from an idle GPU, as a latency-bound caller would see it."""
        drv = driver()
        self._check_open()
        with self._gpu:
            self._upload(x)
            return event_timed_ms(drv, self._stream, self._run, iters, warmup)

    def time_layers(self, x: np.ndarray, iters: int = 20, warmup: int = 1,
                    only: set[str] | None = None) -> dict[str, list[float]]:
        """Per op (or the ops named in ``only``): milliseconds of GPU time of its launches (a split-K conv counts
        both, a Winograd conv its three), launched eagerly.

        gpu_sleep holds the GPU while the host enqueues start event, the op's launches and end event for all
        iterations, so launch latency of the host is not counted as kernel time.
        """
        drv = driver()
        groups: dict[str, list[Launch]] = {}
        for launch in self._launches:
            if only is None or launch.spec.op in only:
                groups.setdefault(launch.spec.op, []).append(launch)
        out: dict[str, list[float]] = {}
        self._check_open()
        with self._gpu:
            self._upload(x)
            for _ in range(max(1, warmup)):
                self._launch_all()  # every buffer now holds what this op reads in a real forward
            events = [(drv.Event(), drv.Event()) for _ in range(iters)]
            for op, launches in groups.items():
                # 20 us of host time per enqueued call is generous; a longer sleep only costs idle GPU time.
                sleep_ns = 20_000 * (len(launches) + 2) * iters + 50_000
                self._sleep.prepared_async_call((1, 1, 1), spec("gpu_sleep").block, self._stream, sleep_ns)
                for start, end in events:
                    start.record(self._stream)
                    for launch in launches:
                        launch(self._stream)
                    end.record(self._stream)
                self._stream.synchronize()
                out[op] = [end.time_since(start) for start, end in events]
            del events  # destroyed while the context is current
        return out

    def download(self, buffer: str) -> np.ndarray:
        """The bytes of one of lowering's buffers ("arena", "params", ...) as the last forward left them: the device
        tests read every layer's output from an arena that reuses nothing (build_plan(reuse=False))."""
        self._check_open()
        out = np.empty(4 * self._buffer_words[buffer], np.uint8)
        with self._gpu:
            driver().memcpy_dtoh(out, self._buffers[buffer])
        return out

    def peak_memory_bytes(self) -> int:
        """Device memory this backend holds: arena, parameters, workspace (split-K, Winograd), probabilities."""
        return self._device_bytes

    def _free(self) -> None:
        for d in self.jpeg_decoders:
            d.close()
        self.jpeg_decoders = []
        if self._graph is not None:
            self._graph.close()
            self._graph = None
        for a in self._allocs:
            a.free()
        self._allocs = []
        for h in self._host:
            h.base.free()  # pagelocked_empty's array base is its HostAllocation
        self._host = []
        self._x_host = self._y_host = None
        self._launches = []
        self._stages, self._tail, self._streams = [], [], []
        self._sleep = None

    def close(self) -> None:
        if self._closed:
            return
        with self._gpu:
            self._free()
        self._gpu.release()
        self._closed = True

    def __enter__(self) -> CudaBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def time_convs(weights: Weights, plan: Plan, configs: dict[str, ConvConfig | None], precision: str = "fp32",
               fixup: bool = False, device: int = 0, iters: int = 10, nhwc: bool = False) -> dict[str, float]:
    """Median milliseconds of each conv of a forward with these configs: one eager, serial backend on this very plan
    (fused or not), CudaBackend.time_layers on an N(0, 1) input."""
    x = np.random.default_rng(0).standard_normal(plan.input.dims).astype(np.float32)
    with CudaBackend(weights, plan, graph=False, concurrent=False, device=device, fixup=fixup, precision=precision,
                     configs=configs, nhwc=nhwc, fuse=is_fused(plan)) as backend:
        ms = backend.time_layers(x, iters=iters, only={op.name for op in plan.conv_ops})
    return {name: statistics.median(t) for name, t in ms.items()}


def tune_configs(weights: Weights, plan: Plan, precision: str = "fp32", fixup: bool = False,
                 winograd: bool | None = True, device: int = 0, iters: int = 10, nhwc: bool = False,
                 measure: bool = True, progress: Callable[[int, int], None] | None = None, fresh: bool = False
                 ) -> tuple[dict[str, ConvConfig | None] | None, str]:
    """The configs of a forward with each conv's measured fastest candidate, and where they came from.

    In order: this machine's tuning cache ("cache": JSON per GPU, kernel build, conv shapes and mode in
    ``tuning_cache_dir()``), the package's table for this GPU model ("table"), and, where ``measure``, a measurement
    ("measured", then cached): every candidate of ``tuning_candidates`` (each direct tile, and Winograd unless
    winograd is False), each conv timed in place with CudaBackend.time_layers (median of ``iters``), one eager
    backend per candidate set, ``progress(done, total)`` after each. Otherwise (None, "model"): the caller takes the
    cost model's configs. fresh: measure whatever the cache and the table hold."""
    name, arch, num_sms = gpu_facts(device)  # no context: the backend creates the one it keeps
    key = tuning_key(name, arch, num_sms, plan, precision, fixup, winograd, nhwc)
    path = tuning_cache_dir() / f"{key}.json"
    if not fresh:
        try:
            return {name: config_from_json(d) for name, d in json.loads(path.read_text()).items()}, "cache"
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not tuned yet, or a damaged file
        shipped = table_configs(name, arch, num_sms, shape_key(plan, precision, fixup, winograd, nhwc))
        if shipped is not None:
            return shipped, "table"
    if not measure:
        return None, "model"
    wgmma = cuda_build.has_wgmma(arch)
    sets = tuning_candidates(plan, num_sms, fixup, precision, winograd, nhwc, wgmma)
    times = []
    for configs in sets:
        times.append(time_convs(weights, plan, configs, precision, fixup, device, iters, nhwc))
        if progress is not None:
            progress(len(times), len(sets))
    best = pick_fastest(choose_configs(plan, num_sms, fixup, precision, winograd, nhwc=nhwc, wgmma=wgmma), sets,
                        times)
    saved = {name: config_to_json(c) for name, c in best.items()}
    atomic_write(path, lambda f: f.write(json.dumps(saved, indent=1).encode()))
    return {name: config_from_json(d) for name, d in saved.items()}, "measured"  # as a later run reads them back
