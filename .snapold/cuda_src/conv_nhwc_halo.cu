// conv_nhwc_halo.cu: the NHWC conv (conv_nhwc.cuh) of stride-1 convs with several taps on halo tiles (sm_90a,
// conv_nhwc[_tf32|_i8]_halo_<BM>x<BN>), fp16, tf32 and int8: the stem's Conv2d_2a, 2b and 4a, the 35x35 modules' 3x3s
// and 5x5s.
//
// Idea: there the implicit GEMM is bound by L2, not by the tensor cores: each of the KH x KW taps reads the whole
// input again (Conv2d_2b moves ~3.9 GB through L2 for 0.36 GB of input). Here a block copies the input rows its
// outputs need, once, and every tap multiplies the same shared copy:
// - Output positions run over the padded-width grid of each image: q = oh Wg + u, Wg = W + 2 PW, u < Wg, of which
//   u < Wo are outputs (the other KW - 1 columns of a row are computed and dropped: 1.3 % of Conv2d_2b's work, 2.7 %
//   of Conv2d_4a's). Then tap (r, s) of output q reads padded input position q + r Wg + s, so for a tile of BM
//   consecutive q the A matrix of tap (r, s) is the shared rows [r Wg + s, r Wg + s + BM) of the tile's halo: its
//   padded input positions q0 .. q0 + halo_rows - 1, one row each (positions in the padding and past the image are
//   copied as zeros). A wgmma descriptor may start at any row (wgmma.cuh's desc_k_major_128b: the swizzle is a
//   function of the address).
// - A row holds halo_cin() channels, one swizzle row (32 of tf32, 128 bytes in the 128-byte swizzle; 32 of fp16 and
//   64 of int8, 64 bytes in the 64-byte one), so wider inputs are cut into planes of that many channels: the halo is
//   planes x rows, the weights planes x taps x BN rows, and the K loop runs plane by plane, tap by tap. Cin is a
//   multiple of 16: a last plane of 16 channels takes half the row's k steps (int8: 16 or 32 channels one k32 step,
//   48 two; the copies zero-fill the channels past Cin that a k step reads, in both operands; the halo's copies skip
//   the half of a row that no k step reads).
// - L2 reads: halo_rows / BM = 2.2x the input for Conv2d_2b's 149-wide grid at BM 256 (2.2x for Conv2d_4a's 73-wide
//   one at BM 128), instead of 9x.
// - The weights of the block's BN channels (blockIdx.y: its channel tile; 74 KB for tf32's 2b, 111 KB for fp16's 4a
//   at BN 64) stay in shared memory for the whole kernel.
// - Warp-specialized and persistent as the _ws_ tiles: warpgroup 0 copies (the weights first, then each tile's
//   halo into buffer L % 2 of the block's L-th tile), warpgroups 1 and 2 each take every other tile of the block,
//   all BM of its rows, so one multiplies while the other stores. full[b] / empty[b] hand buffer b over (the
//   producers' cp.async arrivals / the 4 warps of its consumer warpgroup).
// int8 (NhwcI8): exact s32 sums in the registers fp32 ones take, the requantizing epilogue of NhwcStore::column4
// (bias: float32[3 cout]).
// Needs stride 1, Cin a multiple of 16, no split-K, shared memory within the opt-in limit (cuda.tiles.halo_fits).
//
// Launch: HALO_THREADS threads, at most one block an SM, grid (blocks, ceil(Cout / BN)), dynamic shared memory
//         halo_smem_bytes(sizeof(element), BM, BN, Cin, KH, KW, Wg).
#include "conv_nhwc.cuh"

