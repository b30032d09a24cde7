// mma_emu.h: the warp-wide part of the emulated mma instructions (tf32_emu.h, f16_emu.h; include after emu.h).
//
// Every lane publishes its A and B registers, yields (so the whole block has published), computes its own four
// results from the warp's registers, and yields again before anyone publishes the next ones. Each precision supplies
// the product of A[row][k] and B[k][col] read from the published registers by its PTX ISA fragment layout.
#pragma once
#include <cstring>

namespace mma_emu {
inline unsigned lane_a[1024][4], lane_b[1024][2];

// D = A B + C for one m16n8kK mma; C and D in the layout of both precisions: C[row][col] in lane
// (row % 8) * 4 + col / 2, register 2 * (row >= 8) + col % 2. product(a, b, row, col, k) gets the warp's
// registers (a[lane][reg], b[lane][reg]) and returns A[row][k] * B[k][col] in double.
template <unsigned K, class Product>
void warp_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], Product product) {
    const unsigned me = threadIdx.x, warp0 = me & ~31u, lane = me & 31u;
    std::memcpy(lane_a[me], a, sizeof a);
    std::memcpy(lane_b[me], b, sizeof b);
    emu::yield();
    float out[4];
    for (int r = 0; r < 4; ++r) {
        const unsigned row = lane / 4 + 8 * (r / 2), col = 2 * (lane % 4) + r % 2;
        double sum = d[r];
        for (unsigned k = 0; k < K; ++k) sum += product(lane_a + warp0, lane_b + warp0, row, col, k);
        out[r] = (float)sum;
    }
    emu::yield();
    std::memcpy(d, out, sizeof out);
}
}  // namespace mma_emu
