// tf32_emu.h: the PTX helpers of cuda_src/conv_mma.cuh for the CPU emulator (include after emu.h): tf32:: and
// cp_async:: here, f16:: in f16_emu.h and wgmma:: in wgmma_emu.h (included at the end, so that one -include serves
// every tensor-core kernel).
//
// mma is warp-wide (mma_emu.h: publish, yield, compute, yield); each lane computes its four results from the warp's
// fragments by the PTX ISA layout of mma.m16n8k8 .tf32 ("Matrix Fragments for mma.m16n8k8"). The layout is written
// here from the ISA independently of the kernel, so a kernel that loads fragments in the wrong places gets wrong
// sums. cp.async copies at once (the wait is then trivially satisfied); the barrier that follows it in the kernel
// still orders.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "mma_emu.h"

namespace tf32 {
// cvt.rna.tf32.f32: keep 10 mantissa bits, round to nearest, ties away from zero (add half of the dropped range to
// the magnitude bits); NaN and infinity pass unchanged.
inline unsigned round(float v) {
    unsigned u;
    std::memcpy(&u, &v, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;
    return u & 0xffffe000u;
}

inline float as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    // A[row][k] sits in lane (row % 8) * 4 + k % 4, register (row >= 8) + 2 * (k >= 4);
    // B[k][col] in lane col * 4 + k % 4, register (k >= 4); C[row][col] in lane (row % 8) * 4 + col / 2.
    mma_emu::warp_mma<8>(d, a, b, [](const unsigned (*la)[4], const unsigned (*lb)[2], unsigned row, unsigned col,
                                     unsigned k) {
        const float av = as_float(la[(row % 8) * 4 + k % 4][(row >= 8) + 2 * (k >= 4)]);
        const float bv = as_float(lb[col * 4 + k % 4][k >= 4]);
        return (double)av * bv;
    });
}
}  // namespace tf32

namespace cp_async {
inline void copy4(float* dst, const float* src, bool valid) { *dst = valid ? *src : 0.f; }
inline void check_aligned16(const void* dst, const void* src);
inline void copy16(float* dst, const float* src) {
    check_aligned16(dst, src);
    std::memcpy(dst, src, 16);
}
// cp.async of 16 bytes needs both addresses 16-byte aligned: the GPU stops with "misaligned address" otherwise.
inline void check_aligned16(const void* dst, const void* src) {
    if ((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src)) & 15) {
        std::fprintf(stderr, "emulator: cp.async of 16 bytes from %p to %p: misaligned address\n", src, dst);
        std::abort();
    }
}
inline void copy16_or_zero(void* dst, const void* src, bool valid) {
    check_aligned16(dst, src);
    if (valid)
        std::memcpy(dst, src, 16);
    else
        std::memset(dst, 0, 16);
}
inline void commit() {}
template <int N>
void wait() {}
}  // namespace cp_async

#include "f16_emu.h"
#include "wgmma_emu.h"
