// winograd.c: stride-1 convolutions + bias + ReLU by Winograd's minimal filtering (Lavin & Gray 2016, "Fast
// algorithms for convolutional neural networks"), 2 outputs a tile along each axis the kernel extends in:
// F(2x2, 3x3) (16 multiplies per 2x2 tile and input channel instead of 36), F(2x2, 5x5) (36 instead of 100),
// F(2, 7) and F(2, 3) along one axis for 1x7, 7x1, 1x3, 3x1 (8 instead of 14, 4 instead of 6).
//
// Each mh x mw output tile (ty, tx) reads the nh x nw input tile (n = m + k - 1) at rows mh ty - PH .., columns
// mw tx - PW ..; with d that tile (zero outside the image), U = G g G^T the transformed filter (computed once, in
// float64, by backends/cpu_kernels.py) and V = B^T d B, the output tile is A^T (sum over channels of U (.) V) A.
// For each of the nh nw positions xi of the input tiles the channel sums are one GEMM,
// M_xi[o, tile] = U_xi[o, c] V_xi[c, tile], which runs on conv.c's micro-kernel with U_xi packed as conv.c packs
// weights. The packed weights start with HEADER floats holding B^T and A^T of each axis (wino_axes).
//
// The input tiles of 32 tiles are gathered exactly as conv.c gathers a B panel of an nh x nw convolution at stride
// (mh, mw) over the tile grid (plan_panel and pack_b on that virtual convolution), a block of channels at a time;
// B^T . B turns each column of nh nw taps into V (3x3: additions in registers; other kernels: the matrices'
// nonzero terms). Per panel, V of all channels stays in work memory; the GEMMs then run position by position over
// groups of output channels into a buffer of M, and A^T . A, the bias and the ReLU write each group's output tiles
// (a tile's two pixels of a row interleaved, then masked stores by runs of adjacent tiles).
//
// Tasks are conv.c's: (image, run of adjacent panels, chunk of output channels); a chunk repeats the input side.
#include "gemm.h"

#define MAX_N 8        // input tile size along an axis: F(2, 7)
#define HEADER 256     // floats before U in the packed weights: B^T (MAX_N x MAX_N) of H, of W, A^T (2 x MAX_N) of each
#define CB 32          // channels whose input tiles are gathered at once: 16 x 32 x NR floats, 64 KB (3x3)
#define GROUP 8        // A panels (MR output channels each) whose M lives in work memory at once: 128 KB (3x3)
// The positions' (taps') rows of d, V and M are this many floats (a cache line) further apart than their size:
// at 4 KB multiples (CB * NR floats, GROUP * MR * NR, 32 * NR) the transforms' 16 loads or stores a vector all fall
// in one set of the L1 cache, more than its ways.
#define SKEW 16
#define D_TAP (CB * NR + SKEW)
#define M_XI (GROUP * MR * NR + SKEW)

// The transforms along H and W, as the packed weights' header holds them (row-major, MAX_N columns).
typedef struct {
    const float *bt_h, *bt_w, *at_h, *at_w;
} wino_axes;

typedef struct {
    const ie_conv *p;
    ie_conv tiles;     // the virtual nh x nw convolution at stride (mh, mw) whose B panels are the input tiles
    int mh, mw, nh, nw, taps;  // taps = nh nw positions
    wino_axes axes;
    int panels, panel_block, blocks, m_panels, m_chunks;
} wino_job;

// F(2x2, 3x3): V = B^T d B for one vector of 16 tiles: d + tap * d_tap (tap = 4i + j) into v + xi * v_xi
// (xi = 4u + w). B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]].
IE_AVX512 static inline void input_transform(const float *d, int64_t d_tap, float *v, int64_t v_xi) {
    __m512 t[4][4];
    for (int j = 0; j < 4; j++) {
        __m512 d0 = _mm512_load_ps(d + (0 * 4 + j) * d_tap), d1 = _mm512_load_ps(d + (1 * 4 + j) * d_tap);
        __m512 d2 = _mm512_load_ps(d + (2 * 4 + j) * d_tap), d3 = _mm512_load_ps(d + (3 * 4 + j) * d_tap);
        t[0][j] = _mm512_sub_ps(d0, d2);
        t[1][j] = _mm512_add_ps(d1, d2);
        t[2][j] = _mm512_sub_ps(d2, d1);
        t[3][j] = _mm512_sub_ps(d1, d3);
    }
    for (int u = 0; u < 4; u++) {
        _mm512_store_ps(v + (u * 4 + 0) * v_xi, _mm512_sub_ps(t[u][0], t[u][2]));
        _mm512_store_ps(v + (u * 4 + 1) * v_xi, _mm512_add_ps(t[u][1], t[u][2]));
        _mm512_store_ps(v + (u * 4 + 2) * v_xi, _mm512_sub_ps(t[u][2], t[u][1]));
        _mm512_store_ps(v + (u * 4 + 3) * v_xi, _mm512_sub_ps(t[u][1], t[u][3]));
    }
}

