// pool_nhwc.cu: the pools of the NHWC path (CudaBackend's NHWC layout), for each of its element types (conv_mma.cuh's
// NhwcF16: fp16; NhwcTf32: float32 words rounded to TF32; NhwcF32: float32; i8_piece.cuh's I8Piece: int8).
//
// pool2d_nhwc[_tf32|_f32]: pool.cu's pool2d on channel slices of NHWC buffers: y[b, oh, ow, c] = max or mean of
// x[b, oh*S - P + r, ow*S - P + s, c] over the K x K window (max ignores padding; mean divides by K*K with
// count_include_pad, else by the positions inside the image); sums and maxima in fp32, one rounding at the store.
// With a bias (else null): relu(pool + bias[c]), the average pool moved behind the 1x1 conv it fed, which left its
// raw product in x (plan.fuse_pointwise; both are linear, so they commute).
// global_avg_pool_nhwc[_tf32|_f32]: y[b, c] = mean over H*W of x[b, :, :, c], written as float32 (the classifier's input,
// batch item b at y + b*y_bstride), so the FC runs on fp32 features as in the other modes.
// int8 (`--precision int8`, backends/int8_reference.py's integer semantics, exactly):
// pool2d_nhwc_i8: max pool exact on int8; average pool: the window's int8 sum in int32, divided by the count as one
// float32 division and rounded half to even (i8q::mean); then, where ratio != 1 (a pool feeding a concat stored at
// another scale), requantized: clamp(rint(q * ratio), -127, 127), ratio = float32(s_in) / float32(s_out).
// avg_pool_products_nhwc_i8: an average pool moved behind its 1x1 conv (int8_reference.moved_pools): x holds the
// conv's raw products, exact int32 sums (conv_nhwc.cuh's NhwcStore::column4; x_cstride int32s a pixel), and
// y[b, oh, ow, c] = quantize(relu((float(S) * scale[c]) * (1 / float(count)) + bias[c]), inv_out[c]): S the window's
// int32 sum (the reference checks that it fits), count kernel^2 (count_include_pad) or the positions inside (at most
// 9: i8q::recip_small), each operation rounded on its own; epi = float32[3 C]: bias, scale = s_x s_w, inv_out
// (Int8Scales.moved_pool_epilogue). 3x3 windows of stride 1 only (the moved pools'). A thread takes four channels (a
// 16-byte piece of int32s) of I8_RUN outputs in a row, whose windows share their columns, as pool2d_nhwc_i8_k3s1's.
// global_avg_pool_nhwc_i8: float32 features of the dequantized input, y[b, c] = (S * scale) / hw with S the exact
// int32 sum over H*W (|S| <= 127 * hw < 2^24, exact in float32) and two float32 roundings, a product and a quotient:
// within 2^-23 of the exact mean, relative (the reference's float32 mean of dequantized values is within a few
// ulps of it too, relative to the mean of |x|).
//
// Idea: memory-bound and tiny; each thread moves one 16-byte piece (8 fp16 or 4 float channels) of one pixel,
// consecutive threads the next piece of the same pixel, so a warp's loads and stores are contiguous runs of 16-byte
// pieces. Views as in conv_nhwc.cuh: x, y point at the view's first channel of pixel 0; pixel i starts i * *_cstride
// elements later. Channel counts, strides and view offsets are multiples of the piece.
//
// Launch: pool2d_nhwc[_tf32|_f32|_i8]: block 256, grid ceil(batch*Ho*Wo*channels/PIECE / 256);
//         pool2d_nhwc_i8_k3s1 (3x3 windows, stride 1 only): block 256,
//         grid ceil(batch*Ho*ceil(Wo/I8_RUN)*channels/16 / 256).
//         avg_pool_products_nhwc_i8: block 256, grid ceil(batch*Ho*ceil(Wo/I8_RUN)*channels/4 / 256).
//         global_avg_pool_nhwc[_tf32|_f32|_i8]: block 256, grid ceil(batch*channels/PIECE / 256).
#include "conv_mma.cuh"
#include "i8_piece.cuh"
#include "pool_window.cuh"

// The per-channel sum of one piece over the hw pixels of image b (load(v, pixel) as above): the global pools'.
template <int PIECE, class Acc, class Load>
__device__ __forceinline__ void pixel_sums(Acc (&acc)[PIECE], Load&& load, int b, int hw) {
#pragma unroll
    for (int e = 0; e < PIECE; ++e) acc[e] = 0;
    for (int i = 0; i < hw; ++i) {
        Acc v[PIECE];
        load(v, (size_t)b * hw + i);
#pragma unroll
        for (int e = 0; e < PIECE; ++e) acc[e] += v[e];
    }
}

