// A probe of the int4 decode lead in docs/performance.md ("No pipe at its ceiling"): one token against int4 weights
// (group 128, fp32 scales, 4-bit zero points) on the int8 mma, the codes widened to 8 bits with one shift and two
// masks a 32-bit word, the 16-bit token split into three 8-bit digits per 128-k group beforehand. Not product code:
// bench/int4_imma_probe.py builds it with nvcc, times it beside the product's staged decode kernel on the same bytes
// and checks it against fp64.
//
// Token digits (made by the probe's host code, as an expansion would): per 128-k group g, t = 2^E_g * D / 4096 with
// D = 4096 d0 + 64 d1 + d2 (d0 in [-64, 64], d1 and d2 in [-32, 32]), exact where t is within 2^10 of the group's
// largest; planes 0..2 hold d0, d1, d2 and plane 3 zeros, each permuted so that a lane's 8-byte load is its B fragment
// (below); T_g = sum of D over the group, F_g = 2^E_g / 4096.
// y[n] = sum_g s[n, g] * F_g * (sum_k u_k D_k - z[n, g] * T_g): the int8 mma's column c of the 8 is digit plane c, so
// one m16n8k32 step sums all three digits of 32 k for 16 rows; lane q = 0 combines 4096 S0 + 64 S1 - z T (exact in
// int32), lane q = 1 holds S2; each adds its part times s F in fp32, and the lanes are summed at the end.
#include <cstdint>
#include <type_traits>

#include "gemm/loads.cuh"  // the decode kernels' weight loads

namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerCta = 16 * kWarps;
constexpr int kNB = 4;  // 128-k batches a warp loads per wait, double-buffered

__device__ __forceinline__ void imma(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                     uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// W uint8 [N, K/2] (low nibble the even k), S fp32 [N, K/128], Z uint8 [N, K/128], digits int8 [4][K + 32] permuted,
// T int32 [K/128], F fp32 [K/128], y fp32 [N]. N a multiple of 128, K of 128 * kNB.
__global__ void __launch_bounds__(kWarps * 32, 2)
    int4_imma_gemv(const uint8_t* __restrict__ W, const float* __restrict__ S, const uint8_t* __restrict__ Z,
                   const int8_t* __restrict__ digits, const int* __restrict__ T, const float* __restrict__ F,
                   float* __restrict__ y, int N, int K) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int G = K / 128, plane = K + 32;
  int* sT = reinterpret_cast<int*>(smem + 4 * plane);
  float* sF = reinterpret_cast<float*>(sT + G);
  for (int i = threadIdx.x * 16; i < 4 * plane; i += blockDim.x * 16)
    *reinterpret_cast<uint4*>(smem + i) = *reinterpret_cast<const uint4*>(digits + i);
  for (int i = threadIdx.x; i < G; i += blockDim.x) {
    sT[i] = T[i];
    sF[i] = F[i];
  }
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + warp * 16 + g;  // and row + 8
  const uint8_t* w0 = W + row * (K / 2) + q * 16;
  const uint8_t* w1 = w0 + 8 * static_cast<int64_t>(K / 2);
  const float* s0p = S + row * G;
  const float* s1p = s0p + 8 * G;
  const uint8_t* z0p = Z + row * G;
  const uint8_t* z1p = z0p + 8 * G;
  const unsigned char* dp = smem + min(g, 3) * plane + q * 8;
  const int wa = q == 0 ? 4096 : q == 1 ? 1 : 0, wb = q == 0 ? 64 : 0, zt = q == 0 ? 1 : 0;

  uint4 wbuf[2][kNB][2];
  float sv[2][kNB][2];
  int zv[2][kNB][2];
  auto load = [&](int b, int bt0) {
#pragma unroll
    for (int j = 0; j < kNB; ++j) {
      const int bt = bt0 + j;
      wbuf[b][j][0] = mbk::ld_weights_in_bounds(w0 + bt * 64);
      wbuf[b][j][1] = mbk::ld_weights_in_bounds(w1 + bt * 64);
      sv[b][j][0] = __ldg(s0p + bt);
      sv[b][j][1] = __ldg(s1p + bt);
      zv[b][j][0] = __ldg(z0p + bt);
      zv[b][j][1] = __ldg(z1p + bt);
    }
  };
  float acc0 = 0.f, acc1 = 0.f;
  auto compute = [&](int b, int j, int bt) {
    int c[4] = {0, 0, 0, 0};
    const uint4 r0 = wbuf[b][j][0], r1 = wbuf[b][j][1];
    const uint32_t x0[4] = {r0.x, r0.y, r0.z, r0.w}, x1[4] = {r1.x, r1.y, r1.z, r1.w};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint2 bb = *reinterpret_cast<const uint2*>(dp + (bt * 4 + s) * 32);
      imma(c, x0[s] & 0x0f0f0f0fu, x1[s] & 0x0f0f0f0fu, (x0[s] >> 4) & 0x0f0f0f0fu, (x1[s] >> 4) & 0x0f0f0f0fu, bb.x,
           bb.y);
    }
    const int tg = sT[bt];
    const float fg = sF[bt];
    const int R0 = c[0] * wa + c[1] * wb - zt * zv[b][j][0] * tg;
    const int R1 = c[2] * wa + c[3] * wb - zt * zv[b][j][1] * tg;
    acc0 = fmaf(sv[b][j][0] * fg, static_cast<float>(R0), acc0);
    acc1 = fmaf(sv[b][j][1] * fg, static_cast<float>(R1), acc1);
  };
  // One big batch from buffer `cur` (a compile-time constant, so the buffers stay registers): its first batch, then
  // the next big batch's loads into the other buffer, then its other batches (the staged kernel's order).
  auto step = [&](auto cur_tag, int bt) {
    constexpr int cur = decltype(cur_tag)::value;
    compute(cur, 0, bt);
    if (bt + kNB < G) load(cur ^ 1, bt + kNB);
#pragma unroll
    for (int j = 1; j < kNB; ++j) compute(cur, j, bt + j);
  };
  load(0, 0);
  for (int bt = 0; bt < G; bt += 2 * kNB) {
    step(std::integral_constant<int, 0>{}, bt);
    if (bt + kNB >= G) break;
    step(std::integral_constant<int, 1>{}, bt + kNB);
  }
  acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
  acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
  acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
  acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
  if (q == 0) {
    y[row] = acc0;
    y[row + 8] = acc1;
  }
}

}  // namespace

extern "C" int int4_imma_gemv_launch(const void* W, const void* S, const void* Z, const void* digits, const void* T,
                                     const void* F, void* y, int N, int K, void* stream) {
  if (N % kRowsPerCta != 0 || K % (128 * kNB) != 0) return 1;
  const size_t smem = 4 * static_cast<size_t>(K + 32) + 8 * static_cast<size_t>(K / 128);
  if (smem > 48 * 1024 &&
      cudaFuncSetAttribute(int4_imma_gemv, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) !=
          cudaSuccess)
    return 2;
  int4_imma_gemv<<<N / kRowsPerCta, kWarps * 32, smem, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint8_t*>(W), static_cast<const float*>(S), static_cast<const uint8_t*>(Z),
      static_cast<const int8_t*>(digits), static_cast<const int*>(T), static_cast<const float*>(F),
      static_cast<float*>(y), N, K);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
