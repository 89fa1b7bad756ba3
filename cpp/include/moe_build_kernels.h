/* moe-build fused MoE kernels: the plain C ABI shared by the PyTorch runner, the TensorRT
 * plugin and the tests. Every entry point takes raw device pointers, sizes and a cudaStream_t,
 * launches asynchronously, checks its launches, and returns an mb_status (0 = success).
 * mb_last_error() gives a one-line message for the last failure on the calling thread.
 *
 * Row conventions:
 *   T  = tokens, K = top_k, E = experts on this node, H = hidden, I = intermediate,
 *   N1 = 2*I for gated activations (rows [0,I) gate, [I,2I) up), else I.
 *   expanded row  e = t*K + j   (token t's j-th choice)
 *   permuted row  p in [0, T*K): rows sorted by expert, stable in e.
 *   permuted_to_unpermuted[p] = e ; unpermuted_to_permuted[e] = p
 *   expert_first_token_offset[E+1] (int64): expert x owns permuted rows [off[x], off[x+1]).
 * Weights use the nn.Linear layout [out, in]: w1 [E, N1, H], w2 [E, H, I], row-major.
 */
#ifndef MOE_BUILD_KERNELS_H
#define MOE_BUILD_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int mb_status;
enum {
  MB_OK = 0,
  MB_ERR_INVALID_ARGUMENT = 1,  /* a size/pointer/enum the kernel cannot take */
  MB_ERR_UNSUPPORTED = 2,       /* a valid request this build/arch does not implement */
  MB_ERR_CUDA = 3,              /* a CUDA API or launch error; see mb_last_error() */
};

enum mb_dtype { MB_FP32 = 0, MB_FP16 = 1, MB_BF16 = 2 };
enum mb_routing { MB_SOFTMAX_TOPK = 0, MB_TOPK_SOFTMAX = 1, MB_SIGMOID_GROUPED = 2 };
enum mb_activation {
  MB_ACT_IDENTITY = 0, MB_ACT_RELU = 1, MB_ACT_SILU = 2, MB_ACT_GELU = 3,
  MB_ACT_SWIGLU = 4, MB_ACT_GEGLU = 5, MB_ACT_SWIGLU_CLAMP = 6,
};

const char* mb_last_error(void);

/* stages/routing.cu: logits [T, E] (dtype) -> topk_ids [T, K] int32, topk_weights [T, K] fp32.
 * correction_bias [E] fp32 or NULL (sigmoid_grouped only: used for selection, not weights). */
mb_status mb_routing(const void* logits, int dtype, const float* correction_bias, int num_tokens,
                     int num_experts, int top_k, int method, int renormalize, int num_groups,
                     int topk_groups, float routed_scaling_factor, int32_t* topk_ids,
                     float* topk_weights, cudaStream_t stream);

/* stages/routing_prologue_fused.cu: single-block build of the three expert maps; MB_ERR_UNSUPPORTED outside
 * the fused kernel's limits (T <= 256, K in {1,2,4,6,8}, expert_log = floor(log2(E+1))+1 <= 9). */
mb_status mb_routing_prologue_fused(const int32_t* topk_ids, int num_tokens, int top_k, int num_experts,
                                    int32_t* permuted_to_unpermuted, int32_t* unpermuted_to_permuted,
                                    int64_t* expert_first_token_offset, cudaStream_t stream);

/* stages/routing_prologue_fused.cu: the same block routes first (routing = prologue in the plan): mb_routing's
 * arguments and outputs (topk_ids / topk_weights written as it writes them), then the maps built from those ids, in
 * one launch; MB_ERR_UNSUPPORTED outside mb_routing_prologue_fused's limits. */
mb_status mb_routing_prologue_fused_routing(const void* logits, int dtype, const float* correction_bias,
                                            int num_tokens, int num_experts, int top_k, int method, int renormalize,
                                            int num_groups, int topk_groups, float routed_scaling_factor,
                                            int32_t* topk_ids, float* topk_weights, int32_t* permuted_to_unpermuted,
                                            int32_t* unpermuted_to_permuted, int64_t* expert_first_token_offset,
                                            cudaStream_t stream);

/* stages/routing_prologue_three_step.cu: any T; workspace from mb_routing_prologue_three_step_workspace(), whose
 * size serves every call of up to num_tokens tokens (a runner's workspace is sized once, for its largest call).
 * zero_out (zero_bytes bytes) or NULL with zero_bytes 0: when given, this launch also sets it to zero
 * (the output mb_grouped_gemm_sm90_finalize adds into, zeroed here when the three-step prologue runs,
 * else by mb_expand_rows); nothing the map build or a later stage reads before writing it. */
size_t mb_routing_prologue_three_step_workspace(int num_tokens, int top_k, int num_experts);
mb_status mb_routing_prologue_three_step(const int32_t* topk_ids, int num_tokens, int top_k, int num_experts,
                                         int32_t* permuted_to_unpermuted, int32_t* unpermuted_to_permuted,
                                         int64_t* expert_first_token_offset, void* workspace,
                                         size_t workspace_bytes, void* zero_out, size_t zero_bytes,
                                         cudaStream_t stream);

/* stages/routing_prologue_three_step.cu: the first launch routes too (routing = prologue in the plan): mb_routing's
 * arguments and outputs (topk_ids / topk_weights written as it writes them), then the same maps, zero_out and
 * workspace as mb_routing_prologue_three_step, in two launches; one block routes and counts, so MB_ERR_UNSUPPORTED
 * past num_tokens * top_k = 1024 rows. */
mb_status mb_routing_prologue_three_step_routing(const void* logits, int dtype, const float* correction_bias,
                                                 int num_tokens, int num_experts, int top_k, int method,
                                                 int renormalize, int num_groups, int topk_groups,
                                                 float routed_scaling_factor, int32_t* topk_ids, float* topk_weights,
                                                 int32_t* permuted_to_unpermuted, int32_t* unpermuted_to_permuted,
                                                 int64_t* expert_first_token_offset, void* workspace,
                                                 size_t workspace_bytes, void* zero_out, size_t zero_bytes,
                                                 cudaStream_t stream);

/* stages/scale_columns.cu: out[r, c] = x[r, c] * scale[c] for x, out [rows, cols] in dtype (MB_BF16 or MB_FP16), out
 * == x (in place) or not overlapping it, scale [cols] fp32, each product in fp32 rounded once to dtype: the AWQ pre-quant
 * scales' separate step. cols a multiple of 8; x, out and scale 16-byte aligned. */
mb_status mb_scale_columns(const void* x, void* out, int dtype, const float* scale, int64_t rows, int cols,
                           cudaStream_t stream);

/* stages/expand_rows.cu: permuted_input[p] = input[e / K] (* prequant_scale[h] if non-NULL),
 * permuted_weights[p] = topk_weights[e], for p = unpermuted_to_permuted[e] (every e in [0, T*K)).
 * prequant_scale [H] fp32 or NULL.
 * zero_out [T, H] in dtype or NULL: when given, this launch also sets it to zero. This is where the
 * zeroed output of mb_grouped_gemm_sm90_finalize comes from when the maps were built by
 * mb_routing_prologue_fused (no separate memset launch); it must not overlap input (MB_ERR_INVALID_ARGUMENT). */
mb_status mb_expand_rows(const void* input, int dtype, const int32_t* unpermuted_to_permuted,
                         const float* topk_weights, const float* prequant_scale, int num_tokens,
                         int hidden, int top_k, void* permuted_input, float* permuted_weights,
                         void* zero_out, cudaStream_t stream);

/* stages/fc1_activation.cu: out[p, :I] = act(in[p, :N1] + b1[expert(p)]) for p < off[E]; non-gated:
 * N1 = I. b1 [E, N1] or NULL. prequant_scale [I] fp32 or NULL (AWQ FC2 pre-quant, fused).
 * gate_up_interleaved != 0 (gated activations, I a multiple of 8): in's and b1's columns in W1's interleaved order,
 * feature f's gate at 16 (f / 8) + f % 8 and its up projection 8 further on (the order mb_grouped_gemm_woq_sm90_gated
 * reads); 0: stacked, gate at f and up at I + f. */
mb_status mb_fc1_activation(const void* in, int dtype, const void* b1, const int64_t* expert_first_token_offset,
                            int num_experts, int64_t max_rows, int inter, int activation, int gate_up_interleaved,
                            float swiglu_alpha, float swiglu_limit, const float* prequant_scale, void* out,
                            cudaStream_t stream);

/* stages/finalize.cu: out[t] = sum_j w[t,j] * (gemm2_out[unpermuted_to_permuted[t*K+j]] + b2[ids[t,j]]),
 * over the pairs with 0 <= ids[t,j] < num_experts (expert parallelism: the others are another rank's;
 * num_experts 0: every pair, and topk_ids may be NULL without b2).
 * deterministic != 0: fixed reduction order (j ascending), bit-identical across runs. */
mb_status mb_finalize(const void* gemm2_out, int dtype, const void* b2, const float* topk_weights,
                      const int32_t* topk_ids, const int32_t* unpermuted_to_permuted, int num_tokens,
                      int hidden, int top_k, int num_experts, int deterministic, void* out, cudaStream_t stream);