// Generic B^T d B (nh, nw <= MAX_N) for one vector of 16 tiles, by the nonzero terms of the two 1-D transforms:
// along W into t, then along H into v. Inlined with nh and nw constant (input_transform_any), so that t stays in
// registers; the branches on zero coefficients go the same way for every vector.
// sum over j < n of coef[j] * the 16 floats at x + j * stride, skipping zero coefficients (the transforms' many
// zeros): a row of a transform matrix applied to a column of tiles in memory.
IE_AVX512 static inline __attribute__((always_inline)) __m512 coef_dot(const float *coef, int n, const float *x,
                                                                      int64_t stride) {
    __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int j = 0; j < n; j++)
        if (coef[j] != 0.0f) sum = _mm512_fmadd_ps(_mm512_set1_ps(coef[j]), _mm512_load_ps(x + j * stride), sum);
    return sum;
}

IE_AVX512 static inline __attribute__((always_inline)) void input_transform_n(
    const wino_job *job, const int nh, const int nw, const float *d, int64_t d_tap, float *v, int64_t v_xi) {
    __m512 t[MAX_N * MAX_N];
#pragma GCC unroll 8
    for (int i = 0; i < nh; i++)
#pragma GCC unroll 8
        for (int u = 0; u < nw; u++)
            t[i * nw + u] = coef_dot(job->axes.bt_w + u * MAX_N, nw, d + i * nw * d_tap, d_tap);
#pragma GCC unroll 8
    for (int u = 0; u < nh; u++)
#pragma GCC unroll 8
        for (int w = 0; w < nw; w++) {
            __m512 sum = t[w];
            if (nh > 1) {
                sum = _mm512_setzero_ps();
#pragma GCC unroll 8
                for (int i = 0; i < nh; i++) {
                    float coef = job->axes.bt_h[u * MAX_N + i];
                    if (coef != 0.0f) sum = _mm512_fmadd_ps(_mm512_set1_ps(coef), t[i * nw + w], sum);
                }
            }
            _mm512_store_ps(v + (u * nw + w) * v_xi, sum);
        }
}

IE_AVX512 static void input_transform_any(const wino_job *job, const float *d, int64_t d_tap, float *v,
                                          int64_t v_xi) {
    if (job->nh == 1 && job->nw == 8) input_transform_n(job, 1, 8, d, d_tap, v, v_xi);
    else if (job->nh == 8 && job->nw == 1) input_transform_n(job, 8, 1, d, d_tap, v, v_xi);
    else if (job->nh == 6 && job->nw == 6) input_transform_n(job, 6, 6, d, d_tap, v, v_xi);
    else if (job->nh == 1 && job->nw == 4) input_transform_n(job, 1, 4, d, d_tap, v, v_xi);
    else if (job->nh == 4 && job->nw == 1) input_transform_n(job, 4, 1, d, d_tap, v, v_xi);
    else input_transform_n(job, job->nh, job->nw, d, d_tap, v, v_xi);
}

// Where one output row of the tiles of a vector goes. mw = 2: after the interleave of the tiles' left and right
// pixels, lane j of half h holds pixel b = j % 2 of tile 8h + j / 2; mw = 1: lane j of half 0 holds tile j. Lanes
// of run r store to plane[start[r] + j] (one masked store: adjacent tiles of one row of tiles are adjacent
// pixels), or, past OUT_RUNS runs (narrow maps), all lanes scatter to plane[index[j]]. Pixels outside the map (odd
// sizes) and lanes past the last tile are in no run.
#define OUT_RUNS 4
typedef struct {
    int32_t index[16];
    int32_t start[OUT_RUNS];
    __mmask16 mask[OUT_RUNS];
    __mmask16 scatter_mask;
    int32_t runs;  // -1: scatter
} pixel_runs;

typedef struct {
    pixel_runs at[VECS][2][2];  // [vector][half h][tile row a]
} tile_pixels;

