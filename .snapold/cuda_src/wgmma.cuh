// wgmma.cuh: Hopper's warpgroup matrix multiply (wgmma.mma_async, sm_90a) for conv_nhwc_*.cu's shared tiles.
//
// A warpgroup (4 consecutive warps, the first a multiple of 4) multiplies a 64 x K tile A by a K x N tile B, both
// read by the tensor cores straight from shared memory through 64-bit matrix descriptors, into fp32 accumulators
// (s32 for int8) spread over its 128 threads (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
//   D 64 x N: thread (warp w of the group, lane: g = lane / 4, t = lane % 4) holds, for each n8 block j,
//   d[4j] = D[16w + g][8j + 2t], d[4j + 1] = D[16w + g][8j + 2t + 1], d[4j + 2] = D[16w + g + 8][8j + 2t],
//   d[4j + 3] = D[16w + g + 8][8j + 2t + 1].
// Both tiles are K-major (A[row][k], B[n][k], k contiguous: the only layout .tf32 and .s8 accept) with rows of 64
// bytes in the 64-byte swizzle mode: byte address bits [4, 6) (the 16-byte piece of a row) are XORed with bits [7, 9)
// (row / 2 mod 4), exactly conv_nhwc.cuh's swizzled() on a tile that starts at a multiple of 512 bytes. One
// instruction takes 32 bytes of each row (k16 of fp16, k8 of tf32, k32 of int8); the second half of the rows is the
// same descriptor 32 bytes on.
//
// Ordering: shared memory written by cp.async reaches the tensor cores' (async) proxy only after the writing thread's
// fence.proxy.async and a barrier; wgmma.fence orders the accumulator registers before the first wgmma that reads
// them; commit + wait(0) returns when the group's products are in the registers.
#pragma once

#ifdef __CUDACC__
namespace wgmma {
// The descriptor of a K-major tile of 64-byte rows, 64-byte swizzle, starting at `tile` (512-byte aligned): start
// address / 16 in bits 0-13, leading byte offset (unused by swizzled K-major tiles, set to 1 as the ISA's examples)
// in 16-29, stride byte offset between 8-row groups (8 x 64 bytes) / 16 in 32-45, swizzle mode 2 (64 bytes) in 62-63.
__device__ __forceinline__ unsigned long long desc_k_major_64b(const void* tile) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(tile));
    return (unsigned long long)((a & 0x3FFFF) >> 4) | 1ull << 16 | (unsigned long long)(512 >> 4) << 32 | 2ull << 62;
}
constexpr unsigned long long DESC_32_BYTES = 32 >> 4;  // added to a descriptor: the same rows, 32 bytes further on
// The same for rows of 128 bytes in the 128-byte swizzle (mode 1): byte address bits [4, 7) XORed with bits [7, 10)
// (row mod 8), 8-row groups 1024 bytes apart. In both modes the swizzle is a function of the shared address, with
// the descriptor's base offset (bits 49-51) 0, so a tile may start at any row of a buffer written that way: row i
// of the tile is then row start + i of the buffer (conv_nhwc_halo.cu's halo tiles shift a tile by rows so), as a
// probe on the GPU showed (docs/performance-log.md) and the halo tiles' GPU tests rely on.
__device__ __forceinline__ unsigned long long desc_k_major_128b(const void* tile) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(tile));
    return (unsigned long long)((a & 0x3FFFF) >> 4) | 1ull << 16 | (unsigned long long)(1024 >> 4) << 32 | 1ull << 62;
}
// The same for rows of 32 bytes (one k16 of fp16) in the 32-byte swizzle (mode 3): byte address bit 4 XORed with
// bit 7 (row / 4 mod 2), 8-row groups 256 bytes apart (NhwcF32's fp16 halves, conv_nhwc.cuh's swizzled32()).
__device__ __forceinline__ unsigned long long desc_k_major_32b(const void* tile) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(tile));
    return (unsigned long long)((a & 0x3FFFF) >> 4) | 1ull << 16 | (unsigned long long)(256 >> 4) << 32 | 3ull << 62;
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// This thread's ordinary (and cp.async) shared-memory writes before the async proxy's reads that follow a barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// setmaxnreg: the executing warpgroup's registers a thread become N (more: inc, waits until the SM has them; fewer:
// dec, gives them back), so that warpgroups with different jobs split the SM's register file unevenly.
template <int N, bool INC>
__device__ __forceinline__ void max_registers() {
    if constexpr (INC)
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
    else
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

// Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmma.
template <int R>
__device__ __forceinline__ void fence_registers(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fence_registers(int (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// The accumulators d[0 .. R) as in-out operands of constraint C ("+f" for f32 sums, "+r" for s32 ones).
#define IE_WG_D8(C, i) \
    C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), C(d[i + 4]), C(d[i + 5]), C(d[i + 6]), C(d[i + 7])
#define IE_WG_D16(C) IE_WG_D8(C, 0), IE_WG_D8(C, 8)
#define IE_WG_D32(C) IE_WG_D16(C), IE_WG_D8(C, 16), IE_WG_D8(C, 24)
#define IE_WG_D48(C) IE_WG_D32(C), IE_WG_D8(C, 32), IE_WG_D8(C, 40)
#define IE_WG_D64(C) IE_WG_D32(C), IE_WG_D8(C, 32), IE_WG_D8(C, 40), IE_WG_D8(C, 48), IE_WG_D8(C, 56)
#define IE_WG_D96(C) IE_WG_D64(C), IE_WG_D8(C, 64), IE_WG_D8(C, 72), IE_WG_D8(C, 80), IE_WG_D8(C, 88)
#define IE_WG_R16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define IE_WG_R32 IE_WG_R16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define IE_WG_R48 IE_WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define IE_WG_R64 \
    IE_WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, " \
              "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define IE_WG_R96 \
    IE_WG_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, " \
              "%83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"

// Mma<N>::f16 / tf32 / s8 (one specialization per N, from IE_WGMMA with N's register lists):
// d = A B (accumulate 0) or d += A B (accumulate 1) for one k step: fp16 (m64nNk16, both operands not transposed:
// K-major) or tf32 (m64nNk8) into f32 sums, or int8 (m64nNk32 .s32.s8.s8, exact s32 sums that wrap rather than
// saturate; 8-bit operands must be K-major, and the instruction has no scale or transpose operands). Each is 32 bytes
// of every row. N = 192, 128, 96, 64, 32. The flag (scale-d) is a predicate set from a register. Starting a tile
// with accumulate 0 instead of zeroing d matters: a register written by another instruction between the wgmma of one
// pipeline makes ptxas serialize them (C7515).
#define IE_WGMMA(N, R, REGS, DESC_A, DESC_B, ACC)                                                                 \
    template <>                                                                                                   \
    struct Mma<N> {                                                                                               \
        __device__ __forceinline__ static void f16(float (&d)[R], unsigned long long a, unsigned long long b,     \
                                                   int acc) {                                                     \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N     \
                         "k16.f32.f16.f16 {" REGS "}, " DESC_A ", " DESC_B ", p, 1, 1, 0, 0;\n}"                  \
                         : IE_WG_D##R("+f")                                                                       \
                         : "l"(a), "l"(b), "r"(acc));                                                             \
        }                                                                                                         \
        __device__ __forceinline__ static void tf32(float (&d)[R], unsigned long long a, unsigned long long b,    \
                                                    int acc) {                                                    \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N     \
                         "k8.f32.tf32.tf32 {" REGS "}, " DESC_A ", " DESC_B ", p, 1, 1;\n}"                       \
                         : IE_WG_D##R("+f")                                                                       \
                         : "l"(a), "l"(b), "r"(acc));                                                             \
        }                                                                                                         \
        __device__ __forceinline__ static void s8(int (&d)[R], unsigned long long a, unsigned long long b,        \
                                                  int acc) {                                                      \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N     \
                         "k32.s32.s8.s8 {" REGS "}, " DESC_A ", " DESC_B ", p;\n}"                                \
                         : IE_WG_D##R("+r")                                                                       \
                         : "l"(a), "l"(b), "r"(acc));                                                             \
        }                                                                                                         \
    };

