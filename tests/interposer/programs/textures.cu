// CUDA arrays, 2D/3D copies, texture and surface objects, each section checked on the host.
// Prints one "<section> ok" line per section, or "<section> FAIL <why>".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>
#include <vector>

#define CK(x)                                                                     \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      printf("%s FAIL %s: %s\n", sec, #x, cudaGetErrorName(e_));                 \
      return;                                                                     \
    }                                                                             \
  } while (0)

static void report(const char* sec, int bad) {
  if (bad) printf("%s FAIL %d\n", sec, bad);
  else printf("%s ok\n", sec);
}

static cudaResourceDesc array_res(cudaArray_t a) {
  cudaResourceDesc rd = {};
  rd.resType = cudaResourceTypeArray;
  rd.res.array.array = a;
  return rd;
}

static float q8(float f) { return roundf(f * 256.0f) / 256.0f; }  // 9-bit filter weights

// ---- 1: rotation with linear filtering, normalized coords, wrap (simpleTexture) -------------
__global__ void rotate(float* out, cudaTextureObject_t t, int w, int h, float theta) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= w || y >= h) return;
  float u = (float)x - (float)w / 2, v = (float)y - (float)h / 2;
  float tu = (u * cosf(theta) - v * sinf(theta)) / w + 0.5f;
  float tv = (v * cosf(theta) + u * sinf(theta)) / h + 0.5f;
  out[y * w + x] = tex2D<float>(t, tu, tv);
}

static float wrap_at(const std::vector<float>& img, int w, int h, int i, int j) {
  i = ((i % w) + w) % w;
  j = ((j % h) + h) % h;
  return img[j * w + i];
}