template <class E>
__device__ __forceinline__ void pool2d_nhwc_piece(const typename E::T* __restrict__ x, typename E::T* __restrict__ y,
                                                  int batch, int channels, int h, int w, int x_cstride, int ho, int wo,
                                                  int y_cstride, int kernel, int stride, int pad, int is_max,
                                                  int count_include_pad, const float* __restrict__ bias) {
    constexpr int PIECE = E::PIECE;
    const int groups = channels / PIECE, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * ho * wo * groups) return;
    const int cg = idx % groups, p = idx / groups;  // output pixel p = (b * Ho + oh) * Wo + ow
    const int ow = p % wo, oh = p / wo % ho, b = p / (wo * ho);
    const int h0 = oh * stride - pad, w0 = ow * stride - pad;
    float acc[PIECE];
#pragma unroll
    for (int e = 0; e < PIECE; ++e) acc[e] = is_max ? -INFINITY : 0.f;
    const auto load = [&](float (&v)[PIECE], size_t pixel) { E::load(v, x + pixel * x_cstride + PIECE * cg); };
    const int inside = pool_window(acc, load, b, h, w, h0, w0, kernel, is_max);
    if (!is_max) {
        const float scale = 1.f / (float)(count_include_pad ? kernel * kernel : inside);
#pragma unroll
        for (int e = 0; e < PIECE; ++e) acc[e] *= scale;
    }
    if (bias != nullptr) {
#pragma unroll
        for (int e = 0; e < PIECE; ++e) acc[e] = fmaxf(acc[e] + __ldg(bias + PIECE * cg + e), 0.f);
    }
    E::store(y + (size_t)p * y_cstride + PIECE * cg, acc);
}

template <class E>
__device__ __forceinline__ void global_avg_pool_nhwc_piece(const typename E::T* __restrict__ x, float* __restrict__ y,
                                                           int batch, int channels, int hw, int x_cstride,
                                                           int y_bstride) {
    constexpr int PIECE = E::PIECE;
    const int groups = channels / PIECE, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * groups) return;
    const int cg = idx % groups, b = idx / groups;
    float acc[PIECE];
    pixel_sums(acc, [&](float (&v)[PIECE], size_t pixel) { E::load(v, x + pixel * x_cstride + PIECE * cg); }, b, hw);
    float* yp = y + (size_t)b * y_bstride + PIECE * cg;
#pragma unroll
    for (int e = 0; e < PIECE; ++e) yp[e] = acc[e] / (float)hw;
}

#define POOL_NHWC_KERNELS(SUFFIX, E)                                                                                \
    extern "C" __global__ void __launch_bounds__(IE_THREADS)                                                        \
        pool2d_nhwc##SUFFIX(const E::T* __restrict__ x, E::T* __restrict__ y, int batch, int channels, int h,       \
                            int w, int x_cstride, int ho, int wo, int y_cstride, int kernel, int stride, int pad,   \
                            int is_max, int count_include_pad, const float* __restrict__ bias) {                    \
        pool2d_nhwc_piece<E>(x, y, batch, channels, h, w, x_cstride, ho, wo, y_cstride, kernel, stride, pad,        \
                             is_max, count_include_pad, bias);                                                      \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(IE_THREADS)                                                        \
        global_avg_pool_nhwc##SUFFIX(const E::T* __restrict__ x, float* __restrict__ y, int batch, int channels,    \
                                     int hw, int x_cstride, int y_bstride) {                                        \
        global_avg_pool_nhwc_piece<E>(x, y, batch, channels, hw, x_cstride, y_bstride);                             \
    }

POOL_NHWC_KERNELS(, NhwcF16)
POOL_NHWC_KERNELS(_tf32, NhwcTf32)
POOL_NHWC_KERNELS(_f32, NhwcF32)


// --- int8 (I8Piece: 16 channels a thread) ------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    pool2d_nhwc_i8(const signed char* __restrict__ x, signed char* __restrict__ y, int batch, int channels, int h,
                   int w, int x_cstride, int ho, int wo, int y_cstride, int kernel, int stride, int pad, int is_max,
                   int count_include_pad, float ratio) {
    constexpr int PIECE = I8Piece::PIECE;
    const int groups = channels / PIECE, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * ho * wo * groups) return;
    const int cg = idx % groups, p = idx / groups;  // output pixel p = (b * Ho + oh) * Wo + ow
    const int ow = p % wo, oh = p / wo % ho, b = p / (wo * ho);
    const int h0 = oh * stride - pad, w0 = ow * stride - pad;
    int acc[PIECE];
