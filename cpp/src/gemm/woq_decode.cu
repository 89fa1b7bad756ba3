// Weight-only grouped GEMM, decode kernels (tactic kernel MB_GEMM_DECODE; the operation, the stored forms and the
// launch are gemm/woq.cuh's and gemm/woq_abi.cu's): for the few rows per expert of decode. int4 with group 128 or
// one scale per row and k % 128 == 0 (AWQ's and GPTQ's forms), or group 64 and k % 64 == 0, runs
// woq_decode_int4_staged_kernel with the tactic's tile MB_TILE_DECODE_STAGED (the planner's where the token rows fit
// its shared memory, tactics.woq.woq_decode_tile_rule) or MB_TILE_DECODE_STAGED_C4 (K split over a cluster of four
// CTAs, each staging its quarter of the rows: long K); group 128 or 0 elsewhere woq_decode_int4_codes_kernel (below:
// the same layout on about half the instructions); every other form the first kernel.
//   MB_WOQ_INT4 : B uint8 [E, n, k/2], two 4-bit codes u per byte (low nibble the even column), in rows, or in
//                 16-row tiles (MB_WOQ_INT4_TILES: a 128-k batch of 16 rows 1024 contiguous bytes, so a warp's load
//                 reads 512 contiguous bytes where rows give it 8 runs of 64; moe_build_kernels.h);
//                 w = (u - z) * s, s fp32 [E, n, k/group] (group 0: [E, n, 1]), z uint8 of the same shape, or
//                 8 when zeros is NULL (symmetric int4 stored as q + 8);
//   MB_WOQ_INT8 : B int8 [E, n, k]; w = q * s;
//   MB_WOQ_MXFP4: B uint8 [E, n, k/2] e2m1 codes, scales uint8 e8m0 [E, n, k/32]; w = e2m1(u) * 2^(e - 127).
// The dequantized weight is rounded once to A's type before the mma (gemm/woq.cuh's dequantization, shared with
// gemm/woq_mma.cu: int4 through the magic-number conversion and the split scale, within one unit in the last
// place of the rounded fp32 product; MXFP4 by a 16-bit multiply by a power of two, exact, or in fp32 for a batch
// where a warp's scale exceeds 2^1; int8 in fp32).
//
// The layout of gemm/decode.cu (swap-AB: weights are the 16-row A operand, up to 8 token rows the B
// operand; CTA = 8 warps = (expert, chunk of <= 8 rows, 128 / WK weight rows); WK warps split K; partial
// sums reduced in fixed warp order), with one difference in how a lane walks k: a lane takes 32
// consecutive k of its two weight rows per batch (16 bytes of int4 or MXFP4, 32 of int8: whole sectors),
// spent over the batch's four k32 steps as k = 32q + 8u + {0..7} for step u. The dot product does not care
// which physical k fills which fragment slot as long as a lane's weights and tokens agree, and the lane's
// token row is read at the same k. A lane's 32 k lie in one scale group (groups are 32, 64 or 128 and the
// batches start on multiples of 128), so a batch needs one scale (and zero) per weight row.
//
// Weights stream from HBM once, so the kernel is built to keep bytes in flight: 128 bytes of weights per lane
// (with their scales and zeros) sit in a register ring of kStages batches, each slot refilled with the batch
// kStages ahead as soon as its batch is spent: an int4 / MXFP4 lane has 3-4 batches of 32 bytes requested at any
// time (96-128 bytes, against 32 with a double buffer), at 2 CTAs per SM (launch bounds: <= 128 registers) 48-64
// KB per SM, what ~4 TB/s needs at HBM's loaded latency of ~1.5 us (~45 KB per SM); int8's 64-byte batches fit
// two slots in the same registers (64-128 bytes). The tokens (L1/L2-resident, read by every warp of the CTA) are
// only double-buffered, one batch ahead. That is the intent; the SASS does less (bench/sass_loops.py --waits): ptxas
// gives every load of a batch one scoreboard and each batch's first instruction waits on it, the prefetches issued
// a batch earlier included, so a warp waits about one memory latency a batch (docs/experiments.md, where the
// shared-memory rings tried against it are).
#include <algorithm>
#include <cstdint>

#include <cooperative_groups.h>

#include "gemm/decode_launch.cuh"
#include "gemm/loads.cuh"
#include "gemm/mma.cuh"
#include "gemm/woq.cuh"
#include "gemm/woq_decode_sums.cuh"

