// wgmma_descriptor_probe.cu: a fact conv_nhwc_halo.cu's halo tiles rest on, checked on the GPU. A K-major wgmma operand
// in the 128-byte (64-byte) swizzle whose descriptor starts j rows of 128 (64) bytes past a 1024-byte boundary: is
// its row i the buffer's row j + i, swizzled by the address (bits [4, 7) XOR bits [7, 10); [4, 6) XOR [7, 9)), with
// the descriptor's base-offset field (bits 49-51) left 0? Or does it need base offset = the pattern row of the start?
// One warpgroup multiplies rows j .. j + 63 of an A buffer by an 8-row B (m64n8k8 tf32) for j = 0 .. 11, both ways,
// and compares with the product on the CPU. On the H100 (2026-11-22): every j matches with base offset 0, and none
// with base offset set (docs/performance-log.md, round 12).
//
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/probe scripts/wgmma_descriptor_probe.cu && /tmp/probe
#include <cstdio>
#include <cmath>
template <int ROWB>
__global__ void probe(const float* a_g, const float* b_g, float* d_g, int start_row, int base_offset) {
    constexpr int RF = ROWB / 4, CH = ROWB / 16;  // floats and 16-byte chunks a row
    __shared__ __align__(1024) float abuf[80 * RF];
    __shared__ __align__(1024) float bbuf[8 * RF];
    const int tid = threadIdx.x;
    for (int i = tid; i < 80 * RF; i += 128) {
        const int row = i / RF, col = i % RF, chunk = col / 4, e = col % 4;
        abuf[row * RF + ((chunk ^ (row * ROWB / 128 & (CH - 1))) * 4) + e] = a_g[i];
    }
    for (int i = tid; i < 8 * RF; i += 128) {
        const int row = i / RF, col = i % RF, chunk = col / 4, e = col % 4;
        bbuf[row * RF + ((chunk ^ (row * ROWB / 128 & (CH - 1))) * 4) + e] = b_g[i];
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const unsigned aa = static_cast<unsigned>(__cvta_generic_to_shared(abuf + start_row * RF));
    const unsigned ba = static_cast<unsigned>(__cvta_generic_to_shared(bbuf));
    const unsigned long long mode = ROWB == 128 ? 1ull : 2ull, sbo = 8 * ROWB / 16;
    unsigned long long da = (unsigned long long)((aa & 0x3FFFF) >> 4) | 1ull << 16 | sbo << 32 | mode << 62 |
                            (unsigned long long)base_offset << 49;
    unsigned long long db = (unsigned long long)((ba & 0x3FFFF) >> 4) | 1ull << 16 | sbo << 32 | mode << 62;
    float d[4];
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    for (int kk = 0; kk < ROWB / 32; ++kk) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\nwgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 "
                     "{%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "l"(da + kk * 2), "l"(db + kk * 2), "r"(kk));
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) d_g[(16 * warp + g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
}
template <int ROWB>
int run(float* a, float* b, float* d) {
    constexpr int RF = ROWB / 4;
    for (int start = 0; start < 12; ++start)
        for (int bo = 0; bo < 2; ++bo) {
            const int base = bo ? (start * ROWB / 128 & 7) : 0;
            if (bo && base == 0) continue;
            probe<ROWB><<<1, 128>>>(a, b, d, start, base);
            cudaError_t e = cudaDeviceSynchronize();
            if (e != cudaSuccess) {
                printf("%d-byte rows, start %d base %d: %s\n", ROWB, start, base, cudaGetErrorString(e));
                return 1;
            }
            double err = 0;
            for (int r = 0; r < 64; ++r)
                for (int n = 0; n < 8; ++n) {
                    double s = 0;
                    for (int k = 0; k < RF; ++k) s += a[(start + r) * RF + k] * b[n * RF + k];
                    err = fmax(err, fabs(s - d[r * 8 + n]));
                }
            printf("%3d-byte rows, start row %2d base_offset %d: max err %g %s\n", ROWB, start, base, err,
                   err < 1e-3 ? "MATCH" : "differs");
        }
    return 0;
}
int main() {
    float *a, *b, *d;
    cudaMallocManaged(&a, 80 * 32 * 4);
    cudaMallocManaged(&b, 8 * 32 * 4);
    cudaMallocManaged(&d, 64 * 8 * 4);
    for (int i = 0; i < 80 * 32; ++i) a[i] = (float)((i * 7 + 3) % 13 - 6);
    for (int i = 0; i < 8 * 32; ++i) b[i] = (float)((i * 5 + 1) % 7 - 3);
    return run<128>(a, b, d) || run<64>(a, b, d);
}
