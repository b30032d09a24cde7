// common.cuh: small helpers shared by the kernels of inception-engine.
//
// Warp and block reductions by butterfly shuffles (every lane ends with the result), and the block shape the
// element-wise kernels use. Tensors are float32, NCHW; a "view" is a channel slice of a buffer: a pointer to
// channel 0 of the slice in batch item 0 plus the batch stride (the whole buffer's C_total * H * W), so kernels
// read and write concat buffers in place.
#pragma once

#define IE_THREADS 256  // block size of the element-wise kernels (pool, reduce, softmax)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum (IS_MAX false) or max over the block; every thread gets the result. blockDim.x must be a multiple of 32
// and at most 1024. `scratch` holds one float per warp; the leading barrier makes it safe to call repeatedly.
template <bool IS_MAX>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : (IS_MAX ? -INFINITY : 0.f);
    return IS_MAX ? warp_max(v) : warp_sum(v);
}

// The input window of output pixel n (flattened over batch * Ho * Wo) in an implicit-im2col loader: the batch
// item's base pointer and the window's top-left corner, negative where the window starts in the padding.
struct WindowOrigin {
    const float* xb;
    int ih0, iw0;
};

__device__ __forceinline__ WindowOrigin window_origin(const float* x, int n, int howo, int wo, int stride, int pad_h,
                                                      int pad_w, int x_bstride) {
    const int b = n / howo, p = n - b * howo, oh = p / wo, ow = p - oh * wo;
    return {x + (size_t)b * x_bstride, oh * stride - pad_h, ow * stride - pad_w};
}

// The output tile of a GEMM block on grid (N tiles, M tiles[, z]): tile_n0 = first column (pixel), tile_m0 = first
// row (channel). Blocks start in blockIdx.x-fastest order, so a plain (x, y) = (n, m) mapping runs all N tiles of one
// M tile before the next M tile, and an input tile is read from DRAM again for every M tile (a 35x35 layer's input
// at batch 128 is 2-3x the 50 MB L2). Renumbered so that consecutive blocks take the M tiles of one N tile, those
// reads hit L2. Only the order changes: each (blockIdx.x, blockIdx.y) still owns exactly one tile, the same for
// every blockIdx.z.
__device__ __forceinline__ int tile_n0(int bn) {
    return (blockIdx.x + gridDim.x * blockIdx.y) / gridDim.y * bn;
}
__device__ __forceinline__ int tile_m0(int bm) {
    return (blockIdx.x + gridDim.x * blockIdx.y) % gridDim.y * bm;
}

// Every kernel shape of Inception-V3's convolutions (KH, KW): X(KH, KW) once per shape, for the files that
// instantiate one kernel per shape.
#define IE_FOR_EACH_CONV_SHAPE(X) X(1, 1) X(3, 3) X(5, 5) X(1, 7) X(7, 1) X(1, 3) X(3, 1)
