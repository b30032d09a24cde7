// conv_input_nhwc.cu: the network's first convolution on the NHWC path (CudaBackend's NHWC layout), read straight
// from the float32 NCHW input as uploaded:
//
// y[b, oh, ow, m] = relu(bias[m] + sum_{c, r, s} wt[(c*KH + r)*KW + s][m] * x[b, c, oh*S - PH + r, ow*S - PW + s])
//
// with y a channel slice of an NHWC buffer (conv_nhwc.cuh's views: pixel i starts i * y_cstride elements after y) of
// fp16 (conv_input_nhwc), TF32-rounded float32 (conv_input_nhwc_tf32) or float32 (conv_input_nhwc_f32;
// conv_mma.cuh's NhwcF16, NhwcTf32, NhwcF32), wt
// float32 [K][Cout] (K = Cin*KH*KW in (c, r, s) order, cuda.params.direct_weights), sums in fp32.
// conv_input_nhwc_i8 (`--precision int8`): the same fp32 sums, bias and ReLU, then quantized to int8 at the output's
// storage scale (i8_piece.cuh's i8q::quantize: clamp(rint(v * inv_out), -127, 127), inv_out = float32(1) /
// float32(scale), the argument after relu), as backends/int8_reference.py quantizes this float layer's output. The
// kernel's sums run in (c, r, s) order, one fmaf each, so its int8 output can differ from a float32 reference summed
// in another order by one level where a value lies within float rounding of a rounding boundary.
//
// Idea: the input has 3 channels. conv_nhwc.cuh reads whole 16-byte pieces of 8 channels, so it would need the input
// converted to an fp16 NHWC copy padded to 8 channels: K = 72 instead of 27, and a copy written and read back
// (183 MB each way at batch 128) for a layer of only 4.9 GFLOP. Here one thread computes the 32 channels of one output pixel on the FMA units:
// - its K inputs come straight from x; the windows of neighbouring threads overlap, and L1 serves the re-reads;
// - the weights of the block's 32 channels sit in shared memory, and every lane reads the same word (a broadcast);
// - the 32 sums leave as four (fp16) or eight (tf32) 16-byte stores. In tf32, where the block's 256 pixels x 32
//   channels are one contiguous run of y (y_cstride = Cout = 32, the network's case), they go through shared memory
//   first, so that a warp stores 512 consecutive bytes instead of 16 bytes in each of 32 lines. fp16's 64 bytes a
//   pixel are stored directly: staged, they are slower.
// Bytes: the input once, the output once (~320 MB at batch 128, ~0.1 ms); 2.4 G multiply-adds (~0.08 ms at the FMA
// peak). The fp16 rounding of the input is gone too: fp32 inputs, weights and sums, one rounding at the store.
//
// Launch: conv_input_nhwc[_tf32|_f32|_i8]: block 256, grid (ceil(batch*Ho*Wo / 256), ceil(Cout / CONV_INPUT_COUT)).
// Needs Cin*KH*KW <= CONV_INPUT_MAX_K; Cout, y_cstride and y's first channel multiples of 8 (16 for int8).
//
// conv_input_mma_nhwc[_tf32] (fp16 and tf32): the same conv on the tensor cores. The FMA kernel above spends 864
// multiply-adds and 216 shared-memory broadcasts a pixel, several times the FMA units' floor and the layer's bytes'
// time. K = Cin*KH*KW = 27, padded
// with zeros to 32, is two m16n8k16 steps (fp16) or four m16n8k8 (tf32) for 16 pixels x 8 channels, so here the
// multiplies nearly vanish and the layer is left with its bytes. A block of 4 warps computes output rows (b, oh):
// - the KH input rows its windows cover, every channel, are copied once to shared memory as float32 (coalesced
//   reads of whole rows, zeros for the padding), followed by one row of zeros that the padded k (>= K) read;
// - each warp takes 16-pixel m tiles of the row. A lane's A fragments are, for every tile, the same 8 k at a pixel
//   offset, so their offsets into the copy are computed once; the values are rounded to fp16 or TF32 as they go
//   into the fragment (operands of the element type, as in conv_nhwc_*.cu; the FMA kernel kept fp32 operands). The
//   B fragments (32 k x 32 channels) stay in registers for the whole block;
// - sums + bias, ReLU, rounded to the element type, go to shared memory in rows of 32 channels + 8 elements (the
//   padding puts a warp's pair stores and a phase's 16-byte reads on distinct banks), then leave as 16-byte pieces,
//   consecutive threads on consecutive pieces: one run of 64 (fp16) or 128 (tf32) bytes a pixel;
// - at large batch a block takes several rows (up to 8): the per-block set-up (divisions by run-time shapes) is
//   most of a block's instructions, and with one row a block the kernel is issue-bound;
// - where no window reaches past a row's ends (Conv2d_1a), the rows travel as 16-byte chunks (the aligned copy
//   below), as a 4-byte cp.async a float costs ~12 instructions each, and the kernel keeps its offsets in shared
//   memory, not registers, to run 6 (fp16) / 5 (tf32) blocks an SM: then it moves the layer's bytes at ~2.3 TB/s.
// conv_input_mma_nhwc_i8 (`--precision int8`): fp16's kernel (operands rounded to fp16, fp32 sums), its output
// quantized as conv_input_nhwc_i8's; the fp16 operands move a few more outputs than the FMA kernel's sum order does
// across a rounding boundary (one level; tests/kernels/test_int8_nhwc.py measures how many).
// Launch: conv_input_mma_nhwc[_tf32|_i8]: block 128, grid (blocks, ceil(Cout / CONV_INPUT_COUT)), a block taking output
// rows blockIdx.x, + blocks, ... of the batch*Ho (cuda.tiles.input_mma_blocks), dynamic shared memory
// conv_input_mma_smem_bytes(). Needs Cin*KH*KW <= CONV_INPUT_MMA_K and that memory <= 48 KB (cuda.tiles.input_tile
// falls back to the FMA kernel otherwise); Cout, y_cstride and y's first channel multiples of 8 (16 for int8).
#include "conv_mma.cuh"
#include "i8_piece.cuh"