static void rotation() {
  const char* sec = "rotate";
  const int w = 40, h = 24;
  const float theta = 0.5f;
  std::vector<float> img(w * h);
  for (int i = 0; i < w * h; i++) img[i] = (float)((i * 37) % 101) / 7.0f;
  cudaChannelFormatDesc cd = cudaCreateChannelDesc<float>();
  cudaArray_t arr;
  CK(cudaMallocArray(&arr, &cd, w, h));
  CK(cudaMemcpy2DToArray(arr, 0, 0, img.data(), w * sizeof(float), w * sizeof(float), h,
                         cudaMemcpyHostToDevice));
  cudaResourceDesc rd = array_res(arr);
  cudaTextureDesc td = {};
  td.addressMode[0] = td.addressMode[1] = cudaAddressModeWrap;
  td.filterMode = cudaFilterModeLinear;
  td.readMode = cudaReadModeElementType;
  td.normalizedCoords = 1;
  cudaTextureObject_t t;
  CK(cudaCreateTextureObject(&t, &rd, &td, nullptr));
  float* d;
  CK(cudaMalloc(&d, w * h * sizeof(float)));
  rotate<<<dim3(3, 2), dim3(16, 16)>>>(d, t, w, h, theta);
  std::vector<float> got(w * h);
  CK(cudaMemcpy(got.data(), d, w * h * sizeof(float), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      float u = (float)x - (float)w / 2, v = (float)y - (float)h / 2;
      float tu = (u * cosf(theta) - v * sinf(theta)) / w + 0.5f;
      float tv = (v * cosf(theta) + u * sinf(theta)) / h + 0.5f;
      float xb = tu * w - 0.5f, yb = tv * h - 0.5f;
      int i = (int)floorf(xb), j = (int)floorf(yb);
      float a = q8(xb - i), b = q8(yb - j);
      float t00 = wrap_at(img, w, h, i, j), t10 = wrap_at(img, w, h, i + 1, j);
      float t01 = wrap_at(img, w, h, i, j + 1), t11 = wrap_at(img, w, h, i + 1, j + 1);
      float ref = (1 - a) * (1 - b) * t00 + a * (1 - b) * t10 + (1 - a) * b * t01 + a * b * t11;
      // within one step of the 9-bit weights (the guide does not say how they are rounded)
      float spread = fmaxf(fmaxf(t00, t10), fmaxf(t01, t11)) - fminf(fminf(t00, t10), fminf(t01, t11));
      if (fabsf(ref - got[y * w + x]) > spread / 128.0f + 1e-4f) bad++;
    }
  cudaResourceDesc back;
  CK(cudaGetTextureObjectResourceDesc(&back, t));
  if (back.resType != cudaResourceTypeArray || back.res.array.array != arr) bad += 1000;
  CK(cudaDestroyTextureObject(t));
  CK(cudaFreeArray(arr));
  CK(cudaFree(d));
  report(sec, bad);
}

// ---- 2: 3D array round trip through cudaMemcpy3D, point-sampled tex3D ------------------------
__global__ void fetch3d(int* out, cudaTextureObject_t t, int w, int h, int d) {
  int x = threadIdx.x, y = blockIdx.x % h, z = blockIdx.x / h;
  out[(z * h + y) * w + x] = tex3D<int>(t, x + 0.5f, y + 0.5f, z + 0.5f);
}

static void array3d() {
  const char* sec = "array3d";
  const int w = 8, h = 5, dp = 3;
  std::vector<int> src(w * h * dp), back(w * h * dp, -1);
  for (int i = 0; i < w * h * dp; i++) src[i] = i * 3 + 1;
  cudaChannelFormatDesc cd = cudaCreateChannelDesc<int>();
  cudaArray_t arr;
  CK(cudaMalloc3DArray(&arr, &cd, make_cudaExtent(w, h, dp)));
  cudaMemcpy3DParms p = {};
  p.srcPtr = make_cudaPitchedPtr(src.data(), w * sizeof(int), w, h);
  p.dstArray = arr;
  p.extent = make_cudaExtent(w, h, dp);
  p.kind = cudaMemcpyHostToDevice;
  CK(cudaMemcpy3D(&p));
  cudaMemcpy3DParms q = {};
  q.srcArray = arr;
  q.dstPtr = make_cudaPitchedPtr(back.data(), w * sizeof(int), w, h);
  q.extent = make_cudaExtent(w, h, dp);
  q.kind = cudaMemcpyDeviceToHost;
  CK(cudaMemcpy3D(&q));
  int bad = 0;
  for (int i = 0; i < w * h * dp; i++) bad += back[i] != src[i];
  cudaResourceDesc rd = array_res(arr);
  cudaTextureDesc td = {};
  td.readMode = cudaReadModeElementType;
  cudaTextureObject_t t;
  CK(cudaCreateTextureObject(&t, &rd, &td, nullptr));
  int* d;
  CK(cudaMalloc(&d, w * h * dp * sizeof(int)));
  fetch3d<<<h * dp, w>>>(d, t, w, h, dp);
  std::vector<int> got(w * h * dp);
  CK(cudaMemcpy(got.data(), d, got.size() * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < w * h * dp; i++) bad += got[i] != src[i];
  cudaChannelFormatDesc qd;
  cudaExtent ext;
  unsigned flags;
  CK(cudaArrayGetInfo(&qd, &ext, &flags, arr));
  if (ext.width != w || ext.height != h || ext.depth != dp || qd.x != 32) bad += 1000;
  CK(cudaDestroyTextureObject(t));
  CK(cudaFreeArray(arr));
  CK(cudaFree(d));
  report(sec, bad);
}

// ---- 3: layered 2D array, tex2DLayered with clamp addressing --------------------------------
__global__ void layered(float* out, cudaTextureObject_t t, int w, int h, int layers) {
  int x = threadIdx.x, y = blockIdx.x % h, l = blockIdx.x / h;
  out[(l * h + y) * w + x] = tex2DLayered<float>(t, x - 1.5f, y + 0.5f, l);
}

static void layered2d() {
  const char* sec = "layered";
  const int w = 6, h = 4, L = 3;
  std::vector<float> src(w * h * L);
  for (int i = 0; i < w * h * L; i++) src[i] = 0.25f * i;
  cudaChannelFormatDesc cd = cudaCreateChannelDesc<float>();
  cudaArray_t arr;
  CK(cudaMalloc3DArray(&arr, &cd, make_cudaExtent(w, h, L), cudaArrayLayered));
  cudaMemcpy3DParms p = {};
  p.srcPtr = make_cudaPitchedPtr(src.data(), w * sizeof(float), w, h);
  p.dstArray = arr;
  p.extent = make_cudaExtent(w, h, L);
  p.kind = cudaMemcpyHostToDevice;
  CK(cudaMemcpy3D(&p));
  cudaResourceDesc rd = array_res(arr);
  cudaTextureDesc td = {};
  td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
  cudaTextureObject_t t;
  CK(cudaCreateTextureObject(&t, &rd, &td, nullptr));
  float* d;
  CK(cudaMalloc(&d, src.size() * sizeof(float)));
  layered<<<h * L, w>>>(d, t, w, h, L);
  std::vector<float> got(src.size());
  CK(cudaMemcpy(got.data(), d, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int l = 0; l < L; l++)
    for (int y = 0; y < h; y++)
      for (int x = 0; x < w; x++) {
        int sx = (int)floorf(x - 1.5f);
        sx = sx < 0 ? 0 : sx;
        bad += got[(l * h + y) * w + x] != src[(l * h + y) * w + sx];
      }
  CK(cudaDestroyTextureObject(t));
  CK(cudaFreeArray(arr));
  CK(cudaFree(d));
  report(sec, bad);
}

// ---- 4: surfaces: read, invert, write; clamp and zero boundary modes -------------------------
__global__ void invert(cudaSurfaceObject_t s, int w, int h) {
  int x = threadIdx.x, y = blockIdx.x;
  uchar4 v;
  surf2Dread(&v, s, x * 4, y);
  surf2Dwrite(make_uchar4(255 - v.x, 255 - v.y, 255 - v.z, v.w), s, x * 4, y);
}

__global__ void edges(int* out, cudaSurfaceObject_t s, int w) {
  uchar4 a, b;
  surf2Dread(&a, s, (w + 3) * 4, 0, cudaBoundaryModeClamp);  // the last texel of row 0
  surf2Dread(&b, s, -4, 0, cudaBoundaryModeZero);            // zero
  surf2Dwrite(make_uchar4(1, 2, 3, 4), s, w * 4, 0, cudaBoundaryModeZero);  // dropped
  out[0] = a.x | (a.w << 8);
  out[1] = b.x | b.y | b.z | b.w;
}

static void surfaces() {
  const char* sec = "surface";
  const int w = 16, h = 8;
  std::vector<uchar4> src(w * h), back(w * h);
  for (int i = 0; i < w * h; i++)
    src[i] = make_uchar4(i & 255, (i * 3) & 255, (i * 7) & 255, 200);
  cudaChannelFormatDesc cd = cudaCreateChannelDesc<uchar4>();
  cudaArray_t arr;
  CK(cudaMallocArray(&arr, &cd, w, h, cudaArraySurfaceLoadStore));
  CK(cudaMemcpy2DToArray(arr, 0, 0, src.data(), w * 4, w * 4, h, cudaMemcpyHostToDevice));
  cudaResourceDesc rd = array_res(arr);
  cudaSurfaceObject_t s;
  CK(cudaCreateSurfaceObject(&s, &rd));
  invert<<<h, w>>>(s, w, h);
  int* d;
  CK(cudaMalloc(&d, 2 * sizeof(int)));
  edges<<<1, 1>>>(d, s, w);
  int e[2];
  CK(cudaMemcpy(e, d, sizeof e, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy2DFromArray(back.data(), w * 4, arr, 0, 0, w * 4, h, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < w * h; i++)
    bad += back[i].x != 255 - src[i].x || back[i].y != 255 - src[i].y ||
           back[i].z != 255 - src[i].z || back[i].w != 200;
  int last = 255 - src[w - 1].x;
  if (e[0] != (last | (200 << 8)) || e[1] != 0) {
    printf("%s FAIL edges %#x %#x\n", sec, e[0], e[1]);
    return;
  }
  cudaArray_t plain;
  cudaSurfaceObject_t s2;
  CK(cudaMallocArray(&plain, &cd, w, h));
  rd.res.array.array = plain;
  cudaError_t refused = cudaCreateSurfaceObject(&s2, &rd);
  cudaGetLastError();
  CK(cudaDestroySurfaceObject(s));
  CK(cudaFreeArray(arr));
  CK(cudaFreeArray(plain));
  if (refused == cudaSuccess) bad += 1000;
  report(sec, bad);
}

// ---- 5: tld4 gather; 8/16-bit integers read as normalized floats ----------------------------
__global__ void gather(float4* out, cudaTextureObject_t t, float x, float y) {
  out[0] = tex2Dgather<float4>(t, x, y, 0);
}

__global__ void norm(float4* out, cudaTextureObject_t tu8, cudaTextureObject_t ts8,
                     cudaTextureObject_t tu16, int n) {
  int i = threadIdx.x;
  if (i < n)
    out[i] = make_float4(tex1D<float>(tu8, i + 0.5f), tex1D<float>(ts8, i + 0.5f),
                         tex1D<float>(tu16, i + 0.5f), 0);
}

template <class T>
static cudaTextureObject_t int_tex(cudaArray_t* arr, const T* data, int n) {
  cudaChannelFormatDesc cd = cudaCreateChannelDesc<T>();
  cudaMallocArray(arr, &cd, n, 0);
  cudaMemcpy2DToArray(*arr, 0, 0, data, n * sizeof(T), n * sizeof(T), 1, cudaMemcpyHostToDevice);
  cudaResourceDesc rd = array_res(*arr);
  cudaTextureDesc td = {};
  td.readMode = cudaReadModeNormalizedFloat;
  cudaTextureObject_t t = 0;
  cudaCreateTextureObject(&t, &rd, &td, nullptr);
  return t;
}

static void gather_and_normalized() {
  const char* sec = "gather";
  const int w = 5, h = 4;
  std::vector<float> img(w * h);
  for (int i = 0; i < w * h; i++) img[i] = (float)i;
  cudaChannelFormatDesc cd = cudaCreateChannelDesc<float>();
  cudaArray_t arr;
  CK(cudaMallocArray(&arr, &cd, w, h, cudaArrayTextureGather));
  CK(cudaMemcpy2DToArray(arr, 0, 0, img.data(), w * 4, w * 4, h, cudaMemcpyHostToDevice));
  cudaResourceDesc rd = array_res(arr);
  cudaTextureDesc td = {};
  td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
  cudaTextureObject_t t;
  CK(cudaCreateTextureObject(&t, &rd, &td, nullptr));
  float4* d;
  CK(cudaMalloc(&d, 64 * sizeof(float4)));
  gather<<<1, 1>>>(d, t, 2.2f, 1.7f);  // footprint i0=1, j0=1
  float4 g;
  CK(cudaMemcpy(&g, d, sizeof g, cudaMemcpyDeviceToHost));
  // (i0,j1) (i1,j1) (i1,j0) (i0,j0)
  if (g.x != img[2 * w + 1] || g.y != img[2 * w + 2] || g.z != img[w + 2] || g.w != img[w + 1]) {
    printf("%s FAIL %g %g %g %g\n", sec, g.x, g.y, g.z, g.w);
    return;
  }
  printf("%s ok\n", sec);
  sec = "normalized";
  const int n = 6;
  unsigned char u8[n] = {0, 1, 127, 128, 200, 255};
  signed char s8[n] = {-128, -127, -1, 0, 64, 127};
  unsigned short u16[n] = {0, 1, 1000, 32768, 65000, 65535};
  cudaArray_t a1, a2, a3;
  cudaTextureObject_t t1 = int_tex(&a1, u8, n), t2 = int_tex(&a2, s8, n), t3 = int_tex(&a3, u16, n);
  CK(cudaGetLastError());
  norm<<<1, 32>>>(d, t1, t2, t3, n);
  float4 o[n];
  CK(cudaMemcpy(o, d, sizeof o, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; i++) {
    float r2 = s8[i] / 127.0f;
    r2 = r2 < -1 ? -1 : r2;
    bad += fabsf(o[i].x - u8[i] / 255.0f) > 1e-6f || fabsf(o[i].y - r2) > 1e-6f ||
           fabsf(o[i].z - u16[i] / 65535.0f) > 1e-6f;
  }
  if (bad) printf("%s FAIL %d (%g %g %g)\n", sec, bad, o[2].x, o[0].y, o[3].z);
  else printf("%s ok\n", sec);
}

// ---- 6: linear and pitch2D memory textures; a mipmapped array sampled per level --------------
__global__ void linear_fetch(float* out, cudaTextureObject_t lin, cudaTextureObject_t p2, int n) {
  int i = threadIdx.x;
  out[i] = tex1Dfetch<float>(lin, i - 2);  // out of range -> 0
  out[32 + i] = tex2D<float>(p2, i % 8 + 0.5f, i / 8 + 0.5f);
}

__global__ void lod(float* out, cudaTextureObject_t t) {
  int l = threadIdx.x;
  out[l] = tex2DLod<float>(t, 0.5f, 0.5f, (float)l);
}

static void memory_textures() {
  const char* sec = "linear";
  const int n = 16;
  float* buf;
  CK(cudaMalloc(&buf, n * sizeof(float)));
  std::vector<float> h(n);
  for (int i = 0; i < n; i++) h[i] = 10.0f + i;
  CK(cudaMemcpy(buf, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  cudaResourceDesc rd = {};
  rd.resType = cudaResourceTypeLinear;
  rd.res.linear.devPtr = buf;
  rd.res.linear.desc = cudaCreateChannelDesc<float>();
  rd.res.linear.sizeInBytes = n * sizeof(float);
  cudaTextureDesc td = {};
  cudaTextureObject_t lin, p2;
  CK(cudaCreateTextureObject(&lin, &rd, &td, nullptr));
  float* pitched;
  size_t pitch;
  CK(cudaMallocPitch(&pitched, &pitch, 8 * sizeof(float), 4));
  std::vector<float> img(32);
  for (int i = 0; i < 32; i++) img[i] = i * 0.5f;
  CK(cudaMemcpy2D(pitched, pitch, img.data(), 32, 32, 4, cudaMemcpyHostToDevice));
  cudaResourceDesc rp = {};
  rp.resType = cudaResourceTypePitch2D;
  rp.res.pitch2D.devPtr = pitched;
  rp.res.pitch2D.desc = cudaCreateChannelDesc<float>();
  rp.res.pitch2D.width = 8;
  rp.res.pitch2D.height = 4;
  rp.res.pitch2D.pitchInBytes = pitch;
  CK(cudaCreateTextureObject(&p2, &rp, &td, nullptr));
  float* d;
  CK(cudaMalloc(&d, 64 * sizeof(float)));
  linear_fetch<<<1, 32>>>(d, lin, p2, n);
  float o[64];
  CK(cudaMemcpy(o, d, sizeof o, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < 32; i++) {
    int k = i - 2;
    bad += o[i] != ((k >= 0 && k < n) ? h[k] : 0.0f);
    bad += o[32 + i] != img[i];
  }
  report(sec, bad);
  sec = "mipmap";
  cudaMipmappedArray_t mip;
  cudaChannelFormatDesc cd = cudaCreateChannelDesc<float>();
  CK(cudaMallocMipmappedArray(&mip, &cd, make_cudaExtent(8, 8, 0), 4));
  for (int l = 0; l < 4; l++) {
    cudaArray_t lv;
    CK(cudaGetMipmappedArrayLevel(&lv, mip, l));
    int s = 8 >> l;
    std::vector<float> v(s * s, 100.0f + l);
    CK(cudaMemcpy2DToArray(lv, 0, 0, v.data(), s * 4, s * 4, s, cudaMemcpyHostToDevice));
  }
  cudaResourceDesc rm = {};
  rm.resType = cudaResourceTypeMipmappedArray;
  rm.res.mipmap.mipmap = mip;
  cudaTextureDesc tm = {};
  tm.normalizedCoords = 1;
  tm.mipmapFilterMode = cudaFilterModePoint;
  tm.maxMipmapLevelClamp = 3;
  cudaTextureObject_t tt;
  CK(cudaCreateTextureObject(&tt, &rm, &tm, nullptr));
  lod<<<1, 4>>>(d, tt);
  CK(cudaMemcpy(o, d, 4 * sizeof(float), cudaMemcpyDeviceToHost));
  bad = 0;
  for (int l = 0; l < 4; l++) bad += o[l] != 100.0f + l;
  if (bad) printf("%s FAIL %g %g %g %g\n", sec, o[0], o[1], o[2], o[3]);
  else printf("%s ok\n", sec);
}

// ---- 7: array copies captured into a graph, and an explicit memcpy node naming an array -------
static void graph_copies() {
  const char* sec = "graph";
  const int w = 12, h = 5;
  std::vector<short> src(w * h), back(w * h, 0), back2(w * h, 0);
  for (int i = 0; i < w * h; i++) src[i] = (short)(i * 11 - 300);
  cudaChannelFormatDesc cd = cudaCreateChannelDesc<short>();
  cudaArray_t arr;
  CK(cudaMallocArray(&arr, &cd, w, h));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  CK(cudaMemcpy2DToArrayAsync(arr, 0, 0, src.data(), w * 2, w * 2, h, cudaMemcpyHostToDevice, st));
  CK(cudaMemcpy2DFromArrayAsync(back.data(), w * 2, arr, 0, 0, w * 2, h, cudaMemcpyDeviceToHost,
                                st));
  CK(cudaStreamEndCapture(st, &g));
  cudaMemcpy3DParms p = {};
  p.srcArray = arr;
  p.dstPtr = make_cudaPitchedPtr(back2.data(), w * 2, w, h);
  p.extent = make_cudaExtent(w, h, 1);
  p.kind = cudaMemcpyDeviceToHost;
  cudaGraphNode_t last = nullptr, node;
  size_t n = 0;
  CK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CK(cudaGraphGetNodes(g, nodes.data(), &n));
  last = nodes[n - 1];
  CK(cudaGraphAddMemcpyNode(&node, g, &last, 1, &p));
  cudaGraphExec_t x;
  CK(cudaGraphInstantiate(&x, g, 0));
  CK(cudaGraphLaunch(x, st));
  CK(cudaStreamSynchronize(st));
  int bad = 0;
  for (int i = 0; i < w * h; i++) bad += back[i] != src[i] || back2[i] != src[i];
  CK(cudaGraphExecDestroy(x));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(st));
  CK(cudaFreeArray(arr));
  report(sec, bad);
}

int main() {
  rotation();
  array3d();
  layered2d();
  surfaces();
  gather_and_normalized();
  memory_textures();
  graph_copies();
  printf("done %s\n", cudaGetErrorName(cudaDeviceSynchronize()));
  return 0;
}
