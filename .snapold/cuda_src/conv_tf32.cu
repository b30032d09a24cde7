// conv_tf32.cu: 2-D convolution + bias + ReLU as an implicit GEMM on the tensor cores (TF32 multiply, fp32 sum).
//
// Same math, arguments, launch shape and split-K workspace as conv.cu (`--precision tf32`): y[b, m, oh, ow] =
// relu(bias[m] + sum_{c, r, s} w[m, c, r, s] * x[b, c, oh*S - PH + r, ow*S - PW + s]) for kernels 1x1, 3x3, 5x5,
// 1x7, 7x1, 1x3, 3x1, stride 1 or 2, padding 0..3. Memory stays float32; only the products are TF32 (operands
// rounded to 10 mantissa bits by cvt.rna), accumulation is fp32, so expect a relative error of ~1e-3, not ~1e-6.
//
// Idea: the implicit GEMM of conv_mma.cuh (cp.async ring of fp32 tiles, split-K as conv.cu) with the Tf32Mma
// operand policy: mma.m16n8k8 .tf32, operands rounded by cvt.rna.tf32 as they become fragments, shared rows
// padded by 8 floats (conflict-free fragment loads). conv_f16.cu is the same GEMM with fp16 operands.
//
// Launch: conv_tf32_<KH>x<KW>_<BM>x<BN>: block 256, grid (ceil(N/BN), ceil(M/BM), splits), static shared memory
//         only (<= 40 KB, no attribute to set). Tiles: 128x128 (BK 16, warp 64x32, 2 stages, 34 KB),
//         128x64 (BK 16, warp 32x32, 3 stages, 39 KB), 64x64 (BK 16, warp 32x16, 3 stages, 27 KB).
#include "conv_mma.cuh"

#define CONV_TF32_KERNEL(KH, KW, BM, BN, BK, WARPS_M, STAGES, MIN_BLOCKS) \
    CONV_MMA_KERNEL(conv_tf32, Tf32Mma, KH, KW, BM, BN, BK, WARPS_M, STAGES, MIN_BLOCKS)

#define CONV_TF32_TILES(KH, KW)                          \
    CONV_TF32_KERNEL(KH, KW, 128, 128, 16, 2, 2, 2)      \
    CONV_TF32_KERNEL(KH, KW, 128, 64, 16, 4, 3, 2)       \
    CONV_TF32_KERNEL(KH, KW, 64, 64, 16, 2, 3, 3)

IE_FOR_EACH_CONV_SHAPE(CONV_TF32_TILES)