#define CONV_INPUT_COUT 32    // output channels per thread (and per block)
#define CONV_INPUT_MAX_K 256  // shared memory for 256 x 32 weights, 32 KB

// The launch's arguments (cuda.kernels.ARG_FORMATS), y of element type T: the parameters of both versions below.
#define CONV_INPUT_PARAMS(T)                                                                                        \
    const float *__restrict__ x, const float *__restrict__ wt, const float *__restrict__ bias, T *__restrict__ y,  \
        int batch, int cin, int h, int w, int cout, int ho, int wo, int y_cstride, int kh, int kw, int stride,      \
        int pad_h, int pad_w, int relu
// An entry point of the tensor-core version for a float element type: BODY<E> on the launch's arguments.
#define CONV_INPUT_KERNEL(NAME, BODY, E, THREADS, MIN_BLOCKS)                                                   \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) NAME(CONV_INPUT_PARAMS(E::T)) {           \
        BODY<E>(x, wt, bias, y, batch, cin, h, w, cout, ho, wo, y_cstride, kh, kw, stride, pad_h, pad_w, relu, \
                MmaElemOut<E>{});                                                                               \
    }

// The FMA kernel's output, a piece of PIECE channels of element type T from their float32 values: a float element
// type rounds them as its store does (ElemOut), int8 quantizes them at inv_out (I8Out).
template <class E>
struct ElemOut {
    using T = typename E::T;
    static constexpr int PIECE = E::PIECE;
    __device__ __forceinline__ void store(T* p, const float (&v)[PIECE]) const { E::store(p, v); }
};
struct I8Out {
    using T = I8Piece::T;
    static constexpr int PIECE = I8Piece::PIECE;
    float inv_out;
    __device__ __forceinline__ void store(T* p, const float (&v)[PIECE]) const {
        int q[PIECE];
#pragma unroll
        for (int e = 0; e < PIECE; ++e) q[e] = i8q::quantize(v[e], inv_out);
        I8Piece::store(p, q);
    }
};