static void plan_outputs(const wino_job *job, int n0, tile_pixels *out) {
    const ie_conv *p = job->p;
    const int tw = job->tiles.wo, tiles = job->tiles.ho * tw, mh = job->mh, mw = job->mw;
    for (int v = 0; v < VECS; v++)
        for (int h = 0; h < mw; h++)
            for (int a = 0; a < mh; a++) {
                pixel_runs *d = &out->at[v][h][a];
                *d = (pixel_runs){.runs = 0};
                int32_t start[16];
                for (int j = 0; j < 16; j++) {
                    int n = n0 + 16 * v + (mw == 2 ? 8 * h + j / 2 : j), b = mw == 2 ? j % 2 : 0;
                    int oy = n / tw * mh + a, ox = n % tw * mw + b;
                    int inside = n < tiles && oy < p->ho && ox < p->wo;
                    d->index[j] = inside ? oy * p->wo + ox : 0;
                    start[j] = d->index[j] - j;
                    d->scatter_mask |= (__mmask16)(inside << j);
                }
                for (__mmask16 left = d->scatter_mask; left; d->runs++) {
                    if (d->runs == OUT_RUNS) {
                        d->runs = -1;
                        break;
                    }
                    int first = __builtin_ctz(left);
                    for (int j = first; j < 16; j++)
                        if ((left >> j & 1) && start[j] == start[first]) d->mask[d->runs] |= (__mmask16)(1u << j);
                    d->start[d->runs] = start[first];
                    left &= (__mmask16)~d->mask[d->runs];
                }
            }
}

// Stores v by d's runs into plane, and prefetches the same lines OUT_AHEAD channels further on (plane_floats
// apart): the output planes are written once and are not in the cache, and without the prefetch each store waited
// for its lines (Conv2d_2b, one core: 10.3 -> 5.9 ms).
#define OUT_AHEAD 4
IE_AVX512 static inline void store_pixels(float *plane, const pixel_runs *d, __m512 v, int64_t plane_floats) {
    if (d->runs < 0) {
        _mm512_mask_i32scatter_ps(plane, d->scatter_mask, _mm512_loadu_si512(d->index), v, 4);
        return;
    }
    for (int r = 0; r < d->runs; r++) {
        float *at = plane + d->start[r];
        _mm512_mask_storeu_ps(at, d->mask[r], v);
        __builtin_prefetch(at + OUT_AHEAD * plane_floats, 1, 3);
        __builtin_prefetch(at + OUT_AHEAD * plane_floats + 15, 1, 3);
    }
}

// y0, y1: a row a of the tiles' left and right pixels (mw = 2), or y0 alone (mw = 1); + bias, ReLU, stored.
IE_AVX512 static inline void store_row(const wino_job *job, const tile_pixels *px, int v, int a, __m512 y0, __m512 y1,
                                       __m512 bias, float *out) {
    const __m512i left = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i right = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const int64_t plane = (int64_t)job->p->ho * job->p->wo;
    y0 = _mm512_add_ps(y0, bias);
    y1 = _mm512_add_ps(y1, bias);
    if (job->p->relu) {  // max(0, v) is v when v is NaN, as np.maximum has it
        y0 = _mm512_max_ps(_mm512_setzero_ps(), y0);
        y1 = _mm512_max_ps(_mm512_setzero_ps(), y1);
    }
    if (job->mw == 1) {
        store_pixels(out, &px->at[v][0][a], y0, plane);
        return;
    }
    store_pixels(out, &px->at[v][0][a], _mm512_permutex2var_ps(y0, left, y1), plane);
    store_pixels(out, &px->at[v][1][a], _mm512_permutex2var_ps(y0, right, y1), plane);
}

// F(2x2, 3x3): Y = A^T M A for rows [0, rows) of a group, m[xi * M_XI + r * NR + 16 v]; A^T = [[1, 1, 1, 0],
// [0, 1, -1, -1]].
IE_AVX512 static void output_transform(const wino_job *job, const float *m, int rows, int vecs, int o0, float *y,
                                       const tile_pixels *px) {
    const int64_t plane = (int64_t)job->p->ho * job->p->wo;
    for (int r = 0; r < rows; r++) {
        __m512 bias = _mm512_set1_ps(job->p->bias[o0 + r]);
        for (int v = 0; v < vecs; v++) {
            const float *src = m + r * NR + 16 * v;
            __m512 t[2][4];
            for (int w = 0; w < 4; w++) {
                __m512 m0 = _mm512_load_ps(src + (0 * 4 + w) * M_XI);
                __m512 m1 = _mm512_load_ps(src + (1 * 4 + w) * M_XI);
                __m512 m2 = _mm512_load_ps(src + (2 * 4 + w) * M_XI);
                __m512 m3 = _mm512_load_ps(src + (3 * 4 + w) * M_XI);
                t[0][w] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
                t[1][w] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
            }
            for (int a = 0; a < 2; a++)
                store_row(job, px, v, a, _mm512_add_ps(_mm512_add_ps(t[a][0], t[a][1]), t[a][2]),
                          _mm512_sub_ps(_mm512_sub_ps(t[a][1], t[a][2]), t[a][3]), bias, y + (o0 + r) * plane);
        }
    }
}

