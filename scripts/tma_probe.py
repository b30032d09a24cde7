"""Can the engine drive Hopper's TMA im2col loads from pycuda? A feasibility check for issue 23's next kernel.

    python3 scripts/tma_probe.py [--tma-only | --bandwidth]     (on the GPU machine: sm_90, pycuda, nvcc)

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

Prints one line per check and exits non-zero if any fails. The maps are the engine's own (cuda.tensor_maps.encode, as
the TMA tiles use them: 64-byte rows in the 64-byte swizzle, which check 3 undoes). Check 2 loses the CUDA context
when it fails, so check 3 runs in a process of its own (--tma-only), with the map in global memory, which the ISA
accepts as well, and which the TMA tiles use since.

Outcome (session 9, the lent H100, 2026-11-26; docs/PERFORMANCE.md issue 23 item 14): 1 passes; 2 fails (the kernel
reads its next pointer argument as 0: compute-sanitizer saw a write to address 0), both as a prepared call with
sixteen "Q" and as a 128-byte numpy void scalar; 3 passes for all 7 taps, padding and row wraps included.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inception_engine.backends import cuda as cb  # noqa: E402
from inception_engine.errors import EngineError  # noqa: E402

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
    __shared__ alignas(1024) unsigned short box[%(elems)d];  // the swizzle repeats every 512 bytes
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
// Throughput: one thread a block streams `iters` boxes through a ring of 4 slots of 24 KB, each box from another
// place (pixel tile, channel block, tap), waiting for a slot's last box before reusing it.
extern "C" __global__ void tma_stream(const CUtensorMap* map, int iters, int bytes, int im2col, int tiles, int cblocks,
                                      int cbox, int rows_per_tile) {
    extern __shared__ __align__(1024) unsigned char ring[];
    __shared__ alignas(8) unsigned long long bars[4];
    if (threadIdx.x != 0) return;
    for (int s = 0; s < 4; ++s) {
        const unsigned b = (unsigned)__cvta_generic_to_shared(&bars[s]);
        asm volatile("mbarrier.init.shared::cta.b64 [%%0], 1;" ::"r"(b) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int i = 0; i < iters + 4; ++i) {
        const int s = i %% 4;
        const unsigned b = (unsigned)__cvta_generic_to_shared(&bars[s]);
        if (i >= 4) {
            const unsigned parity = (i / 4 - 1) & 1;
            asm volatile(
                "{\n.reg .pred p;\nWAIT_%%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%%0], %%1;\n@!p bra "
                "WAIT_%%=;\n}" ::"r"(b), "r"(parity) : "memory");
        }
        if (i >= iters) continue;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%%0], %%1;" ::"r"(b), "r"(bytes) : "memory");
        const unsigned dst = (unsigned)__cvta_generic_to_shared(ring + s * 24576);
        const int tile = (blockIdx.x + i * gridDim.x) %% tiles, c = (i %% cblocks) * cbox;
        if (im2col) {
            const int p = tile * rows_per_tile, n = p / (%(h)d * %(w)d), oh = p %% (%(h)d * %(w)d) / %(w)d,
                      ow = p %% %(w)d;
            const unsigned short tap = (unsigned short)(i %% 7), zero = 0;
            asm volatile(
                "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%%0], [%%1, "
                "{%%2, %%3, %%4, %%5}], [%%6], {%%7, %%8};" ::"r"(dst), "l"(map), "r"(c), "r"(ow - 3), "r"(oh),
                "r"(n), "r"(b), "h"(tap), "h"(zero) : "memory");
        } else {
            asm volatile(
                "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%%0], [%%1, {%%2, "
                "%%3}], [%%4];" ::"r"(dst), "l"(map), "r"(c), "r"(tile * rows_per_tile), "r"(b) : "memory");
        }
    }
}
// The map's 16 words as the kernel received them.
extern "C" __global__ void echo_map(const __grid_constant__ CUtensorMap map, unsigned long long* out) {
    if (threadIdx.x < 16) out[threadIdx.x] = reinterpret_cast<const unsigned long long*>(&map)[threadIdx.x];
}
""" % {"elems": PIXELS * CHANNELS, "h": H, "w": W}


