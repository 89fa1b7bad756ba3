"""The planner: one pure function (spec, target, tokens[, forced choices]) -> Plan.

It evaluates the rules in `rules.py` and turns them into a path and per-stage decisions.
Nothing else in moe-build decides a fusion: graph builders, the runner and the plugin read
the returned `Plan`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable, Mapping, Sequence

from ..errors import MoeBuildError, UnsupportedCombination
from ..spec import ActScale, MoESpec, Quant
from ..target import Target
from . import rules as R
from . import tactics as T
from .tactics.decode_kernel import ctas_at_most, decode_column_blocks
from .tactics.woq import on_digits_tile, on_mixed_input_tile
from .gates import OURS, Band, Gate, Plan, StageDecision, bands_text

# The plugin path's stages: the seed's fusion matrix, then the weight layouts and the two GEMMs' tactics
# that follow from it (moe-build's own: what the kernels are told, never decided by them).
FUSION_STAGES = ("routing_prologue", "expand_rows", "gemm_kernel", "fc1_activation", "fc2_prequant", "finalize")
ROUTING_STAGES = ("routing",)  # where the top-k is chosen: its own kernel, or inside the fused prologue's block
ACT_QUANT_STAGES = ("fc1_input_quant", "fc2_input_quant")
DIGITS_STAGES = ("token_digits",)  # where the weight-only digits tile's 8-bit token digits are made
ACCUMULATION_STAGES = ("fp8_accumulation",)  # how the FP8 GEMMs add up their products
LAYOUT_STAGES = ("w1_order", "weight_layout")
TACTIC_STAGES = ("gemm1_tactic", "gemm2_tactic")
# which kernel runs each FP8 row step (tactics/steps.py; "none" where the layer has no such step)
STEP_STAGES = ("expand_rows_tactic", "fc1_input_quant_tactic", "fc1_activation_tactic", "fc2_input_quant_tactic")
EP_STAGES = ("dispatch",)  # how tokens reach the ranks holding their experts, and come back
# how the dispatched rows reach a rank's experts (seed 000's formats) and their outputs come back
EP_FORMAT_STAGES = ("ep_format", "nccl_exchange")
PLUGIN_STAGES = (FUSION_STAGES + ROUTING_STAGES + ACT_QUANT_STAGES + ACCUMULATION_STAGES + LAYOUT_STAGES
                 + TACTIC_STAGES + STEP_STAGES + DIGITS_STAGES + EP_STAGES + EP_FORMAT_STAGES)
OOTB_STAGES = ("expert_compute",) + EP_STAGES
MATRIX_STAGES = FUSION_STAGES + ("expert_compute",)  # the seed's fusion matrix: both paths' fusion stages
STAGE_CHOICES: dict[str, tuple[str, ...]] = {
    "routing_prologue": ("fused", "three_step"),
    "routing": ("prologue", "separate"),
    "expand_rows": ("prequant_fused", "plain"),
    "gemm_kernel": ("tma_warp_specialized", "ampere"),
    "fc1_activation": ("epilogue", "fused_gated", "gated_epilogue", "separate"),
    "fc2_prequant": ("fused", "separate", "none"),
    "finalize": ("fused", "separate"),
    "fc1_input_quant": ("expand_rows", "separate", "none"),
    "fc2_input_quant": ("fc1_activation", "gemm1", "gemm2", "separate", "none"),
    "fp8_accumulation": ("fast", "promoted", "none"),
    "token_digits": ("fused", "separate", "none"),
    "w1_order": ("gate_up_interleaved", "stacked"),
    "weight_layout": ("blocked64", "int4_tiles", "row_major"),
    "expert_compute": ("per_expert_gather", "dense_masked"),
    "dispatch": ("nvlink", "nccl", "allreduce", "none"),
    "ep_format": ("permuted", "batched", "contiguous", "none"),
    "nccl_exchange": ("all_gather", "exact", "none"),
    **{stage: (*T.STEP_TACTICS, "none") for stage in STEP_STAGES},
}  # the tactic stages take any tactic name (tactics.GemmTactic.parse) the GEMM can run
# Which user-facing field a refusing gate is about (for the one-line error).
GATE_FIELD = {
    "ootb_weight_only_quant": "quant", "ootb_sm": "sm", "ootb_quant_implemented": "quant", "ootb_lora": "lora",
    "flavour_sm": "sm", "plugin_output_dtype": "output_dtype", "plugin_fp8_sm": "sm", "plugin_fp4_sm": "sm",
    "ootb_fp8_sm": "sm",
    "plugin_output_fp8_fp4": "output_dtype", "fp8_gemms": "quant", "fp8_rowwise_scales": "quant",
    "fc2_static_scale": "act_scale",
}


# What a user can do about a refusing gate, where there is something (appended to the one-line error).
GATE_HINT = {
    "ootb_weight_only_quant": "--quant none builds it with the experts dequantized exactly to the model dtype",
    "ootb_fp8_sm": "--quant none builds it with the experts dequantized exactly to the model dtype, or --sm 89+",
    "ootb_quant_implemented": "--quant none builds it with the experts dequantized exactly to the model dtype",
    "gemm2_quantizing_call": "force a decode GEMM2 at every count too, e.g. "
                             "gemm2_tactic=decode:ksplit1:after_trigger:plain",
}


def _failing(gates: Sequence[Gate]) -> str:
    """The gates that do not hold, as the one-line errors name them."""
    return "; ".join(f"{g.name}={g.value} fails '{g.condition}'" for g in gates if not g.held)


def _refuse(gates: Sequence[Gate], why: str) -> None:
    for g in gates:
        if not g.held:
            hint = f"; {GATE_HINT[g.name]}" if g.name in GATE_HINT else ""
            raise UnsupportedCombination(GATE_FIELD.get(g.name, g.name),
                                         f"{why}: {g.name}={g.value} fails '{g.condition}'{hint}", g.name, g.source)


def _simple(stage: str, fused: str, fallback: str, gates: Sequence[Gate], forced: str | None,
            summary: Callable[[bool], str], force_needs: Sequence[Gate] | None = None) -> StageDecision:
    """A stage whose fused choice needs every gate to hold and which does not depend on tokens.

    Forcing the fused choice needs the gates in `force_needs` (default: all); cost rules, which
    say when a choice pays rather than whether it can run, are left out so A/B runs can pin it.
    """
    ok = all(g.held for g in gates)
    choice = fused if ok else fallback
    if forced is not None:
        needs = gates if force_needs is None else force_needs
        if forced == fused and not all(g.held for g in needs):
            _refuse(needs, f"cannot force {stage}={fused}")
        choice = forced
    return StageDecision(stage, choice, fallback, tuple(gates), forced=forced is not None,
                         summary=summary(choice == fused))


def _token_ranged(stage: str, fused: str, fallback: str, gates: Sequence[Gate], t_max: int | None, tokens: int,
                  forced: str | None, fused_text: str, fallback_text: str) -> StageDecision:
    """A stage whose fused choice holds for tokens 1..t_max (t_max None: no upper bound; 0: no count),
    and the fallback above.

    The plan is made at one token count, but the runner and plugin see others: the decision
    carries bands over every count, so `choice_for(tokens)` needs no re-planning.
    """
    fused_here = t_max != 0 and (t_max is None or tokens <= t_max)
    if forced == fused and not fused_here:
        _refuse(gates, f"cannot force {stage}={fused}")
    if forced == fallback or t_max == 0:
        return StageDecision(stage, fallback, fallback, tuple(gates), forced=forced is not None, summary=fallback_text)
    if t_max is None:
        bands: tuple[Band, ...] = (Band(1, None, fused),)
        bound = "every token count"
    else:
        bands = (Band(1, t_max, fused), Band(t_max + 1, None, fallback))
        bound = f"tokens 1..{t_max}, {fallback} above"
    choice = fused if fused_here else fallback
    text = fused_text if fused_here else fallback_text
    return StageDecision(stage, choice, fallback, tuple(gates), bands, forced is not None, f"{text} ({bound})")


def _routing_prologue(spec: MoESpec, target: Target, tokens: int, forced: str | None) -> StageDecision:
    static = [R.prologue_not_wfp4a16(spec), R.prologue_topk(spec), R.prologue_expert_log(spec)]
    per_tokens = lambda t: [R.prologue_tokens(t), R.prologue_single_block(t), R.prologue_smem(spec, target, t)]
    # Largest token count for which the token-dependent gates hold (smem grows with tokens).
    t_max = 0
    if all(g.held for g in static):
        t_max = next((t for t in range(R.FUSED_PROLOGUE_MAX_TOKENS, 0, -1)
                      if all(g.held for g in per_tokens(t))), 0)
    return _token_ranged("routing_prologue", "fused", "three_step", static + per_tokens(tokens), t_max, tokens,
                         forced, "single-block fused expert-map build",
                         "three-step sort/offsets/inverse build of the expert maps")


def _routing(spec: MoESpec, tokens: int, forced: str | None) -> StageDecision:
    """moe-build's: the routing inside the first launch of the routing prologue (either form) up to
    ROUTING_IN_PROLOGUE_MAX_TOKENS (bands over every count). Where the caller gives top-k ids there is no routing and
    the stage does not apply (runner/sequence.py)."""
    local = R.routing_local(spec)
    t_max = R.ROUTING_IN_PROLOGUE_MAX_TOKENS if local.held else 0
    gates = [local, R.routing_in_prologue_tokens(tokens)]
    return _token_ranged("routing", "prologue", "separate", gates, t_max, tokens, forced,
                         "routing inside the prologue's first launch (one launch fewer)",
                         "the routing kernel, then the expert maps")


def _expand_rows(spec: MoESpec, forced: str | None) -> StageDecision:
    """The seed's fusion (W4AFP8: the FP8 expansion scales and quantizes), or moe-build's for W4A16 AWQ layers
    that store the scales (the 16-bit expansion scales the rows it copies); both gate sets are reported."""
    seed = [R.expand_w4afp8_without_fp8_input(spec), R.expand_prequant_not_block_scaled(spec)]
    ours = R.expand_awq_scale_16bit(spec)
    held = all(g.held for g in seed) or ours.held
    choice = "prequant_fused" if held else "plain"
    if forced is not None:
        if forced == "prequant_fused" and not held:  # the rule that could have held for this quant mode
            _refuse(seed if spec.quant is Quant.W4AFP8 else [ours], "cannot force expand_rows=prequant_fused")
        choice = forced
    summary = ("AWQ pre-quant scale applied inside expand" + (" (moe-build's, 16-bit rows)" if ours.held else "")
               if choice == "prequant_fused" else "plain duplicate+permute")
    act = R.expand_per_expert_act_scale(spec)  # informs, does not decide: NVFP4 x NVFP4 per-expert act scale
    return StageDecision("expand_rows", choice, "plain", (*seed, ours, act), forced=forced is not None,
                         summary=summary + ("; per-expert activation scale" if act.held else ""))


def _gemm_kernel(spec: MoESpec, target: Target, forced: str | None) -> StageDecision:
    return _simple("gemm_kernel", "tma_warp_specialized", "ampere", [R.tma_ws_sm(target), R.tma_ws_specialisation(spec)],
                   forced, lambda f: "Hopper+ TMA warp-specialized grouped GEMM" if f else "Ampere grouped GEMM")


def _fc1_activation(spec: MoESpec, target: Target, gemm_kernel: str, tokens: int, forced: str | None,
                    gemm1_forced: T.GemmTactic | None = None) -> StageDecision:
    """The seed's SM80 fused gated kernel or moe-build's gated epilogue where their gates hold, else the separate
    activation; with block-128 FP8 scales the gated epilogue in GEMM1's decode band only, weight-only in the mixed-input
    GEMM1's bands (of the forced GEMM1 tactic where one is forced; bands over every count)."""
    not_tma = R.fc1_not_tma_ws(gemm_kernel)
    non_gated = R.fc1_non_gated(spec)
    if non_gated.held:
        if forced not in (None, "separate", "epilogue"):
            raise MoeBuildError("force", f"fc1_activation={forced} does not apply to activation "
                                f"{spec.activation.value}", ("separate", "epilogue"))
        decision = _simple("fc1_activation", "epilogue", "separate", [not_tma], forced,
                           lambda f: "activation fused into GEMM1's epilogue" if f
                           else "GEMM1, then a separate activation kernel")
        return replace(decision, gates=(non_gated, not_tma))
    if forced not in (None, "separate", "fused_gated", "gated_epilogue"):
        raise MoeBuildError("force", f"fc1_activation={forced} does not apply to activation {spec.activation.value}",
                            ("separate", "fused_gated", "gated_epilogue"))
    # Two fused alternatives, at most one of which can hold: the seed's SM80 kernel (not on a TMA WS
    # GEMM) and moe-build's gated epilogue (only on one). Both gate sets are reported either way.
    sm80 = [R.fused_gated_activation_kind(spec), R.fused_gated_same_types(spec), R.fused_gated_not_fp32(spec),
            R.fused_gated_not_fp8(spec), R.fused_gated_sm(target), R.fused_gated_alignment(spec),
            R.fused_gated_two_byte(spec), not_tma]
    ours = [R.gated_epilogue_tma_ws(gemm_kernel), R.gated_epilogue_sm(target), R.gated_epilogue_gemm(spec),
            R.gated_epilogue_inter_mod_8(spec)]
    texts = {"fused_gated": "SM80 fused gated-activation GEMM1 kernel",
             "gated_epilogue": "gated activation in the TMA warp-specialized GEMM1's epilogue (moe-build's own "
                               "fusion; W1 gate/up rows interleaved by 8)",
             "separate": "GEMM1, then a separate gated-activation kernel"}
    held = {"fused_gated": all(g.held for g in sm80), "gated_epilogue": all(g.held for g in ours)}
    if held["gated_epilogue"] and spec.quant is Quant.FP8_BLOCK and forced in (None, "gated_epilogue"):
        return _fc1_gated_block128(spec, target, gemm_kernel, tokens, (non_gated, *sm80, *ours), texts,
                                   forced is not None, gemm1_forced)
    if held["gated_epilogue"] and spec.quant in R.GATED_EPILOGUE_MIXED_INPUT_QUANTS and forced in (None,
                                                                                               "gated_epilogue"):
        return _fc1_gated_in_mixed_band(spec, target, gemm_kernel, tokens, (non_gated, *sm80, *ours), texts,
                                        forced is not None, gemm1_forced)
    choice = next((c for c in ("fused_gated", "gated_epilogue") if held[c]), "separate")
    if forced is not None:
        if forced != "separate" and not held[forced]:
            _refuse(sm80 if forced == "fused_gated" else ours, f"cannot force fc1_activation={forced}")
        choice = forced
    return StageDecision("fc1_activation", choice, "separate", (non_gated, *sm80, *ours), forced=forced is not None,
                         summary=texts[choice])


