// resize_pil.cu: Pillow's bilinear (antialiased) resize of a uint8 RGB image evaluated only on a centre crop, bit
// for bit as Pillow computes it (the resize of torchvision's Inception-V3 preprocessing, on GPU-decoded JPEGs).
//
// Each pass is out = clip((2^21 + sum_t in[start[o] + t] * weights[o][t]) >> 22) to 0..255 along one axis, with the
// fixed-point coefficient tables of Pillow's Resample.c (22 fractional bits), which inception_engine/pil_resize.py
// computes on the host for the crop's outputs of the full resize (so every output pixel has exactly the full
// resize's taps) and pads to one tap count per axis with zero weights.
// resize_pil_h: the horizontal pass, out[r][o][c] from in[r][start[o] + t][c];
// resize_pil_v: the vertical pass, out[o][x][c] from in[start[o] + t][x][c].
// Images are HWC, 3 channels. The input is read through two byte steps, in[y][x][c] = in + y * in_row + x * in_col
// + c, either of them negative or the two swapped: so the first pass reads a stored (decoded) image as its EXIF
// orientation shows it (pixels in[y][x] at y * pitch + x * 3 where it is upright; flipped, rotated or transposed
// views otherwise), which is Pillow's exif_transpose without a copy. Outputs are rows `out_pitch` bytes apart.
//
// Idea: separable, two passes, the intermediate stored as uint8 exactly as Pillow rounds it. The first pass covers
// only the source rows (or columns) the second pass reads, the second writes the 299 x 299 crop straight into its
// slot of the (N, 299, 299, 3) batch. Which pass goes first is Pillow's choice (pil_resize.plan_resize_crop): the
// host passes pointers already offset to the first row / column used and start[] relative to them. Sums are int32,
// exact (at most 255 * 2^22 + 2^21), so the result does not depend on summation order. One thread per output byte:
// consecutive threads write consecutive bytes; the taps' loads of a warp fall in a few cache lines. Memory-bound
// and tiny (a 500 x 375 image: ~0.4 MB read) next to the JPEG decode. A launch does one pass of every image of a
// batch that takes it (blockIdx.y = the image's job): launches from Python cost ~9 us each, and two per image were
// ~18 us of host time per image on the --decode gpu path, whose host side is its limit (docs/PERFORMANCE.md).
//
// A job is RESIZE_PIL_JOB (10) int64s, as jpeg_decode.GpuResizeCrop writes them: src, dst, start, weights (device
// addresses), taps, out_rows, out_cols, in_row, in_col (the input's steps, bytes), out_pitch.
//
// Launch: block 256, grid ceil(max over the jobs of out_rows * out_cols * 3 / 256) x jobs, for both kernels.
#include "common.cuh"

#define RESIZE_PIL_PRECISION_BITS 22  // pil_resize.PRECISION_BITS (Resample.c: 32 - 8 - 2)
#define RESIZE_PIL_CHANNELS 3

__device__ __forceinline__ unsigned char resize_pil_clip(int acc) {
    return (unsigned char)min(max(acc >> RESIZE_PIL_PRECISION_BITS, 0), 255);
}

// One image's pass, unpacked from its job.
struct ResizePilJob {
    const unsigned char* in;
    unsigned char* out;
    const int* start;
    const int* weights;
    int taps, out_rows, out_cols, out_pitch;
    long long in_row, in_col;  // bytes from in[y][x] to in[y + 1][x] and to in[y][x + 1]

    __device__ explicit ResizePilJob(const long long* __restrict__ job)
        : in(reinterpret_cast<const unsigned char*>(job[0])),
          out(reinterpret_cast<unsigned char*>(job[1])),
          start(reinterpret_cast<const int*>(job[2])),
          weights(reinterpret_cast<const int*>(job[3])),
          taps((int)job[4]),
          out_rows((int)job[5]),
          out_cols((int)job[6]),
          out_pitch((int)job[9]),
          in_row(job[7]),
          in_col(job[8]) {}
};

#define RESIZE_PIL_JOB 10

// out[r][o][c] = sum over t of in[r][start[o] + t][c] * weights[o * taps + t], for r < out_rows, o < out_cols.
extern "C" __global__ void __launch_bounds__(IE_THREADS) resize_pil_h(const long long* __restrict__ jobs) {
    const ResizePilJob j(jobs + (size_t)blockIdx.y * RESIZE_PIL_JOB);
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= j.out_rows * j.out_cols * RESIZE_PIL_CHANNELS) return;
    const int c = idx % RESIZE_PIL_CHANNELS, o = idx / RESIZE_PIL_CHANNELS % j.out_cols;
    const int r = idx / (RESIZE_PIL_CHANNELS * j.out_cols);
    const unsigned char* src = j.in + r * j.in_row + __ldg(j.start + o) * j.in_col + c;
    const int* k = j.weights + (size_t)o * j.taps;
    int acc = 1 << (RESIZE_PIL_PRECISION_BITS - 1);
    for (int t = 0; t < j.taps; ++t) acc += (int)__ldg(src + t * j.in_col) * __ldg(k + t);
    j.out[(size_t)r * j.out_pitch + o * RESIZE_PIL_CHANNELS + c] = resize_pil_clip(acc);
}

// out[o][x][c] = sum over t of in[start[o] + t][x][c] * weights[o * taps + t], for o < out_rows, x < out_cols.
extern "C" __global__ void __launch_bounds__(IE_THREADS) resize_pil_v(const long long* __restrict__ jobs) {
    const ResizePilJob j(jobs + (size_t)blockIdx.y * RESIZE_PIL_JOB);
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= j.out_rows * j.out_cols * RESIZE_PIL_CHANNELS) return;
    const int xc = idx % (j.out_cols * RESIZE_PIL_CHANNELS), o = idx / (j.out_cols * RESIZE_PIL_CHANNELS);
    const int x = xc / RESIZE_PIL_CHANNELS, c = xc % RESIZE_PIL_CHANNELS;
    const unsigned char* src = j.in + __ldg(j.start + o) * j.in_row + x * j.in_col + c;
    const int* k = j.weights + (size_t)o * j.taps;
    int acc = 1 << (RESIZE_PIL_PRECISION_BITS - 1);
    for (int t = 0; t < j.taps; ++t) acc += (int)__ldg(src + t * j.in_row) * __ldg(k + t);
    j.out[(size_t)o * j.out_pitch + xc] = resize_pil_clip(acc);
}
