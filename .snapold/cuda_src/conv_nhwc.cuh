// conv_nhwc.cuh: what the NHWC conv kernels share. They compute 2-D convolution + bias + ReLU on NHWC activations, an
// implicit GEMM on the tensor cores whose operands both travel global -> shared memory by cp.async alone (CudaBackend's
// NHWC layout: `--precision fp16`, fp16 activations, `--precision tf32`, TF32 values in float32 words, and `--precision
// fp32` on sm_90a, float32 words whose products are three fp16 ones, and `--precision int8` on sm_90a, int8 values
// with exact int32 sums; conv_mma.cuh's NhwcF16, NhwcTf32, NhwcF32 and NhwcI8).
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
// int8 (NhwcI8, the wgmma tiles only): x, the weight rows and y are int8 (Cin, x_cstride and the view's first channel
// multiples of 16; Cout, y_cstride and the parts' starts and offsets multiples of 4); `bias` is float32[3 Cout]:
// bias[m], scale[m] = s_x s_w[m] at Cout + m, inv_out[m] = 1 / (the storage scale of channel m's part) at
// 2 Cout + m; y = clamp(rint(relu(float(acc) * scale + bias) * inv_out), -127, 127), each operation rounded on its
// own as int8_reference computes it (NhwcStore::column4), four channels a 4-byte store; a moved pool's raw products
// (past relu_end) are the int32 sums themselves, 4 bytes a channel (offsets, cstride in bytes, multiples of 16).
// Split-K: int32 raw sums in the workspace, summed exactly by conv_nhwc_i8_splitk_reduce, which applies the same
// epilogue.
// Parts: the 1x1 convs of a module that read the same input run as one GEMM of their stacked weights
// (plan.fuse_pointwise), whose output channels go to up to four views of the same arena: part 0 from channel 0 at
// y (y_cstride), part i = 1..3 from channel start_i at y + offset_i (elements, maybe negative), pixel stride
// cstride_i. A plain conv has one part (every start_i = Cout). The raw products of a member whose average pool was
// moved behind it come last, past relu_end, with zero bias (the pool adds bias and ReLU: pool_nhwc.cu).
// Split-K: blockIdx.z selects K slice [z*k_split, (z+1)*k_split) (a multiple of the stage's k); with several slices
// the raw fp32 sums (int8: int32) go to the workspace ws[z][P][M] (`out` is then ws) and
// conv_nhwc[_tf32|_f32|_i8]_splitk_reduce sums them in slice order, adds bias, applies ReLU and writes y.
// Block order: tile_n0 / tile_m0 (common.cuh) on grid (pixel tiles, channel tiles): consecutive blocks take the
// channel tiles of one pixel tile, which then share its input through L2.
// Max pool in front (conv_nhwc[_tf32]_maxpool3_<BM>x<BN>, conv_nhwc_i8_wgmma_maxpool3_<BM>x<BN>, plan.fuse_max_pools):
// a 1x1 conv whose input is a 3x3 max pool of x (stride `stride`, no padding) takes the window maxima as it loads A
// (NhwcMaxPoolLoader), so the pool's output never goes through memory: MaxPool_3a and Conv2d_3b become one pass over
// the pool's input.
//
//
// The kernels, one file per family of tiles, each compiled once per element type (cuda_build.UNITS):
// conv_nhwc_mma.cu (mma.sync tiles, their _maxpool3_ twins, the split-K reduction), conv_nhwc_wgmma.cu (wgmma tiles,
// sm_90a), conv_nhwc_ws.cu (warp-specialized persistent wgmma tiles, their TMA and ping-pong twins, sm_90a),
// conv_nhwc_halo.cu (halo tiles, sm_90a). Here: the element types a compile holds, the parts, the arguments, the
// cp.async loader, the epilogue, the sm_90a tiles' shared ring and the entry-point macros.
#pragma once
#include <type_traits>

#include "conv_mma.cuh"

// The element types a compile instantiates its tiles for: one where cuda_build asks for it (-DIE_NHWC_FP16,
// -DIE_NHWC_TF32, -DIE_NHWC_FP32 or -DIE_NHWC_INT8), so that a run compiles only the units its launches use; all of
// them otherwise (the CPU emulator includes every file once).
#if !defined(IE_NHWC_FP16) && !defined(IE_NHWC_TF32) && !defined(IE_NHWC_FP32) && !defined(IE_NHWC_INT8)
#define IE_NHWC_FP16
#define IE_NHWC_TF32
#define IE_NHWC_FP32
#define IE_NHWC_INT8
#endif

