// emu.h: run the engine's CUDA kernels on the CPU, for tests on machines without a GPU (CI).
//
// Compiled with g++ ahead of cuda_src/*.cu (g++ -include emu.h). Each CUDA thread of a block is a fiber
// (ucontext); blocks run one after another. __syncthreads and warp shuffles yield to a scheduler that resumes every
// live fiber once per round. __syncthreads waits until every live thread of the block has arrived (emu::block_sync),
// a shuffle until its warp's 32 lanes have (emu::warp_sync); the warp-wide mma and ldmatrix yield once, so a warp's
// lanes must run them in step, which CUDA requires anyway. Shared memory is a function-static array (one block at a
// time). No inline PTX: timing.cu is not emulated.
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>
using std::max;
using std::min;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline dim3 gridDim, blockDim, blockIdx, threadIdx;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __syncthreads() emu::block_sync()
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
template <class T>
T __ldg(const T* p) { return *p; }
inline float __uint_as_float(unsigned u) {
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}
template <class T>
T __ldcg(const T* p) { return *p; }
// Blocks run one after another, so memory is always coherent and an atomic is a plain read-modify-write.
inline void __threadfence() {}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}

namespace emu {
struct Fiber {
    ucontext_t ctx;
    bool done;
};
inline ucontext_t scheduler;
inline Fiber* current;
inline std::vector<Fiber> fibers;
inline std::vector<std::vector<char>> stacks;
inline std::function<void()> kernel;
inline float lanes[1024];

inline void yield() { swapcontext(&current->ctx, &scheduler); }

// __syncthreads: each thread yields until every live thread of the block has arrived. Threads in step arrive in the
// same round and yield exactly once, as a bare yield would; a warp that took more warp-wide steps than the others
// before the barrier (conv_input_nhwc.cu's tensor-core kernel: warps with more m tiles) is waited for. A thread that
// has exited counts as arrived, as on the GPU.
inline int block_live, block_arrived, block_generation;
// Opens the barrier once the threads waiting at it are all the live ones.
inline void block_release_if_all() {
    if (block_arrived > 0 && block_arrived >= block_live) {
        block_arrived = 0;
        ++block_generation;
    }
}
inline void block_sync() {
    const int generation = block_generation;
    ++block_arrived;
    block_release_if_all();
    do yield();
    while (block_generation == generation);
}
inline void fiber_main() {
    kernel();
    current->done = true;
    --block_live;
    block_release_if_all();
}

// Run f() as a grid of blocks of block.x threads (1-D blocks, as every kernel of the engine uses).
template <class F>
void launch(dim3 grid, dim3 block, F f) {
    gridDim = grid;
    blockDim = block;
    kernel = f;
    fibers.resize(block.x);
    while (stacks.size() < block.x) stacks.emplace_back(1 << 16);
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = {x, y, z};
                block_live = static_cast<int>(block.x);
                block_arrived = 0;
                for (unsigned t = 0; t < block.x; ++t) {
                    Fiber& fb = fibers[t];
                    fb.done = false;
                    getcontext(&fb.ctx);
                    fb.ctx.uc_stack.ss_sp = stacks[t].data();
                    fb.ctx.uc_stack.ss_size = stacks[t].size();
                    fb.ctx.uc_link = &scheduler;
                    makecontext(&fb.ctx, fiber_main, 0);
                }
                for (bool alive = true; alive;) {
                    alive = false;
                    for (unsigned t = 0; t < block.x; ++t) {
                        if (fibers[t].done) continue;
                        threadIdx = {t, 0, 0};
                        current = &fibers[t];
                        swapcontext(&scheduler, &fibers[t].ctx);
                        alive = true;
                    }
                }
            }
}

// Converts a void* argument to whichever pointer type the kernel parameter has.
struct Ptr {
    void* p;
    template <class T>
    operator T*() const { return static_cast<T*>(p); }
};
}  // namespace emu

namespace emu {
// The 32 lanes of a warp meet here: each yields until all have arrived. One yield alone (enough where the block's
// threads run in step, as __syncthreads, itself one yield, needs) would not do after an mbarrier wait: lanes leave it
// in different scheduler rounds, and so reach the next shuffle in different rounds too. Lanes in step still yield
// exactly once here, so the rounds of the rest of the block stay as they were.
inline int warp_arrived[32], warp_generation[32];
inline void warp_sync() {
    const unsigned w = threadIdx.x / 32;
    const int generation = warp_generation[w];
    if (++warp_arrived[w] == 32) {
        warp_arrived[w] = 0;
        ++warp_generation[w];
    }
    do yield();
    while (warp_generation[w] == generation);
}
}  // namespace emu

// Every lane of the warp takes part (the full mask: all the engine's shuffles).
namespace emu {
template <class T>
T shfl_xor(T* lanes, T v, int mask) {
    const unsigned t = threadIdx.x;
    lanes[t] = v;
    emu::warp_sync();
    const T r = lanes[(t & ~31u) | ((t & 31u) ^ static_cast<unsigned>(mask))];
    emu::warp_sync();
    return r;
}
inline double lanes_double[1024];
}  // namespace emu
inline float __shfl_xor_sync(unsigned, float v, int mask) { return emu::shfl_xor(emu::lanes, v, mask); }
inline double __shfl_xor_sync(unsigned, double v, int mask) { return emu::shfl_xor(emu::lanes_double, v, mask); }
