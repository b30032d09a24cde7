// conv_nhwc_wgmma.cu: the NHWC implicit-GEMM conv (conv_nhwc.cuh) on Hopper's wgmma tiles (sm_90a), fp16, tf32,
// fp32 (3xFP16) and int8.
//
// Idea: the same implicit GEMM as conv_nhwc_mma.cu with wgmma (wgmma.cuh): the tiles the loader fills are already in
// wgmma's 64-byte swizzle, so each warpgroup multiplies its 64 pixel rows of the stage by the whole BN-channel B tile
// with two instructions (k16 + k16 of fp16, k8 + k8 of tf32, k32 + k32 of int8) instead of the mma.sync kernel's
// ldmatrix and m16n8 steps: 128x128 issues 2 wgmma per warp per stage instead of 12 ldmatrix + 32 mma. Two warpgroups,
// 256 threads; the accumulators, BM / 128 * BN / 2 per thread, stay in registers until the epilogue. A stage's wgmma
// run on while the next stage is waited for and loaded: its math waits only for the previous stage's (wait(1)), and the
// ring loads into the buffer of the stage before that (cp_async_ring's ASYNC). The ring lives in dynamic shared memory
// (wgmma_stages() stages, more than static shared memory's 48 KB hold), so that it still keeps STAGES - 2 tiles of
// loads in flight. A 256-pixel tile has each warpgroup multiply two blocks of 64 rows per stage. 128x192 (96
// accumulators a thread) covers the Cout = 192 and 384 layers in whole tiles, reading 1.2x fewer bytes per multiply-add
// than 128x128.
// SPLIT (NhwcF32, fp32 as 3xFP16): the ring's float32 stages are not read by the tensor cores. Each thread splits the
// pieces it copied into fp16 high and low halves (conv_mma.cuh's NhwcF32::split) in a set of four tiles of 32-byte
// rows (A_hi, A_lo, B_hi, B_lo; the 32-byte swizzle), one of a ring of WGMMA_LO_TILES sets, once its copies have
// landed (cp_async_ring's landed); each stage (k16) is then three fp16 wgmma, A_hi B_hi, A_hi B_lo, A_lo B_hi. The
// set of tile t + 1 is written in the math of tile t, after its wgmma are issued (the ring's landed runs a tile
// ahead), while the wgmma of tiles t and t - 1 may still read theirs: so three sets, one for each. The cross
// products, ~2^-11 of A B (2^11 times that, the low halves' scale), go to accumulators of their own (dx): the tensor
// cores add each instruction's products to their accumulator with a loss of about a unit in its last place (see
// WGMMA_SPLIT_CHUNK), so small terms added to the large sums would lose what they carry. Every WGMMA_SPLIT_CHUNK
// tiles both sets are waited for and added to `total` (rounded to nearest; dx times 2^-11, exact) at the start of
// the next tile, which starts them anew.
//
// int8 (NhwcI8): int8 activations and weights, exact s32 sums in the registers fp32 ones take, the requantizing
// epilogue of conv_nhwc.cuh's NhwcStore::column4 (bias: float32[3 cout], bias, scale, inv_out). No split-K (k_split
// >= K: one slice, grid.z 1) and no mma.sync tiles; the max-pool twins of the 1x1 convs behind a 3x3 max pool
// (conv_nhwc_i8_wgmma_maxpool3_<BM>x<BN>: NhwcMaxPoolLoader, conv_nhwc.cuh).
//
// Launch: conv_nhwc[_tf32|_f32|_i8]_wgmma_<BM>x<BN>: block 256, grid (ceil(P / BM), ceil(M / BN), splits), dynamic
//         shared memory wgmma_ring_bytes(split, BM, BN).
#include "conv_nhwc.cuh"

