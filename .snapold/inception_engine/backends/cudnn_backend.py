"""cuDNN backend: the same Plan on the same weights through cuDNN 9 and cuBLAS, the yardstick for our own kernels.

Everything is set up once, at init: one device arena (the plan's), one weight block, one workspace, one
descriptor per view, and per convolution the algorithm cudnnFindConvolutionForwardAlgorithmEx measured fastest among
those that run in the precision asked for: "fp32" (the default) allows plain FMA math only (CUDNN_FMA_MATH, cuBLAS
default math: no tensor cores, no TF32, like our own kernels); "tf32" allows TF32 tensor-core math as well (each
layer runs the math type Find measured for its algorithm; cuBLAS in CUBLAS_TF32_TENSOR_OP_MATH).

Then one eager forward, and (``graph=True``, the default) the whole forward, every cuDNN and cuBLAS call on the
backend's stream, is captured once into a CUDA graph that each forward replays: the host's ~10 us per cuDNN call no
longer bounds small batches, so timings compare cuDNN's kernels with ours. If capture fails the backend runs eagerly
and says why in ``graph_fallback`` (never silently). cuBLAS gets a workspace of its own (cublasSetWorkspace) so that
nothing is allocated inside the capture.

Concat costs nothing: a tensor descriptor with explicit strides (n-stride = C_total * H * W) describes a channel
slice of a concat buffer, so convolutions and pools write straight into their slice. Ops:

- convolution: cudnnConvolutionBiasActivationForward, y = relu(conv(x) + bias). Its ``z`` input gets ``y`` with
  alpha2 = 0 (the API wants a z; PyTorch's cudnn_convolution_relu does the same). RELU allows every algorithm
  (the cuDNN API reference restricts only IDENTITY activation, to IMPLICIT_PRECOMP_GEMM); an algorithm Find offers
  that the fused call still refuses for these descriptors is skipped at init, and the next fastest is tried; a
  layer the fused call refuses with every algorithm runs as cudnnConvolutionForward + cudnnAddTensor +
  cudnnActivationForward (listed in ``unfused``).
- max / average pool: cudnnPoolingForward (average pools count padding or not as the op says);
- global average pool: cudnnPoolingForward with an H x W window;
- fc: cublasSgemm (default math, no TF32), then the bias by cudnnAddTensor.

Timing (``time_forward``, ``time_layers``) is device time between CUDA events with the input already on the device
(the input upload and the logits download are the same for every GPU backend and are left out), as in the cuda
backend. Eagerly (``graph=False``) ops are called from Python one by one, so at small batch sizes the host's cost per
cuDNN call can bound ``time_forward``; ``time_layers`` always runs ops one by one and holds the stream behind a gate
so that it measures GPU time only.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Callable, Iterator
from ctypes import byref, c_float, c_int, c_size_t, c_void_p
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cudnn_api import (CUBLAS_DEFAULT_MATH, CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_TF32_TENSOR_OP_MATH,
                         CUDNN_ACTIVATION_RELU, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH,
                         CUDNN_FMA_MATH, CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
                         CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, CUDNN_POOLING_MAX, CUDNN_PROPAGATE_NAN,
                         CUDNN_TENSOR_NCHW, CUDNN_TENSOR_OP_MATH, CU_STREAM_WAIT_VALUE_GEQ, FWD_ALGOS,
                         ConvFwdAlgoPerf, CudnnError, Library, load_cublas, load_cuda_driver, load_cudnn)
from ..cuda_graph import CudaGraph
from ..errors import EngineError
from ..plan import ConvOp, FCOp, GlobalAvgPoolOp, Plan, PoolOp, View
from ..weights import Weights
from . import event_timed_ms
from .cuda.device import probe

F32 = 4  # bytes
ALIGN_BYTES = 256
GATED_ITERS = 32  # time_layers: iterations enqueued behind one closed gate (the stream's queue is finite)
CUBLAS_WORKSPACE_BYTES = 32 << 20  # what the cuBLAS docs recommend for Hopper; set explicitly for graph capture

PRECISIONS = ("fp32", "tf32")
MATH_NAMES = {CUDNN_DEFAULT_MATH: "default", CUDNN_TENSOR_OP_MATH: "tensor_op", CUDNN_FMA_MATH: "fma"}
# precision -> (math type set on every convolution descriptor for Find, math types a Find result may have,
#               cuBLAS math mode). TENSOR_OP_MATH_ALLOW_CONVERSION (fp32 -> fp16) is never allowed.
MATH = {"fp32": (CUDNN_FMA_MATH, (CUDNN_FMA_MATH,), CUBLAS_DEFAULT_MATH),
        "tf32": (CUDNN_TENSOR_OP_MATH, (CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_FMA_MATH),
                 CUBLAS_TF32_TENSOR_OP_MATH)}


def _aligned(nbytes: int) -> int:
    return (nbytes + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES


def _is_whole(v: View) -> bool:
    return v.c_offset == 0 and v.channels == v.c_total


@functools.cache
def _primary_context(device: int) -> Any:
    """The device's primary context (the one the CUDA runtime inside cuDNN and cuBLAS uses), retained once per
    process and never released: releasing the last reference would destroy it under the runtime's feet."""
    import pycuda.driver as drv

    drv.init()
    return drv.Device(device).retain_primary_context()


