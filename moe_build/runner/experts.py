"""The experts (seed 000's FusedMoEExperts): permute, GEMM1 (+activation), GEMM2 (+finalize).

Each method is one step of `sequence.kernel_sequence`; which ones run is the plan's decision.
When the plan fuses finalize into GEMM2 the experts do the top-k weighting and reduction
themselves; otherwise GEMM2 writes permuted rows and prepare_finalize's weight_and_reduce
finishes (seed 000's TopKWeightAndReduce delegate).
"""
from __future__ import annotations

from types import ModuleType

import torch

from ..planner.tactics.woq import DIGITS_GROUP_BYTES
from ..spec import MoESpec
from ..weights import MoEWeights
from ..weights.dtypes import TORCH_DTYPE
from ..weights.fp8 import FP8_GROUP, ScaleGranularity, gate_up_halves_scales
from ..weights.halves import halves_fit
from ..weights.woq import GemmOperand, digits_operand, stored_operand, wgmma_operand
from .batch import Batch
from .prepare_finalize import routing_args


class FusedExperts:
    """The expert-side steps of one layer; holds device weights, nothing per call.

    W1 / b1 come in the plan's w1_order (gate/up-interleaved for the sm90 gated epilogue) and W1 / W2 in
    its weight_layout (64 x 64 blocks, which the sm90 GEMMs are told); each GEMM runs the tactic the plan
    gives at the call's token count (`Batch.gemm1_tactic` / `gemm2_tactic`), each FP8 row step the kernel its step
    tactic names (`Batch.step_tactics`).
    """

    def __init__(self, spec: MoESpec, weights: MoEWeights, kernels: ModuleType, weights_blocked: bool,
                 woq_wgmma: tuple[str, ...] = (), woq_digits: tuple[str, ...] = (), *, fp8_accumulation: str,
                 w1_interleaved: bool = False) -> None:
        self.spec = spec
        self.w = weights
        self.k = kernels
        self.act = spec.activation.value
        # W1 / b1 in the plan's interleaved order (w1_order): a weight-only layer's activation kernel then reads
        # GEMM1's output in that order where its GEMM1 stores it (the bf16 and FP8 layers interleave only where no
        # activation kernel runs)
        self.w1_interleaved = w1_interleaved
        self.layout = kernels.WeightLayout.BLOCKED64 if weights_blocked else kernels.WeightLayout.ROW_MAJOR
        # One claim region per sm90 GEMM that may overlap the other (GEMM2 launches during GEMM1's tail): the
        # gated and finalize GEMMs then launch after a trigger, by placement (kernels.new_gemm_placement). A region
        # serves one call at a time, so each CUDA stream gets its own pair (made at its first placed GEMM), as it
        # gets its own workspace: calls on two streams may run at once.
        self.device = weights.w1.device
        self._placements: dict[tuple[int, str], torch.Tensor] = {}
        # FP8 layers: the GEMMs' scaling, the activation scales (static: one per GEMM input; None: dynamic,
        # per row or per 128 columns) and the output dtype (moe_build/weights/fp8.py).
        f = weights.fp8
        block = f is not None and f.granularity is ScaleGranularity.BLOCK128
        self.fp8_scaling = kernels.Fp8Scaling.BLOCK128 if block else kernels.Fp8Scaling.ROWWISE
        self.fp8_group = FP8_GROUP if block else None
        # Block-128 W1 scales in the gate/up halves' order, for GEMM1's gated epilogue on the wgmma kernel (which reads
        # W1 stacked by 64-row halves); made once here, for a gated activation where the halves fit (I a multiple of
        # 64).
        self.w1_halves_scale = (gate_up_halves_scales(f.w1_scale, spec.intermediate_size)
                                if block and spec.activation.is_gated and halves_fit(spec.intermediate_size) else None)
        # how the FP8 wgmma GEMMs accumulate: the plan's fp8_accumulation ("none" for a layer without FP8 GEMMs)
        self.fp8_accumulation = fp8_accumulation
        self.out_dtype = TORCH_DTYPE[spec.dtype]
        # Weight-only layers: the stored weights and how the GEMMs read them (moe_build/weights/woq.py); W4AFP8's
        # static input scales are the woq weights' (None: each row's own at run time, as for FP8 layers).
        q = weights.woq
        # The order the digits tile reads its token digits in (the digit writers' `group`): the weights' group for
        # int4, the quarters order (group 32's) for MXFP4 and int8, whose mma steps take 32 k in k order.
        group = 0 if q is None or q.group_size is None else q.group_size
        self.digits_group = 32 if q is not None and q.kind.value in ("mxfp4", "int8") else group
        # The matrices ("w1" / "w2") the plan runs through the mixed-input wgmma GEMM (woq_wgmma) as it reads them:
        # their scales (and int4 zero terms), MXFP4 re-encoded as e5m2, made once here (woq.wgmma_operand).
        self.woq_wgmma = {name: wgmma_operand(q, name, self.out_dtype) for name in woq_wgmma} if q is not None else {}
        # ... and those it runs on the digits tile (woq_digits): MXFP4 in its quarters order (woq.digits_operand).
        self.woq_digits = {name: digits_operand(q, name) for name in woq_digits} if q is not None else {}
        # Both as stored, for the decode and mma kernels (no copy).
        self.woq_stored = {name: stored_operand(q, name) for name in ("w1", "w2")} if q is not None else {}
        scales = f if f is not None else q
        self.a1_scale = None if scales is None else scales.a1_scale
        self.a2_scale = None if scales is None else scales.a2_scale

    def placement(self, b: Batch, gemm: str) -> torch.Tensor:
        """The claim region of `gemm` ("gemm1" / "gemm2") for calls on b's stream (zeroed on that stream when
        first made)."""
        key = (b.stream, gemm)
        region = self._placements.get(key)
        if region is None:
            region = self._placements[key] = self.k.new_gemm_placement(self.device)
        return region

    # ---- permute ---------------------------------------------------------------------------
    def prologue_fused(self, b: Batch) -> None:
        self._maps(b, fused=True)

    def prologue_fused_routing(self, b: Batch) -> None:
        """The routing (prepare_finalize's, the same arguments and outputs) and the fused map build in one launch
        (the plan's routing=prologue)."""
        self.k.routing_prologue_fused_routing(
            b.logits, self.spec.top_k, **routing_args(self.spec, self.w, b),
            permuted_to_unpermuted=b.v("permuted_to_unpermuted"), unpermuted_to_permuted=b.v("unpermuted_to_permuted"),
            expert_first_token_offset=b.v("expert_offsets"))

    def prologue_three_step(self, b: Batch) -> None:
        self._maps(b, fused=False)

    def prologue_three_step_zero_output(self, b: Batch) -> None:
        """The three-step prologue, also zeroing `out` for gemm2_sm90_finalize's accumulation (one launch)."""
        self._maps(b, fused=False, zero_out=b.out)

    def prologue_three_step_routing(self, b: Batch) -> None:
        """The routing (prepare_finalize's, the same arguments and outputs) inside the three-step prologue's first
        launch (the plan's routing=prologue)."""
        self._routed_three_step(b, zero_out=None)

    def prologue_three_step_routing_zero_output(self, b: Batch) -> None:
        """The three-step prologue that routes, also zeroing `out` for gemm2_sm90_finalize's accumulation."""
        self._routed_three_step(b, zero_out=b.out)

    def _routed_three_step(self, b: Batch, zero_out: torch.Tensor | None) -> None:
        self.k.routing_prologue_three_step_routing(
            b.logits, self.spec.top_k, **routing_args(self.spec, self.w, b),
            permuted_to_unpermuted=b.v("permuted_to_unpermuted"), unpermuted_to_permuted=b.v("unpermuted_to_permuted"),
            expert_first_token_offset=b.v("expert_offsets"), workspace=_opt(b, "prologue_workspace"),
            zero_out=zero_out)

    def _maps(self, b: Batch, fused: bool, zero_out: torch.Tensor | None = None) -> None:
        maps = dict(permuted_to_unpermuted=b.v("permuted_to_unpermuted"),
                    unpermuted_to_permuted=b.v("unpermuted_to_permuted"),
                    expert_first_token_offset=b.v("expert_offsets"))
        if fused:
            self.k.routing_prologue_fused(b.topk_ids, self.spec.local_experts, **maps, stream=b.stream)
        else:
            self.k.routing_prologue_three_step(b.topk_ids, self.spec.local_experts, **maps,
                                         workspace=_opt(b, "prologue_workspace"), zero_out=zero_out,
                                         stream=b.stream)

    def expand_rows(self, b: Batch) -> None:
        self._expand(b, zero_out=None)

    def expand_rows_zero_output(self, b: Batch) -> None:
        """The expansion, also zeroing `out` for gemm2_sm90_finalize's accumulation (one launch)."""
        self._expand(b, zero_out=b.out)

    def expand_rows_prequant_input(self, b: Batch) -> None:
        """The expansion of the tokens' rows fc1_prequant scaled."""
        self._expand(b, zero_out=None, source=b.v("prequant_input"))

    def expand_rows_prequant_input_zero_output(self, b: Batch) -> None:
        """expand_rows_prequant_input, also zeroing `out` for the fused finalize's accumulation (one launch)."""
        self._expand(b, zero_out=b.out, source=b.v("prequant_input"))

    def expand_rows_prequant(self, b: Batch) -> None:
        """The expansion of the tokens' rows times the AWQ FC1 pre-quant scale (expand_rows=prequant_fused)."""
        self._expand(b, zero_out=None, scale=self.w.woq.fc1_act_scale)

    def expand_rows_prequant_zero_output(self, b: Batch) -> None:
        """expand_rows_prequant, also zeroing `out` for the fused finalize's accumulation (one launch)."""
        self._expand(b, zero_out=b.out, scale=self.w.woq.fc1_act_scale)

    def _expand(self, b: Batch, zero_out: torch.Tensor | None, rows: str = "permuted_input",
                source: torch.Tensor | None = None, scale: torch.Tensor | None = None) -> None:
        """The 16-bit expansion of `source` (None: the tokens' hidden rows), times `scale` per column where given,
        into the workspace view `rows` (W4AFP8's plain expansion writes "expanded_input")."""
        self.k.expand_rows(b.hidden if source is None else source, b.v("unpermuted_to_permuted"), b.topk_weights,
                           scale, permuted_input=b.v(rows), permuted_weights=b.v("permuted_weights"),
                           zero_out=zero_out, stream=b.stream)

    # ---- GEMM1 -----------------------------------------------------------------------------
    def gemm1_sm90(self, b: Batch) -> None:
        """Identity epilogue; bias and activation follow in the separate activation kernel."""
        self.k.grouped_gemm_sm90(b.v("permuted_input"), self.w.w1, b.v("expert_offsets"), c=b.v("fc1_out"),
                                 workspace=_opt(b, "gemm_workspace"), stream=b.stream, weight_layout=self.layout,
                                 tactic=b.gemm1_tactic)

    def gemm1_sm90_gated(self, b: Batch) -> None:
        """act(gate, up) (+b1) in GEMM1's epilogue, straight into fc1_act: no fc1_out round trip."""
        s = self.spec
        self.k.grouped_gemm_sm90_gated(b.v("permuted_input"), self.w.w1, b.v("expert_offsets"), self.act,
                                       bias=self.w.b1, swiglu_alpha=s.swiglu_alpha, swiglu_limit=s.swiglu_limit,
                                       c=b.v("fc1_act"), workspace=_opt(b, "gemm_workspace"), stream=b.stream,
                                       weight_layout=self.layout, placement=self.placement(b, "gemm1"),
                                       tactic=b.gemm1_tactic)

    def gemm1_sm80(self, b: Batch) -> None:
        self.k.grouped_gemm_sm80(b.v("permuted_input"), self.w.w1, b.v("expert_offsets"), c=b.v("fc1_out"),
                                 workspace=_opt(b, "gemm_workspace"), stream=b.stream, tactic=b.gemm1_tactic)

    def gemm1_sm80_act(self, b: Batch) -> None:
        self._sm80_into_act(b, fused_gated=False)

    def gemm1_sm80_fused_gated(self, b: Batch) -> None:
        self._sm80_into_act(b, fused_gated=True)

    def _sm80_into_act(self, b: Batch, fused_gated: bool) -> None:
        s = self.spec
        self.k.grouped_gemm_sm80(b.v("permuted_input"), self.w.w1, b.v("expert_offsets"), activation=self.act,
                                 fused_gated=fused_gated, bias=self.w.b1, swiglu_alpha=s.swiglu_alpha,
                                 swiglu_limit=s.swiglu_limit, c=b.v("fc1_act"),
                                 workspace=_opt(b, "gemm_workspace"), stream=b.stream, tactic=b.gemm1_tactic)

    def fc1_activation(self, b: Batch) -> None:
        self._activation(b, None)

    def _activation(self, b: Batch, prequant_scale: torch.Tensor | None) -> None:
        """fc1_out -> act(+b1) in fc1_act, times GEMM2's pre-quant scale where one is given."""
        s = self.spec
        self.k.fc1_activation(b.v("fc1_out"), b.v("expert_offsets"), self.act, bias=self.w.b1,
                              swiglu_alpha=s.swiglu_alpha, swiglu_limit=s.swiglu_limit, prequant_scale=prequant_scale,
                              out=b.v("fc1_act"), stream=b.stream, gate_up_interleaved=self.w1_interleaved)

    # ---- FP8: GEMM inputs quantized where the plan says, e4m3 GEMMs -------------------------------
    def expand_rows_fp8(self, b: Batch) -> None:
        """The expansion, each token's row quantized once and written to its top_k permuted rows."""
        self._expand_fp8(b, zero_out=None)

    def expand_rows_fp8_zero_output(self, b: Batch) -> None:
        """The FP8 expansion, also zeroing `out` for gemm2_fp8_finalize's accumulation (one launch)."""
        self._expand_fp8(b, zero_out=b.out)

    def _expand_fp8(self, b: Batch, zero_out: torch.Tensor | None) -> None:
        self.k.expand_rows_fp8(b.hidden, b.v("unpermuted_to_permuted"), b.topk_weights, static_scale=self.a1_scale,
                               group=self.fp8_group, permuted_input=b.v("permuted_input"),
                               permuted_scales=b.v("permuted_input_scales"), permuted_weights=b.v("permuted_weights"),
                               zero_out=zero_out, stream=b.stream, tactic=b.step_tactics["expand_rows_tactic"])

    def quantize_input(self, b: Batch) -> None:
        self.k.quantize_fp8(b.hidden, static_scale=self.a1_scale, group=self.fp8_group, out=b.v("input_fp8"),
                            out_scales=b.v("input_scales"), stream=b.stream)

    def expand_rows_fp8_prequantized(self, b: Batch) -> None:
        self._expand_fp8_prequantized(b, zero_out=None)

    def expand_rows_fp8_prequantized_zero_output(self, b: Batch) -> None:
        """The expansion of the quantized tokens, also zeroing `out` for gemm2_fp8_finalize (one launch)."""
        self._expand_fp8_prequantized(b, zero_out=b.out)

    def _expand_fp8_prequantized(self, b: Batch, zero_out: torch.Tensor | None) -> None:
        self.k.expand_rows_fp8_prequantized(b.v("input_fp8"), b.v("input_scales"), b.v("unpermuted_to_permuted"),
                                            b.topk_weights, permuted_input=b.v("permuted_input"),
                                            permuted_scales=b.v("permuted_input_scales"),
                                            permuted_weights=b.v("permuted_weights"), zero_out=zero_out,
                                            stream=b.stream)

    def gemm1_fp8(self, b: Batch) -> None:
        self.k.grouped_gemm_fp8(b.v("permuted_input"), b.v("permuted_input_scales"), self.w.w1, self.w.fp8.w1_scale,
                                b.v("expert_offsets"), self.fp8_scaling, out_dtype=self.out_dtype, c=b.v("fc1_out"),
                                workspace=_opt(b, "gemm_workspace"), stream=b.stream,
                                accumulation=self.fp8_accumulation, tactic=b.gemm1_tactic)

    def gemm1_fp8_gated(self, b: Batch) -> None:
        """act(gate, up) (+b1) of the scaled products in GEMM1's epilogue, straight into fc1_act (W1, its column
        scales and b1 gate/up-interleaved; with block-128 scales stacked, as loaded, the wgmma kernel reading those
        scales in the gate/up halves' order): no fc1_out round trip; quantize_fc2_input or GEMM2 quantizing its own
        input follows."""
        s = self.spec
        w1_scale = self.w.fp8.w1_scale
        if self.w1_halves_scale is not None and b.gemm1_tactic.kernel == self.k.GemmKernel.WGMMA:
            w1_scale = self.w1_halves_scale
        self.k.grouped_gemm_fp8_gated(b.v("permuted_input"), b.v("permuted_input_scales"), self.w.w1,
                                      w1_scale, b.v("expert_offsets"), self.fp8_scaling, self.act,
                                      out_dtype=self.out_dtype, bias=self.w.b1, swiglu_alpha=s.swiglu_alpha,
                                      swiglu_limit=s.swiglu_limit, c=b.v("fc1_act"),
                                      workspace=_opt(b, "gemm_workspace"), stream=b.stream,
                                      accumulation=self.fp8_accumulation, tactic=b.gemm1_tactic)

    def gemm1_fp8_gated_quantized(self, b: Batch) -> None:
        """gemm1_fp8_gated writing GEMM2's FP8 input and its row scales itself, by the static GEMM2 input scale
        (fc2_input_quant=gemm1): the bytes quantize_fc2_input would write, without fc1_act or that step."""
        s = self.spec
        self.k.grouped_gemm_fp8_gated_quantized(b.v("permuted_input"), b.v("permuted_input_scales"), self.w.w1,
                                                self.w.fp8.w1_scale, b.v("expert_offsets"), self.act, self.a2_scale,
                                                out_dtype=self.out_dtype, bias=self.w.b1, swiglu_alpha=s.swiglu_alpha,
                                                swiglu_limit=s.swiglu_limit, out=b.v("fc2_input"),
                                                out_scales=b.v("fc2_input_scales"),
                                                workspace=_opt(b, "gemm_workspace"), stream=b.stream,
                                                accumulation=self.fp8_accumulation, tactic=b.gemm1_tactic)

    def fc1_activation_fp8(self, b: Batch) -> None:
        """The activation (+b1) with GEMM2's FP8 input written in the same pass."""
        s = self.spec
        self.k.fc1_activation_fp8(b.v("fc1_out"), b.v("expert_offsets"), self.act, bias=self.w.b1,
                                  swiglu_alpha=s.swiglu_alpha, swiglu_limit=s.swiglu_limit,
                                  static_scale=self.a2_scale, group=self.fp8_group, out=b.v("fc2_input"),
                                  out_scales=b.v("fc2_input_scales"), stream=b.stream,
                                  tactic=b.step_tactics["fc1_activation_tactic"])

    def quantize_fc2_input(self, b: Batch) -> None:
        """GEMM2's FP8 input from the 16-bit activation (the activation kernel's or GEMM1's gated epilogue's): the
        activation kernel with the identity activation and no bias, which writes the very bytes mb_quantize_fp8
        writes (cpp/src/stages/fc1_activation.cu) but through its faster forms: a warp per row where there is a row
        for every warp the GPU holds and a row is at most 4096 columns, else rows copied into a shared-memory ring
        ahead of the row being quantized, where mb_quantize_fp8 holds a row per block in registers and leaves an SM
        with few loads in flight (docs/performance.md, "The gated epilogue on the FP8 GEMM1", "The FP8 quantize
        step a warp per row")."""
        self.k.fc1_activation_fp8(b.v("fc1_act"), b.v("expert_offsets"), "identity", static_scale=self.a2_scale,
                                  group=self.fp8_group, out=b.v("fc2_input"), out_scales=b.v("fc2_input_scales"),
                                  stream=b.stream, tactic=b.step_tactics["fc2_input_quant_tactic"])

    def gemm2_fp8(self, b: Batch) -> None:
        self.k.grouped_gemm_fp8(b.v("fc2_input"), b.v("fc2_input_scales"), self.w.w2, self.w.fp8.w2_scale,
                                b.v("expert_offsets"), self.fp8_scaling, out_dtype=self.out_dtype,
                                c=b.v("gemm2_out"), workspace=_opt(b, "gemm_workspace"), stream=b.stream,
                                accumulation=self.fp8_accumulation, tactic=b.gemm2_tactic)

    def gemm2_fp8_finalize(self, b: Batch) -> None:
        """GEMM2 with the unpermute, top-k weighting (+b2) and reduction in its epilogue, into `out` (zeroed by the
        three-step prologue or the FP8 expansion, which the sequence runs before it)."""
        self.k.grouped_gemm_fp8_finalize(b.v("fc2_input"), b.v("fc2_input_scales"), self.w.w2, self.w.fp8.w2_scale,
                                         b.v("expert_offsets"), b.v("permuted_to_unpermuted"),
                                         b.v("permuted_weights"), b.out.shape[0], self.spec.top_k, self.fp8_scaling,
                                         out_dtype=self.out_dtype, bias=self.w.b2, out=b.out,
                                         workspace=_opt(b, "gemm_workspace"), stream=b.stream,
                                         accumulation=self.fp8_accumulation, tactic=b.gemm2_tactic)

    def gemm2_fp8_quantizing_finalize(self, b: Batch) -> None:
        """gemm2_fp8_finalize on the 16-bit rows GEMM1's gated epilogue wrote, which GEMM2 quantizes as it loads them
        (by the static scale where the checkpoint has one, else per row, or per 128-column group with block-128
        scales): the bytes the quantize step would write, without that kernel between the GEMMs
        (fc2_input_quant=gemm2)."""
        self.k.grouped_gemm_fp8_quantizing_finalize(b.v("fc1_act"), self.a2_scale, self.w.w2, self.w.fp8.w2_scale,
                                                    b.v("expert_offsets"), b.v("permuted_to_unpermuted"),
                                                    b.v("permuted_weights"), b.out.shape[0], self.spec.top_k,
                                                    bias=self.w.b2, out=b.out, stream=b.stream,
                                                    accumulation=self.fp8_accumulation, scaling=self.fp8_scaling,
                                                    tactic=b.gemm2_tactic)

    # ---- weight-only: 16-bit activations, weights dequantized in the GEMMs -------------------------
    def fc1_prequant(self, b: Batch) -> None:
        """The tokens' rows times the AWQ FC1 pre-quant scale into prequant_input, which the expansion then copies:
        one scale for every expert (woq.fc1_act_scale [H]), so scaling a token's row once gives the very products
        scaling each of its top_k copies would. The plan runs it only where the checkpoint stores the scales
        (use_awq)."""
        self.k.scale_columns(b.hidden, self.w.woq.fc1_act_scale, out=b.v("prequant_input"), stream=b.stream)

    def gemm1_woq(self, b: Batch) -> None:
        self._woq_gemm(b, "w1", b.v("permuted_input"), b.v("fc1_out"), b.gemm1_tactic)

    def fc1_activation_prequant(self, b: Batch) -> None:
        """The activation (+b1) with the AWQ FC2 pre-quant scale applied to its output in the same pass."""
        self._activation(b, self.w.woq.fc2_act_scale)

    def fc2_prequant(self, b: Batch) -> None:
        """GEMM2's input rows times the AWQ FC2 pre-quant scale, in place (the unfused alternative)."""
        self.k.scale_columns(b.v("fc1_act"), self.w.woq.fc2_act_scale, stream=b.stream)

    def gemm2_woq(self, b: Batch) -> None:
        self._woq_gemm(b, "w2", b.v("fc1_act"), b.v("gemm2_out"), b.gemm2_tactic)

    def gemm1_woq_dense(self, b: Batch) -> None:
        self._woq_dense_gemm(b, "w1", b.v("permuted_input"), b.v("fc1_out"), b.gemm1_tactic)

    def gemm2_woq_dense(self, b: Batch) -> None:
        self._woq_dense_gemm(b, "w2", b.v("fc1_act"), b.v("gemm2_out"), b.gemm2_tactic)

    def _woq_dense_gemm(self, b: Batch, name: str, a: torch.Tensor, c: torch.Tensor, tactic: object) -> None:
        """W1 or W2 dequantized into the workspace, then the 16-bit wgmma GEMM on them (row-major, plain store)."""
        q, w = self.w.woq, self.woq_stored[name]
        n, k = w.data.shape[1], q.in_features(name)
        dense = b.v("woq_dense").view(-1)[: q.experts * n * k].view(q.experts, n, k)
        self.k.woq_dequantize(w.data, w.kernel_kind, w.scales, w.group, zeros=w.zeros, out=dense, stream=b.stream)
        self.k.grouped_gemm_sm90(a, dense, b.v("expert_offsets"), c=c, workspace=_opt(b, "gemm_workspace"),
                                 stream=b.stream, weight_layout=self.k.WeightLayout.ROW_MAJOR, tactic=tactic)

    def gemm1_woq_wgmma(self, b: Batch) -> None:
        self._woq_wgmma_gemm(b, "w1", b.v("permuted_input"), b.v("fc1_out"), b.gemm1_tactic)

    def gemm1_woq_wgmma_gated(self, b: Batch) -> None:
        """GEMM1 on the mixed-input wgmma kernel with the gated activation (+b1) in its epilogue, into fc1_act (W1
        interleaved): no fc1_out round trip, no activation step."""
        self._woq_wgmma_gated(b, None)

    def gemm1_woq_wgmma_gated_prequant(self, b: Batch) -> None:
        """gemm1_woq_wgmma_gated with GEMM2's AWQ pre-quant scale applied in the same epilogue (fc2_prequant=fused)."""
        self._woq_wgmma_gated(b, self.w.woq.fc2_act_scale)

    def gemm1_woq_wgmma_gated_fp8_dequantized(self, b: Batch) -> None:
        """W4AFP8 (static input scales): gemm1_woq_wgmma_gated storing GEMM2's input as fc1_activation_fp8_dequantized
        would, each activated value quantized to e4m3 by the static GEMM2 input scale and dequantized."""
        self._woq_wgmma_gated(b, None, self.a2_scale)

    def gemm1_woq_wgmma_gated_prequant_fp8_dequantized(self, b: Batch) -> None:
        """gemm1_woq_wgmma_gated_fp8_dequantized with the AWQ FC2 pre-quant scale before the quantization
        (fc2_prequant=fused)."""
        self._woq_wgmma_gated(b, self.w.woq.fc2_act_scale, self.a2_scale)

    def _woq_wgmma_gated(self, b: Batch, prequant_scale: torch.Tensor | None,
                         fp8_scale: torch.Tensor | None = None) -> None:
        s, w1 = self.spec, self.woq_wgmma["w1"]
        self.k.grouped_gemm_woq_sm90_gated(b.v("permuted_input"), w1.data, w1.kernel_kind, w1.scales, w1.zeros,
                                           b.v("expert_offsets"), w1.group, self.act, bias=self.w.b1,
                                           prequant_scale=prequant_scale, swiglu_alpha=s.swiglu_alpha,
                                           swiglu_limit=s.swiglu_limit, out=b.v("fc1_act"),
                                           workspace=_opt(b, "gemm_workspace"), stream=b.stream,
                                           tactic=b.gemm1_tactic, fp8_scale=fp8_scale)

    def gemm2_woq_wgmma(self, b: Batch) -> None:
        self._woq_wgmma_gemm(b, "w2", b.v("fc1_act"), b.v("gemm2_out"), b.gemm2_tactic)

    def gemm2_woq_wgmma_finalize(self, b: Batch) -> None:
        """GEMM2 on the mixed-input wgmma kernel with the unpermute, top-k weighting (+b2) and reduction in its
        epilogue, into `out` (zeroed by the three-step prologue or the expansion, which the sequence runs before it):
        no gemm2_out round trip, no finalize step."""
        w2 = self.woq_wgmma["w2"]
        self.k.grouped_gemm_woq_sm90_finalize(b.v("fc1_act"), w2.data, w2.kernel_kind, w2.scales, w2.zeros,
                                              b.v("expert_offsets"), w2.group, b.v("permuted_to_unpermuted"),
                                              b.v("permuted_weights"), b.out.shape[0], self.spec.top_k,
                                              bias=self.w.b2, out=b.out,
                                              workspace=_opt(b, "gemm_workspace"), stream=b.stream,
                                              tactic=b.gemm2_tactic)

    def _woq_wgmma_gemm(self, b: Batch, name: str, a: torch.Tensor, c: torch.Tensor, tactic: object) -> None:
        """W1 or W2 as stored through the mixed-input wgmma GEMM (plain store, as _woq_gemm)."""
        w = self.woq_wgmma[name]
        self.k.grouped_gemm_woq_sm90(a, w.data, w.kernel_kind, w.scales, w.zeros, b.v("expert_offsets"), w.group,
                                     c=c, workspace=_opt(b, "gemm_workspace"), tactic=tactic, stream=b.stream)

    def gemm1_woq_digits(self, b: Batch) -> None:
        self._woq_operand_gemm(b, self.woq_digits["w1"], self._digits(b, self.spec.hidden_size), b.v("fc1_out"),
                               b.gemm1_tactic)

    def gemm2_woq_digits(self, b: Batch) -> None:
        self._woq_operand_gemm(b, self.woq_digits["w2"], self._digits(b, self.spec.intermediate_size),
                               b.v("gemm2_out"), b.gemm2_tactic)

    def gemm2_woq_digits_finalize(self, b: Batch) -> None:
        """gemm2_woq_finalize on the token digits of GEMM2's input rows (the decode kernel's digits tile)."""
        self._woq_finalize(b, self._digits(b, self.spec.intermediate_size), self.woq_digits["w2"])

    def _digits(self, b: Batch, k: int) -> torch.Tensor:
        """The workspace's token digits of one GEMM's input rows [T * K, k] (uint8 [T * K, ceil(k / 128), 400]), which
        the GEMM's digits tactic reads: GEMM1's and then GEMM2's, one at a time."""
        rows, width = b.v("permuted_weights").shape[0], -(-k // 128)
        return b.v("token_digits").view(-1)[: rows * width * DIGITS_GROUP_BYTES].view(rows, width, -1)

    def token_digits_gemm1(self, b: Batch) -> None:
        """The expanded rows' token digits (token_digits=separate)."""
        self.k.token_digits(b.v("permuted_input"), out=self._digits(b, self.spec.hidden_size), group=self.digits_group,
                            stream=b.stream)

    def token_digits_gemm2(self, b: Batch) -> None:
        """GEMM2's input rows' token digits (token_digits=separate)."""
        self.k.token_digits(b.v("fc1_act"), out=self._digits(b, self.spec.intermediate_size), group=self.digits_group,
                            stream=b.stream)

    def expand_rows_digits(self, b: Batch) -> None:
        """The expansion writing GEMM1's token digits (token_digits=fused)."""
        self._expand_digits(b, zero_out=None)

    def expand_rows_digits_zero_output(self, b: Batch) -> None:
        self._expand_digits(b, zero_out=b.out)

    def expand_rows_prequant_digits(self, b: Batch) -> None:
        """expand_rows_prequant writing GEMM1's token digits."""
        self._expand_digits(b, zero_out=None, scale=self.w.woq.fc1_act_scale)

    def expand_rows_prequant_digits_zero_output(self, b: Batch) -> None:
        self._expand_digits(b, zero_out=b.out, scale=self.w.woq.fc1_act_scale)

    def expand_rows_prequant_input_digits(self, b: Batch) -> None:
        """expand_rows_prequant_input writing GEMM1's token digits."""
        self._expand_digits(b, zero_out=None, source=b.v("prequant_input"))

    def expand_rows_prequant_input_digits_zero_output(self, b: Batch) -> None:
        self._expand_digits(b, zero_out=b.out, source=b.v("prequant_input"))

    def _expand_digits(self, b: Batch, zero_out: torch.Tensor | None, source: torch.Tensor | None = None,
                       scale: torch.Tensor | None = None, fp8: bool = False) -> None:
        """_expand's rows as GEMM1's token digits (mb_expand_rows_digits), never stored in 16 bits; with `fp8`
        (W4AFP8) the digits of the rows quantized by GEMM1's static input scale, or each row's own where it has none,
        and dequantized."""
        self.k.expand_rows_digits(b.hidden if source is None else source, b.v("unpermuted_to_permuted"),
                                  b.topk_weights, scale, permuted_digits=self._digits(b, self.spec.hidden_size),
                                  permuted_weights=b.v("permuted_weights"), zero_out=zero_out, group=self.digits_group,
                                  stream=b.stream, fp8_static_scale=self.a1_scale if fp8 else None,
                                  fp8_row_scale=fp8 and self.a1_scale is None)

    def fc1_activation_digits(self, b: Batch) -> None:
        """The activation writing GEMM2's token digits (token_digits=fused)."""
        self._activation_digits(b, None)

    def fc1_activation_prequant_digits(self, b: Batch) -> None:
        """fc1_activation_prequant writing GEMM2's token digits."""
        self._activation_digits(b, self.w.woq.fc2_act_scale)

    def _activation_digits(self, b: Batch, prequant_scale: torch.Tensor | None, fp8: bool = False) -> None:
        """The activation writing GEMM2's token digits; with `fp8` (W4AFP8) the digits of its values quantized by
        GEMM2's static input scale, or each row's own where it has none, and dequantized."""
        s = self.spec
        self.k.fc1_activation_digits(b.v("fc1_out"), b.v("expert_offsets"), self.act, bias=self.w.b1,
                                     swiglu_alpha=s.swiglu_alpha, swiglu_limit=s.swiglu_limit,
                                     prequant_scale=prequant_scale, out=self._digits(b, s.intermediate_size),
                                     group=self.digits_group, stream=b.stream,
                                     fp8_static_scale=self.a2_scale if fp8 else None,
                                     fp8_row_scale=fp8 and self.a2_scale is None,
                                     gate_up_interleaved=self.w1_interleaved)

    def gemm2_woq_finalize(self, b: Batch) -> None:
        """GEMM2 on the decode kernel with the unpermute, top-k weighting (+b2) and reduction in its epilogue, into
        `out` (zeroed by the three-step prologue or the expansion, which the sequence runs before it)."""
        self._woq_finalize(b, b.v("fc1_act"), self.woq_stored["w2"])

    def _woq_finalize(self, b: Batch, a: torch.Tensor, w2: GemmOperand) -> None:
        self.k.grouped_gemm_woq_finalize(a, w2.data, w2.kernel_kind, w2.scales, b.v("expert_offsets"), w2.group,
                                         b.v("permuted_to_unpermuted"), b.v("permuted_weights"), b.out.shape[0],
                                         self.spec.top_k, zeros=w2.zeros, bias=self.w.b2, out=b.out, stream=b.stream,
                                         tactic=b.gemm2_tactic, out_dtype=self.out_dtype)

    def _woq_gemm(self, b: Batch, name: str, a: torch.Tensor, c: torch.Tensor, tactic: object) -> None:
        """W1 or W2 ("w1" / "w2") as stored, plain store: b1 is added by the activation, b2 by the finalize."""
        self._woq_operand_gemm(b, self.woq_stored[name], a, c, tactic)

    def _woq_operand_gemm(self, b: Batch, w: GemmOperand, a: torch.Tensor, c: torch.Tensor, tactic: object) -> None:
        """One weight-only GEMM on the decode or mma kernel, plain store."""
        self.k.grouped_gemm_woq(a, w.data, w.kernel_kind, w.scales, b.v("expert_offsets"), w.group, zeros=w.zeros,
                                c=c, tactic=tactic, stream=b.stream, out_dtype=c.dtype)

    # ---- W4AFP8: W4A16's steps on the FP8 quantizations dequantized to 16 bits ---------------------------------
    def expand_rows_16bit(self, b: Batch) -> None:
        """The plain expansion into 16-bit rows, which fc1_prequant_fp8_dequantized scales and quantizes next."""
        self._expand(b, zero_out=None, rows="expanded_input")

    def expand_rows_16bit_zero_output(self, b: Batch) -> None:
        """expand_rows_16bit, also zeroing `out` for the fused finalize's accumulation (one launch)."""
        self._expand(b, zero_out=b.out, rows="expanded_input")

    def expand_rows_fp8_dequantized(self, b: Batch) -> None:
        """The tokens' rows times the FC1 pre-quant scale, quantized to FP8 (the static scale, or each row's dynamic
        one) as they are expanded, stored dequantized in permuted_input (expand_rows=prequant_fused)."""
        self._expand_fp8_dequantized(b, zero_out=None)

    def expand_rows_fp8_dequantized_zero_output(self, b: Batch) -> None:
        """expand_rows_fp8_dequantized, also zeroing `out` for the fused finalize's accumulation (one launch)."""
        self._expand_fp8_dequantized(b, zero_out=b.out)

    def _expand_fp8_dequantized(self, b: Batch, zero_out: torch.Tensor | None) -> None:
        self.k.expand_rows_fp8_dequantized(b.hidden, b.v("unpermuted_to_permuted"), b.topk_weights, self.a1_scale,
                                           permuted_input=b.v("permuted_input"),
                                           permuted_weights=b.v("permuted_weights"), zero_out=zero_out,
                                           stream=b.stream, prequant_scale=self.w.woq.fc1_act_scale,
                                           tactic=b.step_tactics["expand_rows_tactic"])

    def expand_rows_fp8_dequantized_digits(self, b: Batch) -> None:
        """expand_rows_fp8_dequantized's rows as GEMM1's token digits (token_digits=fused)."""
        self._expand_digits(b, zero_out=None, scale=self.w.woq.fc1_act_scale, fp8=True)

    def expand_rows_fp8_dequantized_digits_zero_output(self, b: Batch) -> None:
        self._expand_digits(b, zero_out=b.out, scale=self.w.woq.fc1_act_scale, fp8=True)

    def fc1_prequant_fp8_dequantized(self, b: Batch) -> None:
        """The plain expansion's rows quantized (times the FC1 pre-quant scale), stored dequantized in permuted_input
        (expand_rows=plain)."""
        self._quantize_rows(b, b.v("expanded_input"), self.w.woq.fc1_act_scale, self.a1_scale, b.v("permuted_input"),
                            "fc1_input_quant_tactic")

    def fc1_prequant_fp8_dequantized_digits(self, b: Batch) -> None:
        """fc1_prequant_fp8_dequantized's rows as GEMM1's token digits (token_digits=fused)."""
        self._quantize_rows_digits(b, b.v("expanded_input"), self.w.woq.fc1_act_scale, self.a1_scale,
                                   self.spec.hidden_size)

    def fc1_activation_fp8_dequantized(self, b: Batch) -> None:
        """The activation (+b1) quantized (times the FC2 pre-quant scale where the layer has one), stored dequantized
        in fc1_act."""
        s = self.spec
        self.k.fc1_activation_fp8_dequantized(b.v("fc1_out"), b.v("expert_offsets"), self.act, self.a2_scale,
                                              bias=self.w.b1, swiglu_alpha=s.swiglu_alpha,
                                              swiglu_limit=s.swiglu_limit, out=b.v("fc1_act"), stream=b.stream,
                                              prequant_scale=self.w.woq.fc2_act_scale,
                                              gate_up_interleaved=self.w1_interleaved,
                                              tactic=b.step_tactics["fc1_activation_tactic"])

    def fc1_activation_fp8_dequantized_digits(self, b: Batch) -> None:
        """fc1_activation_fp8_dequantized's rows as GEMM2's token digits (token_digits=fused)."""
        self._activation_digits(b, self.w.woq.fc2_act_scale, fp8=True)

    def fc2_prequant_fp8_dequantized(self, b: Batch) -> None:
        """The activated rows quantized (times the FC2 pre-quant scale), in place in fc1_act (fc2_prequant=separate):
        each element is read only by the thread that writes it."""
        self._quantize_rows(b, b.v("fc1_act"), self.w.woq.fc2_act_scale, self.a2_scale, b.v("fc1_act"),
                            "fc2_input_quant_tactic")

    def _quantize_rows(self, b: Batch, rows: torch.Tensor, prequant: torch.Tensor | None,
                       scale: torch.Tensor | None, out: torch.Tensor, stage: str) -> None:
        """16-bit rows times `prequant`, quantized by the static `scale` (None: each row's dynamic one) and stored
        dequantized into `out`: the activation kernel's identity without a bias over the experts' rows, on the kernel
        the plan's step tactic `stage` names."""
        self.k.fc1_activation_fp8_dequantized(rows, b.v("expert_offsets"), "identity", scale, out=out,
                                              stream=b.stream, prequant_scale=prequant, tactic=b.step_tactics[stage])

    def _quantize_rows_digits(self, b: Batch, rows: torch.Tensor, prequant: torch.Tensor | None,
                              scale: torch.Tensor | None, k: int) -> None:
        """_quantize_rows' values, by the static `scale` (None: each row's own), as the next GEMM's token digits (its
        input width k)."""
        self.k.fc1_activation_digits(rows, b.v("expert_offsets"), "identity", prequant_scale=prequant,
                                     out=self._digits(b, k), group=self.digits_group, stream=b.stream,
                                     fp8_static_scale=scale, fp8_row_scale=scale is None)

    # ---- GEMM2 -----------------------------------------------------------------------------
    def gemm2_sm90_finalize(self, b: Batch) -> None:
        """Unpermute, top-k weighting (+b2) and reduction inside GEMM2's epilogue, into `out`
        (zeroed by expand_rows_zero_output, which the sequence runs before it)."""
        self.k.grouped_gemm_sm90_finalize(b.v("fc1_act"), self.w.w2, b.v("expert_offsets"),
                                          b.v("permuted_to_unpermuted"), b.v("permuted_weights"), b.out.shape[0],
                                          self.spec.top_k, bias=self.w.b2, out=b.out,
                                          workspace=_opt(b, "gemm_workspace"), stream=b.stream,
                                          weight_layout=self.layout, placement=self.placement(b, "gemm2"),
                                          tactic=b.gemm2_tactic)

    def gemm2_sm90(self, b: Batch) -> None:
        self.k.grouped_gemm_sm90(b.v("fc1_act"), self.w.w2, b.v("expert_offsets"), c=b.v("gemm2_out"),
                                 workspace=_opt(b, "gemm_workspace"), stream=b.stream, weight_layout=self.layout,
                                 tactic=b.gemm2_tactic)

    def gemm2_sm80(self, b: Batch) -> None:
        self.k.grouped_gemm_sm80(b.v("fc1_act"), self.w.w2, b.v("expert_offsets"), c=b.v("gemm2_out"),
                                 workspace=_opt(b, "gemm_workspace"), stream=b.stream, tactic=b.gemm2_tactic)


def _opt(b: Batch, name: str) -> torch.Tensor | None:
    """A workspace buffer the layout may leave out (zero-byte scratch)."""
    return b.v(name) if name in b.views else None
