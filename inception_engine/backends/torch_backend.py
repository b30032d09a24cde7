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

PyTorch is optional: it is imported here only, when this backend is asked for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import BackendUnavailable, EngineError
from . import host_timed_ms
from ..plan import ConvOp, FCOp, GlobalAvgPoolOp, Plan, PoolOp, View
from ..weights import Weights

PRECISIONS = ("fp32", "tf32", "fp16")
GRAPH_WARMUP = 3  # eager runs on a side stream before capture, as PyTorch's CUDA-graph notes ask


def _is_whole(v: View) -> bool:
    return v.c_offset == 0 and v.channels == v.c_total


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
                 precision: str = "fp32"):
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
        if graph:
            self._capture()

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

    def _run(self, x: Any) -> Any:
        """The network on ``x`` (already on the device, right dtype); returns the logits tensor (N, classes)."""
        F, torch = self.F, self.torch
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
                w, b = self.params[op.name]
                y = F.relu(F.conv2d(src, w, b, stride=op.stride, padding=op.pad), inplace=True)
            elif isinstance(op, PoolOp) and op.kind == "max":
                y = F.max_pool2d(src, op.kernel, op.stride, op.pad)
            elif isinstance(op, PoolOp):
                y = F.avg_pool2d(src, op.kernel, op.stride, op.pad, count_include_pad=op.count_include_pad)
            elif isinstance(op, GlobalAvgPoolOp):
                y = F.adaptive_avg_pool2d(src, 1)
            elif isinstance(op, FCOp):
                w, b = self.params[op.name]
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

    @property
    def mode(self) -> str:
        return "graph" if self.graph is not None else "eager"

    def _launch(self) -> Any:
        if self.graph is not None:
            self.graph.replay()
            return self.static_out
        with self._math_mode():
            return self._run(self.static_in)

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
        self.params = {}
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