#pragma unroll
    for (int e = 0; e < PIECE; ++e) acc[e] = is_max ? -i8q::QMAX - 1 : 0;
    const auto load = [&](int (&v)[PIECE], size_t pixel) { I8Piece::load(v, x + pixel * x_cstride + PIECE * cg); };
    const int inside = pool_window(acc, load, b, h, w, h0, w0, kernel, is_max);
    const int count = count_include_pad ? kernel * kernel : inside;
#pragma unroll
    for (int e = 0; e < PIECE; ++e) acc[e] = i8q::requantize(is_max ? acc[e] : i8q::mean(acc[e], count), ratio);
    I8Piece::store(y + (size_t)p * y_cstride + PIECE * cg, acc);
}

// pool2d_nhwc_i8_k3s<S>: the network's 3x3 stride-1 pools (the Mixed blocks' average pools, pad 1), same arguments
// and results as pool2d_nhwc_i8 (kernel, stride: 3 and S, checked by the launch code). Only S = 1 is built: the
// stride-2 max pools ran slower so than on pool2d_nhwc_i8 (H100, batch 128: MaxPool_3a 0.163 against 0.111 ms,
// MaxPool_5a 0.116 against 0.079), where a thread's piece is one output and the warps' loads overlap less.
// A thread pools one 16-byte piece for I8_RUN outputs in a row (grid: pieces fastest, then runs of a row, then rows),
// so windows that overlap share their columns: first the K rows of each of the (I8_RUN - 1) * S + K input columns are
// reduced, then each output reduces its K columns. Max: __vmaxs4 on the packed bytes (padding never enters). Average:
// the bytes offset by +128 (xor 0x80: 1..255, so padding and the bias are the only difference from the sum) and
// spread into 16-bit pairs (prmt), added as plain 32-bit words: 9 * 255 < 2^16, so no pair carries into the next;
// the sum is the pair minus 128 per inside position. The mean: i8q::mean_small (counts <= 9, the reciprocal's
// product, exact as the division).
constexpr int I8_RUN = 4;

namespace i8pool {
constexpr unsigned BIAS4 = 0x80808080u;
// the signed bytes of a word as unsigned (v + 128) 16-bit pairs: lo holds bytes 0 and 2, hi bytes 1 and 3.
__device__ __forceinline__ void spread(unsigned word, unsigned& lo, unsigned& hi) {
    const unsigned u = word ^ BIAS4;
    lo = __byte_perm(u, 0u, 0x4240);
    hi = __byte_perm(u, 0u, 0x4341);
}

// the 8 pair-words of one output's window sum (spread order) -> 16 int8 channels at y, requantized.
__device__ __forceinline__ void store_mean(signed char* y, const unsigned (&s)[8], int inside, int count,
                                           float ratio) {
    const float recip = i8q::recip_small(count);
    const int off = 128 * inside;
    int q[16];
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // word k: channels 4k..4k+3 from lo (4k, 4k+2) and hi (4k+1, 4k+3)
        const unsigned lo = s[2 * k], hi = s[2 * k + 1];
        q[4 * k + 0] = static_cast<int>(lo & 0xFFFFu) - off;
        q[4 * k + 1] = static_cast<int>(hi & 0xFFFFu) - off;
        q[4 * k + 2] = static_cast<int>(lo >> 16) - off;
        q[4 * k + 3] = static_cast<int>(hi >> 16) - off;
    }
#pragma unroll
    for (int e = 0; e < 16; ++e) q[e] = i8q::requantize(i8q::mean_small(q[e], recip), ratio);
    I8Piece::store(y, q);
}

__device__ __forceinline__ void store_max(signed char* y, const unsigned (&m)[4], float ratio) {
    if (ratio == 1.f) {
        *reinterpret_cast<uint4*>(y) = uint4{m[0], m[1], m[2], m[3]};
        return;
    }
    int q[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) q[e] = static_cast<signed char>(m[e / 4] >> (8 * (e % 4)) & 0xFF);
#pragma unroll
    for (int e = 0; e < 16; ++e) q[e] = i8q::requantize(q[e], ratio);
    I8Piece::store(y, q);
}