/* ---- expert parallelism: the token side of dispatch and combine (stages/ep_dispatch.cu) -----------------
 * mb_ep_layout: rank d holds experts [d * experts_per_rank, (d + 1) * experts_per_rank) (ep_size <= 32); token
 * t goes once to every rank holding one of its top-k experts. send_counts [ep_size]: rows for each rank;
 * send_tokens [<= T * ep_size]: the token of each send row, rows grouped by rank (rank ascending), tokens
 * ascending within a rank; token_slots [T, ep_size]: token t's send row for rank d, or -1. block_counts: past 1024
 * tokens its scratch, ceil(T / 1024) * ep_size int32 (NULL allowed up to 1024 tokens).
 * mb_ep_pack_send: send row i < send_rows (mb_ep_layout's, rank d's the segment of send_counts holding i):
 * out_rows[i] = hidden[send_tokens[i]] ([rows, hidden_size] in dtype), out_ids[i][j] = its j-th top-k id made
 * local to rank d (id - d * experts_per_rank, or -1 where rank d does not hold it), out_weights[i][j] its
 * weight ([rows, top_k] int32 / fp32).
 * mb_ep_local_ids: topk_ids[i] (i < count, int32) made local to the rank holding experts [first_expert,
 * first_expert + experts_per_rank) in place: id - first_expert there, else -1.
 * mb_ep_combine: out[t] = sum over d ascending with token_slots[t, d] >= 0 of returned[token_slots[t, d]],
 * in fp32, rounded once (returned [rows, hidden] and out [T, hidden] in dtype). max_sms: 0 for the default
 * grid, else at most that many blocks (so at most that many SMs); the result does not depend on it. */
mb_status mb_ep_layout(const int32_t* topk_ids, int num_tokens, int top_k, int ep_size, int experts_per_rank,
                       int32_t* send_counts, int32_t* send_tokens, int32_t* token_slots, int32_t* block_counts,
                       cudaStream_t stream);
mb_status mb_ep_pack_send(const void* hidden, int dtype, const int32_t* topk_ids, const float* topk_weights,
                          int hidden_size, int top_k, int ep_size, int experts_per_rank, const int32_t* send_counts,
                          const int32_t* send_tokens, int send_rows, void* out_rows, int32_t* out_ids,
                          float* out_weights, cudaStream_t stream);
mb_status mb_ep_local_ids(int32_t* topk_ids, int64_t count, int first_expert, int experts_per_rank,
                          cudaStream_t stream);
mb_status mb_ep_combine(const void* returned, int dtype, const int32_t* token_slots, int num_tokens, int hidden,
                        int ep_size, void* out, int max_sms, cudaStream_t stream);

/* stages/ep_nccl.cu: the `nccl` dispatch's exchanges over a communicator of ep_size ranks (comm: an ncclComm_t,
 * torch's ProcessGroupNCCL._comm_ptr()), in one NCCL group on `stream`. Payload j (row_bytes_j > 0; 0: none)
 * sends send_j's rows for rank d, send_rows[d] of them from row send_rows[0] + .. + send_rows[d - 1], and
 * receives recv_rows[d] rows from rank d into recv_j likewise; send_rows / recv_rows are HOST arrays of ep_size
 * counts, each rank's send_rows[d] equal to rank d's recv_rows[rank]. MB_ERR_UNSUPPORTED where NCCL is not
 * loaded in the process or the communicator is non-blocking. */
mb_status mb_ep_nccl_exchange(void* comm, int ep_size, const int32_t* send_rows, const int32_t* recv_rows,
                              const void* send0, void* recv0, int64_t row_bytes0, const void* send1, void* recv1,
                              int64_t row_bytes1, const void* send2, void* recv2, int64_t row_bytes2,
                              cudaStream_t stream);
/* The all-gather form, where the host knows every rank's row count (rows: a HOST array of ep_size, the same on
 * every rank): each rank's rows[rank] rows of payload j (send_j) to every rank, rank d's landing at row rows[0] +
 * .. + rows[d - 1] of recv_j; NCCL all-gathers where the counts are equal, else a broadcast per rank, one group. */
mb_status mb_ep_nccl_all_gather(void* comm, int ep_size, const int32_t* rows, const void* send0, void* recv0,
                                int64_t row_bytes0, const void* send1, void* recv1, int64_t row_bytes1,
                                const void* send2, void* recv2, int64_t row_bytes2, cudaStream_t stream);
/* Its return: out [rows[rank]][hidden] = the sum over ranks d of rank d's partial rows for this rank (partial:
 * [rows[0] + .. + rows[ep_size - 1]][hidden] of enum mb_dtype, laid out as the all-gather landed them); NCCL's sum
 * (fp32 adds of 16-bit values, rounded at each step of its order): a reduce-scatter, or a reduce per rank. */
mb_status mb_ep_nccl_reduce_scatter(void* comm, int ep_size, const int32_t* rows, int64_t hidden, int dtype,
                                    const void* partial, void* out, cudaStream_t stream);

/* stages/ep_nvlink.cu: the `nvlink` dispatch and combine over buffers every rank maps (symmetric memory).
 * A rank's symmetric buffer holds recv_rows [ep][cap][H] (dtype), recv_meta [ep][cap][2K + 1] int32 (K global
 * expert ids, then K fp32 weights' bits, then the row's token index in its source's call), recv_counts [ep][2]
 * int32 (rows from source s, and their first send row in s's send order), returned [max(ep, K) * cap][H] and
 * flags [2][ep] int32 (zero before the first call); peer_* are
 * device arrays of ep_size pointers, entry d rank d's buffer of that kind. cap >= the tokens of any call (a
 * source sends a token at most once to a rank). `done` (dispatch, return): a local int32 counter, zero before the
 * first call and left zero by every call; one per kernel kind and instance in flight.
 * mb_ep_nvlink_dispatch: mb_ep_layout of the num_tokens (<= cap) tokens (send_counts and token_slots written as it
 * writes them; send_tokens [T * ep_size] and block_counts its scratch, unread up to 128 tokens, where one kernel
 * lays the tokens out and sends them), then the send rows written into peer d's recv slots [rank][0..), and peer d's
 * recv_counts[rank]; then peer d's flags[0][rank] = 1.
 * mb_ep_nvlink_wait: waits until flags[0..ep_size) (this rank's flags[0] or flags[1]) are all 1, then sets
 * them to 0; one block, waiting as long as the peers take (as NCCL's kernels do).
 * mb_ep_nvlink_gather: after mb_ep_nvlink_wait(flags[0]), or where wait_flags (this rank's flags[0]) is given
 * waiting for them itself in every block (wait_seen: a local int32 counter as `done`), the received rows as one
 * dense block of `capacity`
 * rows, sources in rank order: out_hidden [capacity][H], out_ids [capacity][K] (local ids: global - first_expert
 * where in [0, local_experts), else -1), out_weights, src_rank / src_row [capacity] (where its partial output
 * goes; src_rank -1 past the received rows, whose ids are all -1); *received = min(rows, capacity) and
 * *overflow = (rows > capacity): rows past the capacity are dropped, their sources' returned rows set to zero
 * (peer_returned as mb_ep_nvlink_return's), nothing else is written. in_place != 0: capacity must be
 * ep_size * cap (every slot), out_hidden is not read: row j is recv_rows' slot j (source j / cap), read there by
 * the experts; only out_ids,
 * out_weights, src_rank / src_row (src_rank -1 for a slot past its source's count) are written, *received = the
 * rows that arrived, *overflow = 0.
 * mb_ep_nvlink_return: partial [rows][H] row j (j < *rows_limit where rows_limit is given) written into rank
 * src_rank[j]'s returned[src_row[j]] (src_rank[j] -1: nowhere); then every peer's flags[1][rank] = 1 (also with
 * no rows). mb_ep_combine follows mb_ep_nvlink_wait(flags[1]), or
 * mb_ep_nvlink_combine does all three in one kernel: mb_ep_nvlink_return of the rows (rows, partial, src_rank,
 * src_row, peer_returned, peer_flags, done as there), then every block waits for flags[1] (seen: a local counter as
 * `done`), the last lowers them, and the num_tokens tokens are summed as mb_ep_combine from `returned` (this rank's)
 * into out (launched with no rows and no tokens too); its grid is capped at the blocks the SMs hold at once.
 * Waiting in every block of a kernel saves a launch but holds the SMs it spins on: with a second micro-batch in
 * flight beside it (dual-batch overlap), wait with mb_ep_nvlink_wait's one block instead.
 * max_sms (dispatch, gather, return, combine): 0 for the default grid, else at most that many blocks, so the kernel
 * occupies at most that many SMs (the rest stay free for compute beside it); the rows written do not depend on
 * it. */