// Stages of the wgmma tiles' ring (cuda.tiles.wgmma_stages), for two blocks an SM (one block cannot hide its own
// barrier and load latency, which is why there are no 256x128 and 256x192 wgmma tiles): for 128 pixel rows, 4 in
// flight while one is multiplied and the one before it may still be read by its wgmma (3 for 128x192, whose 6 would
// not fit twice); 256-row tiles, twice the bytes a stage, 2. A SPLIT element type (NhwcF32) needs WGMMA_LO_TILES sets
// of halves, each a stage's bytes (conv_nhwc_wgmma_gemm): 6 stages for its tiles of at most 64 channels, and 8 for
// 128x128, which runs one block an SM (its sums in registers three times would spill at two).
__host__ __device__ constexpr int wgmma_stages(bool split, int bm, int bn) {
    return split ? (bn == 128 ? 8 : 6) : bm == 256 ? 4 : bn == 192 ? 5 : 6;
}
constexpr int WGMMA_LO_TILES = 3;
// A SPLIT type's tensor-core accumulators take the sums of this many tiles (d: one fp16 wgmma of k16 a tile, dx:
// two), then they are added to fp32 registers, rounded to nearest. The tensor cores' own accumulation measured
// biased: with every tile in them, fp32 forwards were 1.1e-4 off float64 at batch 128, where long K runs unsplit
// (2.0e-5 at batch 1, split-K), on the H100, against 4.5e-7 for the FFMA path.
[[maybe_unused]] constexpr int WGMMA_SPLIT_CHUNK = 4;  // unused where the wgmma tiles are not built
// The ring's bytes, the launch's dynamic shared memory (cuda.tiles.wgmma_ring_bytes).
__host__ __device__ constexpr int wgmma_ring_bytes(bool split, int bm, int bn) {
    return (wgmma_stages(split, bm, bn) + (split ? WGMMA_LO_TILES : 0)) * (bm + bn) * 64;
}


#ifndef __CUDACC__
static_assert(wgmma_ring_bytes(true, 128, 128) <= sizeof(wgmma_ring), "the emulator's ring is too small");
static_assert(wgmma_ring_bytes(false, 128, 192) <= sizeof(wgmma_ring), "the emulator's ring is too small");
#endif

