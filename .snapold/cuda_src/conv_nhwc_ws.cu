// conv_nhwc_ws.cu: the NHWC implicit-GEMM conv (conv_nhwc.cuh) on warp-specialized persistent wgmma tiles (sm_90a),
// fp16, tf32 and int8: cp.async producers (_ws_), the copy engine's TMA (_ws_tma_), and TMA with ping-pong consumers
// (_ws_tma_pp_).
//
// Idea: the same implicit GEMM as conv_nhwc_wgmma.cu, warp-specialized and persistent ("_ws" tiles). Where every warp
// both loads and multiplies, the loader's address arithmetic (over a hundred SASS instructions a stage) takes the
// issue slots and the tensor pipe idles half the time. Here the block is four warpgroups with one job each:
// - warpgroups 0 and 1, the producers, run NhwcLoader (their 256 threads copy the whole tile) into a ring of STAGES
//   buffers (one producer warpgroup cannot keep the consumers fed);
// - warpgroups 2 and 3, the consumers, each multiply 64 (MB x 64) pixel rows of a stage by its B tile, then release
//   the buffer, and do the epilogue; they issue ~10 instructions a stage.
// setmaxnreg moves registers from the producers to the consumers (WS_PRODUCER_REGS, WS_CONSUMER_REGS).
// Buffer handover by mbarriers (wgmma.cuh): full[b] completes when each of the producer threads' copies into b
// have landed (cp.async.mbarrier.arrive: the hardware arrives for the thread, which goes on issuing), and the
// consumers fence them for the async proxy after the wait; empty[b] when the 8 consumer warps have arrived, each
// once the wgmma that read b have completed (wgmma.wait_group). The producers wait for empty[b] before reloading b.
// A producer must not arrive on full[b] itself after cp.async.wait_group: that would put the issue of a later load,
// which waits for a buffer, between a stage landing and its consumers.
// Persistent: gridDim.x blocks (one an SM: the ring takes ~200 KB) take the tiles blockIdx.x, + gridDim.x, ... in
// tile_n0's order (the channel tiles of one pixel tile, then its K slices last), so the producer loads the next
// tile's stages while the consumers store the last one's.
// TMA (the "_ws_tma_" tiles): one producer thread asks the copy engine for each stage's two boxes instead, the A tile
// as an im2col box of the input (its first pixel's window corner, shifted by the stage's tap) and the B tile as a box
// of the weights, through two tensor maps in global memory (cuda.tensor_maps; `maps`: A's, then B's, 128 bytes each),
// which frees the issue slots the eight producer warps' cp.async took. A stage's rows are 128 bytes (64 k of fp16, 32
// of tf32, 128 of int8) in the 128-byte swizzle: TMA moves boxes of 128-byte rows 1.4x (im2col) and 2.1x (tiled)
// faster than of 64-byte ones (docs/PERFORMANCE.md), with which these tiles would be slower than the cp.async ones.
// A stage must not span two taps: Cin is a multiple of its k (cuda.tiles.tile_fits). full[b] takes the one arrival
// of that thread with the stage's bytes expected, and the consumers need no proxy fence (the copy engine writes
// through the async proxy, which their wgmma read).
// Ping-pong (the "_ws_tma_pp_" tiles, TMA only): with the loads on the copy engine, the consumers' epilogue is the
// largest cost left, because the tensor cores idle while both consumer warpgroups store the same tile. Here each
// consumer warpgroup takes whole tiles, in turn (block tiles 0, 2, 4, ... and 1, 3, ...), so that one stores while
// the other multiplies. A warpgroup then holds a whole tile's sums (BM / 64 x BN / 2 accumulators: 192 for
// 128x192), so the block is one producer warpgroup (its thread 0 asks for every box) and two consumers,
// WS_PP_THREADS, with setmaxnreg's 40 / 232 registers. The producer fills the ring in tile order as before, and each
// consumer steps its ring position over the other's stages. A consumer starts a tile's stages only once the other
// has waited for the last stage of its own (the turn barriers): mbarrier waits tell phases apart by parity alone, so
// a wait for fill f of a buffer while fill f - 1 has not landed would pass on fill f - 2's completed phase. A
// consumer waits its own stages in order and the turn follows its wait for the tile's last, so every fill before the
// other's next tile has been seen landed (TMA loads into different buffers may land out of order: the producer's
// order alone would not say so).
//
// int8 (NhwcI8): the same tiles on int8 operands, k32 steps of 32 bytes, exact s32 sums in the registers fp32 ones
// take, the requantizing epilogue of conv_nhwc.cuh's NhwcStore::column4 (bias: float32[3 cout]); split-K writes
// int32 partial sums (conv_nhwc_i8_splitk_reduce requantizes their exact sum). The TMA tiles' 128-byte rows are 128
// channels a stage, so they take Cin multiples of 128 only (Inception: the 256-, 384-, 768-, 1280- and 2048-channel
// inputs and Mixed_6b's 128s); their _r64_ twins' 64-byte rows (64-byte swizzle, boxes TMA moves slower a byte) take
// the multiples of 64 too (the 64-, 192- and 448-channel ones); the cp.async _ws_ tiles, 64 channels a stage, take
// every Cin multiple of 16.
//
// Launch: conv_nhwc[_tf32|_i8]_ws_<BM>x<BN> and _ws_tma[_r64]_<BM>x<BN>: WS_THREADS threads,
//         _ws_tma_pp[_r64]_<BM>x<BN>: WS_PP_THREADS; grid (blocks, 1, 1), at most one block an SM; dynamic shared
//         memory ws_ring_bytes(BM, BN, ROW). The TMA tiles take the tensor maps' address last.
#include "conv_nhwc.cuh"