__device__ __forceinline__ uint4 load(const signed char* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// A row of windows' columns w0 + j, j < COLS: whether each lies inside the image (cols_in[j]), and add(j, ih, iw)
// for each of its K rows h0 + r that do.
template <int COLS, int K, class Add>
__device__ __forceinline__ void columns(int h0, int w0, int h, int w, int (&cols_in)[COLS], Add&& add) {
#pragma unroll
    for (int j = 0; j < COLS; ++j) {
        const int iw = w0 + j;
        cols_in[j] = (unsigned)iw < (unsigned)w;
        if (!cols_in[j]) continue;
#pragma unroll
        for (int r = 0; r < K; ++r) {
            const int ih = h0 + r;
            if ((unsigned)ih < (unsigned)h) add(j, ih, iw);
        }
    }
}
}  // namespace i8pool

template <int S>
__device__ __forceinline__ void pool_i8_k3(const signed char* __restrict__ x, signed char* __restrict__ y, int batch,
                                           int channels, int h, int w, int x_cstride, int ho, int wo, int y_cstride,
                                           int pad, int is_max, int count_include_pad, float ratio) {
    constexpr int K = 3, COLS = (I8_RUN - 1) * S + K;
    static_assert(K * K <= i8q::MEAN_SMALL_MAX, "the reciprocal mean is exact up to 9 positions");
    const int groups = channels / I8Piece::PIECE, runs = (wo + I8_RUN - 1) / I8_RUN;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * ho * runs * groups) return;
    const int cg = idx % groups, run = idx / groups % runs, row = idx / (groups * runs);  // row = b * Ho + oh
    const int oh = row % ho, b = row / ho, ow0 = run * I8_RUN;
    const int h0 = oh * S - pad, w0 = ow0 * S - pad;
    const signed char* xb = x + (size_t)b * h * w * x_cstride + I8Piece::PIECE * cg;
    signed char* yp = y + ((size_t)row * wo + ow0) * y_cstride + I8Piece::PIECE * cg;
    int rows_in = 0;
#pragma unroll
    for (int r = 0; r < K; ++r) rows_in += (unsigned)(h0 + r) < (unsigned)h;
    if (is_max) {
        unsigned col[COLS][4];  // each column's maximum over the window's rows (all -128 outside the image)
#pragma unroll
        for (int j = 0; j < COLS; ++j) {
            col[j][0] = col[j][1] = col[j][2] = col[j][3] = i8pool::BIAS4;
            const int iw = w0 + j;
            if ((unsigned)iw >= (unsigned)w) continue;
#pragma unroll
            for (int r = 0; r < K; ++r) {
                const int ih = h0 + r;
                if ((unsigned)ih >= (unsigned)h) continue;
                const uint4 v = i8pool::load(xb + ((size_t)ih * w + iw) * x_cstride);
                col[j][0] = __vmaxs4(col[j][0], v.x), col[j][1] = __vmaxs4(col[j][1], v.y);
                col[j][2] = __vmaxs4(col[j][2], v.z), col[j][3] = __vmaxs4(col[j][3], v.w);
            }
        }
#pragma unroll
        for (int o = 0; o < I8_RUN; ++o) {
            if (ow0 + o >= wo) break;
            unsigned m[4];
#pragma unroll
            for (int k = 0; k < 4; ++k)
                m[k] = __vmaxs4(__vmaxs4(col[o * S][k], col[o * S + 1][k]), col[o * S + 2][k]);
            i8pool::store_max(yp + (size_t)o * y_cstride, m, ratio);
        }
        return;
    }
    unsigned col[COLS][8] = {};  // each column's sum over the window's rows, spread (0 outside the image)
    int cols_in[COLS];
    i8pool::columns<COLS, K>(h0, w0, h, w, cols_in, [&](int j, int ih, int iw) {
        const uint4 v = i8pool::load(xb + ((size_t)ih * w + iw) * x_cstride);
        const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            unsigned lo, hi;
            i8pool::spread(words[k], lo, hi);
            col[j][2 * k] += lo, col[j][2 * k + 1] += hi;
        }
    });
#pragma unroll
    for (int o = 0; o < I8_RUN; ++o) {
        if (ow0 + o >= wo) break;
        unsigned s[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) s[k] = col[o * S][k] + col[o * S + 1][k] + col[o * S + 2][k];
        const int inside = rows_in * (cols_in[o * S] + cols_in[o * S + 1] + cols_in[o * S + 2]);
        i8pool::store_mean(yp + (size_t)o * y_cstride, s, inside, count_include_pad ? K * K : inside, ratio);
    }
}

