// softmax.cu: row-wise softmax of the logits, p[b, j] = exp(z[b, j] - max_j z[b]) / sum_j exp(z[b, j] - max_j z[b]).
//
// Idea: one block per row (1000 classes); three passes over the row, which stays in L1/L2: block max, block sum
// of exponentials (subtracting the max keeps exp from overflowing), then the normalised writes. expf, not
// __expf, so the result agrees with the float64 reference to fp32 rounding.
//
// Launch: block 256, grid batch.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    softmax_rows(const float* __restrict__ z, float* __restrict__ p, int cols, int z_bstride, int p_bstride) {
    __shared__ float scratch[32];
    const float* zr = z + (size_t)blockIdx.x * z_bstride;
    float* pr = p + (size_t)blockIdx.x * p_bstride;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, zr[j]);
    m = block_reduce<true>(m, scratch);
    float s = 0.f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += expf(zr[j] - m);
    s = block_reduce<false>(s, scratch);
    const float inv = 1.f / s;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) pr[j] = expf(zr[j] - m) * inv;
}