namespace mbk {
namespace {

// Batches of weights in the register ring: 128 bytes of weights per lane, 4 batches of int4 / MXFP4 or 2 of int8.
template <int KIND>
constexpr int kStages = KIND == MB_WOQ_INT8 ? 2 : 4;

// The CTA's sums to C: a lane's accumulators (fragment rows g and g + 8, tokens 2q and 2q + 1) to shared memory,
// then gemm/woq_decode_sums.cuh's store.
template <typename T, int WK, int R>
__device__ __forceinline__ void store_sums(const WoqGemmParams& p, float (&s_part)[WK][R][kDecodeTokens + 1],
                                           const float (&acc)[4], int expert, int64_t row_begin, int rows, int col0,
                                           int ks, int rg) {
  const int lane = threadIdx.x & 31, q = lane & 3, g = lane >> 2;
#pragma unroll
  for (int c = 0; c < 4; ++c) s_part[ks][rg * 16 + g + (c >> 1) * 8][2 * q + (c & 1)] = acc[c];
  __syncthreads();
  store_part_sums<T, WK>(p, s_part, expert, row_begin, rows, col0);
}

template <typename T, int KIND, int WK>
__global__ void __launch_bounds__(kDecodeThreads, 2) grouped_woq_decode_kernel(WoqGemmParams p) {
  constexpr int R = 16 * (kDecodeWarps / WK);  // weight rows per CTA (= output columns)
  constexpr int U = 4;                       // k32 steps per batch (128 k)
  constexpr int S = kStages<KIND>;
  static_assert(S % 2 == 0, "the token double buffer is indexed by the ring slot's parity");
  constexpr int RAW = KIND == MB_WOQ_INT8 ? 2 : 1;  // 16-byte weight loads per row per batch
  __shared__ float s_part[WK][R][kDecodeTokens + 1];

  const TileRows tile = cta_find_tile<kDecodeTokens>(p.offsets, p.num_experts);
  const int expert = tile.expert;
  if (expert < 0) return;
  const int64_t row_begin = tile.begin;
  const int rows = static_cast<int>(tile.end - row_begin);
  const int N = p.n, K = p.k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane & 3, g = lane >> 2;
  const int rg = warp / WK, ks = warp % WK;
  const int col0 = blockIdx.y * R;
  // A lane's k to its scale group: k >> shift (MXFP4's 32, or the group), or group 0's one scale per row.
  const int group_shift = KIND == MB_WOQ_MXFP4 || p.group == 32 ? 5 : p.group == 64 ? 6 : 7;
  const int group_mask = KIND == MB_WOQ_MXFP4 || p.group ? -1 : 0;
  const int groups = KIND == MB_WOQ_MXFP4 ? K / kMxfp4Group : (p.group ? K / p.group : 1);

  const uint8_t* wptr[2];      // the lane's two weight rows (int8, MXFP4)
  int64_t wrows[2], srow[2];   // their indices (int4, read in rows or in tiles), their scale (and zero) rows
  const bool tiles = p.kind == MB_WOQ_INT4_TILES;
  bool wok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int feat = col0 + rg * 16 + h * 8 + g;
    wok[h] = feat < N;
    const int64_t wrow = static_cast<int64_t>(expert) * N + (wok[h] ? feat : 0);
    wptr[h] = p.B + wrow * (KIND == MB_WOQ_INT8 ? K : K / 2);
    wrows[h] = wrow;
    srow[h] = wrow * groups;
  }
  const bool aok = g < rows;
  const int64_t arow_index = row_begin + (aok ? g : 0);
  const T* arow = static_cast<const T*>(p.A) + arow_index * K;

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const int kslice = decode_k_slice(K, WK);
  const int kb = ks * kslice, ke = min(K, kb + kslice);

  uint4 w[S][2][RAW], a[2][U];
  uint32_t sv[S][2], zv[S][2];  // the stored scale and zero of each slot's rows
  auto load_weights = [&](int slot, int k0) {
    const int k = k0 + 32 * q;  // this lane's 32 k
    const bool kin = k < ke;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool ok = kin && wok[h];
      const uint8_t* src = KIND == MB_WOQ_INT4 ? p.B + int4_offset(tiles, wrows[h], k / 2, K / 2)
                                               : wptr[h] + (KIND == MB_WOQ_INT8 ? k : k / 2);
#pragma unroll
      for (int r = 0; r < RAW; ++r) w[slot][h][r] = ld_weights(src + 16 * r, ok);
      const int64_t si = srow[h] + ((k >> group_shift) & group_mask);
      sv[slot][h] = KIND == MB_WOQ_MXFP4 ? ld_u8(static_cast<const uint8_t*>(p.scales) + si, ok)
                                         : ld_b32(static_cast<const float*>(p.scales) + si, ok);
      zv[slot][h] = KIND == MB_WOQ_INT4 && p.zeros ? ld_u8(p.zeros + si, ok) : 8u;
    }
  };
  auto load_tokens = [&](int buf, int k0) {
    const int k = k0 + 32 * q;
#pragma unroll
    for (int u = 0; u < U; ++u) a[buf][u] = ld_tokens(arow + k + 8 * u, k < ke && aok);
  };
  auto compute = [&](int slot, int buf) {
    RowConsts rc[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) rc[h] = row_consts<KIND>(woq_consts<T, KIND>(sv[slot][h], zv[slot][h]));
    auto run = [&](auto fast_tag) {
      constexpr bool kFast = decltype(fast_tag)::value;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        uint32_t frag[2][4];  // k 8u + 0..3 and 8u + 4..7: {row g, row g + 8, row g, row g + 8}
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4& r = w[slot][h][KIND == MB_WOQ_INT8 ? u >> 1 : 0];
          const uint32_t words[4] = {r.x, r.y, r.z, r.w};
          uint32_t pairs[4];
          dequant_step<T, KIND, kFast>(words[u], make_uint2(words[(u & 1) * 2], words[(u & 1) * 2 + 1]), rc[h],
                                       pairs);
          frag[0][h] = pairs[0];
          frag[0][2 + h] = pairs[1];
          frag[1][h] = pairs[2];
          frag[1][2 + h] = pairs[3];
        }
        const uint4& tok = a[buf][u];  // the token row's 8 T at step u's k
        mma16816<MmaName<T>::kBf16>(acc, frag[0], tok.x, tok.y);
        mma16816<MmaName<T>::kBf16>(acc, frag[1], tok.z, tok.w);
      }
    };
    if constexpr (KIND == MB_WOQ_MXFP4) {
      if (__all_sync(0xffffffffu, rc[0].a && rc[1].a)) {
        run(std::true_type{});
      } else {
        run(std::false_type{});
      }
    } else {
      run(std::true_type{});
    }
  };
  // Weights and their constants (nothing upstream writes them) are requested before waiting for the kernel that
  // writes A; loads past the slice are predicated off.