constexpr int HALO_PRODUCERS = 128, HALO_CIN = 32;
[[maybe_unused]] constexpr int HALO_THREADS = HALO_PRODUCERS + 256;  // cuda.tiles.HALO_THREADS
[[maybe_unused]] constexpr int HALO_PRODUCER_REGS = 56, HALO_CONSUMER_REGS = 224;  // 128 x 56 + 256 x 224 = 384 x 168
// Channels a row (a plane's) of elements of `elem` bytes: HALO_CIN, or for int8 64 (a 64-byte row, as fp16's).
__host__ __device__ constexpr int halo_cin(int elem) { return elem == 1 ? 2 * HALO_CIN : HALO_CIN; }
__host__ __device__ constexpr int halo_rows(int bm, int kh, int kw, int wg) { return bm + (kh - 1) * wg + kw - 1; }
__host__ __device__ constexpr int halo_planes(int elem, int cin) { return (cin + halo_cin(elem) - 1) / halo_cin(elem); }
// One plane of a halo buffer: its rows of halo_cin(elem) elements of `elem` bytes, in whole 1024-byte swizzle
// patterns so that the next plane starts on one too.
__host__ __device__ constexpr int halo_plane_bytes(int elem, int bm, int kh, int kw, int wg) {
    return (halo_rows(bm, kh, kw, wg) * halo_cin(elem) * elem + 1023) / 1024 * 1024;
}
// The weights, two halo buffers, full[2] and empty[2] (cuda.tiles.halo_smem_bytes).
__host__ __device__ constexpr int halo_smem_bytes(int elem, int bm, int bn, int cin, int kh, int kw, int wg) {
    const int weights = kh * kw * bn * halo_cin(elem) * elem;  // a plane's
    return halo_planes(elem, cin) * (weights + 2 * halo_plane_bytes(elem, bm, kh, kw, wg)) + 4 * 8;
}

// A count of k steps as a type, so that the loop over them unrolls inside a generic lambda.
template <int N>
struct HaloSteps {
    static constexpr int value = N;
};