// The ring's stages (cuda.tiles.ws_stages): ~200 KB of stages of BM + BN rows of `row` bytes, at most 12.
__host__ __device__ constexpr int ws_stages(int bm, int bn, int row = 64) {
    return 200 * 1024 / ((bm + bn) * row) < 12 ? 200 * 1024 / ((bm + bn) * row) : 12;
}
// The launch's dynamic shared memory (cuda.tiles.wgmma_ring_bytes): the ring, then its full and empty barriers.
__host__ __device__ constexpr int ws_ring_bytes(int bm, int bn, int row = 64) {
    return ws_stages(bm, bn, row) * ((bm + bn) * row + 16);
}
constexpr int WS_PRODUCERS = 256;  // threads of the producer warpgroups
// setmaxnreg: the producers give registers to the consumers, 256 x 56 + 256 x 200 = the SM's 65,536.
[[maybe_unused]] constexpr int WS_PRODUCER_REGS = 56, WS_CONSUMER_REGS = 200;  // unused where the tiles are not built
[[maybe_unused]] constexpr int WS_THREADS = WS_PRODUCERS + 256;  // cuda.tiles.WS_THREADS
// The ping-pong tiles: one producer warpgroup; 128 x 40 + 256 x 232 = 64,512, what the block holds at launch (384 x
// 168: setmaxnreg.inc past it would stall).
constexpr int WS_PP_PRODUCERS = 128;
[[maybe_unused]] constexpr int WS_PP_PRODUCER_REGS = 40, WS_PP_CONSUMER_REGS = 232;
[[maybe_unused]] constexpr int WS_PP_THREADS = WS_PP_PRODUCERS + 256;  // cuda.tiles.WS_PP_THREADS

// A position in the ring of STAGES buffers: the buffer, and the parity of the ring's passes so far (the phase of its
// barriers that the next wait is for).
template <int STAGES>
struct WsRing {
    int buf = 0;
    unsigned phase = 0;
    __device__ __forceinline__ void next() {
        if (++buf == STAGES) {
            buf = 0;
            phase ^= 1;
        }
    }
    __device__ __forceinline__ void skip(int stages) {  // another consumer's tile (ping-pong)
        buf += stages;
        const int passes = buf / STAGES;
        buf -= passes * STAGES;
        phase ^= passes & 1;
    }
};

