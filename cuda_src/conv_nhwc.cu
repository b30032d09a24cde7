// conv_nhwc.cu: 2-D convolution + bias + ReLU on NHWC activations, an implicit GEMM on the tensor cores whose
// operands both travel global -> shared memory by cp.async alone (CudaBackend's NHWC layout: `--precision fp16`,
// fp16 activations, `--precision tf32`, TF32 values in float32 words, and `--precision fp32` on sm_90a, float32
// words whose products are three TF32 ones; conv_mma.cuh's NhwcF16, NhwcTf32 and NhwcF32).
//
// y[b, oh, ow, m] = relu(bias[m] + sum_{r, s, c} w[m, r, s, c] * x[b, oh*S - PH + r, ow*S - PW + s, c]) as
// C[P, M] = A[P, K] B[K, M]: P = batch*Ho*Wo output pixels (GEMM rows), M = Cout (columns), K = KH*KW*Cin in
// (r, s, c) order. x and y are channel slices of NHWC buffers: pixel (b, h, w) of the view starts at
// x + ((b*H + h)*W + w)*x_cstride elements, where x points at the view's first channel and x_cstride is the
// buffer's channel count. Weights are rows w[M][K] of the same element type (cuda.params.direct_weights), bias fp32,
// sums fp32 (mma.m16n8k16 .f16 or mma.m16n8k8 .tf32). Needs Cin, x_cstride and the view's first channel multiples
// of PIECE (8 halves or 4 floats: 16 bytes), Cout, y_cstride and y's first channel even; for the fp16 wgmma,
// warp-specialized and halo tiles (8-byte stores of 4 channels) Cout, y_cstride, y's first channel and the parts'
// starts, offsets and strides multiples of 4. CudaBackend's views are multiples of 8 (cuda.launch_nhwc.check_nhwc).
//
// Idea: with channels innermost, the im2col row of an output pixel is, tap by tap, Cin consecutive elements of x, so
// PIECE k (Cin % PIECE == 0) are one 16-byte piece of one input pixel. conv_f16.cu's element-by-element gather
// through registers becomes one cp.async of 16 bytes per piece, with (r, s, c) of k kept per thread and advanced per
// tile, and padding and tails are the copy's zero fill (source size 0). The weight rows are 16-byte pieces too.
// Nothing passes through registers on its way to shared memory, so a ring of STAGES tiles keeps STAGES - 1 tiles of
// loads in flight behind the math of the current one, with one barrier per tile (conv_mma.cuh's cp_async_ring).
// Shared tiles As[pixel][k], Bs[m][k]: 4 pieces = 64 bytes per row (32 k of fp16, 16 of tf32), unpadded, so that 3
// stages of 128x128 fit the 48 KB of static shared memory. 16-byte piece c of row r is stored at piece
// c ^ (r / 2 % 4): two rows share a 128-byte bank window, and the 8 rows one ldmatrix phase reads (the same logical
// piece of rows r0..r0+7, r0 even) then fall on bank groups 4 (r % 2) + (c ^ r / 2 % 4), all 8 distinct.
// Fragments by ldmatrix.x4: one mma k step spans two pieces, and in both element types the ISA's fragments are the
// same 16-byte pieces (conv_f16.cu's header for fp16; for .tf32, a0..a3 = A[g][t], A[g+8][t], A[g][t+4],
// A[g+8][t+4] and b0, b1 = B[t][g], B[t+4][g] are, 32 bits per lane, ldmatrix's (row g, word t) of the pieces
// (rows 0-7 | 8-15) x (piece 0 | 1)). A rows are output pixels here, B rows output channels.
// Epilogue: a lane's accumulator pair (c0, c1) is two adjacent output channels of one pixel: bias, ReLU (on channels
// below relu_end), rounding to the element type, one 4- or 8-byte store.
// Parts: the 1x1 convs of a module that read the same input run as one GEMM of their stacked weights
// (plan.fuse_pointwise), whose output channels go to up to four views of the same arena: part 0 from channel 0 at
// y (y_cstride), part i = 1..3 from channel start_i at y + offset_i (elements, maybe negative), pixel stride
// cstride_i. A plain conv has one part (every start_i = Cout). The raw products of a member whose average pool was
// moved behind it come last, past relu_end, with zero bias (the pool adds bias and ReLU: pool_nhwc.cu).
// Split-K: blockIdx.z selects K slice [z*k_split, (z+1)*k_split) (a multiple of the stage's k); with several slices
// the raw fp32 sums go to the workspace ws[z][P][M] (`out` is then ws) and conv_nhwc[_tf32]_splitk_reduce sums them
// in slice order, adds bias, applies ReLU and writes y.
// Block order: tile_n0 / tile_m0 (common.cuh) on grid (pixel tiles, channel tiles): consecutive blocks take the
// channel tiles of one pixel tile, which then share its input through L2.
// Max pool in front (conv_nhwc[_tf32]_maxpool3_<BM>x<BN>, plan.fuse_max_pools): a 1x1 conv whose input is a 3x3 max
// pool of x (stride `stride`, no padding) takes the window maxima as it loads A (NhwcMaxPoolLoader), so the pool's
// output never goes through memory: MaxPool_3a and Conv2d_3b become one pass over the pool's input.
//
// Launch: conv_nhwc_<BM>x<BN> (fp16), conv_nhwc_tf32_<BM>x<BN> and their _maxpool3_ twins: block 256, grid
//         (ceil(P / BM), ceil(M / BN), splits), static shared memory STAGES * (BM + BN) * 64 bytes.
//         conv_nhwc[_tf32|_f32]_wgmma_<BM>x<BN>: the same grid, dynamic shared memory wgmma_ring_bytes(split, BM,
//         BN). conv_nhwc[_tf32|_f32]_splitk_reduce: block 256, grid ceil(P * M / 2 / 256).
#include "conv_mma.cuh"

// Stages of the wgmma tiles' ring (cuda.tiles.wgmma_stages), for two blocks an SM (one block cannot hide its own
// barrier and load latency: round 9's 256x128 and 256x192 tiles): for 128 pixel rows, 4 in flight while one is
// multiplied and the one before it may still be read by its wgmma (3 for 128x192, whose 6 would not fit twice);
// 256-row tiles, twice the bytes a stage, 2. A SPLIT element type (NhwcF32) needs WGMMA_LO_TILES more tiles for the
// low halves (conv_nhwc_wgmma_gemm): 6 stages for its tiles of at most 64 channels, and 8 for 128x128, which runs one
// block an SM (its sums in registers twice would spill at two).
__host__ __device__ constexpr int wgmma_stages(bool split, int bm, int bn) {
    return split ? (bn == 128 ? 8 : 6) : bm == 256 ? 4 : bn == 192 ? 5 : 6;
}
constexpr int WGMMA_LO_TILES = 3;
// A SPLIT type's tensor-core accumulators take the sums of this many tiles (12 wgmma of k8), then they are added to
// fp32 registers, rounded to nearest. The tensor cores' own accumulation measured biased: with every tile in them,
// fp32 forwards were 1.1e-4 off float64 at batch 128, where long K runs unsplit (2.0e-5 at batch 1, split-K), on the
// H100, against 4.5e-7 for the FFMA path.
[[maybe_unused]] constexpr int WGMMA_SPLIT_CHUNK = 2;  // unused where the wgmma tiles are not built
// The ring's bytes, the launch's dynamic shared memory (cuda.tiles.wgmma_ring_bytes).
__host__ __device__ constexpr int wgmma_ring_bytes(bool split, int bm, int bn) {
    return (wgmma_stages(split, bm, bn) + (split ? WGMMA_LO_TILES : 0)) * (bm + bn) * 64;
}

// Where 16-byte piece `piece` of shared row `row` lives (in elements from the row's start); see the header.
template <int PIECE>
__device__ __forceinline__ int swizzled(int row, int piece) { return (piece ^ (row >> 1 & 3)) * PIECE; }

