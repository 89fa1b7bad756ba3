// mma.sync throughput on this GPU: u4 x s4 m16n8k64 against u8 x s8 m16n8k32 (and bf16 m16n8k16), in MACs a second
// and a clock an SM (the clock cudaDevAttrClockRate reports, the GPU's highest), then one u4 mma checked against its
// definition (docs/experiments.md, "The int4 mma for the digits tile"). Run:
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -o mma_rate bench/mma_rate_probe.cu && ./mma_rate
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
template <int KIND>
__global__ void k(const uint32_t* in, int* out, int iters) {
  const int t = threadIdx.x;
  uint32_t a0 = in[t & 31], a1 = in[(t + 1) & 31], a2 = in[(t + 2) & 31], a3 = in[(t + 3) & 31], b0 = in[(t + 4) & 31], b1 = in[(t + 5) & 31];
  int d[4][4] = {};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (KIND == 0)
        asm volatile("mma.sync.aligned.m16n8k64.row.col.s32.u4.s4.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+r"(d[j][0]), "+r"(d[j][1]), "+r"(d[j][2]), "+r"(d[j][3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
      else if (KIND == 1)
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+r"(d[j][0]), "+r"(d[j][1]), "+r"(d[j][2]), "+r"(d[j][3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
      else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+r"(d[j][0]), "+r"(d[j][1]), "+r"(d[j][2]), "+r"(d[j][3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
  int s = 0;
  for (int j = 0; j < 4; ++j) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  out[blockIdx.x * blockDim.x + t] = s;
}
// One u4 mma against its definition: A 16x64 unsigned nibbles, B 64x8 signed nibbles, fragments as PTX's m16n8k64 layout.
__global__ void check(const uint32_t* a, const uint32_t* b, int* c) {
  const int t = threadIdx.x;
  int d[4] = {0, 0, 0, 0};
  asm volatile("mma.sync.aligned.m16n8k64.row.col.s32.u4.s4.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
    : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]) : "r"(a[4 * t]), "r"(a[4 * t + 1]), "r"(a[4 * t + 2]), "r"(a[4 * t + 3]), "r"(b[2 * t]), "r"(b[2 * t + 1]));
  for (int i = 0; i < 4; ++i) c[4 * t + i] = d[i];
}
int main() {
  uint32_t* in; int* out; cudaMalloc(&in, 128); cudaMalloc(&out, 1 << 24);
  cudaMemset(in, 0x11, 128);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  const char* names[3] = {"u4.s4 m16n8k64", "u8.s8 m16n8k32", "bf16 m16n8k16"};
  const double macs[3] = {16.0 * 8 * 64, 16.0 * 8 * 32, 16.0 * 8 * 16};
  for (int kind = 0; kind < 3; ++kind) {
    for (int warps : {4, 8, 16}) {
      const int iters = 4096, blocks = sms * 2;
      auto launch = [&] {
        if (kind == 0) k<0><<<blocks, 32 * warps>>>(in, out, iters);
        else if (kind == 1) k<1><<<blocks, 32 * warps>>>(in, out, iters);
        else k<2><<<blocks, 32 * warps>>>(in, out, iters);
      };
      launch(); cudaDeviceSynchronize();
      cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
      cudaEventRecord(e0); launch(); cudaEventRecord(e1); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1);
      const double total = macs[kind] * 4.0 * iters * blocks * warps;
      printf("{\"mma\": \"%s\", \"warps_per_cta\": %d, \"ctas_per_sm\": 2, \"ms\": %.3f, \"tera_macs_per_s\": %.1f, \"macs_per_clk_per_sm_at_base\": %.0f}\n",
             names[kind], warps, ms, total / ms / 1e9, total / (ms * 1e-3) / sms / (clk * 1e3));
    }
  }
  // Layout check of the u4 mma.
  uint32_t ha[128], hb[64]; unsigned seed = 12345;
  for (auto& v : ha) { seed = seed * 1664525u + 1013904223u; v = seed; }
  for (auto& v : hb) { seed = seed * 1664525u + 1013904223u; v = seed; }
  uint32_t *da, *db; int* dc; cudaMalloc(&da, 512); cudaMalloc(&db, 256); cudaMalloc(&dc, 512);
  cudaMemcpy(da, ha, 512, cudaMemcpyHostToDevice); cudaMemcpy(db, hb, 256, cudaMemcpyHostToDevice);
  check<<<1, 32>>>(da, db, dc); int hc[128]; cudaMemcpy(hc, dc, 512, cudaMemcpyDeviceToHost);
  // Reference: A row-major 16x64: thread t (g = t/4, q = t%4) holds a0: row g, k 8q..8q+7; a1: row g+8; a2: row g, k 32+8q..; a3: row g+8, k 32+8q..
  // B col 64x8: b0: col g, k 8q..8q+7; b1: col g, k 32+8q..; nibble i of a register = k + i.
  int A[16][64], B[64][8];
  for (int t = 0; t < 32; ++t) {
    const int g = t / 4, q = t % 4;
    for (int i = 0; i < 8; ++i) {
      A[g][8 * q + i] = (ha[4 * t] >> 4 * i) & 15; A[g + 8][8 * q + i] = (ha[4 * t + 1] >> 4 * i) & 15;
      A[g][32 + 8 * q + i] = (ha[4 * t + 2] >> 4 * i) & 15; A[g + 8][32 + 8 * q + i] = (ha[4 * t + 3] >> 4 * i) & 15;
      auto s4 = [](uint32_t v) { int x = v & 15; return x >= 8 ? x - 16 : x; };
      B[8 * q + i][g] = s4(hb[2 * t] >> 4 * i); B[32 + 8 * q + i][g] = s4(hb[2 * t + 1] >> 4 * i);
    }
  }
  int bad = 0;
  for (int t = 0; t < 32; ++t) {
    const int g = t / 4, q = t % 4;
    for (int i = 0; i < 4; ++i) {
      const int r = g + (i >= 2 ? 8 : 0), c = 2 * q + (i & 1);
      int s = 0; for (int kk = 0; kk < 64; ++kk) s += A[r][kk] * B[kk][c];
      bad += s != hc[4 * t + i];
    }
  }
  printf("{\"u4_layout_check_mismatches\": %d}\n", bad);
  return 0;
}