template <class E, int BM, int BN>
__device__ __forceinline__ void conv_nhwc_halo_gemm(const NhwcConvArgs<E>& a) {
    using T = typename E::T;
    constexpr int PIECE = E::PIECE, MB = BM / 64;  // elements a 16-byte piece; 64-row blocks of a tile
    // A row: 128 bytes of tf32 (8 pieces, 128-byte swizzle) or 64 of fp16 or int8 (4 pieces, 64-byte swizzle). Piece
    // c of the row at byte offset o of a 1024-byte aligned buffer goes to piece c ^ (o / 128 mod PIECES): the ISA's
    // swizzle of its address. A wgmma takes 32 bytes of each row (k8 of tf32, k16 of fp16, k32 of int8).
    constexpr int CIN = halo_cin(sizeof(T)), ROW = CIN * sizeof(T), PIECES = ROW / 16, STEPS = ROW / 32;
    static_assert(ROW == 128 || ROW == 64, "a halo row is one swizzle row");
    static_assert(BN * ROW % 1024 == 0, "each tap's weights start on a swizzle pattern");
    const auto swizzled = [](int row, int c) { return row * ROW + ((c ^ (row * ROW / 128 & (PIECES - 1))) << 4); };
    const auto descriptor = [](const void* p) {
        return ROW == 128 ? wgmma::desc_k_major_128b(p) : wgmma::desc_k_major_64b(p);
    };
    const int taps = a.kh * a.kw, wg = a.w + 2 * a.pad_w, rows = halo_rows(BM, a.kh, a.kw, wg);
    const int planes = halo_planes(sizeof(T), a.cin), plane_bytes = halo_plane_bytes(sizeof(T), BM, a.kh, a.kw, wg);
    const int buffer_bytes = planes * plane_bytes, n0 = blockIdx.y * BN;  // n0: the block's first output channel
    unsigned char* const weights = wgmma_ring;  // [plane][tap][n][ROW bytes], swizzled
    unsigned char* const halo = wgmma_ring + planes * taps * BN * ROW;  // two buffers of [plane][row][ROW bytes]
    unsigned long long* const full = reinterpret_cast<unsigned long long*>(halo + 2 * buffer_bytes);
    unsigned long long* const empty = full + 2;
#ifndef __CUDACC__
    if (halo_smem_bytes(sizeof(T), BM, BN, a.cin, a.kh, a.kw, wg) > (int)sizeof(wgmma_ring)) {
        std::fprintf(stderr, "emulator: a halo tile needs %d bytes of shared memory\n",
                     halo_smem_bytes(sizeof(T), BM, BN, a.cin, a.kh, a.kw, wg));
        std::abort();
    }
#endif
    const int tid = threadIdx.x;
    if (tid == 0)
        for (int b = 0; b < 2; ++b) {
            mbarrier::init(full + b, HALO_PRODUCERS);
            mbarrier::init(empty + b, 4);
        }
    __syncthreads();

    const int per_image = a.ho * wg, tiles_img = (per_image + BM - 1) / BM, tiles = a.batch * tiles_img;
    const int k_total = taps * a.cin, p_total = a.batch * a.ho * a.wo;

    if (tid < HALO_PRODUCERS) {
        wgmma::max_registers<HALO_PRODUCER_REGS, false>();
        for (int i = tid; i < planes * taps * BN * PIECES; i += HALO_PRODUCERS) {  // (plane, tap, n) weight rows
            const int row = i / PIECES, c = i % PIECES, plane = row / (taps * BN), tap = row / BN - plane * taps;
            const int n = n0 + row % BN, k = plane * CIN + c * PIECE;
            const bool ok = n < a.cout && k < a.cin;
            cp_async::copy16_or_zero(weights + swizzled(row, c), a.wr + (ok ? n * k_total + tap * a.cin + k : 0), ok);
        }
        int local = 0;
        for (int i = blockIdx.x; i < tiles; i += gridDim.x, ++local) {
            const int buf = local & 1, b = i / tiles_img, q0 = (i - b * tiles_img) * BM;
            if (local >= 2) mbarrier::wait(empty + buf, ((local >> 1) - 1) & 1);
            for (int plane = 0; plane < planes; ++plane) {
                // The pieces of a row that the plane's k steps read (the consumers' loops below): all of them, or
                // for a last plane of at most half a row's bytes, the first half (the rest is never read, so it is
                // not copied, and twice as many rows go in a pass).
                const bool half = (a.cin - plane * CIN) * (int)sizeof(T) <= ROW / 2;
                const int used = half ? PIECES / 2 : PIECES, step = HALO_PRODUCERS / used;  // rows a pass covers
                const int piece = tid % used, row0 = tid / used;  // piece `piece` of rows row0 + step i
                const int k = plane * CIN + piece * PIECE;  // the piece's first channel
                const bool has = k < a.cin;
                unsigned char* const dst = halo + buf * buffer_bytes + plane * plane_bytes;
                int ph = (q0 + row0) / wg, pw = q0 + row0 - ph * wg;  // the row's padded input position
                const T* const image = a.x + (size_t)b * a.h * a.w * a.x_cstride + (has ? k : 0);
                for (int row = row0; row < rows; row += step) {
                    const int ih = ph - a.pad_h, iw = pw - a.pad_w;
                    const bool ok = has && (unsigned)ih < (unsigned)a.h && (unsigned)iw < (unsigned)a.w;
                    cp_async::copy16_or_zero(dst + swizzled(row, piece),
                                             image + (ok ? (ih * a.w + iw) * a.x_cstride : 0), ok);
                    for (pw += step; pw >= wg; pw -= wg) ++ph;
                }
            }
            cp_async::arrive_on(full + buf);  // once this thread's copies so far (the weights too) have landed
        }
        cp_async::wait<0>();
        return;
    }

    // The consumers: warpgroup `group` takes the block's tiles local = group, group + 2, ..., from buffer `group`.
    wgmma::max_registers<HALO_CONSUMER_REGS, true>();
    const int group = (tid - HALO_PRODUCERS) / 128, lane = tid % 32, warp = tid / 32 % 4;
    const unsigned long long db0 = descriptor(weights);
    const unsigned long long da0 = descriptor(halo + group * buffer_bytes);
    const NhwcStore<E> store{a, p_total, 0, 1};
    for (int local = group, i = blockIdx.x + group * gridDim.x; i < tiles; local += 2, i += 2 * gridDim.x) {
        const int b = i / tiles_img, q0 = (i - b * tiles_img) * BM;
        typename E::Acc d[MB][BN / 2];
        int accumulate = 0;  // a register, not a constant (wgmma.cuh: C7515)
        mbarrier::wait(full + group, (local >> 1) & 1);
        wgmma::fence_proxy_async();  // the producers' copies, seen through the barrier, before the async proxy's reads
        // Plane by plane, tap by tap: the full planes' STEPS k steps, then a last plane of 16 channels' STEPS / 2
        // (int8: of 16 or 32 channels, 1; of 48, STEPS), in loops of their own (a branch between the two inside the
        // tap loop made the Cin-32 tiles 30-50 % slower).
        const auto taps_of_plane = [&](int plane, auto steps) {
            for (int r = 0; r < a.kh; ++r)
                for (int s = 0; s < a.kw; ++s) {
                    wgmma::fence();  // each tap: else ptxas puts one in itself (C7519), as the loop is not unrolled
                    const unsigned long long da = da0 + (plane * plane_bytes + (r * wg + s) * ROW) / 16;
                    const unsigned long long db = db0 + ((plane * taps + r * a.kw + s) * BN * ROW) / 16;
#pragma unroll
                    for (int kk = 0; kk < decltype(steps)::value; ++kk) {
#pragma unroll
                        for (int mb = 0; mb < MB; ++mb)
                            E::template wgmma<BN>(d[mb], da + (mb * 64 * ROW + kk * 32) / 16, db + kk * 32 / 16,
                                                  accumulate);
                        accumulate = 1;
                    }
                }
        };
        const int full_planes = a.cin / CIN;
        for (int plane = 0; plane < full_planes; ++plane) taps_of_plane(plane, HaloSteps<STEPS>{});
        if (full_planes < planes) {
            if (CIN > HALO_CIN && (a.cin - full_planes * CIN) * (int)sizeof(T) > ROW / 2)  // int8's 48
                taps_of_plane(full_planes, HaloSteps<STEPS>{});
            else
                taps_of_plane(full_planes, HaloSteps<STEPS / 2>{});
        }
        wgmma::commit();
        wgmma::wait<0>();
        if (lane == 0) mbarrier::arrive(empty + group);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) wgmma::fence_registers(d[mb]);

        // Row q0 + 64 mb + 16 warp + lane / 4 + 8 half of the grid: its output pixel, or none past Wo or Ho.
        int pixel[MB][2];
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int q = q0 + 64 * mb + 16 * warp + lane / 4 + 8 * h, oh = q / wg, u = q - oh * wg;
                pixel[mb][h] = u < a.wo && oh < a.ho ? (b * a.ho + oh) * a.wo + u : p_total;
            }
        store.template wgmma_pixels<MB, BN>(n0, [&](int mb, int h) { return pixel[mb][h]; },
                                            [&](int mb, int i) { return d[mb][i]; });
    }
}