mb_status mb_ep_nvlink_dispatch(const void* hidden, int dtype, const int32_t* topk_ids, const float* topk_weights,
                                int num_tokens, int hidden_size, int top_k, int rank, int ep_size, int experts_per_rank,
                                int cap, int32_t* send_counts, int32_t* send_tokens, int32_t* token_slots,
                                int32_t* block_counts, void* const* peer_rows, int32_t* const* peer_meta,
                                int32_t* const* peer_counts, int32_t* const* peer_flags, int32_t* done, int max_sms,
                                cudaStream_t stream);
mb_status mb_ep_nvlink_wait(int32_t* flags, int ep_size, cudaStream_t stream);
mb_status mb_ep_nvlink_gather(const void* recv_rows, int dtype, const int32_t* recv_meta, const int32_t* recv_counts,
                              int ep_size, int cap, int hidden_size, int top_k, int first_expert, int local_experts,
                              int capacity, int in_place, void* out_hidden, int32_t* out_ids, float* out_weights,
                              int32_t* src_rank, int32_t* src_row, int32_t* received, int32_t* overflow,
                              void* const* peer_returned, int32_t* wait_flags, int32_t* wait_seen, int max_sms,
                              cudaStream_t stream);
mb_status mb_ep_nvlink_return(const void* partial, int dtype, const int32_t* src_rank, const int32_t* src_row,
                              int rows, const int64_t* rows_limit, int hidden_size, void* const* peer_returned,
                              int rank, int ep_size, int32_t* const* peer_flags, int32_t* done, int max_sms,
                              cudaStream_t stream);
mb_status mb_ep_nvlink_combine(const void* partial, int dtype, const int32_t* src_rank, const int32_t* src_row,
                               int rows, int hidden_size, void* const* peer_returned, int rank, int ep_size,
                               int32_t* const* peer_flags, int32_t* done, const void* returned,
                               const int32_t* token_slots, int num_tokens, void* out, int32_t* flags, int32_t* seen,
                               int max_sms, cudaStream_t stream);

/* stages/ep_permute.cu: dispatch_with_permute's receiving side (seed 004): the rows in this rank's recv slots (as
 * mb_ep_nvlink_gather reads them) expanded to one row per (row, local expert) pair, grouped by local expert:
 * expert e's rows are [expert_offsets[e], expert_offsets[e] + expert_counts[e]) of `rows`, the group
 * expert_offsets[e + 1] - expert_offsets[e] rows long: expert_counts[e] rounded up to pad_multiple (contiguous,
 * expert_capacity 0), or expert_capacity (batched; pad_multiple must be 1), pairs past it dropped.
 * mb_ep_permute_layout (one block; where wait_flags (this rank's flags[0]) is given it waits for them and lowers
 * them, wait_seen a zero local counter): expert_offsets [local_experts + 1] int64, expert_counts [local_experts]
 * int32, pair_row [ep * cap * K] int32 (slot j's pair k: its row, -1 for another rank's expert, -2 dropped; written
 * for received slots only), row_src_rank / row_return [rows] int32 (the row's source rank, -1 for padding, and its
 * pair's index token * K + k in the source's returned, for mb_ep_nvlink_return), *overflow = (a pair was dropped).
 * The order of a group's rows is not fixed (no row's expert output depends on it).
 * mb_ep_permute_rows (after the layout): each received row copied to its pairs' rows; a dropped pair's source gets
 * a zero row at returned[token * K + k] (peer_returned as mb_ep_nvlink_return's; NULL: none). max_sms as above.
 * cap 0 (both): the received rows are dense, each source's right after the previous one's (the nccl dispatch's
 * exact sizes), recv_meta [rows][2K + 1]; mb_ep_permute_rows then sizes its grid for max_rows rows. */
mb_status mb_ep_permute_layout(const int32_t* recv_meta, const int32_t* recv_counts, int ep_size, int cap, int top_k,
                               int first_expert, int local_experts, int pad_multiple, int expert_capacity,
                               int64_t* expert_offsets, int32_t* expert_counts, int32_t* pair_row,
                               int32_t* row_src_rank, int32_t* row_return, int32_t* overflow, int32_t* wait_flags,
                               int32_t* wait_seen, cudaStream_t stream);
mb_status mb_ep_permute_rows(const void* recv_rows, int dtype, const int32_t* recv_meta, const int32_t* recv_counts,
                             int ep_size, int cap, int max_rows, int hidden_size, int top_k, const int32_t* pair_row,
                             void* rows, void* const* peer_returned, int max_sms, cudaStream_t stream);

/* ---- FP8 activation quantization (issue 46): the FP8 GEMMs' inputs ---------------------------------
 * A row of `cols` fp16/bf16 values x becomes e4m3 bytes q = e4m3(x / s) and fp32 scales, bit for bit
 * moe_build/weights/fp8.py's quantize_rows: x / s an IEEE fp32 division of x's fp32 value, rounded to
 * nearest even and saturated to +-448 (q * s dequantizes). The scale s and the scales written:
 *   static_scale != NULL (one fp32 in device memory; group must be 0): s = *static_scale, and every row's
 *     scale entry is that value, scales [rows] (the GEMMs always read a per-row array);
 *   static_scale == NULL, group 0: per row, s = max(amax(|x_row|), 1e-12) / 448 in fp32 (an IEEE division),
 *     scales [rows];
 *   static_scale == NULL, group 128: per row and 128-column group (the last may be partial), s as above
 *     over the group, scales [rows, ceil(cols / 128)] row-major (the GEMMs' MB_FP8_BLOCK128 scale_a).
 * dtype MB_FP16 or MB_BF16 (MB_FP32: MB_ERR_UNSUPPORTED). Inputs are finite (NaN and inf: no contract).
 * prequant_scale (W4AFP8's AWQ pre-quant scale, fp32 [cols] in device memory) or NULL: where given, x is each
 * element's fp32 value times prequant_scale[c], one fp32 multiply (rounded once), for the amax and the division
 * alike; what the fp64 reference quantizes after converting its exact product to fp32. */

/* stages/quantize_fp8.cu: out [rows, cols] e4m3 and out_scales, the quantization of in [rows, cols] (dtype):
 * the unfused step, before mb_expand_rows_fp8_prequantized, or after a plain expansion or activation where a
 * W4AFP8 plan leaves the pre-quant scale out of them. */
mb_status mb_quantize_fp8(const void* in, int dtype, int64_t rows, int cols, const float* prequant_scale,
                          const float* static_scale, int group, uint8_t* out, float* out_scales, cudaStream_t stream);

/* The FP8 row steps' kernels, mb_expand_rows_fp8's and mb_fc1_activation_fp8's (and their _dequantized forms'): the
 * step tactic the plan gives each call (moe_build/planner/tactics/steps.py), run as given. A kernel that cannot take
 * the call is refused (MB_ERR_UNSUPPORTED, naming what it needs), never replaced by another. "Whole units": cols a
 * multiple of 8, the 16-bit pointers 16-byte and the e4m3 ones 8-byte aligned. */
typedef enum {
  MB_STEP_BLOCK_ROWS = 0,   /* blocks over the rows (the expansion: over the tokens): every call; the only kernel of
                               the _dequantized forms with a static scale (the 16-bit step's) */
  MB_STEP_WARP_ROWS = 1,    /* a warp a row (the expansion: a token), a persistent grid: whole units, no pre-quant
                               scale, rows of at most 4096 columns (the activation's gated rows: 1536 a half) */
  MB_STEP_STAGED_ROWS = 2,  /* the activation: rows copied into a shared-memory ring ahead of use, whole units, a ring
                               of two rows within a block's shared memory */
  MB_STEP_GROUP_ITEMS = 3,  /* the activation: half a warp a (row, 128-column group), whole units, a static or
                               per-group scale, no pre-quant scale, e4m3 bytes out (not the _dequantized form) */
} mb_step_tactic;

/* stages/expand_rows.cu: mb_expand_rows with the rows quantized as they are copied: permuted_input [T*K, H]
 * e4m3 and permuted_scales (the layout above, one scale row per permuted row) with row p the quantization
 * of input[e / K], permuted_weights[p] = topk_weights[e], for p = unpermuted_to_permuted[e]: a token's row
 * is read and quantized once and its bytes and scales stored K times (at decode sizes the K rows are split
 * among blocks, each quantizing the row). zero_out [T, H] in dtype or NULL, as mb_expand_rows' (it must not
 * overlap input: MB_ERR_INVALID_ARGUMENT). prequant_scale [H] or NULL as above: W4AFP8's AWQ FC1 pre-quant scale
 * fused into the expansion (expand_rows=prequant_fused); equal, bit for bit, to mb_expand_rows then
 * mb_quantize_fp8 with the same scale. Launched after a trigger, it reads input (and quantizes it) before it waits
 * on its stream predecessor, whose output it needs for the maps only: input must be written before that
 * predecessor, never by it, and the predecessor must wait on its own before it lets this kernel start, as the map
 * builds do (the layer's order). tactic: mb_step_tactic, MB_STEP_BLOCK_ROWS or MB_STEP_WARP_ROWS. */
