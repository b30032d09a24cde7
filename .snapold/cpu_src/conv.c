// conv.c: float32 2-D convolution + bias + ReLU on the CPU, as an implicit GEMM with an AVX-512 micro-kernel.
//
// Computes y[i, o, oy, ox] = relu(bias[o] + sum_{ky, kx, c} w[o, ky, kx, c] * x[i, c, oy*S - PH + ky, ox*S - PW + kx])
// with x zero outside the image: every convolution of Inception-V3 (kernels 1x1 to 7x7, strides 1 and 2).
//
// Idea: per image, the matrix product C[M, N] = A[M, K] B[K, N] with M = output channels, N = Ho*Wo output pixels
// and K = KH*KW*C in (ky, kx, c) order, blocked as in Goto & van de Geijn 2008 ("Anatomy of high-performance
// matrix multiplication") and BLIS (Van Zee & van de Geijn 2015):
// * A, the weights, is packed once when the backend is built (ie_pack_weights) into panels of MR rows, each
//   [k][r] for one block of K, zero past M: the micro-kernel reads MR consecutive floats per k and never checks
//   the M edge, and a sweep of all panels over one B panel reads one contiguous stretch (prefetched ahead).
// * B, the im2col matrix, never exists in full: a task packs one NR-column panel of it, one K block at a time,
//   straight from the image into a buffer that stays in L1 ([k][j], zero where the window leaves the image).
//   Along a row of output pixels a stride-1 tap reads consecutive input pixels, so each 16-pixel vector of a panel
//   is one masked vector load per channel (two where it wraps to the next output row); lanes outside the image are
//   masked off, which writes the padding's zeros and never touches their addresses (AVX-512 masked loads suppress
//   faults). Where that would take more than RUNS loads (stride 2), a gather.
// * The micro-kernel holds an MR x NR = 8 x 32 block of C in 16 zmm registers; per k one row of the B panel (two
//   loads) and MR broadcasts of A feed 16 FMAs. The last K block adds the bias, applies the ReLU and stores under
//   masks at the right edge; earlier K blocks store raw sums that the next one reloads. A last panel of at most 16
//   pixels runs a one-vector copy of the kernel: N = 17*17 = 289 is 9 panels and 1 pixel, and a full-width last
//   panel cost the 17x17 layers 10%.
//
// Blocking, measured on the stem, 35x35, 17x17 and 8x8 layers (AMD Zen 5, one core): MR = 8 divides every M of the
// network (32..448), where MR = 12 (24 accumulators) lost up to 12% to the zero rows of the last panel (M = 32, 64)
// and was no faster elsewhere; NR = 48 (24 accumulators) was no faster than 32. KC = 192, K cut into equal blocks:
// K = 288 (the stem) in 2 blocks of 144, 4032 (the 8x8 3x3 layers) in 21; a packed B panel (<= 24 KB) stays in the
// 48 KB L1 while the A panels of its K block (M*KC floats, at most 345 KB) stream from L2. On Zen 5, 256 and 512
// were within the noise of 384; on Intel Xeon (Sapphire Rapids class, 48 KB L1) 192 beat 384 by 3-5% on the whole
// forward (a 48 KB B panel filled the L1).
//
// Tasks: (image, run of adjacent B panels, chunk of A panels), taken in turn by the thread pool (threadpool.c). A
// layer with few B panels (8x8 maps: 2 an image) splits M into chunks too, each repacking its B panel, so that
// every thread has work; the weights stay shared and read-only.
#include "gemm.h"

#include <stdlib.h>


typedef struct {
    const ie_conv *p;
    int64_t k;         // KH*KW*C
    int panels;        // B panels an image
    int panel_block;   // B panels a task
    int blocks;        // tasks an image and chunk of A
    int m_panels;      // A panels
    int m_chunks;      // A panels are split into this many chunks, one task each
} conv_job;

// Packed weights: K blocks of KC rows one after the other; in each, the A panels one after the other, each
// [kc][MR] (zero past M). A sweep of the A panels over one B panel reads one contiguous stretch.
// K is cut into equal blocks of at most KC rows (K = 288 as 2 x 144, not 256 + 32).
IE_HIDDEN int k_block(int64_t k) {
    int64_t blocks = (k + KC - 1) / KC;
    return (int)((k + blocks - 1) / blocks);
}

int64_t ie_packed_weights_floats(int m, int64_t k) { return (int64_t)(m + MR - 1) / MR * MR * k; }