// Where the output channels go (the header's parts): part i >= 1 takes channels from start[i - 1] on.
struct NhwcParts {
    int start[3], offset[3], cstride[3], relu_end;

    // Channel m of output pixel p is at element base + p cstride from y. 32-bit: every part lies in the arena, which
    // has fewer than 2^31 elements (CudaBackend checks).
    struct Column {
        int base, cstride;
    };
    __device__ __forceinline__ Column column(int y_cstride, int m) const {
        Column col{m, y_cstride};
#pragma unroll
        for (int i = 0; i < 3; ++i)
            if (m >= start[i]) col = Column{offset[i] + (m - start[i]), cstride[i]};
        return col;
    }
};

// The arguments every NHWC conv kernel takes, as one value (the loader and the epilogues read them).
template <class E>
struct NhwcConvArgs {
    const typename E::T* __restrict__ x;
    const typename E::T* __restrict__ wr;
    const float* __restrict__ bias;
    void* __restrict__ out;
    int batch, cin, h, w, x_cstride, cout, ho, wo, y_cstride, kh, kw, stride, pad_h, pad_w, k_split;
    NhwcParts parts;
};

// The cp.async loader of a BM x BN block tile with NT threads: load(k, stage) copies this thread's pieces of the next
// K tile (BK = 4 pieces) into As[stage], Bs[stage]. The thread copies piece `piece` (k = PIECE piece ..
// PIECE (piece + 1) - 1 of the stage) of tile rows row0 + ROWS i; ROWS is a multiple of 8, so all its rows share
// one swizzle and its shared addresses are fixed steps from its first.
// Per stage it is meant to cost few instructions (round 9: the SASS loop had 146 per stage, most of it address
// arithmetic, with the tensor cores idle half the time; 136 after this rewrite, as at 128x192's register cap ptxas
// reloads some of this state every stage). Everything that does not change between stages is computed once: the
// pixels' window corners and element offsets, the weight rows' offsets, the shared addresses. The piece's k is kept
// as (r, s, c) and as its tap's element offset, advanced by BK per stage without a division (stages are loaded in
// order). Offsets are 32-bit and non-negative where read (a buffer of x has fewer than 2^31 elements:
// cuda.launch_nhwc.check_nhwc), so an address is one multiply-add; a piece outside the input reads offset 0 with zero
// fill, so no branch is needed.
template <class E, int BM, int BN, int NT>
struct NhwcLoader {
    using T = typename E::T;
    static constexpr int PIECE = E::PIECE, BK = 4 * PIECE, ROWS = NT / 4;  // ROWS: tile rows one pass covers
    static constexpr int A_ROWS = BM / ROWS, B_ROWS = (BN + ROWS - 1) / ROWS;  // rows of each tile per thread
    static_assert(BM % ROWS == 0 && (BN % ROWS == 0 || BN < ROWS) && ROWS % 8 == 0, "loader shape");

    const T* __restrict__ x;
    const T* __restrict__ wr;
    T* a_dst;  // this thread's first piece in As[0] and Bs[0]
    T* b_dst;
    int a_at, b_at;  // ... as offsets from As[0] and Bs[0] (where split() puts the low halves)
    bool b_rows;  // the thread has B rows (a narrow tile: only the threads of its first BN rows)
    int h, w, cin, kw, x_cstride, k_end;
    int a_ih[A_ROWS], a_iw[A_ROWS];  // the pixel's window corner
    int a_corner[A_ROWS];            // offset of the corner's pixel (in the padding, maybe: read only when inside)
    int w_row[B_ROWS];               // offset of the weight row; -1 past Cout (zero fill)
    int k, c, r, s, tap;             // the piece's k as (r, s, c), and tap = (r w + s) x_cstride + c

    __device__ __forceinline__ NhwcLoader(const NhwcConvArgs<E>& a, T (*as)[BM][BK], T (*bs)[BN][BK], int p0, int m0,
                                          int k_begin, int k_end_, int tid)
        : x(a.x), wr(a.wr), h(a.h), w(a.w), cin(a.cin), kw(a.kw), x_cstride(a.x_cstride), k_end(k_end_) {
        const int piece = tid % 4, row0 = tid / 4;
        const int howo = a.ho * a.wo, p_total = a.batch * howo, k_total = a.kh * a.kw * a.cin;
        a_dst = &as[0][row0][swizzled<PIECE>(row0, piece)];
        b_dst = &bs[0][row0][swizzled<PIECE>(row0, piece)];
        a_at = a_dst - &as[0][0][0];
        b_at = b_dst - &bs[0][0][0];
        b_rows = BN >= ROWS || row0 < BN;
#pragma unroll
        for (int i = 0; i < A_ROWS; ++i) {
            const int p = p0 + row0 + ROWS * i;
            const int b = p / howo, q = p - b * howo, oh = q / a.wo, ow = q - oh * a.wo;
            a_ih[i] = p < p_total ? oh * a.stride - a.pad_h : -(1 << 20);  // a pixel past P reads only zero fill
            a_iw[i] = ow * a.stride - a.pad_w;
            a_corner[i] = ((b * a.h + oh * a.stride - a.pad_h) * a.w + a_iw[i]) * a.x_cstride;
        }
#pragma unroll
        for (int i = 0; i < B_ROWS; ++i)
            w_row[i] = m0 + row0 + ROWS * i < a.cout ? (m0 + row0 + ROWS * i) * k_total : -1;
        k = k_begin + PIECE * piece;
        const int t = k / a.cin;
        c = k - t * a.cin;
        r = t / a.kw;
        s = t - r * a.kw;
        tap = (r * a.w + s) * a.x_cstride + c;
    }

    __device__ __forceinline__ void operator()(int, int stage) {
        const bool k_ok = k < k_end;  // k_split and K are multiples of PIECE: a piece is inside or outside
        T* const ad = a_dst + stage * (BM * BK);
#pragma unroll
        for (int i = 0; i < A_ROWS; ++i) {
            const bool ok = k_ok && (unsigned)(a_ih[i] + r) < (unsigned)h && (unsigned)(a_iw[i] + s) < (unsigned)w;
            cp_async::copy16_or_zero(ad + i * ROWS * BK, x + (ok ? (unsigned)(a_corner[i] + tap) : 0u), ok);
        }
        copy_b(stage, k_ok);
        advance();
    }

    // This thread's weight pieces of the stage.
    __device__ __forceinline__ void copy_b(int stage, bool k_ok) const {
        if (b_rows) {
            T* const bd = b_dst + stage * (BN * BK);
#pragma unroll
            for (int i = 0; i < B_ROWS; ++i) {
                const bool ok = k_ok && w_row[i] >= 0;
                cp_async::copy16_or_zero(bd + i * ROWS * BK, wr + (ok ? (unsigned)(w_row[i] + k) : 0u), ok);
            }
        }
    }

    __device__ __forceinline__ void advance() {
        k += BK;  // the next stage's piece
        tap += BK;
        for (c += BK; c >= cin; c -= cin) {  // past the tap's channels: the next tap (s, then r)
            tap += x_cstride - cin;
            if (++s == kw) {
                s = 0;
                ++r;
                tap += (w - kw) * x_cstride;
            }
        }
    }

    // SPLIT element types: this thread's pieces of the tile in `stage` become their high halves, and their low
    // halves go to the same places of the tiles at a_lo, b_lo (E::split). Each piece is split by the thread that
    // copied it, once its own copies have landed (cp_async_ring's landed), so no other thread has to wait.
    __device__ __forceinline__ void split(int stage, T* a_lo, T* b_lo) const {
        T* const ad = a_dst + stage * (BM * BK);
#pragma unroll
        for (int i = 0; i < A_ROWS; ++i) E::split(ad + i * ROWS * BK, a_lo + a_at + i * ROWS * BK);
        if (b_rows) {
            T* const bd = b_dst + stage * (BN * BK);
#pragma unroll
            for (int i = 0; i < B_ROWS; ++i) E::split(bd + i * ROWS * BK, b_lo + b_at + i * ROWS * BK);
        }
    }
};