def _fc1_gated_block128(spec: MoESpec, target: Target, gemm_kernel: str, tokens: int, gates: Sequence[Gate],
                        texts: Mapping[str, str], forced: bool, gemm1_forced: T.GemmTactic | None) -> StageDecision:
    """A block-128 layer's gated epilogue: the decode GEMM1's in its band (rules.gated_epilogue_block_decode) and the
    wgmma GEMM1's on the gate/up halves (rules.gated_epilogue_block_wgmma), by GEMM1's tactic at each count (the forced
    one at every count); the separate activation at the others (bands over every count); forced, refused where it
    cannot hold."""
    store = _plain_store_calls(spec, target, gemm_kernel)["gemm1_tactic"]

    def rules_at(rows: T.RowCount) -> tuple[Gate, Gate]:
        tactic = gemm1_forced or T.choose_tactic(store, rows)
        decode = R.gated_epilogue_block_decode(spec, rows)
        return (decode if tactic.kernel == "decode" else replace(decode, held=False),
                R.gated_epilogue_block_wgmma(spec, tactic))

    def where(rows: T.RowCount) -> str:
        decode, wgmma = rules_at(rows)
        return "decode" if decode.held else "wgmma" if wgmma.held else "separate"

    bands = tuple(Band(lo, hi, c) for lo, hi, c in T.token_bands(
        spec.top_k, spec.local_experts, lambda rows: "separate" if where(rows) == "separate" else "gated_epilogue"))
    if forced:  # refused at the first count where neither GEMM1 can run it
        lo = next((b.lo for b in bands if b.choice == "separate"), None)
        if lo is not None:
            _refuse(rules_at(T.RowCount(lo, spec.top_k, spec.local_experts)),
                    f"cannot force fc1_activation=gated_epilogue (a forced choice holds at every token count; at {lo} "
                    "tokens)")
    rows_here = T.RowCount(tokens, spec.top_k, spec.local_experts)
    here, at = rules_at(rows_here), where(rows_here)
    choice = "separate" if at == "separate" else "gated_epilogue"
    text = {"decode": "gated activation in the FP8 decode GEMM1's epilogue (moe-build's own fusion; W1 stacked, its "
                      "block-128 scales whole)",
            "wgmma": "gated activation in the FP8 wgmma GEMM1's epilogue (moe-build's own fusion; W1 stacked, read by "
                     "64-row gate/up halves)",
            "separate": texts["separate"]}[at]
    return StageDecision("fc1_activation", choice, "separate", (*gates, *here), bands, forced=forced,
                         summary=f"{text} ({bands_text(bands, choice_first=True)})")


