// Weight-only grouped GEMM, mma kernel (tactic kernel MB_GEMM_MMA; the operation, the stored forms and the checks
// are gemm/woq.cuh's and gemm/woq_abi.cu's): for many rows per expert (prefill), where the decode kernel would
// read and dequantize an expert's weights again for every 8 rows.
//
// One CTA computes BM token rows x 128 output columns of one expert (tiles MB_TILE_MMA_64x128 and
// MB_TILE_MMA_128x128). Swap-AB as gemm/woq_decode.cu: the weights are the 16-row A operand of mma.sync m16n8k16,
// the tokens the 8-column B operand. Each warp owns 32 output columns (two m-tiles) for 64 token rows (eight
// n-tiles), so the CTA is 4 warps (64 rows) or 8 (128 rows: two warps share each weight row). Per 128-k stage a
// lane reads its two weight rows' 32 consecutive k per m-tile (16 bytes of int4 / MXFP4, 32 of int8) and spends
// them over four k32 steps as k = 32q + 8u + {0..7}, as the decode kernel does; each weight is dequantized once per
// warp into a register fragment and used by the warp's eight n-tiles (a lane dequantizes one weight per mma). The
// lane's token fragment is one 16-byte shared-memory load of token row g at the same k.
//
// Pipeline: kStages stages of 128 k, each holding the stage's token tile (cp.async, zero-filled past the
// expert's rows and past K), the weight tile as stored bytes (cp.async, zero-filled past n and K) and the
// per-row, per-group dequantization constants. The constants are loaded one stage ahead into registers, turned
// into the form the dequantization needs and stored once per CTA after the stage's mma (nothing pipelines the
// unaligned bytes of the zeros and e8m0 scales through cp.async). Shared layouts, each free of bank conflicts:
//   tokens : row r at r * 256 bytes, 16-byte chunk c (k 8c..8c+7) at position c ^ ((c >> 3) << 1) ^ (r & 1): a
//            quarter warp (rows g, g+1; chunks 4q + u) reads 8 distinct 16-byte bank groups;
//   weights: row r at r * 64 bytes (int4 / MXFP4: lanes q read chunk q of rows g, g+1: 8 groups), int8 at
//            r * 128 bytes with chunk c at c ^ (r & 1);
//   consts : [128 rows][4 groups] of 8 bytes.
// After the mainloop the fp32 accumulators go through shared memory (rows padded by 4 floats), and each warp
// stores whole 256-byte token rows with the bias added: one rounding of acc + bias, as the decode kernel.
//
// Dequantization (gemm/woq.cuh's): each weight once per warp per stage, with its row's constants from shared
// memory; at these tiles the mainloop's budget is instruction issue beside the mma, not memory. MXFP4 takes the
// fp32 path for a stage where any multiplier of the warp's rows does not fit T.
#include <algorithm>
#include <cstdint>

#include "gemm/loads.cuh"
#include "gemm/mma.cuh"
#include "gemm/woq.cuh"

