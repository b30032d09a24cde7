// ie_cpu.h: what the float32 CPU kernels share: the parameter blocks Python fills in (ctypes mirrors them in
// inception_engine/backends/cpu_kernels.py, field for field) and the thread pool that runs their tasks.
#pragma once
#include <stdint.h>

// All kernels need AVX-512F and FMA; ie_cpu_supported() checks the CPU before Python calls anything else. Only the
// functions marked with this are compiled for AVX-512, so loading the library is safe on any x86-64 CPU.
#define IE_AVX512 __attribute__((target("avx512f,fma")))

// y = relu(conv(x, w) + bias) for a batch of images (conv.c says how). x and y point at channel 0 of image 0 of
// their views; image i starts x_image_stride (y_image_stride) floats later; within an image channels are
// h*w (ho*wo) floats apart, so a channel slice of a concat buffer is a valid x or y.
typedef struct {
    const float *x;
    float *y;
    const float *weights;  // packed: ie_conv_mr() rows a panel, see conv.c
    const float *bias;     // o floats
    int64_t x_image_stride, y_image_stride;
    int32_t images, c, h, w, o, ho, wo, kh, kw, stride, pad_h, pad_w, relu;
} ie_conv;

// Max or average pool over kernel x kernel windows (max: padding never wins; average: divided by kernel^2 or,
// without count_include_pad, by the in-image part of the window), then + bias[c] where bias is not NULL, then
// the ReLU where relu is set (an average pool moved behind a 1x1 conv finishes the conv). Same view conventions as
// ie_conv.
typedef struct {
    const float *x;
    float *y;
    const float *bias;  // c floats, or NULL
    int64_t x_image_stride, y_image_stride;
    int32_t images, c, h, w, ho, wo, kernel, stride, pad, is_max, count_include_pad, relu;
} ie_pool;

// Runs fn(arg, t) for t in [0, tasks) on the calling thread and up to threads - 1 pool threads (threadpool.c).
void ie_parallel(int tasks, int threads, void (*fn)(void *arg, int task), void *arg);
