// Probe: does the int4 decode kernels' weight access pattern, not their arithmetic, hold them under the read rate?
// The staged / ring / digits decode kernels read an expert's int4 rows as stored ([E][N][K/2] bytes): a warp takes 16
// rows, lane (g, q) reads 16 bytes at 16q of rows g and g + 8 each 128-k batch (64 bytes a row), three batches
// a wait, two big batches in flight (gemm/woq_decode.cu). So one warp load touches 8 rows 64 bytes each, and the
// 2112 warps of a wave stream 16 rows apiece. The probe runs that loop with only an xor for the arithmetic on two
// layouts of the same bytes: rows (as stored) and tiles (each 16-row block's batches contiguous, a batch's 16 rows
// x 64 bytes in row order: a warp load reads 512 contiguous bytes), beside a plain read-only reduction (the floor's
// byte rate). GEMMs as the bench's layers give them at 16 tokens: experts touched x n x k, K split over KP CTAs.
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a bench/int4_layout_probe.cu -o /tmp/int4_layout_probe
//   /tmp/int4_layout_probe      (prints one line a GEMM and layout: us, GB/s, x the reduction's rate)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CHECK(x)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));               \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

constexpr int kThreads = 256, kNB = 3;

struct Gemm {
  const char* name;
  int experts, n, k, kp;
};

// The kernels' weight load (gemm/loads.cuh): kept out of L1, L2 asked for the 256-byte run (HINT), or plainly.
template <bool HINT>
__device__ __forceinline__ uint4 ld16(const uint8_t* p) {
  uint4 v;
  if (HINT)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// WORK: extra dependent integer operations a 32-bit word, standing in for the dequantization and the mma.
template <bool TILED, int WORK, bool HINT>
__global__ void __launch_bounds__(kThreads, 2) rows_kernel(const uint8_t* w, int n, int k, int kp, unsigned* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int e = blockIdx.x, part = blockIdx.z;
  const int64_t row0 = static_cast<int64_t>(e) * n + blockIdx.y * 128 + warp * 16;  // the warp's first row
  const int64_t rb = k / 2;                                                             // bytes a row
  const int batches = static_cast<int>(rb / 64), nb = batches / kp, b0 = part * nb;
  const uint8_t* p0;
  int64_t step, r8;
  if (TILED) {  // tile row0 / 16: its batches contiguous, 1 KB each (16 rows x 64 bytes)
    p0 = w + row0 * rb + static_cast<int64_t>(b0) * 1024 + g * 64 + 16 * q;
    step = 1024;
    r8 = 512;
  } else {
    p0 = w + (row0 + g) * rb + static_cast<int64_t>(b0) * 64 + 16 * q;
    step = 64;
    r8 = 8 * rb;
  }
  uint4 a[kNB][2], b[kNB][2];
  unsigned acc = threadIdx.x;
  auto load = [&](uint4 (&buf)[kNB][2], int jb) {
#pragma unroll
    for (int j = 0; j < kNB; ++j) {
      const int jc = min(jb + j, nb - 1);
      buf[j][0] = ld16<HINT>(p0 + jc * step);
      buf[j][1] = ld16<HINT>(p0 + jc * step + r8);
    }
  };
  auto use = [&](uint4 (&buf)[kNB][2]) {
#pragma unroll
    for (int j = 0; j < kNB; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned v[4] = {buf[j][h].x, buf[j][h].y, buf[j][h].z, buf[j][h].w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          unsigned x = v[c];
#pragma unroll
          for (int i = 0; i < WORK; ++i) x = __funnelshift_l(x, x ^ acc, 3) + 0x9e3779b9u;
          acc ^= x;
        }
      }
    }
  };
  load(a, 0);
  load(b, kNB);
  for (int jb = 0; jb < nb; jb += 2 * kNB) {
    use(a);
    if (jb + 2 * kNB < nb) load(a, jb + 2 * kNB);
    if (jb + kNB < nb) use(b);
    if (jb + 3 * kNB < nb) load(b, jb + 3 * kNB);
  }
  if (acc == 0x12345678u) out[0] = acc;  // keeps the loads
}