template <class E, int BM, int BN, class Loader = NhwcLoader<E, BM, BN, 256>>
__device__ __forceinline__ void conv_nhwc_wgmma_gemm(const NhwcConvArgs<E>& a) {
    using T = typename E::T;
    constexpr int MB = BM / 128;  // two warpgroups of 128 threads, each MB blocks of 64 pixel rows
    constexpr int STAGES = wgmma_stages(E::SPLIT, BM, BN);
    constexpr int BK = Loader::BK;
    static_assert(BM % 128 == 0 && (BN == 192 || BN == 128 || BN == 64 || BN == 32), "wgmma tile shape");

    // 512-byte aligned tiles (BM, BN multiples of 8 rows of 64 bytes): the swizzle repeats every 512 bytes.
    // wgmma_ring_bytes(E::SPLIT, BM, BN), the launch's dynamic shared memory (cuda.tiles.wgmma_ring_bytes):
    // As[STAGES], Bs[STAGES], and for SPLIT WGMMA_LO_TILES sets of the fp16 halves (conv_nhwc.cuh's HalvesSet).
    T(*As)[BM][BK] = reinterpret_cast<T(*)[BM][BK]>(wgmma_ring);
    T(*Bs)[BN][BK] = reinterpret_cast<T(*)[BN][BK]>(wgmma_ring + STAGES * BM * BK * sizeof(T));
    unsigned short* const halves = reinterpret_cast<unsigned short*>(wgmma_ring + STAGES * (BM + BN) * BK * sizeof(T));
#ifndef __CUDACC__
    static_assert(wgmma_ring_bytes(E::SPLIT, BM, BN) <= sizeof(wgmma_ring), "the emulator's ring is too small");
#endif

    const int tid = threadIdx.x, group = tid / 128;
    const int p_total = a.batch * a.ho * a.wo, k_total = a.kh * a.kw * a.cin;
    const int p0 = tile_n0(BM), m0 = tile_m0(BN);
    const int k_begin = blockIdx.z * a.k_split;
    const int k_end = min(k_total, k_begin + a.k_split);
    Loader load(a, As, Bs, p0, m0, k_begin, k_end, tid);

    // Not zeroed: the first wgmma of the block overwrites d (wgmma.cuh). Every block has at least one K tile (the
    // backend's split-K never leaves a slice empty).
    typename E::Acc d[MB][BN / 2];
    int accumulate = 0;

    // The descriptors of buffer 0; a buffer, and 64 rows, are fixed steps on (start addresses in units of 16 bytes).
    const unsigned long long da0 = wgmma::desc_k_major_64b(&As[0][64 * MB * group][0]);
    const unsigned long long db0 = wgmma::desc_k_major_64b(&Bs[0][0][0]);
    constexpr unsigned A_STEP = BM * BK * sizeof(T) / 16, B_STEP = BN * BK * sizeof(T) / 16;
    constexpr unsigned ROWS64_STEP = 64 * BK * sizeof(T) / 16;
    // SPLIT: the sets of halves (conv_nhwc.cuh's HalvesSet, wgmma.cuh's 32-byte rows): set 0's descriptor, and its
    // tiles, a set and 64 rows as steps on it.
    using S = HalvesSet<BM, BN>;
    static_assert(!E::SPLIT || S::SIZE * 2 == (BM + BN) * BK * static_cast<int>(sizeof(T)),
                  "a set of halves is a float32 stage's bytes");
    const unsigned long long ds0 = wgmma::desc_k_major_32b(halves);
    constexpr unsigned SET_STEP = S::SIZE / 8, HALF_ROWS64_STEP = 64 * S::ROW / 8;  // fp16 elements / 8: 16 bytes
    int set = WGMMA_LO_TILES - 1;  // the set of halves of the tile being split and multiplied (SPLIT)
    // SPLIT: d holds the high halves' products (A_hi B_hi) of at most WGMMA_SPLIT_CHUNK tiles (chunk_tiles so far),
    // dx the cross products (A_hi B_lo + A_lo B_hi, 2^11 times their value); then both move to total.
    typename E::Acc dx[E::SPLIT ? MB : 1][E::SPLIT ? BN / 2 : 1];
    float total[E::SPLIT ? MB : 1][E::SPLIT ? BN / 2 : 1];
    int chunk_tiles = 0;
    if constexpr (E::SPLIT) {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) total[mb][i] = 0.f;
    }
    const auto promote = [&] {
        if constexpr (E::SPLIT) {
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {
                wgmma::fence_registers(d[mb]);
                wgmma::fence_registers(dx[mb]);
#pragma unroll
                for (int i = 0; i < BN / 2; ++i) total[mb][i] += d[mb][i] + dx[mb][i] * E::LO_UNSCALE;
            }
        }
    };
    const auto split = [&](int st) {
        if constexpr (E::SPLIT) {
            set = set == WGMMA_LO_TILES - 1 ? 0 : set + 1;
            load.split(st, halves + set * S::SIZE);
        }
    };
    // SPLIT: the math of tile t also splits tile t + 1 (the ring's ahead), once its wgmma are issued. Tile t + 1's set
    // is tile t - 2's, whose wgmma every warpgroup waited for (wait<1> in the math of tile t - 1) before the barrier
    // of tile t; the split itself happens after that barrier. A chunk's sums are waited for and promoted at the start
    // of the next chunk's first tile, so that its barrier and loads are not behind the drain.
    const auto multiply = [&](int st, auto&& ahead) {
        if constexpr (E::SPLIT) {
            if (chunk_tiles == WGMMA_SPLIT_CHUNK) {
                wgmma::wait<0>();
                promote();
                accumulate = chunk_tiles = 0;
            }
        }
        wgmma::fence();
        if constexpr (E::SPLIT) {  // one k16 a stage: three fp16 wgmma on the tile's set of halves
            const unsigned long long ds = ds0 + set * SET_STEP;
            const unsigned long long b_hi = ds + S::B_HI / 8, b_lo = ds + S::B_LO / 8;
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {  // rows 64 (MB group + mb) ..
                const unsigned long long rows = ds + (MB * group + mb) * HALF_ROWS64_STEP;
                const unsigned long long a_hi = rows + S::A_HI / 8, a_lo = rows + S::A_LO / 8;
                E::template wgmma<BN>(d[mb], a_hi, b_hi, accumulate);
                E::template wgmma<BN>(dx[mb], a_hi, b_lo, accumulate);
                E::template wgmma<BN>(dx[mb], a_lo, b_hi, 1);
            }
        } else {
            const unsigned long long db = db0 + st * B_STEP;
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {  // rows 64 (MB group + mb) ..
                const unsigned long long da = da0 + (st * A_STEP + mb * ROWS64_STEP);
#pragma unroll
                for (int half = 0; half < 2; ++half) {  // k16 + k16 (fp16), k8 + k8 (tf32) or k32 + k32 (int8)
                    const unsigned long long on = half * wgmma::DESC_32_BYTES;
                    E::template wgmma<BN>(d[mb], da + on, db + on, half ? 1 : accumulate);
                }
            }
        }
        accumulate = 1;
        wgmma::commit();
        ahead();
        if constexpr (E::SPLIT) ++chunk_tiles;
        wgmma::wait<1>();
    };
    if constexpr (E::SPLIT)
        cp_async_ring<STAGES, BK, true>(k_begin, k_end, load, multiply, split);
    else
        cp_async_ring<STAGES, BK, true>(k_begin, k_end, load, [&](int st) { multiply(st, [] {}); });
    wgmma::wait<0>();
    if (E::SPLIT && chunk_tiles) promote();
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) wgmma::fence_registers(d[mb]);
    cp_async::wait<0>();  // no copy may still target shared memory when the block exits
    const auto sum = [&](int mb, int i) {
        if constexpr (E::SPLIT)
            return total[mb][i];
        else
            return d[mb][i];
    };

    NhwcStore<E>{a, p_total, (int)blockIdx.z, (int)gridDim.z}.template wgmma_rows<MB, BN>(p0, m0, group, sum);
}

