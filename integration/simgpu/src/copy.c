/*
 * copy.c — memcpy and memset families of the simulated GPU (test double). The bytes move at enqueue time; the
 * stream is charged the transfer time; synchronous variants wait for it (and for earlier work on the legacy or
 * per-thread stream, whose ordering they follow). Device-to-device copies and memsets run on the SMs of their
 * stream's context, as on the H100 (integration/gpu/probes/copyescape.cu): every SM from a primary-context stream,
 * the green context's SMs from a green stream.
 */
#include "simgpu.h"

#include <string.h>

enum { DIR_HTOD, DIR_DTOH, DIR_DTOD, DIR_ANY };

static CUresult copy1d(void *dst, const void *src, size_t n, int dir, CUstream h, bool async, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(async ? h : NULL, ptd, &s, &ctx);
    if (r)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    if ((dir == DIR_HTOD || dir == DIR_DTOD) && sim_mem_check_range((CUdeviceptr)(uintptr_t)dst, n))
        return CUDA_ERROR_INVALID_VALUE;
    if ((dir == DIR_DTOH || dir == DIR_DTOD) && sim_mem_check_range((CUdeviceptr)(uintptr_t)src, n))
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture) {
        if (!async)
            return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        CUDA_MEMCPY3D c = {0};
        c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
        c.srcDevice = (CUdeviceptr)(uintptr_t)src;
        c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
        c.dstDevice = (CUdeviceptr)(uintptr_t)dst;
        c.WidthInBytes = n;
        c.Height = 1;
        c.Depth = 1;
        return sim_capture_memcpy(s, ctx, &c);
    }
    memmove(dst, src, n);
    bool on_device = dir == DIR_DTOD || (dir == DIR_ANY && !sim_mem_check_range((CUdeviceptr)(uintptr_t)dst, n) &&
                                         !sim_mem_check_range((CUdeviceptr)(uintptr_t)src, n));
    if (on_device)
        return sim_enqueue_device_op(s, ctx, ctx, n, !async);
    return sim_enqueue_copy(s, ctx, n, !async);
}

#define P(x) ((void *)(uintptr_t)(x))

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { return copy1d(P(dst), P(src), n, DIR_ANY, NULL, false, false); }
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) { return copy1d(P(dst), P(src), n, DIR_ANY, NULL, false, true); }
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) { return copy1d(P(dst), P(src), n, DIR_ANY, h, true, false); }
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) { return copy1d(P(dst), P(src), n, DIR_ANY, h, true, true); }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return copy1d(P(d), s, n, DIR_HTOD, NULL, false, false); }
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *s, size_t n) { return copy1d(P(d), s, n, DIR_HTOD, NULL, false, true); }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return copy1d(d, P(s), n, DIR_DTOH, NULL, false, false); }
CUresult cuMemcpyDtoH_v2_ptds(void *d, CUdeviceptr s, size_t n) { return copy1d(d, P(s), n, DIR_DTOH, NULL, false, true); }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy1d(P(d), P(s), n, DIR_DTOD, NULL, false, false); }
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy1d(P(d), P(s), n, DIR_DTOD, NULL, false, true); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream h) { return copy1d(P(d), s, n, DIR_HTOD, h, true, false); }
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *s, size_t n, CUstream h) { return copy1d(P(d), s, n, DIR_HTOD, h, true, true); }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream h) { return copy1d(d, P(s), n, DIR_DTOH, h, true, false); }
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *d, CUdeviceptr s, size_t n, CUstream h) { return copy1d(d, P(s), n, DIR_DTOH, h, true, true); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream h) { return copy1d(P(d), P(s), n, DIR_DTOD, h, true, false); }
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream h) { return copy1d(P(d), P(s), n, DIR_DTOD, h, true, true); }

CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                      size_t ByteCount) {
    SIM_CHECK_INIT();
    if (!sim_ctx_valid(dstContext) || !sim_ctx_valid(srcContext))
        return CUDA_ERROR_INVALID_CONTEXT;
    return copy1d(P(dstDevice), P(srcDevice), ByteCount, DIR_DTOD, NULL, false, false);
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                           size_t ByteCount, CUstream hStream) {
    SIM_CHECK_INIT();
    if (!sim_ctx_valid(dstContext) || !sim_ctx_valid(srcContext))
        return CUDA_ERROR_INVALID_CONTEXT;
    return copy1d(P(dstDevice), P(srcDevice), ByteCount, DIR_DTOD, hStream, true, false);
}

/* ---- 2D / 3D ---- */