// Generic A^T M A (nh, nw <= MAX_N; mh, mw <= 2) for one row and vector, by the nonzero terms: along H into t, then
// along W. Inlined with the sizes constant (output_transform_any), as input_transform_n.
IE_AVX512 static inline __attribute__((always_inline)) void output_tile_n(
    const wino_job *job, const int nh, const int nw, const int mh, const int mw, const float *src, int v,
    __m512 bias, float *out, const tile_pixels *px) {
    __m512 t[2][MAX_N];
#pragma GCC unroll 2
    for (int a = 0; a < mh; a++)
#pragma GCC unroll 8
        for (int w = 0; w < nw; w++) t[a][w] = coef_dot(job->axes.at_h + a * MAX_N, nh, src + w * M_XI, nw * M_XI);
#pragma GCC unroll 2
    for (int a = 0; a < mh; a++) {
        __m512 y[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
#pragma GCC unroll 2
        for (int b = 0; b < mw; b++)
#pragma GCC unroll 8
            for (int w = 0; w < nw; w++) {
                float coef = job->axes.at_w[b * MAX_N + w];
                if (coef != 0.0f) y[b] = _mm512_fmadd_ps(_mm512_set1_ps(coef), t[a][w], y[b]);
            }
        store_row(job, px, v, a, y[0], y[1], bias, out);
    }
}

IE_AVX512 static void output_transform_any(const wino_job *job, const float *m, int rows, int vecs, int o0, float *y,
                                           const tile_pixels *px) {
    const int64_t plane = (int64_t)job->p->ho * job->p->wo;
    const int nh = job->nh, nw = job->nw;
    for (int r = 0; r < rows; r++) {
        __m512 bias = _mm512_set1_ps(job->p->bias[o0 + r]);
        float *out = y + (o0 + r) * plane;
        for (int v = 0; v < vecs; v++) {
            const float *src = m + r * NR + 16 * v;
            if (nh == 1 && nw == 8) output_tile_n(job, 1, 8, 1, 2, src, v, bias, out, px);
            else if (nh == 8 && nw == 1) output_tile_n(job, 8, 1, 2, 1, src, v, bias, out, px);
            else if (nh == 6 && nw == 6) output_tile_n(job, 6, 6, 2, 2, src, v, bias, out, px);
            else output_tile_n(job, nh, nw, job->mh, job->mw, src, v, bias, out, px);
        }
    }
}

// Floats between two positions' rows of V: C rows of NR, skewed.
static inline int64_t v_xi(int c) { return (int64_t)c * NR + SKEW; }

// V of every channel for the panel at tile n0: vin[xi][c][NR] (the first vecs vectors).
IE_AVX512 static void transform_inputs(const wino_job *job, const float *x, const lane_reads *plan, int vecs,
                                       float *d, float *vin) {
    const int c_all = job->p->c, fast = job->nh == 4 && job->nw == 4;
    for (int c0 = 0; c0 < c_all; c0 += CB) {
        int cb = c_all - c0 < CB ? c_all - c0 : CB;
        for (int tap = 0; tap < job->taps; tap++)
            pack_b(&job->tiles, x, plan, vecs, (int64_t)tap * c_all + c0, cb, d + (int64_t)tap * D_TAP);
        for (int c = 0; c < cb; c++)
            for (int v = 0; v < vecs; v++) {
                const float *from = d + c * NR + 16 * v;
                float *to = vin + (int64_t)(c0 + c) * NR + 16 * v;
                if (fast) input_transform(from, D_TAP, to, v_xi(c_all));
                else input_transform_any(job, from, D_TAP, to, v_xi(c_all));
            }
    }
}

// The GEMMs of one group of A panels [g0, g1) for the panel whose V is vin, into m.
IE_AVX512 static void group_gemms(const wino_job *job, int vecs, int g0, int g1, const float *vin, float *m) {
    static const float no_bias[MR];
    const __mmask16 all[VECS] = {0xFFFF, 0xFFFF};
    const int c_all = job->p->c, kb = k_block(c_all);
    const int64_t u_xi = ie_packed_weights_floats(job->p->o, c_all);  // floats of one position's packed U
    for (int xi = 0; xi < job->taps; xi++)
        for (int64_t k0 = 0; k0 < c_all; k0 += kb) {
            int kc = c_all - k0 < kb ? (int)(c_all - k0) : kb;
            const float *a = job->p->weights + HEADER + xi * u_xi + k0 * job->m_panels * MR + (int64_t)g0 * kc * MR;
            for (int mp = g0; mp < g1; mp++, a += kc * MR)
                micro_kernel(vecs, kc, a, vin + xi * v_xi(c_all) + k0 * NR, m + xi * M_XI + (mp - g0) * MR * NR, NR,
                             MR, all, k0 == 0, 0, no_bias, 0);
        }
}

IE_AVX512 static void wino_task(void *arg, int task) {
    const wino_job *job = arg;
    const ie_conv *p = job->p;
    const int tiles = job->tiles.ho * job->tiles.wo, taps = job->taps, fast = job->nh == 4 && job->nw == 4;
    int chunk = task % job->m_chunks, block = task / job->m_chunks % job->blocks;
    int image = task / job->m_chunks / job->blocks;
    int mp0 = job->m_panels * chunk / job->m_chunks, mp1 = job->m_panels * (chunk + 1) / job->m_chunks;
    size_t d_floats = (size_t)taps * D_TAP, v_floats = (size_t)taps * v_xi(p->c), m_floats = (size_t)taps * M_XI;
    float *d = thread_scratch((d_floats + v_floats + m_floats) * sizeof(float) + sizeof(tile_pixels) +
                              taps * VECS * sizeof(lane_reads));
    float *vin = d + d_floats, *m = vin + v_floats;
    tile_pixels *px = (tile_pixels *)(m + m_floats);
    lane_reads *plan = (lane_reads *)(px + 1);
    const float *x = p->x + image * p->x_image_stride;
    float *y = p->y + image * p->y_image_stride;
    for (int panel = block * job->panel_block; panel < (block + 1) * job->panel_block && panel < job->panels;
         panel++) {
        int n0 = panel * NR, vecs = tiles - n0 > 16 ? 2 : 1;
        plan_panel(&job->tiles, job->mh, n0, plan);
        transform_inputs(job, x, plan, vecs, d, vin);
        plan_outputs(job, n0, px);
        for (int g0 = mp0; g0 < mp1; g0 += GROUP) {
            int g1 = g0 + GROUP < mp1 ? g0 + GROUP : mp1;
            group_gemms(job, vecs, g0, g1, vin, m);
            int rows = (p->o < g1 * MR ? p->o : g1 * MR) - g0 * MR;
            if (fast) output_transform(job, m, rows, vecs, g0 * MR, y, px);
            else output_transform_any(job, m, rows, vecs, g0 * MR, y, px);
        }
    }
}

// Kernels up to MAX_N - 1 = 7 along each axis, not 1x1; stride 1. Output tiles are 2 along an axis the kernel
// extends in, else 1.
void ie_conv2d_winograd(const ie_conv *p, int threads) {
    wino_job job = {.p = p, .tiles = *p, .m_panels = (p->o + MR - 1) / MR};
    job.mh = p->kh > 1 ? 2 : 1;
    job.mw = p->kw > 1 ? 2 : 1;
    job.nh = job.mh + p->kh - 1;
    job.nw = job.mw + p->kw - 1;
    job.taps = job.nh * job.nw;
    job.axes = (wino_axes){p->weights, p->weights + MAX_N * MAX_N, p->weights + 2 * MAX_N * MAX_N,
                           p->weights + 2 * MAX_N * MAX_N + 2 * MAX_N};
    job.tiles.ho = (p->ho + job.mh - 1) / job.mh;
    job.tiles.wo = (p->wo + job.mw - 1) / job.mw;
    job.tiles.kh = job.nh;
    job.tiles.kw = job.nw;
    job.tiles.stride = job.mw;  // along rows of tiles; plan_panel takes mh for the other axis
    job.panels = (job.tiles.ho * job.tiles.wo + NR - 1) / NR;
    split_tasks(p->images, job.panels, job.m_panels, threads, 4 * threads, &job.panel_block, &job.blocks,
                &job.m_chunks);
    ie_parallel(p->images * job.blocks * job.m_chunks, threads, wino_task, &job);
}