namespace mbk {
namespace {

constexpr int kCols = 128;                    // output columns (weight rows) per CTA
constexpr int kStageK = 128;                  // k per pipeline stage
constexpr int kStages = 3;                    // 2 stages in flight; fits sm_80's 163 KB at the largest tile
constexpr int kWarpTokens = 64;               // token rows per warp: 8 mma n-tiles
constexpr int kWarpCols = 32;                 // output columns per warp: 2 mma m-tiles
constexpr int kColWarps = kCols / kWarpCols;  // warps along the columns
constexpr int kSlots = 4;                     // scale groups per row per stage at most (group 32)
constexpr int kTokRowBytes = kStageK * 2;     // a token row's bytes per stage
constexpr int kOutStride = kCols + 4;         // floats per row of the epilogue tile (fragment stores conflict-free)

template <int BM, int KIND>
struct WoqTile {
  static constexpr int kWarps = BM / kWarpTokens * kColWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWRowBytes = KIND == MB_WOQ_INT8 ? kStageK : kStageK / 2;  // a weight row's bytes per stage
  static constexpr int kTokBytes = BM * kTokRowBytes;
  static constexpr int kWBytes = kCols * kWRowBytes;
  static constexpr int kConstBytes = kCols * kSlots * 8;
  static constexpr int kStageBytes = kTokBytes + kWBytes + kConstBytes;
  static constexpr int kSmem = std::max(kStages * kStageBytes, BM * kOutStride * 4);
  static constexpr int kConstItems = kCols * kSlots / kThreads;  // (row, group) constants per thread per stage
  // Row tiles per raster group: 1024 token rows, whose k-slices stay in L2 while the group's column blocks pass.
  static constexpr int kRasterTiles = 1024 / BM;
};

template <typename T, int KIND, int BM>
__global__ void __launch_bounds__(WoqTile<BM, KIND>::kThreads)
    grouped_woq_mma_kernel(WoqGemmParams p, int m_tiles, int n_blocks) {
  using Tile = WoqTile<BM, KIND>;
  constexpr int kThreads = Tile::kThreads, kWarps = Tile::kWarps;
  constexpr int WROW = Tile::kWRowBytes, WCH = WROW / 16, ITEMS = Tile::kConstItems;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ TileRows s_tile;

  // Raster: groups of kRasterTiles row tiles, the row tile fastest within a group, so that the CTAs running at one
  // time share a few weight tiles and the group's token rows are read from L2 by each column block.
  const int per_group = Tile::kRasterTiles * n_blocks;
  const int raster_group = static_cast<int>(blockIdx.x) / per_group;
  const int first_tile = raster_group * Tile::kRasterTiles;
  const int group_tiles = min(Tile::kRasterTiles, m_tiles - first_tile);
  const int in_group = static_cast<int>(blockIdx.x) - raster_group * per_group;
  const int col0 = (in_group / group_tiles) * kCols;
  if (threadIdx.x < 32) {
    TileRows t;
    const bool ok = find_tile<BM>(p.offsets, p.num_experts, first_tile + in_group % group_tiles, &t.expert, &t.begin,
                                  &t.end);
    if (threadIdx.x == 0) {
      if (!ok) t.expert = -1;
      s_tile = t;
    }
  }
  __syncthreads();
  const TileRows tile = s_tile;
  if (tile.expert < 0) return;

  const int N = p.n, K = p.k;
  const int expert = tile.expert;
  const int rows = static_cast<int>(tile.end - tile.begin);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int wc = (warp % kColWarps) * kWarpCols;    // the warp's first column in the tile
  const int wt = (warp / kColWarps) * kWarpTokens;  // its first token row
  const int ktiles = (K + kStageK - 1) / kStageK;
  // Scale groups per stage: 4 (group 32, MXFP4), 2 (64), 1 (128, or one scale per row: group 0).
  const int group_shift = p.group == 32 ? 0 : p.group == 64 ? 1 : 2;
  const int slots = kSlots >> group_shift;
  const int groups = p.group ? K / p.group : 1;
  const T* A = static_cast<const T*>(p.A) + tile.begin * K;
  const int64_t wrow_bytes = KIND == MB_WOQ_INT8 ? K : K / 2;
  const uint8_t* B = p.B + static_cast<int64_t>(expert) * N * wrow_bytes;
  const bool tiles = p.kind == MB_WOQ_INT4_TILES;  // int4 in 16-row tiles (N % 16 == 0: the expert's start a tile's)
  const int64_t scale_row0 = static_cast<int64_t>(expert) * N + col0;  // the scale row of the tile's column 0
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  auto load_weights = [&](int stage, int kt) {
    const uint32_t dst = smem0 + stage * Tile::kStageBytes + Tile::kTokBytes;
#pragma unroll
    for (int i = 0; i < kCols * WCH / kThreads; ++i) {
      const int c = tid + i * kThreads;
      const int r = c / WCH, ch = c % WCH;
      const int kb = kt * WROW + ch * 16;
      const bool ok = col0 + r < N && kb < wrow_bytes;
      const int pos = KIND == MB_WOQ_INT8 ? ch ^ (r & 1) : ch;
      const int64_t at = KIND == MB_WOQ_INT4 ? int4_offset(tiles, col0 + r, kb, wrow_bytes)
                                             : (col0 + r) * wrow_bytes + kb;
      cp_async16(dst + r * WROW + pos * 16, ok ? B + at : B, ok);
    }
  };
  auto load_tokens = [&](int stage, int kt) {
    const uint32_t dst = smem0 + stage * Tile::kStageBytes;
#pragma unroll
    for (int i = 0; i < BM * 16 / kThreads; ++i) {
      const int c = tid + i * kThreads;
      const int r = c >> 4, ch = c & 15;
      const int k = kt * kStageK + ch * 8;
      const bool ok = r < rows && k < K;
      const int pos = ch ^ ((ch >> 3) << 1) ^ (r & 1);
      cp_async16(dst + r * kTokRowBytes + pos * 16, ok ? A + static_cast<int64_t>(r) * K + k : A, ok);
    }
  };
  // The (row, group) constants of stage kt: item i is row i / slots, group slot i % slots.
  auto load_consts = [&](int kt, uint32_t (&sv)[ITEMS], uint32_t (&zv)[ITEMS]) {
#pragma unroll
    for (int m = 0; m < ITEMS; ++m) {
      const int i = tid + m * kThreads;
      const int r = i >> (2 - group_shift), gi = p.group ? kt * slots + (i & (slots - 1)) : 0;
      const bool ok = i < kCols * slots && col0 + r < N && gi < groups;
      const int64_t at = ok ? (scale_row0 + r) * groups + gi : 0;
      sv[m] = KIND == MB_WOQ_MXFP4 ? ld_u8(static_cast<const uint8_t*>(p.scales) + at, ok)
                                   : ld_b32(static_cast<const float*>(p.scales) + at, ok);
      zv[m] = KIND == MB_WOQ_INT4 && p.zeros ? ld_u8(p.zeros + at, ok) : 8u;
    }
  };
  auto store_consts = [&](int stage, const uint32_t (&sv)[ITEMS], const uint32_t (&zv)[ITEMS]) {
    unsigned char* dst = smem + stage * Tile::kStageBytes + Tile::kTokBytes + Tile::kWBytes;
#pragma unroll
    for (int m = 0; m < ITEMS; ++m) {
      const int i = tid + m * kThreads;
      if (i < kCols * slots) {
        const int r = i >> (2 - group_shift), j = i & (slots - 1);
        *reinterpret_cast<uint2*>(dst + (r * kSlots + j) * 8) = woq_consts<T, KIND>(sv[m], zv[m]);
      }
    }
  };

  // The lane's token chunk offsets in a stage per step u (its row wt + g, chunk 4q + u, swizzled as written).
  int tok_off[4];
  {
    const int key = ((q >> 1) << 1) | (g & 1);
#pragma unroll
    for (int u = 0; u < 4; ++u) tok_off[u] = (wt + g) * kTokRowBytes + (4 * q + (u ^ key)) * 16;
  }

  float acc[2][8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mt][nt][c] = 0.f;

  auto compute = [&](int stage) {
    const unsigned char* st = smem + stage * Tile::kStageBytes;
    const unsigned char* sw = st + Tile::kTokBytes;
    const uint2* sc = reinterpret_cast<const uint2*>(sw + Tile::kWBytes);
    const int slot = q >> group_shift;
    RowConsts rc[2][2];  // [m-tile][row g, g + 8]
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) rc[mt][h] = row_consts<KIND>(sc[(wc + 16 * mt + 8 * h + g) * kSlots + slot]);
    auto run = [&](auto fast_tag) {
      constexpr bool kFast = decltype(fast_tag)::value;
      uint4 raw[2][2];  // int4 / MXFP4: the lane's 16 bytes of each row; int8: the step pair's 16
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (KIND != MB_WOQ_INT8 ? u == 0 : (u & 1) == 0) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int r = wc + 16 * mt + 8 * h + g;
              const int pos = KIND == MB_WOQ_INT8 ? (2 * q + (u >> 1)) ^ (r & 1) : q;
              raw[mt][h] = *reinterpret_cast<const uint4*>(sw + r * WROW + pos * 16);
            }
        }
        uint4 tok[8];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          tok[nt] = *reinterpret_cast<const uint4*>(st + tok_off[u] + nt * 8 * kTokRowBytes);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          uint32_t frag[2][4];  // k 8u + 0..3 and 8u + 4..7: {row g, row g + 8, row g, row g + 8}
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint4& r = raw[mt][h];
            const uint32_t words[4] = {r.x, r.y, r.z, r.w};
            uint32_t pairs[4];
            dequant_step<T, KIND, kFast>(words[u], make_uint2(words[(u & 1) * 2], words[(u & 1) * 2 + 1]),
                                         rc[mt][h], pairs);
            frag[0][h] = pairs[0];
            frag[0][2 + h] = pairs[1];
            frag[1][h] = pairs[2];
            frag[1][2 + h] = pairs[3];
          }
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            mma16816<MmaName<T>::kBf16>(acc[mt][nt], frag[0], tok[nt].x, tok[nt].y);
            mma16816<MmaName<T>::kBf16>(acc[mt][nt], frag[1], tok[nt].z, tok[nt].w);
          }
        }
      }
    };
    if constexpr (KIND == MB_WOQ_MXFP4) {
      const bool fast = __all_sync(0xffffffffu, rc[0][0].a && rc[0][1].a && rc[1][0].a && rc[1][1].a);
      if (fast) {
        run(std::true_type{});
      } else {
        run(std::false_type{});
      }
    } else {
      run(std::true_type{});
    }
  };

  // Prologue: the weights and constants of the first stages (nothing upstream writes them) before waiting for the
  // kernel that writes A; one commit group per stage, the first also holding the weights of the others.
  uint32_t ps[kStages - 1][ITEMS], pz[kStages - 1][ITEMS];
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < ktiles) {
      load_weights(s, s);
      load_consts(s, ps[s], pz[s]);
    }
  mb::wait_for_predecessor();
  mb::let_dependents_start();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_tokens(s, s);
    cp_async_commit();
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < ktiles) store_consts(s, ps[s], pz[s]);

  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for every thread (its constants stored); stage kt - 1 fully consumed
    const int pf = kt + kStages - 1;
    uint32_t sv[ITEMS], zv[ITEMS];
    if (pf < ktiles) {
      load_weights(pf % kStages, pf);
      load_tokens(pf % kStages, pf);
      load_consts(pf, sv, zv);
    }
    cp_async_commit();
    if (wt < rows) compute(kt % kStages);  // a 128-row tile's second warp row has nothing to do past 64 rows
    if (pf < ktiles) store_consts(pf % kStages, sv, zv);
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages: the epilogue tile reuses them

  float* out = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        out[(wt + 8 * nt + 2 * q + (c & 1)) * kOutStride + wc + 16 * mt + g + 8 * (c >> 1)] = acc[mt][nt][c];
  __syncthreads();

  using P2 = Pair<T>;
  const int col = col0 + 4 * lane;  // n % 16 == 0: a lane's 4 columns are all in or all out
  if (col >= N) return;
  float b[4] = {0.f, 0.f, 0.f, 0.f};
  if (p.bias) {
    const T* bias = static_cast<const T*>(p.bias) + static_cast<int64_t>(expert) * N + col;
    const float2 b01 = P2::to_float2(*reinterpret_cast<const typename P2::type*>(bias));
    const float2 b23 = P2::to_float2(*reinterpret_cast<const typename P2::type*>(bias + 2));
    b[0] = b01.x;
    b[1] = b01.y;
    b[2] = b23.x;
    b[3] = b23.y;
  }
  T* C = static_cast<T*>(p.C) + tile.begin * N + col;
  for (int r = warp; r < rows; r += kWarps) {
    const float4 v = *reinterpret_cast<const float4*>(out + r * kOutStride + 4 * lane);
    *reinterpret_cast<uint2*>(C + static_cast<int64_t>(r) * N) =
        make_uint2(pack_rn<T>(v.x + b[0], v.y + b[1]), pack_rn<T>(v.z + b[2], v.w + b[3]));
  }
}

