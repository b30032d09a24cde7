// pool.c: max and average pooling over kernel x kernel windows at stride S with padding P (Inception-V3: 3x3 max
// at stride 2 unpadded, 3x3 average at stride 1 padded by 1), for the float32 CPU path.
//
// Separable, one output row at a time: the window's input rows are reduced into one row (contiguous, vectorised
// by the compiler), then each output takes its kernel neighbours in that row: 2k - 2 operations an output instead
// of k^2 - 1. Windows are clipped to the image, which for max is padding with -inf; for average the sum is the
// zero-padded one and the divisor k^2 (count_include_pad) or the area of the clipped window.
// Tasks: (image, run of channels), taken in turn by the thread pool (threadpool.c).
#include "ie_cpu.h"

#include <math.h>
#include <string.h>

typedef struct {
    const ie_pool *p;
    int chunks;  // channel runs an image
} pool_job;

static inline int min_int(int a, int b) { return a < b ? a : b; }
static inline int max_int(int a, int b) { return a > b ? a : b; }

IE_AVX512 static void pool_plane(const ie_pool *p, const float *x, float *y, float *row) {
    const int k = p->kernel, s = p->stride, pad = p->pad, w = p->w, is_max = p->is_max;
    const int row_len = (p->wo - 1) * s + k;  // the padded row the outputs read
    for (int i = 0; i < row_len; i++) row[i] = is_max ? -INFINITY : 0.0f;
    float *inside = row + pad;
    for (int oy = 0; oy < p->ho; oy++) {
        int y0 = max_int(oy * s - pad, 0), y1 = min_int(oy * s - pad + k, p->h);
        memcpy(inside, x + (int64_t)y0 * w, w * sizeof(float));
        for (int iy = y0 + 1; iy < y1; iy++) {
            const float *in = x + (int64_t)iy * w;
            if (is_max)
                for (int ix = 0; ix < w; ix++) inside[ix] = inside[ix] > in[ix] ? inside[ix] : in[ix];
            else
                for (int ix = 0; ix < w; ix++) inside[ix] += in[ix];
        }
        float *out = y + (int64_t)oy * p->wo;
        for (int ox = 0; ox < p->wo; ox++) out[ox] = row[ox * s];
        for (int j = 1; j < k; j++) {
            if (is_max && s == 1)
                for (int ox = 0; ox < p->wo; ox++) out[ox] = out[ox] > row[ox + j] ? out[ox] : row[ox + j];
            else if (is_max)
                for (int ox = 0; ox < p->wo; ox++) out[ox] = out[ox] > row[ox * s + j] ? out[ox] : row[ox * s + j];
            else if (s == 1)
                for (int ox = 0; ox < p->wo; ox++) out[ox] += row[ox + j];
            else
                for (int ox = 0; ox < p->wo; ox++) out[ox] += row[ox * s + j];
        }
        if (is_max) continue;
        if (p->count_include_pad) {
            float scale = 1.0f / (float)(k * k);
            for (int ox = 0; ox < p->wo; ox++) out[ox] *= scale;
            continue;
        }
        for (int ox = 0; ox < p->wo; ox++) {
            int cols = min_int(ox * s - pad + k, w) - max_int(ox * s - pad, 0);
            out[ox] *= 1.0f / (float)((y1 - y0) * cols);
        }
    }
}

IE_AVX512 static void pool_task(void *arg, int task) {
    const pool_job *job = arg;
    const ie_pool *p = job->p;
    int image = task / job->chunks, chunk = task % job->chunks;
    int c0 = p->c * chunk / job->chunks, c1 = p->c * (chunk + 1) / job->chunks;
    float row[(p->wo - 1) * p->stride + p->kernel + p->w];  // a few hundred floats
    for (int c = c0; c < c1; c++)
        pool_plane(p, p->x + image * p->x_image_stride + (int64_t)c * p->h * p->w,
                   p->y + image * p->y_image_stride + (int64_t)c * p->ho * p->wo, row);
}

void ie_pool2d(const ie_pool *p, int threads) {
    pool_job job = {p, min_int(p->c, 4 * threads)};
    ie_parallel(p->images * job.chunks, threads, pool_task, &job);
}