@dataclass
class _Conv:
    """Everything cudnnConvolutionBiasActivationForward needs for one layer except the algorithm and workspace."""

    lib: Library
    handle: c_void_p
    where: str
    x: c_void_p
    xp: int
    w: c_void_p
    wp: int
    conv: c_void_p
    y: c_void_p
    yp: int
    bias: c_void_p
    bp: int
    relu: c_void_p
    one: int  # addresses of host floats 1 and 0
    zero: int

    def fused(self, algo: int, ws_ptr: int, ws_bytes: int) -> Callable[[], None]:
        """y = relu(conv(x) + bias) in one call. The API also adds alpha2 * z; z = y with alpha2 = 0 (PyTorch's
        cudnn_convolution_relu does the same), so y's old contents must not matter."""
        return self.lib.bind(self.where, "cudnnConvolutionBiasActivationForward", self.handle, self.one, self.x,
                             self.xp, self.w, self.wp, self.conv, algo, ws_ptr, ws_bytes, self.zero, self.y, self.yp,
                             self.bias, self.bp, self.relu, self.y, self.yp)

    def unfused(self, algo: int, ws_ptr: int, ws_bytes: int) -> Callable[[], None]:
        """The same in three calls (convolution, bias, ReLU in place): two more passes over y, for layers whose
        descriptors the fused call refuses."""
        calls = [self.lib.bind(self.where, "cudnnConvolutionForward", self.handle, self.one, self.x, self.xp, self.w,
                               self.wp, self.conv, algo, ws_ptr, ws_bytes, self.zero, self.y, self.yp),
                 self.lib.bind(self.where, "cudnnAddTensor", self.handle, self.one, self.bias, self.bp, self.one,
                               self.y, self.yp),
                 self.lib.bind(self.where, "cudnnActivationForward", self.handle, self.relu, self.one, self.y,
                               self.yp, self.zero, self.y, self.yp)]

        def run() -> None:
            for call in calls:
                call()

        return run


