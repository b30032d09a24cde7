// ffma_gemm.cuh: the FFMA main loop of the fp32 GEMM tiles, shared by conv.cu's implicit GEMM and winograd.cu's
// batched GEMM (their loaders and epilogues differ; the loop that multiplies is this one).
//
// A block computes a BM x BN tile of C = A B, a thread a TM x TN micro-tile of it in registers (acc), fed by 16-byte
// shared-memory reads: the thread's rows are TM/4 runs of 4 spaced BM/(TM/4) apart (columns likewise: BN/(TN/4)), so
// the 8 threads of a quarter warp read 32 consecutive words, free of bank conflicts. As[buf][k][m] and Bs[buf][k][n]
// hold two BK-deep stages: the caller's load(kt) brings stage kt's elements from global memory to registers and
// store(buf) puts them in stage buf, so the loads of stage kt + BK are in flight during the math of stage kt; one
// barrier per stage. The sum runs over k = k_begin, k_begin + 1, ..., k_end - 1 in that order, one fmaf each: every
// caller's results depend on that order (tests compare them bit for bit), so it must not change.
#pragma once

template <int BM, int BN, int BK, int TM, int TN, typename Load, typename Store>
__device__ __forceinline__ void ffma_main_loop(float (&acc)[TM][TN], float (&As)[2][BK][BM], float (&Bs)[2][BK][BN],
                                               int tx, int ty, int k_begin, int k_end, Load& load, Store& store) {
    constexpr int M_RUNS = TM / 4, N_RUNS = TN / 4;
    static_assert(TM % 4 == 0 && TN % 4 == 0, "micro-tiles are read as float4 runs");
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    load(k_begin);
    store(0);
    __syncthreads();
    int buf = 0;
    for (int kt = k_begin; kt < k_end; kt += BK) {
        const bool more = kt + BK < k_end;
        if (more) load(kt + BK);
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
#pragma unroll
            for (int run = 0; run < M_RUNS; ++run) {
                const float4 v = *reinterpret_cast<const float4*>(&As[buf][kk][run * (BM / M_RUNS) + ty * 4]);
                a[run * 4 + 0] = v.x; a[run * 4 + 1] = v.y; a[run * 4 + 2] = v.z; a[run * 4 + 3] = v.w;
            }
#pragma unroll
            for (int run = 0; run < N_RUNS; ++run) {
                const float4 v = *reinterpret_cast<const float4*>(&Bs[buf][kk][run * (BN / N_RUNS) + tx * 4]);
                b[run * 4 + 0] = v.x; b[run * 4 + 1] = v.y; b[run * 4 + 2] = v.z; b[run * 4 + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) store(buf ^ 1);
        __syncthreads();
        buf ^= 1;
    }
}