#pragma unroll
  for (int s = 0; s < S; ++s) load_weights(s, kb + 128 * s);
  mb::wait_for_predecessor();
  mb::let_dependents_start();
  load_tokens(0, kb);
  for (int k0 = kb; k0 < ke; k0 += S * 128) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const int kc = k0 + 128 * s;
      if (kc < ke) {  // warp-uniform
        load_tokens((s + 1) & 1, kc + 128);
        compute(s, s & 1);
        load_weights(s, kc + 128 * S);
      }
    }
  }
  store_sums<T, WK>(p, s_part, acc, expert, row_begin, rows, col0, ks, rg);
}

// Step u of a lane's two rows of int4 codes (rows g and g + 8: a batch's 16 bytes each) as the mma's A fragments,
// the exact integers u - z in T: k 8u + 0..3 in frag[0], 8u + 4..7 in frag[1], each {row g, row g + 8, row g,
// row g + 8}. zv: -(magic + z) in both halves, per row (int4_neg_zero).
template <typename T>
__device__ __forceinline__ void int4_codes_step(const uint4 (&w)[2], int u, const uint32_t (&zv)[2],
                                                uint32_t (&frag)[2][4]) {
  using H = Woq16<T>;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t words[4] = {w[h].x, w[h].y, w[h].z, w[h].w};
    const uint32_t wd = words[u], ws = wd >> 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // byte i's low nibble (the even k) to bits 0-3, its high nibble to bits 16-19
      const uint32_t placed = and_or<0x000f000fu, H::kMagic>(__byte_perm(wd, ws, 0x0400u + 0x0101u * i));
      frag[i >> 1][(i & 1) * 2 + h] = fma2<T>(placed, H::kOne, zv[h]);  // (magic + u) - (magic + z), exact
    }
  }
}

// A stored zero byte as -(magic + z) in both halves; without zero points the byte read is a scale's, masked to 0
// (zmask) with 8 or-ed in (zor): symmetric int4 stored as q + 8.
template <typename T>
__device__ __forceinline__ uint32_t int4_neg_zero(uint32_t stored, uint32_t zmask, uint32_t zor) {
  return (Woq16<T>::kMagic | kNegZero2) + ((stored & zmask) | zor) * 0x00010001u;
}

