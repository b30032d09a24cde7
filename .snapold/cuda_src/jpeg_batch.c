// jpeg_batch.c: the host half of --decode gpu, a batch of files per call and no Python per file.
//
// ie_jpeg_read reads a batch of files on a few threads and sorts them by their headers:
//   IE_JPEG_PLAIN       a plain JPEG (the rule below): nvImageCodec decodes it to what Pillow gives before
//                       Pillow turns it upright; height, width and EXIF orientation reported;
//   IE_JPEG_OTHER       readable, anything else: the caller decides (Pillow's reading of the header, the CPU path);
//   IE_JPEG_UNREADABLE  could not be opened or read, not a regular file, or empty: the caller words the error.
// Its bytes stay in the context (one buffer per batch position, grown as needed) until the next read.
//
// Plain: 8-bit Huffman-coded (baseline, extended or progressive), grey or JFIF YCbCr (component ids 1, 2, 3), no
// Adobe marker with colour transform 0 (R, G, B stored as they are), an EXIF orientation 1 to 8 where there is one
// (as one SHORT), no XMP packet (Pillow reads orientation there too), at most one EXIF block, within max_pixels
// (Pillow's limit), and
// complete (an end-of-image marker after the last start of scan: entropy-coded data cannot hold FF D9). This is
// jpeg_decode.plain_jpeg_size's rule; tests/unit/test_jpeg_batch.py checks the two agree on fuzzed headers.
//
// ie_jpeg_decode (built with IE_WITH_NVIMGCODEC, against the installed nvImageCodec's header) decodes chosen files
// of the last read into caller memory, one nvimgcodecDecoderDecode for the whole batch: 8-bit interleaved RGB,
// image k at out + offset[k] with rows of width * 3 bytes, on the caller's CUDA stream (device memory), or into
// host memory for a decoder made with device -99999 (nvImageCodec's CPU-only mode, for tests).

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef IE_WITH_NVIMGCODEC
#include <cuda_runtime_api.h>
#include <nvimgcodec.h>
#endif

enum { IE_JPEG_PLAIN = 0, IE_JPEG_OTHER = 1, IE_JPEG_UNREADABLE = 2 };
#define IE_JPEG_MAX_THREADS 16

typedef struct {
    unsigned char* data;
    size_t capacity;
    size_t length;  // of the file the last read put here
} ie_buffer;

typedef struct {
    ie_buffer* files;  // one per batch position
    int slots;
#ifdef IE_WITH_NVIMGCODEC
    nvimgcodecInstance_t instance;
    nvimgcodecDecoder_t decoder;
    int host_output;
#endif
} ie_jpeg;

// ---------------------------------------------------------------------------------------------- the header rule

static uint32_t be16(const unsigned char* p) { return ((uint32_t)p[0] << 8) | p[1]; }

static uint32_t tiff16(const unsigned char* p, int little) { return little ? (uint32_t)(p[0] | (p[1] << 8)) : be16(p); }