template <class O>
__device__ __forceinline__ void conv_input_pixel(CONV_INPUT_PARAMS(typename O::T), const O out) {
    constexpr int CO = CONV_INPUT_COUT, PIECE = O::PIECE;
    __shared__ __align__(16) float ws[CONV_INPUT_MAX_K][CO];
    const int k_total = cin * kh * kw, m0 = blockIdx.y * CO;
    for (int i = threadIdx.x; i < k_total * CO; i += blockDim.x) {  // consecutive threads, consecutive channels
        const int k = i / CO, j = i % CO;
        ws[k][j] = m0 + j < cout ? __ldg(wt + (size_t)k * cout + m0 + j) : 0.f;
    }
    __syncthreads();

    const int howo = ho * wo, p_total = batch * howo, p0 = blockIdx.x * blockDim.x, p = p0 + threadIdx.x;
    // The block's output is one run of 128-byte pixels: stage it (the header).
    const bool dense = sizeof(typename O::T) == 4 && y_cstride == CO && cout == CO;
    if (p >= p_total && !dense) return;
    const int b = p / howo, q = p - b * howo, oh = q / wo, ow = q - oh * wo;
    const int ih0 = oh * stride - pad_h, iw0 = ow * stride - pad_w;
    float acc[CO];
#pragma unroll
    for (int j = 0; j < CO; ++j) acc[j] = 0.f;
    const float* wk = &ws[0][0];
    for (int c = 0; c < (p < p_total ? cin : 0); ++c) {
        const float* xc = x + ((size_t)b * cin + c) * h * w;
        for (int r = 0; r < kh; ++r) {
            const int ih = ih0 + r;
            const bool row_ok = (unsigned)ih < (unsigned)h;
            for (int s = 0; s < kw; ++s, wk += CO) {
                const int iw = iw0 + s;
                const float v = row_ok && (unsigned)iw < (unsigned)w ? __ldg(xc + (size_t)ih * w + iw) : 0.f;
#pragma unroll
                for (int j = 0; j < CO; ++j) acc[j] = fmaf(v, wk[j], acc[j]);
            }
        }
    }

    if (dense) {
        // Float4 f of pixel i at row i, slot f ^ (i % 8): the 8 lanes of a phase hit 8 distinct 16-byte bank groups
        // both ways.
        float4* tile = reinterpret_cast<float4*>(&ws[0][0]);  // 256 pixels x 8 float4, the weights' space
        static_assert(CONV_INPUT_MAX_K * CO >= 256 * CO, "the weights' shared memory holds the block's output");
        __syncthreads();  // every thread is done with the weights
        const int i = threadIdx.x;
#pragma unroll
        for (int f = 0; f < CO / 4; ++f) {
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                v[e] = acc[4 * f + e] + __ldg(bias + 4 * f + e);
                if (relu) v[e] = fmaxf(v[e], 0.f);
            }
            tile[i * (CO / 4) + (f ^ (i % 8))] = float4{v[0], v[1], v[2], v[3]};
        }
        __syncthreads();
        constexpr int PIECES = CO / PIECE;  // of the element type, per pixel
        const int pieces = min((int)blockDim.x, p_total - p0) * PIECES;
        for (int n = threadIdx.x; n < pieces; n += blockDim.x) {
            const int px = n / PIECES, g = n % PIECES;
            float v[PIECE];
#pragma unroll
            for (int f = 0; f < PIECE / 4; ++f) {
                const float4 t = tile[px * (CO / 4) + ((g * PIECE / 4 + f) ^ (px % 8))];
                v[4 * f] = t.x;
                v[4 * f + 1] = t.y;
                v[4 * f + 2] = t.z;
                v[4 * f + 3] = t.w;
            }
            out.store(y + (size_t)(p0 + px) * CO + PIECE * g, v);
        }
        return;
    }
    typename O::T* yp = y + (size_t)p * y_cstride + m0;
