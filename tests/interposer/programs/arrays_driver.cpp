// Driver API: CUDA arrays through cuArrayCreate / cuArray3DCreate and their descriptors, the
// byte-offset copies (HtoA, AtoH, AtoD, DtoA, AtoA), cuMemcpy2D/3D with array endpoints and
// their validation, memory requirements, texture descriptor queries and the documented refusals.
#include <cstdio>
#include <cstring>
#include <cuda.h>
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_; cuGetErrorName(r_, &n_); printf("FAIL %s: %s\n", #x, n_); return 1; } } while (0)
static const char *name(CUresult r) { const char *n; cuGetErrorName(r, &n); return n; }

int main() {
    CUdevice dev; CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    // a 2D array of ushort2 (4 bytes per element), 10 x 6
    CUDA_ARRAY_DESCRIPTOR ad = {10, 6, CU_AD_FORMAT_UNSIGNED_INT16, 2};
    CUarray a, b;
    CK(cuArrayCreate(&a, &ad));
    CUDA_ARRAY_DESCRIPTOR q;
    CK(cuArrayGetDescriptor(&q, a));
    CUDA_ARRAY3D_DESCRIPTOR q3;
    CK(cuArray3DGetDescriptor(&q3, a));
    printf("desc w=%zu h=%zu fmt=%d ch=%u depth=%zu flags=%u\n", q.Width, q.Height, (int)q.Format,
           q.NumChannels, q3.Depth, q3.Flags);
    unsigned h[60], back[60], back2[60];
    for (int i = 0; i < 60; i++) h[i] = 0x10000u * i + 7;
    CK(cuMemcpyHtoA(a, 0, h, sizeof h));
    CK(cuMemcpyAtoH(back, a, 0, sizeof back));
    CUdeviceptr d;
    CK(cuMemAlloc(&d, sizeof h));
    CK(cuMemcpyAtoD(d, a, 40, 80));  // rows 1 and 2
    CK(cuArrayCreate(&b, &ad));
    CK(cuMemcpyDtoA(b, 0, d, 80));
    CK(cuMemcpyAtoA(b, 80, a, 80, 160));
    CK(cuMemcpyAtoH(back2, b, 0, 240));
    int ok = !memcmp(back, h, sizeof h);
    for (int i = 0; i < 20; i++) ok = ok && back2[i] == h[10 + i];
    for (int i = 20; i < 60; i++) ok = ok && back2[i] == h[i];
    // a 4x3 sub-rectangle at (x=2, y=1) of a, to a host buffer with a 32-byte pitch
    unsigned sub[3][8] = {};
    CUDA_MEMCPY2D c = {};
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY; c.srcArray = a; c.srcXInBytes = 8; c.srcY = 1;
    c.dstMemoryType = CU_MEMORYTYPE_HOST; c.dstHost = sub; c.dstPitch = 32;
    c.WidthInBytes = 16; c.Height = 3;
    CK(cuMemcpy2D(&c));
    for (int y = 0; y < 3; y++)
        for (int x = 0; x < 4; x++) ok = ok && sub[y][x] == h[(y + 1) * 10 + x + 2];
    printf("copies ok=%d\n", ok);
    c.Height = 6;  // rows 1..6 of a 6-row array: outside
    CUresult e1 = cuMemcpy2D(&c);
    CUDA_MEMCPY3D c3 = {};
    c3.srcMemoryType = CU_MEMORYTYPE_HOST; c3.srcHost = h; c3.srcPitch = 40; c3.srcHeight = 6;
    c3.dstMemoryType = CU_MEMORYTYPE_ARRAY; c3.dstArray = a; c3.dstLOD = 1;
    c3.WidthInBytes = 40; c3.Height = 6; c3.Depth = 1;
    CUresult e2 = cuMemcpy3D(&c3);
    CUresult e3 = cuMemcpyAtoH(back, a, 200, 80);  // past the array's 240 bytes
    printf("refused region=%s lod=%s span=%s\n", name(e1), name(e2), name(e3));
    // cuArray3DCreate: a layered 1D array, a cubemap, and invalid requests
    CUDA_ARRAY3D_DESCRIPTOR l = {16, 0, 4, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_LAYERED};
    CUarray la, cube, bad;
    CK(cuArray3DCreate(&la, &l));
    CUDA_ARRAY3D_DESCRIPTOR cd = {8, 8, 6, CU_AD_FORMAT_UNSIGNED_INT8, 4, CUDA_ARRAY3D_CUBEMAP};
    CK(cuArray3DCreate(&cube, &cd));
    CUDA_ARRAY3D_DESCRIPTOR nc = {8, 4, 6, CU_AD_FORMAT_UNSIGNED_INT8, 4, CUDA_ARRAY3D_CUBEMAP};
    CUresult e4 = cuArray3DCreate(&bad, &nc);
    CUDA_ARRAY3D_DESCRIPTOR ch3 = {8, 4, 0, CU_AD_FORMAT_FLOAT, 3, 0};
    CUresult e5 = cuArray3DCreate(&bad, &ch3);
    CUDA_ARRAY_MEMORY_REQUIREMENTS mr;
    CK(cuArrayGetMemoryRequirements(&mr, cube, dev));
    CUmipmappedArray mm;
    CUDA_ARRAY3D_DESCRIPTOR md = {16, 16, 0, CU_AD_FORMAT_FLOAT, 1, 0};
    CK(cuMipmappedArrayCreate(&mm, &md, 5));
    CUDA_ARRAY_MEMORY_REQUIREMENTS mmr;
    CK(cuMipmappedArrayGetMemoryRequirements(&mmr, mm, dev));
    CUarray lv4;
    CK(cuMipmappedArrayGetLevel(&lv4, mm, 4));
    CUDA_ARRAY3D_DESCRIPTOR l4;
    CK(cuArray3DGetDescriptor(&l4, lv4));
    CUresult e10 = cuMipmappedArrayGetLevel(&lv4, mm, 5);
    CUresult e11 = cuArrayDestroy(lv4);  // a level goes with its mipmapped array
    CK(cuMipmappedArrayDestroy(mm));
    printf("array3d cube=%s channels=%s size_ok=%d\n", name(e4), name(e5),
           (int)(mr.size >= 8 * 8 * 6 * 4 && mr.alignment > 0));
    printf("mipmap size_ok=%d level4=%zux%zu past=%s destroy_level=%s\n",
           (int)(mmr.size >= 4 * (256 + 64 + 16 + 4 + 1)), l4.Width, l4.Height, name(e10),
           name(e11));
    // a texture object's descriptors come back as given; a view is not supported
    CUDA_RESOURCE_DESC rd = {};
    rd.resType = CU_RESOURCE_TYPE_ARRAY; rd.res.array.hArray = la;
    CUDA_TEXTURE_DESC td = {};
    td.addressMode[0] = CU_TR_ADDRESS_MODE_BORDER; td.filterMode = CU_TR_FILTER_MODE_LINEAR;
    td.flags = CU_TRSF_NORMALIZED_COORDINATES; td.borderColor[0] = 0.5f;
    CUtexObject t;
    CK(cuTexObjectCreate(&t, &rd, &td, NULL));
    CUDA_TEXTURE_DESC tq; CUDA_RESOURCE_DESC rq;
    CK(cuTexObjectGetTextureDesc(&tq, t));
    CK(cuTexObjectGetResourceDesc(&rq, t));
    CUDA_RESOURCE_VIEW_DESC vd = {};
    CUtexObject t2;
    CUresult e6 = cuTexObjectCreate(&t2, &rd, &td, &vd);
    CUsurfObject s;
    CUresult e7 = cuSurfObjectCreate(&s, &rd);  // not created with SURFACE_LDST
    printf("tex desc_ok=%d res_ok=%d view=%s surf=%s\n",
           (int)(tq.addressMode[0] == CU_TR_ADDRESS_MODE_BORDER && tq.borderColor[0] == 0.5f &&
                 tq.flags == CU_TRSF_NORMALIZED_COORDINATES),
           (int)(rq.resType == CU_RESOURCE_TYPE_ARRAY && rq.res.array.hArray == la), name(e6),
           name(e7));
    CK(cuTexObjectDestroy(t));
    CUresult e8 = cuTexObjectDestroy(t);
    CK(cuArrayDestroy(a));
    CK(cuArrayDestroy(b));
    CK(cuArrayDestroy(la));
    CK(cuArrayDestroy(cube));
    CUresult e9 = cuArrayDestroy(a);
    printf("destroyed again tex=%s array=%s\n", name(e8), name(e9));
    CK(cuCtxDestroy(ctx));
    printf("ok\n");
    return 0;
}