mb_status mb_expand_rows_fp8(const void* input, int dtype, const int32_t* unpermuted_to_permuted,
                             const float* topk_weights, const float* prequant_scale, int num_tokens, int hidden,
                             int top_k,
                             const float* static_scale, int group, uint8_t* permuted_input, float* permuted_scales,
                             float* permuted_weights, void* zero_out, int tactic, cudaStream_t stream);
/* The same expansion of rows mb_quantize_fp8 quantized: input_fp8 [T, H] e4m3 and input_scales
 * [T, scale_cols] (scale_cols 1, or ceil(H / 128) for group 128) copied to permuted_input [T*K, H] and
 * permuted_scales [T*K, scale_cols]. zero_out [T, H] in zero_dtype (MB_FP32, MB_FP16 or MB_BF16) or NULL
 * (zero_dtype is then not read); it must not overlap input_fp8. */
mb_status mb_expand_rows_fp8_prequantized(const uint8_t* input_fp8, const float* input_scales, int scale_cols,
                                          const int32_t* unpermuted_to_permuted, const float* topk_weights,
                                          int num_tokens, int hidden, int top_k, uint8_t* permuted_input,
                                          float* permuted_scales, float* permuted_weights, void* zero_out,
                                          int zero_dtype, cudaStream_t stream);

/* stages/fc1_activation.cu: GEMM2's FP8 input in the activation step: for p < off[E], the values
 * mb_fc1_activation computes (act(in[p, :N1] + b1[expert(p)]), rounded to dtype as it writes them) quantized
 * into out [max_rows, inter] e4m3 and out_scales (the layout above, rows = max_rows), so this equals
 * mb_fc1_activation then mb_quantize_fp8 bit for bit. Rows past off[E] and their scales are not written.
 * prequant_scale [inter] or NULL as above (W4AFP8's AWQ FC2 pre-quant scale, fc2_prequant=fused) multiplies the
 * rounded activated values; then this equals mb_fc1_activation then mb_quantize_fp8 with that scale. tactic:
 * mb_step_tactic, any of the four (the same bytes from each). */
mb_status mb_fc1_activation_fp8(const void* in, int dtype, const void* b1, const int64_t* expert_first_token_offset,
                                int num_experts, int64_t max_rows, int inter, int activation, float swiglu_alpha,
                                float swiglu_limit, const float* prequant_scale, const float* static_scale, int group,
                                uint8_t* out, float* out_scales, int tactic, cudaStream_t stream);
/* W4AFP8, whose GEMMs are W4A16's on 16-bit rows (issue 47): the same quantizations by the static scale (static_scale,
 * one fp32 on the device) or, static_scale NULL, by each row's dynamic scale (group 0 above), each element stored as
 * its e4m3 value times its scale in one fp32 multiply, rounded to dtype (permuted_input / out [rows, cols] in dtype,
 * no scales).
 * stages/expand_rows.cu: the rows mb_expand_rows_fp8 quantizes (prequant_scale [H] or NULL, zero_out as
 * mb_expand_rows'); stages/fc1_activation.cu: the values mb_fc1_activation_fp8 quantizes (with MB_ACT_IDENTITY and
 * b1 NULL: in's own rows, the separate step after mb_fc1_activation or a plain expansion); gate_up_interleaved as
 * mb_fc1_activation's (a gated activation and a static scale: W1 interleaved where GEMM1's gated epilogue runs in some
 * band). tactic: as the FP8 forms' (with a static scale MB_STEP_BLOCK_ROWS; group items never). */
mb_status mb_expand_rows_fp8_dequantized(const void* input, int dtype, const int32_t* unpermuted_to_permuted,
                                         const float* topk_weights, const float* prequant_scale, int num_tokens,
                                         int hidden, int top_k, const float* static_scale, void* permuted_input,
                                         float* permuted_weights, void* zero_out, int tactic, cudaStream_t stream);
mb_status mb_fc1_activation_fp8_dequantized(const void* in, int dtype, const void* b1,
                                            const int64_t* expert_first_token_offset, int num_experts,
                                            int64_t max_rows, int inter, int activation, int gate_up_interleaved,
                                            float swiglu_alpha,
                                            float swiglu_limit, const float* prequant_scale,
                                            const float* static_scale, void* out, int tactic, cudaStream_t stream);
/* ---- end of FP8 activation quantization ------------------------------------------------------------ */

/* ---- grouped GEMMs over expert segments ------------------------------------------------------------
 * C[p] = A[p] @ B[x]^T for the permuted rows p of expert x (expert_first_token_offset), in one of three
 * epilogues per entry point: plain store (+ bias), gated activation (GEMM1: act(gate, up) written at
 * half width) or finalize (GEMM2: unpermute + top-k weight + bias, added into the token's output row).
 *
 * How a GEMM runs is its tactic, an argument of every entry point: moe-build's planner chooses it per
 * GEMM and token-count band from its table of measured rules (moe_build/planner/tactics/) and the
 * plan records it; the library never chooses one and reads no environment. A tactic the entry point
 * cannot run (a kernel of another architecture, a tile that does not take the weight layout, a
 * placement without a gated or finalize epilogue) is MB_ERR_UNSUPPORTED or MB_ERR_INVALID_ARGUMENT. */
enum mb_gemm_kernel {
  MB_GEMM_DECODE = 0,  /* gemm/decode.cu: swap-AB mma.sync, weights streamed into registers (few rows) */
  MB_GEMM_MMA = 1,     /* gemm/mma.cuh: cp.async + ldmatrix + mma.sync tiles (sm_80 and later) */
  MB_GEMM_WGMMA = 2,   /* gemm/sm90_*: CUTLASS 3 TMA warp-specialized wgmma kernels (sm_90a, sm90 entry points) */
};
enum mb_gemm_tile {
  MB_TILE_NONE = 0,                /* the decode kernel (no tile) */
  MB_TILE_MMA_16x64 = 1,           /* mma.sync tiles, BM x BN */
  MB_TILE_MMA_64x128 = 2,
  MB_TILE_MMA_128x128 = 3,
  MB_TILE_COOP_128x256 = 4,        /* wgmma: cooperative 128 x 256 */
  MB_TILE_PINGPONG_64x256 = 5,     /* wgmma: pingpong 64 x 256 */
  MB_TILE_PINGPONG_64x128 = 6,     /* wgmma: pingpong 64 x 128 */
  MB_TILE_PINGPONG_64x256_C2 = 7,  /* wgmma: pingpong 64 x 256 in 2x1 clusters (weight tile multicast) */
  MB_TILE_PINGPONG_64x192_C2 = 8,  /* wgmma: pingpong 64 x 192 in 2x1 clusters (row-major weights only) */
  MB_TILE_COOP_128x128 = 9,        /* wgmma: cooperative 128 x 128 (the FP8 GEMM only) */
  MB_TILE_COOP_128x128_C2 = 10,    /* wgmma: cooperative 128 x 128 in 2x1 clusters (weight tile multicast; FP8 only) */
  MB_TILE_COOP_128x192 = 11,       /* wgmma: cooperative 128 x 192 (the FP8 GEMM only, rowwise scales) */
  MB_TILE_COOP_128x192_C2 = 12,    /* wgmma: cooperative 128 x 192 in 2x1 clusters (FP8 only, rowwise scales) */
  MB_TILE_WOQ_128x64 = 13,         /* wgmma mixed-input: 128 weight rows x 64 token rows (mb_grouped_gemm_woq_sm90) */
  MB_TILE_WOQ_128x128 = 14,        /* wgmma mixed-input: 128 weight rows x 128 token rows (mb_grouped_gemm_woq_sm90) */
  MB_TILE_WOQ_128x16 = 15,         /* wgmma mixed-input: 128 weight rows x 16 token rows */
  MB_TILE_WOQ_128x32 = 16,         /* wgmma mixed-input: 128 weight rows x 32 token rows */
  MB_TILE_WOQ_128x256 = 17,        /* wgmma mixed-input: 128 weight rows x 256 token rows */
  MB_TILE_DECODE_STAGED = 18,      /* decode with the chunk's token rows staged in shared memory (the weight-only
                                      int4 forms with one scale per row or per 128 k, mb_grouped_gemm_woq) */
  MB_TILE_PINGPONG_64x128_C2 = 19, /* wgmma: pingpong 64 x 128 in 2x1 clusters (weight tile multicast; FP8 only) */
  MB_TILE_PINGPONG_128x128 = 20,   /* wgmma: pingpong 128 x 128, a warpgroup's tile two 64-row wgmmas (the FP8 GEMM
                                      only, rowwise scales with fast accumulation) */
  MB_TILE_PINGPONG_128x128_C2 = 21, /* wgmma: pingpong 128 x 128 in 2x1 clusters (weight tile multicast; FP8 only,
                                       rowwise scales with fast accumulation) */
  MB_TILE_DECODE_DIGITS = 22,      /* decode on the int8 mma, A the token digits mb_token_digits writes (the weight-only
                                      int4 forms with one scale per row, per 64 k or per 128 k, and MXFP4,
                                      MB_INPUT_DIGITS) */
  MB_TILE_DECODE_TWOCTA = 23,      /* decode held to 128 registers a thread, two CTAs an SM (the FP8 GEMM with
                                      MB_FP8_BLOCK128 scales only, whose plain decode kernel holds one) */
  MB_TILE_WOQ_128x320_C2 = 24,     /* wgmma mixed-input: 128 weight rows x 320 token rows in 2x1 clusters (the token
                                      tile multicast, each CTA loading 160 of its rows) */
  MB_TILE_WOQ_128x160 = 25,        /* wgmma mixed-input: 128 weight rows x 160 token rows */
  MB_TILE_WOQ_128x192 = 26,        /* wgmma mixed-input: 128 weight rows x 192 token rows */
  MB_TILE_WOQ_128x224 = 27,        /* wgmma mixed-input: 128 weight rows x 224 token rows */
  MB_TILE_DECODE_STAGED_C4 = 28,   /* decode as MB_TILE_DECODE_STAGED with K split over the four CTAs of a (1, 1, 4)
                                      cluster, each staging its quarter of the token rows, the partial sums added in
                                      the first CTA's shared memory in rank order (compute capability 9.0) */
};
enum mb_gemm_launch {
  MB_LAUNCH_PLAIN = 0,          /* an ordinary launch */
  MB_LAUNCH_AFTER_TRIGGER = 1,  /* programmatic dependent launch: CTAs set up under the previous kernel's tail
                                   and wait for it before reading A (decode, wgmma; plain below sm_90) */
  MB_LAUNCH_PLACED = 2,         /* wgmma pingpong 64x256 / 64x128 of the 16-bit sm90 entry points with the
                                   gated or finalize epilogue: after a trigger, each CTA starting at the tiles a
                                   plain launch puts on its SM (needs the caller's `placement` region) */
};
enum mb_output_l2 {
  MB_OUTPUT_L2_PLAIN = 0,       /* ordinary stores */
  MB_OUTPUT_L2_EVICT_LAST = 1,  /* wgmma gated / finalize epilogues: outputs written under L2 evict_last */
};
typedef struct mb_gemm_tactic {
  int32_t kernel;     /* enum mb_gemm_kernel */
  int32_t tile;       /* enum mb_gemm_tile: MB_TILE_NONE (or MB_TILE_DECODE_STAGED / _STAGED_C4 / _DIGITS / _TWOCTA) for decode, an MMA tile for mma,
                         a wgmma tile for wgmma */
  int32_t k_split;    /* decode: K slices per CTA, 1, 2, 4 or 8; 0 for the other kernels */
  int32_t launch;     /* enum mb_gemm_launch: mma PLAIN (the weight-only GEMM's also AFTER_TRIGGER); decode PLAIN or
                         AFTER_TRIGGER; wgmma any (PLACED as above) */
  int32_t output_l2;  /* enum mb_output_l2: EVICT_LAST only for the wgmma gated and finalize epilogues */
} mb_gemm_tactic;