// int4 with one scale per 128 k (group 128) or per row (group 0), k % 128 == 0: the common AWQ / GPTQ forms, on a
// main loop of 622 instructions a warp per 4 KB of weights instead of the kernel above's 1098 (sm_90a, bf16):
//   - the mma takes the exact integers u - z in T (the nibble placed into the magic's mantissa, then one packed add
//     of -(magic + z): three instructions a pair instead of five), and each 128-k batch's fp32 sums are multiplied
//     by the row's scale after it (group 128), or the whole slice's once (group 0): no weight is rounded to T;
//   - loads are unpredicated: rows past n, token rows past the chunk and batches past the slice read addresses
//     moved back inside the tensors (their sums are never stored, or never computed), and k % 128 == 0 leaves no
//     partial batch to zero.
// H200, graph replay of the W4A16 layers at 1 and 16 tokens: 3-8% faster than on the kernel above (Mixtral-8x7B
// 116.8 -> 107.8 us at 1 token, docs/performance.md); halving the instructions did not halve the time: each batch
// waits on the loads it just issued (the staged kernel below, which replaces it wherever the token rows fit its
// shared memory, says why and how it waits less).
template <typename T, int WK, bool PER_ROW>
__global__ void __launch_bounds__(kDecodeThreads, 2) woq_decode_int4_codes_kernel(WoqGemmParams p) {
  constexpr int R = 16 * (kDecodeWarps / WK);  // weight rows per CTA (= output columns)
  constexpr int U = 4;                         // k32 steps per batch (128 k, one scale group)
  constexpr int S = 4;                         // batches in the register ring
  constexpr int SS = PER_ROW ? 1 : S;          // the scales' and zeros' ring: one pair per row for group 0
  __shared__ float s_part[WK][R][kDecodeTokens + 1];

  const TileRows tile = cta_find_tile<kDecodeTokens>(p.offsets, p.num_experts);
  const int expert = tile.expert;
  if (expert < 0) return;
  const int64_t row_begin = tile.begin;
  const int rows = static_cast<int>(tile.end - row_begin);
  const int N = p.n, K = p.k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane & 3, g = lane >> 2;
  const int rg = warp / WK, ks = warp % WK;
  const int col0 = blockIdx.y * R;
  const int groups = PER_ROW ? 1 : K / 128;

  // The lane's weight rows r and r + 8 (a warp's 16 rows moved back inside n where they pass its end: n % 16 == 0,
  // so the block is wholly in or wholly moved), its token row (moved back to the chunk's last where g >= rows).
  const int64_t wrow = static_cast<int64_t>(expert) * N + min(col0 + rg * 16, N - 16) + g;
  const int64_t arow_index = row_begin + min(g, rows - 1);

  // This warp's K slice in whole batches; batch j of the slice is read at min(j, nb - 1).
  const int kslice = decode_k_slice(K, WK);
  const int kb = ks * kslice;
  const int nb = max(0, min(K, kb + kslice) - kb) / 128;
  const int64_t gi = wrow * groups + (PER_ROW ? 0 : kb / 128);  // the lane's first scale (and zero) of the slice
  // Rows r and r + 8 as two pointers each (fixed offsets fold into the loads), each batch's address one 32-bit
  // offset from them.
  const Int4Lane wl = int4_lane(p, wrow - g, g, kb, 16 * q);
  const float* sp0 = static_cast<const float*>(p.scales) + gi;
  const float* sp1 = sp0 + 8 * groups;
  // Without zero points (symmetric int4 stored as q + 8) the zero is read from the scales' bytes and masked to 0,
  // then 8 is or-ed in: one unpredicated load either way.
  const uint8_t* zp0 = p.zeros ? p.zeros + gi : reinterpret_cast<const uint8_t*>(sp0);
  const uint8_t* zp1 = p.zeros ? zp0 + 8 * groups : reinterpret_cast<const uint8_t*>(sp1);
  const uint32_t zmask = p.zeros ? 0xffu : 0u, zor = p.zeros ? 0u : 8u;
  const char* ap = static_cast<const char*>(p.A) + (arow_index * K + kb + 32 * q) * sizeof(T);
  constexpr unsigned kTokenBytes = 128u * sizeof(T);  // a batch of one token row

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  uint4 w[S][2], a[2][U];
  float sv[SS][2];
  uint32_t zv[SS][2];  // -(magic + z) in both halves
  auto load_consts = [&](int slot, unsigned jc) {
    const unsigned zo = p.zeros ? jc : 4u * jc;  // the zero's byte, or the scale's first byte
    sv[slot][0] = __ldg(sp0 + jc);
    sv[slot][1] = __ldg(sp1 + jc);
    zv[slot][0] = int4_neg_zero<T>(__ldg(zp0 + zo), zmask, zor);
    zv[slot][1] = int4_neg_zero<T>(__ldg(zp1 + zo), zmask, zor);
  };
  auto load_weights = [&](int slot, int j) {
    const unsigned jc = static_cast<unsigned>(min(j, nb - 1));
    w[slot][0] = ld_weights_in_bounds(wl.p0 + wl.batch_bytes * jc);
    w[slot][1] = ld_weights_in_bounds(wl.p1 + wl.batch_bytes * jc);
    if constexpr (!PER_ROW) load_consts(slot, jc);
  };
  auto load_tokens = [&](int buf, int j) {
    const char* src = ap + kTokenBytes * static_cast<unsigned>(min(j, nb - 1));
#pragma unroll
    for (int u = 0; u < U; ++u) a[buf][u] = ld_tokens_in_bounds(src + 16 * u);
  };
  auto compute = [&](int slot, int buf) {
    const int cs = PER_ROW ? 0 : slot;
    float part[4] = {0.f, 0.f, 0.f, 0.f};
    float(&sum)[4] = PER_ROW ? acc : part;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      uint32_t frag[2][4];
      int4_codes_step<T>(w[slot], u, zv[cs], frag);
      const uint4& tok = a[buf][u];  // the token row's 8 T at step u's k
      mma16816<MmaName<T>::kBf16>(sum, frag[0], tok.x, tok.y);
      mma16816<MmaName<T>::kBf16>(sum, frag[1], tok.z, tok.w);
    }
    if constexpr (!PER_ROW) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[c] = fmaf(part[c], sv[slot][c >> 1], acc[c]);  // c < 2: row g, else g + 8
    }
  };
  // Weights and their constants (nothing upstream writes them) are requested before waiting for the kernel that
  // writes A.
  if (nb > 0) {
    if constexpr (PER_ROW) load_consts(0, 0u);
#pragma unroll
    for (int s = 0; s < S; ++s) load_weights(s, s);
  }
  mb::wait_for_predecessor();
  mb::let_dependents_start();
  if (nb > 0) {
    load_tokens(0, 0);
    for (int j0 = 0; j0 < nb; j0 += S) {
#pragma unroll
      for (int s = 0; s < S; ++s) {
        if (j0 + s < nb) {  // warp-uniform
          load_tokens((s + 1) & 1, j0 + s + 1);
          compute(s, s & 1);
          load_weights(s, j0 + s + S);
        }
      }
    }
    if constexpr (PER_ROW) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[c] *= sv[0][c >> 1];
    }
  }
  store_sums<T, WK>(p, s_part, acc, expert, row_begin, rows, col0, ks, rg);
}


// The same forms with the CTA's token rows staged in shared memory, where they fit (launch_int4_staged), and one
// more: int4 with one scale per 64 k and k % 64 == 0 (GPT-OSS-20B's 2880 at group 64):
//   - the mma takes the exact integers u - z in T (the nibble placed into the magic's mantissa, then one packed add
//     of -(magic + z): three instructions a pair), and each scale group's fp32 sums are multiplied by the row's
//     scale after it (group 128: a batch; group 64: each half of a batch), or the whole slice's once (group 0): no
//     weight is rounded to T.
//   - group 64: a step's mma sums the k of all four lanes q, so a lane's k are placed to keep each step inside one
//     half of the batch: the lane reads 8 bytes (16 k) at 16q of each half, steps 0-1 spending the first half's and
//     2-3 the second's, and the tokens are staged in the same order. A half batch at the end of K (k % 128 == 64)
//     reads its second half from the first half's bytes and multiplies it by zero tokens;
//   - waits: ptxas gives every global load one scoreboard and a wait drains it whole, so a warp's loads in flight
//     are what it issued since its last wait. The kernel issues a big batch (kBigBatch 128-k batches: 3-4 KB of
//     weights a warp, with their scales and zeros) after the first batch of the previous one, and waits once per
//     big batch: 3-4 KB a warp in flight over the compute, where a ring refilled batch by batch waited each batch on
//     the 1 KB it had just issued (the ring kernel above; Nsight Compute, H200: 49% of its stall samples on those waits).
//     With one scale group a batch the big batches go in pairs (run_big_batch_pairs): the first two issued before
//     the wait for the predecessor, one wait per pair, each buffer refilled once computed;
//   - the token rows, 16 bytes a lane per step, would take twice the weights' registers: the CTA copies its chunk
//     of them (all of K) into shared memory once (cp.async) and the steps read them there. Copied in windows with a
//     barrier around each, where they do not fit, this was slower than the ring kernel (docs/experiments.md);
//   - loads are unpredicated, as in the ring kernel; batches past a slice are computed on zero tokens.
// 128-k batches a warp loads per wait: 4 KB of int4 weights with one scale per row, 3 KB with a scale and a zero
// per group (their registers: four such batches spill at 128 a thread; group 64's three, with two groups' scales
// each, already spill 8-40 bytes).
template <int GROUP>
constexpr int kBigBatch = GROUP == 0 ? 4 : 3;
constexpr unsigned kTokenPad = 64;      // bytes after each token row of a slice: rows alternate halves of the banks
constexpr int kTokenZeros = 256;        // a batch of a zero token row, read by batches past the slice