template <class E, int BM, int BN, bool TMA = false, bool PINGPONG = false, int TMA_ROW = 128>
__device__ __forceinline__ void conv_nhwc_ws_gemm(const NhwcConvArgs<E>& a, const unsigned char* maps = nullptr) {
    using T = typename E::T;
    // bytes of a stage's row: its k (the TMA tiles' in the 128-byte swizzle, int8's _r64_ ones' in the 64-byte one)
    constexpr int ROW = TMA ? TMA_ROW : 64;
    constexpr int PRODUCERS = PINGPONG ? WS_PP_PRODUCERS : WS_PRODUCERS;
    // 64-row blocks of a consumer warpgroup: half the tile's, or all of them (ping-pong)
    constexpr int MB = PINGPONG ? BM / 64 : BM / 128, STAGES = ws_stages(BM, BN, ROW);
    using Loader = NhwcLoader<E, BM, BN, WS_PRODUCERS>;
    constexpr int BK = ROW / sizeof(T);
    static_assert(!E::SPLIT && BM % 128 == 0 && STAGES >= 3, "warp-specialized tile");
    static_assert(TMA || BK == Loader::BK, "the cp.async loader's stage");
    static_assert(TMA || !PINGPONG, "a ping-pong tile's one producer warpgroup asks the copy engine");
    static_assert(!PINGPONG || MB * BN / 2 <= 192, "a ping-pong consumer's sums within its 232 registers");
    const auto descriptor = [](const void* p) {
        return ROW == 128 ? wgmma::desc_k_major_128b(p) : wgmma::desc_k_major_64b(p);
    };

    T(*As)[BM][BK] = reinterpret_cast<T(*)[BM][BK]>(wgmma_ring);
    T(*Bs)[BN][BK] = reinterpret_cast<T(*)[BN][BK]>(wgmma_ring + STAGES * BM * BK * sizeof(T));
    unsigned long long* const full =
        reinterpret_cast<unsigned long long*>(wgmma_ring + STAGES * (BM + BN) * BK * sizeof(T));
    unsigned long long* const empty = full + STAGES;
#ifndef __CUDACC__
    static_assert(ws_ring_bytes(BM, BN, ROW) <= sizeof(wgmma_ring), "the emulator's ring is too small");
#endif
    __shared__ __align__(8) unsigned long long turn[2];  // ping-pong: consumer g may start its next tile's stages
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int b = 0; b < STAGES; ++b) {
            mbarrier::init(full + b, TMA ? 1 : WS_PRODUCERS);
            mbarrier::init(empty + b, PINGPONG ? 4 : 8);  // the warps of the stage's consumers
        }
        if constexpr (PINGPONG)
            for (int g = 0; g < 2; ++g) mbarrier::init(turn + g, 4);
    }
    __syncthreads();  // the only block-wide barrier: from here on the warpgroups meet at the mbarriers alone

    const int p_total = a.batch * a.ho * a.wo, k_total = a.kh * a.kw * a.cin;
    const int tiles_m = (a.cout + BN - 1) / BN, tiles_pm = (p_total + BM - 1) / BM * tiles_m;
    const int splits = (k_total + a.k_split - 1) / a.k_split, tiles = tiles_pm * splits;
    struct Tile {
        int p0, m0, z, k_begin, k_end, stages;
    };
    const auto tile_at = [&](int i) {
        Tile t;
        t.z = i / tiles_pm;
        const int r = i - t.z * tiles_pm;
        t.p0 = r / tiles_m * BM;
        t.m0 = (r - r / tiles_m * tiles_m) * BN;
        t.k_begin = t.z * a.k_split;
        t.k_end = min(k_total, t.k_begin + a.k_split);
        t.stages = (t.k_end - t.k_begin + BK - 1) / BK;
        return t;
    };

    if (tid < PRODUCERS) {  // the producers
        wgmma::max_registers<PINGPONG ? WS_PP_PRODUCER_REGS : WS_PRODUCER_REGS, false>();
        int issued = 0;       // loads so far
        WsRing<STAGES> ring;  // the next load's buffer; empty[ring.buf] is waited for at phase ^ 1
        if constexpr (TMA) {
            if (tid != 0) return;  // one thread asks for every box
            const int hw = a.ho * a.wo;
            for (int i = blockIdx.x; i < tiles; i += gridDim.x) {
                const Tile t = tile_at(i);
                const int n = t.p0 / hw, oh = (t.p0 - n * hw) / a.wo, ow = t.p0 - n * hw - oh * a.wo;
                const int corner_w = ow * a.stride - a.pad_w, corner_h = oh * a.stride - a.pad_h;
                for (int kt = 0; kt < t.stages; ++kt) {
                    const int k = t.k_begin + kt * BK, tap = k / a.cin, r = tap / a.kw;
                    if (issued++ >= STAGES) mbarrier::wait(empty + ring.buf, ring.phase ^ 1);
                    tma::arrive_expect_tx(full + ring.buf, (BM + BN) * ROW);
                    tma::load_im2col(As[ring.buf], maps, k - tap * a.cin, corner_w, corner_h, n, tap - r * a.kw, r,
                                     full + ring.buf);
                    tma::load_tiled(Bs[ring.buf], maps + tma::MAP_BYTES, k, t.m0, full + ring.buf);
                    ring.next();
                }
            }
        } else {
            for (int i = blockIdx.x; i < tiles; i += gridDim.x) {
                const Tile t = tile_at(i);
                Loader load(a, As, Bs, t.p0, t.m0, t.k_begin, t.k_end, tid);
                for (int kt = 0; kt < t.stages; ++kt) {
                    if (issued++ >= STAGES) mbarrier::wait(empty + ring.buf, ring.phase ^ 1);
                    load(0, ring.buf);
                    cp_async::arrive_on(full + ring.buf);  // once this thread's copies so far have landed
                    ring.next();
                }
            }
            cp_async::wait<0>();
        }
        return;
    }

    // The consumers: warpgroup `group` multiplies pixel rows 64 MB group .. of every tile (ping-pong: all the rows
    // of every other tile).
    wgmma::max_registers<PINGPONG ? WS_PP_CONSUMER_REGS : WS_CONSUMER_REGS, true>();
    const int group = (tid - PRODUCERS) / 128, lane = tid % 32, first_row = PINGPONG ? 0 : 64 * MB * group;
    const unsigned long long da0 = descriptor(&As[0][first_row][0]);
    const unsigned long long db0 = descriptor(&Bs[0][0][0]);
    constexpr unsigned A_STEP = BM * ROW / 16, B_STEP = BN * ROW / 16, ROWS64_STEP = 64 * ROW / 16;
    WsRing<STAGES> ring;  // the next stage's buffer; full[ring.buf] is waited for at phase
    unsigned turns = 0;  // ping-pong: the other consumer's handovers waited for so far
    for (int i = blockIdx.x, j = 0; i < tiles; i += gridDim.x, ++j) {
        const Tile t = tile_at(i);
        if (PINGPONG && (j & 1) != group) {  // the other consumer's tile: step over its stages
            ring.skip(t.stages);
            continue;
        }
        if (PINGPONG && j > 0) mbarrier::wait(turn + group, turns++ & 1);
        typename E::Acc d[MB][BN / 2];
        int accumulate = 0, last = 0;  // a register, not a constant (wgmma.cuh: C7515); the buffer before ring.buf
        for (int kt = 0; kt < t.stages; ++kt) {
            mbarrier::wait(full + ring.buf, ring.phase);
            if (PINGPONG && kt == t.stages - 1 && lane == 0)  // this warp has seen every fill up to the last landed
                mbarrier::arrive(turn + (group ^ 1));
            if constexpr (!TMA)  // the producers' copies, seen through the barrier, before the async proxy's reads
                wgmma::fence_proxy_async();
            const unsigned long long db = db0 + ring.buf * B_STEP;
            wgmma::fence();
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {
                const unsigned long long da = da0 + (ring.buf * A_STEP + mb * ROWS64_STEP);
#pragma unroll
                for (int kk = 0; kk < ROW / 32; ++kk) {  // k steps of 32 bytes: k16 (fp16), k8 (tf32), k32 (int8)
                    const unsigned long long on = kk * wgmma::DESC_32_BYTES;
                    E::template wgmma<BN>(d[mb], da + on, db + on, kk ? 1 : accumulate);
                }
            }
            accumulate = 1;
            wgmma::commit();
            wgmma::wait<1>();  // the wgmma of the stage before have read their buffer
            if (kt > 0 && lane == 0) mbarrier::arrive(empty + last);
            last = ring.buf;
            ring.next();
        }
        wgmma::wait<0>();
        if (lane == 0) mbarrier::arrive(empty + last);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) wgmma::fence_registers(d[mb]);

        NhwcStore<E>{a, p_total, t.z, splits}.template wgmma_rows<MB, BN>(
            t.p0, t.m0, PINGPONG ? 0 : group, [&](int mb, int i) { return d[mb][i]; });
    }
}