/* Weight layout of B (weight_layout), the sm90 entry points:
 *   MB_WEIGHTS_ROW_MAJOR: each expert's [n, k] row-major, experts back to back;
 *   MB_WEIGHTS_BLOCKED64: the stacked [E * n, k] rows in 64 x 64 blocks, each block row-major and
 *     contiguous, blocks ordered row block by row block: element (r, c) at
 *     ((r / 64) * (k / 64) + c / 64) * 4096 + (r % 64) * 64 + c % 64 (moe_build.weights.block_64x64).
 *     A wgmma tile's weight tile is then a few 8 KB runs instead of 128-byte pieces of as many rows.
 *     Needs n (the gated entry: 2 * inter) and k multiples of 64; the mma tiles and the wgmma
 *     pingpong 64x192 in 2x1 clusters refuse it (MB_ERR_UNSUPPORTED). */
enum mb_weight_layout { MB_WEIGHTS_ROW_MAJOR = 0, MB_WEIGHTS_BLOCKED64 = 1 };

/* gemm/sm80.cu: C[p] = act(A[p] @ B[x]^T + bias[x]) (sm_80 and later; tactic kernel DECODE or MMA).
 * fused_gated: B is [E, 2N, K] (gate rows, then up rows) and C = gated_act(gate, up) [rows, N] in one
 * kernel (the SM80 fused gated-activation kernel). No workspace. */
size_t mb_grouped_gemm_sm80_workspace(int num_experts);
mb_status mb_grouped_gemm_sm80(const void* A, const void* B, const void* bias, void* C,
                               const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                               int n, int k, int dtype, int activation, int fused_gated, float swiglu_alpha,
                               float swiglu_limit, mb_gemm_tactic tactic, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);

/* gemm/sm90_abi.cu: the sm90 entry points (a non-9.0 device gets MB_ERR_UNSUPPORTED). Plain:
 * C[p] = A[p] @ B[x]^T (+bias). Finalize: out[t] += topk_weight * (A[p] @ B[x]^T + bias) scattered to the
 * token row of p; out [T, n] is in `dtype` and must be zeroed by the caller (the runner has mb_expand_rows'
 * zero_out do it); each element gets top_k atomic adds (packed 2-element fp16/bf16 atomics), so with
 * top_k < 3 the adds commute and the result is deterministic. The decode kernel needs no workspace and
 * reduces in a fixed order (bit-reproducible); the wgmma kernels need mb_grouped_gemm_sm90_workspace().
 * For every GEMM entry point max_rows >= off[E] (e.g. T * top_k) bounds the rows; n, k % 8 == 0; with
 * the wgmma kernels A must hold max_rows rows (its TMA tiles may read rows off[E] .. max_rows - 1, which
 * reach no output), and max_rows and E * n must fit in int32; fp16/bf16 only (fp32: MB_ERR_UNSUPPORTED). */
size_t mb_grouped_gemm_sm90_workspace(int num_experts, int64_t max_rows, int n, int k);
/* placement (the finalize and gated entry points): NULL, or a claim region of
 * mb_grouped_gemm_sm90_placement_ints() int32 that is zero before its first use and is given to no call that
 * may run at the same time as this one; each call leaves it as the next needs it. A tactic with
 * MB_LAUNCH_PLACED needs it (else MB_ERR_INVALID_ARGUMENT): its CTAs start at the tiles a plain launch puts
 * on their SM, from a record taken once per device at the first such call outside a graph capture; until
 * that record exists (a first call inside a capture) the call launches plainly.
 * The previous kernel in the stream must not write B, the bias or the expert offsets (the runner's chain
 * writes them at least one kernel earlier). */
size_t mb_grouped_gemm_sm90_placement_ints(void);
/* 1 once the current device has its placement record (taken at the first placed call), else 0. */
int mb_grouped_gemm_sm90_placement_recorded(void);
mb_status mb_grouped_gemm_sm90(const void* A, const void* B, const void* bias, void* C,
                               const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                               int n, int k, int dtype, int weight_layout, mb_gemm_tactic tactic, void* workspace,
                               size_t workspace_bytes, cudaStream_t stream);
mb_status mb_grouped_gemm_sm90_finalize(const void* A, const void* B, const void* bias, void* out,
                                        const int64_t* expert_first_token_offset,
                                        const int32_t* permuted_to_unpermuted, const float* permuted_weights,
                                        int num_experts, int64_t max_rows, int num_tokens, int top_k, int n,
                                        int k, int dtype, int weight_layout, mb_gemm_tactic tactic,
                                        int32_t* placement, void* workspace, size_t workspace_bytes,
                                        cudaStream_t stream);
/* GEMM1 with the gated activation in its epilogue: C [rows, inter] = act(gate, up) of
 * A [rows, k] @ B^T (+ bias), B [E, 2 * inter, k] and bias [E, 2 * inter] (or NULL) with the gate
 * and up rows interleaved in blocks of 8 (rows 16b..16b+7: gate features 8b..8b+7, rows
 * 16b+8..16b+15: their up projections). activation: MB_ACT_SWIGLU, MB_ACT_GEGLU or
 * MB_ACT_SWIGLU_CLAMP (with swiglu_alpha / swiglu_limit); inter a multiple of 8. Workspace as
 * mb_grouped_gemm_sm90_workspace(num_experts, max_rows, 2 * inter, k). */
mb_status mb_grouped_gemm_sm90_gated(const void* A, const void* B, const void* bias, void* C,
                                     const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                                     int inter, int k, int dtype, int activation, float swiglu_alpha,
                                     float swiglu_limit, int weight_layout, mb_gemm_tactic tactic,
                                     int32_t* placement, void* workspace, size_t workspace_bytes,
                                     cudaStream_t stream);