// The staged kernel's launch: the GEMM, and the most token rows a chunk can have (min(8, max_rows)), which sizes
// its shared memory.
struct WoqStagedLaunch {
  WoqGemmParams p;
  int rows_cap;
};

// Where the staged kernel stores a token row's 16-byte chunk c (8 k, c < 16) of a batch: at the step and lane that
// read it, step u's four lanes side by side (position 4u + q). Group 128 or 0: lane q takes k 32q + 8u + 0..7;
// group 64: k 64h + 16q + 8s + 0..7 at step 2h + s.
template <int GROUP>
__device__ __forceinline__ int staged_chunk_position(int c) {
  if constexpr (GROUP == 64) return (2 * (c >> 3) + (c & 1)) * 4 + ((c & 7) >> 1);
  else return (c & 3) * 4 + (c >> 2);
}

// KP > 1 (MB_TILE_DECODE_STAGED_C4): the KP CTAs of a (1, 1, KP) cluster (blockIdx.z its rank) take K's slices
// KP * WK ways, each staging its own slices' token rows, so a chunk's rows fit at KP times the k; each CTA's partial
// sums then go to its rank's shared memory and the first CTA adds the others' into its own in rank order before its
// store (fixed order: bit-reproducible).
template <typename T, int WK, int GROUP, int KP>
__global__ void __launch_bounds__(kDecodeThreads, 2) woq_decode_int4_staged_kernel(WoqStagedLaunch d) {
  static_assert(GROUP == 0 || GROUP == 64 || GROUP == 128, "one scale per row, per 64 k or per 128 k");
  static_assert(KP == 1 || KP == 4, "one CTA, or a cluster of four, a column block");
  const WoqGemmParams& p = d.p;
  constexpr bool PER_ROW = GROUP == 0;
  constexpr int R = 16 * (kDecodeWarps / WK);  // weight rows per CTA (= output columns)
  constexpr int U = 4;                         // k32 steps per batch (128 k)
  constexpr int H = GROUP == 64 ? 2 : 1;       // scale groups per batch
  constexpr int NB = kBigBatch<GROUP>;         // batches per wait
  // Big batches in pairs (run_big_batch_pairs) with one scale group a batch. H100, W4A16 layers, graph replay, us, two
  // rounds (docs/performance.md, "The staged int4 decode kernel's big batches in pairs"): Mixtral-8x7B (GEMM1 staged)
  // at 4 / 16 / 32 tokens 276.1 / 380.1-381.5 / 497.2-498.1 -> 262.2-263.4 / 360.7-361.3 / 478.3-479.4, Qwen3-30B-A3B
  // at 64 (both GEMMs) 168.8-169.3 -> 164.3-165.0. Group 64 (two scale groups a batch) keeps one wait a big batch: with
  // the second buffer held from the start its kernels spill 16-48 bytes (8-20 without), and GPT-OSS-20B at 32 / 64
  // tokens ran 280.3-280.4 / 345.2 -> 294.3-294.8 / 370.7-372.3.
  constexpr bool PAIRS = H == 1;
  constexpr int SB = PER_ROW ? 1 : NB;         // scales and zeros per row in a buffer: one for group 0
  constexpr int TB = static_cast<int>(sizeof(T));  // token bytes per k in shared memory
  __shared__ float s_part[WK][R][kDecodeTokens + 1];
  extern __shared__ __align__(16) unsigned char s_tok[];  // [WK][rows_cap][pitch]: the token rows of each slice

  const TileRows tile = cta_find_tile<kDecodeTokens>(p.offsets, p.num_experts);
  const int expert = tile.expert;
  if (expert < 0) return;
  const int64_t row_begin = tile.begin;
  const int rows = static_cast<int>(tile.end - row_begin);
  const int N = p.n, K = p.k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane & 3, g = lane >> 2;
  const int rg = warp / WK, ks = warp % WK;
  const int col0 = blockIdx.y * R;
  const int groups = PER_ROW ? 1 : K / GROUP;
  const int part = KP > 1 ? static_cast<int>(blockIdx.z) : 0;  // the CTA's rank in its cluster

  // The lane's weight rows r and r + 8 (a warp's 16 rows moved back inside n where they pass its end: n % 16 == 0,
  // so the block is wholly in or wholly moved).
  const int64_t wrow = static_cast<int64_t>(expert) * N + min(col0 + rg * 16, N - 16) + g;

  // K slices of whole batches (the last one of K a half batch where k % 128 == 64); slice 0 is the longest, so it
  // sizes each slice's rows in shared memory.
  const int kslice = decode_k_slice(K, KP * WK);
  const int kb = (part * WK + ks) * kslice;
  const int nb = (max(0, min(K, kb + kslice) - kb) + 127) / 128;
  const int nb0 = (min(K, kslice) + 127) / 128;
  // Batches past the slice are computed too (a branch per batch would make ptxas wait again at each, see run_big_batches):
  // they read the slice's last batch, or K's last where the slice is empty, and the zero token row.
  const int kbc = min(kb, (K - 1) / 128 * 128), last = max(nb, 1) - 1;
  const int g0 = PER_ROW ? 0 : kbc / GROUP;            // the slice's first scale group
  const int64_t gi = wrow * groups + g0;               // the lane's first scale (and zero) of the slice
  const unsigned glast = static_cast<unsigned>(groups - 1 - g0);  // the row's last group, from g0
  const Int4Lane wl = int4_lane(p, wrow - g, g, kbc, (H == 2 ? 8 : 16) * q);
  const float* sp0 = static_cast<const float*>(p.scales) + gi;
  const float* sp1 = sp0 + 8 * groups;
  // Without zero points (symmetric int4 stored as q + 8) the zero is read from the scales' bytes and masked to 0,
  // then 8 is or-ed in: one unpredicated load either way.
  const uint8_t* zp0 = p.zeros ? p.zeros + gi : reinterpret_cast<const uint8_t*>(sp0);
  const uint8_t* zp1 = p.zeros ? zp0 + 8 * groups : reinterpret_cast<const uint8_t*>(sp1);
  const uint32_t zmask = p.zeros ? 0xffu : 0u, zor = p.zeros ? 0u : 8u;
  // The lane's token row in shared memory (moved back to the chunk's last where g >= rows).
  const unsigned pitch = static_cast<unsigned>(nb0) * 128u * TB + kTokenPad;
  // A batch of a row is stored step-major (stage_tokens, staged_chunk_position): step u's 16 bytes of lanes q = 0..3
  // side by side, so a step's reads are 64 contiguous bytes a row and rows alternate halves of the banks
  // (pitch = 64 mod 128).
  const unsigned char* tp = s_tok + (ks * d.rows_cap + min(g, rows - 1)) * pitch + 16 * q;
  unsigned char* const s_zero = s_tok + WK * d.rows_cap * pitch;  // kTokenZeros bytes of zeros
  const unsigned char* tz = s_zero + 16 * q;

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  uint4 w[2][NB][2];
  constexpr int CB = PER_ROW ? 1 : 2;  // buffers of scales and zeros: group 0 loads its one pair up front
  float sv[CB][SB][H][2];
  uint32_t zb[CB][SB][2];  // the stored zero bytes (or scale bytes) of the H groups, byte h group h's, turned into
                           // -(magic + z) at use
  // The constants of batch jc's groups (group 64: the second half's moved back to the first past the row's end).
  auto load_consts = [&](int buf, int j, unsigned jc) {
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const unsigned gc = min(H * jc + h, glast);
      const unsigned zo = p.zeros ? gc : 4u * gc;  // the zero's byte, or the scale's first byte
      sv[buf][j][h][0] = __ldg(sp0 + gc);
      sv[buf][j][h][1] = __ldg(sp1 + gc);
      const uint32_t z0 = __ldg(zp0 + zo), z1 = __ldg(zp1 + zo);
      zb[buf][j][0] = h == 0 ? z0 : zb[buf][j][0] | z0 << 8;
      zb[buf][j][1] = h == 0 ? z1 : zb[buf][j][1] | z1 << 8;
    }
  };
  // Big batch jb .. jb + NB - 1 of the slice into buffer buf; batches past the slice read its last.
  auto load_big = [&](int buf, int jb) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      const unsigned jc = static_cast<unsigned>(min(jb + j, last));
      w[buf][j][0] = ld_int4_batch_row<H>(wl.p0, jc, glast, wl.batch_bytes, wl.half0);
      w[buf][j][1] = ld_int4_batch_row<H>(wl.p1, jc, glast, wl.batch_bytes, wl.half1);
      if constexpr (!PER_ROW) load_consts(buf, j, jc);
    }
  };
  // Batch jb of the slice from slot j of buffer buf, on zero tokens where `valid` is false.
  auto compute = [&](int buf, int j, int jb, bool valid) {
    const int cb = PER_ROW ? 0 : buf, cs = PER_ROW ? 0 : j;
    const unsigned char* tb = valid ? tp + jb * 128 * TB : tz;
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const uint32_t zv[2] = {int4_neg_zero<T>(zb[cb][cs][0] >> 8 * h, zmask, zor),
                              int4_neg_zero<T>(zb[cb][cs][1] >> 8 * h, zmask, zor)};
      float part[4] = {0.f, 0.f, 0.f, 0.f};
      float(&sum)[4] = PER_ROW ? acc : part;
#pragma unroll
      for (int u = h * (U / H); u < (h + 1) * (U / H); ++u) {
        uint32_t frag[2][4];
        int4_codes_step<T>(w[buf][j], u, zv, frag);
        const uint4 tok = *reinterpret_cast<const uint4*>(tb + 64 * u);  // the token row's 8 T at step u's k
        mma16816<MmaName<T>::kBf16>(sum, frag[0], tok.x, tok.y);
        mma16816<MmaName<T>::kBf16>(sum, frag[1], tok.z, tok.w);
      }
      if constexpr (!PER_ROW) {
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[c] = fmaf(part[c], sv[cb][cs][h][c >> 1], acc[c]);  // c < 2: row g, else g + 8
      }
    }
  };
  // Every slice's token rows into shared memory by cp.async, then a barrier (the copies visible to all warps). A
  // half batch at the end of K is completed with zeros.
  const char* A = static_cast<const char*>(p.A);
  auto stage_tokens = [&]() {
    constexpr int kChunks = 128 * TB / 16;    // 16-byte chunks stored per batch of one row (16)
    static_assert(kChunks == 16, "staged_chunk_position places 16 chunks a batch");
    for (int sr = 0; sr < WK * rows; ++sr) {  // (slice, row) pairs, CTA-uniform
      const int s = sr % WK, r = sr / WK;
      const int k0 = (part * WK + s) * kslice;  // < K + kslice: fits int
      const int slice_k = max(0, min(kslice, K - k0));  // the last slice is shorter, or empty
      const int chunks = slice_k * TB / 16, stored_chunks = (slice_k + 127) / 128 * kChunks;
      const char* src = A + ((row_begin + r) * K + k0) * TB;
      unsigned char* dst = s_tok + (s * d.rows_cap + r) * pitch;
#pragma unroll 4
      for (int c = threadIdx.x; c < stored_chunks; c += kDecodeThreads) {
        const int cc = c & (kChunks - 1);
        uint4* at = reinterpret_cast<uint4*>(dst + ((c - cc) + staged_chunk_position<GROUP>(cc)) * 16);
        if (c >= chunks) {
          *at = make_uint4(0u, 0u, 0u, 0u);
        } else {
          cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(at)), src + c * 16, true);
        }
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
  };
  // Weights and their constants (nothing upstream writes them) are requested before waiting for the kernel that
  // writes A.
  if constexpr (PER_ROW) load_consts(0, 0, 0u);
  load_big(0, 0);
  if (PAIRS && NB < nb) load_big(1, NB);
  for (int i = threadIdx.x; i < kTokenZeros / 16; i += kDecodeThreads)
    reinterpret_cast<uint4*>(s_zero)[i] = make_uint4(0u, 0u, 0u, 0u);
  mb::wait_for_predecessor();
  mb::let_dependents_start();
  stage_tokens();
  if constexpr (PAIRS) run_big_batch_pairs<NB>(nb, load_big, compute);
  else run_big_batches<NB>(nb, load_big, compute);
  if constexpr (PER_ROW) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[c] *= sv[0][0][0][c >> 1];
  }
  if constexpr (KP == 1) {
    store_sums<T, WK>(p, s_part, acc, expert, row_begin, rows, col0, ks, rg);
  } else {
#if __CUDA_ARCH__ >= 900
#pragma unroll
    for (int c = 0; c < 4; ++c) s_part[ks][rg * 16 + g + (c >> 1) * 8][2 * q + (c & 1)] = acc[c];
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();  // every rank's partial sums written (and visible across the cluster)
    if (part == 0) {
      float* mine = &s_part[0][0][0];
      constexpr int kCount = WK * R * (kDecodeTokens + 1);
      for (int i = threadIdx.x; i < kCount; i += kDecodeThreads) {
        float v = mine[i];
#pragma unroll
        for (int r = 1; r < KP; ++r) v += cluster.map_shared_rank(mine, r)[i];
        mine[i] = v;
      }
      __syncthreads();
      store_part_sums<T, WK>(p, s_part, expert, row_begin, rows, col0);
    }
    cluster.sync();  // the other ranks' shared memory lives until the first has read it
#else
    __trap();  // the launcher refuses clusters below compute capability 9.0
#endif
  }
}