// The warp-specialized tiles exist where wgmma does: sm_90a and the CPU emulator (conv_nhwc_wgmma.cu).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDACC__)
// The warp-specialized tiles: WS_THREADS (512) threads, one block an SM (128 registers a thread at launch, then
// setmaxnreg's split; the consumers hold BM / 128 * BN / 2 accumulators; ptxas: no spill. 256x192's 192 spill).
// Their TMA twins NAME_ws_tma_BMxBN take the tensor maps' address last.
#define CONV_NHWC_WS_KERNEL(NAME, E, BM, BN) \
    CONV_NHWC_ENTRY(NAME##_ws_##BM##x##BN, E, WS_THREADS, 1, (conv_nhwc_ws_gemm<E, BM, BN>))
#define CONV_NHWC_WS_TMA_KERNEL_ROW(NAME, E, BM, BN, ROW)                                                         \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1)                                                   \
        NAME##_##BM##x##BN(CONV_NHWC_PARAMS(E), const unsigned char* __restrict__ maps) {                         \
        conv_nhwc_ws_gemm<E, BM, BN, true, false, ROW>(CONV_NHWC_ARGS(E), maps);                                  \
    }
#define CONV_NHWC_WS_TMA_KERNEL(NAME, E, BM, BN) CONV_NHWC_WS_TMA_KERNEL_ROW(NAME##_ws_tma, E, BM, BN, 128)
// Their ping-pong versions NAME_ws_tma_pp_BMxBN: WS_PP_THREADS (384), 168 registers a thread at launch.
#define CONV_NHWC_WS_PP_KERNEL_ROW(NAME, E, BM, BN, ROW)                                                          \
    extern "C" __global__ void __launch_bounds__(WS_PP_THREADS, 1)                                                \
        NAME##_##BM##x##BN(CONV_NHWC_PARAMS(E), const unsigned char* __restrict__ maps) {                         \
        conv_nhwc_ws_gemm<E, BM, BN, true, true, ROW>(CONV_NHWC_ARGS(E), maps);                                   \
    }
