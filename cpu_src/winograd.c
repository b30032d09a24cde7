// winograd.c: 3x3 stride-1 convolutions + bias + ReLU by Winograd's minimal filtering F(2x2, 3x3) (Lavin & Gray
// 2016, "Fast algorithms for convolutional neural networks"): 16 multiplies per 2x2 output tile and input channel
// instead of 36, so the GEMMs do 0.44x the direct convolution's work.
//
// Each 2x2 output tile (ty, tx) reads the 4x4 input tile at rows 2ty - PH .., columns 2tx - PW ..; with
// d that tile (zero outside the image), U = G g G^T the 4x4 transformed filter (computed once, in float64, by
// backends/cpu_kernels.py) and V = B^T d B, the output tile is A^T (sum over channels of U (.) V) A. For each of
// the 16 positions xi of the 4x4 tiles the channel sums are one GEMM, M_xi[o, tile] = U_xi[o, c] V_xi[c, tile],
// which runs on conv.c's micro-kernel with U_xi packed as conv.c packs weights.
//
// The input tiles of 32 tiles are gathered exactly as conv.c gathers a B panel of a 4x4 convolution at stride 2
// over the tile grid (plan_panel and pack_b on that virtual convolution), a block of channels at a time; B^T . B
// turns each 16-tap column into V in registers (additions only). Per panel, V of all channels stays in work
// memory; the GEMMs then run position by position over groups of output channels into a buffer of M, and A^T . A,
// the bias and the ReLU write each group's output tiles (each tile's two pixels of a row interleaved, then masked
// stores by runs of adjacent tiles).
//
// Tasks are conv.c's: (image, run of adjacent panels, chunk of output channels); a chunk repeats the input side.
#include "gemm.h"

#define TAPS 16        // 4x4 input tile
#define CB 32          // channels whose input tiles are gathered at once: 16 x 32 x NR floats, 64 KB
#define GROUP 8        // A panels (MR output channels each) whose M lives in work memory at once: 128 KB
// The 16 positions' (taps') rows of d, V and M are this many floats (a cache line) further apart than their size:
// at 4 KB multiples (CB * NR floats, GROUP * MR * NR, 32 * NR) the transforms' 16 loads or stores a vector all fall
// in one set of the L1 cache, more than its ways.
#define SKEW 16
#define D_TAP (CB * NR + SKEW)
#define M_XI (GROUP * MR * NR + SKEW)

typedef struct {
    const ie_conv *p;
    ie_conv tiles;     // the virtual 4x4 stride-2 convolution whose B panels are the input tiles
    int panels, panel_block, blocks, m_panels, m_chunks;
} wino_job;

// V = B^T d B for one vector of 16 tiles: d + tap * d_tap (tap = 4i + j) into v + xi * v_xi (xi = 4u + w). B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]].
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

// Where one output row of 8 tiles goes: after the interleave of the tiles' left and right pixels, lane j of the
// 16 holds pixel b = j % 2 of tile 8h + j / 2 of a vector; lanes of run r store to plane[start[r] + j] (one masked
// store: tiles in one row of tiles are adjacent pixel pairs), or, past OUT_RUNS runs (maps under 8 pixels wide),
// all lanes scatter to plane[index[j]]. Pixels outside the map (odd sizes) and lanes past the last tile are in no
// run.
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

static void plan_outputs(const ie_conv *p, int tw, int tiles, int n0, tile_pixels *out) {
    for (int v = 0; v < VECS; v++)
        for (int h = 0; h < 2; h++)
            for (int a = 0; a < 2; a++) {
                pixel_runs *d = &out->at[v][h][a];
                *d = (pixel_runs){.runs = 0};
                int32_t start[16];
                for (int j = 0; j < 16; j++) {
                    int n = n0 + 16 * v + 8 * h + j / 2, oy = n / tw * 2 + a, ox = n % tw * 2 + j % 2;
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

// Y = A^T M A + bias, ReLU, for rows [0, rows) of a group: m[xi * M_XI + r * NR + 16 v]; A^T = [[1, 1,
// 1, 0], [0, 1, -1, -1]].
IE_AVX512 static void output_transform(const wino_job *job, const float *m, int rows, int vecs, int o0, float *y,
                                       const tile_pixels *px) {
    const ie_conv *p = job->p;
    const int64_t plane = (int64_t)p->ho * p->wo;
    const __m512 zero = _mm512_setzero_ps();
    const __m512i left = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i right = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int r = 0; r < rows; r++) {
        __m512 bias = _mm512_set1_ps(p->bias[o0 + r]);
        float *out = y + (o0 + r) * plane;
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
            for (int a = 0; a < 2; a++) {
                __m512 y0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(t[a][0], t[a][1]), t[a][2]), bias);
                __m512 y1 = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(t[a][1], t[a][2]), t[a][3]), bias);
                if (p->relu) {  // max(0, v) is v when v is NaN, as np.maximum has it
                    y0 = _mm512_max_ps(zero, y0);
                    y1 = _mm512_max_ps(zero, y1);
                }
                store_pixels(out, &px->at[v][0][a], _mm512_permutex2var_ps(y0, left, y1), plane);
                store_pixels(out, &px->at[v][1][a], _mm512_permutex2var_ps(y0, right, y1), plane);
            }
        }
    }
}