def _fc1_gated_in_mixed_band(spec: MoESpec, target: Target, gemm_kernel: str, tokens: int, gates: Sequence[Gate],
                             texts: Mapping[str, str], forced: bool, gemm1_forced: T.GemmTactic | None
                             ) -> StageDecision:
    """A weight-only layer's gated epilogue, the mixed-input wgmma GEMM1's (rules.gated_epilogue_woq_mixed): in the
    bands where GEMM1's tactic is one of its tiles, and the separate activation (on W1 interleaved) in the others;
    forced, refused (it cannot hold at every count: the decode kernels have no gated epilogue)."""
    store = _plain_store_calls(spec, target, gemm_kernel)["gemm1_tactic"]

    def rule(rows: T.RowCount) -> Gate:
        return R.gated_epilogue_woq_mixed(spec, rows, gemm1_forced or T.choose_tactic(store, rows))

    bands = tuple(Band(lo, hi, "gated_epilogue" if held else "separate") for lo, hi, held in
                  T.token_bands(spec.top_k, spec.local_experts, lambda rows: rule(rows).held))
    if forced:  # refused at the first count where the gate fails
        lo = next(b.lo for b in bands if b.choice == "separate")
        _refuse([rule(T.RowCount(lo, spec.top_k, spec.local_experts))],
                f"cannot force fc1_activation=gated_epilogue (a forced choice holds at every token count; at {lo} "
                "tokens)")
    here = rule(T.RowCount(tokens, spec.top_k, spec.local_experts))
    choice = "gated_epilogue" if here.held else "separate"
    fp8 = (" GEMM2's input quantized to e4m3 by its static scale there," if spec.quant is Quant.W4AFP8 else "")
    text = (f"gated activation in the mixed-input wgmma GEMM1's epilogue (moe-build's own fusion;{fp8} W1 gate/up rows "
            "interleaved by 8)" if choice == "gated_epilogue" else
            texts["separate"] + (" (W1 gate/up rows interleaved by 8)" if any(b.choice == "gated_epilogue"
                                                                             for b in bands) else ""))
    return StageDecision("fc1_activation", choice, "separate", (*gates, here), bands,
                         summary=f"{text} ({bands_text(bands, choice_first=True)})")


def _fc2_prequant(spec: MoESpec, forced: str | None) -> StageDecision:
    """The seed's fusion where its gates hold (W4AFP8's fused activation also quantizes GEMM2's input to FP8)."""
    awq, gated = R.fc2_use_awq(spec), R.fc2_gated(spec)
    if not awq.held:
        if forced not in (None, "none"):
            _refuse([awq], f"cannot force fc2_prequant={forced}")
        return StageDecision("fc2_prequant", "none", "none", (awq, gated), forced=forced is not None,
                             summary="no FC2 pre-quant scale")
    fused_text, separate_text = "FC2 pre-quant scale applied in FC1's gated activation", \
        "FC2 pre-quant scale applied before GEMM2"
    return _simple("fc2_prequant", "fused", "separate", [awq, gated], forced if forced != "none" else "separate",
                   lambda f: fused_text if f else separate_text)


def _finalize(spec: MoESpec, target: Target, gemm_kernel: str, tokens: int, forced: str | None,
              ep_format: str, gemm2_forced: T.GemmTactic | None) -> StageDecision:
    static = [R.finalize_tma_ws(gemm_kernel), R.finalize_sm_not_wfp4a16(spec, target),
              R.finalize_topk_or_nondeterministic(spec, target), R.finalize_env(target), R.finalize_no_lora(spec),
              R.finalize_tactic_available(spec), R.finalize_where_experts_run(ep_format)]
    gemm2_store = _gemm2_store_tactic(spec, target, gemm_kernel, gemm2_forced)
    gates = (*static, R.finalize_tactic_rows(spec, tokens, gemm2_store(T.RowCount(tokens, spec.top_k,
                                                                                  spec.local_experts))))
    fused_text = "unpermute + top-k weighting + reduction in GEMM2's epilogue"
    separate_text = "separate finalize kernel after GEMM2"
    if forced == "fused":
        # The tactic gate is a measured preference, not a capability: forcing overrides it (as picking
        # a FINALIZE tactic by hand does in TensorRT-LLM), so the bench can time the fused epilogue anywhere.
        _refuse(static, "cannot force finalize=fused")
        return StageDecision("finalize", "fused", "separate", gates, forced=True, summary=f"{fused_text} (every count)")
    if forced == "separate" or not all(g.held for g in static):
        return StageDecision("finalize", "separate", "separate", gates, forced=forced is not None,
                             summary=separate_text)
    fused_at = T.token_bands(spec.top_k, spec.local_experts,
                             lambda rows: R.finalize_fused(spec, rows, gemm2_store(rows)))
    bands = tuple(Band(lo, hi, "fused" if fused else "separate") for lo, hi, fused in fused_at)
    choice = next(b.choice for b in bands if b.holds(tokens))
    where = "every count" if len(bands) == 1 else bands_text(bands, choice_first=True)
    return StageDecision("finalize", choice, "separate", gates, bands,
                         summary=f"{fused_text if choice == 'fused' else separate_text} ({where})")