template <int PIECE>
__device__ __forceinline__ int swizzled(int row, int piece) { return (piece ^ (row >> 1 & 3)) * PIECE; }
// A 16-byte float32 piece (k 4 piece .. 4 piece + 3 of a 16-k row) as four fp16 values in a row of 32 bytes of the
// 32-byte swizzle (wgmma.cuh's desc_k_major_32b): where they start, in fp16 elements from the row's start.
__device__ __forceinline__ int swizzled32(int row, int piece) {
    return ((piece >> 1 ^ (row >> 2 & 1)) << 3) + ((piece & 1) << 2);
}

// A SPLIT element type's set of fp16 halves of one stage (NhwcLoader::split writes it, conv_nhwc_wgmma.cu's wgmma
// read it): four tiles of 32-byte rows (ROW fp16 values, one k16), A_hi (BM rows), A_lo, B_hi (BN rows), B_lo, at
// these offsets in fp16 elements; SIZE of them, as many bytes as a float32 stage of BM + BN rows.
template <int BM, int BN>
struct HalvesSet {
    static constexpr int ROW = 16;
    static constexpr int A_HI = 0, A_LO = BM * ROW, B_HI = 2 * BM * ROW, B_LO = B_HI + BN * ROW, SIZE = B_LO + BN * ROW;
};

// Where the output channels go (the header's parts): part i >= 1 takes channels from start[i - 1] on.
struct NhwcParts {
    int start[3], offset[3], cstride[3], relu_end;

    // Channel m of output pixel p is at element base + p cstride from y; it is channel ch of its part. 32-bit: every
    // part lies in the arena, which has fewer than 2^31 elements (CudaBackend checks). An int8 raw product's int32
    // value is at byte offset + 4 ch = base + 3 ch instead (NhwcStore::column4).
    struct Column {
        int base, cstride, ch;
    };
    __device__ __forceinline__ Column column(int y_cstride, int m) const {
        Column col{m, y_cstride, m};
#pragma unroll
        for (int i = 0; i < 3; ++i)
            if (m >= start[i]) col = Column{offset[i] + (m - start[i]), cstride[i], m - start[i]};
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
// Per stage it is meant to cost few instructions: address arithmetic in the stage loop keeps the tensor cores idle
// (at 128x192's register cap ptxas still reloads some of this state every stage). Everything that does not change between stages is computed once: the
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
    int half_at;  // its first piece's fp16 halves in a tile of split()'s set: row row0, swizzled32 (A's and B's alike)
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
        half_at = row0 * BK + swizzled32(row0, piece);
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

    // SPLIT element types: this thread's pieces of the tile in `stage` go, as fp16 high and low halves, to the same
    // rows of a set of four tiles of 32-byte rows at `set`: A's high halves (BM rows), A's low ones, B's high ones (BN
    // rows), B's low ones. Each piece is handled by the thread that copied it, once its own copies have landed
    // (cp_async_ring's landed), so no other thread has to wait: A's pieces are split (E::split), B's came split
    // (conv_nhwc_f32_split_weights, once after the upload) and are only moved (E::copy_halves).
    __device__ __forceinline__ void split(int stage, unsigned short* set) const {
        using S = HalvesSet<BM, BN>;
        static_assert(BK == S::ROW, "a stage's k is one row of halves");
        const T* const ad = a_dst + stage * (BM * BK);
#pragma unroll
        for (int i = 0; i < A_ROWS; ++i) {
            unsigned short* const at = set + half_at + i * ROWS * S::ROW;
            E::split(ad + i * ROWS * BK, at + S::A_HI, at + S::A_LO);
        }
        if (b_rows) {
            const T* const bd = b_dst + stage * (BN * BK);
#pragma unroll
            for (int i = 0; i < B_ROWS; ++i) {
                unsigned short* const at = set + half_at + i * ROWS * S::ROW;
                E::copy_halves(bd + i * ROWS * BK, at + S::B_HI, at + S::B_LO);
            }
        }
    }
};

// The loader of a 1x1 conv that reads a max pool's output without it being stored (plan.fuse_max_pools): x is the
// pool's input, stride the pool's (pad 0: its windows lie inside the image, as torchvision's stem pools do), and
// A[p][k] = max over the POOL x POOL window of output pixel p, channel k. The A pieces travel through registers:
// the thread's POOL^2 pieces of every row are loaded as raw words first, without a branch (a row past P or a piece
// past K loads pixel 0's and is zeroed after), so that all of them are in flight together, as a cp.async stage's
// would be; then their maxima are stored where a cp.async would have put the piece, and the ring's barrier makes
// them visible as it does the copies (on the wgmma tiles, cp_async_ring's ASYNC proxy fence covers these stores too).
// The weights still go by cp.async. A 1x1 conv has one tap, so the base's tap offset is the channel offset. fp16 and
// tf32 on the mma.sync tiles (conv_nhwc_mma.cu), int8 on the wgmma ones (conv_nhwc_wgmma.cu).
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
            if constexpr (E::INT) {  // int8: the bytes' maxima, four a word (__vmaxs4), stored as they are
                uint4 m = q[i][0];
#pragma unroll
                for (int t = 1; t < POOL * POOL; ++t) {
                    m.x = __vmaxs4(m.x, q[i][t].x), m.y = __vmaxs4(m.y, q[i][t].y);
                    m.z = __vmaxs4(m.z, q[i][t].z), m.w = __vmaxs4(m.w, q[i][t].w);
                }
                *reinterpret_cast<uint4*>(ad + i * ROWS * BK) = ok[i] ? m : uint4{0, 0, 0, 0};
            } else {
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
        }
        this->copy_b(stage, k_ok);
        this->advance();
    }
};

