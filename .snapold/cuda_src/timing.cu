// timing.cu: gpu_sleep, a kernel that only waits, for timing short kernels with CUDA events.
//
// Idea: a kernel timed between two events launched from Python starts several microseconds after the first event
// (the host is still launching it), which would be counted as kernel time. Launching gpu_sleep first keeps the GPU
// busy while the host enqueues start event, kernels and end event, so the events bracket GPU work only.
// %globaltimer is a nanosecond wall clock; __nanosleep keeps the waiting thread off the issue slots.
//
// Launch: block 1, grid 1.

extern "C" __global__ void gpu_sleep(long long ns) {
    long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