def _gemm2_store_tactic(spec: MoESpec, target: Target, gemm_kernel: str, forced: T.GemmTactic | None
                        ) -> Callable[[T.RowCount], T.GemmTactic | None]:
    """A weight-only layer's GEMM2 tactic with the plain store by rows (the forced one at every count), which places
    the mixed-input kernel's finalize bands (rules.finalize_fused); None for the other layers and off sm90's kernels."""
    if spec.quant not in R.FINALIZE_WOQ_QUANTS or gemm_kernel != "tma_warp_specialized":
        return lambda rows: None
    store = _plain_store_calls(spec, target, gemm_kernel)["gemm2_tactic"]
    return lambda rows: forced or T.choose_tactic(store, rows)


def _plain_store_calls(spec: MoESpec, target: Target, gemm_kernel: str) -> dict[str, T.GemmCall]:
    """The two GEMMs with the plain store (no gated or finalize epilogue, row-major weights): where a weight-only
    layer's GEMMs run decides the bands of the epilogues the mixed-input kernel has."""
    return _gemm_calls(spec, target, {"gemm_kernel": gemm_kernel, "fc1_activation": "separate", "finalize": "separate",
                                      "weight_layout": "row_major", "fp8_accumulation": "none"})


def _optional_stage(stage: str, fused: str, fallback: str, gates: Sequence[Gate], forced: str | None, fused_text: str,
                    fallback_text: str, none_text: str, why_not_none: str,
                    force_needs: Sequence[Gate] | None = None) -> StageDecision:
    """A stage of some layers only (those with FP8 GEMMs, with a GEMM on the digits tile): `fused` where every gate
    holds, else `fallback`; "none" for a layer without them (the first gate), which a layer with them cannot be forced
    to (`why_not_none`). Forcing `fused` needs `force_needs` (default: every gate), as _simple's."""
    if not gates[0].held:
        if forced not in (None, "none"):
            _refuse(gates[:1], f"cannot force {stage}={forced}")
        return StageDecision(stage, "none", "none", tuple(gates), forced=forced is not None, summary=none_text)
    if forced == "none":
        raise MoeBuildError("force", f"{stage}=none: {why_not_none}", (fused, fallback))
    return _simple(stage, fused, fallback, gates, forced, lambda f: fused_text if f else fallback_text, force_needs)


def _act_quant(stage: str, fused: str, gates: Sequence[Gate], forced: str | None, fused_text: str,
               separate_text: str, none_text: str = "no FP8 activations") -> StageDecision:
    """An FP8 activation-quantization stage: `fused` where every gate holds, else a separate quantize kernel."""
    return _optional_stage(stage, fused, "separate", gates, forced, fused_text, separate_text, none_text,
                           "FP8 GEMMs need FP8 inputs")


# W4AFP8's GEMM inputs are quantized to FP8 where its pre-quant stages say (the scale applied, then quantized) and
# stored dequantized to 16 bits (or as token digits) for W4A16's GEMMs (runner/sequence.py)
W4AFP8_INPUT_TEXT = ("W4AFP8: quantized to FP8 ({}) where {} says (times the AWQ pre-quant scale where there is one), "
                     "stored dequantized to 16 bits for the weight-only (W4A16) GEMMs")


def _w4afp8_input_text(spec: MoESpec, stage: str) -> list[str]:
    """The W4AFP8 summary of a GEMM input's stage (none for other quant modes)."""
    if spec.quant is not Quant.W4AFP8:
        return []
    scale = "its static scale" if spec.act_scale is ActScale.STATIC else "each row's dynamic scale"
    return [W4AFP8_INPUT_TEXT.format(scale, stage)]


def _fc1_input_quant(spec: MoESpec, forced: str | None) -> StageDecision:
    return _act_quant("fc1_input_quant", "expand_rows", [R.input_quant_fp8(spec)], forced,
                      "GEMM1's input quantized to FP8 while rows are expanded",
                      "GEMM1's input quantized to FP8 by a separate kernel, then expanded",
                      *_w4afp8_input_text(spec, "expand_rows"))


# fc2_input_quant's summaries where GEMM2's input is made after GEMM1 (the bands' choices)
FC2_QUANT_TEXTS = {
    "gemm2": "GEMM2's input quantized to FP8 by GEMM2 itself as it loads its rows (the quantizing decode kernel)",
    "separate": "GEMM2's input quantized to FP8 by a separate kernel after GEMM1's gated epilogue",
    "fc1_activation": "GEMM2's input quantized to FP8 in the activation kernel",
}


def _fc2_input_quant(spec: MoESpec, fc1: StageDecision, finalize: StageDecision, gemm2: StageDecision,
                     call: T.GemmCall, tokens: int, forced: str | None) -> StageDecision:
    """In the activation kernel where it can run there (every count); else, after GEMM1's gated epilogue, in that
    epilogue where the scale is static (every count), else in GEMM2 at the counts where it runs the quantizing decode
    kernel (bands over every count, the GEMM2 tactic's, the finalize's and GEMM1's gated epilogue's, with the
    activation kernel where that epilogue does not run); forced, the same choice at every count."""
    fc1_activation = fc1.choice
    fc1_banded = len({b.choice for b in fc1.bands}) > 1  # block-128: the gated epilogue in GEMM1's decode band only
    if fc1_banded:
        if forced == "fc1_activation":
            _refuse([R.fc2_quant_in_activation("gated_epilogue")], "cannot force fc2_input_quant=fc1_activation "
                    "(GEMM1's gated epilogue runs at some counts; force fc1_activation=separate as well)")
        fc1_activation = "gated_epilogue"  # the static gates below: GEMM2 may quantize somewhere
    gates = [R.input_quant_fp8(spec), R.fc2_quant_in_activation(fc1_activation)]
    fused_text = FC2_QUANT_TEXTS["fc1_activation"]
    separate_text = "GEMM2's input quantized to FP8 by a separate kernel after the activation"
    in_gemm1 = [gates[0], R.fp8_rowwise_scales(spec), R.fc2_quant_static_scale(spec),
                R.fc2_quant_after_gated_epilogue(fc1_activation)]
    if forced == "gemm1" or (forced is None and all(g.held for g in in_gemm1)):
        _refuse(in_gemm1, "cannot force fc2_input_quant=gemm1")
        return StageDecision("fc2_input_quant", "gemm1", "separate", (*gates, *in_gemm1[1:]),
                             forced=forced is not None,
                             summary="GEMM2's input quantized to FP8 by GEMM1's gated epilogue with the static scale "
                                     "(every count)")
    in_gemm2 = [gates[0], R.fc2_quant_after_gated_epilogue(fc1_activation), R.fc2_quant_gemm2_k(spec)]
    if forced == "gemm2" or (forced is None and all(g.held for g in in_gemm2)):
        # shown: the count's GEMM1 epilogue gate comes with the count's gates (_fc2_quant_in_gemm2's `here`)
        return _fc2_quant_in_gemm2(spec, in_gemm2, (*gates, *in_gemm2[2:]), fc1, finalize, gemm2, call, tokens,
                                   forced is not None)
    if fc1_banded and gates[0].held and forced is None:  # after the gated epilogue a quantize step, else the kernel
        bands = tuple(Band(b.lo, b.hi, "separate" if b.choice == "gated_epilogue" else "fc1_activation")
                      for b in fc1.bands)
        choice = next(b.choice for b in bands if b.holds(tokens))
        return StageDecision("fc2_input_quant", choice, "separate", (*gates, *in_gemm2[1:]), bands,
                             summary=f"{FC2_QUANT_TEXTS[choice]} ({bands_text(bands, choice_first=True)})")
    return _act_quant("fc2_input_quant", "fc1_activation", gates, forced, fused_text, separate_text,
                      *_w4afp8_input_text(spec, "fc2_prequant"))