/* ---- FP8 grouped GEMM ------------------------------------------------------------------------------
 * gemm/fp8_abi.cu: C[p] = A[p] @ B[x]^T, scaled, (+ bias[x]) for the permuted rows p of expert x, with A
 * [max_rows, k] and B [E, n, k] in e4m3 (one byte each, B row-major per expert), fp32 accumulation and
 * C [max_rows, n] and bias [E, n] in dtype (MB_BF16 or MB_FP16: no FP8 output). The scales
 * (moe_build/weights/fp8.py says how checkpoints' scales become these):
 *   MB_FP8_ROWWISE : C[p, c] = scale_a[p] * scale_b[x, c] * sum_k A[p, k] B[x, c, k];
 *                    scale_a [max_rows], scale_b [E, n] (per-tensor weight scales repeated per column);
 *   MB_FP8_BLOCK128: C[p, c] = sum_kb scale_a[p, kb] * scale_b[x, c / 128, kb] * (the 128-k block kb's sum);
 *                    scale_a [max_rows, ceil(k / 128)], scale_b [E, ceil(n / 128), ceil(k / 128)], row-major.
 * Tactic kernels: MB_GEMM_DECODE (mma.sync e4m3, compute capability 8.9 and later; k_split 1, 2, 4 or 8; an
 * SM 8.9 GPU needs a library built with sm_89 code, else MB_ERR_UNSUPPORTED)
 * and MB_GEMM_WGMMA (compute capability 9.0; tiles MB_TILE_COOP_128x128, MB_TILE_COOP_128x128_C2 and
 * MB_TILE_PINGPONG_64x128, and MB_TILE_COOP_128x256, MB_TILE_COOP_128x192 and MB_TILE_COOP_128x192_C2 with
 * MB_FP8_ROWWISE, MB_TILE_PINGPONG_128x128 and MB_TILE_PINGPONG_128x128_C2 with MB_FP8_ROWWISE and MB_FP8_ACCUM_FAST; the _C2 tiles run in 2x1
 * clusters whose two CTAs share, by TMA multicast, the weight tile of neighbouring row tiles of one expert; launch
 * PLAIN or AFTER_TRIGGER, never PLACED). n and k multiples of
 * 16; A, B, C 16-byte aligned; the wgmma kernel needs mb_grouped_gemm_fp8_workspace() bytes (the decode kernel
 * none), and A must hold max_rows rows.
 * accumulation (mb_fp8_accumulation), the wgmma kernel's: MB_FP8_ACCUM_PROMOTED adds the tensor cores' partial sums
 * into fp32 registers every 128 k (the blockwise mainloop does so by construction); MB_FP8_ACCUM_FAST lets the
 * tensor cores accumulate the whole k (fp32 accumulator registers, the tensor cores' own precision within the
 * chain: TensorRT-LLM's Hopper FP8 MoE GEMMs run so), MB_FP8_ROWWISE only. The decode kernel adds each mma's sums
 * into fp32 registers and takes either value. */
enum mb_fp8_scaling { MB_FP8_ROWWISE = 0, MB_FP8_BLOCK128 = 1 };
enum mb_fp8_accumulation { MB_FP8_ACCUM_PROMOTED = 0, MB_FP8_ACCUM_FAST = 1 };
size_t mb_grouped_gemm_fp8_workspace(int num_experts, int64_t max_rows, int n, int k);
mb_status mb_grouped_gemm_fp8(const void* A, const float* scale_a, const void* B, const float* scale_b, int scaling,
                              int accumulation, const void* bias, void* C, const int64_t* expert_first_token_offset,
                              int num_experts, int64_t max_rows, int n, int k, int dtype, mb_gemm_tactic tactic,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream);
/* The FP8 GEMM2 with the finalize epilogue, as mb_grouped_gemm_sm90_finalize's for 16-bit GEMMs:
 * out[t] += permuted_weights[p] * (C[p] + bias[x]) for the token t = permuted_to_unpermuted[p] / top_k of each
 * permuted row p < off[E], C[p] the scaled product above (MB_FP8_ROWWISE: scaled before the bias; MB_FP8_BLOCK128:
 * by the mainloop). out [num_tokens, n] in dtype, 16-byte aligned, must be zeroed by the caller (the runner has
 * the expansion's or the three-step prologue's zero_out do it); each element gets top_k packed 2-element
 * fp16/bf16 atomic adds, so with top_k < 3 the adds commute and the result is deterministic. The same kernels,
 * tactics and workspace as mb_grouped_gemm_fp8, and output_l2 EVICT_LAST with the wgmma kernel (its atomics under
 * L2 evict_last). */
mb_status mb_grouped_gemm_fp8_finalize(const void* A, const float* scale_a, const void* B, const float* scale_b,
                                       int scaling, int accumulation, const void* bias, void* out,
                                       const int64_t* expert_first_token_offset,
                                       const int32_t* permuted_to_unpermuted, const float* permuted_weights,
                                       int num_experts, int64_t max_rows, int num_tokens, int top_k, int n, int k,
                                       int dtype, mb_gemm_tactic tactic, void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream);
/* The FP8 GEMM2 with the finalize epilogue that quantizes its own input (the plan's fc2_input_quant=gemm2):
 * mb_grouped_gemm_fp8_finalize, but A16 [max_rows, k] holds the 16-bit rows (dtype) the quantize step would read,
 * and each CTA quantizes its rows as it loads them, bit for bit as mb_quantize_fp8 does, into shared memory:
 * MB_FP8_ROWWISE by static_scale (that device scalar for every row) or, NULL, each row's own
 * max(amax, 1e-12) / 448, its sums scaled by those row scales; MB_FP8_BLOCK128 (static_scale NULL) each 128-column
 * group's own, as mb_quantize_fp8 with group 128, each 128-k block's sum scaled by its group's. The decode kernel
 * only (MB_GEMM_DECODE; any other tactic kernel is MB_ERR_UNSUPPORTED), k <= MB_FP8_QUANTIZING_MAX_K (the rows of a
 * chunk in shared memory); A16 16-byte aligned. */
#define MB_FP8_QUANTIZING_MAX_K 8192
mb_status mb_grouped_gemm_fp8_quantizing_finalize(const void* A16, const float* static_scale, const void* B,
                                                  const float* scale_b, int scaling, int accumulation,
                                                  const void* bias, void* out,
                                                  const int64_t* expert_first_token_offset,
                                                  const int32_t* permuted_to_unpermuted, const float* permuted_weights,
                                                  int num_experts, int64_t max_rows, int num_tokens, int top_k, int n,
                                                  int k, int dtype, mb_gemm_tactic tactic, cudaStream_t stream);
/* The FP8 GEMM1 with the gated activation in its epilogue, as mb_grouped_gemm_sm90_gated's for 16-bit GEMMs:
 * C [max_rows, inter] in dtype = act(gate, up) of the scaled product above (+ bias), B [E, 2 * inter, k] e4m3,
 * scale_b [E, 2 * inter] and bias [E, 2 * inter] (or NULL) with the gate and up rows interleaved in blocks of 8
 * (rows 16b..16b+7: gate features 8b..8b+7, rows 16b+8..16b+15: their up projections), each of gate and up scaled
 * by its row's and column's scale before the bias. MB_FP8_BLOCK128 scales take W1 stacked instead, as the checkpoint
 * stores it (rows 0..inter-1 gate, inter..2 inter-1 up; bias in the same order), and no static scale below; on the
 * decode kernel (MB_GEMM_DECODE) scale_b [E, ceil(2 inter / 128), ceil(k / 128)] (its 128-row scale blocks stay
 * whole), on the wgmma kernel (MB_GEMM_WGMMA; inter a multiple of 64) scale_b [E, 2 inter / 8, ceil(k / 128)] in
 * the gate/up halves' order, each 128-column tile t 64 features' gate columns, then their up columns: row 16t + u is
 * the scale of W1 rows 64t + 8u .. + 7 (u < 8, gate) or inter + 64t + 8(u - 8) .. + 7 (up), the stacked 128-row
 * block holding them; any other tactic kernel is MB_ERR_UNSUPPORTED. activation: MB_ACT_SWIGLU, MB_ACT_GEGLU or
 * MB_ACT_SWIGLU_CLAMP (with swiglu_alpha / swiglu_limit); inter a multiple of 8. The same kernels, tactics and
 * workspace as mb_grouped_gemm_fp8 (n = 2 * inter), and output_l2 EVICT_LAST with the wgmma kernel (its stores
 * under L2 evict_last).
 * c_static_scale (a device fp32 scalar) with c_scales [max_rows] fp32, or both NULL: C is e4m3 [max_rows, inter]
 * instead, GEMM2's FP8 input (the plan's fc2_input_quant=gemm1): each act(gate, up) rounded to dtype, then
 * quantized by that static scale bit for bit as mb_quantize_fp8 quantizes the 16-bit rows, and c_scales[p] set
 * to the scale for every row p written: the bytes and scales the quantize step would write. */
mb_status mb_grouped_gemm_fp8_gated(const void* A, const float* scale_a, const void* B, const float* scale_b,
                                    int scaling, int accumulation, const void* bias, void* C,
                                    const float* c_static_scale, float* c_scales,
                                    const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                                    int inter, int k, int dtype, int activation, float swiglu_alpha,
                                    float swiglu_limit, mb_gemm_tactic tactic, void* workspace,
                                    size_t workspace_bytes, cudaStream_t stream);

