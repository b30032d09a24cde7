// pool_window.cuh: one pooling window's reduction, shared by pool.cu (NCHW, a channel a thread: PIECE 1) and
// pool_nhwc.cu (a piece of PIECE channels a thread, every element type).
#pragma once

__device__ __forceinline__ float window_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ int window_max(int a, int b) { return max(a, b); }

// The max or the sum, per channel, of one PIECE-channel piece over the window from (h0, w0) of image b, positions
// outside the image left out: load(v, pixel) gives the piece of input pixel (b * h + ih) * w + iw. Returns how many
// positions were inside. The pool2d kernels of every layout and element type share it (acc: float, or int for int8).
template <int PIECE, class Acc, class Load>
__device__ __forceinline__ int pool_window(Acc (&acc)[PIECE], Load&& load, int b, int h, int w, int h0, int w0,
                                           int kernel, int is_max) {
    int inside = 0;
    for (int r = 0; r < kernel; ++r) {
        const int ih = h0 + r;
        if ((unsigned)ih >= (unsigned)h) continue;
        for (int s = 0; s < kernel; ++s) {
            const int iw = w0 + s;
            if ((unsigned)iw >= (unsigned)w) continue;
            Acc v[PIECE];
            load(v, (size_t)(b * h + ih) * w + iw);
#pragma unroll
            for (int e = 0; e < PIECE; ++e) acc[e] = is_max ? window_max(acc[e], v[e]) : acc[e] + v[e];
            ++inside;
        }
    }
    return inside;
}