def _fc2_quant_in_gemm2(spec: MoESpec, gates: Sequence[Gate], shown: Sequence[Gate], fc1: StageDecision,
                        finalize: StageDecision, gemm2: StageDecision, call: T.GemmCall, tokens: int,
                        forced: bool) -> StageDecision:
    """fc2_input_quant=gemm2 at the counts where GEMM1 runs the gated epilogue and GEMM2 the decode kernel with the
    finalize fused and few enough CTAs (`call`: GEMM2's), separate at the others after the gated epilogue, and
    fc1_activation where the activation kernel runs (bands over every count); forced, gemm2 at every count, refused
    where `gates` or a count's GEMM1 epilogue or GEMM2 kernel does not hold (the waves gate is a measured preference:
    forcing overrides it). The decision shows `shown` (the activation kernel's gates too) and the count's gates."""
    def gates_at(rows: T.RowCount) -> tuple[Gate, Gate, Gate]:
        gated = R.fc2_quant_after_gated_epilogue(_choice_at(fc1, rows))
        tactic = _choice_at(gemm2, rows)
        kernel = R.fc2_quant_gemm2_call(tactic, _choice_at(finalize, rows))
        if not kernel.held:
            return gated, kernel, R.fc2_quant_gemm2_waves(call.experts, 0, call.sm_count, False)
        blocks = decode_column_blocks(call, T.GemmTactic.parse(tactic).k_split)
        few = ctas_at_most(call, rows, blocks, R.FP8_QUANTIZING_MAX_CTAS_PER_SM * call.sm_count)
        return gated, kernel, R.fc2_quant_gemm2_waves(min(call.experts, rows.rows), blocks, call.sm_count, few)

    def choice_at(rows: T.RowCount) -> str:
        here_gates = gates_at(rows)
        if all(g.held for g in here_gates):
            return "gemm2"
        return "separate" if here_gates[0].held else "fc1_activation"

    rows_here = T.RowCount(tokens, spec.top_k, spec.local_experts)
    here = gates_at(rows_here)
    if forced:
        _refuse(gates, "cannot force fc2_input_quant=gemm2")
        for lo, hi, count_gates in T.token_bands(spec.top_k, spec.local_experts, lambda rows: gates_at(rows)[:2]):
            for gate in count_gates:
                if not gate.held:
                    where = f"{lo}+" if hi is None else f"{lo}-{hi}"
                    _refuse([gate], f"cannot force fc2_input_quant=gemm2 (a forced choice holds at every token "
                                    f"count; at {where} tokens)")
        return StageDecision("fc2_input_quant", "gemm2", "separate", (*shown, *here), forced=True,
                             summary=f"{FC2_QUANT_TEXTS['gemm2']} (every count)")
    bands = tuple(Band(lo, hi, c) for lo, hi, c in T.token_bands(spec.top_k, spec.local_experts, choice_at))
    choice = choice_at(rows_here)
    where = "every count" if len(bands) == 1 else bands_text(bands, choice_first=True)
    return StageDecision("fc2_input_quant", choice, "separate", (*shown, *here), bands,
                         summary=f"{FC2_QUANT_TEXTS[choice]} ({where})")


# what each step tactic stage's step is (its summary)
STEP_TEXTS = {
    "expand_rows_tactic": "FP8 expansion (GEMM1's input quantized as the rows are copied)",
    "fc1_input_quant_tactic": "FP8 quantize step of the expanded rows",
    "fc1_activation_tactic": "FP8 activation step (GEMM2's input quantized as it is activated)",
    "fc2_input_quant_tactic": "FP8 quantize step of the activated rows",
}


def _fp8_row_steps_run(fc1: StageDecision, fc2_input_quant: StageDecision) -> tuple[bool, bool]:
    """Whether an FP8 layer runs, at some token count, the activation step that quantizes GEMM2's input and the
    quantize step after a 16-bit activation (runner/sequence.py's _fp8_steps): neither where GEMM1 or GEMM2 quantizes
    that input; the quantize step after GEMM1's gated epilogue, or where the plan puts it (separate); else the
    activation step."""
    activation = quantize = False
    for lo in sorted({b.lo for b in fc1.bands} | {b.lo for b in fc2_input_quant.bands}):
        c1, c2 = fc1.choice_for(lo), fc2_input_quant.choice_for(lo)
        if c2 in ("gemm1", "gemm2"):
            continue
        if c1 == "gated_epilogue" or c2 == "separate":
            quantize = True
        else:
            activation = True
    return activation, quantize


def _row_steps(spec: MoESpec, target: Target, expand_rows: StageDecision, fc1_input_quant: StageDecision,
               fc1: StageDecision, fc2_input_quant: StageDecision,
               fc2_prequant: StageDecision) -> dict[str, T.RowStep | None]:
    """The FP8 row steps the layer runs at some token count (runner/sequence.py's), as the step tactic rules see them;
    None where the layer has no such step. W4AFP8's steps store the quantized values in 16 bits; with a pre-quant
    scale where its stage puts the AWQ scale in them."""
    fp8 = spec.quant in (Quant.FP8, Quant.FP8_BLOCK)
    if not fp8 and spec.quant is not Quant.W4AFP8:
        return dict.fromkeys(STEP_STAGES)
    scaling = ("per_group" if spec.quant is Quant.FP8_BLOCK else
               "static" if spec.act_scale is ActScale.STATIC else "per_row")

    def step(cols: int, gated: bool = False, prequant: bool = False, expansion: bool = False) -> T.RowStep:
        return T.RowStep(cols, gated, prequant, scaling, not fp8, expansion, target.sm_count,
                         target.max_smem_per_block)

    H, I, gated = spec.hidden_size, spec.intermediate_size, spec.activation.is_gated
    if fp8:
        activation, quantize = _fp8_row_steps_run(fc1, fc2_input_quant)
        return {"expand_rows_tactic": step(H, expansion=True) if fc1_input_quant.choice == "expand_rows" else None,
                "fc1_input_quant_tactic": None,  # mb_quantize_fp8: one kernel
                "fc1_activation_tactic": step(I, gated) if activation else None,
                "fc2_input_quant_tactic": step(I) if quantize else None}
    fused_expansion = expand_rows.choice == "prequant_fused"
    separate_fc2 = fc2_prequant.choice == "separate"  # the 16-bit activation, then the quantize step with the scale
    awq1 = spec.quant_prequant_scales
    return {"expand_rows_tactic": step(H, prequant=awq1, expansion=True) if fused_expansion else None,
            "fc1_input_quant_tactic": None if fused_expansion else step(H, prequant=awq1),
            "fc1_activation_tactic": None if separate_fc2 else step(I, gated, prequant=fc2_prequant.choice == "fused"),
            "fc2_input_quant_tactic": step(I, prequant=True) if separate_fc2 else None}


def _step_tactic(stage: str, step: T.RowStep | None, spec: MoESpec, tokens: int,
                 forced: str | None) -> StageDecision:
    """A row step's kernel in bands over every token count (tactics/steps.py), or the forced one at all; "none" where
    the layer has no such step."""
    if step is None:
        if forced not in (None, "none"):
            raise MoeBuildError("force", f"{stage}={forced}: the layer has no {STEP_TEXTS[stage]}", "none")
        return StageDecision(stage, "none", "none", (), forced=forced is not None, summary=f"no {STEP_TEXTS[stage]}")
    gates = (Gate(f"{stage}_step", step.describe(), "step tactic table: moe_build/planner/tactics/steps.py", True, OURS,
                  token_dependent=True),)
    if forced is not None:
        problem = T.step_problem(step, forced)
        if problem is not None:
            raise MoeBuildError("force", f"{stage}={forced}: {problem}", [t for t in T.STEP_TACTICS if
                                                                           T.step_problem(step, t) is None])
        return StageDecision(stage, forced, forced, gates, forced=True, summary=f"the {STEP_TEXTS[stage]} as forced")
    bands = tuple(Band(lo, hi, choice) for lo, hi, choice in
                  T.token_bands(spec.top_k, spec.local_experts, lambda rows: T.step_tactic(step, rows)))
    here = next(band.choice for band in bands if band.holds(tokens))
    return StageDecision(stage, here, here, gates, bands,
                         summary=f"the {STEP_TEXTS[stage]}, where it runs: {bands_text(bands, choice_first=True)}")


