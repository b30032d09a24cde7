"""PyTorch backend: the same Plan on the same weight file, run by torch.nn.functional (no torchvision), for comparison.

Ops are the Plan's, in order: conv2d + bias + relu, max / avg pool (count_include_pad per op), adaptive average
pool, linear. A concat is torch.cat of its parts, done when the concat buffer is first read; every buffer is dropped
after its last reader (the Plan's lifetimes), so eager memory stays close to what the network needs.

Options: ``device`` "auto" (cuda when available, else cpu), "cpu", "cuda" or "cuda:N"; ``graph`` replays one
captured CUDA graph (static input and output tensors) instead of running eagerly; ``precision`` "fp32" (TF32 off
for matmul and cuDNN, the like-for-like comparison), "tf32" (TF32 allowed) or "fp16" (half weights and input,
channels_last). cuDNN autotuning (``torch.backends.cudnn.benchmark``) is on, as cuDNN's Find is for the cudnn backend.
The TF32 and benchmark switches are process-wide in PyTorch; they are set only while this backend runs and put back
afterwards.

``compile_mode`` "reduce-overhead" or "max-autotune" runs the same network as an ``nn.Module`` (the weights its
parameters) through ``torch.compile(module, mode=..., dynamic=False)``: what a user gets from one line. Both modes
replay CUDA graphs (Inductor's CUDA-graph trees), so they need a CUDA device and Triton. The compile happens in
``__init__``, at this plan's batch size (static shapes: another batch size is another backend, another compile), and
``compile_seconds`` says how long it took (see ``_compile``).

PyTorch is optional: it is imported here only, when this backend is asked for.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import BackendUnavailable, EngineError
from ..errors import first_line
from . import host_timed_ms
from ..plan import ConvOp, FCOp, GlobalAvgPoolOp, Plan, PoolOp, View
from ..weights import Weights

PRECISIONS = ("fp32", "tf32", "fp16")
GRAPH_WARMUP = 3  # eager runs on a side stream before capture, as PyTorch's CUDA-graph notes ask
# torch.compile modes offered; both capture CUDA graphs ("max-autotune" is max-autotune-no-cudagraphs plus them).
COMPILE_MODES = ("reduce-overhead", "max-autotune")
# Calls counted as compiling: CUDA-graph trees run a newly compiled function once to warm it up (after Dynamo,
# Inductor and any autotuning, all inside that first call) and record its graph on the second; replays start at
# the third. A function asking for a further warm-up records on a later call, inside the bench's warm-up forwards.
COMPILE_CALLS = 2

Params = Mapping[str, tuple[Any, Any]]  # conv / fc op name -> (weight, bias) tensors


def _is_whole(v: View) -> bool:
    return v.c_offset == 0 and v.channels == v.c_total


class CompileFailed(RuntimeError):
    """torch.compile raised; the message is one line naming the error underneath PyTorch's wrappers."""


def compile_failure(e: BaseException) -> str:
    """The error under a torch.compile failure, as ``Type: first line``. Dynamo and Inductor wrap it
    (BackendCompilerFailed, InductorError: ``inner_exception``, or a ``__cause__``) in messages whose first line says
    only where it happened ("backend='inductor' raised:")."""
    seen: set[int] = set()
    while id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "inner_exception", None) or e.__cause__
        if not isinstance(inner, BaseException):
            break
        e = inner
    return f"{type(e).__name__}: {first_line(e)}" if str(e).strip() else type(e).__name__


def _compile_counts() -> dict[str, int]:
    """Inductor's and AOTAutograd's cache hits and misses and the CUDA graphs Inductor skipped, so far in this
    process; empty where PyTorch keeps no such counters (they are internal: only ever read, never relied on)."""
    try:
        from torch._dynamo.utils import counters

        return {"hit": counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
                "miss": counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["autograd_cache_miss"],
                "skips": counters["inductor"]["cudagraph_skips"]}
    except Exception:  # moved or renamed in another PyTorch version
        return {}