void ie_pack_weights(const float *a, int m, int64_t k, float *packed) {
    int m_panels = (m + MR - 1) / MR, kb = k_block(k);
    for (int64_t k0 = 0; k0 < k; k0 += kb) {
        int kc = k - k0 < kb ? (int)(k - k0) : kb;
        for (int mp = 0; mp < m_panels; mp++)
            for (int kk = 0; kk < kc; kk++)
                for (int r = 0; r < MR; r++, packed++)
                    *packed = mp * MR + r < m ? a[(int64_t)(mp * MR + r) * k + k0 + kk] : 0.0f;
    }
}

int ie_cpu_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
}

// Per-thread work memory, grown on demand, never freed (the pool's threads live as long as the process).
static _Thread_local void *scratch;
static _Thread_local size_t scratch_bytes;

IE_HIDDEN void *thread_scratch(size_t bytes) {
    if (bytes > scratch_bytes) {
        free(scratch);
        scratch_bytes = (bytes + 4095) & ~(size_t)4095;
        scratch = aligned_alloc(64, scratch_bytes);
        if (!scratch) abort();  // a few hundred KB; nothing sensible to do without them
    }
    return scratch;
}

// plan[tap * VECS + v] for the panel at output pixel n0: lane l of vector v reads input pixel
// (oy*stride_h - PH + ky, ox*S - PW + kx) for (oy, ox) = output pixel n0 + 16v + l. Integer vector arithmetic: this
// runs for every tap of every panel and must cost little next to the packing it plans (3 input channels in the stem).
IE_HIDDEN IE_AVX512 void plan_panel(const ie_conv *p, int stride_h, int n0, lane_reads *plan) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i zero = _mm512_setzero_si512(), wo = _mm512_set1_epi32(p->wo), one = _mm512_set1_epi32(1);
    for (int v = 0; v < VECS; v++) {
        __m512i n = _mm512_add_epi32(_mm512_set1_epi32(n0 + 16 * v), lane);
        __mmask16 in_map = _mm512_cmplt_epi32_mask(n, _mm512_set1_epi32(p->ho * p->wo));
        // oy = n / wo by a float division (off by at most one for n < 2^22, which cpu_kernels.py checks), corrected.
        __m512i oy = _mm512_cvttps_epi32(_mm512_div_ps(_mm512_cvtepi32_ps(n), _mm512_cvtepi32_ps(wo)));
        __m512i ox = _mm512_sub_epi32(n, _mm512_mullo_epi32(oy, wo));
        __mmask16 low = _mm512_cmplt_epi32_mask(ox, zero);
        oy = _mm512_mask_sub_epi32(oy, low, oy, one);
        ox = _mm512_mask_add_epi32(ox, low, ox, wo);
        __mmask16 high = _mm512_cmpge_epi32_mask(ox, wo);
        oy = _mm512_mask_add_epi32(oy, high, oy, one);
        ox = _mm512_mask_sub_epi32(ox, high, ox, wo);
        __m512i iy0 = _mm512_sub_epi32(_mm512_mullo_epi32(oy, _mm512_set1_epi32(stride_h)),
                                       _mm512_set1_epi32(p->pad_h));
        __m512i ix0 = _mm512_sub_epi32(_mm512_mullo_epi32(ox, _mm512_set1_epi32(p->stride)),
                                       _mm512_set1_epi32(p->pad_w));
        for (int tap = 0; tap < p->kh * p->kw; tap++) {
            lane_reads *d = &plan[tap * VECS + v];
            *d = (lane_reads){0};
            __m512i iy = _mm512_add_epi32(iy0, _mm512_set1_epi32(tap / p->kw));
            __m512i ix = _mm512_add_epi32(ix0, _mm512_set1_epi32(tap % p->kw));
            __mmask16 valid = in_map & _mm512_cmpge_epi32_mask(iy, zero) &
                              _mm512_cmplt_epi32_mask(iy, _mm512_set1_epi32(p->h)) &
                              _mm512_cmpge_epi32_mask(ix, zero) & _mm512_cmplt_epi32_mask(ix, _mm512_set1_epi32(p->w));
            __m512i index = _mm512_maskz_add_epi32(valid, _mm512_mullo_epi32(iy, _mm512_set1_epi32(p->w)), ix);
            _mm512_storeu_si512(d->index, index);
            d->gather_mask = valid;
            // Runs: lanes whose index - S*lane agree are one masked load (they need not be adjacent); at stride 2 two
            // loads and a permute. Other strides gather.
            __m512i start = _mm512_sub_epi32(index, _mm512_mullo_epi32(lane, _mm512_set1_epi32(p->stride)));
            int32_t starts[16];
            _mm512_storeu_si512(starts, start);
            int runs = 0;
            for (__mmask16 left = valid; left; runs++) {
                if (runs == RUNS || p->stride > 2) {
                    runs = -1;  // gather
                    break;
                }
                int first = __builtin_ctz(left);
                d->start[runs] = starts[first];
                d->mask[runs] = left & _mm512_cmpeq_epi32_mask(start, _mm512_set1_epi32(starts[first]));
                left &= (__mmask16)~d->mask[runs];
                for (int l = 0; l < 16; l++)
                    if (d->mask[runs] >> l & 1) {
                        if (l < 8) d->even_lo[runs] |= (__mmask16)(1u << 2 * l);
                        else d->even_hi[runs] |= (__mmask16)(1u << (2 * l - 16));
                    }
            }
            d->runs = runs;
        }
    }
}