// Floats between two positions' rows of V: C rows of NR, skewed.
static inline int64_t v_xi(int c) { return (int64_t)c * NR + SKEW; }

// V of every channel for the panel at tile n0: vin[xi][c][NR] (the first vecs vectors).
IE_AVX512 static void transform_inputs(const wino_job *job, const float *x, const lane_reads *plan, int vecs,
                                       float *d, float *vin) {
    const int c_all = job->p->c;
    for (int c0 = 0; c0 < c_all; c0 += CB) {
        int cb = c_all - c0 < CB ? c_all - c0 : CB;
        for (int tap = 0; tap < TAPS; tap++)
            pack_b(&job->tiles, x, plan, vecs, (int64_t)tap * c_all + c0, cb, d + (int64_t)tap * D_TAP);
        for (int c = 0; c < cb; c++)
            for (int v = 0; v < vecs; v++)
                input_transform(d + c * NR + 16 * v, D_TAP, vin + (int64_t)(c0 + c) * NR + 16 * v, v_xi(c_all));
    }
}

IE_AVX512 static void wino_task(void *arg, int task) {
    static const float no_bias[MR];
    const wino_job *job = arg;
    const ie_conv *p = job->p;
    const int c_all = p->c, tiles = job->tiles.ho * job->tiles.wo, kb = k_block(c_all);
    int chunk = task % job->m_chunks, block = task / job->m_chunks % job->blocks;
    int image = task / job->m_chunks / job->blocks;
    int mp0 = job->m_panels * chunk / job->m_chunks, mp1 = job->m_panels * (chunk + 1) / job->m_chunks;
    size_t d_floats = (size_t)TAPS * D_TAP, v_floats = (size_t)TAPS * v_xi(c_all), m_floats = (size_t)TAPS * M_XI;
    float *d = thread_scratch((d_floats + v_floats + m_floats) * sizeof(float) + sizeof(tile_pixels) +
                              TAPS * VECS * sizeof(lane_reads));
    float *vin = d + d_floats, *m = vin + v_floats;
    tile_pixels *px = (tile_pixels *)(m + m_floats);
    lane_reads *plan = (lane_reads *)(px + 1);
    const float *x = p->x + image * p->x_image_stride;
    float *y = p->y + image * p->y_image_stride;
    const int64_t u_xi = ie_packed_weights_floats(p->o, c_all);  // floats of one position's packed U
    const __mmask16 all[VECS] = {0xFFFF, 0xFFFF};
    for (int panel = block * job->panel_block; panel < (block + 1) * job->panel_block && panel < job->panels;
         panel++) {
        int n0 = panel * NR, vecs = tiles - n0 > 16 ? 2 : 1;
        plan_panel(&job->tiles, n0, plan);
        transform_inputs(job, x, plan, vecs, d, vin);
        plan_outputs(p, job->tiles.wo, tiles, n0, px);
        for (int g0 = mp0; g0 < mp1; g0 += GROUP) {
            int g1 = g0 + GROUP < mp1 ? g0 + GROUP : mp1;
            for (int xi = 0; xi < TAPS; xi++)
                for (int64_t k0 = 0; k0 < c_all; k0 += kb) {
                    int kc = c_all - k0 < kb ? (int)(c_all - k0) : kb;
                    const float *a = p->weights + xi * u_xi + k0 * job->m_panels * MR + (int64_t)g0 * kc * MR;
                    for (int mp = g0; mp < g1; mp++, a += kc * MR)
                        micro_kernel(vecs, kc, a, vin + xi * v_xi(c_all) + k0 * NR,
                                     m + xi * M_XI + (mp - g0) * MR * NR, NR, MR, all, k0 == 0, 0, no_bias,
                                     0);
                }
            int rows = (p->o < g1 * MR ? p->o : g1 * MR) - g0 * MR;
            output_transform(job, m, rows, vecs, g0 * MR, y, px);
        }
    }
}

void ie_conv2d_winograd(const ie_conv *p, int threads) {
    wino_job job = {.p = p, .tiles = *p, .m_panels = (p->o + MR - 1) / MR, .m_chunks = 1};
    job.tiles.ho = (p->ho + 1) / 2;
    job.tiles.wo = (p->wo + 1) / 2;
    job.tiles.kh = job.tiles.kw = 4;
    job.tiles.stride = 2;
    job.panels = (job.tiles.ho * job.tiles.wo + NR - 1) / NR;
    // As conv.c: runs of up to 8 panels a task, about 8 tasks a thread; split M where panels are few.
    job.panel_block = p->images * job.panels / (8 * threads);
    job.panel_block = job.panel_block < 1 ? 1 : job.panel_block > 8 ? 8 : job.panel_block;
    job.blocks = (job.panels + job.panel_block - 1) / job.panel_block;
    while (p->images * job.blocks * job.m_chunks < 4 * threads && job.m_panels >= 8 * job.m_chunks)
        job.m_chunks *= 2;
    ie_parallel(p->images * job.blocks * job.m_chunks, threads, wino_task, &job);
}
