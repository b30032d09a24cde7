// wgmma_emu.h: cuda_src/wgmma.cuh for the CPU emulator (included by tf32_emu.h after f16_emu.h).
//
// The descriptor here is the tile's start address / 16 and, for 128-byte and 32-byte rows, the real descriptor's
// mode bits (the kernel only adds byte offsets / 16 to it); the layout is the one the real descriptors name: K-major rows of 64 bytes, 8-row groups
// 512 bytes apart, 64-byte swizzle (bits [4, 6) XOR bits [7, 9) of the address), or rows of 128 bytes, 8-row groups
// 1024 bytes apart, 128-byte swizzle (bits [4, 7) XOR bits [7, 10)), or rows of 32 bytes, 8-row groups 256 bytes
// apart, 32-byte swizzle (bit 4 XOR bit 7). Element addresses are computed as the PTX ISA
// defines those modes, on the address bits, independently of the kernel's swizzle, so a tile stored in another
// layout gives wrong sums. Each thread computes its own accumulators (the ISA's D fragment layout, wgmma.cuh's
// header) from shared memory, which no thread writes between the barrier before a stage's wgmma and the barrier
// after it; fences, commit and wait are no-ops.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace wgmma {
inline unsigned long long desc_k_major_64b(const void* tile) { return reinterpret_cast<uintptr_t>(tile) >> 4; }
constexpr unsigned long long DESC_32_BYTES = 32 >> 4;
// Rows of 128 bytes in the 128-byte swizzle: bit 62 set, as the real descriptor's mode 1.
constexpr unsigned long long DESC_128B = 1ull << 62;
inline unsigned long long desc_k_major_128b(const void* tile) {
    return reinterpret_cast<uintptr_t>(tile) >> 4 | DESC_128B;
}
// Rows of 32 bytes in the 32-byte swizzle: bits 62 and 63 set, as the real descriptor's mode 3.
constexpr unsigned long long DESC_32B = 3ull << 62;
inline unsigned long long desc_k_major_32b(const void* tile) {
    return reinterpret_cast<uintptr_t>(tile) >> 4 | DESC_32B;
}

inline void fence() {}
inline void commit() {}
template <int N>
void wait() {}
inline void fence_proxy_async() {}
template <int N, bool INC>
void max_registers() {}
template <int R>
void fence_registers(float (&)[R]) {}
template <int R>
void fence_registers(int (&)[R]) {}


// Where byte `kbyte` of row `row` of the tile lives. 128-byte rows: bits [4, 7) XOR bits [7, 10) of the address,
// whatever row of the 1024-byte pattern the tile starts at. 32-byte rows: bit 4 XOR bit 7.
inline const unsigned char* element(unsigned long long desc, int row, int kbyte) {
    if ((desc & DESC_32B) == DESC_32B) {
        const uintptr_t logical = ((desc & ~DESC_32B) << 4) + row * 32 + kbyte;
        return reinterpret_cast<const unsigned char*>(logical ^ ((logical >> 7 & 1) << 4));
    }
    if (desc & DESC_128B) {
        const uintptr_t logical = ((desc & ~DESC_128B) << 4) + row * 128 + kbyte;
        return reinterpret_cast<const unsigned char*>(logical ^ ((logical >> 7 & 7) << 4));
    }
    const uintptr_t logical = (desc << 4) + (row / 8) * 512 + (row % 8) * 64 + kbyte;
    return reinterpret_cast<const unsigned char*>(logical ^ ((logical >> 7 & 3) << 4));
}

inline float f16_at(unsigned long long desc, int row, int k) {
    uint16_t h;
    std::memcpy(&h, element(desc, row, 2 * k), 2);
    return f16::half_value(h);
}