#pragma unroll
    for (int g = 0; g < CO / PIECE; ++g) {
        if (m0 + PIECE * g >= cout) break;  // cout is a multiple of PIECE: a piece is wholly inside or outside
        float v[PIECE];
#pragma unroll
        for (int e = 0; e < PIECE; ++e) {
            v[e] = acc[PIECE * g + e] + __ldg(bias + m0 + PIECE * g + e);
            if (relu) v[e] = fmaxf(v[e], 0.f);
        }
        out.store(yp + PIECE * g, v);
    }
}

// The FMA kernel for a float element type E.
#define CONV_INPUT_FMA_KERNEL(NAME, E)                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 1) NAME(CONV_INPUT_PARAMS(E::T)) {                        \
        conv_input_pixel(x, wt, bias, y, batch, cin, h, w, cout, ho, wo, y_cstride, kh, kw, stride, pad_h, pad_w, \
                         relu, ElemOut<E>{});                                                                   \
    }
CONV_INPUT_FMA_KERNEL(conv_input_nhwc, NhwcF16)
CONV_INPUT_FMA_KERNEL(conv_input_nhwc_tf32, NhwcTf32)
CONV_INPUT_FMA_KERNEL(conv_input_nhwc_f32, NhwcF32)
extern "C" __global__ void __launch_bounds__(256, 1)
    conv_input_nhwc_i8(CONV_INPUT_PARAMS(I8Piece::T), float inv_out) {
    conv_input_pixel(x, wt, bias, y, batch, cin, h, w, cout, ho, wo, y_cstride, kh, kw, stride, pad_h, pad_w, relu,
                     I8Out{inv_out});
}


// --- the tensor-core version ---------------------------------------------------------------------------------------

constexpr int CONV_INPUT_MMA_K = 32;                    // K padded to this
constexpr int CONV_INPUT_MMA_THREADS = 128;             // 4 warps
constexpr int CONV_INPUT_MMA_ROW = CONV_INPUT_COUT + 8;  // a staged output pixel, elements (the header's padding)

// The input copy's row width: the row with its padding, and at least what the last m tile's windows reach, rounded
// up to whole 16-byte chunks, plus one chunk: the aligned copy (below) starts a row up to 3 floats late.
__host__ __device__ constexpr int conv_input_mma_width(int w, int pad_w, int wo, int kw, int stride) {
    return ((w + 2 * pad_w > ((wo + 15) / 16 * 16 - 1) * stride + kw ? w + 2 * pad_w
                                                                    : ((wo + 15) / 16 * 16 - 1) * stride + kw) +
            3) / 4 * 4 + 4;
}
// Floats of the input copy (Cin*KH rows and the zero row), rounded up to 16 bytes: the staged output follows it.
__host__ __device__ constexpr int conv_input_mma_copy_floats(int cin, int kh, int wp) {
    return ((cin * kh + 1) * wp + 3) / 4 * 4;
}
// The launch's dynamic shared memory (cuda.tiles.input_mma_smem_bytes).
__host__ __device__ constexpr int conv_input_mma_smem_bytes(int elem_bytes, int cin, int kh, int wp, int wo) {
    return 4 * conv_input_mma_copy_floats(cin, kh, wp) + (wo + 15) / 16 * 16 * CONV_INPUT_MMA_ROW * elem_bytes;
}

#ifdef __CUDACC__
extern __shared__ __align__(16) unsigned char conv_input_smem[];
#else
alignas(16) static unsigned char conv_input_smem[48 * 1024];  // the emulator runs one block at a time
#endif