// The halo tiles exist where wgmma does: sm_90a and the CPU emulator (conv_nhwc_wgmma.cu).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDACC__)
// HALO_THREADS (384) threads, one block an SM (168 registers a thread at launch, then setmaxnreg's split: the
// consumers hold BM / 64 x BN / 2 accumulators).
#define CONV_NHWC_HALO_KERNEL(NAME, E, BM, BN) \
    CONV_NHWC_ENTRY(NAME##_halo_##BM##x##BN, E, HALO_THREADS, 1, (conv_nhwc_halo_gemm<E, BM, BN>))

// In cuda/tiles.py's order (HALO_SPEEDS).
#define CONV_NHWC_HALO_TILES(NAME, E)       \
    CONV_NHWC_HALO_KERNEL(NAME, E, 256, 64) \
    CONV_NHWC_HALO_KERNEL(NAME, E, 256, 32) \
    CONV_NHWC_HALO_KERNEL(NAME, E, 128, 96) \
    CONV_NHWC_HALO_KERNEL(NAME, E, 128, 64) \
    CONV_NHWC_HALO_KERNEL(NAME, E, 128, 32)

#ifdef IE_NHWC_FP16
CONV_NHWC_HALO_TILES(conv_nhwc, NhwcF16)
#endif
#ifdef IE_NHWC_TF32
CONV_NHWC_HALO_TILES(conv_nhwc_tf32, NhwcTf32)
#endif
#ifdef IE_NHWC_INT8
CONV_NHWC_HALO_TILES(conv_nhwc_i8, NhwcI8)
#endif
#endif
