// resize_fid.cu: the FID tools' resizes of decoded images on the GPU (pytorch-fid's bilinear, clean-fid's Pillow
// bicubic), writing the network's float32 NCHW input.
//
// resize_fid_bilinear: y[slot, c, oy, ox] = (v - mean[c]) / std[c] with v = torch's F.interpolate(x / 255,
// size=(size, size), mode="bilinear", align_corners=False) without antialiasing (pytorch-fid's InceptionV3 with
// resize_input): per axis, source index s = max(scale * (o + 0.5) - 0.5, 0) with scale = in / size in float, taps
// floor(s) and the next one (the same at the last row or column), weights 1 - (s - floor(s)) and s - floor(s); the
// four taps combined as torch's upsample_bilinear2d kernel combines them: h0 * (w0 * p00 + w1 * p01) + h1 * (w0 *
// p10 + w1 * p11), in float. pytorch-fid's 2x - 1 is mean = std = 0.5 (the FID weight file's scaling), as the host
// normalises the CPU path's pixels (images.normalize_u8). The CPU path computes the same arithmetic in C
// (cpu_src/fid_resize.c; its Pillow fallback, ingest/fid_resize.py, in float64): they differ where nvcc fuses a
// product and a sum (tests/kernels/test_resize_fid.py's bound).
//
// Images are HWC uint8, 3 channels, read through two byte steps as resize_pil.cu reads them (in[y][x][c] = in +
// y * in_row + x * in_col + c: the view of a stored image that its EXIF orientation makes upright, without a copy;
// gpu_resize.upright_views).
//
// Idea: one pass, no intermediate: without antialiasing each output reads only the 2 x 2 source pixels around its
// source coordinate, so the separable form saves nothing; the resize, the x / 255 and the scaling are fused and the
// network's input is written once (float32 NCHW, where the uint8 path has normalize_u8_nchw write it). A launch
// resizes every image of a batch (blockIdx.y = the image's job), one thread per output pixel (its three channels):
// consecutive threads write consecutive floats of each channel plane; memory-bound and small (a 256 x 256 image:
// 0.2 MB read, 1.07 MB written).
//
// A job is RESIZE_FID_JOB (6) int64s, as ingest/gpu_fid_resize.py writes them: src (device address of the view's
// pixel (0, 0)), in_h, in_w, in_row, in_col (bytes), slot (the batch image y's plane starts at y + slot * y_bstride).
//
// Launch: block 256, grid ceil(size * size / 256) x jobs.
#include "common.cuh"

#define RESIZE_FID_JOB 6
#define RESIZE_FID_CHANNELS 3

// torch's area_pixel_compute_source_index (align_corners=False, not cubic): the source coordinate, clamped at 0.
__device__ __forceinline__ float resize_fid_source(float scale, int o) {
    const float s = scale * ((float)o + 0.5f) - 0.5f;
    return s < 0.0f ? 0.0f : s;
}

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    resize_fid_bilinear(const long long* __restrict__ jobs, float* __restrict__ y,
                        const float* __restrict__ mean_std, int size, int y_bstride) {
    const long long* job = jobs + (size_t)blockIdx.y * RESIZE_FID_JOB;
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= size * size) return;
    const unsigned char* in = reinterpret_cast<const unsigned char*>(job[0]);
    const int in_h = (int)job[1], in_w = (int)job[2];
    const long long in_row = job[3], in_col = job[4];
    const int oy = p / size, ox = p % size;

    const float sy = resize_fid_source((float)in_h / (float)size, oy);
    const int y0 = (int)sy;
    const int dy = y0 < in_h - 1 ? 1 : 0;
    const float h1 = sy - (float)y0, h0 = 1.0f - h1;
    const float sx = resize_fid_source((float)in_w / (float)size, ox);
    const int x0 = (int)sx;
    const int dx = x0 < in_w - 1 ? 1 : 0;
    const float w1 = sx - (float)x0, w0 = 1.0f - w1;

    const unsigned char* r0 = in + y0 * in_row + x0 * in_col;
    const unsigned char* r1 = r0 + dy * in_row;
    const long long step = dx * in_col;
    float* out = y + (size_t)job[5] * y_bstride + p;
#pragma unroll
    for (int c = 0; c < RESIZE_FID_CHANNELS; ++c) {
        // ToTensor's x / 255 (an IEEE division, as torch's), before the interpolation
        const float p00 = (float)__ldg(r0 + c) / 255.0f, p01 = (float)__ldg(r0 + step + c) / 255.0f;
        const float p10 = (float)__ldg(r1 + c) / 255.0f, p11 = (float)__ldg(r1 + step + c) / 255.0f;
        const float v = h0 * (w0 * p00 + w1 * p01) + h1 * (w0 * p10 + w1 * p11);
        out[(size_t)c * size * size] = (v - mean_std[c]) / mean_std[3 + c];
    }
}