static CUresult side(CUmemorytype t, const void *host, CUdeviceptr dev, CUarray arr, unsigned char **base) {
    switch (t) {
    case CU_MEMORYTYPE_HOST:
        *base = (unsigned char *)(uintptr_t)host;
        break;
    case CU_MEMORYTYPE_DEVICE:
    case CU_MEMORYTYPE_UNIFIED:
        *base = P(dev);
        break;
    case CU_MEMORYTYPE_ARRAY:
        if (!arr || arr->magic != SIM_ARRAY)
            return CUDA_ERROR_INVALID_HANDLE;
        *base = arr->mem;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return *base ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult sim_do_memcpy3d(const CUDA_MEMCPY3D *c) {
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char *src, *dst;
    CUresult r = side(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, &src);
    if (!r)
        r = side(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, &dst);
    if (r)
        return r;
    size_t w = c->WidthInBytes, h = c->Height ? c->Height : 1, d = c->Depth ? c->Depth : 1;
    size_t sp = c->srcPitch ? c->srcPitch : w, dp = c->dstPitch ? c->dstPitch : w;
    size_t sh = c->srcHeight ? c->srcHeight : h, dh = c->dstHeight ? c->dstHeight : h;
    if (w == 0)
        return CUDA_SUCCESS;
    if ((h > 1 || d > 1) && (sp < w || dp < w))
        return CUDA_ERROR_INVALID_VALUE;
    size_t s0 = c->srcXInBytes + c->srcY * sp + c->srcZ * sp * sh;
    size_t d0 = c->dstXInBytes + c->dstY * dp + c->dstZ * dp * dh;
    size_t sext = (d - 1) * sp * sh + (h - 1) * sp + w, dext = (d - 1) * dp * dh + (h - 1) * dp + w;
    if (c->srcMemoryType == CU_MEMORYTYPE_DEVICE && sim_mem_check_range((CUdeviceptr)(uintptr_t)(src + s0), sext))
        return CUDA_ERROR_INVALID_VALUE;
    if (c->dstMemoryType == CU_MEMORYTYPE_DEVICE && sim_mem_check_range((CUdeviceptr)(uintptr_t)(dst + d0), dext))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t z = 0; z < d; z++)
        for (size_t y = 0; y < h; y++)
            memmove(dst + d0 + z * dp * dh + y * dp, src + s0 + z * sp * sh + y * sp, w);
    return CUDA_SUCCESS;
}

CUresult sim_do_memcpy2d(const CUDA_MEMCPY2D *c) {
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_MEMCPY3D t = {0};
    t.srcXInBytes = c->srcXInBytes;
    t.srcY = c->srcY;
    t.srcMemoryType = c->srcMemoryType;
    t.srcHost = c->srcHost;
    t.srcDevice = c->srcDevice;
    t.srcArray = c->srcArray;
    t.srcPitch = c->srcPitch;
    t.dstXInBytes = c->dstXInBytes;
    t.dstY = c->dstY;
    t.dstMemoryType = c->dstMemoryType;
    t.dstHost = c->dstHost;
    t.dstDevice = c->dstDevice;
    t.dstArray = c->dstArray;
    t.dstPitch = c->dstPitch;
    t.WidthInBytes = c->WidthInBytes;
    t.Height = c->Height;
    t.Depth = 1;
    return sim_do_memcpy3d(&t);
}

/* Whether a 3D copy is device memory to device memory (what the GPU runs on SMs). */
bool sim_copy3d_on_device(const CUDA_MEMCPY3D *c) {
    bool src = c->srcMemoryType == CU_MEMORYTYPE_DEVICE ||
               (c->srcMemoryType == CU_MEMORYTYPE_UNIFIED && !sim_mem_check_range(c->srcDevice, 1));
    bool dst = c->dstMemoryType == CU_MEMORYTYPE_DEVICE ||
               (c->dstMemoryType == CU_MEMORYTYPE_UNIFIED && !sim_mem_check_range(c->dstDevice, 1));
    return src && dst;
}

static CUresult copy3d(const CUDA_MEMCPY3D *c, CUstream h, bool async, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(async ? h : NULL, ptd, &s, &ctx);
    if (r)
        return r;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture)
        return async ? sim_capture_memcpy(s, ctx, c) : CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    if ((r = sim_do_memcpy3d(c)))
        return r;
    size_t n = c->WidthInBytes * (c->Height ? c->Height : 1) * (c->Depth ? c->Depth : 1);
    if (sim_copy3d_on_device(c))
        return sim_enqueue_device_op(s, ctx, ctx, n, !async);
    return sim_enqueue_copy(s, ctx, n, !async);
}

