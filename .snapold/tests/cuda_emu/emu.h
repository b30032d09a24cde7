// emu.h: run the engine's CUDA kernels on the CPU, for tests on machines without a GPU (CI).
//
// Compiled with g++ ahead of cuda_src/*.cu (g++ -include emu.h). Each CUDA thread of a block is a fiber (its own
// stack; see emu::switch_stack); blocks run one after another. __syncthreads and warp shuffles yield to a scheduler that resumes every
// live fiber once per round. __syncthreads waits until every live thread of the block has arrived (emu::block_sync),
// a shuffle until its warp's 32 lanes have (emu::warp_sync); the warp-wide mma and ldmatrix yield once, so a warp's
// lanes must run them in step, which CUDA requires anyway. Shared memory is a function-static array (one block at a
// time). No inline PTX: timing.cu is not emulated.
#pragma once
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
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
struct alignas(8) int2 {
    int x, y;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
template <class T>
T __ldg(const T* p) { return *p; }
inline unsigned __float_as_uint(float f) {
    unsigned u;
    __builtin_memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}
template <class T>
T __ldcg(const T* p) { return *p; }
// The explicitly rounded float32 operations (round to nearest even; the library compiles with -ffp-contract=off, so
// a product and a sum stay two roundings), and int -> float, rounded to nearest (cvtsi2ss under the default rounding
// mode).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __int2float_rn(int i) { return static_cast<float>(i); }
inline int __float2int_rn(float v) {
    const float r = std::nearbyint(v);
    if (r != r) return 0;
    if (r >= 2147483648.f) return 2147483647;
    if (r < -2147483648.f) return -2147483647 - 1;
    return static_cast<int>(r);
}
// The byte permute (selector nibbles 0..7: bytes of x, then y) and the per-byte signed maximum of the SIMD intrinsics.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long b = (static_cast<unsigned long long>(y) << 32) | x;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) r |= static_cast<unsigned>(b >> (8 * (s >> (4 * n) & 7)) & 0xFF) << (8 * n);
    return r;
}
inline unsigned __vmaxs4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) {
        const int x = static_cast<signed char>(a >> (8 * n) & 0xFF), y = static_cast<signed char>(b >> (8 * n) & 0xFF);
        r |= (static_cast<unsigned>(x > y ? x : y) & 0xFF) << (8 * n);
    }
    return r;
}
// Round-to-nearest double arithmetic that the compiler may not fuse: the emulator is built with -ffp-contract=off,
// so a plain product and sum are each rounded once, as on the GPU.
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
// Blocks run one after another, so memory is always coherent and an atomic is a plain read-modify-write.
inline void __threadfence() {}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}

namespace emu {
#if defined(__x86_64__)
// Saves what the x86-64 System V ABI makes callee-saved (rbx, rbp, r12-r15) on the current stack, stores the stack
// pointer in *save, and resumes the stack at `load`. swapcontext would also save the signal mask, a system call on
// every switch: with a switch at every barrier, shuffle and mma of every thread, that was half of an emulated
// kernel's time. The kernels never change the floating-point control words (mxcsr, x87), so those are not switched.
// noipa: callers must treat it as a call that may read and write any memory (other fibers run before it returns).
__attribute__((naked, noipa)) inline void switch_stack(void** save, void* load) {
    asm("push %rbp\n push %rbx\n push %r12\n push %r13\n push %r14\n push %r15\n"
        "mov %rsp, (%rdi)\n mov %rsi, %rsp\n"
        "pop %r15\n pop %r14\n pop %r13\n pop %r12\n pop %rbx\n pop %rbp\n ret\n");
}
struct Fiber {
    void* sp;
    bool done;
};
inline void* scheduler;
#else
struct Fiber {
    ucontext_t ctx;
    bool done;
};
inline ucontext_t scheduler;
#endif
inline Fiber* current;
inline std::vector<Fiber> fibers;
inline std::vector<std::vector<char>> stacks;
inline std::function<void()> kernel;
inline float lanes[1024];

#if defined(__x86_64__)
inline void yield() { switch_stack(&current->sp, scheduler); }
inline void resume(Fiber& fb) { switch_stack(&scheduler, fb.sp); }
#else
inline void yield() { swapcontext(&current->ctx, &scheduler); }
inline void resume(Fiber& fb) { swapcontext(&scheduler, &fb.ctx); }
#endif

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
#if defined(__x86_64__)
    yield();  // to the scheduler, which never resumes a finished fiber
    __builtin_unreachable();
#endif
}

// A fiber about to run the kernel from the start of its stack.
inline void start(Fiber& fb, std::vector<char>& stack) {
    fb.done = false;
#if defined(__x86_64__)
    // switch_stack's first resume pops six zero registers and returns into fiber_main as if called from a frame with
    // no return address (fiber_main never returns): at its entry the stack pointer is 8 below a 16-byte boundary,
    // as after a call.
    auto top = reinterpret_cast<std::uintptr_t>(stack.data() + stack.size()) & ~std::uintptr_t{15};
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;
    *--sp = reinterpret_cast<void*>(&fiber_main);
    for (int i = 0; i < 6; ++i) *--sp = nullptr;
    fb.sp = sp;
#else
    getcontext(&fb.ctx);
    fb.ctx.uc_stack.ss_sp = stack.data();
    fb.ctx.uc_stack.ss_size = stack.size();
    fb.ctx.uc_link = &scheduler;
    makecontext(&fb.ctx, fiber_main, 0);
#endif
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
                for (unsigned t = 0; t < block.x; ++t) start(fibers[t], stacks[t]);
                for (bool alive = true; alive;) {
                    alive = false;
                    for (unsigned t = 0; t < block.x; ++t) {
                        if (fibers[t].done) continue;
                        threadIdx = {t, 0, 0};
                        current = &fibers[t];
                        resume(fibers[t]);
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
namespace emu {
inline int lanes_int[1024];
}  // namespace emu
inline int __shfl_xor_sync(unsigned, int v, int mask) { return emu::shfl_xor(emu::lanes_int, v, mask); }