def _fp8_accumulation(spec: MoESpec, gemm_kernel: str, forced: str | None) -> StageDecision:
    """The FP8 wgmma GEMMs' accumulation: fast (the tensor cores' own over the whole k) where the scales are rowwise,
    else promoted (fp32 adds every 128 k); "none" for a layer without FP8 GEMMs."""
    gates = [R.input_quant_fp8(spec), R.fp8_wgmma_kernel(gemm_kernel), R.fp8_rowwise_scales(spec)]
    return _optional_stage("fp8_accumulation", "fast", "promoted", gates, forced,
                           "FP8 wgmma GEMMs accumulate the whole k in the tensor cores (fp32 registers, no promotion)",
                           "FP8 GEMMs add their partial sums into fp32 every 128 k", "no FP8 GEMMs",
                           "FP8 GEMMs accumulate one way or the other")


def _token_digits(spec: MoESpec, fc2_prequant: str, tactics: Sequence[StageDecision],
                  forced: str | None) -> StageDecision:
    """Where the GEMMs on the digits tile (at any count of their tactic bands) get their token digits: from the
    kernels that write their input rows, or a digits step after each; "none" where no GEMM runs the tile."""
    on = [d.stage.split("_")[0] for d in tactics
          if any(on_digits_tile(T.GemmTactic.parse(c)) for c in ([b.choice for b in d.bands] or [d.choice]))]
    capable = [R.digits_tile_planned(on), R.digits_fc2_prequant(fc2_prequant), R.digits_row_scale_fits(spec)]
    return _optional_stage("token_digits", "fused", "separate", capable + [R.digits_row_scale_pays(spec)], forced,
                           "the digits tile's token digits made by the expansion (GEMM1) and the activation (GEMM2)",
                           "the digits tile's token digits made by a step of their own before each GEMM",
                           "no GEMM on the digits tile", "a GEMM on the digits tile reads token digits",
                           force_needs=capable)


def _w1_order(spec: MoESpec, fc1_activation: StageDecision) -> StageDecision:
    gate = R.w1_interleaved(spec, tuple(dict.fromkeys((fc1_activation.choice,
                                                        *(b.choice for b in fc1_activation.bands)))))
    choice = "gate_up_interleaved" if gate.held else "stacked"
    return StageDecision("w1_order", choice, "stacked", (gate,),
                         summary="W1 / b1 gate and up rows interleaved in blocks of 8 features" if gate.held
                         else "W1 / b1 as the checkpoint stacks them (gate rows, then up rows)")


def _weight_layout(spec: MoESpec, target: Target, gemm_kernel: str, forced: str | None) -> StageDecision:
    capable = [R.blocked_gemm_kernel(gemm_kernel), R.blocked_sizes(spec), R.blocked_unquantized(spec)]
    return _simple("weight_layout", "blocked64", "row_major", capable + [R.blocked_rows_pay(spec, target)], forced,
                   lambda f: "W1 / W2 stored in 64 x 64 blocks (the sm90 GEMMs' prefill layout)" if f
                   else "W1 / W2 row-major per expert", force_needs=capable)


def _int4_layout(spec: MoESpec, target: Target, layout: StageDecision, tactics: Sequence[StageDecision],
                 forced: str | None) -> StageDecision:
    """weight_layout for int4 weight-only layers, once the GEMMs' bands are known: the codes in 16-row tiles where no
    band up to the profile's max tokens runs the mixed-input wgmma kernel (which reads rows), else rows. Other layers
    keep `layout` (whose blocked gates refuse quantized weights)."""
    quant = R.int4_tiles_quant(spec)
    if not quant.held:
        if forced == "int4_tiles":
            _refuse([quant], "cannot force weight_layout=int4_tiles")
        return layout
    mixed = min((b.lo for t in tactics for b in t.bands if on_mixed_input_tile(T.GemmTactic.parse(b.choice))),
                default=None)
    pay = R.int4_tiles_pay(mixed, target.profile.max)

    def summary(tiled: bool) -> str:
        if not tiled:
            return "W1 / W2's int4 codes in rows (what the mixed-input wgmma bands read)"
        copy = ("; the mixed-input wgmma bands read a rows copy (twice the codes' memory)"
                if mixed is not None and mixed <= target.profile.max else "")
        return f"W1 / W2's int4 codes in 16-row tiles (the decode kernels' fastest form){copy}"
    return _simple("weight_layout", "int4_tiles", "row_major", [quant, pay], forced, summary, force_needs=[quant])


def _gemm_calls(spec: MoESpec, target: Target, choices: Mapping[str, str]) -> dict[str, T.GemmCall]:
    """The two grouped GEMMs of the layer as the tactic rules see them at the plan's token count (GEMM2's
    epilogue is the finalize stage's choice there; `_tactic` follows it over every count)."""
    entry = "sm90" if choices["gemm_kernel"] == "tma_warp_specialized" else "sm80"
    gated1 = _gemm1_epilogue(choices["fc1_activation"]) == "gated"
    fp8 = {Quant.FP8: "rowwise", Quant.FP8_BLOCK: "block128"}.get(spec.quant, "none")
    # W4AFP8's GEMMs are W4A16's: the expansion and the activation write its FP8-quantized rows dequantized to 16 bits
    # (runner/sequence.py), which the GEMMs read as W4A16's: its kernels and rules whole
    woq = {Quant.W4A16_AWQ: "int4", Quant.W4AFP8: "int4", Quant.W8A16: "int8",
           Quant.WFP4A16: "mxfp4"}.get(spec.quant, "none")
    woq_group = 32 if woq == "mxfp4" else 0 if spec.quant_per_channel else spec.quant_group_size
    common = dict(sm=target.sm, entry=entry, experts=spec.local_experts, top_k=spec.top_k,
                  itemsize=1 if fp8 != "none" or woq == "int8" else spec.dtype.itemsize,
                  weights_blocked=choices["weight_layout"] == "blocked64", sm_count=target.sm_count,
                  l2_bytes=target.l2_bytes, memory_bytes_per_s=target.memory_bytes_per_s, fp8=fp8, woq=woq,
                  woq_group=woq_group if woq != "none" else 0,
                  dtype=spec.dtype.value,
                  deterministic=target.deterministic,
                  fp8_accumulation=choices["fp8_accumulation"])
    return {"gemm1_tactic": T.GemmCall(epilogue="gated" if gated1 else "store", n=spec.fc1_out_features,
                                       k=spec.hidden_size, **common),
            "gemm2_tactic": T.GemmCall(epilogue=_gemm2_epilogue(choices["finalize"]),
                                       n=spec.hidden_size, k=spec.intermediate_size, **common)}


def _gemm1_epilogue(fc1_activation: str) -> str:
    return "gated" if fc1_activation in ("gated_epilogue", "fused_gated") else "store"


def _gemm2_epilogue(finalize_choice: str) -> str:
    return "finalize" if finalize_choice == "fused" else "store"


def _choice_at(d: StageDecision, rows: T.RowCount) -> str:
    """`d`'s choice at `rows`' token count, its band's end recorded as a threshold (a decision without bands, e.g. a
    forced one, has its choice at every count)."""
    if not d.bands:
        return d.choice
    return next(b.choice for b in d.bands if b.hi is None or rows.tokens_at_most(b.hi))