template <int N>
struct Mma;
IE_WGMMA(192, 96, IE_WG_R96, "%96", "%97", "%98")
IE_WGMMA(128, 64, IE_WG_R64, "%64", "%65", "%66")
IE_WGMMA(96, 48, IE_WG_R48, "%48", "%49", "%50")
IE_WGMMA(64, 32, IE_WG_R32, "%32", "%33", "%34")
IE_WGMMA(32, 16, IE_WG_R16, "%16", "%17", "%18")
}  // namespace wgmma

// mbarrier (shared-memory transaction barriers, PTX ISA "Parallel Synchronization and Communication Instructions:
// mbarrier"): a 64-bit word in shared memory that completes a phase when `count` arrivals have been made since the
// last one, then counts again. wait(parity) returns once the phase of that parity has completed: a fresh barrier is
// in phase 0, so wait(0) waits for its first completion. Arrivals release and waits acquire (the default .release /
// .acquire at CTA scope), so what a thread wrote before its arrival is visible to the threads that waited.
namespace mbarrier {
__device__ __forceinline__ unsigned at(const unsigned long long* bar) {
    return static_cast<unsigned>(__cvta_generic_to_shared(bar));
}
__device__ __forceinline__ void init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(at(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(at(bar)) : "memory");
}
__device__ __forceinline__ bool try_wait(unsigned long long* bar, unsigned parity) {
    unsigned done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(at(bar)), "r"(parity)
                 : "memory");
    return done;
}
__device__ __forceinline__ void wait(unsigned long long* bar, unsigned parity) {
    while (!try_wait(bar, parity)) {
    }
}
}  // namespace mbarrier

// TMA (PTX ISA "cp.async.bulk.tensor"): the copy engine moves a box of a tensor, described by a 128-byte tensor map
// the driver encoded (cuda.tensor_maps), into shared memory, and completes `bytes` of the barrier's expected
// transactions when it has landed. The maps live in global memory (scripts/tma_probe.py: a by-value map parameter did
// not survive pycuda's launch).
namespace tma {
constexpr int MAP_BYTES = 128;  // a CUtensorMap (cuda.tensor_maps.MAP_BYTES)
// One arrival on bar, and `bytes` of copies that must land before its phase completes.
__device__ __forceinline__ void arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mbarrier::at(bar)), "r"(bytes)
                 : "memory");
}
// The im2col box of a 4-D NHWC map: its pixels from the window corner (w, h) of image n on, channels from c, each
// pixel shifted by the tap (off_w, off_h).
__device__ __forceinline__ void load_im2col(void* dst, const void* map, int c, int w, int h, int n, int off_w,
                                            int off_h, unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5}], [%6], {%7, %8};" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
        "l"(map), "r"(c), "r"(w), "r"(h), "r"(n), "r"(mbarrier::at(bar)), "h"(static_cast<unsigned short>(off_w)),
        "h"(static_cast<unsigned short>(off_h))
        : "memory");
}
// The box of a 2-D tiled map from element (x, y): x the contiguous dimension.
__device__ __forceinline__ void load_tiled(void* dst, const void* map, int x, int y, unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
        "l"(map), "r"(x), "r"(y), "r"(mbarrier::at(bar))
        : "memory");
}
}  // namespace tma
#endif