// The wgmma tiles exist where wgmma does: sm_90a (cuda_build compiles this file for it on compute capability 9.0),
// and the CPU emulator (tests/cuda_emu/wgmma_emu.h).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDACC__)
// Two blocks of 256 threads an SM. Shared memory and accumulators a thread: 128x128 96 KB, 64; 128x64 72 KB,
// 128x32 60 KB (3 blocks fit); 128x192 100 KB, 96 (ptxas: 128 registers, none spilled). The 256-pixel tiles, for
// the narrow layers (Cout 32-96, where a 128-pixel stage is little math for its barrier and loads): 256x64 80 KB,
// 256x32 72 KB. NhwcF32 (three wgmma a k step, low tiles, and its sums in registers three times): 128x64 108 KB, 128
// registers; 128x32 90 KB, 95; 128x128 one block an SM (its 192 sums would spill at 128 registers), 176 KB, 237.
#define CONV_NHWC_WGMMA_KERNEL_BLOCKS(NAME, E, BM, BN, MIN_BLOCKS) \
    CONV_NHWC_ENTRY(NAME##_wgmma_##BM##x##BN, E, 256, MIN_BLOCKS, (conv_nhwc_wgmma_gemm<E, BM, BN>))
#define CONV_NHWC_WGMMA_KERNEL(NAME, E, BM, BN) CONV_NHWC_WGMMA_KERNEL_BLOCKS(NAME, E, BM, BN, 2)

// In cuda/tiles.py's order (WGMMA_SPEEDS, F32_WGMMA_SHAPES).
#define CONV_NHWC_WGMMA_TILES(NAME, E)        \
    CONV_NHWC_WGMMA_KERNEL(NAME, E, 128, 192) \
    CONV_NHWC_WGMMA_KERNEL(NAME, E, 128, 128) \
    CONV_NHWC_WGMMA_KERNEL(NAME, E, 128, 64)  \
    CONV_NHWC_WGMMA_KERNEL(NAME, E, 128, 32)  \
    CONV_NHWC_WGMMA_KERNEL(NAME, E, 256, 64)  \
    CONV_NHWC_WGMMA_KERNEL(NAME, E, 256, 32)

#ifdef IE_NHWC_FP16
CONV_NHWC_WGMMA_TILES(conv_nhwc, NhwcF16)
#endif
#ifdef IE_NHWC_TF32
CONV_NHWC_WGMMA_TILES(conv_nhwc_tf32, NhwcTf32)
#endif
#ifdef IE_NHWC_FP32
CONV_NHWC_WGMMA_KERNEL_BLOCKS(conv_nhwc_f32, NhwcF32, 128, 128, 1)
CONV_NHWC_WGMMA_KERNEL(conv_nhwc_f32, NhwcF32, 128, 64)
CONV_NHWC_WGMMA_KERNEL(conv_nhwc_f32, NhwcF32, 128, 32)
#endif
#ifdef IE_NHWC_INT8
CONV_NHWC_WGMMA_TILES(conv_nhwc_i8, NhwcI8)
// int8's max-pool twins (int8 has no mma.sync tiles): NAME_wgmma_maxpool3_BMxBN, the 1x1 conv behind a 3x3 max pool.
#define CONV_NHWC_WGMMA_MAXPOOL_KERNEL(NAME, E, BM, BN)                                   \
    CONV_NHWC_ENTRY(NAME##_wgmma_maxpool3_##BM##x##BN, E, 256, 2,                         \
                    (conv_nhwc_wgmma_gemm<E, BM, BN, NhwcMaxPoolLoader<E, BM, BN, 256, 3>>))
CONV_NHWC_WGMMA_MAXPOOL_KERNEL(conv_nhwc_i8, NhwcI8, 128, 192)
CONV_NHWC_WGMMA_MAXPOOL_KERNEL(conv_nhwc_i8, NhwcI8, 128, 128)
CONV_NHWC_WGMMA_MAXPOOL_KERNEL(conv_nhwc_i8, NhwcI8, 128, 64)
CONV_NHWC_WGMMA_MAXPOOL_KERNEL(conv_nhwc_i8, NhwcI8, 128, 32)
CONV_NHWC_WGMMA_MAXPOOL_KERNEL(conv_nhwc_i8, NhwcI8, 256, 64)
CONV_NHWC_WGMMA_MAXPOOL_KERNEL(conv_nhwc_i8, NhwcI8, 256, 32)
#endif
#endif

// conv_nhwc_f32_split_weights: the fp32 tiles' weight rows (params.direct_weights), uploaded as float32, become in
// place what their loader copies (NhwcF32::copy_halves): each 16-byte piece of four weights its four fp16 high
// halves, then its four low ones, made by NhwcF32::split, the rounding the tiles give their activations. Launched
// once per weight array after the parameters are uploaded (lowering's setup launches): no block splits the weights
// again, and the host does not either (NumPy's float16 casts cost ~6 ns a weight on the development machine).
// Launch: block 256, grid ceil(pieces / 256).
#ifdef IE_NHWC_FP32
extern "C" __global__ void __launch_bounds__(256) conv_nhwc_f32_split_weights(float* w, int pieces) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pieces) return;
    float* const piece = w + 4 * i;
    unsigned short* const halves = reinterpret_cast<unsigned short*>(piece);
    NhwcF32::split(piece, halves, halves + 4);  // the piece is read whole before its halves are written
}
#endif