#define POOL_I8_K3(S)                                                                                               \
    extern "C" __global__ void __launch_bounds__(IE_THREADS) pool2d_nhwc_i8_k3s##S(                                 \
        const signed char* __restrict__ x, signed char* __restrict__ y, int batch, int channels, int h, int w,      \
        int x_cstride, int ho, int wo, int y_cstride, int kernel, int stride, int pad, int is_max,                  \
        int count_include_pad, float ratio) {                                                                       \
        pool_i8_k3<S>(x, y, batch, channels, h, w, x_cstride, ho, wo, y_cstride, pad, is_max, count_include_pad,    \
                      ratio);                                                                                       \
    }
POOL_I8_K3(1)

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    avg_pool_products_nhwc_i8(const int* __restrict__ x, signed char* __restrict__ y, int batch, int channels, int h,
                              int w, int x_cstride, int ho, int wo, int y_cstride, int kernel, int stride, int pad,
                              int count_include_pad, const float* __restrict__ epi) {
    constexpr int PIECE = 4, K = 3, COLS = I8_RUN - 1 + K;  // kernel 3, stride 1: checked by the launch code
    const int groups = channels / PIECE, runs = (wo + I8_RUN - 1) / I8_RUN;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * ho * runs * groups) return;
    const int cg = idx % groups, run = idx / groups % runs, row = idx / (groups * runs);  // row = b * Ho + oh
    const int oh = row % ho, b = row / ho, ow0 = run * I8_RUN;
    const int h0 = oh - pad, w0 = ow0 - pad;
    int rows_in = 0;
#pragma unroll
    for (int r = 0; r < K; ++r) rows_in += (unsigned)(h0 + r) < (unsigned)h;
    int col[COLS][PIECE] = {};  // each column's sum over the window's rows (0 outside the image)
    int cols_in[COLS];
    i8pool::columns<COLS, K>(h0, w0, h, w, cols_in, [&](int j, int ih, int iw) {
        const int4 v = __ldg(reinterpret_cast<const int4*>(x + ((size_t)(b * h + ih) * w + iw) * x_cstride) + cg);
        col[j][0] += v.x, col[j][1] += v.y, col[j][2] += v.z, col[j][3] += v.w;
    });
    float bias[PIECE], scale[PIECE], inv_out[PIECE];
#pragma unroll
    for (int e = 0; e < PIECE; ++e) {
        bias[e] = __ldg(epi + PIECE * cg + e);
        scale[e] = __ldg(epi + channels + PIECE * cg + e);
        inv_out[e] = __ldg(epi + 2 * channels + PIECE * cg + e);
    }
    signed char* yp = y + ((size_t)row * wo + ow0) * y_cstride + PIECE * cg;
#pragma unroll
    for (int o = 0; o < I8_RUN; ++o) {
        if (ow0 + o >= wo) break;
        const int inside = rows_in * (cols_in[o] + cols_in[o + 1] + cols_in[o + 2]);
        const float recip = i8q::recip_small(count_include_pad ? K * K : inside);
        unsigned b[PIECE];
#pragma unroll
        for (int e = 0; e < PIECE; ++e) {
            const int sum = col[o][e] + col[o + 1][e] + col[o + 2][e];
            const float f = __fadd_rn(i8q::mul(i8q::mul(__int2float_rn(sum), scale[e]), recip), bias[e]);
            b[e] = i8q::quantized_bits(f, inv_out[e], 0.f);  // after a ReLU
        }
        *reinterpret_cast<unsigned*>(yp + (size_t)o * y_cstride) = i8q::pack_low_bytes(b[0], b[1], b[2], b[3]);
    }
}

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    global_avg_pool_nhwc_i8(const signed char* __restrict__ x, float* __restrict__ y, int batch, int channels, int hw,
                            int x_cstride, int y_bstride, float scale) {
    constexpr int PIECE = I8Piece::PIECE;
    const int groups = channels / PIECE, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * groups) return;
    const int cg = idx % groups, b = idx / groups;
    int acc[PIECE];
    pixel_sums(acc, [&](int (&v)[PIECE], size_t pixel) { I8Piece::load(v, x + pixel * x_cstride + PIECE * cg); }, b,
               hw);
    float* yp = y + (size_t)b * y_bstride + PIECE * cg;
#pragma unroll
    for (int e = 0; e < PIECE; ++e) yp[e] = i8q::div(i8q::mul(static_cast<float>(acc[e]), scale), (float)hw);
}