def _tactic(stage: str, call: T.GemmCall, epilogue_stage: StageDecision | None, tokens: int,
            forced: T.GemmTactic | None) -> StageDecision:
    """A GEMM's tactic in bands over every token count (tactics.token_bands), or the forced one at all.

    A GEMM's epilogue follows a stage that may itself be token-dependent (GEMM1's fc1_activation, GEMM2's
    finalize): at each count the rules see the epilogue of that stage's band there, and the bands also end where
    it changes.
    """
    gemm = "GEMM1" if stage == "gemm1_tactic" else "GEMM2"
    gates = (Gate(f"{stage}_call", f"sm={call.sm} entry={call.entry} epilogue={call.epilogue} n={call.n} k={call.k} "
                  f"experts={call.experts} top_k={call.top_k} blocked={call.weights_blocked} "
                  f"sms={call.sm_count} l2={call.l2_bytes >> 20} MiB memory={call.memory_bytes_per_s / 1e12:.2f} TB/s "
                  f"deterministic={call.deterministic}",
                  "tactic table: moe_build/planner/tactics/", True, OURS, token_dependent=True),)

    def call_at(rows: T.RowCount) -> T.GemmCall:
        if epilogue_stage is None:
            return call
        choice = _choice_at(epilogue_stage, rows)
        epilogue = _gemm1_epilogue(choice) if stage == "gemm1_tactic" else _gemm2_epilogue(choice)
        return replace(call, epilogue=epilogue)

    if forced is not None:  # one tactic at every token count: it must hold in every band of GEMM2's epilogue
        for lo, hi, part in T.token_bands(call.top_k, call.experts, call_at):
            problem = T.tactic_problem(part, forced)
            if problem is not None:
                where = f"{lo}+" if hi is None else f"{lo}-{hi}"
                raise MoeBuildError("force", f"{stage}={forced.name}: {problem} (a forced tactic holds at every token "
                                    f"count; at {where} tokens the {gemm} epilogue is {part.epilogue})")
        return StageDecision(stage, forced.name, forced.name, gates, forced=True, summary=f"{gemm} as forced")
    bands = tuple(Band(lo, hi, tactic.name) for lo, hi, tactic in
                  T.token_bands(call.top_k, call.experts, lambda rows: T.choose_tactic(call_at(rows), rows)))
    here = next(band.choice for band in bands if band.holds(tokens))
    summary = f"{gemm}: {len(bands)} tactic band{'s' if len(bands) > 1 else ''} by rows per expert"
    if call.woq == "mxfp4":
        # the runner's copies beside the stored form for those bands (weights/woq.py mxfp4_as_e5m2 and
        # mxfp4_quarters): memory the user should see
        tactics = [T.GemmTactic.parse(b.choice) for b in bands]
        if any(on_digits_tile(t) for t in tactics):
            summary += "; its MXFP4 weights also held in the quarters order (half a byte a weight) for the digits bands"
        if any(on_mixed_input_tile(t) for t in tactics):
            summary += "; its MXFP4 weights also held as e5m2 (1 byte a weight) for the mixed-input (woq128x*) bands"
    # A tactic has no fused and fallback form: the fallback shown is the choice itself.
    return StageDecision(stage, here, here, gates, bands, summary=summary)


def _expert_compute(spec: MoESpec, target: Target, forced: str | None) -> StageDecision:
    nonzero = R.ootb_flavour_has_nonzero(target)
    return _simple("expert_compute", "per_expert_gather", "dense_masked", [R.ootb_gather_pays(spec), nonzero], forced,
                   lambda f: "per expert: gather its tokens, compute, scatter-add" if f
                   else "every expert on every token, masked by the routing weights", force_needs=[nonzero])


def _dispatch(spec: MoESpec, path: str, forced: str | None) -> StageDecision:
    """Expert parallelism's data movement. The plugin path's runner sends each token to the ranks holding its
    experts and back: written straight into the peers' memory where the ranks share an NVLink domain (seed 004),
    else the two-phase NCCL all-to-all (seed 003); an OOTB engine has no collective inside, so each rank's engine
    computes its own experts over every token and the ranks' outputs are summed (an all-reduce)."""
    ep = R.ep_parallel(spec)
    if path == "ootb":
        gates: tuple[Gate, ...] = (ep,)
        allowed = ("allreduce",) if ep.held else ("none",)
    else:
        gates = (ep, R.ep_one_nvlink_domain(spec))
        allowed = (("nvlink", "nccl") if gates[1].held else ("nccl",)) if ep.held else ("none",)
    if forced is not None and forced not in allowed:
        raise MoeBuildError("force", f"dispatch={forced} does not apply to the {path} path with "
                            f"ep_size={spec.ep_size}", allowed)
    choice = forced or allowed[0]
    texts = {"none": "every expert on one GPU",
             "nvlink": f"rows written straight into the other GPUs' memory over NVLink, and back "
                       f"({spec.local_experts} experts per rank)",
             "nccl": f"tokens to the ranks holding their experts and back: counts exchanged first, rows sized "
                     f"exactly, NCCL all-to-all ({spec.local_experts} experts per rank)",
             "allreduce": f"each rank's engine computes its {spec.local_experts} experts over every token; "
                          f"the ranks' outputs are summed"}
    return StageDecision("dispatch", choice, allowed[-1], gates, forced=forced is not None, summary=texts[choice])


def _ep_format(spec: MoESpec, target: Target, dispatch: str, forced: str | None) -> StageDecision:
    """The format the dispatched rows reach a rank's experts in (seed 000), and how their outputs come back.
    contiguous: the received rows with their top-k ids, expanded by the experts' own prologue, each row's
    partial sum returned; permuted / batched (either dispatch's dispatch_with_permute, seed 004): the rows land
    grouped by local expert (padded to pad_multiple, or experts x max rows), the experts run their GEMMs only,
    and every (token, k) row goes back to the token's rank, which weights and sums them in k order."""
    exchanged = dispatch in ("nvlink", "nccl")
    gates: tuple[Gate, ...] = ()
    if not exchanged:
        allowed: tuple[str, ...] = ("none",)
    else:
        det = R.ep_unpermute_deterministic(target)
        able = (R.ep_unpermute_no_fc2_bias(spec), R.ep_unpermute_16bit(spec))
        gates = (det, *able)
        allowed = (("permuted", "batched", "contiguous") if det.held else ("contiguous", "permuted", "batched")) \
            if all(g.held for g in able) else ("contiguous",)
    if forced is not None and forced not in allowed:
        why = _failing(gates[1:])  # the deterministic request only orders the choices
        raise MoeBuildError("force", f"ep_format={forced} does not apply with dispatch={dispatch}"
                            + (f" ({why})" if why else ""), allowed)
    choice = forced or allowed[0]
    texts = {"none": "no rows are exchanged",
             "contiguous": "received rows with their top-k ids; each rank returns one partial sum per token",
             "permuted": "rows land grouped by local expert (dispatch_with_permute); every (token, k) output "
                         "goes back and the token's rank sums them in k order (combine_with_unpermute)",
             "batched": "rows land as local experts x max rows with per-expert counts; every (token, k) output "
                        "goes back and the token's rank sums them in k order"}
    return StageDecision("ep_format", choice, allowed[-1] if exchanged else "none", gates,
                         forced=forced is not None, summary=texts[choice])