// Which k of a 16- or 8-k step each element of a lane's fragments is (PTX ISA, "Matrix Fragments for mma.m16n8k16"
// and "... mma.m16n8k8"; g = lane / 4, t = lane % 4). A register i holds row g + 8 (i % 2) of the tile; B register i
// column g. fp16 packs two k a register: A's k = 2t + 8 (i / 2) + e, B's 2t + 8i + e (e = 0, 1); tf32 one: A's
// t + 4 (i / 2), B's t + 4i.
template <class E>
struct InputFragments;
template <>
struct InputFragments<NhwcF16> {
    static constexpr int STEP = 16, PACK = 2;
    __device__ __forceinline__ static int a_k(int t, int half, int e) { return 2 * t + 8 * half + e; }
    __device__ __forceinline__ static int b_k(int t, int i, int e) { return 2 * t + 8 * i + e; }
    __device__ __forceinline__ static unsigned reg(const float (&v)[2]) { return f16::pack(v[0], v[1]); }
};
template <>
struct InputFragments<NhwcTf32> {
    static constexpr int STEP = 8, PACK = 1;
    __device__ __forceinline__ static int a_k(int t, int half, int) { return t + 4 * half; }
    __device__ __forceinline__ static int b_k(int t, int i, int) { return t + 4 * i; }
    __device__ __forceinline__ static unsigned reg(const float (&v)[1]) { return tf32::round(v[0]); }
};

// Copy the input rows of an output row of image b whose windows start at input row ih0: row (c, r) of the windows to
// copy[(c*KH + r)*wp ...], column j holding input column j - pad_w, by cp.async with zero fill outside the input, so
// that all of a thread's ~24 loads are in flight at once. The general copy, one float a cp.async: any padding.
__device__ __forceinline__ void conv_input_mma_copy(float* copy, const float* __restrict__ x, int b, int ih0, int cin,
                                                    int h, int w, int kh, int pad_w, int wp) {
    for (int c = 0, r = 0, cr = 0; cr < cin * kh; ++cr) {
        const int ih = ih0 + r;
        const bool row_ok = (unsigned)ih < (unsigned)h;
        const float* const xr = x + (((size_t)b * cin + c) * h + ih) * w - pad_w;
        for (int j = threadIdx.x; j < wp; j += CONV_INPUT_MMA_THREADS) {
            const bool ok = row_ok && (unsigned)(j - pad_w) < (unsigned)w;
            cp_async::copy4(copy + cr * wp + j, ok ? xr + j : x, ok);
        }
        if (++r == kh) {
            r = 0;
            ++c;
        }
    }
    cp_async::commit();
}

// The aligned copy, where no window reaches past a row's ends (pad_w = 0 and (Wo-1)*S + KW <= W: Conv2d_1a). The
// general copy spends ~12 instructions a float, most of the kernel's, which leaves it issue-bound.
// Here a row moves as 16-byte cp.asyncs of the aligned chunks that cover it: input row (c, ih) starts at element
// o = ((b*Cin + c)*H + ih)*W, rarely a multiple of 4 (W = 299), so its chunks 4 floor(o/4) + 4q land at copy row
// cr's slot from its start, and the row itself sh = o % 4 floats into the slot: the A fragments add each k's sh.
// The chunks' stray floats of the neighbouring rows fall where no window of an output pixel reads. A thread's chunks
// are n = thread, + 128, ... of the rows' chunks in order, (cr, q) stepped without a division; what a copy row needs
// besides (its input row's offset and window row) is looked up in `rows_at`, filled once per block. Few registers
// matter here: keeping each chunk's place in registers takes 166-189 of them, 3 blocks an SM, and leaves the kernel
// latency-bound.
constexpr int CONV_INPUT_MMA_MAX_ROWS = 64;  // Cin*KH of the aligned copy, at most