// The loader of a 1x1 conv that reads a max pool's output without it being stored (plan.fuse_max_pools): x is the
// pool's input, stride the pool's (pad 0: its windows lie inside the image, as torchvision's stem pools do), and
// A[p][k] = max over the POOL x POOL window of output pixel p, channel k. The A pieces travel through registers:
// the thread's POOL^2 pieces of every row are loaded as raw words first, without a branch (a row past P or a piece
// past K loads pixel 0's and is zeroed after), so that all of them are in flight together, as a cp.async stage's
// would be; then their maxima are stored where a cp.async would have put the piece, and the ring's barrier makes
// them visible as it does the copies. The weights still go by cp.async. A 1x1 conv has one tap, so the base's tap
// offset is the channel offset.
template <class E, int BM, int BN, int NT, int POOL>
struct NhwcMaxPoolLoader : NhwcLoader<E, BM, BN, NT> {
    using Base = NhwcLoader<E, BM, BN, NT>;
    using typename Base::T;
    using Base::A_ROWS, Base::BK, Base::PIECE, Base::ROWS;
    using Base::Base;

    __device__ __forceinline__ void operator()(int, int stage) {
        const bool k_ok = this->k < this->k_end;
        const int row = this->w * this->x_cstride;
        bool ok[A_ROWS];
        uint4 q[A_ROWS][POOL * POOL];
#pragma unroll
        for (int i = 0; i < A_ROWS; ++i) {
            ok[i] = k_ok && this->a_ih[i] >= 0;  // a_ih < 0: the base's marker of a pixel past P
            const T* const corner = this->x + (ok[i] ? (unsigned)(this->a_corner[i] + this->tap) : 0u);
#pragma unroll
            for (int t = 0; t < POOL * POOL; ++t)
                q[i][t] = __ldg(reinterpret_cast<const uint4*>(corner + t / POOL * row + t % POOL * this->x_cstride));
        }
        T* const ad = this->a_dst + stage * (BM * BK);
#pragma unroll
        for (int i = 0; i < A_ROWS; ++i) {
            float m[PIECE], v[PIECE];
            E::unpack(m, q[i][0]);
#pragma unroll
            for (int t = 1; t < POOL * POOL; ++t) {
                E::unpack(v, q[i][t]);
#pragma unroll
                for (int e = 0; e < PIECE; ++e) m[e] = fmaxf(m[e], v[e]);
            }
#pragma unroll
            for (int e = 0; e < PIECE; ++e) m[e] = ok[i] ? m[e] : 0.f;
            E::store(ad + i * ROWS * BK, m);  // exact: the maximum is one of the element type's values
        }
        this->copy_b(stage, k_ok);
        this->advance();
    }
};

// The epilogue of a thread's accumulators, one column at a time: pairs of output channels m, m + 1 (cout is even:
// m + 1 < cout when m < cout) of the thread's pixels. Raw to the split-K workspace when the grid has several slices,
// else bias, ReLU, the element type, into the column's part. What depends on the channels alone (part, bias, ReLU)
// is looked up once per column rather than once per pair (round 9: the per-pair lookups were ~2,700 instructions a
// warp per 128x192 block).
template <class E>
struct NhwcStore {
    const NhwcConvArgs<E>& a;
    int p_total;
    int z, splits;  // the block's K slice (blockIdx.z) of how many (gridDim.z)

    // pairs(put) calls put(p, v0, v1) for each of the thread's pixels p in this column.
    template <class Pairs>
    __device__ __forceinline__ void column(int m, Pairs&& pairs) const {
        if (m >= a.cout) return;
        if (splits > 1) {
            float* ws = static_cast<float*>(a.out) + (size_t)z * p_total * a.cout + m;
            pairs([&](int p, float v0, float v1) {
                if (p < p_total) *reinterpret_cast<float2*>(ws + (size_t)p * a.cout) = float2{v0, v1};
            });
            return;
        }
        const NhwcParts::Column col = a.parts.column(a.y_cstride, m);
        const float b0 = __ldg(a.bias + m), b1 = __ldg(a.bias + m + 1);
        const bool relu = m < a.parts.relu_end;
        typename E::T* const y = static_cast<typename E::T*>(a.out) + col.base;
        pairs([&](int p, float v0, float v1) {
            if (p >= p_total) return;
            v0 += b0;
            v1 += b1;
            if (relu) {
                v0 = fmaxf(v0, 0.f);
                v1 = fmaxf(v1, 0.f);
            }
            E::store2(y + p * col.cstride, v0, v1);
        });
    }

    // fp16: channels m .. m + 3 of the thread's pixels, quads(put) calling put(p, v[4]), one 8-byte store each.
    // Pairs would be 4-byte stores, 16 bytes of a pixel per warp instruction: half a 32-byte sector (ncu: 32 % of
    // the sectors in excess, round 12). All four channels are below Cout and in one part, as every count and start
    // is a multiple of 4 here (the header).
    template <class Quads>
    __device__ __forceinline__ void column4(int m, Quads&& quads) const {
        if (m >= a.cout) return;
        const NhwcParts::Column col = a.parts.column(a.y_cstride, m);
        float bias[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) bias[e] = __ldg(a.bias + m + e);
        const bool relu = m < a.parts.relu_end;
        typename E::T* const y = static_cast<typename E::T*>(a.out) + col.base;
        quads([&](int p, const float (&q)[4]) {
            if (p >= p_total) return;
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = relu ? fmaxf(q[e] + bias[e], 0.f) : q[e] + bias[e];
            E::store4(y + p * col.cstride, v);
        });
    }

    // A wgmma warpgroup's BN-channel tile from channel m0: sum(mb, i) is its accumulator i of 64-row block mb, which
    // holds tile row 64 mb + 16 warp + g + 8 half, channels 8j + 2t + e for i = 4j + 2 half + e (wgmma.cuh's D
    // layout); pixel(mb, half) is the output pixel of this thread's row (p_total or more: none). fp16, no split-K:
    // lanes t and t ^ 1 swap pairs so that each holds 4 adjacent channels of a pixel (even t: block j's 2t .. 2t + 3,
    // odd t: block j + 1's 2t - 2 .. 2t + 1), and the 4 lanes of a pixel store blocks j and j + 1 as 32 bytes.
    template <int MB, int BN, class Pixel, class Sum>
    __device__ __forceinline__ void wgmma_pixels(int m0, Pixel&& pixel, Sum&& sum) const {
        const int t = threadIdx.x % 4;
        if constexpr (sizeof(typename E::T) == 2) {
            static_assert(BN % 16 == 0, "fp16 stores blocks of 8 channels in pairs");
            if (splits == 1) {
                const bool odd = t & 1;
#pragma unroll
                for (int j = 0; j < BN / 8; j += 2) {
                    float q[MB][2][4];
#pragma unroll
                    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                        for (int half = 0; half < 2; ++half) {
                            const int i = 4 * j + 2 * half;  // block j's pair; i + 4, block j + 1's
                            const float a0 = sum(mb, i), a1 = sum(mb, i + 1), b0 = sum(mb, i + 4), b1 = sum(mb, i + 5);
                            const float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
                            const float r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
                            float(&v)[4] = q[mb][half];
                            v[0] = odd ? r0 : a0;
                            v[1] = odd ? r1 : a1;
                            v[2] = odd ? b0 : r0;
                            v[3] = odd ? b1 : r1;
                        }
                    column4(m0 + 8 * j + 2 * t + (odd ? 6 : 0), [&](auto&& put) {
#pragma unroll
                        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                            for (int half = 0; half < 2; ++half) put(pixel(mb, half), q[mb][half]);
                    });
                }
                return;
            }
        }
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
            column(m0 + 8 * j + 2 * t, [&](auto&& put) {
#pragma unroll
                for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                    for (int half = 0; half < 2; ++half)
                        put(pixel(mb, half), sum(mb, 4 * j + 2 * half), sum(mb, 4 * j + 2 * half + 1));
            });
    }
    // ... whose rows are the pixels of the GEMM tile's rows from p0, warpgroup `group` taking rows 64 MB group on.
    template <int MB, int BN, class Sum>
    __device__ __forceinline__ void wgmma_rows(int p0, int m0, int group, Sum&& sum) const {
        const int lane = threadIdx.x % 32, row = p0 + 64 * MB * group + 16 * (threadIdx.x / 32 % 4) + lane / 4;
        wgmma_pixels<MB, BN>(m0, [&](int mb, int half) { return row + 64 * mb + 8 * half; }, sum);
    }
};