template <typename T, int KIND>
mb_status launch_kind(const WoqGemmParams& p, int64_t max_rows, int k_split, bool after_trigger, cudaStream_t stream) {
  return by_k_split(k_split, [&](auto wk) {
    constexpr int WK = decltype(wk)::value;
    return launch_decode(grouped_woq_decode_kernel<T, KIND, WK>, p, p.n, 16 * (kDecodeWarps / WK),
                         decode_chunks(max_rows, p.num_experts), after_trigger, stream, "grouped gemm woq");
  });
}

// The staged kernel's shared memory: each of a CTA's wk slices' token rows (slice 0's length in whole batches, the
// longest, of K in kp * wk slices) and a zero batch.
size_t staged_smem(const WoqGemmParams& p, int rows_cap, int wk, int kp, int token_bytes) {
  const int kslice = decode_k_slice(p.k, kp * wk);
  const size_t slice_k = static_cast<size_t>(std::min(p.k, kslice) + 127) / 128 * 128;
  return static_cast<size_t>(rows_cap) * wk * (slice_k * token_bytes + kTokenPad) + kTokenZeros;
}

// The int4 codes forms on the ring kernel (group 128 or 0).
template <typename T, bool PER_ROW>
mb_status launch_int4_ring(const WoqGemmParams& p, int64_t max_rows, int k_split, bool after_trigger,
                           cudaStream_t stream) {
  return by_k_split(k_split, [&](auto wk) {
    constexpr int WK = decltype(wk)::value;
    return launch_decode(woq_decode_int4_codes_kernel<T, WK, PER_ROW>, p, p.n, 16 * (kDecodeWarps / WK),
                         decode_chunks(max_rows, p.num_experts), after_trigger, stream, "grouped gemm woq");
  });
}