template <typename T, int KIND, int BM>
mb_status launch_tile(const WoqGemmParams& p, int64_t max_rows, bool after_trigger, cudaStream_t stream) {
  using Tile = WoqTile<BM, KIND>;
  auto kernel = grouped_woq_mma_kernel<T, KIND, BM>;
  // Idempotent and cheap; done on every call so a new device or thread needs no init step.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmem);
  if (err != cudaSuccess) return fail(MB_ERR_CUDA, "grouped gemm woq: smem attribute: %s", cudaGetErrorString(err));
  // sum over experts of ceil(rows_x / BM) <= ceil(max_rows / BM) + (non-empty experts <= min(E, max_rows))
  const int64_t m_tiles = (max_rows + BM - 1) / BM + std::min<int64_t>(p.num_experts, max_rows);
  const int64_t n_blocks = (p.n + kCols - 1) / kCols;
  if (m_tiles * n_blocks > INT32_MAX)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm woq: grid too large (%lld row tiles x %lld column blocks)",
                (long long)m_tiles, (long long)n_blocks);
  err = mb::launch_after_trigger_smem(kernel, dim3(static_cast<unsigned>(m_tiles * n_blocks)), dim3(Tile::kThreads),
                                      Tile::kSmem, stream, after_trigger, p, static_cast<int>(m_tiles),
                                      static_cast<int>(n_blocks));
  if (err != cudaSuccess) return fail(MB_ERR_CUDA, "grouped gemm woq launch: %s", cudaGetErrorString(err));
  return MB_OK;
}

template <typename T, int KIND>
mb_status launch_kind(const WoqGemmParams& p, int64_t max_rows, int tile, bool after_trigger, cudaStream_t stream) {
  return tile == MB_TILE_MMA_64x128 ? launch_tile<T, KIND, 64>(p, max_rows, after_trigger, stream)
                                    : launch_tile<T, KIND, 128>(p, max_rows, after_trigger, stream);
}

}  // namespace

mb_status launch_woq_mma(const WoqGemmParams& p, int64_t max_rows, int dtype, int tile, bool after_trigger,
                         cudaStream_t stream) {
  return dispatch_16bit(dtype, [&](auto tag) {
    using T = decltype(tag);
    switch (p.kind) {
      case MB_WOQ_INT8: return launch_kind<T, MB_WOQ_INT8>(p, max_rows, tile, after_trigger, stream);
      case MB_WOQ_MXFP4: return launch_kind<T, MB_WOQ_MXFP4>(p, max_rows, tile, after_trigger, stream);
      default: return launch_kind<T, MB_WOQ_INT4>(p, max_rows, tile, after_trigger, stream);
    }
  });
}

}  // namespace mbk