template <class E, int BM, int BN, int WARPS_M, int STAGES, class Loader = NhwcLoader<E, BM, BN, 256>>
__device__ __forceinline__ void conv_nhwc_gemm(const NhwcConvArgs<E>& a) {
    using T = typename E::T;
    constexpr int PIECE = E::PIECE, NT = 256, BK = Loader::BK;
    constexpr int WARPS_N = NT / 32 / WARPS_M, WM = BM / WARPS_M, WN = BN / WARPS_N;
    constexpr int MI = WM / 16, NJ = WN / 8;  // m16n8 tiles per warp
    static_assert(WM % 16 == 0 && NJ % 2 == 0, "tile shape");

    __shared__ __align__(128) T As[STAGES][BM][BK];
    __shared__ __align__(128) T Bs[STAGES][BN][BK];

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = (warp % WARPS_M) * WM, wn = (warp / WARPS_M) * WN;
    const int p_total = a.batch * a.ho * a.wo, k_total = a.kh * a.kw * a.cin;
    const int p0 = tile_n0(BM), m0 = tile_m0(BN);
    const int k_begin = blockIdx.z * a.k_split;
    const int k_end = min(k_total, k_begin + a.k_split);
    Loader load(a, As, Bs, p0, m0, k_begin, k_end, tid);

    float acc[MI][NJ][4];
    zero_acc(acc);

    // This lane's ldmatrix rows and pieces (the header): A matrices (rows 0-7 | 8-15) x (piece 0 | 1); B matrices
    // (n 0-7, piece 0), (n 0-7, piece 1), (n 8-15, piece 0), (n 8-15, piece 1). Tile rows start at multiples of 16,
    // so the swizzle of a lane's row depends on the lane only.
    const int a_row = lane % 16, a_piece = lane / 16;
    const int b_row = lane % 8 + lane / 16 * 8, b_piece = lane / 8 % 2;

    cp_async_ring<STAGES, BK>(k_begin, k_end, load, [&](int st) {
#pragma unroll
        for (int kk = 0; kk < 4; kk += 2) {  // mma k steps of two pieces (k16 of fp16, k8 of tf32)
            unsigned b[NJ][2];
#pragma unroll
            for (int jj = 0; jj < NJ / 2; ++jj) {
                const int row = wn + 16 * jj + b_row;
                ldmatrix_b_pair(b[2 * jj], b[2 * jj + 1], &Bs[st][row][swizzled<PIECE>(row, kk + b_piece)]);
            }
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                const int row = wm + 16 * i + a_row;
                unsigned af[4];
                ldmatrix::x4(af, &As[st][row][swizzled<PIECE>(row, kk + a_piece)]);
#pragma unroll
                for (int j = 0; j < NJ; ++j) E::mma(acc[i][j], af, b[j]);
            }
        }
    });
    cp_async::wait<0>();  // no copy may still target shared memory when the block exits

    // Epilogue: C[g (+8)][2t, 2t+1] of each m16n8 tile (conv_mma.cuh's C layout) = pixel p, channels m, m + 1.
    const int g = lane / 4, t = lane % 4;
    const NhwcStore<E> store{a, p_total, (int)blockIdx.z, (int)gridDim.z};
#pragma unroll
    for (int j = 0; j < NJ; ++j)
        store.column(m0 + wn + 8 * j + 2 * t, [&](auto&& put) {
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int half = 0; half < 2; ++half)
                    put(p0 + wm + 16 * i + g + 8 * half, acc[i][j][2 * half], acc[i][j][2 * half + 1]);
        });
}

// The same implicit GEMM with wgmma (sm_90a; wgmma.cuh): the tiles the loader fills are already in wgmma's 64-byte
// swizzle, so each warpgroup multiplies its 64 pixel rows of the stage by the whole BN-channel B tile with two
// instructions (k16 + k16 of fp16, k8 + k8 of tf32) instead of the mma.sync kernel's ldmatrix and m16n8 steps:
// 128x128 issues 2 wgmma per warp per stage instead of 12 ldmatrix + 32 mma. Two warpgroups, 256 threads; the
// accumulators, BM / 128 * BN / 2 per thread, stay in registers until the epilogue. A stage's wgmma run on while the
// next stage is waited for and loaded: its math waits only for the previous stage's (wait(1)), and the ring loads
// into the buffer of the stage before that (cp_async_ring's ASYNC). The ring lives in dynamic shared memory
// (wgmma_stages() stages, more than static shared memory's 48 KB hold), so that it still keeps STAGES - 2 tiles of
// loads in flight. A 256-pixel tile has each warpgroup multiply two blocks of 64 rows per stage.
// 128x192 (96 accumulators a thread) covers the Cout = 192 and 384 layers in whole tiles, reading 1.2x fewer
// bytes per multiply-add than 128x128.
// SPLIT (NhwcF32): each thread splits the pieces it copied into high halves in place and low halves in a ring of
// WGMMA_LO_TILES A and B tiles of their own (cp_async_ring's landed), and each k step is three wgmma: A B, A B_lo,
// A_lo B. The low tiles of tile t are written before the barrier of tile t, while a warpgroup may still be in the
// math of tile t - 1 and its wgmma of tile t - 2 may still read: so three of them, one for each. Every
// WGMMA_SPLIT_CHUNK tiles the accumulators are waited for and added to `total`, and the next tile starts them anew.
#ifdef __CUDACC__
extern __shared__ __align__(1024) unsigned char wgmma_ring[];
#else
// The emulator runs one block at a time; the ring is as large as an SM's shared memory for a block (227 KB): the
// warp-specialized tiles take ~200 KB, the halo tiles up to all of it (below).
alignas(1024) static unsigned char wgmma_ring[227 * 1024];
static_assert(wgmma_ring_bytes(true, 128, 128) <= sizeof(wgmma_ring), "the emulator's ring is too small");
static_assert(wgmma_ring_bytes(false, 128, 192) <= sizeof(wgmma_ring), "the emulator's ring is too small");
#endif

