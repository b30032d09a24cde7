"""ctypes bindings for the slice of cuDNN 9 (legacy API) and cuBLAS that the cudnn backend calls, and the one CUDA
driver call (cuStreamWaitValue32_v2) it times layers with.

Signatures and enum values follow cuDNN 9's ``cudnn_graph.h`` / ``cudnn_ops.h`` / ``cudnn_cnn.h`` and CUDA's
``cublas_api.h``. Every handle and descriptor is an opaque pointer (``c_void_p``); device pointers are passed as
integers. Calls go through ``Library.call``, which turns a failing status into one ``CudnnError`` line naming the
layer, the function and the library's own words for the status.

Where the libraries are looked for, in order: the loader's path (``libcudnn.so.9`` is in /lib/x86_64-linux-gnu on
the GPU machine; ``libcublas.so.13`` / ``.12`` where the CUDA toolkit is registered), then the CUDA toolkit's lib
directories, then the lib directories of NVIDIA's pip wheels (nvidia-cudnn-cu13 / -cu12, nvidia-cublas) on sys.path.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable
from ctypes import POINTER, byref, c_char_p, c_double, c_float, c_int, c_size_t, c_void_p
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BackendUnavailable, EngineError

# cudnn_graph.h / cudnn_ops.h / cudnn_cnn.h
CUDNN_STATUS_SUCCESS = 0
CUDNN_DATA_FLOAT = 0
CUDNN_TENSOR_NCHW = 0
CUDNN_CROSS_CORRELATION = 1  # what deep-learning frameworks call convolution (no kernel flip)
CUDNN_DEFAULT_MATH = 0  # on Ampere and newer this permits TF32 tensor-core math for float data
CUDNN_TENSOR_OP_MATH = 1  # tensor cores (TF32 for float data); 2 (..._ALLOW_CONVERSION) would permit fp16
CUDNN_FMA_MATH = 3  # plain fp32 FMA: no tensor cores, no TF32 (comparable with our own fp32 kernels)
CUDNN_PROPAGATE_NAN = 1
CUDNN_ACTIVATION_RELU = 1
CUDNN_POOLING_MAX = 0
CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 1
CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING = 2

# cudnnConvolutionFwdAlgo_t, by value
FWD_ALGOS = ("implicit_gemm", "implicit_precomp_gemm", "gemm", "direct", "fft", "fft_tiling", "winograd",
             "winograd_nonfused")

# cublas_api.h
CUBLAS_STATUS_SUCCESS = 0
CUBLAS_OP_N = 0
CUBLAS_OP_T = 1
CUBLAS_DEFAULT_MATH = 0  # fp32 stays fp32 (TF32 only with CUBLAS_TF32_TENSOR_OP_MATH)
CUBLAS_TF32_TENSOR_OP_MATH = 3

# cuda.h
CU_STREAM_WAIT_VALUE_GEQ = 0  # wait until (int32_t)(*addr - value) >= 0


class ConvFwdAlgoPerf(ctypes.Structure):
    """cudnnConvolutionFwdAlgoPerf_t (cudnn_cnn.h)."""

    _fields_ = [("algo", c_int), ("status", c_int), ("time", c_float), ("memory", c_size_t),
                ("determinism", c_int), ("math_type", c_int), ("reserved", c_int * 3)]


class CudnnError(EngineError):
    """A cuDNN or cuBLAS call failed. The message names the layer, the call and the library's reason."""


P = c_void_p  # handles, descriptors, device pointers, host scalars passed by address
PP = POINTER(c_void_p)  # out-parameter for Create* functions
I = c_int