// conv_nhwc_i8_splitk_reduce: y[p, m] (int8, the parts) = NhwcStore::column4's epilogue of the int32 sum over z of
// ws[z][p][m] (exact: int32 sums of int8 products, whatever the slices), two channels a thread, one 2-byte store (a
// moved pool's raw products: the sums, one 8-byte store).
// Launch: block 256, grid ceil(P * M / 2 / 256).
#ifdef IE_NHWC_INT8
extern "C" __global__ void __launch_bounds__(256)
    conv_nhwc_i8_splitk_reduce(const int* __restrict__ ws, const float* __restrict__ bias, signed char* __restrict__ y,
                               int splits, int p_total, int cout, int y_cstride, NHWC_PARTS_PARAMS) {
    const NhwcParts parts = NHWC_PARTS_ARGS;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x, pairs = cout / 2;
    if (idx >= p_total * pairs) return;
    const int p = idx / pairs, m = 2 * (idx - p * pairs);
    int acc[2] = {0, 0};
    for (int z = 0; z < splits; ++z) {
        const int2 s = __ldg(reinterpret_cast<const int2*>(ws + ((size_t)z * p_total + p) * cout + m));
        acc[0] += s.x;
        acc[1] += s.y;
    }
    const NhwcParts::Column col = parts.column(y_cstride, m);
    if (m >= parts.relu_end) {  // a moved pool's raw product: the int32 sums (NhwcStore::column4)
        *reinterpret_cast<int2*>(y + (col.base + 3 * col.ch + p * col.cstride)) = int2{acc[0], acc[1]};
        return;
    }
    unsigned b[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const float f = __fadd_rn(__fmul_rn(__int2float_rn(acc[e]), __ldg(bias + cout + m + e)), __ldg(bias + m + e));
        b[e] = i8q::quantized_bits(f, __ldg(bias + 2 * cout + m + e), 0.f);  // after a ReLU
    }
    *reinterpret_cast<unsigned short*>(y + (col.base + p * col.cstride)) =
        static_cast<unsigned short>(__byte_perm(b[0], b[1], 0x0040));
}
#endif