template <class E, int BM, int BN>
__device__ __forceinline__ void conv_nhwc_wgmma_gemm(const NhwcConvArgs<E>& a) {
    using T = typename E::T;
    constexpr int NT = 256, MB = BM / 128;  // two warpgroups, each MB blocks of 64 pixel rows
    constexpr int STAGES = wgmma_stages(E::SPLIT, BM, BN);
    using Loader = NhwcLoader<E, BM, BN, NT>;
    constexpr int BK = Loader::BK;
    static_assert(BM % 128 == 0 && (BN == 192 || BN == 128 || BN == 64 || BN == 32), "wgmma tile shape");

    // 512-byte aligned tiles (BM, BN multiples of 8 rows of 64 bytes): the swizzle repeats every 512 bytes.
    // wgmma_ring_bytes(E::SPLIT, BM, BN), the launch's dynamic shared memory (cuda.tiles.wgmma_ring_bytes):
    // As[STAGES], Bs[STAGES], and for SPLIT A_lo[WGMMA_LO_TILES], B_lo[WGMMA_LO_TILES].
    T(*As)[BM][BK] = reinterpret_cast<T(*)[BM][BK]>(wgmma_ring);
    T(*Bs)[BN][BK] = reinterpret_cast<T(*)[BN][BK]>(wgmma_ring + STAGES * BM * BK * sizeof(T));
    T* const a_lo = reinterpret_cast<T*>(wgmma_ring + STAGES * (BM + BN) * BK * sizeof(T));
    T* const b_lo = a_lo + WGMMA_LO_TILES * BM * BK;
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
    float d[MB][BN / 2];
    int accumulate = 0;

    // The descriptors of buffer 0; a buffer, and 64 rows, are fixed steps on (start addresses in units of 16 bytes).
    const unsigned long long da0 = wgmma::desc_k_major_64b(&As[0][64 * MB * group][0]);
    const unsigned long long db0 = wgmma::desc_k_major_64b(&Bs[0][0][0]);
    const unsigned long long da_lo0 = wgmma::desc_k_major_64b(a_lo + 64 * MB * group * BK);
    const unsigned long long db_lo0 = wgmma::desc_k_major_64b(b_lo);
    constexpr unsigned A_STEP = BM * BK * sizeof(T) / 16, B_STEP = BN * BK * sizeof(T) / 16;
    constexpr unsigned ROWS64_STEP = 64 * BK * sizeof(T) / 16;
    int lo = WGMMA_LO_TILES - 1;  // the low tiles of the tile being split and multiplied (SPLIT)
    // SPLIT: d holds the sums of at most WGMMA_SPLIT_CHUNK tiles (chunk_tiles so far); then they move to total.
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
#pragma unroll
                for (int i = 0; i < BN / 2; ++i) total[mb][i] += d[mb][i];
            }
        }
    };
    const auto split = [&](int st) {
        if constexpr (E::SPLIT) {
            lo = lo == WGMMA_LO_TILES - 1 ? 0 : lo + 1;
            load.split(st, a_lo + lo * BM * BK, b_lo + lo * BN * BK);
        }
    };
    cp_async_ring<STAGES, BK, true>(
        k_begin, k_end, load,
        [&](int st) {
            const unsigned long long db = db0 + st * B_STEP;
            wgmma::fence();
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {  // rows 64 (MB group + mb) ..
                const unsigned long long da = da0 + (st * A_STEP + mb * ROWS64_STEP);
#pragma unroll
                for (int half = 0; half < 2; ++half) {  // k8 + k8 (tf32) or k16 + k16 (fp16): 32 bytes on
                    const unsigned long long on = half * wgmma::DESC_32_BYTES;
                    E::template wgmma<BN>(d[mb], da + on, db + on, half ? 1 : accumulate);
                    if constexpr (E::SPLIT) {
                        const unsigned long long da_lo = da_lo0 + (lo * A_STEP + mb * ROWS64_STEP);
                        E::template wgmma<BN>(d[mb], da + on, db_lo0 + lo * B_STEP + on, 1);
                        E::template wgmma<BN>(d[mb], da_lo + on, db + on, 1);
                    }
                }
            }
            accumulate = 1;
            wgmma::commit();
            if (E::SPLIT && ++chunk_tiles == WGMMA_SPLIT_CHUNK) {
                wgmma::wait<0>();
                promote();
                accumulate = chunk_tiles = 0;
            } else {
                wgmma::wait<1>();
            }
        },
        split);
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

// The same implicit GEMM, warp-specialized and persistent (sm_90a; "_ws" tiles). Round 9's ncu profile of the wgmma
// tiles: every warp both loads and multiplies, so the loader's address arithmetic (136 SASS instructions per stage,
// under 128x192's register cap) takes the issue slots, and the tensor pipe is active ~50 % of the time. Here the
// block is four warpgroups with one job each:
// - warpgroups 0 and 1, the producers, run NhwcLoader (their 256 threads copy the whole tile) into a ring of STAGES
//   buffers (one producer warpgroup measured too slow: round 11 in docs/performance-log.md);
// - warpgroups 2 and 3, the consumers, each multiply 64 (MB x 64) pixel rows of a stage by its B tile, then release
//   the buffer, and do the epilogue; they issue ~10 instructions a stage.
// setmaxnreg moves registers from the producers to the consumers (WS_PRODUCER_REGS, WS_CONSUMER_REGS).
// Buffer handover by mbarriers (wgmma.cuh): full[b] completes when each of the producer threads' copies into b
// have landed (cp.async.mbarrier.arrive: the hardware arrives for the thread, which goes on issuing), and the
// consumers fence them for the async proxy after the wait; empty[b] when the 8 consumer warps have arrived, each
// once the wgmma that read b have completed (wgmma.wait_group). The producers wait for empty[b] before reloading b.
// (Round 11's first version arrived on full[b] itself, after cp.async.wait_group, LAG loads behind the one it issued:
// that put the issue of a later load, which waits for a buffer, between a stage landing and its consumers.)
// Persistent: gridDim.x blocks (one an SM: the ring takes ~200 KB) take the tiles blockIdx.x, + gridDim.x, ... in
// tile_n0's order (the channel tiles of one pixel tile, then its K slices last), so the producer loads the next
// tile's stages while the consumers store the last one's.
// TMA (the "_ws_tma_" tiles): one producer thread asks the copy engine for each stage's two boxes instead, the A
// tile as an im2col box of the input (its first pixel's window corner, shifted by the stage's tap) and the B tile as
// a box of the weights, through two tensor maps in global memory (cuda.tensor_maps; `maps`: A's, then B's, 128
// bytes each). The eight producer warps issued ~95 instructions a warp a stage for their cp.async (item 11 of issue
// 23 in docs/PERFORMANCE.md); with no loads at all the ws tiles ran ~20 % faster (item 15). A stage's rows are 128
// bytes (64 k of fp16, 32 of tf32) in the 128-byte swizzle: TMA moves boxes of 64-byte rows at 42 (im2col) and 68
// (tiled) GB/s an SM, of 128-byte rows at 59 and 143 (scripts/tma_probe.py --bandwidth, H100), and with 64-byte
// rows these tiles ran 8-17 % slower than the cp.async ones. A stage must not span two taps: Cin is a multiple of
// its k (cuda.tiles.tile_fits). full[b] takes the one arrival of that thread with the stage's bytes expected, and the
// consumers need no proxy fence (the copy engine writes through the async proxy, which their wgmma read).
// Ping-pong (the "_ws_tma_pp_" tiles, TMA only): with the loads on the copy engine, the consumers' epilogue is the
// largest cost left (issue 23 item 17: the forward ran 4.27 -> 3.77 ms with the stores skipped), because the tensor
// cores idle while both consumer warpgroups store the same tile. Here each consumer warpgroup takes whole tiles, in
// turn (block tiles 0, 2, 4, ... and 1, 3, ...), so that one stores while the other multiplies. A warpgroup then holds
// a whole tile's sums (BM / 64 x BN / 2 accumulators: 192 for 128x192), so the block is one producer warpgroup (its
// thread 0 asks for every box) and two consumers, WS_PP_THREADS, with setmaxnreg's 40 / 232 registers. The producer
// fills the ring in tile order as before, and each consumer steps its ring position over the other's stages. A
// consumer starts a tile's stages only once the other has waited for the last stage of its own (the turn barriers):
// mbarrier waits tell phases apart by parity alone, so a wait for fill f of a buffer while fill f - 1 has not landed
// would pass on fill f - 2's completed phase. A consumer waits its own stages in order and the turn follows its wait
// for the tile's last, so every fill before the other's next tile has been seen landed (TMA loads into different
// buffers may land out of order: the producer's order alone would not say so).
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