// The tensor cores read the upper 19 bits of a .tf32 operand.
inline float tf32_at(unsigned long long desc, int row, int k) {
    unsigned u;
    std::memcpy(&u, element(desc, row, 4 * k), 4);
    u &= 0xffffe000u;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// An int8 operand (.s8), exact as a float.
inline float s8_at(unsigned long long desc, int row, int k) {
    return static_cast<float>(*reinterpret_cast<const signed char*>(element(desc, row, k)));
}

template <int N>
struct Mma {
    // D (64 x N) = A (64 x K) B (K x N) (+ D if accumulate), A[row][k] and B[n][k] read through `at` (a template
    // argument, so that it is inlined). A thread's N / 2 accumulators are rows g and g + 8 of its warp's 16 by N / 4
    // columns, so it reads those 2 rows and N / 4 columns once (each element is a float, its product with another
    // exact in double). Each sum runs over k in order, in double; the loop over a row's columns is innermost, where
    // the compiler can vectorize it. D: float (f32 sums) or int (.s32: the double sums of int8 products are exact
    // integers, added to d in int32 arithmetic, which wraps as the hardware's does).
    template <int K, float (*at)(unsigned long long, int, int), class D>
    static void run(D (&d)[N / 2], unsigned long long a, unsigned long long b, int accumulate) {
        const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        constexpr int C = N / 4;
        float rows[2][K], cols[K][C];
        double sums[2][C] = {};
        for (int r = 0; r < 2; ++r)
            for (int k = 0; k < K; ++k) rows[r][k] = at(a, 16 * warp + g + 8 * r, k);
        for (int c = 0; c < C; ++c)
            for (int k = 0; k < K; ++k) cols[k][c] = at(b, 8 * (c / 2) + 2 * t + c % 2, k);
        for (int k = 0; k < K; ++k)
            for (int r = 0; r < 2; ++r)
                for (int c = 0; c < C; ++c) sums[r][c] += static_cast<double>(rows[r][k]) * cols[k][c];
        for (int i = 0; i < N / 2; ++i) {  // accumulator i: row i % 4 / 2, column 8 (i / 4) + 2 t + i % 2
            const double sum = sums[i % 4 / 2][2 * (i / 4) + i % 2];
            if constexpr (std::is_same_v<D, int>)
                d[i] = static_cast<int>(static_cast<unsigned>(accumulate ? d[i] : 0) +
                                        static_cast<unsigned>(static_cast<int>(sum)));
            else
                d[i] = static_cast<float>(accumulate ? d[i] + sum : sum);
        }
    }
    static void f16(float (&d)[N / 2], unsigned long long a, unsigned long long b, int acc) {
        run<16, f16_at>(d, a, b, acc);
    }
    static void tf32(float (&d)[N / 2], unsigned long long a, unsigned long long b, int acc) {
        run<8, tf32_at>(d, a, b, acc);
    }
    static void s8(int (&d)[N / 2], unsigned long long a, unsigned long long b, int acc) {
        run<32, s8_at>(d, a, b, acc);
    }
};
}  // namespace wgmma

// mbarrier: the 64-bit word holds the arrivals a phase needs (bits 0-15), those still missing (16-31) and the
// phase (32). A wait yields to the other fibers until the phase of its parity has completed; a wait that no arrival
// can end (a deadlock) aborts the test process with a message instead of spinning forever.
namespace mbarrier {
inline void init(unsigned long long* bar, unsigned count) { *bar = count | (unsigned long long)count << 16; }
inline void arrive(unsigned long long* bar) {
    const unsigned long long count = *bar & 0xffff, missing = (*bar >> 16 & 0xffff) - 1, phase = *bar >> 32 & 1;
    *bar = missing ? count | missing << 16 | phase << 32 : count | count << 16 | (phase ^ 1) << 32;
}
inline bool try_wait(unsigned long long* bar, unsigned parity) { return (*bar >> 32 & 1) != parity; }
inline void wait(unsigned long long* bar, unsigned parity) {
    for (long spins = 0; !try_wait(bar, parity); ++spins) {
        if (spins > 10000000) {
            std::fprintf(stderr, "emulator: thread %u waits forever on an mbarrier (deadlock)\n", threadIdx.x);
            std::abort();
        }
        emu::yield();
    }
}
}  // namespace mbarrier

// cp.async lands at once here (tf32_emu.h), so the arrival it triggers is immediate.
namespace cp_async {
inline void arrive_on(unsigned long long* bar) { mbarrier::arrive(bar); }
}  // namespace cp_async

