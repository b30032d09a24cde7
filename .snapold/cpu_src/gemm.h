// gemm.h: what conv.c's implicit GEMM shares with winograd.c: the blocking, the B-panel planner and packer, the
// micro-kernel and the per-thread work memory (conv.c says how each works). Internal to the library.
#pragma once
#include "ie_cpu.h"

#include <immintrin.h>
#include <stddef.h>

#define IE_HIDDEN __attribute__((visibility("hidden")))

#define MR 8
#define VECS 2  // 16-float vectors a B row
#define NR (16 * VECS)
#define KC 192
#define RUNS 4          // masked loads a vector may take before a gather is cheaper
// The micro-kernel prefetches A this many k steps ahead. A forward reads 95 MB of weights, three times the L3, so
// each layer's A comes from memory at its first B panel; 160 steps (5 KB) cover that latency where the hardware
// prefetchers alone did not: whole forward 67.1 -> 63.1 ms on one core, 35.0 -> 31.7 ms on two, against 16 steps.
#define PREFETCH_K 160

// How one 16-pixel vector of a B panel reads one tap from a channel plane: lane l takes plane[start[r] + S*l] for
// the run r whose mask has bit l (stride S = 1 or 2; runs = -1: gather plane[index[l]] under gather_mask); lanes
// in no run are zero.
typedef struct {
    int32_t index[16];
    int32_t start[RUNS];
    __mmask16 mask[RUNS];
    __mmask16 even_lo[RUNS], even_hi[RUNS];  // stride 2: the 32 floats from start[r] that lanes of run r read
    __mmask16 gather_mask;
    int32_t runs;
} lane_reads;

// Floats of the packed weights of an m x k matrix (conv.c's ie_pack_weights).
int64_t ie_packed_weights_floats(int m, int64_t k);
// K cut into equal blocks of at most KC rows; the packed weights and every loop over K use the same cut.
IE_HIDDEN int k_block(int64_t k);
// At least ``bytes`` of 64-byte-aligned memory of the calling thread, valid until its next call.
IE_HIDDEN void *thread_scratch(size_t bytes);
// plan[tap * VECS + v]: how vector v of the B panel at output pixel n0 reads each tap of p, whose stride is
// stride_h down the rows and p->stride along them (winograd.c's tiles: the two can differ).
IE_HIDDEN IE_AVX512 void plan_panel(const ie_conv *p, int stride_h, int n0, lane_reads *plan);
// B rows [k0, k0 + kc) ((tap, c) order) of the panel that ``plan`` describes, its first vecs vectors, into dst
// ([k][NR]).
IE_HIDDEN IE_AVX512 void pack_b(const ie_conv *p, const float *x, const lane_reads *plan, int vecs, int64_t k0,
                                int kc, float *dst);
// How a layer's GEMM is cut into tasks (conv.c's and winograd.c's): per image, runs of up to 8 adjacent B panels a
// task, about 8 tasks a thread (threads on neighbouring panels would share the cache lines at the panels' edges in
// every row of C); where that leaves fewer than min_tasks tasks, the A panels are split too, in chunks of at least
// 4 A panels, doubling until there are. Sets *panel_block (B panels a task), *blocks (tasks an image and A chunk)
// and *m_chunks; the tasks number images * blocks * m_chunks.
static inline void split_tasks(int images, int panels, int m_panels, int threads, int min_tasks, int *panel_block,
                               int *blocks, int *m_chunks) {
    int pb = images * panels / (8 * threads);
    pb = pb < 1 ? 1 : pb > 8 ? 8 : pb;
    *panel_block = pb;
    *blocks = (panels + pb - 1) / pb;
    *m_chunks = 1;
    while (images * *blocks * *m_chunks < min_tasks && m_panels >= 8 * *m_chunks) *m_chunks *= 2;
}
// C[0:rows, 0:16*vecs] = (first ? 0 : C) + A panel ([kc][MR]) * B panel ([kc][NR]); with last, + bias and ReLU.
IE_HIDDEN IE_AVX512 void micro_kernel(int vecs, int kc, const float *a, const float *b, float *c, int64_t ldc,
                                      int rows, const __mmask16 *mask, int first, int last, const float *bias,
                                      int relu);