def im2col_map(x_ptr: int, n: int = N, channels: int = CHANNELS, pixels: int = PIXELS) -> cb.Im2colMap:
    """The NHWC fp16 input as the engine's TMA tiles see it (cuda.tensor_maps): boxes of `pixels` window corners of
    the 1x7 conv x `channels` channels, in the swizzle of their row's bytes."""
    return cb.Im2colMap(x_ptr, 2, (C, W, H, n), C, (-PAD_W, 0), (PAD_W - (KW - 1), 0), channels, pixels, 1)


def bandwidth(module) -> None:
    """--bandwidth: GB/s of back-to-back TMA boxes, one thread a block on every SM, for the two row widths a stage
    of k could have (64 bytes: today's 32 fp16 channels; 128 bytes: 64), im2col (the A tile) and tiled (the B tile).
    Input as a 17x17 conv's at batch 128 (14 MB, mostly L2 hits)."""
    import pycuda.driver as drv

    n, k, cout = 128, 7 * C, 192
    x_gpu = drv.to_device(np.zeros((n, H, W, C), np.float16))
    w_gpu = drv.to_device(np.zeros((cout, k), np.float16))
    sms = drv.Context.get_device().get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)
    fn = module.get_function("tma_stream")
    fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, 4 * 24576)
    iters = 2000
    print(f"TMA boxes back to back, {sms} blocks of one thread, {iters} boxes each, 4 in flight a block:")
    for label, im2col, row_bytes in (("im2col 128 px", 1, 64), ("im2col 128 px", 1, 128), ("tiled 192 rows", 0, 64),
                                     ("tiled 192 rows", 0, 128)):
        if im2col:
            tmap = cb.encode(im2col_map(int(x_gpu), n, row_bytes // 2, 128))
            rows, tiles, cblocks, rows_per_tile = 128, n * H * W // 128, C // (row_bytes // 2), 128
        else:
            tmap = cb.encode(cb.TiledMap(int(w_gpu), 2, k, cout, row_bytes // 2, cout))
            rows, tiles, cblocks, rows_per_tile = cout, 1, k // (row_bytes // 2), cout
        map_gpu = drv.to_device(np.frombuffer(tmap, np.uint8))
        box = rows * row_bytes
        args = (map_gpu, np.int32(iters), np.int32(box), np.int32(im2col), np.int32(tiles), np.int32(cblocks),
                np.int32(row_bytes // 2), np.int32(rows_per_tile))
        fn(*args, block=(32, 1, 1), grid=(sms, 1), shared=4 * 24576)  # warm-up
        start, end = drv.Event(), drv.Event()
        start.record()
        fn(*args, block=(32, 1, 1), grid=(sms, 1), shared=4 * 24576)
        end.record()
        end.synchronize()
        ms = end.time_since(start)
        gbs = sms * iters * box / ms / 1e6
        print(f"  {label} x {row_bytes} B rows ({box // 1024} KB a box): {gbs:7.0f} GB/s, {gbs / sms:5.1f} GB/s an SM")


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


def unswizzle_64b(box: np.ndarray) -> np.ndarray:
    """The rows of a box of 64-byte rows as the 64-byte swizzle stored them (16-byte chunk j of row p at chunk
    j ^ (p / 2 mod 4)), in plain order."""
    chunks = box.reshape(len(box), 4, -1)
    rows = np.arange(len(box))[:, None]
    return chunks[rows, np.arange(4)[None, :] ^ (rows >> 1 & 3)].reshape(box.shape)


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
        box = np.empty((PIXELS, CHANNELS), np.float16)
        drv.memcpy_dtoh(box, out)
        got = unswizzle_64b(box)
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
        tmap = cb.encode(im2col_map(int(x_gpu)))
        print("PASS encode: cuTensorMapEncodeIm2col accepted the NHWC fp16 map through ctypes (cuda.tensor_maps)")
    except (OSError, AttributeError, EngineError) as e:
        print(f"FAIL encode: {e}")
        return 1
    module = SourceModule(KERNEL, arch="sm_90a", no_extern_c=True, options=["-std=c++17"])
    if "--bandwidth" in sys.argv:
        bandwidth(module)
        return 0
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