// Chunks of one input row: ceil((W + 3) / 4) cover it from any alignment.
__host__ __device__ constexpr int conv_input_row_chunks(int w) { return (w + 6) / 4; }
// Also: rows_at's offsets, 8 times an image's floats, must fit an int.
__device__ __forceinline__ bool conv_input_aligned(int cin, int h, int w, int wo, int kh, int kw, int stride,
                                                   int pad_w) {
    return pad_w == 0 && (wo - 1) * stride + kw <= w && kh <= 8 && cin * kh <= CONV_INPUT_MMA_MAX_ROWS &&
           (long long)cin * h * w < (1LL << 28);
}

// rows_at[cr] = (c*H + r)*W << 3 | r for copy row cr = c*KH + r: its input row's offset from row (b, 0, ih0) of x,
// and its window row (KH <= 8).
__device__ __forceinline__ void conv_input_rows_at(int* rows_at, int cin, int h, int w, int kh) {
    for (int cr = threadIdx.x; cr < cin * kh; cr += CONV_INPUT_MMA_THREADS) {
        const int c = cr / kh, r = cr - c * kh;
        rows_at[cr] = (c * h + r) * w << 3 | r;
    }
}

// img = (b*Cin*H + ih0)*W, the offset of row (b, 0, ih0) (negative in the top padding); total: x's floats.
__device__ __forceinline__ void conv_input_mma_copy_aligned(float* copy, const float* __restrict__ x,
                                                            const int* rows_at, long long img, int ih0, int h, int w,
                                                            int rows, int wp, long long total) {
    const int nq = conv_input_row_chunks(w);
    int cr = threadIdx.x / nq, q = threadIdx.x - cr * nq;
    for (; cr < rows;) {
        const int at = rows_at[cr];
        const bool ok = (unsigned)(ih0 + (at & 7)) < (unsigned)h;
        const long long src = ((img + (at >> 3)) & ~3LL) + 4 * q;
        float* const dst = copy + cr * wp + 4 * q;
        if (!ok || src + 4 <= total) {
            cp_async::copy16_or_zero(dst, ok ? x + src : x, ok);
        } else {  // the last chunk of the tensor: only its floats inside it
#pragma unroll
            for (int e = 0; e < 4; ++e) cp_async::copy4(dst + e, src + e < total ? x + src + e : x, src + e < total);
        }
        for (q += CONV_INPUT_MMA_THREADS; q >= nq; q -= nq) ++cr;
    }
    cp_async::commit();
}

// The tensor-core kernel's output: a pair of float32 values (sums + bias, ReLU) into the staged row as elements of
// type T, and the staged rows leave in Chunks. A float element type rounds as its store2 does, in 16-byte chunks
// (MmaElemOut); int8 quantizes at inv_out as I8Out does, in 8-byte chunks, as a staged row (CONV_INPUT_MMA_ROW = 40
// bytes) is 8-byte aligned only (MmaI8Out).
template <class E>
struct MmaElemOut {
    using T = typename E::T;
    using Chunk = uint4;
    __device__ __forceinline__ void store2(T* p, float v0, float v1) const { E::store2(p, v0, v1); }
};
struct MmaI8Out {
    using T = I8Piece::T;
    using Chunk = uint2;
    float inv_out;
    __device__ __forceinline__ void store2(T* p, float v0, float v1) const {
        const float lo = -static_cast<float>(i8q::QMAX);
        *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(
            __byte_perm(i8q::quantized_bits(v0, inv_out, lo), i8q::quantized_bits(v1, inv_out, lo), 0x0040));
    }
};

