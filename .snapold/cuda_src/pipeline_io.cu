// pipeline_io.cu: the two ends of the streaming classifier (inception-run, Engine.predict on the cuda backend).
//
// normalize_u8_nchw: y[b, c, p] = (x[b, p, c] / 255 - mean[c]) / std[c], from the decoded uint8 RGB pixels (HWC,
// as Pillow leaves them, 1 byte a channel over PCIe instead of 4) to the float32 NCHW input of the first conv:
// torchvision's ToTensor + Normalize. The same float32 operations in the same order as images.normalize_u8 (an
// IEEE division by 255, a subtraction, an IEEE division by std; nvcc contracts none of them into an FMA), so the
// GPU's input is bit-identical to the CPU path's.
//
// softmax_topk_rows: the k most likely classes of each row of logits and their softmax probabilities, so that
// only k (index, probability) pairs per image cross PCIe back instead of 1000 logits. Ties go to the lower class
// index, as the CPU path's stable argsort does; sorting the logits sorts the probabilities (exp is monotonic).
//
// Idea: normalize is one pass over memory (a thread per pixel; 12 bytes read-modify-write per pixel, ~0.05 ms for
// a batch of 128 at HBM speed, against a 5-9 ms forward). Top-k is one block per row: the row's logits (padded
// with -inf to TOPK_N) are sorted in shared memory by a bitonic network (log2(N) (log2(N) + 1) / 2 = 55 compare-
// exchange steps for N = 1024, whatever k is), the maximum is then element 0, and the softmax denominator is a
// block sum of expf(z - max), accumulated in double as the CPU path does.
//
// Launch: normalize_u8_nchw: block 256, grid ceil(hw / 256) x batch.
//         softmax_topk_rows: block TOPK_N (1024), grid batch; cols <= TOPK_N, 1 <= k <= cols.
#include "common.cuh"

#define TOPK_N 1024

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    normalize_u8_nchw(const unsigned char* __restrict__ x, float* __restrict__ y,
                      const float* __restrict__ mean_std, int hw, int y_bstride) {
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= hw) return;
    const unsigned char* px = x + ((size_t)blockIdx.y * hw + p) * 3;
    float* yb = y + (size_t)blockIdx.y * y_bstride + p;
#pragma unroll
    for (int c = 0; c < 3; ++c) {
        const float v = (float)px[c] / 255.0f;
        yb[(size_t)c * hw] = (v - mean_std[c]) / mean_std[3 + c];
    }
}

// a comes before b: larger logit first, the lower class index among equals.
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

extern "C" __global__ void __launch_bounds__(TOPK_N)
    softmax_topk_rows(const float* __restrict__ z, float* __restrict__ prob, int* __restrict__ index, int cols,
                      int z_bstride, int k) {
    __shared__ float val[TOPK_N];
    __shared__ int idx[TOPK_N];
    __shared__ double partial[TOPK_N / 32];
    const int t = threadIdx.x;
    const float* zr = z + (size_t)blockIdx.x * z_bstride;
    val[t] = t < cols ? zr[t] : -INFINITY;
    idx[t] = t;
    __syncthreads();
    for (int size = 2; size <= TOPK_N; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const int other = t ^ stride;
            if (other > t) {
                // Runs with (t & size) == 0 end in ranking order, the others reversed: together a bitonic sequence
                // for the next size; the last size (all of TOPK_N) is one run in ranking order.
                const bool in_order = (t & size) == 0;
                const bool swap = ranks_before(val[other], idx[other], val[t], idx[t]) == in_order;
                if (swap) {
                    const float v = val[t];
                    val[t] = val[other];
                    val[other] = v;
                    const int i = idx[t];
                    idx[t] = idx[other];
                    idx[other] = i;
                }
            }
            __syncthreads();
        }
    }
    const float m = val[0];
    double s = t < cols ? (double)expf(val[t] - m) : 0.0;  // the -inf padding sorted last: t >= cols
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (t % 32 == 0) partial[t / 32] = s;
    __syncthreads();
    if (t < k) {
        double total = 0.0;
        for (int w = 0; w < TOPK_N / 32; ++w) total += partial[w];
        prob[(size_t)blockIdx.x * k + t] = (float)((double)expf(val[t] - m) / total);
        index[(size_t)blockIdx.x * k + t] = idx[t];
    }
}