// B rows [k0, k0 + kc) of the first vecs vectors of the panel that ``plan`` describes, into dst ([k][NR]). Along K
// the tap changes every C rows; within a tap each vector reads every channel plane the same way, with the plan's
// loads in registers.
IE_HIDDEN IE_AVX512 void pack_b(const ie_conv *p, const float *x, const lane_reads *plan, int vecs, int64_t k0,
                                int kc, float *dst) {
    const int64_t plane = (int64_t)p->h * p->w;
    for (int64_t k = k0; k < k0 + kc;) {
        int tap = (int)(k / p->c), c = (int)(k % p->c);
        int count = (int)(k0 + kc - k) < p->c - c ? (int)(k0 + kc - k) : p->c - c;  // channels of this tap
        for (int v = 0; v < vecs; v++) {
            const lane_reads *d = &plan[tap * VECS + v];
            float *out = dst + (k - k0) * NR + v * 16;
            const float *src = x + c * plane;
            __mmask16 m0 = d->mask[0], m1 = d->mask[1];
            const float *s0 = src + d->start[0], *s1 = src + d->start[1];
            if (d->runs < 0) {
                __m512i index = _mm512_loadu_si512(d->index);
                for (int i = 0; i < count; i++, out += NR, src += plane)
                    _mm512_store_ps(out, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), d->gather_mask, index, src, 4));
            } else if (p->stride == 2) {
                const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                for (int i = 0; i < count; i++, out += NR, src += plane) {
                    __m512 val = _mm512_setzero_ps();
                    for (int r = 0; r < d->runs; r++) {
                        const float *at = src + d->start[r];
                        __m512 run = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(d->even_lo[r], at), even,
                                                            _mm512_maskz_loadu_ps(d->even_hi[r], at + 16));
                        val = _mm512_mask_mov_ps(val, d->mask[r], run);
                    }
                    _mm512_store_ps(out, val);
                }
            } else {
                switch (d->runs) {
                case 0:
                    for (int i = 0; i < count; i++, out += NR) _mm512_store_ps(out, _mm512_setzero_ps());
                    break;
                case 1:  // the common case: 16 pixels of one output row inside the image, or the edge of one
                    for (int i = 0; i < count; i++, out += NR, s0 += plane)
                        _mm512_store_ps(out, _mm512_maskz_loadu_ps(m0, s0));
                    break;
                case 2:
                    for (int i = 0; i < count; i++, out += NR, s0 += plane, s1 += plane)
                        _mm512_store_ps(out, _mm512_mask_loadu_ps(_mm512_maskz_loadu_ps(m0, s0), m1, s1));
                    break;
                default:
                    for (int i = 0; i < count; i++, out += NR, src += plane) {
                        __m512 val = _mm512_setzero_ps();
                        for (int r = 0; r < d->runs; r++)
                            val = _mm512_mask_loadu_ps(val, d->mask[r], src + d->start[r]);
                        _mm512_store_ps(out, val);
                    }
                }
            }
        }
        k += count;
    }
}

// C[0:rows, 0:16*vecs] (row stride ldc, column vector v under mask[v]) = (first ? 0 : C) + A panel * B panel over
// kc; with last, + bias and ReLU. vecs is a constant wherever this is inlined (micro_kernel's switch), so the
// accumulators are registers and a narrow panel at the right edge costs what its vectors cost.
IE_AVX512 static inline __attribute__((always_inline)) void micro_kernel_vecs(
    const int vecs, int kc, const float *restrict a, const float *restrict b, float *c, int64_t ldc, int rows,
    const __mmask16 *mask, int first, int last, const float *bias, int relu) {
    __m512 acc[MR][VECS];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_setzero_ps();
    // The next A panel's block of C (the caller's next call, MR rows down): its lines come in while this one
    // multiplies, where a store missing the cache would wait for them. Whole forward, one core: 125 -> 115 ms.
#pragma GCC unroll 16
    for (int r = MR; r < 2 * MR; r++) {
        __builtin_prefetch(c + r * ldc, 1, 3);
        __builtin_prefetch(c + r * ldc + 16 * vecs - 1, 1, 3);
    }
    for (int k = 0; k < kc; k++, a += MR, b += NR) {
        _mm_prefetch((const char *)(a + PREFETCH_K * MR), _MM_HINT_T0);
        __m512 bv[VECS];
#pragma GCC unroll 4
        for (int v = 0; v < vecs; v++) bv[v] = _mm512_load_ps(b + 16 * v);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            __m512 ar = _mm512_set1_ps(a[r]);
#pragma GCC unroll 4
            for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
        }
    }
    const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        if (r >= rows) break;
        float *row = c + r * ldc;
        __m512 bias_r = _mm512_set1_ps(bias[r]);