// The block's output rows blockIdx.x, + gridDim.x, ... (the host launches one block per few rows at large batch, so
// that what depends on the weights alone, B fragments, the fragments' offsets and the bias, is set up once for them).
// The next row's copy is issued as soon as the current row's math is done, and lands while its output is stored.
// E: the mma's element type (its fragments and mma), O: the output's (MmaElemOut<E> or MmaI8Out).
template <class E, class O>
__device__ __forceinline__ void conv_input_mma_rows(CONV_INPUT_PARAMS(typename O::T), const O store_out) {
    using F = InputFragments<E>;
    using T = typename O::T;
    using Chunk = typename O::Chunk;
    constexpr int CO = CONV_INPUT_COUT, NJ = CO / 8, STEPS = CONV_INPUT_MMA_K / F::STEP, PACK = F::PACK;
    constexpr int WARPS = CONV_INPUT_MMA_THREADS / 32, PIECE = sizeof(Chunk) / sizeof(T), PIECES = CO / PIECE;
    const int wp = conv_input_mma_width(w, pad_w, wo, kw, stride), rows = cin * kh, k_total = rows * kw;
    float* const copy = reinterpret_cast<float*>(conv_input_smem);
    T* const out = reinterpret_cast<T*>(conv_input_smem + 4 * conv_input_mma_copy_floats(cin, kh, wp));
    const int m0 = blockIdx.y * CO, out_rows = batch * ho;
    const bool aligned = conv_input_aligned(cin, h, w, wo, kh, kw, stride, pad_w);
    // Where each k of the A fragments sits in the copy, for the pixel at column 0: k_base (the copy row's slot and the
    // tap's column, or the zero row past K) + the aligned copy's shift of the copy row k_row, as k_at for the row in
    // the copy. In shared memory rather than in each lane's registers (see the aligned copy).
    __shared__ int rows_at[CONV_INPUT_MMA_MAX_ROWS], k_base[CONV_INPUT_MMA_K], k_row[CONV_INPUT_MMA_K],
        k_at[CONV_INPUT_MMA_K];
    if (aligned) conv_input_rows_at(rows_at, cin, h, w, kh);
    for (int k = threadIdx.x; k < CONV_INPUT_MMA_K; k += CONV_INPUT_MMA_THREADS) {
        const int c = k / (kh * kw), rs = k - c * kh * kw;
        k_base[k] = k < k_total ? (c * kh + rs / kw) * wp + rs % kw : rows * wp;
        k_row[k] = k < k_total && aligned ? c * kh + rs / kw : -1;
    }
    __syncthreads();
    // Issue the copy of output row `row`'s input rows, and set k_at for it: called before the first row and after
    // each row's math, so the row in the copy and k_at change together (the loop's barriers order both).
    const auto issue_copy = [&](int row) {
        const int b = row / ho, ih0 = (row - b * ho) * stride - pad_h;
        const long long img = ((long long)b * cin * h + ih0) * w;  // the offset of x's row (b, 0, ih0)
        if (aligned)
            conv_input_mma_copy_aligned(copy, x, rows_at, img, ih0, h, w, rows, wp, (long long)batch * cin * h * w);
        else
            conv_input_mma_copy(copy, x, b, ih0, cin, h, w, kh, pad_w, wp);
        for (int k = threadIdx.x; k < CONV_INPUT_MMA_K; k += CONV_INPUT_MMA_THREADS) {
            const int cr = k_row[k];
            k_at[k] = k_base[k] + (cr < 0 ? 0 : static_cast<int>((img + (rows_at[cr] >> 3)) & 3));
        }
    };
    if ((int)blockIdx.x < out_rows) issue_copy(blockIdx.x);
    for (int j = threadIdx.x; j < wp; j += CONV_INPUT_MMA_THREADS) copy[rows * wp + j] = 0.f;  // the padded k's row

    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    unsigned bfrag[STEPS][NJ][2];  // B[k][n] = wt[k][m0 + n], zero past K and Cout
#pragma unroll
    for (int s = 0; s < STEPS; ++s)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float v[PACK];
                const int m = m0 + 8 * j + g;
#pragma unroll
                for (int e = 0; e < PACK; ++e) {
                    const int k = s * F::STEP + F::b_k(t, i, e);
                    v[e] = k < k_total && m < cout ? __ldg(wt + (size_t)k * cout + m) : 0.f;
                }
                bfrag[s][j][i] = F::reg(v);
            }
    float bias_v[NJ][2];
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int m = m0 + 8 * j + 2 * t + e;
            bias_v[j][e] = m < cout ? __ldg(bias + m) : 0.f;
        }

    for (int row = blockIdx.x; row < out_rows; row += gridDim.x) {
        cp_async::wait<0>();
        __syncthreads();  // the row's copy is complete, and the last row's output has left shared memory
        int at[STEPS][2][PACK];  // where the lane's A fragments' k sit in the copy, for the pixel at column 0
#pragma unroll
        for (int s = 0; s < STEPS; ++s)
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
                for (int e = 0; e < PACK; ++e) at[s][half][e] = k_at[s * F::STEP + F::a_k(t, half, e)];
        for (int tile = threadIdx.x / 32; tile < (wo + 15) / 16; tile += WARPS) {
            float acc[NJ][4] = {};
            const int col[2] = {(16 * tile + g) * stride, (16 * tile + g + 8) * stride};  // rows g, g + 8 of it
#pragma unroll
            for (int s = 0; s < STEPS; ++s) {
                unsigned a[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    float v[PACK];
#pragma unroll
                    for (int e = 0; e < PACK; ++e) v[e] = copy[at[s][i / 2][e] + col[i % 2]];
                    a[i] = F::reg(v);
                }
#pragma unroll
                for (int j = 0; j < NJ; ++j) E::mma(acc[j], a, bfrag[s][j]);
            }
#pragma unroll
            for (int j = 0; j < NJ; ++j)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    float v0 = acc[j][2 * half] + bias_v[j][0], v1 = acc[j][2 * half + 1] + bias_v[j][1];
                    if (relu) {
                        v0 = fmaxf(v0, 0.f);
                        v1 = fmaxf(v1, 0.f);
                    }
                    store_out.store2(out + (16 * tile + g + 8 * half) * CONV_INPUT_MMA_ROW + 8 * j + 2 * t, v0, v1);
                }
        }
        __syncthreads();  // the row's output is staged; the copy is free
        if (row + (int)gridDim.x < out_rows) issue_copy(row + gridDim.x);

        T* const yrow = y + (size_t)row * wo * y_cstride + m0;  // pixel (b, oh, 0) is pixel row * Wo
        for (int n = threadIdx.x; n < wo * PIECES; n += CONV_INPUT_MMA_THREADS) {
            const int px = n / PIECES, q = n % PIECES;
            if (m0 + q * PIECE < cout)  // Cout is a multiple of PIECE: a piece is wholly inside or outside
                *reinterpret_cast<Chunk*>(yrow + (size_t)px * y_cstride + q * PIECE) =
                    *reinterpret_cast<const Chunk*>(out + px * CONV_INPUT_MMA_ROW + q * PIECE);
        }
    }
}

// Blocks an SM that their shared memory allows (~27 KB fp16, ~40 KB tf32 at 299x299), which ptxas then fits the
// registers to without spilling (76 and 96 registers).
CONV_INPUT_KERNEL(conv_input_mma_nhwc, conv_input_mma_rows, NhwcF16, CONV_INPUT_MMA_THREADS, 6)
CONV_INPUT_KERNEL(conv_input_mma_nhwc_tf32, conv_input_mma_rows, NhwcTf32, CONV_INPUT_MMA_THREADS, 5)
// int8: fp16's operands and mma, the output quantized (~20 KB of shared memory at 299x299).
extern "C" __global__ void __launch_bounds__(CONV_INPUT_MMA_THREADS, 6)
    conv_input_mma_nhwc_i8(CONV_INPUT_PARAMS(I8Piece::T), float inv_out) {
    conv_input_mma_rows<NhwcF16>(x, wt, bias, y, batch, cin, h, w, cout, ho, wo, y_cstride, kh, kw, stride, pad_h,
                                 pad_w, relu, MmaI8Out{inv_out});
}
