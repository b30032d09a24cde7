// pool_nhwc.cu: the pools of the fp16 NHWC path (CudaBackend(nhwc=True)).
//
// pool2d_nhwc: pool.cu's pool2d on fp16 channel slices of NHWC buffers: y[b, oh, ow, c] = max or mean of
// x[b, oh*S - P + r, ow*S - P + s, c] over the K x K window (max ignores padding; mean divides by K*K with
// count_include_pad, else by the positions inside the image); sums and maxima in fp32, one rounding at the store.
// global_avg_pool_nhwc: y[b, c] = mean over H*W of x[b, :, :, c], written as float32 (the classifier's input, batch
// item b at y + b*y_bstride), so the FC runs on fp32 features as in the other modes.
//
// Idea: memory-bound and tiny; each thread moves 8 channels (16 bytes) of one pixel, consecutive threads the next 8
// channels of the same pixel, so a warp's loads and stores are contiguous runs of 16-byte pieces. Views as in
// conv_nhwc.cu: x, y point at the view's first channel of pixel 0; pixel i starts i * *_cstride halves later.
// Channel counts, strides and view offsets are multiples of 8 (16-byte aligned pieces).
//
// Launch: pool2d_nhwc: block 256, grid ceil(batch*Ho*Wo*channels/8 / 256).
//         global_avg_pool_nhwc: block 256, grid ceil(batch*channels/8 / 256).
#include "conv_mma.cuh"

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    pool2d_nhwc(const unsigned short* __restrict__ x, unsigned short* __restrict__ y, int batch, int channels, int h,
                int w, int x_cstride, int ho, int wo, int y_cstride, int kernel, int stride, int pad, int is_max,
                int count_include_pad) {
    const int groups = channels / 8, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * ho * wo * groups) return;
    const int cg = idx % groups, p = idx / groups;  // output pixel p = (b * Ho + oh) * Wo + ow
    const int ow = p % wo, oh = p / wo % ho, b = p / (wo * ho);
    const int h0 = oh * stride - pad, w0 = ow * stride - pad;
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = is_max ? -INFINITY : 0.f;
    int inside = 0;
    for (int r = 0; r < kernel; ++r) {
        const int ih = h0 + r;
        if ((unsigned)ih >= (unsigned)h) continue;
        for (int s = 0; s < kernel; ++s) {
            const int iw = w0 + s;
            if ((unsigned)iw >= (unsigned)w) continue;
            float v[8];
            unpack8(v, __ldg(reinterpret_cast<const uint4*>(x + ((size_t)(b * h + ih) * w + iw) * x_cstride + 8 * cg)));
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] = is_max ? fmaxf(acc[e], v[e]) : acc[e] + v[e];
            ++inside;
        }
    }
    if (!is_max) {
        const float scale = 1.f / (float)(count_include_pad ? kernel * kernel : inside);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] *= scale;
    }
    *reinterpret_cast<uint4*>(y + (size_t)p * y_cstride + 8 * cg) = pack8(acc);
}

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    global_avg_pool_nhwc(const unsigned short* __restrict__ x, float* __restrict__ y, int batch, int channels, int hw,
                         int x_cstride, int y_bstride) {
    const int groups = channels / 8, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * groups) return;
    const int cg = idx % groups, b = idx / groups;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int i = 0; i < hw; ++i) {
        float v[8];
        unpack8(v, __ldg(reinterpret_cast<const uint4*>(x + ((size_t)b * hw + i) * x_cstride + 8 * cg)));
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += v[e];
    }
    float* yp = y + (size_t)b * y_bstride + 8 * cg;
#pragma unroll
    for (int e = 0; e < 8; ++e) yp[e] = acc[e] / (float)hw;
}