class TorchBackend:
    name = "torch"
    PRECISIONS = PRECISIONS

    @classmethod
    def check_available(cls) -> None:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise BackendUnavailable("PyTorch is not installed (pip install torch); the torch backend is only a "
                                     "comparison and nothing else needs it") from None

    def __init__(self, weights: Weights, plan: Plan, device: str = "auto", graph: bool = False,
                 precision: str = "fp32", compile_mode: str | None = None):
        self.check_available()
        import torch
        import torch.nn.functional as F

        if precision not in PRECISIONS:
            raise EngineError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
            raise BackendUnavailable(f"torch backend: device {device!r} is not usable here "
                                     f"(CUDA available: {torch.cuda.is_available()}); use device='cpu' or 'auto'")
        if compile_mode is not None:
            self._check_compile(torch, compile_mode, graph, device)
        if graph and device == "cpu":
            raise BackendUnavailable("torch backend: graph=True needs a CUDA device")
        self.torch, self.F = torch, F
        self.plan = plan
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.precision = precision
        self.dtype = torch.float16 if precision == "fp16" else torch.float32
        self.memory_format = torch.channels_last if precision == "fp16" else torch.contiguous_format
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

        self.params: dict[str, Any] = {}
        for op in plan.ops:
            if isinstance(op, (ConvOp, FCOp)):
                # np.array copies: weight files load read-only, and torch wants arrays it may write
                w = torch.from_numpy(np.array(weights.arrays[op.name + ".weight"], dtype=np.float32))
                b = torch.from_numpy(np.array(weights.arrays[op.name + ".bias"], dtype=np.float32))
                w = w.to(self.device, self.dtype)
                if w.dim() == 4:
                    w = w.contiguous(memory_format=self.memory_format)
                self.params[op.name] = (w, b.to(self.device, self.dtype))
        # Buffers nobody reads after op i, dropped right after it.
        self._dead_after = [[b.name for b in plan.buffers.values() if b.last == i] for i in range(len(plan.ops))]
        self.static_in = torch.zeros(plan.input.dims, dtype=self.dtype, device=self.device).contiguous(
            memory_format=self.memory_format)
        self.graph = None
        self.compiled: Any = None
        self.compile_seconds: float | None = None  # wall seconds of the first COMPILE_CALLS compiled calls
        self.compile_cached: bool | None = None  # True: Inductor's on-disk caches served the code; None: unknown
        self.graph_fallback: str | None = None
        if graph:
            self._capture()
        if compile_mode is not None:
            self._compile(compile_mode)

    @staticmethod
    def _check_compile(torch: Any, mode: str, graph: bool, device: str) -> None:
        if mode not in COMPILE_MODES:
            raise EngineError(f"compile_mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
        if graph:
            raise EngineError("torch backend: graph=True and compile_mode both capture CUDA graphs; choose one")
        if not hasattr(torch, "compiler"):
            raise BackendUnavailable(f"PyTorch {torch.__version__} has no torch.compiler (needs 2.1 or newer)")
        try:
            import triton  # noqa: F401  (Inductor writes the GPU kernels in Triton)
        except ImportError:
            raise BackendUnavailable("torch.compile on the GPU needs Triton, which is not installed (pip install "
                                     "triton; PyTorch's CUDA wheels bring it)") from None
        if device == "cpu":
            raise BackendUnavailable(f"torch backend: compile_mode {mode!r} replays CUDA graphs and needs a CUDA "
                                     f"device")

    @contextlib.contextmanager
    def _math_mode(self) -> Iterator[None]:
        """TF32 per ``precision`` and cuDNN autotuning on, for the duration; PyTorch's previous settings after."""
        torch = self.torch
        saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                 torch.backends.cudnn.benchmark)
        tf32 = self.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True
        try:
            with torch.no_grad():
                yield
        finally:
            (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.benchmark) = saved

    def _run(self, x: Any, params: Params | None = None) -> Any:
        """The network on ``x`` (already on the device, right dtype); returns the logits tensor (N, classes).
        ``params``: the weights to use, ``self.params`` by default (the compiled module passes its parameters)."""
        F, torch = self.F, self.torch
        params = self.params if params is None else params
        whole: dict[str, Any] = {self.plan.input.buffer: x}  # buffer -> tensor holding all its channels
        parts: dict[str, dict[int, Any]] = {}  # concat buffer -> {channel offset: tensor} until it is read

        def read(v: View) -> Any:
            if v.buffer not in whole:
                pieces = parts[v.buffer]
                if v.c_offset in pieces and pieces[v.c_offset].shape[1] == v.channels:
                    return pieces[v.c_offset]
                whole[v.buffer] = torch.cat([pieces[c] for c in sorted(pieces)], dim=1)
                del parts[v.buffer]
            t = whole[v.buffer]
            return t if _is_whole(v) else t[:, v.c_offset:v.c_offset + v.channels]

        def write(v: View, t: Any) -> None:
            if _is_whole(v):
                whole[v.buffer] = t
            else:
                parts.setdefault(v.buffer, {})[v.c_offset] = t

        for op, dead in zip(self.plan.ops, self._dead_after):
            src = read(op.src)
            if isinstance(op, ConvOp):
                w, b = params[op.name]
                y = F.relu(F.conv2d(src, w, b, stride=op.stride, padding=op.pad), inplace=True)
            elif isinstance(op, PoolOp) and op.kind == "max":
                y = F.max_pool2d(src, op.kernel, op.stride, op.pad)
            elif isinstance(op, PoolOp):
                y = F.avg_pool2d(src, op.kernel, op.stride, op.pad, count_include_pad=op.count_include_pad)
            elif isinstance(op, GlobalAvgPoolOp):
                y = F.adaptive_avg_pool2d(src, 1)
            elif isinstance(op, FCOp):
                w, b = params[op.name]
                y = F.linear(src.flatten(1), w, b)[:, :, None, None]
            else:
                raise TypeError(f"{op.name}: unknown op {type(op).__name__}")
            write(op.dst, y)
            for name in dead:
                whole.pop(name, None)
                parts.pop(name, None)
        return read(self.plan.output).reshape(self.plan.batch, -1)

    def _capture(self) -> None:
        torch = self.torch
        with self._math_mode():
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # autotuning and lazy init happen here, not inside the capture
                for _ in range(GRAPH_WARMUP):
                    self._run(self.static_in)
            torch.cuda.current_stream(self.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_out = self._run(self.static_in)

    def as_module(self) -> Any:
        """The network as a ``torch.nn.Module``, as a user would hand it to torch.compile: the weights (the same
        tensors, same dtype and layout) are its parameters, so CUDA-graph trees treat them as static addresses and do
        not copy them in before every replay; ``forward`` is ``_run``."""
        torch = self.torch
        backend = self
        # ParameterDict keys may not contain '.', which op names do ("Mixed_5b.branch1x1")
        keys = {name: name.replace(".", "__") for name in self.params}

        class Inception(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.weight = torch.nn.ParameterDict(
                    {keys[n]: torch.nn.Parameter(w, requires_grad=False) for n, (w, _) in backend.params.items()})
                self.bias = torch.nn.ParameterDict(
                    {keys[n]: torch.nn.Parameter(b, requires_grad=False) for n, (_, b) in backend.params.items()})

            def forward(self, x: Any) -> Any:
                return backend._run(x, {n: (self.weight[k], self.bias[k]) for n, k in keys.items()})

        return Inception().eval()

    def _compile(self, mode: str) -> None:
        """torch.compile the module at this batch size and call it until its CUDA graph is recorded.

        ``compile_seconds`` is the wall time of those COMPILE_CALLS calls, the GPU synchronised at the end: Dynamo's
        trace, Inductor's code generation and (max-autotune) kernel benchmarking, Triton's compiles, the warm-up run
        and the graph's capture. Dynamo's in-memory caches are cleared first, so every batch size is traced afresh
        and earlier ones' entries cannot reach Dynamo's recompile limit; Inductor's on-disk caches (FX graph,
        AOTAutograd, autotuning, Triton kernels) are left as a user has them: ``compile_cached`` says when they
        served the code (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 turns them off)."""
        torch = self.torch
        torch.compiler.reset()
        module = self.as_module()
        # The input tensor is a static address too, as static_in is to torch-graph's capture: the timing is of the
        # network with its input already in place, as for every other row, not of a copy into the graph's own buffer.
        mark_static = getattr(torch._dynamo, "mark_static_address", None)
        if mark_static is not None:
            mark_static(self.static_in)
        before = _compile_counts()
        t0 = time.perf_counter()
        try:
            compiled = torch.compile(module, mode=mode, dynamic=False)
            with self._math_mode():
                for _ in range(COMPILE_CALLS):
                    self._step_begin()
                    compiled(self.static_in)
            torch.cuda.synchronize(self.device)
        except Exception as e:  # Dynamo's, Inductor's and Triton's own error types
            self._release_compiled()
            raise CompileFailed(f"torch.compile(mode={mode!r}) failed at batch {self.plan.batch}: "
                                f"{compile_failure(e)}") from None
        self.compile_seconds = time.perf_counter() - t0
        self.compiled = compiled
        after = _compile_counts()
        if before and after:
            hits, misses = after["hit"] - before["hit"], after["miss"] - before["miss"]
            self.compile_cached = True if hits and not misses else False if misses else None
            if after["skips"] > before["skips"]:
                self.graph_fallback = (f"torch.compile(mode={mode!r}) skipped CUDA graphs (PyTorch logged why); "
                                       f"its kernels are launched one by one")

    def _step_begin(self) -> None:
        """A new inference step for CUDA-graph trees: the previous call's outputs (already copied out, or dropped)
        may be overwritten by this replay."""
        self.torch.compiler.cudagraph_mark_step_begin()  # in torch.compiler since 2.1, which _check_compile asks for

    def _release_compiled(self) -> None:
        """Drop the compiled code and the memory pools of its CUDA graphs (they outlive the module otherwise, and
        the next rows of a benchmark need the memory)."""
        torch = self.torch
        self.compiled = None
        torch.compiler.reset()
        try:
            from torch._inductor import cudagraph_trees

            cudagraph_trees.reset_cudagraph_trees()
        except Exception:  # internal API: without it the pools go when the process does
            pass
        torch.cuda.empty_cache()

    @property
    def mode(self) -> str:
        return "compile" if self.compiled is not None else "graph" if self.graph is not None else "eager"

    def _launch(self) -> Any:
        if self.graph is not None:
            self.graph.replay()
            return self.static_out
        if self.compiled is not None:
            self._step_begin()
        # the compiled call too: Dynamo's guards check the TF32 switches and grad mode it was compiled under
        with self._math_mode():
            return self._run(self.static_in) if self.compiled is None else self.compiled(self.static_in)

    def forward(self, x: np.ndarray) -> np.ndarray:
        if x.shape != self.plan.input.dims:
            raise ValueError(f"input shape {x.shape} does not match the plan's {self.plan.input.dims}")
        self.static_in.copy_(self.torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
        return self._launch().float().cpu().numpy()

    def time_forward(self, x: np.ndarray, iters: int, warmup: int) -> list[float]:
        """ms per forward, input already on the device: CUDA events on the GPU, perf_counter on the CPU."""
        torch = self.torch
        self.static_in.copy_(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
        for _ in range(warmup):
            self._launch()
        if not self.cuda:
            return host_timed_ms(self._launch, iters)
        times = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(iters):
            start.record()
            self._launch()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return times

    def peak_memory_bytes(self) -> int:
        """On the GPU: PyTorch's peak allocated bytes on the device since init (weights, activations, workspaces;
        the whole process, so other torch users in it count too). On the CPU: the weights and the static input only,
        a lower bound."""
        if self.cuda:
            return int(self.torch.cuda.max_memory_allocated(self.device))
        return sum(t.numel() * t.element_size() for pair in self.params.values() for t in pair) + \
            self.static_in.numel() * self.static_in.element_size()

    def close(self) -> None:
        self.graph = None
        if self.compiled is not None:
            self._release_compiled()
        self.params = {}
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