#define CONV_NHWC_WS_PP_KERNEL(NAME, E, BM, BN) CONV_NHWC_WS_PP_KERNEL_ROW(NAME##_ws_tma_pp, E, BM, BN, 128)

// In cuda/tiles.py's order (NHWC_WGMMA_TILES): cp.async, then TMA, then TMA ping-pong.
#define CONV_NHWC_WS_TILES(NAME, E)             \
    CONV_NHWC_WS_KERNEL(NAME, E, 128, 192)      \
    CONV_NHWC_WS_KERNEL(NAME, E, 128, 128)      \
    CONV_NHWC_WS_KERNEL(NAME, E, 128, 64)       \
    CONV_NHWC_WS_KERNEL(NAME, E, 256, 128)      \
    CONV_NHWC_WS_TMA_KERNEL(NAME, E, 128, 192)  \
    CONV_NHWC_WS_TMA_KERNEL(NAME, E, 256, 128)  \
    CONV_NHWC_WS_PP_KERNEL(NAME, E, 128, 192)   \
    CONV_NHWC_WS_PP_KERNEL(NAME, E, 128, 128)

#ifdef IE_NHWC_FP16
CONV_NHWC_WS_TILES(conv_nhwc, NhwcF16)
#endif
#ifdef IE_NHWC_TF32
CONV_NHWC_WS_TILES(conv_nhwc_tf32, NhwcTf32)
#endif
#ifdef IE_NHWC_INT8
CONV_NHWC_WS_TILES(conv_nhwc_i8, NhwcI8)
// int8's TMA tiles of 64-byte rows (NAME_ws_tma_r64_, NAME_ws_tma_pp_r64_): 64 channels a stage, for the Cin multiples
// of 64 but not of 128 (Inception's 64-, 192- and 448-channel inputs).
CONV_NHWC_WS_TMA_KERNEL_ROW(conv_nhwc_i8_ws_tma_r64, NhwcI8, 128, 192, 64)
CONV_NHWC_WS_TMA_KERNEL_ROW(conv_nhwc_i8_ws_tma_r64, NhwcI8, 256, 128, 64)
CONV_NHWC_WS_PP_KERNEL_ROW(conv_nhwc_i8_ws_tma_pp_r64, NhwcI8, 128, 192, 64)
CONV_NHWC_WS_PP_KERNEL_ROW(conv_nhwc_i8_ws_tma_pp_r64, NhwcI8, 128, 128, 64)
#endif
#endif