template <class E, int BM, int BN, bool TMA = false, bool PINGPONG = false>
__device__ __forceinline__ void conv_nhwc_ws_gemm(const NhwcConvArgs<E>& a, const unsigned char* maps = nullptr) {
    using T = typename E::T;
    constexpr int ROW = TMA ? 128 : 64;  // bytes of a stage's row: its k (the TMA tiles' in the 128-byte swizzle)
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
        float d[MB][BN / 2];
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
                for (int kk = 0; kk < ROW / 32; ++kk) {  // k steps of 32 bytes: k16 (fp16), k8 (tf32)
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

// Halo tiles (sm_90a, "_halo_": conv_nhwc[_tf32]_halo_<BM>x<BN>) for stride-1 convs with several taps, first built
// for the stem's Conv2d_2a and 2b (32 -> 32 and 32 -> 64 channels, 3x3, 147x147), then for Conv2d_4a (80 -> 192,
// 3x3, 73x73) and the 35x35 modules' 3x3s and 5x5s. There the implicit GEMM is bound by L2, not by the tensor cores:
// each of the KH x KW taps reads the whole input again (round 11: Conv2d_2b moves ~3.9 GB through L2 for 0.36 GB of
// input, 0.82 ms at batch 128; session 4: Conv2d_4a's 128x192 tiles run L2 at 87 % of its peak). Here a block copies
// the input rows its outputs need, once, and every tap multiplies the same shared copy:
// - Output positions run over the padded-width grid of each image: q = oh Wg + u, Wg = W + 2 PW, u < Wg, of which
//   u < Wo are outputs (the other KW - 1 columns of a row are computed and dropped: 1.3 % of Conv2d_2b's work, 2.7 %
//   of Conv2d_4a's). Then tap (r, s) of output q reads padded input position q + r Wg + s, so for a tile of BM
//   consecutive q the A matrix of tap (r, s) is the shared rows [r Wg + s, r Wg + s + BM) of the tile's halo: its
//   padded input positions q0 .. q0 + halo_rows - 1, one row each (positions in the padding and past the image are
//   copied as zeros). A wgmma descriptor may start at any row (wgmma.cuh's desc_k_major_128b: the swizzle is a
//   function of the address).
// - A row holds HALO_CIN channels, one swizzle row (128 bytes of tf32 in the 128-byte swizzle, 64 of fp16 in the
//   64-byte one), so wider inputs are cut into planes of HALO_CIN channels: the halo is planes x rows, the weights
//   planes x taps x BN rows, and the K loop runs plane by plane, tap by tap. Cin is a multiple of 16: a last plane of
//   16 channels takes half the row's k steps.
// - L2 reads: halo_rows / BM = 2.2x the input for Conv2d_2b's 149-wide grid at BM 256 (2.2x for Conv2d_4a's 73-wide
//   one at BM 128), instead of 9x.
// - The weights of the block's BN channels (blockIdx.y: its channel tile; 74 KB for tf32's 2b, 111 KB for fp16's 4a
//   at BN 64) stay in shared memory for the whole kernel.
// - Warp-specialized and persistent as the _ws_ tiles: warpgroup 0 copies (the weights first, then each tile's
//   halo into buffer L % 2 of the block's L-th tile), warpgroups 1 and 2 each take every other tile of the block,
//   all BM of its rows, so one multiplies while the other stores. full[b] / empty[b] hand buffer b over (the
//   producers' cp.async arrivals / the 4 warps of its consumer warpgroup).
// Measured (H100, batch 128; docs/PERFORMANCE.md): Conv2d_2a 0.65 -> 0.32 ms and 2b 0.82 -> 0.51 in tf32 (round
// 12); in fp16 Conv2d_4a 0.491 -> 0.408 ms on 128x64, the 35x35 5x5s 0.10 -> 0.074 on 256x32 (session 5, item 4).
// Stride 1, Cin a multiple of 16, no split-K, shared memory within the opt-in limit (cuda.tiles.halo_fits). Launch:
// HALO_THREADS threads, at most one block an SM, grid (blocks, ceil(Cout / BN)), dynamic shared memory
// halo_smem_bytes(sizeof(element), BM, BN, Cin, KH, KW, Wg).
constexpr int HALO_PRODUCERS = 128, HALO_CIN = 32;
[[maybe_unused]] constexpr int HALO_THREADS = HALO_PRODUCERS + 256;  // cuda.tiles.HALO_THREADS
[[maybe_unused]] constexpr int HALO_PRODUCER_REGS = 56, HALO_CONSUMER_REGS = 224;  // 128 x 56 + 256 x 224 = 384 x 168
__host__ __device__ constexpr int halo_rows(int bm, int kh, int kw, int wg) { return bm + (kh - 1) * wg + kw - 1; }
__host__ __device__ constexpr int halo_planes(int cin) { return (cin + HALO_CIN - 1) / HALO_CIN; }
// One plane of a halo buffer: its rows of HALO_CIN elements of `elem` bytes, in whole 1024-byte swizzle patterns so
// that the next plane starts on one too.
__host__ __device__ constexpr int halo_plane_bytes(int elem, int bm, int kh, int kw, int wg) {
    return (halo_rows(bm, kh, kw, wg) * HALO_CIN * elem + 1023) / 1024 * 1024;
}
// The weights, two halo buffers, full[2] and empty[2] (cuda.tiles.halo_smem_bytes).
__host__ __device__ constexpr int halo_smem_bytes(int elem, int bm, int bn, int cin, int kh, int kw, int wg) {
    return halo_planes(cin) * (kh * kw * bn * HALO_CIN * elem + 2 * halo_plane_bytes(elem, bm, kh, kw, wg)) + 4 * 8;
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
    // A row: 128 bytes of tf32 (8 pieces, 128-byte swizzle) or 64 of fp16 (4 pieces, 64-byte swizzle). Piece c of
    // the row at byte offset o of a 1024-byte aligned buffer goes to piece c ^ (o / 128 mod PIECES): the ISA's
    // swizzle of its address. A wgmma takes 32 bytes of each row (k8 of tf32, k16 of fp16).
    constexpr int ROW = HALO_CIN * sizeof(T), PIECES = ROW / 16, STEPS = ROW / 32;
    static_assert(ROW == 128 || ROW == 64, "a halo row is one swizzle row");
    static_assert(BN * ROW % 1024 == 0, "each tap's weights start on a swizzle pattern");
    const auto swizzled = [](int row, int c) { return row * ROW + ((c ^ (row * ROW / 128 & (PIECES - 1))) << 4); };
    const auto descriptor = [](const void* p) {
        return ROW == 128 ? wgmma::desc_k_major_128b(p) : wgmma::desc_k_major_64b(p);
    };
    const int taps = a.kh * a.kw, wg = a.w + 2 * a.pad_w, rows = halo_rows(BM, a.kh, a.kw, wg);
    const int planes = halo_planes(a.cin), plane_bytes = halo_plane_bytes(sizeof(T), BM, a.kh, a.kw, wg);
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
        constexpr int STEP = HALO_PRODUCERS / PIECES;  // rows a pass of the producers covers
        const int piece = tid % PIECES, row0 = tid / PIECES;  // this thread copies piece `piece` of rows row0 + STEP i
        for (int i = tid; i < planes * taps * BN * PIECES; i += HALO_PRODUCERS) {  // (plane, tap, n) weight rows
            const int row = i / PIECES, c = i % PIECES, plane = row / (taps * BN), tap = row / BN - plane * taps;
            const int n = n0 + row % BN, k = plane * HALO_CIN + c * PIECE;
            const bool ok = n < a.cout && k < a.cin;
            cp_async::copy16_or_zero(weights + swizzled(row, c), a.wr + (ok ? n * k_total + tap * a.cin + k : 0), ok);
        }
        int local = 0;
        for (int i = blockIdx.x; i < tiles; i += gridDim.x, ++local) {
            const int buf = local & 1, b = i / tiles_img, q0 = (i - b * tiles_img) * BM;
            if (local >= 2) mbarrier::wait(empty + buf, ((local >> 1) - 1) & 1);
            for (int plane = 0; plane < planes; ++plane) {
                const int k = plane * HALO_CIN + piece * PIECE;  // the piece's first channel
                const bool has = k < a.cin;
                unsigned char* const dst = halo + buf * buffer_bytes + plane * plane_bytes;
                int ph = (q0 + row0) / wg, pw = q0 + row0 - ph * wg;  // the row's padded input position
                const T* const image = a.x + (size_t)b * a.h * a.w * a.x_cstride + (has ? k : 0);
                for (int row = row0; row < rows; row += STEP) {
                    const int ih = ph - a.pad_h, iw = pw - a.pad_w;
                    const bool ok = has && (unsigned)ih < (unsigned)a.h && (unsigned)iw < (unsigned)a.w;
                    cp_async::copy16_or_zero(dst + swizzled(row, piece),
                                             image + (ok ? (ih * a.w + iw) * a.x_cstride : 0), ok);
                    for (pw += STEP; pw >= wg; pw -= wg) ++ph;
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
        float d[MB][BN / 2];
        int accumulate = 0;  // a register, not a constant (wgmma.cuh: C7515)
        mbarrier::wait(full + group, (local >> 1) & 1);
        wgmma::fence_proxy_async();  // the producers' copies, seen through the barrier, before the async proxy's reads
        // Plane by plane, tap by tap: the full planes' STEPS k steps, then a last plane of 16 channels' STEPS / 2,
        // in loops of their own (a branch between the two inside the tap loop made the Cin-32 tiles 30-50 % slower).
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
        const int full_planes = a.cin / HALO_CIN;
        for (int plane = 0; plane < full_planes; ++plane) taps_of_plane(plane, HaloSteps<STEPS>{});
        if (full_planes < planes) taps_of_plane(full_planes, HaloSteps<STEPS / 2>{});
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

// The parts as flat kernel parameters (what the launch format passes), ending in relu_end.
#define NHWC_PARTS_PARAMS                                                                                         \
    int start1, int offset1, int cstride1, int start2, int offset2, int cstride2, int start3, int offset3,        \
        int cstride3, int relu_end
#define NHWC_PARTS_ARGS                                                                                           \
    NhwcParts {                                                                                                   \
        {start1, start2, start3}, {offset1, offset2, offset3}, {cstride1, cstride2, cstride3}, relu_end           \
    }
#define CONV_NHWC_PARAMS(E)                                                                                         \
    const E::T *__restrict__ x, const E::T *__restrict__ wr, const float *__restrict__ bias, void *__restrict__ out, \
        int batch, int cin, int h, int w, int x_cstride, int cout, int ho, int wo, int y_cstride, int kh, int kw,   \
        int stride, int pad_h, int pad_w, int k_split, NHWC_PARTS_PARAMS
#define CONV_NHWC_ARGS(E)                                                                                        \
    NhwcConvArgs<E> {                                                                                            \
        x, wr, bias, out, batch, cin, h, w, x_cstride, cout, ho, wo, y_cstride, kh, kw, stride, pad_h, pad_w,    \
            k_split, NHWC_PARTS_ARGS                                                                             \
    }

// Compile units (cuda_build.UNITS). One compile holds every kernel unless cuda_build asks for one element type
// (-DIE_NHWC_ONLY_F16, _TF32, _F32) and one kind of tile (-DIE_NHWC_ONLY_SYNC: mma.sync tiles and the split-K
// reduction; _WGMMA, _WS, _HALO): a first run then compiles only the units its launches use, in parallel, a few
// seconds instead of the whole file's (docs/PERFORMANCE.md, cold start). A kind left out expands to nothing.
#if !defined(IE_NHWC_ONLY_F16) && !defined(IE_NHWC_ONLY_TF32) && !defined(IE_NHWC_ONLY_F32)
#define IE_NHWC_F16
#define IE_NHWC_TF32
#define IE_NHWC_F32
#endif
#ifdef IE_NHWC_ONLY_F16
#define IE_NHWC_F16
#endif
#ifdef IE_NHWC_ONLY_TF32
#define IE_NHWC_TF32
#endif
#ifdef IE_NHWC_ONLY_F32
#define IE_NHWC_F32
#endif
#if !defined(IE_NHWC_ONLY_SYNC) && !defined(IE_NHWC_ONLY_WGMMA) && !defined(IE_NHWC_ONLY_WS) && \
    !defined(IE_NHWC_ONLY_HALO)
#define IE_NHWC_SYNC
#define IE_NHWC_WGMMA
#define IE_NHWC_WS
#define IE_NHWC_HALO
#endif
#ifdef IE_NHWC_ONLY_SYNC
#define IE_NHWC_SYNC
#endif
#ifdef IE_NHWC_ONLY_WGMMA
#define IE_NHWC_WGMMA
#endif
#ifdef IE_NHWC_ONLY_WS
#define IE_NHWC_WS
#endif
#ifdef IE_NHWC_ONLY_HALO
#define IE_NHWC_HALO
#endif

// One extern "C" entry point per element type and tile: KERNEL runs GEMM (a parenthesized template-id) on its
// arguments, THREADS threads a block, at least MIN_BLOCKS blocks an SM (which caps registers: 2 blocks of 256
// threads leave 128 a thread for the 64x32 warp tile's 64 accumulators).
#define CONV_NHWC_ENTRY(KERNEL, E, THREADS, MIN_BLOCKS, GEMM)                                            \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) KERNEL(CONV_NHWC_PARAMS(E)) { \
        GEMM(CONV_NHWC_ARGS(E));                                                                      \
    }
// Each mma.sync tile also as NAME_maxpool3_BMxBN: the 1x1 conv behind a 3x3 max pool (NhwcMaxPoolLoader).
#ifdef IE_NHWC_SYNC
#define CONV_NHWC_KERNEL(NAME, E, BM, BN, WARPS_M, STAGES, MIN_BLOCKS)                                        \
    CONV_NHWC_ENTRY(NAME##_##BM##x##BN, E, 256, MIN_BLOCKS, (conv_nhwc_gemm<E, BM, BN, WARPS_M, STAGES>)) \
    CONV_NHWC_ENTRY(NAME##_maxpool3_##BM##x##BN, E, 256, MIN_BLOCKS,                                      \
                    (conv_nhwc_gemm<E, BM, BN, WARPS_M, STAGES, NhwcMaxPoolLoader<E, BM, BN, 256, 3>>))
#else
#define CONV_NHWC_KERNEL(NAME, E, BM, BN, WARPS_M, STAGES, MIN_BLOCKS)
#endif

// Warp tiles and shared memory: 128x128 64x32, 48 KB; 128x64 and 64x128 32x32, 48 KB; 64x64 32x16, 32 KB; 128x32
// (the Cout = 32 layers) 32x16, 40 KB. Bytes per stage are the same in both element types.
#define CONV_NHWC_TILES(NAME, E)                   \
    CONV_NHWC_KERNEL(NAME, E, 128, 128, 2, 3, 2)   \
    CONV_NHWC_KERNEL(NAME, E, 128, 64, 4, 4, 2)    \
    CONV_NHWC_KERNEL(NAME, E, 64, 128, 2, 4, 2)    \
    CONV_NHWC_KERNEL(NAME, E, 64, 64, 2, 4, 3)     \
    CONV_NHWC_KERNEL(NAME, E, 128, 32, 4, 4, 3)

#ifdef IE_NHWC_F16
CONV_NHWC_TILES(conv_nhwc, NhwcF16)
#endif
#ifdef IE_NHWC_TF32
CONV_NHWC_TILES(conv_nhwc_tf32, NhwcTf32)
#endif

// The wgmma tiles exist where wgmma does: sm_90a (cuda_build compiles this file for it on compute capability 9.0),
// and the CPU emulator (tests/cuda_emu/wgmma_emu.h).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDACC__)
// Two blocks of 256 threads an SM. Shared memory and accumulators a thread: 128x128 96 KB, 64; 128x64 72 KB,
// 128x32 60 KB (3 blocks fit); 128x192 100 KB, 96 (ptxas: 128 registers, none spilled). The 256-pixel tiles, for
// the narrow layers (Cout 32-96, where a 128-pixel stage is little math for its barrier and loads): 256x64 80 KB,
// 256x32 72 KB. NhwcF32 (three wgmma a k step, low tiles, and its sums in registers twice): 128x64 108 KB, 113
// registers; 128x32 90 KB; 128x128 one block an SM (its 128 sums would spill at 128 registers), 176 KB.
#ifdef IE_NHWC_WGMMA
#define CONV_NHWC_WGMMA_KERNEL_BLOCKS(NAME, E, BM, BN, MIN_BLOCKS) \
    CONV_NHWC_ENTRY(NAME##_wgmma_##BM##x##BN, E, 256, MIN_BLOCKS, (conv_nhwc_wgmma_gemm<E, BM, BN>))
#else
#define CONV_NHWC_WGMMA_KERNEL_BLOCKS(NAME, E, BM, BN, MIN_BLOCKS)
#endif
#define CONV_NHWC_WGMMA_KERNEL(NAME, E, BM, BN) CONV_NHWC_WGMMA_KERNEL_BLOCKS(NAME, E, BM, BN, 2)
// The warp-specialized tiles: WS_THREADS (512) threads, one block an SM (128 registers a thread at launch, then
// setmaxnreg's split; the consumers hold BM / 128 * BN / 2 accumulators; ptxas: no spill. 256x192's 192 spill).
// Their TMA twins NAME_ws_tma_BMxBN take the tensor maps' address last.
#ifdef IE_NHWC_WS
#define CONV_NHWC_WS_KERNEL(NAME, E, BM, BN) \
    CONV_NHWC_ENTRY(NAME##_ws_##BM##x##BN, E, WS_THREADS, 1, (conv_nhwc_ws_gemm<E, BM, BN>))
#define CONV_NHWC_WS_TMA_KERNEL(NAME, E, BM, BN)                                                                  \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1)                                                   \
        NAME##_ws_tma_##BM##x##BN(CONV_NHWC_PARAMS(E), const unsigned char* __restrict__ maps) {                 \
        conv_nhwc_ws_gemm<E, BM, BN, true>(CONV_NHWC_ARGS(E), maps);                                              \
    }
// Their ping-pong versions NAME_ws_tma_pp_BMxBN: WS_PP_THREADS (384), 168 registers a thread at launch.
#define CONV_NHWC_WS_PP_KERNEL(NAME, E, BM, BN)                                                                   \
    extern "C" __global__ void __launch_bounds__(WS_PP_THREADS, 1)                                                \
        NAME##_ws_tma_pp_##BM##x##BN(CONV_NHWC_PARAMS(E), const unsigned char* __restrict__ maps) {              \
        conv_nhwc_ws_gemm<E, BM, BN, true, true>(CONV_NHWC_ARGS(E), maps);                                        \
    }
#else
#define CONV_NHWC_WS_KERNEL(NAME, E, BM, BN)
#define CONV_NHWC_WS_TMA_KERNEL(NAME, E, BM, BN)
#define CONV_NHWC_WS_PP_KERNEL(NAME, E, BM, BN)
#endif
// The halo tiles: HALO_THREADS (384) threads, one block an SM (168 registers a thread at launch, then setmaxnreg's
// split: the consumers hold BM / 64 x BN / 2 accumulators).
#ifdef IE_NHWC_HALO
#define CONV_NHWC_HALO_KERNEL(NAME, E, BM, BN) \
    CONV_NHWC_ENTRY(NAME##_halo_##BM##x##BN, E, HALO_THREADS, 1, (conv_nhwc_halo_gemm<E, BM, BN>))
#else
#define CONV_NHWC_HALO_KERNEL(NAME, E, BM, BN)
#endif

// fp16's and tf32's sm_90a tiles, in cuda/tiles.py's order (NHWC_WGMMA_TILES): wgmma, warp-specialized (cp.async,
// then TMA, then TMA ping-pong), halo.
#define CONV_NHWC_SM90_TILES(NAME, E)           \
    CONV_NHWC_WGMMA_KERNEL(NAME, E, 128, 192)   \
    CONV_NHWC_WGMMA_KERNEL(NAME, E, 128, 128)   \
    CONV_NHWC_WGMMA_KERNEL(NAME, E, 128, 64)    \
    CONV_NHWC_WGMMA_KERNEL(NAME, E, 128, 32)    \
    CONV_NHWC_WGMMA_KERNEL(NAME, E, 256, 64)    \
    CONV_NHWC_WGMMA_KERNEL(NAME, E, 256, 32)    \
    CONV_NHWC_WS_KERNEL(NAME, E, 128, 192)      \
    CONV_NHWC_WS_KERNEL(NAME, E, 128, 128)      \
    CONV_NHWC_WS_KERNEL(NAME, E, 128, 64)       \
    CONV_NHWC_WS_KERNEL(NAME, E, 256, 128)      \
    CONV_NHWC_WS_TMA_KERNEL(NAME, E, 128, 192)  \
    CONV_NHWC_WS_TMA_KERNEL(NAME, E, 256, 128)  \
    CONV_NHWC_WS_PP_KERNEL(NAME, E, 128, 192)   \
    CONV_NHWC_WS_PP_KERNEL(NAME, E, 128, 128)   \
    CONV_NHWC_HALO_KERNEL(NAME, E, 256, 64)     \
    CONV_NHWC_HALO_KERNEL(NAME, E, 256, 32)     \
    CONV_NHWC_HALO_KERNEL(NAME, E, 128, 96)     \
    CONV_NHWC_HALO_KERNEL(NAME, E, 128, 64)     \
    CONV_NHWC_HALO_KERNEL(NAME, E, 128, 32)

#ifdef IE_NHWC_F16
CONV_NHWC_SM90_TILES(conv_nhwc, NhwcF16)
#endif
#ifdef IE_NHWC_TF32
CONV_NHWC_SM90_TILES(conv_nhwc_tf32, NhwcTf32)
#endif
#ifdef IE_NHWC_F32
CONV_NHWC_WGMMA_KERNEL_BLOCKS(conv_nhwc_f32, NhwcF32, 128, 128, 1)
CONV_NHWC_WGMMA_KERNEL(conv_nhwc_f32, NhwcF32, 128, 64)
CONV_NHWC_WGMMA_KERNEL(conv_nhwc_f32, NhwcF32, 128, 32)
#endif
#endif

// y[p, m] (a view of the element type E, or its parts) = relu(bias[m] + sum over z of ws[z][p][m]), two channels per
// thread.
template <class E>
__device__ __forceinline__ void conv_nhwc_splitk_sum(const float* __restrict__ ws, const float* __restrict__ bias,
                                                     typename E::T* __restrict__ y, int splits, int p_total, int cout,
                                                     int y_cstride, const NhwcParts& parts) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x, pairs = cout / 2;
    if (idx >= p_total * pairs) return;
    const int p = idx / pairs, m = 2 * (idx - p * pairs);
    float v0 = 0.f, v1 = 0.f;
    for (int z = 0; z < splits; ++z) {
        const float2 s = __ldg(reinterpret_cast<const float2*>(ws + ((size_t)z * p_total + p) * cout + m));
        v0 += s.x;
        v1 += s.y;
    }
    v0 += __ldg(bias + m);
    v1 += __ldg(bias + m + 1);
    if (m < parts.relu_end) {
        v0 = fmaxf(v0, 0.f);
        v1 = fmaxf(v1, 0.f);
    }
    const NhwcParts::Column col = parts.column(y_cstride, m);
    E::store2(y + (col.base + p * col.cstride), v0, v1);
}

#define CONV_NHWC_SPLITK_REDUCE(NAME, E)                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        NAME(const float* __restrict__ ws, const float* __restrict__ bias, E::T* __restrict__ y, int splits,      \
             int p_total, int cout, int y_cstride, NHWC_PARTS_PARAMS) {                                           \
        conv_nhwc_splitk_sum<E>(ws, bias, y, splits, p_total, cout, y_cstride, NHWC_PARTS_ARGS);                  \
    }

#ifdef IE_NHWC_SYNC
#ifdef IE_NHWC_F16
CONV_NHWC_SPLITK_REDUCE(conv_nhwc_splitk_reduce, NhwcF16)
#endif
#ifdef IE_NHWC_TF32
CONV_NHWC_SPLITK_REDUCE(conv_nhwc_tf32_splitk_reduce, NhwcTf32)
#endif
#ifdef IE_NHWC_F32
CONV_NHWC_SPLITK_REDUCE(conv_nhwc_f32_splitk_reduce, NhwcF32)
#endif
#endif
