// pool.cu: 2-D max / average pooling and global average pooling on channel-slice views (fp32, NCHW).
//
// pool2d: y[b, c, oh, ow] = max or mean of x[b, c, oh*S - P + r, ow*S - P + s] over the K x K window. Max ignores
// positions outside the image (padding is -inf); average divides by K*K when count_include_pad is set (padding
// counts as zeros, torchvision's default) or by the number of positions inside the image otherwise. Inception-V3
// uses 3x3/2 max pools (stem, grid reductions) and 3x3/1/pad 1 average pools (the pool branch of each module).
// global_avg_pool: y[b, c] = mean over H*W of x[b, c] (8x8 -> 1x1 before the classifier).
//
// Idea: both are memory-bound and tiny; one thread per output element (consecutive threads along W, so reads and
// writes are coalesced) for pool2d, one warp per (b, c) plane with a shuffle reduction for global_avg_pool.
// Views as in conv.cu: x, y point at channel 0 of the view in batch item 0; item b is x_bstride floats later.
//
// Launch: pool2d: block 256, grid ceil(batch*channels*Ho*Wo / 256).
//         global_avg_pool: block 256 (8 warps), grid ceil(batch*channels / 8).
#include "common.cuh"
#include "pool_window.cuh"

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    pool2d(const float* __restrict__ x, float* __restrict__ y, int batch, int channels, int h, int w,
           int x_bstride, int ho, int wo, int y_bstride, int kernel, int stride, int pad, int is_max,
           int count_include_pad) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * channels * ho * wo) return;
    const int ow = idx % wo, oh = (idx / wo) % ho, c = (idx / (wo * ho)) % channels, b = idx / (wo * ho * channels);
    const float* xp = x + (size_t)b * x_bstride + (size_t)c * h * w;
    const int h0 = oh * stride - pad, w0 = ow * stride - pad;
    float acc[1] = {is_max ? -INFINITY : 0.f};
    const auto load = [&](float (&v)[1], size_t pixel) { v[0] = __ldg(xp + pixel); };  // image 0 of the plane xp
    const int inside = pool_window(acc, load, 0, h, w, h0, w0, kernel, is_max);
    if (!is_max) acc[0] /= (float)(count_include_pad ? kernel * kernel : inside);
    y[(size_t)b * y_bstride + (size_t)c * ho * wo + oh * wo + ow] = acc[0];
}

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    global_avg_pool(const float* __restrict__ x, float* __restrict__ y, int batch, int channels, int hw,
                    int x_bstride, int y_bstride) {
    const int plane = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (plane >= batch * channels) return;  // whole warps leave together: the shuffle below needs all 32 lanes
    const int b = plane / channels, c = plane - b * channels;
    const float* xp = x + (size_t)b * x_bstride + (size_t)c * hw;
    float s = 0.f;
    for (int i = lane; i < hw; i += 32) s += __ldg(xp + i);
    s = warp_sum(s);
    if (lane == 0) y[(size_t)b * y_bstride + c] = s / (float)hw;
}