// TMA: the emulator's own tensor maps (cuda.tensor_maps.emulated writes them; the driver's format is opaque), whose
// copies land at once, so expect_tx is a plain arrival. Rows of 64 bytes land in the 64-byte swizzle (16-byte chunk
// bits [4, 6) XOR address bits [7, 9)), rows of 128 bytes in the 128-byte one (bits [4, 7) XOR bits [7, 10)); the
// destination is 1024-byte aligned.
namespace tma {
constexpr int MAP_BYTES = 128;  // as a CUtensorMap: cuda.tensor_maps pads the emulator's maps to it
struct EmuMap {  // cuda.tensor_maps.EMU_FORMAT
    unsigned long long magic, base;
    int kind, elem_bytes;           // 1: im2col (NHWC), 2: tiled (2-D)
    int dims[4];                    // im2col: C, W, H, N; tiled: K, rows
    long long strides[3];           // bytes between consecutive W, H, N (tiled: rows)
    int lower[2], upper[2];         // im2col: the window corners' box (W, H), upper from the far edge
    int box[2];                     // im2col: channels, pixels; tiled: K, rows
    int stride;                     // im2col: the corners' step (the conv's stride)
};
constexpr unsigned long long EMU_MAP_MAGIC = 0x70616d2d616d74ull;  // "tma-map"
inline const EmuMap& emu_map(const void* map) {
    const EmuMap& m = *static_cast<const EmuMap*>(map);
    if (m.magic != EMU_MAP_MAGIC) {
        std::fprintf(stderr, "emulator: a TMA load from something that is not an emulated tensor map\n");
        std::abort();
    }
    return m;
}
// Row `row` of `bytes` (64 or 128) of a box at dst, from src (zeros where null): its 16-byte chunks, swizzled.
inline void put_row(void* dst, int row, const unsigned char* src, int bytes) {
    if (bytes != 64 && bytes != 128) {
        std::fprintf(stderr, "emulator: TMA boxes of 64- or 128-byte rows only\n");
        std::abort();
    }
    unsigned char* const out = static_cast<unsigned char*>(dst) + row * bytes;
    for (int j = 0; j < bytes / 16; ++j) {
        unsigned char* const chunk = out + 16 * (j ^ (bytes == 64 ? row >> 1 & 3 : row & 7));
        if (src)
            std::memcpy(chunk, src + 16 * j, 16);
        else
            std::memset(chunk, 0, 16);
    }
}
inline void arrive_expect_tx(unsigned long long* bar, unsigned) { mbarrier::arrive(bar); }
inline void load_im2col(void* dst, const void* map, int c, int w, int h, int n, int off_w, int off_h,
                        unsigned long long*) {
    const EmuMap& m = emu_map(map);
    const int bytes = m.box[0] * m.elem_bytes;
    for (int p = 0; p < m.box[1]; ++p) {  // corners W fastest, then H, then N, within the corners' box
        const int iw = w + off_w, ih = h + off_h;
        const bool inside = n < m.dims[3] && (unsigned)iw < (unsigned)m.dims[1] && (unsigned)ih < (unsigned)m.dims[2];
        const unsigned char* src = reinterpret_cast<const unsigned char*>(m.base) + n * m.strides[2] +
                                   ih * m.strides[1] + iw * m.strides[0] + (long long)c * m.elem_bytes;
        put_row(dst, p, inside ? src : nullptr, bytes);
        if ((w += m.stride) > m.dims[1] - 1 + m.upper[0]) {
            w = m.lower[0];
            if ((h += m.stride) > m.dims[2] - 1 + m.upper[1]) {
                h = m.lower[1];
                ++n;
            }
        }
    }
}
inline void load_tiled(void* dst, const void* map, int x, int y, unsigned long long*) {
    const EmuMap& m = emu_map(map);
    const int bytes = m.box[0] * m.elem_bytes;
    for (int r = 0; r < m.box[1]; ++r) {
        const bool inside = y + r < m.dims[1] && x < m.dims[0];  // whole rows: K is a multiple of the box's
        const unsigned char* src =
            reinterpret_cast<const unsigned char*>(m.base) + (y + r) * m.strides[0] + (long long)x * m.elem_bytes;
        put_row(dst, r, inside ? src : nullptr, bytes);
    }
}
}  // namespace tma
