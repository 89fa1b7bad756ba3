// Finalize: out[t] = sum_j w[t,j] * (gemm2_out[unpermuted_to_permuted[t*K + j]] + b2[ids[t,j]]), over the pairs
// whose expert is on this rank (0 <= ids[t,j] < num_experts; with num_experts 0, every pair): under expert
// parallelism the others were sorted past this rank's rows (their gemm2_out rows hold nothing) and are skipped.
// Each lane sums its column vectors of a token in fp32, j ascending, acc = fmaf(w, x, acc). A
// gather has no cross-thread reduction at all, so its order is fixed: the deterministic and the
// non-deterministic requests run this same kernel and are bit-identical.
// (The faster scheme for the non-deterministic case, scattering into the token rows from the
// GEMM2 epilogue, is mb_grouped_gemm_sm90_finalize; as a separate pass, the gather is the
// cheaper one: each output is written once and no atomics are needed.)
// A warp owns a (token, column chunk) unit. The K rows are gathered in batches of KB: the batch's
// indices come in one load per array (lane jj loads slot jj's, then shuffles), and all of the
// batch's vectors (KB rows x VPT vectors per lane, and the bias rows) are loaded before any is
// summed, so a lane has KB * VPT = 8 16-byte gathers in flight, and a sum goes out as one 16-byte
// store (mb::store_f32). Small top_k takes more vectors per lane (KB = 2, VPT = 4), so that the
// gathers in flight stay 8. At decode sizes mb::stage_launch() narrows the chunks so that the few
// tokens still spread over the SMs.
// Launched after a trigger and started with mb::chain_start(), as the stage kernels: its launch and block setup
// overlap GEMM2's tail (at decode sizes, where the layer is a chain of short kernels, that was a plain launch's gap).
// Once GEMM2's rows outgrow L2 (mb::streams_past_l2) they are read, and the sums written, with the
// evict-first accesses (mb::load_raw, mb::store_f32): they cannot stay in L2 anyway.
#include "common/common.cuh"

namespace {

template <typename T, int VEC, int KB, int VPT, bool BIAS, bool LOCAL, bool STREAM>
__global__ void __launch_bounds__(mb::kStageThreads)
finalize_kernel(const T* __restrict__ gemm2_out, const T* __restrict__ b2, const float* __restrict__ topk_weights,
                const int32_t* __restrict__ topk_ids, const int32_t* __restrict__ unpermuted_to_permuted,
                int num_tokens, int hidden, int top_k, int num_experts, int vpl, int64_t chunks,
                T* __restrict__ out) {
  using R = mb::Raw<T, VEC>;
  const int lane = threadIdx.x % 32;
  const int64_t nvec = hidden / VEC;
  mb::chain_start();
  // Warps stride over the tokens, blockIdx.y over a row's column chunks. (t is 32-bit: t + stride
  // < 2^31 + 2^22 cannot wrap, and the 64-bit index took the registers that kept ptxas from a spill.)
  for (unsigned t = blockIdx.x * mb::kStageWarps + threadIdx.x / 32; t < static_cast<unsigned>(num_tokens);
       t += gridDim.x * mb::kStageWarps) {
    for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
      const int64_t v0 = c * 32 * vpl + lane;  // this lane's vectors: v0, v0 + 32, ...
      auto mine = [&](int i) { return i < vpl && v0 + i * 32 < nvec; };
      float acc[VPT][VEC];
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[i][k] = 0.0f;
      }
      for (int j0 = 0; j0 < top_k; j0 += KB) {
        // The batch's indices (lane jj < KB loads slot jj's, one load per array for the warp, then
        // shuffled to all lanes), then all of its vectors, then the sums: nothing waits for a load
        // before the batch's last one is out. Slots past top_k re-read the last index, load nothing.
        const int64_t el = static_cast<int64_t>(t) * top_k + min(j0 + lane % KB, top_k - 1);
        const int row_l = unpermuted_to_permuted[el];
        const float w_l = topk_weights[el];
        const int id_l = BIAS || LOCAL ? topk_ids[el] : 0;
        float w[KB];
        bool here[KB];  // the pair exists and its expert is on this rank
        const R* src[KB];
        const R* bias[KB];
#pragma unroll
        for (int jj = 0; jj < KB; ++jj) {
          w[jj] = __shfl_sync(0xffffffffu, w_l, jj);
          const int row = __shfl_sync(0xffffffffu, row_l, jj);
          const int id = __shfl_sync(0xffffffffu, id_l, jj);
          here[jj] = j0 + jj < top_k && (!LOCAL || (id >= 0 && id < num_experts));
          src[jj] = reinterpret_cast<const R*>(gemm2_out + static_cast<int64_t>(row) * hidden);
          if constexpr (BIAS) bias[jj] = reinterpret_cast<const R*>(b2 + static_cast<int64_t>(id) * hidden);
        }
        R x[KB][VPT], b[KB][VPT];
#pragma unroll
        for (int jj = 0; jj < KB; ++jj) {
#pragma unroll
          for (int i = 0; i < VPT; ++i) {
            if (!here[jj] || !mine(i)) continue;
            x[jj][i] = mb::load_raw<STREAM>(src[jj] + v0 + i * 32);
            if constexpr (BIAS) b[jj][i] = bias[jj][v0 + i * 32];
          }
        }
#pragma unroll
        for (int jj = 0; jj < KB; ++jj) {
#pragma unroll
          for (int i = 0; i < VPT; ++i) {
            if (!here[jj] || !mine(i)) continue;
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
              float xk = mb::raw_f32<T>(x[jj][i], k);
              if constexpr (BIAS) xk += mb::raw_f32<T>(b[jj][i], k);
              acc[i][k] = fmaf(w[jj], xk, acc[i][k]);
            }
          }
        }
      }
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (mine(i))
          mb::store_f32<T, VEC, STREAM>(out + static_cast<int64_t>(t) * hidden + (v0 + i * 32) * VEC, acc[i]);
      }
    }
  }
}

}  // namespace