CUDNN_FUNCTIONS: dict[str, tuple[Any, list[Any]]] = {
    "cudnnGetVersion": (c_size_t, []),
    "cudnnGetErrorString": (c_char_p, [I]),
    "cudnnGetLastErrorString": (None, [c_char_p, c_size_t]),
    "cudnnCreate": (I, [PP]),
    "cudnnDestroy": (I, [P]),
    "cudnnSetStream": (I, [P, P]),
    "cudnnCreateTensorDescriptor": (I, [PP]),
    "cudnnSetTensor4dDescriptorEx": (I, [P, I, I, I, I, I, I, I, I, I]),  # desc, dtype, n c h w, strides n c h w
    "cudnnDestroyTensorDescriptor": (I, [P]),
    "cudnnCreateFilterDescriptor": (I, [PP]),
    "cudnnSetFilter4dDescriptor": (I, [P, I, I, I, I, I, I]),  # desc, dtype, format, k c h w
    "cudnnDestroyFilterDescriptor": (I, [P]),
    "cudnnCreateConvolutionDescriptor": (I, [PP]),
    # desc, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w, mode, compute type
    "cudnnSetConvolution2dDescriptor": (I, [P, I, I, I, I, I, I, I, I]),
    "cudnnSetConvolutionMathType": (I, [P, I]),
    "cudnnGetConvolution2dForwardOutputDim": (I, [P, P, P, POINTER(I), POINTER(I), POINTER(I), POINTER(I)]),
    "cudnnDestroyConvolutionDescriptor": (I, [P]),
    "cudnnGetConvolutionForwardAlgorithmMaxCount": (I, [P, POINTER(I)]),
    # handle, xDesc, x, wDesc, w, convDesc, yDesc, y, requested, *returned, *perf, workspace, workspace bytes
    "cudnnFindConvolutionForwardAlgorithmEx": (I, [P, P, P, P, P, P, P, P, I, POINTER(I), POINTER(ConvFwdAlgoPerf),
                                                   P, c_size_t]),
    # handle, xDesc, wDesc, convDesc, yDesc, algo, *bytes
    "cudnnGetConvolutionForwardWorkspaceSize": (I, [P, P, P, P, P, I, POINTER(c_size_t)]),
    # handle, *alpha1, xDesc, x, wDesc, w, convDesc, algo, workspace, workspace bytes, *alpha2, zDesc, z,
    # biasDesc, bias, activationDesc, yDesc, y
    "cudnnConvolutionBiasActivationForward": (I, [P, P, P, P, P, P, P, I, P, c_size_t, P, P, P, P, P, P, P, P]),
    # handle, *alpha, xDesc, x, wDesc, w, convDesc, algo, workspace, workspace bytes, *beta, yDesc, y
    "cudnnConvolutionForward": (I, [P, P, P, P, P, P, P, I, P, c_size_t, P, P, P]),
    "cudnnActivationForward": (I, [P, P, P, P, P, P, P, P]),  # handle, desc, *alpha, xDesc, x, *beta, yDesc, y
    "cudnnCreateActivationDescriptor": (I, [PP]),
    "cudnnSetActivationDescriptor": (I, [P, I, I, c_double]),  # desc, mode, nan propagation, coef
    "cudnnDestroyActivationDescriptor": (I, [P]),
    "cudnnCreatePoolingDescriptor": (I, [PP]),
    # desc, mode, nan propagation, window h w, padding h w, stride h w
    "cudnnSetPooling2dDescriptor": (I, [P, I, I, I, I, I, I, I, I]),
    "cudnnDestroyPoolingDescriptor": (I, [P]),
    "cudnnPoolingForward": (I, [P, P, P, P, P, P, P, P]),  # handle, desc, *alpha, xDesc, x, *beta, yDesc, y
    "cudnnAddTensor": (I, [P, P, P, P, P, P, P]),  # handle, *alpha, aDesc, A, *beta, cDesc, C  (C = a A + b C)
}

CUBLAS_FUNCTIONS: dict[str, tuple[Any, list[Any]]] = {
    "cublasCreate_v2": (I, [PP]),
    "cublasDestroy_v2": (I, [P]),
    "cublasSetStream_v2": (I, [P, P]),
    "cublasSetMathMode": (I, [P, I]),
    "cublasSetWorkspace_v2": (I, [P, P, c_size_t]),  # handle, device buffer, bytes
    "cublasGetStatusString": (c_char_p, [I]),
    # handle, transa, transb, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc   (column-major)
    "cublasSgemm_v2": (I, [P, I, I, I, I, I, P, P, I, P, I, P, P, I]),
}


CUDA_FUNCTIONS: dict[str, tuple[Any, list[Any]]] = {
    # stream, device address, value, flags (CUDA >= 11.7; the unsuffixed symbol is the older call)
    "cuStreamWaitValue32_v2": (I, [P, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]),
    "cuGetErrorName": (I, [I, POINTER(c_char_p)]),
}


@dataclass
class Library:
    """A loaded library whose functions return a status; ``call`` checks it."""

    cdll: ctypes.CDLL
    path: str
    reason: Callable[[int], str]

    def bind(self, where: str, fn: str, *args: Any) -> Callable[[], None]:
        """``fn(*args)`` as a call with nothing left to look up; a failing status raises CudnnError."""
        f = getattr(self.cdll, fn)

        def run() -> None:
            status = f(*args)
            if status != 0:
                raise CudnnError(f"{where}: {fn} failed: {self.reason(status)}")

        return run

    def call(self, where: str, fn: str, *args: Any) -> None:
        self.bind(where, fn, *args)()

    def create(self, where: str, fn: str) -> c_void_p:
        """Run a ``cudnnCreate*`` / ``cublasCreate_v2`` style function and return the new handle."""
        h = c_void_p()
        self.call(where, fn, byref(h))
        return h