// The staged kernel in (1, 1, KP) clusters over a (chunks, column blocks, KP) grid, after a trigger or plainly.
template <typename Kernel>
mb_status launch_staged_clusters(Kernel kernel, const WoqStagedLaunch& d, int kp, int out_cols, int64_t chunks,
                                 size_t smem, bool after_trigger, cudaStream_t stream) {
  const char* who = "grouped gemm woq";
  const int64_t col_blocks = (d.p.n + out_cols - 1) / out_cols;
  if (chunks > INT32_MAX || col_blocks > 65535)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: grid too large (chunks %lld, column blocks %lld)", who,
                (long long)chunks, (long long)col_blocks);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess)
    return fail(MB_ERR_CUDA, "%s: %zu bytes of shared memory: %s", who, smem, cudaGetErrorString(err));
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = static_cast<unsigned>(kp);
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3((unsigned)chunks, (unsigned)col_blocks, (unsigned)kp);
  cfg.blockDim = dim3(kDecodeThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = after_trigger ? 2 : 1;
  err = cudaLaunchKernelEx(&cfg, kernel, d);
  if (err != cudaSuccess) return fail(MB_ERR_CUDA, "%s launch: %s", who, cudaGetErrorString(err));
  return MB_OK;
}

// The int4 codes forms on the staged kernel (KP 4: in clusters of four CTAs along K, compute capability 9.0),
// refused where a chunk's token rows do not fit kTokenBudget.
template <typename T, int GROUP, int KP>
mb_status launch_int4_staged(const WoqGemmParams& p, int64_t max_rows, int k_split, bool after_trigger,
                             cudaStream_t stream) {
  if (KP > 1 && mb::device_attribute(cudaDevAttrComputeCapabilityMajor) < 9)
    return fail(MB_ERR_UNSUPPORTED, "grouped gemm woq: the stagedc4 decode kernel runs in thread-block clusters: "
                "compute capability 9.0 or later");
  return by_k_split(k_split, [&](auto wk) {
    constexpr int WK = decltype(wk)::value;
    const WoqStagedLaunch d{p, static_cast<int>(std::min<int64_t>(kDecodeTokens, max_rows))};
    const size_t smem = staged_smem(p, d.rows_cap, WK, KP, static_cast<int>(sizeof(T)));
    if (smem > kTokenBudget)
      return fail(MB_ERR_UNSUPPORTED, "grouped gemm woq: the staged decode kernel's token rows (%d-row chunks, k %d in "
                  "%d slices) need %zu bytes of shared memory, over its %zu: the tile none, or a larger k_split",
                  d.rows_cap, p.k, KP * WK, smem, kTokenBudget);
    const auto kernel = woq_decode_int4_staged_kernel<T, WK, GROUP, KP>;
    const int out_cols = 16 * (kDecodeWarps / WK);
    const int64_t chunks = decode_chunks(max_rows, p.num_experts);
    if constexpr (KP > 1) return launch_staged_clusters(kernel, d, KP, out_cols, chunks, smem, after_trigger, stream);
    return launch_decode(kernel, d, p.n, out_cols, chunks, after_trigger, stream, "grouped gemm woq", smem);
  });
}