static uint32_t tiff32(const unsigned char* p, int little) {
    return little ? (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24)
                  : ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

// The orientation tag of an EXIF block's first IFD: 1 where it has none, -1 where the block is malformed or the
// tag is not one SHORT (Pillow makes sense of those).
static int exif_orientation(const unsigned char* t, size_t n) {
    if (n < 8) return -1;
    int little;
    if (t[0] == 'I' && t[1] == 'I') little = 1;
    else if (t[0] == 'M' && t[1] == 'M') little = 0;
    else return -1;
    if (tiff16(t + 2, little) != 42) return -1;
    size_t ifd = tiff32(t + 4, little);
    if (ifd + 2 > n) return -1;
    size_t count = tiff16(t + ifd, little);
    if (ifd + 2 + 12 * count > n) return -1;
    for (size_t e = ifd + 2; e < ifd + 2 + 12 * count; e += 12) {
        if (tiff16(t + e, little) == 0x0112) {
            if (tiff16(t + e + 2, little) != 3 || tiff32(t + e + 4, little) != 1) return -1;
            return (int)tiff16(t + e + 8, little);
        }
    }
    return 1;
}

static int complete(const unsigned char* d, size_t n) {
    if (n >= 2 && d[n - 2] == 0xFF && d[n - 1] == 0xD9) return 1;
    long last_eoi = -1, last_sos = -1;
    for (size_t i = 0; i + 1 < n; i++) {
        if (d[i] != 0xFF) continue;
        if (d[i + 1] == 0xD9) last_eoi = (long)i;
        else if (d[i + 1] == 0xDA) last_sos = (long)i;
    }
    return last_eoi > last_sos;
}

// 1 and layout = (height, width, EXIF orientation) for a plain JPEG, else 0.
int ie_jpeg_plain_size(const unsigned char* d, size_t n, int64_t max_pixels, int32_t* layout) {
    if (n < 2 || d[0] != 0xFF || d[1] != 0xD8) return 0;
    size_t pos = 2;
    int have_size = 0, exif_seen = 0, orientation = 1;
    uint32_t h = 0, w = 0;
    for (;;) {
        if (pos + 4 > n) return 0;
        if (d[pos] != 0xFF) return 0;
        unsigned marker = d[pos + 1];
        if (marker == 0xFF) {  // fill byte
            pos += 1;
            continue;
        }
        if ((marker >= 0xD0 && marker <= 0xD7) || marker == 0x01) return 0;  // markers without a length
        size_t length = be16(d + pos + 2);
        if (length < 2 || pos + 2 + length > n) return 0;
        const unsigned char* seg = d + pos + 4;
        size_t seg_n = length - 2;
        if (marker == 0xDA) break;  // start of scan: the header is over
        if (marker == 0xE1) {
            if (seg_n >= 6 && memcmp(seg, "Exif\0\0", 6) == 0) {
                orientation = exif_orientation(seg + 6, seg_n - 6);
                if (exif_seen || orientation < 1 || orientation > 8) return 0;
                exif_seen = 1;
            } else if (seg_n >= 24 && memcmp(seg, "http://ns.adobe.com/xap/", 24) == 0) {
                return 0;
            }
        } else if (marker == 0xEE && seg_n >= 12 && memcmp(seg, "Adobe", 5) == 0 && seg[11] == 0) {
            return 0;
        } else if (marker == 0xC0 || marker == 0xC1 || marker == 0xC2) {
            if (have_size || seg_n < 6 || seg[0] != 8) return 0;
            h = be16(seg + 1);
            w = be16(seg + 3);
            unsigned components = seg[5];
            if (components == 3) {
                if (seg_n < 15 || seg[6] != 1 || seg[9] != 2 || seg[12] != 3) return 0;
            } else if (components != 1) {
                return 0;
            }
            have_size = 1;
        } else if (marker >= 0xC3 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
            return 0;  // lossless, arithmetic-coded
        }
        pos += 2 + length;
    }
    if (!have_size || h < 1 || w < 1) return 0;
    if (max_pixels > 0 && (int64_t)h * w > max_pixels) return 0;  // Pillow words the warning or the refusal
    if (!complete(d, n)) return 0;
    layout[0] = (int32_t)h;
    layout[1] = (int32_t)w;
    layout[2] = orientation;
    return 1;
}

// --------------------------------------------------------------------------------------------------- reading

typedef struct {
    ie_jpeg* ctx;
    int n, first, step;
    const char* const* paths;
    int64_t max_pixels;
    int32_t* kind;
    int32_t* layout;
    int64_t* length;
} ie_read_job;

static int read_one(ie_buffer* buf, const char* path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // non-blocking: a FIFO is never waited on
    if (fd < 0) return 0;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
    size_t size = ok ? (size_t)st.st_size : 0, got = 0;
    if (ok && size > buf->capacity) {
        unsigned char* grown = realloc(buf->data, size);
        if (grown == NULL) ok = 0;
        else buf->data = grown, buf->capacity = size;
    }
    while (ok && got < size) {
        ssize_t r = read(fd, buf->data + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;  // shorter than stat said (truncated meanwhile): what was read is the file
        got += (size_t)r;
    }
    close(fd);
    buf->length = ok ? got : 0;
    return ok && got > 0;
}

static void* read_files(void* arg) {
    ie_read_job* job = arg;
    for (int i = job->first; i < job->n; i += job->step) {
        ie_buffer* buf = &job->ctx->files[i];
        if (!read_one(buf, job->paths[i])) {
            job->kind[i] = IE_JPEG_UNREADABLE;
        } else {
            job->kind[i] = ie_jpeg_plain_size(buf->data, buf->length, job->max_pixels, job->layout + 3 * i)
                               ? IE_JPEG_PLAIN : IE_JPEG_OTHER;
        }
        job->length[i] = (int64_t)buf->length;
    }
    return NULL;
}

ie_jpeg* ie_jpeg_new(void) { return calloc(1, sizeof(ie_jpeg)); }

// Reads paths[0 .. n-1] on up to `threads` threads; per file its kind, (height, width, EXIF orientation) where plain,
// and length.
// Returns 0, or -1 where memory ran out (nothing is read then).
static int ensure_slots(ie_jpeg* ctx, int n) {
    if (n > ctx->slots) {
        ie_buffer* grown = realloc(ctx->files, (size_t)n * sizeof(ie_buffer));
        if (grown == NULL) return -1;
        memset(grown + ctx->slots, 0, (size_t)(n - ctx->slots) * sizeof(ie_buffer));
        ctx->files = grown;
        ctx->slots = n;
    }
    return 0;
}

int ie_jpeg_read(ie_jpeg* ctx, int n, const char* const* paths, int threads, int64_t max_pixels, int32_t* kind,
                 int32_t* layout, int64_t* length) {
    if (ensure_slots(ctx, n) != 0) return -1;
    if (threads > IE_JPEG_MAX_THREADS) threads = IE_JPEG_MAX_THREADS;
    if (threads > n) threads = n;
    if (threads < 1) threads = 1;
    ie_read_job jobs[IE_JPEG_MAX_THREADS];
    pthread_t tids[IE_JPEG_MAX_THREADS];
    int started[IE_JPEG_MAX_THREADS] = {0};
    for (int t = 0; t < threads; t++) {
        jobs[t] = (ie_read_job){ctx, n, t, threads, paths, max_pixels, kind, layout, length};
        if (t > 0) started[t] = pthread_create(&tids[t], NULL, read_files, &jobs[t]) == 0;
    }
    read_files(&jobs[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t]) pthread_join(tids[t], NULL);
        else read_files(&jobs[t]);  // no thread to be had: this one reads its share
    }
    return 0;
}

// The bytes of file i of the last read (its length as ie_jpeg_read reported it).
const unsigned char* ie_jpeg_bytes(const ie_jpeg* ctx, int i) {
    return i >= 0 && i < ctx->slots ? ctx->files[i].data : NULL;
}

// ------------------------------------------------------------------------------------------- decoding

int ie_jpeg_has_decoder(void) {
#ifdef IE_WITH_NVIMGCODEC
    return 1;
#else
    return 0;
#endif
}

#ifdef IE_WITH_NVIMGCODEC
// Makes the context's nvImageCodec decoder: device -1 the current CUDA device, -99999 CPU only; threads its host
// threads (0: one per CPU); options its decoder options. Returns 0, or an nvImageCodec status with a message.
int ie_jpeg_open_decoder(ie_jpeg* ctx, int device, int threads, const char* options, char* err, size_t err_n) {
    nvimgcodecInstanceCreateInfo_t info = {NVIMGCODEC_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                           sizeof(nvimgcodecInstanceCreateInfo_t), NULL};
    info.load_builtin_modules = 1;
    info.load_extension_modules = 1;  // from the library's own extensions folder
    nvimgcodecStatus_t s = nvimgcodecInstanceCreate(&ctx->instance, &info);
    if (s != NVIMGCODEC_STATUS_SUCCESS) {
        snprintf(err, err_n, "nvimgcodecInstanceCreate failed (status %d)", (int)s);
        ctx->instance = NULL;
        return (int)s;
    }
    nvimgcodecExecutionParams_t exec = {NVIMGCODEC_STRUCTURE_TYPE_EXECUTION_PARAMS,
                                        sizeof(nvimgcodecExecutionParams_t), NULL};
    exec.device_id = device;
    exec.max_num_cpu_threads = threads;
    s = nvimgcodecDecoderCreate(ctx->instance, &ctx->decoder, &exec, options);
    if (s != NVIMGCODEC_STATUS_SUCCESS) {
        snprintf(err, err_n, "nvimgcodecDecoderCreate failed (status %d)", (int)s);
        nvimgcodecInstanceDestroy(ctx->instance);
        ctx->instance = NULL;
        ctx->decoder = NULL;
        return (int)s;
    }
    ctx->host_output = device == NVIMGCODEC_DEVICE_CPU_ONLY;
    return 0;
}

static nvimgcodecStatus_t code_stream(nvimgcodecInstance_t inst, nvimgcodecCodeStream_t* cs,
                                      const unsigned char* data, size_t n) {
#if NVIMGCODEC_VER >= 800  // 0.8 added the code stream view
    return nvimgcodecCodeStreamCreateFromHostMem(inst, cs, data, n, NULL);
#else
    return nvimgcodecCodeStreamCreateFromHostMem(inst, cs, data, n);
#endif
}

// Decodes files which[0 .. n-1] of the last read, of sizes hw[2k], hw[2k+1], into out + offset[k] (rows of
// width * 3 bytes), on `stream`. ok[k]: 1 decoded, 0 not (the caller's CPU path takes it). Returns 0, or -1 with a
// message where the batch call itself failed (every ok 0).
int ie_jpeg_decode(ie_jpeg* ctx, int n, const int32_t* which, const int32_t* hw, uint64_t out,
                   const int64_t* offset, void* stream, int32_t* ok, char* err, size_t err_n) {
    memset(ok, 0, (size_t)n * sizeof(int32_t));
    if (ctx->decoder == NULL) {
        snprintf(err, err_n, "no decoder: ie_jpeg_open_decoder first");
        return -1;
    }
    nvimgcodecCodeStream_t* streams = calloc((size_t)n + 1, sizeof(nvimgcodecCodeStream_t));
    nvimgcodecImage_t* images = calloc((size_t)n + 1, sizeof(nvimgcodecImage_t));
    int* index = calloc((size_t)n + 1, sizeof(int));  // batch position -> k
    nvimgcodecProcessingStatus_t* status = calloc((size_t)n + 1, sizeof(nvimgcodecProcessingStatus_t));
    int rc = 0, m = 0;
    if (!streams || !images || !index || !status) {
        snprintf(err, err_n, "out of host memory");
        rc = -1;
        goto done;
    }
    for (int k = 0; k < n; k++) {
        int i = which[k];
        if (i < 0 || i >= ctx->slots) continue;
        nvimgcodecCodeStream_t cs = NULL;
        if (code_stream(ctx->instance, &cs, ctx->files[i].data, ctx->files[i].length) != NVIMGCODEC_STATUS_SUCCESS)
            continue;
        nvimgcodecImageInfo_t info = {NVIMGCODEC_STRUCTURE_TYPE_IMAGE_INFO, sizeof(nvimgcodecImageInfo_t), NULL};
        if (nvimgcodecCodeStreamGetImageInfo(cs, &info) != NVIMGCODEC_STATUS_SUCCESS ||
            info.plane_info[0].height != (uint32_t)hw[2 * k] || info.plane_info[0].width != (uint32_t)hw[2 * k + 1]) {
            nvimgcodecCodeStreamDestroy(cs);
            continue;
        }
        uint32_t h = (uint32_t)hw[2 * k], w = (uint32_t)hw[2 * k + 1];
        info.color_spec = NVIMGCODEC_COLORSPEC_SRGB;
        info.sample_format = NVIMGCODEC_SAMPLEFORMAT_I_RGB;
        info.chroma_subsampling = NVIMGCODEC_SAMPLING_NONE;
        info.num_planes = 1;
        info.plane_info[0].height = h;
        info.plane_info[0].width = w;
        info.plane_info[0].row_stride = (size_t)w * 3;
        info.plane_info[0].num_channels = 3;
        info.plane_info[0].sample_type = NVIMGCODEC_SAMPLE_DATA_TYPE_UINT8;
        info.plane_info[0].precision = 0;
        info.buffer = (void*)(uintptr_t)(out + (uint64_t)offset[k]);
        info.buffer_kind = ctx->host_output ? NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_HOST
                                            : NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_DEVICE;
        info.cuda_stream = (cudaStream_t)stream;
        nvimgcodecImage_t img = NULL;
        if (nvimgcodecImageCreate(ctx->instance, &img, &info) != NVIMGCODEC_STATUS_SUCCESS) {
            nvimgcodecCodeStreamDestroy(cs);
            continue;
        }
        streams[m] = cs;
        images[m] = img;
        index[m] = k;
        m++;
    }
    if (m > 0) {
        nvimgcodecDecodeParams_t params = {NVIMGCODEC_STRUCTURE_TYPE_DECODE_PARAMS, sizeof(nvimgcodecDecodeParams_t),
                                           NULL};
        params.apply_exif_orientation = 0;  // decoded as stored: the resize reads each through its orientation
        nvimgcodecFuture_t future = NULL;
        nvimgcodecStatus_t s = nvimgcodecDecoderDecode(ctx->decoder, streams, images, m, &params, &future);
        size_t got = 0;
        if (s == NVIMGCODEC_STATUS_SUCCESS) s = nvimgcodecFutureWaitForAll(future);
        if (s == NVIMGCODEC_STATUS_SUCCESS) s = nvimgcodecFutureGetProcessingStatus(future, status, &got);
        if (future != NULL) nvimgcodecFutureDestroy(future);
        if (s != NVIMGCODEC_STATUS_SUCCESS) {
            snprintf(err, err_n, "nvimgcodecDecoderDecode failed (status %d)", (int)s);
            rc = -1;
        } else {
            for (size_t j = 0; j < got && j < (size_t)m; j++)
                ok[index[j]] = status[j] == NVIMGCODEC_PROCESSING_STATUS_SUCCESS;
        }
    }
    for (int j = 0; j < m; j++) {
        nvimgcodecImageDestroy(images[j]);
        nvimgcodecCodeStreamDestroy(streams[j]);
    }
done:
    free(streams);
    free(images);
    free(index);
    free(status);
    return rc;
}

// Decodes `copies` copies of one small plain JPEG (data, n) into device memory of its own and waits: nvImageCodec
// starts nvJPEG and the hardware decoder at its first decode, which this takes off a run's first batch (the
// caller runs it beside the rest of its start-up). Returns 0, or -1 with a message.
int ie_jpeg_warm_up(ie_jpeg* ctx, const unsigned char* data, size_t n, int copies, char* err, size_t err_n) {
    int32_t hw[3];  // height, width, orientation
    if (ctx->host_output || copies < 1 || !ie_jpeg_plain_size(data, n, 0, hw) || ensure_slots(ctx, copies) != 0) {
        snprintf(err, err_n, "warm-up: needs a device decoder and one small plain JPEG");
        return -1;
    }
    int32_t* which = calloc((size_t)copies, sizeof(int32_t));
    int32_t* sizes = calloc((size_t)copies * 2, sizeof(int32_t));
    int64_t* offsets = calloc((size_t)copies, sizeof(int64_t));
    int32_t* ok = calloc((size_t)copies, sizeof(int32_t));
    size_t image = (size_t)hw[0] * hw[1] * 3;
    void* out = NULL;
    cudaStream_t stream = NULL;
    int rc = -1;
    if (!which || !sizes || !offsets || !ok) {
        snprintf(err, err_n, "warm-up: out of host memory");
        goto done;
    }
    for (int k = 0; k < copies; k++) {
        ie_buffer* buf = &ctx->files[k];
        if (buf->capacity < n) {
            unsigned char* grown = realloc(buf->data, n);
            if (grown == NULL) goto done;
            buf->data = grown, buf->capacity = n;
        }
        memcpy(buf->data, data, n);
        buf->length = n;
        which[k] = k;
        sizes[2 * k] = hw[0], sizes[2 * k + 1] = hw[1];
        offsets[k] = (int64_t)(k * image);
    }
    if (cudaMalloc(&out, image * (size_t)copies) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        snprintf(err, err_n, "warm-up: no device memory or stream");
        goto done;
    }
    rc = ie_jpeg_decode(ctx, copies, which, sizes, (uint64_t)(uintptr_t)out, offsets, stream, ok, err, err_n);
    if (cudaStreamSynchronize(stream) != cudaSuccess) rc = -1;
done:
    if (stream != NULL) cudaStreamDestroy(stream);
    if (out != NULL) cudaFree(out);
    free(which);
    free(sizes);
    free(offsets);
    free(ok);
    return rc;
}
#endif

void ie_jpeg_free(ie_jpeg* ctx) {
    if (ctx == NULL) return;
#ifdef IE_WITH_NVIMGCODEC
    if (ctx->decoder != NULL) nvimgcodecDecoderDestroy(ctx->decoder);
    if (ctx->instance != NULL) nvimgcodecInstanceDestroy(ctx->instance);
#endif
    for (int i = 0; i < ctx->slots; i++) free(ctx->files[i].data);
    free(ctx->files);
    free(ctx);
}
