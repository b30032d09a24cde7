// conv_input_nhwc.cu: the network's first convolution on the NHWC path (CudaBackend's NHWC layout), read straight
// from the float32 NCHW input as uploaded:
//
// y[b, oh, ow, m] = relu(bias[m] + sum_{c, r, s} wt[(c*KH + r)*KW + s][m] * x[b, c, oh*S - PH + r, ow*S - PW + s])
//
// with y a channel slice of an NHWC buffer (conv_nhwc.cu's views: pixel i starts i * y_cstride elements after y) of
// fp16 (conv_input_nhwc), TF32-rounded float32 (conv_input_nhwc_tf32) or float32 (conv_input_nhwc_f32;
// conv_mma.cuh's NhwcF16, NhwcTf32, NhwcF32), wt
// float32 [K][Cout] (K = Cin*KH*KW in (c, r, s) order, cuda.params.direct_weights), sums in fp32.
//
// Idea: the input has 3 channels. conv_nhwc.cu reads whole 16-byte pieces of 8 channels, so it needed the input
// converted to an fp16 NHWC copy padded to 8 channels: K = 72 instead of 27, and a copy written and read back
// (183 MB each way at batch 128) for a layer of only 4.9 GFLOP. Measured on an H200 at batch 128, conversion and
// conv took 0.50 ms, 9.9 TFLOP/s. Here one thread computes the 32 channels of one output pixel on the FMA units:
// - its K inputs come straight from x; the windows of neighbouring threads overlap, and L1 serves the re-reads;
// - the weights of the block's 32 channels sit in shared memory, and every lane reads the same word (a broadcast);
// - the 32 sums leave as four (fp16) or eight (tf32) 16-byte stores. In tf32, where the block's 256 pixels x 32
//   channels are one contiguous run of y (y_cstride = Cout = 32, the network's case), they go through shared memory
//   first, so that a warp stores 512 consecutive bytes instead of 16 bytes in each of 32 lines: 0.44 -> 0.36 ms at
//   batch 128 (H100). fp16's 64 bytes a pixel measured slower so (0.30 -> 0.32 ms) and store directly.
// Bytes: the input once, the output once (~320 MB at batch 128, ~0.1 ms); 2.4 G multiply-adds (~0.08 ms at the FMA
// peak). The fp16 rounding of the input is gone too: fp32 inputs, weights and sums, one rounding at the store.
//
// Launch: conv_input_nhwc[_tf32|_f32]: block 256, grid (ceil(batch*Ho*Wo / 256), ceil(Cout / CONV_INPUT_COUT)).
// Needs Cin*KH*KW <= CONV_INPUT_MAX_K; Cout, y_cstride and y's first channel multiples of 8.
#include "conv_mma.cuh"

#define CONV_INPUT_COUT 32    // output channels per thread (and per block)
#define CONV_INPUT_MAX_K 256  // shared memory for 256 x 32 weights, 32 KB

template <class E>
__device__ __forceinline__ void conv_input_pixel(const float* __restrict__ x, const float* __restrict__ wt,
                                                 const float* __restrict__ bias, typename E::T* __restrict__ y,
                                                 int batch, int cin, int h, int w, int cout, int ho, int wo,
                                                 int y_cstride, int kh, int kw, int stride, int pad_h, int pad_w,
                                                 int relu) {
    constexpr int CO = CONV_INPUT_COUT, PIECE = E::PIECE;
    __shared__ __align__(16) float ws[CONV_INPUT_MAX_K][CO];
    const int k_total = cin * kh * kw, m0 = blockIdx.y * CO;
    for (int i = threadIdx.x; i < k_total * CO; i += blockDim.x) {  // consecutive threads, consecutive channels
        const int k = i / CO, j = i % CO;
        ws[k][j] = m0 + j < cout ? __ldg(wt + (size_t)k * cout + m0 + j) : 0.f;
    }
    __syncthreads();

    const int howo = ho * wo, p_total = batch * howo, p0 = blockIdx.x * blockDim.x, p = p0 + threadIdx.x;
    // The block's output is one run of 128-byte pixels: stage it (the header).
    const bool dense = sizeof(typename E::T) == 4 && y_cstride == CO && cout == CO;
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
            E::store(y + (size_t)(p0 + px) * CO + PIECE * g, v);
        }
        return;
    }
    typename E::T* yp = y + (size_t)p * y_cstride + m0;
#pragma unroll
    for (int g = 0; g < CO / PIECE; ++g) {
        if (m0 + PIECE * g >= cout) break;  // cout is a multiple of PIECE: a piece is wholly inside or outside
        float v[PIECE];
#pragma unroll
        for (int e = 0; e < PIECE; ++e) {
            v[e] = acc[PIECE * g + e] + __ldg(bias + m0 + PIECE * g + e);
            if (relu) v[e] = fmaxf(v[e], 0.f);
        }
        E::store(yp + PIECE * g, v);
    }
}

#define CONV_INPUT_NHWC_KERNEL(NAME, E)                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                                \
        NAME(const float* __restrict__ x, const float* __restrict__ wt, const float* __restrict__ bias,              \
             E::T* __restrict__ y, int batch, int cin, int h, int w, int cout, int ho, int wo, int y_cstride, int kh, \
             int kw, int stride, int pad_h, int pad_w, int relu) {                                                   \
        conv_input_pixel<E>(x, wt, bias, y, batch, cin, h, w, cout, ho, wo, y_cstride, kh, kw, stride, pad_h, pad_w, \
                            relu);                                                                                   \
    }

CONV_INPUT_NHWC_KERNEL(conv_input_nhwc, NhwcF16)
CONV_INPUT_NHWC_KERNEL(conv_input_nhwc_tf32, NhwcTf32)
CONV_INPUT_NHWC_KERNEL(conv_input_nhwc_f32, NhwcF32)
