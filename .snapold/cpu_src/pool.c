// pool.c: max and average pooling over kernel x kernel windows at stride S with padding P (Inception-V3: 3x3 max
// at stride 2 unpadded, 3x3 average at stride 1 padded by 1), then an optional bias and ReLU, for the float32 CPU
// path.
//
// Separable, one output row at a time: the window's input rows are reduced into one row, then each output takes
// its kernel neighbours in that row: 2k - 2 operations an output instead of k^2 - 1. Both passes are 16-lane
// vectors under masks, no scalar remainders: the network's maps are 8 to 147 pixels wide, and on a 17-wide row the
// loop overhead of plain C loops cost more than the arithmetic. Lanes outside the image load the reduction's
// identity (-inf for max, 0 for a sum), which is what padding means; for an average the divisor is k^2
// (count_include_pad) or the area of the window inside the image. Stride 2 takes the even lanes of 32 loaded
// floats (a permute); other strides gather.
// Tasks: (image, run of channels), taken in turn by the thread pool (threadpool.c).
#include "ie_cpu.h"

#include <immintrin.h>
#include <math.h>

typedef struct {
    const ie_pool *p;
    int chunks;  // channel runs an image
} pool_job;

static inline int min_int(int a, int b) { return a < b ? a : b; }
static inline int max_int(int a, int b) { return a > b ? a : b; }

// Lanes l with lo <= l < hi.
static inline __mmask16 lanes_between(int lo, int hi) {
    lo = max_int(lo, 0);
    hi = min_int(hi, 16);
    return hi <= lo ? 0 : (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

IE_AVX512 static inline __m512 reduce(int is_max, __m512 a, __m512 b) {
    return is_max ? _mm512_max_ps(a, b) : _mm512_add_ps(a, b);
}

// One output row's window row ``first``, ``first + s``, ... (16 lanes) of ``row`` (w floats), identity outside.
IE_AVX512 static inline __m512 strided_lanes(const float *row, int w, int first, int s, __m512 identity) {
    if (s == 1) return _mm512_mask_loadu_ps(identity, lanes_between(-first, w - first), row + first);
    if (s == 2) {
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        __m512 lo = _mm512_mask_loadu_ps(identity, lanes_between(-first, w - first), row + first);
        __m512 hi = _mm512_mask_loadu_ps(identity, lanes_between(-first - 16, w - first - 16), row + first + 16);
        return _mm512_permutex2var_ps(lo, even, hi);
    }
    __m512i col = _mm512_add_epi32(_mm512_set1_epi32(first),
                                   _mm512_mullo_epi32(_mm512_set1_epi32(s), _mm512_setr_epi32(
                                       0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)));
    __mmask16 inside = _mm512_cmpge_epi32_mask(col, _mm512_setzero_si512()) &
                       _mm512_cmplt_epi32_mask(col, _mm512_set1_epi32(w));
    return _mm512_mask_i32gather_ps(identity, inside, col, row, 4);
}

IE_AVX512 static void pool_plane(const ie_pool *p, const float *x, float *y, float *row, float bias) {
    const int k = p->kernel, s = p->stride, pad = p->pad, w = p->w, is_max = p->is_max;
    const __m512 identity = _mm512_set1_ps(is_max ? -INFINITY : 0.0f), zero = _mm512_setzero_ps();
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int oy = 0; oy < p->ho; oy++) {
        int y0 = max_int(oy * s - pad, 0), y1 = min_int(oy * s - pad + k, p->h);
        for (int x0 = 0; x0 < w; x0 += 16) {
            __mmask16 m = lanes_between(0, w - x0);
            __m512 v = _mm512_maskz_loadu_ps(m, x + (int64_t)y0 * w + x0);
            for (int iy = y0 + 1; iy < y1; iy++)
                v = reduce(is_max, v, _mm512_maskz_loadu_ps(m, x + (int64_t)iy * w + x0));
            _mm512_mask_storeu_ps(row + x0, m, v);
        }
        for (int ox0 = 0; ox0 < p->wo; ox0 += 16) {
            __m512 v = identity;
            for (int j = 0; j < k; j++) v = reduce(is_max, v, strided_lanes(row, w, ox0 * s - pad + j, s, identity));
            if (!is_max) {
                int area = k * k;
                if (!p->count_include_pad) {  // (rows inside) * (columns inside), per lane
                    __m512i left = _mm512_sub_epi32(_mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(ox0)),
                                                                       _mm512_set1_epi32(s)), _mm512_set1_epi32(pad));
                    __m512i cols = _mm512_sub_epi32(_mm512_min_epi32(_mm512_add_epi32(left, _mm512_set1_epi32(k)),
                                                                     _mm512_set1_epi32(w)),
                                                    _mm512_max_epi32(left, _mm512_setzero_si512()));
                    __m512 count = _mm512_cvtepi32_ps(_mm512_mullo_epi32(cols, _mm512_set1_epi32(y1 - y0)));
                    v = _mm512_mul_ps(v, _mm512_div_ps(_mm512_set1_ps(1.0f), count));
                } else {
                    v = _mm512_mul_ps(v, _mm512_set1_ps(1.0f / (float)area));
                }
            }
            if (p->bias) v = _mm512_add_ps(v, _mm512_set1_ps(bias));
            if (p->relu) v = _mm512_max_ps(zero, v);  // max(0, v) is v when v is NaN, as np.maximum has it
            _mm512_mask_storeu_ps(y + (int64_t)oy * p->wo + ox0, lanes_between(0, p->wo - ox0), v);
        }
    }
}

IE_AVX512 static void pool_task(void *arg, int task) {
    const pool_job *job = arg;
    const ie_pool *p = job->p;
    int image = task / job->chunks, chunk = task % job->chunks;
    int c0 = p->c * chunk / job->chunks, c1 = p->c * (chunk + 1) / job->chunks;
    float row[p->w];  // a few hundred floats
    for (int c = c0; c < c1; c++)
        pool_plane(p, p->x + image * p->x_image_stride + (int64_t)c * p->h * p->w,
                   p->y + image * p->y_image_stride + (int64_t)c * p->ho * p->wo, row, p->bias ? p->bias[c] : 0.0f);
}

void ie_pool2d(const ie_pool *p, int threads) {
    pool_job job = {p, min_int(p->c, 4 * threads)};
    ie_parallel(p->images * job.chunks, threads, pool_task, &job);
}
