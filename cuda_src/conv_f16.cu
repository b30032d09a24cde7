// conv_f16.cu: 2-D convolution + bias + ReLU as an implicit GEMM on the tensor cores (fp16 multiply, fp32 sum).
//
// Same math, arguments, launch shape, tile names and split-K workspace as conv_tf32.cu (`--precision fp16`).
// Memory stays float32; only the products are fp16: each operand is rounded to IEEE binary16 (to nearest, ties to
// even; below 2^-14 to the subnormal grid, from 65520 up to infinity) as it becomes an mma fragment, products are
// exact in the fp32 sum. fp16 keeps 10 mantissa bits, as TF32, so the error is ~1e-3 relative, as long as the
// operands stay in fp16's range (|v| < 65504; activations and weights of a BN-folded Inception-V3 are far below).
//
// Idea: the implicit GEMM of conv_mma.cuh with the F16Mma operand policy: mma.m16n8k16 .f16 (half the mma of
// k8 TF32 steps), cvt.rn.f16x2.f32 packing two operands per instruction (half the conversions), fragment rows and
// columns permuted so that 8-byte shared loads feed two registers (half the shared-load instructions), shared rows
// padded by 4 floats (conflict-free, see F16Mma). Smaller padding leaves room for a 4th stage in the 64x64 tile.
//
// Launch: conv_f16_<KH>x<KW>_<BM>x<BN>: block 256, grid (ceil(N/BN), ceil(M/BM), splits), static shared memory
//         only (no attribute to set). Tiles: 128x128 (BK 16, warp 64x32, 2 stages, 33 KB),
//         128x64 (BK 16, warp 32x32, 3 stages, 38 KB), 64x64 (BK 16, warp 32x16, 4 stages, 34 KB).
#include "conv_mma.cuh"

#define CONV_F16_KERNEL(KH, KW, BM, BN, BK, WARPS_M, STAGES, MIN_BLOCKS) \
    CONV_MMA_KERNEL(conv_f16, F16Mma, KH, KW, BM, BN, BK, WARPS_M, STAGES, MIN_BLOCKS)

#define CONV_F16_TILES(KH, KW)                          \
    CONV_F16_KERNEL(KH, KW, 128, 128, 16, 2, 2, 2)      \
    CONV_F16_KERNEL(KH, KW, 128, 64, 16, 4, 3, 2)       \
    CONV_F16_KERNEL(KH, KW, 64, 64, 16, 2, 4, 3)

IE_FOR_EACH_CONV_SHAPE(CONV_F16_TILES)