extern "C" mb_status mb_finalize(const void* gemm2_out, int dtype, const void* b2, const float* topk_weights,
                                 const int32_t* topk_ids, const int32_t* unpermuted_to_permuted, int num_tokens,
                                 int hidden, int top_k, int num_experts, int deterministic, void* out,
                                 cudaStream_t stream) {
  (void)deterministic;  // both modes are the fixed-order gather (see the top of this file)
  const char* who = "mb_finalize";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(hidden >= 1, "%s: hidden must be >= 1, got %d", who, hidden);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  MB_REQUIRE(num_experts >= 0, "%s: num_experts must be >= 0, got %d", who, num_experts);
  if (num_tokens == 0) return mb::dispatch_dtype(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(gemm2_out && topk_weights && unpermuted_to_permuted && out,
             "%s: gemm2_out, topk_weights, unpermuted_to_permuted and out must be non-NULL", who);
  MB_REQUIRE((!b2 && num_experts == 0) || topk_ids, "%s: topk_ids must be non-NULL when b2 or num_experts is given",
             who);
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = 16 / sizeof(T);
    const bool wide = mb::vec_width<T>(hidden, {gemm2_out, b2, out}) == kWide;
    const int64_t nvec = wide ? hidden / kWide : hidden;
    // K rows per batch and vectors per lane: 8 loads in flight per lane (KB * VPT), the batch
    // covering top_k = 8 (and 5..7) in one pass, 4 (and 3) and 2 (and 1).
    const int kb = top_k >= 5 ? 8 : top_k >= 3 ? 4 : 2;
    const mb::StageLaunch shape = mb::stage_launch(num_tokens, nvec, 8 / kb);
    const bool stream_rows = wide && mb::streams_past_l2(static_cast<int64_t>(num_tokens) * top_k * hidden *
                                                         static_cast<int64_t>(sizeof(T)));
    // Separate kernels with and without bias: the bias vectors double the registers of a batch.
    auto launch = [&](auto vec_const, auto kb_const, auto bias_const, auto local_const, auto stream_const) {
      constexpr int VEC = decltype(vec_const)::value;
      constexpr int KB = decltype(kb_const)::value;
      constexpr bool BIAS = decltype(bias_const)::value;
      constexpr bool LOCAL = decltype(local_const)::value;
      constexpr bool STREAM = decltype(stream_const)::value;
      return mb::check_launch("finalize_kernel", mb::launch_after_trigger(
          finalize_kernel<T, VEC, KB, 8 / KB, BIAS, LOCAL, STREAM>, shape.grid, dim3(mb::kStageThreads), stream,
          static_cast<const T*>(gemm2_out), static_cast<const T*>(b2), topk_weights, topk_ids,
          unpermuted_to_permuted, num_tokens, hidden, top_k, num_experts, shape.vpl, shape.chunks,
          static_cast<T*>(out)));
    };
    auto by_local = [&](auto vec_const, auto kb_const, auto bias_const, auto stream_const) {
      return num_experts ? launch(vec_const, kb_const, bias_const, std::true_type{}, stream_const)
                         : launch(vec_const, kb_const, bias_const, std::false_type{}, stream_const);
    };
    auto by_stream = [&](auto vec_const, auto kb_const, auto bias_const) {
      return stream_rows ? by_local(vec_const, kb_const, bias_const, std::true_type{})
                         : by_local(vec_const, kb_const, bias_const, std::false_type{});
    };
    auto by_bias = [&](auto vec_const, auto kb_const) {
      return b2 ? by_stream(vec_const, kb_const, std::true_type{}) : by_stream(vec_const, kb_const, std::false_type{});
    };
    auto by_batch = [&](auto vec_const) {
      switch (kb) {
        case 8: return by_bias(vec_const, std::integral_constant<int, 8>{});
        case 4: return by_bias(vec_const, std::integral_constant<int, 4>{});
        default: return by_bias(vec_const, std::integral_constant<int, 2>{});
      }
    };
    return wide ? by_batch(std::integral_constant<int, kWide>{}) : by_batch(std::integral_constant<int, 1>{});
  });
}