static CUresult copy2d(const CUDA_MEMCPY2D *c, CUstream h, bool async, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(async ? h : NULL, ptd, &s, &ctx);
    if (r)
        return r;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if ((r = sim_do_memcpy2d(c)))
        return r;
    return sim_enqueue_copy(s, ctx, c->WidthInBytes * (c->Height ? c->Height : 1), !async);
}

CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *p) { return copy2d(p, NULL, false, false); }
CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *p) { return copy2d(p, NULL, false, true); }
CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *p) { return copy2d(p, NULL, false, false); }
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *p, CUstream h) { return copy2d(p, h, true, false); }
CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *p, CUstream h) { return copy2d(p, h, true, true); }
CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *p) { return copy3d(p, NULL, false, false); }
CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *p) { return copy3d(p, NULL, false, true); }
CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *p, CUstream h) { return copy3d(p, h, true, false); }
CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *p, CUstream h) { return copy3d(p, h, true, true); }

/* ---- memset ---- */

CUresult sim_do_memset(CUdeviceptr dst, size_t pitch, unsigned value, unsigned esize, size_t width, size_t height) {
    if (width == 0 || height == 0)
        return CUDA_SUCCESS;
    if (esize != 1 && esize != 2 && esize != 4)
        return CUDA_ERROR_INVALID_VALUE;
    size_t row = width * esize;
    if (height > 1 && pitch < row)
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_mem_check_range(dst, (height - 1) * pitch + row))
        return CUDA_ERROR_INVALID_VALUE;
    if (esize > 1 && (dst % esize))
        return CUDA_ERROR_INVALID_VALUE; /* misaligned for the element size */
    for (size_t y = 0; y < height; y++) {
        unsigned char *p = (unsigned char *)P(dst) + y * pitch;
        if (esize == 1)
            memset(p, (int)(value & 0xff), width);
        else if (esize == 2)
            for (size_t i = 0; i < width; i++)
                ((uint16_t *)(void *)p)[i] = (uint16_t)value;
        else
            for (size_t i = 0; i < width; i++)
                ((uint32_t *)(void *)p)[i] = value;
    }
    return CUDA_SUCCESS;
}

static CUresult memset_common(CUdeviceptr dst, size_t pitch, unsigned value, unsigned esize, size_t width,
                              size_t height, CUstream h, bool async, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(async ? h : NULL, ptd, &s, &ctx);
    if (r)
        return r;
    if (s->capture) {
        if (!async)
            return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        CUDA_MEMSET_NODE_PARAMS p = {.dst = dst, .pitch = pitch, .value = value, .elementSize = esize,
                                     .width = width, .height = height};
        return sim_capture_memset(s, ctx, &p);
    }
    if ((r = sim_do_memset(dst, pitch, value, esize, width, height)))
        return r;
    return sim_enqueue_device_op(s, ctx, ctx, width * esize * height, !async);
}

CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return memset_common(d, n, v, 1, n, 1, NULL, false, false); }
CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) { return memset_common(d, n, v, 1, n, 1, NULL, false, true); }
CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return memset_common(d, n * 2, v, 2, n, 1, NULL, false, false); }
CUresult cuMemsetD16_v2_ptds(CUdeviceptr d, unsigned short v, size_t n) { return memset_common(d, n * 2, v, 2, n, 1, NULL, false, true); }
CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { return memset_common(d, n * 4, v, 4, n, 1, NULL, false, false); }
CUresult cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n) { return memset_common(d, n * 4, v, 4, n, 1, NULL, false, true); }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream h) { return memset_common(d, n, v, 1, n, 1, h, true, false); }
CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream h) { return memset_common(d, n, v, 1, n, 1, h, true, true); }
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream h) { return memset_common(d, n * 2, v, 2, n, 1, h, true, false); }
CUresult cuMemsetD16Async_ptsz(CUdeviceptr d, unsigned short v, size_t n, CUstream h) { return memset_common(d, n * 2, v, 2, n, 1, h, true, true); }
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream h) { return memset_common(d, n * 4, v, 4, n, 1, h, true, false); }
CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream h) { return memset_common(d, n * 4, v, 4, n, 1, h, true, true); }
CUresult cuMemsetD2D8_v2(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t hgt) { return memset_common(d, pitch, v, 1, w, hgt, NULL, false, false); }
CUresult cuMemsetD2D32_v2(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t hgt) { return memset_common(d, pitch, v, 4, w, hgt, NULL, false, false); }
CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t hgt, CUstream h) { return memset_common(d, pitch, v, 1, w, hgt, h, true, false); }
CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t hgt, CUstream h) { return memset_common(d, pitch, v, 4, w, hgt, h, true, false); }
