"""Can the engine drive Hopper's TMA im2col loads from pycuda? A feasibility check for issue 23's next kernel.

    python3 scripts/tma_probe.py [--tma-only]     (on the GPU machine: sm_90, pycuda, nvcc)

Sessions 4-9 measured the warp-specialized conv tiles' producers issuing ~95 instructions a warp per stage for their
five 16-byte cp.async (docs/PERFORMANCE.md, issue 23 items 11-13), and named TMA loads as the way out: one thread
asks the copy engine for a whole 128-pixel x 32-channel A tile of the implicit GEMM, the im2col addressing and the
zero padding done in hardware. Three things have to work for that from this code base, and this script checks each:

1. the driver's cuTensorMapEncodeIm2col, called through ctypes (pycuda does not wrap it), accepts an im2col map of an
   NHWC fp16 activation (a 17x17 map of 192 channels, a 1x7 conv's padding: Mixed_6b-6e's branch7x7_2);
2. the 128-byte map reaches a kernel as a __grid_constant__ parameter through pycuda (a 128-byte numpy void scalar
   in an unprepared call; it is the first parameter, so the 64-byte alignment the ISA asks for holds);
3. cp.async.bulk.tensor's im2col mode loads, for each of the 7 taps, the rows the implicit GEMM needs: pixel p of
   the first 128 output pixels, channels c0..c0+31 of input column ow + tap - 3, zero past the image's edges.

Prints one line per check and exits non-zero if any fails. Not a test of the engine: nothing here is used by it yet.
Check 2 loses the CUDA context when it fails, so check 3 runs in a process of its own (--tma-only), with the map in
global memory, which the ISA accepts as well.

Outcome (session 9, the lent H100, 2026-11-26; docs/PERFORMANCE.md issue 23 item 14): 1 passes; 2 fails (the kernel
reads its next pointer argument as 0: compute-sanitizer saw a write to address 0), both as a prepared call with
sixteen "Q" and as a 128-byte numpy void scalar; 3 passes for all 7 taps, padding and row wraps included.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

N, H, W, C = 2, 17, 17, 192  # NHWC fp16 input of a 17x17 module conv
KW, PAD_W = 7, 3  # a 1x7 conv: taps along W, padding 3 on each side
PIXELS, CHANNELS = 128, 32  # one A tile: 128 output pixels x 32 channels (64 bytes a row)
C0 = 64  # the channel slice the probe loads

KERNEL = r"""
#include <cuda.h>
// One thread asks the TMA unit for one im2col box: PIXELS rows of CHANNELS fp16 values, into shared memory, then the
// block copies it out.
extern "C" __global__ void tma_im2col_box(const CUtensorMap* map, unsigned short* out, int c, int w, int h, int n,
                                          int off_w, int off_h, int bytes) {
    __shared__ alignas(128) unsigned short box[%(elems)d];
    __shared__ alignas(8) unsigned long long bar;
    const unsigned b = (unsigned)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%%0], 1;" ::"r"(b) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%%0], %%1;" ::"r"(b), "r"(bytes) : "memory");
        const unsigned dst = (unsigned)__cvta_generic_to_shared(box);
        const unsigned short ow = (unsigned short)off_w, oh = (unsigned short)off_h;
        asm volatile(
            "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%%0], [%%1, {%%2, "
            "%%3, %%4, %%5}], [%%6], {%%7, %%8};" ::"r"(dst), "l"(map), "r"(c), "r"(w), "r"(h), "r"(n), "r"(b),
            "h"(ow), "h"(oh) : "memory");
        asm volatile(
            "{\n.reg .pred p;\nWAIT_%%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%%0], 0;\n@!p bra WAIT_%%=;\n}"
            ::"r"(b) : "memory");
    }
    __syncthreads();
    for (int i = threadIdx.x; i < %(elems)d; i += blockDim.x) out[i] = box[i];
}
// The map's 16 words as the kernel received them.
extern "C" __global__ void echo_map(const __grid_constant__ CUtensorMap map, unsigned long long* out) {
    if (threadIdx.x < 16) out[threadIdx.x] = reinterpret_cast<const unsigned long long*>(&map)[threadIdx.x];
}
""" % {"elems": PIXELS * CHANNELS}


def encode_im2col(x_ptr: int) -> bytes:
    """The im2col tensor map of the NHWC input (dims and strides innermost first, as the driver takes them)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    tmap = (ctypes.c_uint64 * 16)()  # CUtensorMap: 128 opaque bytes, 64-byte aligned (ctypes arrays of u64: 8, so
    if ctypes.addressof(tmap) % 64:  # over-allocate and align by hand when needed)
        raw = (ctypes.c_uint8 * (128 + 64))()
        tmap = (ctypes.c_uint64 * 16).from_address((ctypes.addressof(raw) + 63) // 64 * 64)
    dims = (ctypes.c_uint64 * 4)(C, W, H, N)
    strides = (ctypes.c_uint64 * 3)(2 * C, 2 * C * W, 2 * C * W * H)  # bytes, dims 1..3
    lower = (ctypes.c_int * 2)(-PAD_W, 0)  # W, H: the first window's corner
    upper = (ctypes.c_int * 2)(PAD_W - (KW - 1), 0)  # the last window's corner, from the far edge
    elem_strides = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
    f = cuda.cuTensorMapEncodeIm2col
    f.restype = ctypes.c_int
    rc = f(ctypes.byref(tmap), 6, 4, ctypes.c_void_p(x_ptr), dims, strides, lower, upper,  # 6: FLOAT16
           ctypes.c_uint32(CHANNELS), ctypes.c_uint32(PIXELS), elem_strides, 0, 0, 0, 0)  # no interleave, swizzle,
    if rc != 0:  # L2 promotion; out-of-bounds elements read as zero
        raise RuntimeError(f"cuTensorMapEncodeIm2col returned CUresult {rc}")
    return bytes(tmap)


def expected_box(x: np.ndarray, tap: int) -> np.ndarray:
    """Rows of the implicit GEMM's A tile: output pixel p = (n, oh, ow) of the first PIXELS, input column
    ow + tap - PAD_W (zero outside), channels C0 .. C0 + CHANNELS - 1."""
    rows = np.zeros((PIXELS, CHANNELS), np.float16)
    for p in range(PIXELS):
        n, rest = divmod(p, H * W)
        oh, ow = divmod(rest, W)
        iw = ow + tap - PAD_W
        if 0 <= iw < W:
            rows[p] = x[n, oh, iw, C0:C0 + CHANNELS]
    return rows


def tma_loads(module, x: np.ndarray, tmap: bytes) -> int:
    """Check 3: each tap's im2col box against the implicit GEMM's A rows, the map in global memory."""
    import pycuda.driver as drv

    fn = module.get_function("tma_im2col_box")
    map_gpu = drv.to_device(np.frombuffer(tmap, np.uint8))  # 256-byte aligned
    out = drv.mem_alloc(PIXELS * CHANNELS * 2)
    ok = True
    for tap in range(KW):
        # the box's first pixel: image 0, output (0, 0), whose window corner is column -PAD_W
        fn(map_gpu, out, *(np.int32(v) for v in (C0, -PAD_W, 0, 0, tap, 0, PIXELS * CHANNELS * 2)),
           block=(128, 1, 1), grid=(1, 1))
        got = np.empty((PIXELS, CHANNELS), np.float16)
        drv.memcpy_dtoh(got, out)
        want = expected_box(x, tap)
        bad = int((got.view(np.uint16) != want.view(np.uint16)).any(axis=1).sum())
        ok &= bad == 0
        print(f"{'PASS' if bad == 0 else 'FAIL'} tap {tap}: the box's {PIXELS} rows "
              + ("match the implicit GEMM's A rows" if bad == 0 else f"differ in {bad} rows"))
    return 0 if ok else 1


def main() -> int:
    """Checks 1 and 2 (--tma-only: 1 and 3; a failed check 2 loses the context, so 3 runs in a process of its
    own)."""
    import pycuda.autoinit  # noqa: F401  (a context on device 0)
    import pycuda.driver as drv
    from pycuda.compiler import SourceModule

    major, minor = drv.Context.get_device().compute_capability()
    if (major, minor) < (9, 0):
        print(f"SKIP: compute capability {major}.{minor}; TMA needs 9.0")
        return 0
    x = np.random.default_rng(0).standard_normal((N, H, W, C)).astype(np.float16)
    x_gpu = drv.to_device(x)
    try:
        tmap = encode_im2col(int(x_gpu))
        print("PASS encode: cuTensorMapEncodeIm2col accepted the NHWC fp16 map through ctypes")
    except (OSError, AttributeError, RuntimeError) as e:
        print(f"FAIL encode: {e}")
        return 1
    module = SourceModule(KERNEL, arch="sm_90a", no_extern_c=True, options=["-std=c++17"])
    if "--tma-only" in sys.argv:
        return tma_loads(module, x, tmap)
    out = drv.mem_alloc(16 * 8)
    as_struct = np.frombuffer(tmap, np.dtype((np.void, 128)))[0]  # one argument of 128 bytes, passed by value
    module.get_function("echo_map")(as_struct, out, block=(32, 1, 1), grid=(1, 1))
    back = np.empty(16, np.uint64)
    try:
        drv.memcpy_dtoh(back, out)
    except drv.Error as e:
        print(f"FAIL param: the 128-byte map as a by-value parameter through pycuda: {e}")
        return 1
    same = np.array_equal(back, np.frombuffer(tmap, np.uint64))
    print(f"{'PASS' if same else 'FAIL'} param: the 128-byte map as a by-value parameter through pycuda")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
