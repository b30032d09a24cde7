// wgmma_emu.h: cuda_src/wgmma.cuh for the CPU emulator (included by tf32_emu.h after f16_emu.h).
//
// The descriptor here is the tile's start address / 16 alone (the kernel only adds byte offsets / 16 to it); the
// layout is the one the real descriptors name: K-major rows of 64 bytes, 8-row groups 512 bytes apart, 64-byte
// swizzle. Element addresses are computed as the PTX ISA defines that mode, on the address bits (bits [4, 6) XOR bits
// [7, 9)), independently of the kernel's swizzled(), so a tile stored in another layout gives wrong sums. Each thread
// computes its own accumulators (the ISA's D fragment layout, wgmma.cuh's header) from shared memory, which no thread
// writes between the barrier before a stage's wgmma and the barrier after it; fences, commit and wait are no-ops.
#pragma once
#include <cstdint>
#include <cstring>

namespace wgmma {
inline unsigned long long desc_k_major_64b(const void* tile) { return reinterpret_cast<uintptr_t>(tile) >> 4; }
constexpr unsigned long long DESC_32_BYTES = 32 >> 4;

inline void fence() {}
inline void commit() {}
template <int N>
void wait() {}
inline void fence_proxy_async() {}
template <int R>
void fence_registers(float (&)[R]) {}

// Where byte `kbyte` of row `row` of the tile lives.
inline const unsigned char* element(unsigned long long desc, int row, int kbyte) {
    const uintptr_t logical = (desc << 4) + (row / 8) * 512 + (row % 8) * 64 + kbyte;
    return reinterpret_cast<const unsigned char*>(logical ^ ((logical >> 7 & 3) << 4));
}

inline double f16_at(unsigned long long desc, int row, int k) {
    uint16_t h;
    std::memcpy(&h, element(desc, row, 2 * k), 2);
    return f16::half_value(h);
}

// The tensor cores read the upper 19 bits of a .tf32 operand.
inline double tf32_at(unsigned long long desc, int row, int k) {
    unsigned u;
    std::memcpy(&u, element(desc, row, 4 * k), 4);
    u &= 0xffffe000u;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

template <int N>
struct Mma {
    // D (64 x N) = A (64 x K) B (K x N) (+ D if accumulate), A[row][k] and B[n][k] read through `at`.
    template <class At>
    static void run(float (&d)[N / 2], unsigned long long a, unsigned long long b, int accumulate, int k_total, At at) {
        const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        for (int i = 0; i < N / 2; ++i) {
            const int row = 16 * warp + g + 8 * (i % 4 / 2), col = 8 * (i / 4) + 2 * t + i % 2;
            double sum = 0.0;
            for (int k = 0; k < k_total; ++k) sum += at(a, row, k) * at(b, col, k);
            d[i] = static_cast<float>(accumulate ? d[i] + sum : sum);
        }
    }
    static void f16(float (&d)[N / 2], unsigned long long a, unsigned long long b, int acc) {
        run(d, a, b, acc, 16, f16_at);
    }
    static void tf32(float (&d)[N / 2], unsigned long long a, unsigned long long b, int acc) {
        run(d, a, b, acc, 8, tf32_at);
    }
};
}  // namespace wgmma