// clean-fid's resize ("clean" mode: each channel a float32 Pillow image resized with Image.BICUBIC, clipped to
// [0, 255], not rounded), as Pillow computes a mode "F" resize: two passes, each output sum_t in[start + t] * k[t]
// with the coefficients in double (computed on the host as Pillow's precompute_coeffs does, padded to one tap count
// with leading zeros, which add +0.0 to a sum that is still 0.0: the same sum) accumulated in double in tap order,
// each product and sum rounded once (__dmul_rn, __dadd_rn: no FMA, as Pillow's C builds compute them), the result
// rounded to float. The first pass reads the uint8 view (exact in float) into a float32 HWC intermediate; the
// second clips and scales into the network's input as the host scales the CPU path's pixels ((x / 255 - mean) /
// std in float). Which axis goes first is Pillow's choice (pil_resize.plan_resize_crop's rule), per job.
// A job is RESIZE_CLEAN_JOB (11) int64s (ingest/gpu_fid_resize.py): src, dst, start (int32 device array), weights
// (double device array), taps, out_rows, out_cols, in_row, in_col (the input's steps in its elements), vertical
// (1: the taps run down the rows), slot (the second pass's batch slot; the first pass writes dst densely).
// Launch: block 256, grid ceil(max out_rows * out_cols / 256) x jobs.
#define RESIZE_CLEAN_JOB 11

struct ResizeCleanJob {
    const void* in;
    float* out;
    const int* start;
    const double* weights;
    int taps, out_rows, out_cols, vertical;
    long long in_row, in_col, slot;

    __device__ explicit ResizeCleanJob(const long long* __restrict__ job)
        : in(reinterpret_cast<const void*>(job[0])),
          out(reinterpret_cast<float*>(job[1])),
          start(reinterpret_cast<const int*>(job[2])),
          weights(reinterpret_cast<const double*>(job[3])),
          taps((int)job[4]),
          out_rows((int)job[5]),
          out_cols((int)job[6]),
          vertical((int)job[9]),
          in_row(job[7]),
          in_col(job[8]),
          slot(job[10]) {}

    // Pillow's float sum for output (r, x), channel c, of an input of element type T.
    template <typename T>
    __device__ float sum(int r, int x, int c) const {
        const int o = vertical ? r : x;
        const T* src = reinterpret_cast<const T*>(in) + (vertical ? 0 : r * in_row) + (vertical ? x * in_col : 0) +
                       (long long)__ldg(start + o) * (vertical ? in_row : in_col) + c;
        const long long step = vertical ? in_row : in_col;
        const double* k = weights + (size_t)o * taps;
        double ss = 0.0;
        for (int t = 0; t < taps; ++t) ss = __dadd_rn(ss, __dmul_rn((double)src[t * step], __ldg(k + t)));
        return (float)ss;
    }
};

// First pass: uint8 view -> float32 (out_rows, out_cols, 3), dense.
extern "C" __global__ void __launch_bounds__(IE_THREADS) resize_clean_first(const long long* __restrict__ jobs) {
    const ResizeCleanJob j(jobs + (size_t)blockIdx.y * RESIZE_CLEAN_JOB);
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= j.out_rows * j.out_cols) return;
    const int r = p / j.out_cols, x = p % j.out_cols;
#pragma unroll
    for (int c = 0; c < RESIZE_FID_CHANNELS; ++c)
        j.out[(size_t)p * RESIZE_FID_CHANNELS + c] = j.sum<unsigned char>(r, x, c);
}

// Second pass: float32 intermediate -> the network's input, clipped to [0, 255] and scaled, NCHW slot `slot` of y.
extern "C" __global__ void __launch_bounds__(IE_THREADS)
    resize_clean_second(const long long* __restrict__ jobs, float* __restrict__ y, const float* __restrict__ mean_std,
                        int y_bstride) {
    const ResizeCleanJob j(jobs + (size_t)blockIdx.y * RESIZE_CLEAN_JOB);
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    const int plane = j.out_rows * j.out_cols;
    if (p >= plane) return;
    const int r = p / j.out_cols, x = p % j.out_cols;
    float* out = y + (size_t)j.slot * y_bstride + p;
#pragma unroll
    for (int c = 0; c < RESIZE_FID_CHANNELS; ++c) {
        const float v = fminf(fmaxf(j.sum<float>(r, x, c), 0.0f), 255.0f);
        out[(size_t)c * plane] = (v / 255.0f - mean_std[c]) / mean_std[3 + c];
    }
}