def _nccl_exchange(spec: MoESpec, dispatch: str, ep_format: str, tokens: int, forced: str | None) -> StageDecision:
    """How the nccl dispatch sizes its exchanges. exact (seed 003's two phases): the row counts exchanged first and
    read on the host, every buffer sized from them. all_gather: where the caller gives every rank's token count
    (serving loops know them once per step), every rank's tokens go to every rank and each rank's partial sums come
    back in one reduce-scatter, with no count exchange and no host synchronization, up to a bounded pool of rows.
    `tokens`: every rank's tokens of a call together (the rows a rank's experts see)."""
    if dispatch != "nccl":
        if forced not in (None, "none"):
            raise MoeBuildError("force", f"nccl_exchange={forced} does not apply with dispatch={dispatch}", ("none",))
        return StageDecision("nccl_exchange", "none", "none", (), forced=forced is not None,
                             summary="no nccl exchange")
    if forced == "none":
        raise MoeBuildError("force", "nccl_exchange=none does not apply with dispatch=nccl", ("all_gather", "exact"))
    contiguous = R.nccl_all_gather_contiguous(ep_format)
    gates = (contiguous, R.nccl_all_gather_pool(spec, tokens))
    t_max = R.nccl_all_gather_max_tokens(spec) if contiguous.held else 0
    return _token_ranged("nccl_exchange", "all_gather", "exact", gates, t_max, tokens, forced,
                         "every rank's tokens to every rank (an all-gather) and the partial sums back (a "
                         "reduce-scatter), where the call gives every rank's token count",
                         "row counts exchanged first and read on the host, every buffer sized exactly")


def parse_force(items: Iterable[str], field: str = "force") -> dict[str, str]:
    """STAGE=CHOICE items as {stage: choice} (a later item of a stage wins); an item without "=" is refused.
    Which stages and choices exist is make_plan's to check."""
    force: dict[str, str] = {}
    for item in items:
        stage, sep, choice = item.partition("=")
        if not sep:
            raise MoeBuildError(field, f"expected STAGE=CHOICE, got {item!r}", "STAGE=CHOICE")
        force[stage] = choice
    return force


def _check_forced(path: str, force: Mapping[str, str]) -> dict[str, T.GemmTactic]:
    """Refuse a forced stage the path lacks or a choice the stage has not; returns the forced tactics, parsed."""
    allowed = PLUGIN_STAGES if path == "plugin" else OOTB_STAGES
    tactics = {}
    for stage, choice in force.items():
        if stage not in allowed:
            raise MoeBuildError("force", f"stage {stage!r} is not part of the {path} path", allowed)
        if stage in TACTIC_STAGES:
            tactics[stage] = T.GemmTactic.parse(choice)
        elif choice not in STAGE_CHOICES[stage]:
            raise MoeBuildError("force", f"unknown choice {choice!r} for {stage}", STAGE_CHOICES[stage])
    if "w1_order" in force:
        raise MoeBuildError("force", "w1_order follows fc1_activation; force that stage instead",
                            [s for s in PLUGIN_STAGES if s != "w1_order"])
    return tactics


def make_plan(spec: MoESpec, target: Target, tokens: int = 1,
              force: Mapping[str, str] | None = None) -> Plan:
    """Decide the path and every stage for `spec` on `target` at `tokens` tokens.

    `force` maps stage -> choice to pin a decision (for A/B comparisons): a fallback can always
    be forced, a fused choice only where all its gates hold, else `UnsupportedCombination`.
    """
    if not isinstance(tokens, int) or tokens < 1:
        raise MoeBuildError("tokens", f"must be a positive integer, got {tokens!r}", "integers >= 1")
    force = dict(force or {})
    plugin_gates = [R.moe_plugin_enabled(target), R.flavour_supports_plugins(target)]
    if all(g.held for g in plugin_gates):
        checks = [R.plugin_output_dtype_matches(spec), R.plugin_fp8_sm(spec, target), R.plugin_fp4_sm(spec, target),
                  R.plugin_output_not_fp8_fp4(spec)]
        _refuse(checks, "the MoE plugin refuses this combination")
        tactics = _check_forced("plugin", force)
        gemm = _gemm_kernel(spec, target, force.get("gemm_kernel"))
        fc1 = _fc1_activation(spec, target, gemm.choice, tokens, force.get("fc1_activation"),
                              tactics.get("gemm1_tactic"))
        dispatch = _dispatch(spec, "plugin", force.get("dispatch"))
        ep_format = _ep_format(spec, target, dispatch.choice, force.get("ep_format"))
        finalize = _finalize(spec, target, gemm.choice, tokens, force.get("finalize"), ep_format.choice,
                             tactics.get("gemm2_tactic"))
        layout = _weight_layout(spec, target, gemm.choice, force.get("weight_layout"))
        accumulation = _fp8_accumulation(spec, gemm.choice, force.get("fp8_accumulation"))
        calls = _gemm_calls(spec, target, {"gemm_kernel": gemm.choice, "fc1_activation": fc1.choice,
                                           "finalize": finalize.choice, "weight_layout": layout.choice,
                                           "fp8_accumulation": accumulation.choice})
        gemm1_tactic = _tactic("gemm1_tactic", calls["gemm1_tactic"], fc1, tokens, tactics.get("gemm1_tactic"))
        gemm2_tactic = _tactic("gemm2_tactic", calls["gemm2_tactic"], finalize, tokens, tactics.get("gemm2_tactic"))
        layout = _int4_layout(spec, target, layout, (gemm1_tactic, gemm2_tactic), force.get("weight_layout"))
        fc2_prequant = _fc2_prequant(spec, force.get("fc2_prequant"))
        prologue = _routing_prologue(spec, target, tokens, force.get("routing_prologue"))
        expand_rows = _expand_rows(spec, force.get("expand_rows"))
        fc1_input_quant = _fc1_input_quant(spec, force.get("fc1_input_quant"))
        fc2_input_quant = _fc2_input_quant(spec, fc1, finalize, gemm2_tactic, calls["gemm2_tactic"], tokens,
                                           force.get("fc2_input_quant"))
        steps = _row_steps(spec, target, expand_rows, fc1_input_quant, fc1, fc2_input_quant, fc2_prequant)
        stages = (
            prologue,
            expand_rows,
            gemm,
            fc1,
            fc2_prequant,
            finalize,
            _routing(spec, tokens, force.get("routing")),
            fc1_input_quant,
            fc2_input_quant,
            accumulation,
            _w1_order(spec, fc1),
            layout,
            gemm1_tactic,
            gemm2_tactic,
            *(_step_tactic(stage, steps[stage], spec, tokens, force.get(stage)) for stage in STEP_STAGES),
            _token_digits(spec, fc2_prequant.choice, (gemm1_tactic, gemm2_tactic), force.get("token_digits")),
            dispatch,
            ep_format,
            _nccl_exchange(spec, dispatch.choice, ep_format.choice, tokens, force.get("nccl_exchange")),
        )
        # not a refusal: the plan is TensorRT-LLM's matrix on every SM; the report and the runner read whether
        # moe-build's own kernels can run it
        kernels = R.plugin_kernels_for_sm(target)
        return Plan("plugin", tuple(plugin_gates + checks + [kernels]), stages, tokens, spec.to_dict(),
                    target.to_dict())
    checks = [R.ootb_not_weight_only(spec), R.ootb_sm_below_100(target), R.flavour_targets_sm(target),
              R.ootb_quant_implemented(spec), R.ootb_fp8_sm(spec, target), R.ootb_no_lora(spec)]
    reason = _failing(plugin_gates)
    _refuse(checks, f"the OOTB path ({reason}) refuses this combination")
    _check_forced("ootb", force)
    stages = (_expert_compute(spec, target, force.get("expert_compute")), _dispatch(spec, "ootb", force.get("dispatch")))
    return Plan("ootb", tuple(plugin_gates + checks), stages, tokens, spec.to_dict(), target.to_dict())