__global__ void reduce_kernel(const uint4* w, int64_t count, unsigned* out) {
  unsigned acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < count; i += 4 * stride) {
    const uint4 v0 = __ldg(w + i), v1 = __ldg(w + i + stride), v2 = __ldg(w + i + 2 * stride),
                v3 = __ldg(w + i + 3 * stride);
    acc ^= v0.x ^ v0.y ^ v0.z ^ v0.w ^ v1.x ^ v1.y ^ v1.z ^ v1.w;
    acc ^= v2.x ^ v2.y ^ v2.z ^ v2.w ^ v3.x ^ v3.y ^ v3.z ^ v3.w;
  }
  for (; i < count; i += stride) acc ^= w[i].x;
  if (acc == 0x12345678u) out[0] = acc;
}

template <typename F>
float median_us(F&& launch, const uint4* flush, int64_t flush_count, unsigned* out, int sms) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < 25; ++r) {
    reduce_kernel<<<sms * 4, 512>>>(flush, flush_count, out);  // empties L2 of the probe's bytes
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 3) t.push_back(ms * 1000.f);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t max_bytes = 512ll << 20;
  uint8_t* w;
  uint4* flush;
  unsigned* out;
  CHECK(cudaMalloc(&w, max_bytes));
  CHECK(cudaMalloc(&flush, 256ll << 20));
  CHECK(cudaMalloc(&out, 64));
  CHECK(cudaMemset(w, 0x5a, max_bytes));
  CHECK(cudaMemset(flush, 0x33, 256ll << 20));
  const int64_t flush_count = (256ll << 20) / 16;
  // The bench layers' GEMMs at 16 tokens (experts touched, n, k), K split as the plan's decode tile splits it.
  const Gemm gemms[] = {
      {"mixtral_g1", 8, 28672, 4096, 1},   {"mixtral_g2_kp4", 8, 4096, 14336, 4}, {"mixtral_g2_kp1", 8, 4096, 14336, 1},
      {"gptoss_g1", 27, 5760, 2816, 1},    {"gptoss_g2", 27, 2816, 2816, 1},      {"qwen3_g1", 80, 1536, 2048, 1},
      {"qwen3_g2", 80, 2048, 768, 1},      {"dsv2_g1", 48, 2816, 2048, 1},        {"dsv2_g2", 48, 2048, 1408, 1},
  };
  // The read rate: the reduction over 512 MB.
  const float red_us = median_us(
      [&] { reduce_kernel<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(w), max_bytes / 16, out); }, flush,
      flush_count, out, sms);
  const double red_gbs = max_bytes / (red_us * 1e3);
  std::printf("reduction 512 MB: %.1f us, %.0f GB/s\n", red_us, red_gbs);
  // Variants: (layout, WORK, HINT).
  std::printf("%-16s %8s %6s | us and x the reduction's rate: rows w0 h, tiles w0 h, rows w8 h, tiles w8 h, rows w8, "
              "tiles w8 | rows/tiles w8 h\n", "gemm", "MB", "CTAs");
  for (const Gemm& gm : gemms) {
    const int64_t bytes = static_cast<int64_t>(gm.experts) * gm.n * (gm.k / 2);
    const dim3 grid(gm.experts, gm.n / 128, gm.kp);
    auto t = [&](auto kernel) {
      const float us = median_us([&] { kernel<<<grid, kThreads>>>(w, gm.n, gm.k, gm.kp, out); }, flush, flush_count,
                                 out, sms);
      CHECK(cudaGetLastError());
      return us;
    };
    const float us[6] = {t(rows_kernel<false, 0, true>),  t(rows_kernel<true, 0, true>),
                         t(rows_kernel<false, 8, true>),  t(rows_kernel<true, 8, true>),
                         t(rows_kernel<false, 8, false>), t(rows_kernel<true, 8, false>)};
    std::printf("%-16s %8.1f %6d |", gm.name, bytes / 1e6, grid.x * grid.y * grid.z);
    for (float u : us) std::printf(" %6.1f %.2f", u, bytes / (u * 1e3) / red_gbs);
    std::printf(" | %.3f\n", us[2] / us[3]);
  }
  return 0;
}