template <typename T, int KP>
mb_status launch_int4_staged_group(const WoqGemmParams& p, int64_t max_rows, int k_split, bool after_trigger,
                                   cudaStream_t stream) {
  switch (p.group) {
    case 0: return launch_int4_staged<T, 0, KP>(p, max_rows, k_split, after_trigger, stream);
    case 64: return launch_int4_staged<T, 64, KP>(p, max_rows, k_split, after_trigger, stream);
    default: return launch_int4_staged<T, 128, KP>(p, max_rows, k_split, after_trigger, stream);
  }
}

}  // namespace

mb_status launch_woq_decode(const WoqGemmParams& p, int64_t max_rows, int dtype, int k_split, int tile,
                            bool after_trigger, cudaStream_t stream) {
  if (tile == MB_TILE_DECODE_DIGITS) return launch_woq_decode_digits(p, max_rows, dtype, k_split, after_trigger, stream);
  const bool staged = tile == MB_TILE_DECODE_STAGED || tile == MB_TILE_DECODE_STAGED_C4;
  if (staged && !int4_staged_fit(p))
    return fail(MB_ERR_UNSUPPORTED, "grouped gemm woq: the staged decode kernel takes int4 weights with one scale per "
                "row or per 128 k and k a multiple of 128, or per 64 k and k a multiple of 64 (kind %d, group %d, k %d)",
                p.kind, p.group, p.k);
  return dispatch_16bit(dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool a = after_trigger;
    if (tile == MB_TILE_DECODE_STAGED_C4) return launch_int4_staged_group<T, 4>(p, max_rows, k_split, a, stream);
    if (staged) return launch_int4_staged_group<T, 1>(p, max_rows, k_split, a, stream);
    if (int4_codes_fit(p))
      return p.group ? launch_int4_ring<T, false>(p, max_rows, k_split, a, stream)
                     : launch_int4_ring<T, true>(p, max_rows, k_split, a, stream);
    switch (p.kind) {
      case MB_WOQ_INT8: return launch_kind<T, MB_WOQ_INT8>(p, max_rows, k_split, after_trigger, stream);
      case MB_WOQ_MXFP4: return launch_kind<T, MB_WOQ_MXFP4>(p, max_rows, k_split, after_trigger, stream);
      default: return launch_kind<T, MB_WOQ_INT4>(p, max_rows, k_split, after_trigger, stream);
    }
  });
}

}  // namespace mbk