def _pip_lib_dirs(subdirs: tuple[str, ...]) -> list[Path]:
    """``<site-packages>/nvidia/<sub>/lib`` for every sys.path entry: where NVIDIA's pip wheels put their libraries."""
    return [Path(p) / "nvidia" / sub / "lib" for p in sys.path if p for sub in subdirs]


def _toolkit_lib_dirs() -> list[Path]:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return [Path(r) / sub for r in roots if r for sub in ("lib64", "targets/x86_64-linux/lib")]


def _load(sonames: tuple[str, ...], dirs: list[Path], what: str, how: str) -> tuple[ctypes.CDLL, str]:
    for name in sonames:  # the loader's own search path first (ld.so.cache, LD_LIBRARY_PATH)
        try:
            return ctypes.CDLL(name), name
        except OSError:
            pass
    broken = ""
    for path in (d / name for d in dirs for name in sonames):
        if path.is_file():
            try:
                return ctypes.CDLL(str(path)), str(path)
            except OSError as e:  # present but unloadable (a missing dependency, wrong architecture)
                broken = broken or f"; {path} does not load: {e}"
    raise BackendUnavailable(f"{what} not found (looked for {', '.join(sonames)} on the loader path, in the CUDA "
                             f"toolkit and in NVIDIA's pip wheels){broken}; {how}")


def _bind(cdll: ctypes.CDLL, path: str, functions: dict[str, tuple[Any, list[Any]]], what: str) -> None:
    for name, (restype, argtypes) in functions.items():
        try:
            f = getattr(cdll, name)
        except AttributeError:
            raise BackendUnavailable(f"{path} has no {name}: not a {what} library") from None
        f.restype = restype
        f.argtypes = argtypes


@functools.cache
def load_cudnn() -> Library:
    cdll, path = _load(("libcudnn.so.9",), _pip_lib_dirs(("cudnn",)), "cuDNN 9 (libcudnn.so.9)",
                       "install cuDNN 9 or `pip install nvidia-cudnn-cu13`")
    _bind(cdll, path, CUDNN_FUNCTIONS, "cuDNN 9")
    version = cdll.cudnnGetVersion()
    if version // 10000 != 9:
        raise BackendUnavailable(f"{path} is cuDNN {version}; the cudnn backend needs cuDNN 9")

    def reason(status: int) -> str:
        text = cdll.cudnnGetErrorString(status).decode()
        detail = ctypes.create_string_buffer(1024)
        cdll.cudnnGetLastErrorString(detail, len(detail))  # cuDNN 9's own explanation, when it has one
        last = detail.value.decode(errors="replace").strip().splitlines()
        return f"{text} ({status})" + (f": {last[0]}" if last else "")

    return Library(cdll, path, reason)


@functools.cache
def load_cublas() -> Library:
    sonames = ("libcublas.so.13", "libcublas.so.12")
    cdll, path = _load(sonames, _toolkit_lib_dirs() + _pip_lib_dirs(("cu13", "cublas")), "cuBLAS",
                       "install the CUDA toolkit or `pip install nvidia-cublas`")
    _bind(cdll, path, CUBLAS_FUNCTIONS, "cuBLAS")

    def reason(status: int) -> str:
        return f"{cdll.cublasGetStatusString(status).decode()} ({status})"

    return Library(cdll, path, reason)


def cudnn_version() -> int:
    """cuDNN's version as MAJOR * 10000 + MINOR * 100 + PATCH; needs no GPU."""
    return int(load_cudnn().cdll.cudnnGetVersion())


@functools.cache
def load_cuda_driver() -> Library:
    try:
        cdll = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise BackendUnavailable(f"the CUDA driver library libcuda.so.1 does not load ({e})") from None
    _bind(cdll, "libcuda.so.1", CUDA_FUNCTIONS, "CUDA driver (11.7 or newer)")

    def reason(status: int) -> str:
        name = c_char_p()
        cdll.cuGetErrorName(status, byref(name))
        return f"{(name.value or b'CUDA error').decode()} ({status})"

    return Library(cdll, "libcuda.so.1", reason)