// The epilogue of a thread's accumulators, one column at a time: pairs of output channels m, m + 1 (cout is even:
// m + 1 < cout when m < cout) of the thread's pixels. Raw to the split-K workspace when the grid has several slices,
// else bias, ReLU, the element type, into the column's part. What depends on the channels alone (part, bias, ReLU)
// is looked up once per column rather than once per pair (per pair, the lookups would be thousands of instructions a
// warp per 128x192 block).
template <class E>
struct NhwcStore {
    const NhwcConvArgs<E>& a;
    int p_total;
    int z, splits;  // the block's K slice (blockIdx.z) of how many (gridDim.z)

    // pairs(put) calls put(p, v0, v1) for each of the thread's pixels p in this column.
    // int8: only the split-K path (its unsplit sums go through column4), whose raw sums stay int32 (exact).
    template <class Pairs>
    __device__ __forceinline__ void column(int m, Pairs&& pairs) const {
        if (m >= a.cout) return;
        if (splits > 1) {
            using Acc = typename E::Acc;
            using Acc2 = std::conditional_t<E::INT, int2, float2>;
            Acc* ws = static_cast<Acc*>(a.out) + (size_t)z * p_total * a.cout + m;
            pairs([&](int p, Acc v0, Acc v1) {
                if (p < p_total) *reinterpret_cast<Acc2*>(ws + (size_t)p * a.cout) = Acc2{v0, v1};
            });
            return;
        }
        if constexpr (!E::INT) {
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
    }

    // fp16 and int8: channels m .. m + 3 of the thread's pixels, quads(put) calling put(p, v[4]), one 8-byte (fp16) or
    // 4-byte (int8) store each. Pairs would be 4-byte stores, 16 bytes of a pixel per warp instruction: half a 32-byte
    // sector, so a third of the sectors written would be in excess. All four channels are below Cout and in one part,
    // as every count and start is a multiple of 4 here (the header).
    // int8 (E::INT): bias holds bias[m], then scale[m] = s_x s_w[m] at cout + m and inv_out[m] (1 / the storage scale
    // of channel m's output) at 2 cout + m, all float32, and each sum becomes
    // quantize(relu(float(acc) * scale[m] + bias[m]), inv_out[m]), every operation rounded on its own (no fused
    // multiply-add), as int8_reference.conv_epilogue and quantize compute it. Channels from relu_end on are a moved
    // pool's raw products (plan.fuse_pointwise): in int8 the exact int32 sums, 16 bytes a pixel's four channels, at
    // byte offset + 4 ch of their part (whose cstride counts bytes), for pool_nhwc.cu's avg_pool_products_nhwc_i8.
    template <class Quads>
    __device__ __forceinline__ void column4(int m, Quads&& quads) const {
        using Acc = typename E::Acc;
        if (m >= a.cout) return;
        const NhwcParts::Column col = a.parts.column(a.y_cstride, m);
        if constexpr (E::INT) {
            if (m >= a.parts.relu_end) {
                signed char* const raw = static_cast<signed char*>(a.out) + (col.base + 3 * col.ch);
                quads([&](int p, const Acc (&q)[4]) {
                    if (p < p_total) *reinterpret_cast<int4*>(raw + p * col.cstride) = int4{q[0], q[1], q[2], q[3]};
                });
                return;
            }
        }
        float bias[4], scale[4], inv_out[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            bias[e] = __ldg(a.bias + m + e);
            if constexpr (E::INT) {
                scale[e] = __ldg(a.bias + a.cout + m + e);
                inv_out[e] = __ldg(a.bias + 2 * a.cout + m + e);
            }
        }
        const bool relu = m < a.parts.relu_end;
        typename E::T* const y = static_cast<typename E::T*>(a.out) + col.base;
        quads([&](int p, const Acc (&q)[4]) {
            if (p >= p_total) return;
            if constexpr (E::INT) {
                const float lo = relu ? 0.f : -static_cast<float>(i8q::QMAX);
                unsigned b[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float f = __fadd_rn(__fmul_rn(__int2float_rn(q[e]), scale[e]), bias[e]);
                    b[e] = i8q::quantized_bits(f, inv_out[e], lo);
                }
                *reinterpret_cast<unsigned*>(y + p * col.cstride) = i8q::pack_low_bytes(b[0], b[1], b[2], b[3]);
            } else {
                float v[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) v[e] = relu ? fmaxf(q[e] + bias[e], 0.f) : q[e] + bias[e];
                E::store4(y + p * col.cstride, v);
            }
        });
    }

    // A wgmma warpgroup's BN-channel tile from channel m0: sum(mb, i) is its accumulator i of 64-row block mb, which
    // holds tile row 64 mb + 16 warp + g + 8 half, channels 8j + 2t + e for i = 4j + 2 half + e (wgmma.cuh's D
    // layout); pixel(mb, half) is the output pixel of this thread's row (p_total or more: none). fp16 and int8 without
    // split-K:
    // lanes t and t ^ 1 swap pairs so that each holds 4 adjacent channels of a pixel (even t: block j's 2t .. 2t + 3,
    // odd t: block j + 1's 2t - 2 .. 2t + 1), and the 4 lanes of a pixel store blocks j and j + 1 as 32 bytes.
    template <int MB, int BN, class Pixel, class Sum>
    __device__ __forceinline__ void wgmma_pixels(int m0, Pixel&& pixel, Sum&& sum) const {
        const int t = threadIdx.x % 4;
        using Acc = typename E::Acc;
        if constexpr (sizeof(typename E::T) <= 2) {
            static_assert(BN % 16 == 0, "fp16 and int8 store blocks of 8 channels in pairs");
            if (splits == 1) {
                const bool odd = t & 1;
#pragma unroll
                for (int j = 0; j < BN / 8; j += 2) {
                    Acc q[MB][2][4];
#pragma unroll
                    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                        for (int half = 0; half < 2; ++half) {
                            const int i = 4 * j + 2 * half;  // block j's pair; i + 4, block j + 1's
                            const Acc a0 = sum(mb, i), a1 = sum(mb, i + 1), b0 = sum(mb, i + 4), b1 = sum(mb, i + 5);
                            const Acc r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
                            const Acc r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
                            Acc(&v)[4] = q[mb][half];
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

// The dynamic shared memory of the sm_90a tiles (wgmma, warp-specialized and halo), laid out by each kernel.
#ifdef __CUDACC__
extern __shared__ __align__(1024) unsigned char wgmma_ring[];
#else
// The emulator runs one block at a time; the ring is as large as an SM's shared memory for a block (227 KB): the
// warp-specialized tiles take ~200 KB, the halo tiles up to all of it (conv_nhwc_halo.cu).
alignas(1024) static unsigned char wgmma_ring[227 * 1024];
#endif

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

// One extern "C" entry point per element type and tile: KERNEL runs GEMM (a parenthesized template-id) on its
// arguments, THREADS threads a block, at least MIN_BLOCKS blocks an SM (which caps registers: 2 blocks of 256
// threads leave 128 a thread for the 64x32 warp tile's 64 accumulators).
#define CONV_NHWC_ENTRY(KERNEL, E, THREADS, MIN_BLOCKS, GEMM)                                            \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) KERNEL(CONV_NHWC_PARAMS(E)) { \
        GEMM(CONV_NHWC_ARGS(E));                                                                      \
    }
