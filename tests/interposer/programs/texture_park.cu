// A CUDA array with a texture and a surface object over it, written before its session is
// parked to a file and restored on another daemon (or migrated), then sampled, written and
// read back after the move: the array is session memory and the objects are descriptors in
// it, so both come back with the session. Prints "after ... ok=1" when every value matches
// the host's own computation.
#include <cmath>
#include <cstdio>
#include <cuda_runtime.h>

__global__ void fill(cudaSurfaceObject_t s, int w, int h, float k) {
  int x = threadIdx.x, y = blockIdx.x;
  if (x < w && y < h) surf2Dwrite(k * (y * w + x), s, x * (int)sizeof(float), y);
}

__global__ void sample(float* out, cudaTextureObject_t t, cudaSurfaceObject_t s, int w, int h) {
  int x = threadIdx.x, y = blockIdx.x;
  if (x >= w || y >= h) return;
  out[y * w + x] = tex2D<float>(t, x + 1.0f, y + 0.5f);  // halfway to the next texel
  float v;
  surf2Dread(&v, s, x * (int)sizeof(float), y);
  surf2Dwrite(v + 1.0f, s, x * (int)sizeof(float), y);
}

int main() {
  const int w = 32, h = 16;
  cudaChannelFormatDesc cd = cudaCreateChannelDesc<float>();
  cudaArray_t arr;
  cudaError_t e1 = cudaMallocArray(&arr, &cd, w, h, cudaArraySurfaceLoadStore);
  cudaResourceDesc rd = {};
  rd.resType = cudaResourceTypeArray;
  rd.res.array.array = arr;
  cudaTextureDesc td = {};
  td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
  td.filterMode = cudaFilterModeLinear;
  cudaTextureObject_t t;
  cudaSurfaceObject_t s;
  cudaError_t e2 = cudaCreateTextureObject(&t, &rd, &td, nullptr);
  cudaError_t e3 = cudaCreateSurfaceObject(&s, &rd);
  fill<<<h, w>>>(s, w, h, 2.0f);
  cudaError_t e4 = cudaDeviceSynchronize();
  printf("before array=%s tex=%s surf=%s sync=%s\n", cudaGetErrorName(e1), cudaGetErrorName(e2),
         cudaGetErrorName(e3), cudaGetErrorName(e4));
  printf("ready\n");
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 2;  // the test moves the session meanwhile
  float* d;
  cudaMalloc(&d, w * h * sizeof(float));
  sample<<<h, w>>>(d, t, s, w, h);
  static float got[w * h], back[w * h];
  cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost);
  cudaError_t e5 = cudaMemcpy2DFromArray(back, w * sizeof(float), arr, 0, 0, w * sizeof(float), h,
                                         cudaMemcpyDeviceToHost);
  bool ok = true;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      float a = 2.0f * (y * w + x), b = 2.0f * (y * w + (x + 1 < w ? x + 1 : x));
      ok = ok && fabsf(got[y * w + x] - 0.5f * (a + b)) < 1e-4f;
      ok = ok && back[y * w + x] == a + 1.0f;
    }
  printf("after copy=%s ok=%d\n", cudaGetErrorName(e5), (int)ok);
  cudaDestroyTextureObject(t);
  cudaDestroySurfaceObject(s);
  cudaFreeArray(arr);
  return ok ? 0 : 1;
}
