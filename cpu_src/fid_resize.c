// fid_resize.c: pytorch-fid's resize on the host, for the FID network's CPU decode path: a decoded HWC uint8 RGB
// image (any size) into the network's float32 (3, size, size) input, y[c][oy][ox] = (v - mean[c]) / std[c], where v
// is torch's F.interpolate(x / 255, size=(size, size), mode="bilinear", align_corners=False) without antialiasing
// (pytorch-fid's InceptionV3 with resize_input) and mean = std = 0.5 its 2x - 1.
//
// The arithmetic is resize_fid.cu's, the GPU decode path's (torch's upsample_bilinear2d in float32): per axis the
// source coordinate s = max(scale * (o + 0.5) - 0.5, 0), scale = in / size in float, taps floor(s) and the next (the
// same at the last row or column), weights 1 - (s - floor(s)) and s - floor(s); the four taps combined as
// h0 * (w0 * p00 + w1 * p01) + h1 * (w0 * p10 + w1 * p11); x / 255 an IEEE division before the interpolation (a
// table of the 256 quotients: the same floats). Built alone into its own small library (ingest/fid_resize.py's
// fid_library), plain C (an AVX2 clone of one loop where the CPU has it), so that every decode worker can load it
// where the CPU path's AVX-512 kernels cannot run; one call an image, single-threaded (the decode workers run side
// by side).
//
// Idea: torch's inner sums w0 * p00 + w1 * p01 are the horizontal interpolation of one source row, the same for
// every output row that reads that row: each is computed once, for the three channels together (the row's bytes and
// the column taps read once), and the two latest kept (the rows an output row reads only move down); an output row
// is then h0 * A + h1 * B over whole rows, which the compiler vectorizes (with an AVX2 clone where the CPU has it:
// the same IEEE operations on more lanes, no contraction, so the same floats). The same operations in the same order
// as the formula above: the same floats.
#include <stdint.h>
#include <stdlib.h>

// torch's area_pixel_compute_source_index (align_corners=False), clamped at 0, and the taps it gives.
static void taps(int in, int size, int *lo, int *step, float *w0, float *w1) {
    const float scale = (float)in / (float)size;
    for (int o = 0; o < size; ++o) {
        float s = scale * ((float)o + 0.5f) - 0.5f;
        s = s < 0.0f ? 0.0f : s;
        lo[o] = (int)s;
        step[o] = lo[o] < in - 1 ? 1 : 0;
        w1[o] = s - (float)lo[o];
        w0[o] = 1.0f - w1[o];
    }
}

// The AVX2 clone of a hot loop, dispatched once at load (GCC's and clang's ifunc, glibc only); elsewhere one plain
// build.
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define IE_AVX2_CLONE __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef IE_AVX2_CLONE
#define IE_AVX2_CLONE
#endif

// One source row's horizontal interpolation, the three channels: h[c * size + ox] = w0[ox] * p(x0, c) + w1[ox] *
// p(x1, c), x0 and x1 byte offsets of the pixels.
static void source_row(const uint8_t *row, const int *x0, const int *x1, const float *w0, const float *w1,
                       const float *unit, int size, float *h) {
    for (int ox = 0; ox < size; ++ox) {
        const uint8_t *p = row + x0[ox], *q = row + x1[ox];
        const float a = w0[ox], b = w1[ox];
        h[ox] = a * unit[p[0]] + b * unit[q[0]];
        h[size + ox] = a * unit[p[1]] + b * unit[q[1]];
        h[2 * size + ox] = a * unit[p[2]] + b * unit[q[2]];
    }
}

// One output row of a channel: y = (a * A + b * B - mean) / std.
IE_AVX2_CLONE
static void output_row(float a, const float *A, float b, const float *B, float mean, float std, float *y, int size) {
    for (int ox = 0; ox < size; ++ox) y[ox] = (a * A[ox] + b * B[ox] - mean) / std;
}

// rgb: pixel (y, x) channel c at rgb[y * row + x * 3 + c]; out: 3 planes of size * size floats. Returns 0, or -1
// where its tables cannot be allocated.
int ie_fid_bilinear(const uint8_t *rgb, int h, int w, int64_t row, float *out, int size, const float *mean_std) {
    float unit[256];
    for (int i = 0; i < 256; ++i) unit[i] = (float)i / 255.0f;
    int *ints = malloc(4 * sizeof(int) * (size_t)size);
    float *floats = malloc(10 * sizeof(float) * (size_t)size);
    if (ints == NULL || floats == NULL) {
        free(ints);
        free(floats);
        return -1;
    }
    int *ylo = ints, *ystep = ints + size, *x0 = ints + 2 * size, *x1 = ints + 3 * size;
    float *h0 = floats, *h1 = floats + size, *w0 = floats + 2 * size, *w1 = floats + 3 * size;
    float *kept[2] = {floats + 4 * size, floats + 7 * size};  // two source rows' interpolations, 3 channels each
    taps(h, size, ylo, ystep, h0, h1);
    taps(w, size, x0, x1, w0, w1);
    for (int ox = 0; ox < size; ++ox) {  // byte offsets of a pixel's two column taps
        x1[ox] = 3 * (x0[ox] + x1[ox]);
        x0[ox] *= 3;
    }
    int kept_row[2] = {-1, -1};
    for (int oy = 0; oy < size; ++oy) {
        const int rows[2] = {ylo[oy], ylo[oy] + ystep[oy]};
        const float *src[2];
        for (int k = 0; k < 2; ++k) {
            int slot = kept_row[0] == rows[k] ? 0 : kept_row[1] == rows[k] ? 1 : -1;
            if (slot < 0) {  // the older kept row goes: the rows read only move down
                slot = kept_row[0] < kept_row[1] ? 0 : 1;
                if (k == 1 && kept_row[slot] == rows[0]) slot ^= 1;
                source_row(rgb + rows[k] * row, x0, x1, w0, w1, unit, size, kept[slot]);
                kept_row[slot] = rows[k];
            }
            src[k] = kept[slot];
        }
        for (int c = 0; c < 3; ++c)
            output_row(h0[oy], src[0] + (size_t)c * size, h1[oy], src[1] + (size_t)c * size, mean_std[c],
                       mean_std[3 + c], out + ((size_t)c * size + oy) * size, size);
    }
    free(ints);
    free(floats);
    return 0;
}