/* ---- weight-only grouped GEMM (issue 47) ----------------------------------------------------------
 * gemm/woq_abi.cu: C[p] = A[p] @ dequant(B[x])^T (+ bias[x]) for the permuted rows p of expert x; A
 * [max_rows, k] and C [max_rows, n] in dtype (MB_BF16 or MB_FP16), B in moe_build/weights/woq.py's forms:
 *   MB_WOQ_INT4 / MB_WOQ_INT4_TILES: int4 codes in rows or in 16-row tiles (below), w = (u - z) * s, s fp32
 *                 [E, n, k/group] (group 0: [E, n, 1]), z uint8 of the same shape (a 4-bit zero point, 0..15) or 8
 *                 where zeros is NULL;
 *   MB_WOQ_INT8 : int8 [E, n, k], w = q * s (s as above; no zeros);
 *   MB_WOQ_MXFP4: uint8 [E, n, k/2] e2m1 codes, scales uint8 e8m0 [E, n, k/32] (group 32), w = e2m1 * 2^(e-127).
 * The weight is rounded once to dtype before the mma (the mma kernel's int4 weights: d * s_hi + d * s_lo with
 * s split into two dtype values, which may differ from the fp32 product's rounding by one unit in the last
 * place); fp32 accumulation. Groups 32, 64 or 128 dividing k (or 0); n % 16 == 0, k % 32 == 0; A, B, C 16-byte
 * aligned; no workspace. Tactics (launch PLAIN or AFTER_TRIGGER, output_l2 PLAIN; else MB_ERR_UNSUPPORTED):
 *   MB_GEMM_DECODE (gemm/woq_decode.cu): k_split 1, 2, 4 or 8; up to 8 rows per CTA, for the few rows per
 *     expert of decode;
 *   MB_GEMM_MMA (gemm/woq_mma.cu): tile MB_TILE_MMA_64x128 or MB_TILE_MMA_128x128 (token rows x output
 *     columns per CTA; each CTA dequantizes its weight tile once per 64 token rows), for many rows per expert.
 * A's type (a_type; W4AFP8's FP8 activations arrive dequantized to dtype, mb_expand_rows_fp8_dequantized /
 * mb_fc1_activation_fp8_dequantized):
 *   MB_INPUT_DTYPE: A in dtype;
 *   MB_INPUT_DIGITS: A the token digits of 16-bit rows [max_rows, k] as mb_token_digits writes them for this
 *                   GEMM's group; the tactic's tile MB_TILE_DECODE_DIGITS and only then
 *                   (gemm/woq_decode_digits.cu: int4 codes, MXFP4's as 2 e2m1, or int8 weights as stored, times
 *                   8-bit digits on the int8 mma, each scale group's sum exact in int32); int4 weights with group 0
 *                   or 128 and k % 128 == 0, or group 64 and k % 64 == 0, MXFP4 in its quarters form
 *                   (MB_WOQ_MXFP4_QUARTERS, k % 128 == 0), or int8 with group 0 and k % 64 == 0 or group 128 and
 *                   k % 128 == 0 (else MB_ERR_UNSUPPORTED); MXFP4 and int8 read the digits laid out for group 32
 *                   (mb_token_digits' `group`); C in dtype. */
/* MB_WOQ_E5M2: e5m2 [E, n, k], w = q * s (mb_grouped_gemm_woq_sm90 and its gated and finalize forms only, dtype
 * MB_BF16): MXFP4 re-encoded for the mixed-input kernel, whose k tile takes one scale (moe_build/weights/woq.py's
 * mxfp4_as_e5m2).
 * MB_WOQ_MXFP4_QUARTERS: MXFP4 re-ordered for the digits tile (MB_INPUT_DIGITS only; moe_build/weights/woq.py's
 * mxfp4_quarters), so that a lane reads its codes of a 128-k group in one 16-byte load and its four scales in one
 * 4-byte load, and a decode warp's 16 rows of a group are 1024 contiguous code bytes and 64 contiguous scale bytes.
 * A row's group (k 128j .. 128j + 127) is 64 bytes holding at 16q + 4u its stored bytes 16u + 4q .. 16u + 4q + 3 (the
 * codes of k 32u + 8q .. 32u + 8q + 7), q, u = 0..3, and its four e8m0 scales 4 bytes (scale group u at byte u); the
 * rows lie in 16-row tiles (n % 16 == 0): codes uint8 [E, n, k/2] where tile t = r / 16 of an expert holds its rows'
 * at 8 k t, group j's 1024 bytes from 1024 j, row r % 16's 64 at 64 (r % 16); scales uint8 [E, n, k/32] the same way,
 * tile t's at k t / 2, group j's 64 bytes from 64 j, row r % 16's four at 4 (r % 16). Group 32, no zeros;
 * k % 128 == 0. A layer whose k ends in a half group (k % 128 == 64: GPT-OSS-20B's 2880) is padded to a whole one of
 * zero codes and exponents and run at that k: its token digits (mb_token_digits at the layer's k) hold as many
 * groups, the padded half's digits zero.
 * MB_WOQ_INT4: uint8 [E, n, k/2] 4-bit codes u in rows (row r's k/2 bytes at r k/2; low nibble the even column).
 * MB_WOQ_INT4_TILES: the same bytes, each 16 rows' (a tile; n % 16 == 0) reordered so that a decode warp's load of
 * its 16 rows reads contiguous bytes: uint8 [E, n, k/2] where tile t = r / 16 holds its rows' bytes at 8 k t, batch j
 * (k 128j .. 128j + 127) the 1024 bytes from 1024j, row r % 16's 64 at 64 (r % 16); a last batch of k % 128 k holds
 * its rows' (k % 128) / 2 bytes each, row by row (mb_grouped_gemm_woq, its finalize form and mb_woq_dequantize; the
 * wgmma kernels read rows). */
enum mb_woq_kind {
  MB_WOQ_INT4 = 0,
  MB_WOQ_INT8 = 1,
  MB_WOQ_MXFP4 = 2,
  MB_WOQ_E5M2 = 3,
  MB_WOQ_MXFP4_QUARTERS = 4,
  MB_WOQ_INT4_TILES = 5
};
enum mb_woq_input { MB_INPUT_DTYPE = 0, MB_INPUT_DIGITS = 1 };

/* stages/token_digits.cu: the token rows in [rows, k] (dtype fp16 or bf16) as the int8 mma's operand, for the
 * weight-only GEMM whose weights have one scale per `group` k (0: per row, 64 or 128 for int4, 32 for MXFP4;
 * k % 128 == 0, or k % 64 == 0 for groups 32 and 64): each 128-k group g of a row, with E its largest magnitude's exponent minus 5, as three
 * 8-bit digits per value, x = 2^(E - 12) * (4096 d0 + 64 d1 + d2) (|d0| <= 64, |d1|, |d2| <= 32): exact for every
 * value with no bits below 2^(E - 12) (every bf16 value within 2^10 of the group's largest, every fp16 one within
 * 2^7), the rest rounded there; a group holding an inf or NaN carries a NaN factor. A row with k % 128 == 64 ends
 * with a half group (its k 64..127 zero).
 * out [rows, ceil(k / 128), MB_TOKEN_DIGITS_BATCH_BYTES] bytes: per group the three digit planes (384 bytes, in the
 * order the decode kernel's mma fragments read them for `group`: group 64 keeps each mma step inside one 64-k half,
 * group 32 makes each step one 32-k scale group),
 * the int32 sum of the group's 4096 d0 + 64 d1 + d2, the fp32 factor 2^(E - 12), the int32 sum over its first 64 k,
 * and 4 zero bytes. Launched after a trigger (it waits for its predecessor first). */
#define MB_TOKEN_DIGITS_BATCH_BYTES 400
mb_status mb_token_digits(const void* in, int dtype, int64_t rows, int k, int group, uint8_t* out,
                          cudaStream_t stream);
/* The same digits made where GEMM1's and GEMM2's input rows are written (the plan's token_digits=fused), so that
 * the rows never pass through 16 bits in memory: mb_expand_rows_digits (stages/expand_rows.cu) writes
 * permuted_digits [T * K, ceil(hidden / 128), MB_TOKEN_DIGITS_BATCH_BYTES], the bytes of mb_expand_rows (its
 * arguments as there: prequant_scale, permuted_weights, zero_out) then mb_token_digits; mb_fc1_activation_digits
 * (stages/fc1_activation.cu) writes out [max_rows, ceil(inter / 128), MB_TOKEN_DIGITS_BATCH_BYTES] for p < off[E],
 * the bytes of mb_fc1_activation then mb_token_digits. `group`, hidden and inter as mb_token_digits' group and k;
 * dtype fp16 or bf16; input, in, b1 and zero_out 8-byte aligned, prequant_scale and the digits 16-byte. Both
 * launched after a trigger. mb_fc1_activation_digits lets its dependent (GEMM2) start before it waits for GEMM1, so
 * GEMM2 may read ahead of its own wait only what was complete before GEMM1 launched (the expert offsets, which the
 * expansion's trigger after its wait guarantees, and the weights). mb_expand_rows_digits reads its input rows before
 * it waits (as mb_expand_rows_fp8: its input must be complete before its predecessor starts) and waits before its
 * first store or map read. fp8_static_scale (one fp32 on the device) or
 * NULL: W4AFP8's, the digits then those of the rows mb_expand_rows_fp8_dequantized / mb_fc1_activation_fp8_dequantized
 * write; fp8_row_scale != 0 (W4AFP8's per-row scales; fp8_static_scale NULL, hidden or inter at most 16384): the
 * digits of the rows those write with each row's dynamic scale. */