#pragma GCC unroll 4
        for (int v = 0; v < vecs; v++) {
            __m512 sum = acc[r][v];
            if (!first) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(mask[v], row + 16 * v));
            if (last) {
                sum = _mm512_add_ps(sum, bias_r);
                if (relu) sum = _mm512_max_ps(zero, sum);  // max(0, v) is v when v is NaN, as np.maximum has it
            }
            _mm512_mask_storeu_ps(row + 16 * v, mask[v], sum);
        }
    }
}

IE_HIDDEN IE_AVX512 void micro_kernel(int vecs, int kc, const float *a, const float *b, float *c, int64_t ldc,
                                      int rows, const __mmask16 *mask, int first, int last, const float *bias,
                                      int relu) {
    switch (vecs) {
    case 1: micro_kernel_vecs(1, kc, a, b, c, ldc, rows, mask, first, last, bias, relu); break;
    case 2: micro_kernel_vecs(2, kc, a, b, c, ldc, rows, mask, first, last, bias, relu); break;
    default: micro_kernel_vecs(VECS, kc, a, b, c, ldc, rows, mask, first, last, bias, relu);
    }
}

static __mmask16 lanes_below(int n) { return n >= 16 ? 0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

IE_AVX512 static void conv_task(void *arg, int task) {
    const conv_job *job = arg;
    const ie_conv *p = job->p;
    int chunk = task % job->m_chunks, block = task / job->m_chunks % job->blocks;
    int image = task / job->m_chunks / job->blocks;
    int n_out = p->ho * p->wo, mp0 = job->m_panels * chunk / job->m_chunks;
    int mp1 = job->m_panels * (chunk + 1) / job->m_chunks;
    float *b = thread_scratch(KC * NR * sizeof(float) + (size_t)p->kh * p->kw * VECS * sizeof(lane_reads));
    lane_reads *plan = (lane_reads *)(b + KC * NR);
    const float *x = p->x + image * p->x_image_stride;
    const int kb = k_block(job->k);
    for (int panel = block * job->panel_block; panel < (block + 1) * job->panel_block && panel < job->panels;
         panel++) {
        int n0 = panel * NR;
        float *y = p->y + image * p->y_image_stride + n0;
        __mmask16 mask[VECS];
        int vecs = 0;  // vectors with a pixel in them
        for (int v = 0; v < VECS; v++) vecs += (mask[v] = lanes_below(n_out - n0 - 16 * v)) != 0;
        plan_panel(p, p->stride, n0, plan);
        for (int64_t k0 = 0; k0 < job->k; k0 += kb) {
            int kc = job->k - k0 < kb ? (int)(job->k - k0) : kb;
            pack_b(p, x, plan, vecs, k0, kc, b);
            const float *a = p->weights + k0 * job->m_panels * MR + (int64_t)mp0 * kc * MR;
            for (int mp = mp0; mp < mp1; mp++, a += kc * MR) {
                int rows = p->o - mp * MR < MR ? p->o - mp * MR : MR;
                micro_kernel(vecs, kc, a, b, y + (int64_t)mp * MR * n_out, n_out, rows, mask, k0 == 0,
                             k0 + kc == job->k, p->bias + mp * MR, p->relu);
            }
        }
    }
}

void ie_conv2d(const ie_conv *p, int threads) {
    conv_job job = {.p = p, .k = (int64_t)p->kh * p->kw * p->c, .panels = (p->ho * p->wo + NR - 1) / NR,
                    .m_panels = (p->o + MR - 1) / MR};
    // Few tasks: M split too until there are 8 a thread. The 17x17 layers have 10 panels (the last one pixel): 10
    // tasks on 2 threads take 5 panels' time where 4.5 would do, while a chunk repeats only the packing of its B
    // panel.
    split_tasks(p->images, job.panels, job.m_panels, threads, 8 * threads, &job.panel_block, &job.blocks,
                &job.m_chunks);
    ie_parallel(p->images * job.blocks * job.m_chunks, threads, conv_task, &job);
}
