// fc.cu: the fully-connected classifier at batch 1, y = W x + bias, as a matrix-vector product (fp32).
//
// Computes y[b, o] = bias[o] + sum_i w[o, i] * x[b, i] with w row-major (out_features, in_features), the layout
// of the weight file. Batches above 1 use the implicit-GEMM conv kernel instead (the FC is a 1x1 convolution on
// a 1x1 image with M = out_features, N = batch, K = in_features), where every weight is read once per tile rather
// than once per image.
//
// Idea: memory-bound (2048 x 1000 weights = 8 MB, read once). One warp per output row: lanes stride the row with
// 16-byte loads, so each warp-wide load reads 512 contiguous bytes; a shuffle reduction adds the 32 partial sums.
// x (8 KB) stays in L1. Needs in_features % 4 == 0 and 16-byte aligned x and w (the host checks).
//
// Launch: block 256 (8 rows), grid (ceil(out_features / 8), batch).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    fc_gemv(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
            float* __restrict__ y, int in_features, int out_features, int x_bstride, int y_bstride) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= out_features) return;  // whole warps leave together
    const float4* wr = reinterpret_cast<const float4*>(w + (size_t)row * in_features);
    const float4* xv = reinterpret_cast<const float4*>(x + (size_t)blockIdx.y * x_bstride);
    float s = 0.f;
    for (int i = lane; i < in_features / 4; i += 32) {
        const float4 a = __ldg(wr + i), b = __ldg(xv + i);
        s = fmaf(a.x, b.x, s);
        s = fmaf(a.y, b.y, s);
        s = fmaf(a.z, b.z, s);
        s = fmaf(a.w, b.w, s);
    }
    s = warp_sum(s);
    if (lane == 0) y[(size_t)blockIdx.y * y_bstride + row] = s + __ldg(bias + row);
}