mb_status mb_expand_rows_digits(const void* input, int dtype, const int32_t* unpermuted_to_permuted,
                                const float* topk_weights, const float* prequant_scale, const float* fp8_static_scale,
                                int fp8_row_scale, int num_tokens, int hidden, int top_k, int group,
                                uint8_t* permuted_digits, float* permuted_weights, void* zero_out,
                                cudaStream_t stream);
mb_status mb_fc1_activation_digits(const void* in, int dtype, const void* b1, const int64_t* expert_first_token_offset,
                                   int num_experts, int64_t max_rows, int inter, int activation,
                                   int gate_up_interleaved, float swiglu_alpha, float swiglu_limit,
                                   const float* prequant_scale, const float* fp8_static_scale, int fp8_row_scale,
                                   int group, uint8_t* out, cudaStream_t stream);
mb_status mb_grouped_gemm_woq(const void* A, int a_type, const void* B, int kind, const void* scales,
                              const uint8_t* zeros, int group, const void* bias, void* C,
                              const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows, int n,
                              int k, int dtype, mb_gemm_tactic tactic, cudaStream_t stream);
/* The weight-only GEMM2 with the finalize epilogue, as mb_grouped_gemm_fp8_finalize's: out[t] +=
 * permuted_weights[p] * (C[p] + bias[x]) for the token t = permuted_to_unpermuted[p] / top_k of each permuted row
 * p < off[E], C[p] mb_grouped_gemm_woq's product. out
 * [num_tokens, n] in dtype, 16-byte aligned, must be zeroed by the caller (the runner has the expansion's or the
 * three-step prologue's zero_out do it); each element gets top_k packed 2-element fp16/bf16 atomic adds, so with
 * top_k < 3 the adds commute and the result is deterministic. The decode kernel only (MB_GEMM_DECODE; else
 * MB_ERR_UNSUPPORTED), with mb_grouped_gemm_woq's weights, activations and other checks. */
mb_status mb_grouped_gemm_woq_finalize(const void* A, int a_type, const void* B, int kind,
                                       const void* scales, const uint8_t* zeros, int group, const void* bias, void* out,
                                       const int64_t* expert_first_token_offset, const int32_t* permuted_to_unpermuted,
                                       const float* permuted_weights, int num_experts, int64_t max_rows,
                                       int num_tokens, int top_k, int n, int k, int dtype, mb_gemm_tactic tactic,
                                       cudaStream_t stream);

/* gemm/woq_sm90.cu: the weight-only GEMM on wgmma (compute capability 9.0): C = A @ dequant(B[x])^T as
 * mb_grouped_gemm_woq, with CUTLASS's mixed-input mainloop converting the weights in registers (no 16-bit copy of
 * them is written). B as mb_grouped_gemm_woq's MB_WOQ_INT4 ([E, n, k/2] 4-bit codes u) or MB_WOQ_INT8 ([E, n, k]),
 * or MB_WOQ_E5M2 ([E, n, k] e5m2 values q, dtype MB_BF16 only: MXFP4 re-encoded per 64 k); scales in dtype, MN-major
 * [E, groups, n] (groups = k / group, or 1 for group 0); int4 only, zeros in dtype like the scales holding (8 - z) * s
 * (z the zero point; 0 for a checkpoint without zeros): w = (u - 8) * s + zeros (int4), q * s (int8, e5m2), each
 * product and sum rounded to dtype (moe_build/weights/woq.py's wgmma_operand writes them).
 * Group 0, 64
 * or 128 dividing k; n % 8 == 0 (a last 128-row weight tile past n reads zeros), k % 64 == 0; A, B, C, scales, zeros
 * 16-byte aligned. Tactic: MB_GEMM_WGMMA on
 * an MB_TILE_WOQ_* tile (128 weight rows x 16, 32, 64, 128 or 256 token rows), launch PLAIN, output_l2 PLAIN. The workspace holds CUTLASS's
 * per-SM maps and the per-expert pointer arrays: mb_grouped_gemm_woq_sm90_workspace bytes, 16-byte aligned. */
size_t mb_grouped_gemm_woq_sm90_workspace(int num_experts);
mb_status mb_grouped_gemm_woq_sm90(const void* A, const void* B, int kind, const void* scales, const void* zeros,
                                   int group, void* C, const int64_t* expert_first_token_offset, int num_experts,
                                   int64_t max_rows, int n, int k, int dtype, mb_gemm_tactic tactic, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream);
/* gemm/woq_sm90_gated.cu: GEMM1 on the same kernel with the gated activation in its epilogue: out[p, f] =
 * act(g + bg, u + bu) (* prequant_scale[f]) for feature f < inter, rounded to dtype once, g and u the products of W1
 * rows 16 (f / 8) + f % 8 (gate) and 8 further on (up): W1 (B, scales, zeros) and b1 [E, 2 inter] interleaved in
 * blocks of 8 features (the plan's w1_order gate_up_interleaved), so each wgmma thread holds both halves of its
 * feature. No [rows, 2 inter] output is written and no activation step runs. activation a gated one (MB_ACT_SWIGLU,
 * MB_ACT_GEGLU, MB_ACT_SWIGLU_CLAMP with swiglu_alpha and swiglu_limit); b1 and prequant_scale (fp32 [inter], AWQ's FC2
 * pre-quant scale, fc2_prequant=fused) may be NULL; out [max_rows, inter] in dtype; inter % 8 == 0 and n = 2 inter.
 * fp8_scale (W4AFP8 with a static GEMM2 input scale: a device fp32 scalar, int4 weights only) or NULL: each value is
 * then stored as mb_fc1_activation_fp8_dequantized stores it, act rounded to dtype, times prequant_scale in fp32,
 * quantized to e4m3 by fp8_scale and dequantized (the value W4A16's GEMM2 reads for W4AFP8's e4m3 input).
 * Everything else (B, kind, scales, zeros, group, k, tactic, workspace) as mb_grouped_gemm_woq_sm90, whose workspace
 * size covers this kernel too. */
mb_status mb_grouped_gemm_woq_sm90_gated(const void* A, const void* B, int kind, const void* scales,
                                         const void* zeros, int group, const void* b1, const float* prequant_scale,
                                         const float* fp8_scale, int activation, float swiglu_alpha,
                                         float swiglu_limit, void* out,
                                         const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                                         int inter, int k, int dtype, mb_gemm_tactic tactic, void* workspace,
                                         size_t workspace_bytes, cudaStream_t stream);
/* gemm/woq_sm90_finalize.cu: GEMM2 on the same kernel with the finalize in its epilogue, as
 * mb_grouped_gemm_woq_finalize's: out[t] += permuted_weights[p] * (C[p] + bias[x]) for the token t =
 * permuted_to_unpermuted[p] / top_k of each permuted row p, C mb_grouped_gemm_woq_sm90's product, rounded to dtype before
 * each add; no [rows, n] output is written and no finalize step runs. out [num_tokens, n] in dtype, 16-byte aligned,
 * zeroed by the caller; each element gets top_k 16-byte vector atomic adds (8 features of one token), so with top_k < 3
 * the adds commute and the result is deterministic. bias [E, n] or NULL. Everything else (A, B, kind, scales, zeros,
 * group, n, k, tactic, workspace) as mb_grouped_gemm_woq_sm90, whose workspace size covers this kernel too. */
mb_status mb_grouped_gemm_woq_sm90_finalize(const void* A, const void* B, int kind, const void* scales,
                                            const void* zeros, int group, const void* bias, void* out,
                                            const int64_t* expert_first_token_offset,
                                            const int32_t* permuted_to_unpermuted, const float* permuted_weights,
                                            int num_experts, int64_t max_rows, int num_tokens, int top_k, int n, int k,
                                            int dtype, mb_gemm_tactic tactic, void* workspace, size_t workspace_bytes,
                                            cudaStream_t stream);

/* gemm/woq_dequantize.cu: weight-only experts (mb_grouped_gemm_woq's forms: data [E, n, k] int8, [E, n, k/2] MXFP4
 * or int4 codes in rows or tiles (MB_WOQ_INT4_TILES), scales fp32 [E, n, k/group] (group 0: [E, n, 1]) or uint8
 * e8m0 [E, n, k/32], int4 zeros uint8 like the scales or NULL for 8) dequantized into out [E, n, k] row-major in `dtype`, each weight computed in fp32 and
 * rounded once: what a weight-only GEMM with a wgmma tactic runs before the 16-bit wgmma GEMM. k a multiple of 32,
 * out 16-byte and data 8-byte aligned. */
mb_status mb_woq_dequantize(int kind, const void* data, const void* scales, const uint8_t* zeros, int group,
                            int num_experts, int n, int k, int dtype, void* out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* MOE_BUILD_KERNELS_H */