class CudnnBackend:
    name = "cudnn"
    PRECISIONS = PRECISIONS

    @classmethod
    def check_available(cls) -> None:
        probe()  # pycuda, a driver and a GPU, as for the cuda backend
        load_cudnn()
        load_cublas()

    def __init__(self, weights: Weights, plan: Plan, algo: str = "find", find_workspace_mib: int = 1024,
                 device: int = 0, graph: bool = True, precision: str = "fp32"):
        """``algo``: "find" (fastest per layer, measured) or one cuDNN algorithm for every layer, by name
        (``FWD_ALGOS``: "implicit_gemm", "implicit_precomp_gemm", ...). ``find_workspace_mib`` caps the workspace
        an algorithm may need during the search (and so the one kept). ``graph``: replay the forward as one CUDA
        graph (eager if capture fails; ``graph_fallback`` says why). ``precision``: "fp32" or "tf32"."""
        if algo != "find" and algo not in FWD_ALGOS:
            raise ValueError(f"algo must be 'find' or one of {', '.join(FWD_ALGOS)}, got {algo!r}")
        if precision not in PRECISIONS:
            raise EngineError(f"the cudnn backend has no {precision!r} mode; choose one of {', '.join(PRECISIONS)}")
        if not _is_whole(plan.input):
            raise ValueError("the plan's input must be a whole buffer")
        import pycuda.driver as drv

        self.plan = plan
        self.algo = algo
        self.precision = precision
        self._drv = drv
        self._cudnn = load_cudnn()
        self._cublas = load_cublas()
        self._closed = False
        self._ctx = _primary_context(device)
        self._allocs: list[Any] = []
        self._destroy: list[tuple[Library, str, c_void_p]] = []  # (library, destroy function, handle)
        self._descs: dict[View, c_void_p] = {}
        self.algos: dict[str, str] = {}  # conv op -> the cuDNN algorithm it runs
        self.math: dict[str, str] = {}  # conv op -> the math type it runs ("fma", "default", "tensor_op")
        self.unfused: list[str] = []  # conv ops the fused call refused, run as convolution + bias + ReLU
        self.graph_fallback: str | None = None  # why a graph was asked for and the forward runs eagerly
        self._graph: CudaGraph | None = None
        try:
            with self._active():
                self._setup(weights, find_workspace_mib << 20)
                if graph:
                    self._capture()
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def _active(self) -> Iterator[None]:
        """The device's primary context is current inside; nothing stays pushed between calls, so this backend and
        others (the cuda backend, PyTorch) can live in one process."""
        self._ctx.push()
        try:
            yield
        finally:
            self._drv.Context.pop()

    # ---- set-up -------------------------------------------------------------------------------------------------

    def _setup(self, weights: Weights, find_ws_cap: int) -> None:
        drv = self._drv
        self._stream = drv.Stream()
        self._handle = self._own(self._cudnn, "cudnnDestroy", self._cudnn.create("cudnn init", "cudnnCreate"))
        self._cudnn.call("cudnn init", "cudnnSetStream", self._handle, self._stream.handle)
        self._blas = self._own(self._cublas, "cublasDestroy_v2", self._cublas.create("cublas init", "cublasCreate_v2"))
        self._cublas.call("cublas init", "cublasSetStream_v2", self._blas, self._stream.handle)
        self._cublas.call("cublas init", "cublasSetMathMode", self._blas, MATH[self.precision][2])
        self._one, self._zero = c_float(1.0), c_float(0.0)  # host scalars, passed by address

        plan = self.plan
        self._arena_bytes = plan.arena_elems * F32
        self._arena = self._alloc(self._arena_bytes)
        # after cublasSetStream, which resets the workspace to cuBLAS's own pool
        self._cublas.call("cublas init", "cublasSetWorkspace_v2", self._blas,
                          int(self._alloc(CUBLAS_WORKSPACE_BYTES)), CUBLAS_WORKSPACE_BYTES)
        drv.memset_d32(self._arena, 0, plan.arena_elems)  # the algorithm search reads it: finite values
        self._upload_weights(weights)
        self._gate = self._alloc(F32)  # time_layers holds the stream on this word
        drv.memset_d32(self._gate, 0, 1)
        self._gate_count = 0

        self._relu = self._own(self._cudnn, "cudnnDestroyActivationDescriptor",
                               self._cudnn.create("cudnn init", "cudnnCreateActivationDescriptor"))
        self._cudnn.call("cudnn init", "cudnnSetActivationDescriptor", self._relu, CUDNN_ACTIVATION_RELU,
                         CUDNN_PROPAGATE_NAN, 0.0)

        # Pass 1: describe every convolution and pick its algorithm, with a generous scratch workspace.
        convs = {op.name: self._describe_conv(op) for op in plan.conv_ops}
        free_bytes, _ = drv.mem_get_info()
        find_ws_bytes = max(min(find_ws_cap, free_bytes // 2), ALIGN_BYTES)
        find_ws = drv.mem_alloc(find_ws_bytes)
        try:
            chosen = {name: self._choose_algo(conv, int(find_ws), find_ws_bytes) for name, conv in convs.items()}
        finally:
            self._stream.synchronize()
            find_ws.free()
        # Pass 2: one workspace, the largest any chosen algorithm needs; every op bound to its arguments.
        self._ws_bytes = _aligned(max([ws for _, ws, _, _ in chosen.values()] + [1]))
        ws_ptr = int(self._alloc(self._ws_bytes))
        self.algos = {name: FWD_ALGOS[algo] for name, (algo, _, _, _) in chosen.items()}
        self.math = {name: MATH_NAMES[math] for name, (_, _, math, _) in chosen.items()}
        self.unfused = [name for name, (_, _, _, fused) in chosen.items() if not fused]
        self._runs = []
        for op in plan.ops:
            if isinstance(op, ConvOp):
                algo, _, _, fused = chosen[op.name]
                conv = convs[op.name]
                self._runs.append((conv.fused if fused else conv.unfused)(algo, ws_ptr, self._ws_bytes))
            else:
                self._runs.append(self._prepare(op))

        self._in_ptr = self._ptr(plan.input)
        self._host_in = drv.pagelocked_empty(plan.input.dims, np.float32)
        out = plan.buffers[plan.output.buffer]
        self._out_ptr = int(self._arena) + out.offset * F32
        self._host_out = drv.pagelocked_empty(out.shape, np.float32)

    def _own(self, lib: Library, destroy: str, handle: c_void_p) -> c_void_p:
        self._destroy.append((lib, destroy, handle))
        return handle

    def _alloc(self, nbytes: int) -> Any:
        a = self._drv.mem_alloc(nbytes)
        self._allocs.append(a)
        return a

    def _upload_weights(self, weights: Weights) -> None:
        """Every op's weight and bias in one device block, each array 256-byte aligned."""
        arrays: dict[str, np.ndarray] = {}
        for op in self.plan.ops:
            if isinstance(op, (ConvOp, FCOp)):
                for part in ("weight", "bias"):
                    arrays[f"{op.name}.{part}"] = np.ascontiguousarray(weights.arrays[f"{op.name}.{part}"],
                                                                       dtype=np.float32)
        offsets, total = {}, 0
        for k, a in arrays.items():
            offsets[k] = total
            total += _aligned(a.nbytes)
        host = np.zeros(max(total, ALIGN_BYTES) // F32, np.float32)
        for k, a in arrays.items():
            host[offsets[k] // F32:offsets[k] // F32 + a.size] = a.ravel()
        self._weights_bytes = host.nbytes
        block = self._alloc(host.nbytes)
        self._drv.memcpy_htod(block, host)
        self._wptr = {k: int(block) + off for k, off in offsets.items()}

    def _ptr(self, v: View) -> int:
        _, _, h, w = v.shape
        return int(self._arena) + (v.offset + v.c_offset * h * w) * F32

    def _tensor(self, v: View) -> c_void_p:
        """A descriptor of the view: N x channels x H x W inside an N x C_total x H x W buffer."""
        if v not in self._descs:
            n, c_total, h, w = v.shape
            d = self._own(self._cudnn, "cudnnDestroyTensorDescriptor",
                          self._cudnn.create("cudnn init", "cudnnCreateTensorDescriptor"))
            self._cudnn.call("cudnn init", "cudnnSetTensor4dDescriptorEx", d, CUDNN_DATA_FLOAT, n, v.channels, h, w,
                             c_total * h * w, h * w, w, 1)
            self._descs[v] = d
        return self._descs[v]

    def _packed(self, where: str, n: int, c: int, h: int, w: int) -> c_void_p:
        d = self._own(self._cudnn, "cudnnDestroyTensorDescriptor",
                      self._cudnn.create(where, "cudnnCreateTensorDescriptor"))
        self._cudnn.call(where, "cudnnSetTensor4dDescriptorEx", d, CUDNN_DATA_FLOAT, n, c, h, w, c * h * w, h * w,
                         w, 1)
        return d

    def _prepare(self, op: Any) -> Callable[[], None]:
        """A pool or fc op as one call with every argument bound."""
        if isinstance(op, PoolOp):
            if op.kind == "max":
                mode = CUDNN_POOLING_MAX
            elif op.count_include_pad:
                mode = CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
            else:
                mode = CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING
            return self._prepare_pool(op, mode, (op.kernel, op.kernel), op.pad, (op.stride, op.stride))
        if isinstance(op, GlobalAvgPoolOp):
            hw = (op.src.h, op.src.w)
            return self._prepare_pool(op, CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, hw, 0, hw)
        if isinstance(op, FCOp):
            return self._prepare_fc(op)
        raise TypeError(f"{op.name}: unknown op {type(op).__name__}")

    def _prepare_pool(self, op: Any, mode: int, window: tuple[int, int], pad: int,
                      stride: tuple[int, int]) -> Callable[[], None]:
        lib, where = self._cudnn, op.name
        desc = self._own(lib, "cudnnDestroyPoolingDescriptor", lib.create(where, "cudnnCreatePoolingDescriptor"))
        lib.call(where, "cudnnSetPooling2dDescriptor", desc, mode, CUDNN_PROPAGATE_NAN, *window, pad, pad, *stride)
        return lib.bind(where, "cudnnPoolingForward", self._handle, desc, ctypes.addressof(self._one),
                        self._tensor(op.src), self._ptr(op.src), ctypes.addressof(self._zero), self._tensor(op.dst),
                        self._ptr(op.dst))

    def _prepare_fc(self, op: FCOp) -> Callable[[], None]:
        """logits (N, out) = x (N, in) @ W.T + b. cuBLAS is column-major: a row-major (N, out) matrix with row
        stride ldc is the column-major (out, N) matrix C, so C = op(A) B with A = W seen as (in, out) column-major
        and transposed, B = x seen as (in, N) column-major."""
        src, dst, where = op.src, op.dst, op.name
        n, k, m = self.plan.batch, src.channels * src.h * src.w, dst.channels
        if not (dst.h == dst.w == 1 and (src.h == src.w == 1 or _is_whole(src))):
            raise ValueError(f"{where}: fc needs (N, C, 1, 1) views or a whole input buffer")
        ldb, ldc = src.c_total * src.h * src.w, dst.c_total
        gemm = self._cublas.bind(where, "cublasSgemm_v2", self._blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k,
                                 ctypes.addressof(self._one), self._wptr[where + ".weight"], k, self._ptr(src), ldb,
                                 ctypes.addressof(self._zero), self._ptr(dst), ldc)
        bias = self._cudnn.bind(where, "cudnnAddTensor", self._handle, ctypes.addressof(self._one),
                                self._packed(where, 1, m, 1, 1), self._wptr[where + ".bias"],
                                ctypes.addressof(self._one), self._tensor(dst), self._ptr(dst))

        def run() -> None:
            gemm()
            bias()

        return run

    def _describe_conv(self, op: ConvOp) -> _Conv:
        lib, where = self._cudnn, op.name
        o, c = op.dst.channels, op.src.channels
        x = self._tensor(op.src)
        w = self._own(lib, "cudnnDestroyFilterDescriptor", lib.create(where, "cudnnCreateFilterDescriptor"))
        lib.call(where, "cudnnSetFilter4dDescriptor", w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, o, c, *op.kernel)
        conv = self._own(lib, "cudnnDestroyConvolutionDescriptor",
                         lib.create(where, "cudnnCreateConvolutionDescriptor"))
        lib.call(where, "cudnnSetConvolution2dDescriptor", conv, *op.pad, op.stride, op.stride, 1, 1,
                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)
        lib.call(where, "cudnnSetConvolutionMathType", conv, MATH[self.precision][0])
        dims = [c_int() for _ in range(4)]
        lib.call(where, "cudnnGetConvolution2dForwardOutputDim", conv, x, w, *map(byref, dims))
        if tuple(d.value for d in dims) != op.dst.dims:
            raise CudnnError(f"{where}: cuDNN computes output {tuple(d.value for d in dims)}, the plan says "
                             f"{op.dst.dims}")
        return _Conv(lib, self._handle, where, x, self._ptr(op.src), w, self._wptr[where + ".weight"], conv,
                     self._tensor(op.dst), self._ptr(op.dst), self._packed(where, 1, o, 1, 1),
                     self._wptr[where + ".bias"], self._relu, ctypes.addressof(self._one),
                     ctypes.addressof(self._zero))

    def _choose_algo(self, conv: _Conv, ws_ptr: int, ws_bytes: int) -> tuple[int, int, int, bool]:
        """(algorithm, workspace bytes, math type, fused): the fastest algorithm Find measured (or the one asked
        for) in a math type the precision allows, through the fused call where cuDNN accepts it, else as three
        calls. Each candidate is tried by running it once (the output is overwritten later); the convolution
        descriptor keeps the math type of the one returned."""
        lib, where = self._cudnn, conv.where
        set_math, allowed, _ = MATH[self.precision]
        if self.algo != "find":
            algo, ws = FWD_ALGOS.index(self.algo), c_size_t()
            lib.call(where, "cudnnGetConvolutionForwardWorkspaceSize", self._handle, conv.x, conv.w, conv.conv,
                     conv.y, algo, byref(ws))
            if ws.value > ws_bytes:
                raise CudnnError(f"{where}: {self.algo} needs {ws.value >> 20} MiB of workspace, more than the "
                                 f"{ws_bytes >> 20} MiB allowed")
            candidates = [(algo, ws.value, set_math)]
            found = self.algo
        else:
            count, returned = c_int(), c_int()
            lib.call(where, "cudnnGetConvolutionForwardAlgorithmMaxCount", self._handle, byref(count))
            perf = (ConvFwdAlgoPerf * count.value)()
            lib.call(where, "cudnnFindConvolutionForwardAlgorithmEx", self._handle, conv.x, conv.xp, conv.w,
                     conv.wp, conv.conv, conv.y, conv.yp, count.value, byref(returned), perf, ws_ptr, ws_bytes)
            results = perf[:returned.value]  # fastest first
            # fp32: plain-FMA results only (tensor cores / TF32 are not what we compare against there)
            candidates = [(p.algo, p.memory, p.math_type) for p in results
                          if p.status == 0 and p.math_type in allowed and p.memory <= ws_bytes]
            found = ", ".join(f"{FWD_ALGOS[p.algo]} status {p.status} math {p.math_type} {p.memory >> 20} MiB"
                              for p in results) or "nothing"
        refused = []
        for fused in (True, False):  # the fused call may refuse what plain convolution (which Find measures) accepts
            for algo, ws, math in candidates:
                lib.call(where, "cudnnSetConvolutionMathType", conv.conv, math)
                try:
                    (conv.fused if fused else conv.unfused)(algo, ws_ptr, ws_bytes)()
                except CudnnError as e:
                    refused.append(str(e))
                    continue
                return algo, ws, math, fused
        raise CudnnError(f"{where}: no cuDNN algorithm runs this convolution in {self.precision} "
                         f"(Find: {found}; {' / '.join(refused) or 'nothing to try'})")

    # ---- running ------------------------------------------------------------------------------------------------

    def _upload(self, x: np.ndarray) -> None:
        if self._closed:
            raise EngineError("this cudnn backend was closed; create a new one")
        if x.shape != self.plan.input.dims:
            raise ValueError(f"input shape {x.shape} does not match the plan's {self.plan.input.dims}")
        self._host_in[...] = x
        self._drv.memcpy_htod_async(self._in_ptr, self._host_in, self._stream)

    def _run_all(self) -> None:
        for run in self._runs:
            run()

    def _capture(self) -> None:
        """One eager forward first (whatever cuDNN or cuBLAS set up lazily happens outside the capture), then the
        same calls captured. A failure leaves the backend eager, with the reason in ``graph_fallback``."""
        self._run_all()
        self._stream.synchronize()
        try:
            self._graph = CudaGraph(self._stream.handle, self._run_all)
        except EngineError as e:  # CudnnError from a call refused inside the capture, or the driver's refusal
            self.graph_fallback = f"CUDA-graph capture failed ({' '.join(str(e).split())}); running eagerly"
        self._stream.synchronize()

    @property
    def mode(self) -> str:
        return "graph" if self._graph is not None else "eager"

    def _forward_on_device(self) -> None:
        if self._graph is not None:
            self._graph.launch()
        else:
            self._run_all()

    def forward(self, x: np.ndarray) -> np.ndarray:
        with self._active():
            self._upload(x)
            self._forward_on_device()
            self._drv.memcpy_dtoh_async(self._host_out, self._out_ptr, self._stream)
            self._stream.synchronize()
        v = self.plan.output
        return self._host_out[:, v.c_offset:v.c_offset + v.channels].reshape(self.plan.batch, -1).copy()

    def time_forward(self, x: np.ndarray, iters: int, warmup: int) -> list[float]:
        """Device ms per forward (all ops, input already on the device), one CUDA-event pair per forward, each
        forward starting on an idle GPU."""
        with self._active():
            self._upload(x)
            return event_timed_ms(self._drv, self._stream, self._forward_on_device, iters, warmup)

    def time_layers(self, x: np.ndarray, iters: int = 20, warmup: int = 1) -> dict[str, list[float]]:
        """Device ms of each op, ``iters`` times (an event pair around each run).

        The stream first waits on a gate word (cuStreamWaitValue32); the host enqueues the runs and their events
        behind it and only then opens the gate from a second stream, so the host's ~10 us per cuDNN call is not
        counted as GPU time for short ops."""
        drv = self._drv
        wait = load_cuda_driver()
        out: dict[str, list[float]] = {}
        with self._active():
            opener = drv.Stream()
            self._upload(x)
            for _ in range(max(1, warmup)):
                self._run_all()  # every op's input now holds what it reads in a real forward
            for op, run in zip(self.plan.ops, self._runs):
                out[op.name] = []
                for first in range(0, iters, GATED_ITERS):
                    self._gate_count += 1
                    wait.call(op.name, "cuStreamWaitValue32_v2", self._stream.handle, int(self._gate),
                              self._gate_count, CU_STREAM_WAIT_VALUE_GEQ)
                    events = [(drv.Event(), drv.Event()) for _ in range(min(GATED_ITERS, iters - first))]
                    for start, end in events:
                        start.record(self._stream)
                        run()
                        end.record(self._stream)
                    drv.memset_d32_async(self._gate, self._gate_count, 1, opener)
                    self._stream.synchronize()
                    out[op.name] += [start.time_till(end) for start, end in events]
        return out

    def peak_memory_bytes(self) -> int:
        """Device memory this backend holds: arena + weights + cuDNN's and cuBLAS's workspaces (the handles' own
        memory and the graph's not included)."""
        return self._arena_bytes + self._weights_bytes + self._ws_bytes + CUBLAS_WORKSPACE_BYTES

    # ---- direct access, for tests that check one op against poisoned memory ------------------------------------

    def read_arena(self) -> np.ndarray:
        host = np.empty(self.plan.arena_elems, np.float32)
        with self._active():
            self._stream.synchronize()
            self._drv.memcpy_dtoh(host, self._arena)
        return host

    def write_arena(self, host: np.ndarray) -> None:
        with self._active():
            self._stream.synchronize()
            self._drv.memcpy_htod(self._arena, np.ascontiguousarray(host, dtype=np.float32))

    def run_op(self, index: int) -> None:
        with self._active():
            self._runs[index]()
            self._stream.synchronize()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._active():
            stream = getattr(self, "_stream", None)
            if stream is not None:
                stream.synchronize()
            if self._graph is not None:  # before the memory its kernels point into is freed
                self._graph.close()
                self._graph = None
            for lib, destroy, handle in reversed(self._destroy):
                getattr(lib.cdll, destroy)(handle)  # status ignored: nothing left to do about it at teardown
            self._destroy.clear()
            for a in self._allocs:
                a.free()
            self._allocs.clear()
