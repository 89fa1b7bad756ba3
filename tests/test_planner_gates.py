"""Gate by gate: flip one condition of the seed's fusion matrix and check exactly what changes.

Each row: a base case, one change, the gates whose `held` must flip (and no others), and the
decisions that must change (and no others). Rows whose change makes the planner refuse name the
refusing rule instead. The expectations are the seed's conditions, written here by hand.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from moe_build.errors import UnsupportedCombination
from moe_build.planner import make_plan, rules as R
from moe_build.planner.gates import Plan
from moe_build.planner.plan import MATRIX_STAGES
from moe_build.spec import ActScale, DType, MoESpec, Quant
from moe_build.target import Flavour, MoePlugin, Target

MIXTRAL = MoESpec(4096, 14336, 8, 2, dtype=DType.BF16)
SM90 = Target(sm=90, flavour=Flavour.TENSORRT)
SM80 = Target(sm=80, flavour=Flavour.TENSORRT)
SM89 = Target(sm=89, flavour=Flavour.TENSORRT)
SM100 = Target(sm=100, flavour=Flavour.TENSORRT)
OOTB89 = Target(sm=89, flavour=Flavour.TENSORRT, moe_plugin=MoePlugin.DISABLE)

# Hopper bases plan with Mixtral's intermediate size, >= 2048, where the FINALIZE tactic holds at any
# token count (below 2048 it holds past 4 rows per expert, tokens * top_k > 4 * experts_per_node).
BASES: dict[str, tuple[MoESpec, Target, int]] = {
    "hopper": (MIXTRAL, SM90, 4),
    "ampere": (MIXTRAL, SM80, 16),
    "ada": (MIXTRAL, SM89, 16),
    "hopper_top4": (dataclasses.replace(MIXTRAL, top_k=4), SM90, 2),
    "hopper_256e": (dataclasses.replace(MIXTRAL, num_experts=256), SM90, 4),
    "hopper_fp8": (dataclasses.replace(MIXTRAL, quant=Quant.FP8), SM90, 4),
    "blackwell_fp8": (dataclasses.replace(MIXTRAL, quant=Quant.FP8), SM100, 4),
    "hopper_awq": (dataclasses.replace(MIXTRAL, quant=Quant.W4A16_AWQ, quant_prequant_scales=True), SM90, 4),
    "hopper_w4afp8": (dataclasses.replace(MIXTRAL, quant=Quant.W4AFP8), SM90, 4),
    "tokens256": (MIXTRAL, SM90, 256),
    "ootb": (MIXTRAL, OOTB89, 16),
    "ootb_many_experts": (dataclasses.replace(MIXTRAL, num_experts=64), OOTB89, 16),
}

# (gate, base, spec changes, target changes, tokens, force, gates that flip, decisions that change)
ROWS: list[tuple[str, str, dict, dict, int | None, dict, set[str], dict[str, str]]] = [
    ("moe_plugin", "hopper", {}, {"moe_plugin": MoePlugin.DISABLE, "sm": 89}, None, {},
     None, {"path": "ootb"}),
    ("flavour_plugin_layers", "ada", {}, {"flavour": Flavour.TENSORRT_RTX}, None, {},
     None, {"path": "ootb"}),
    ("prologue_tokens", "tokens256", {}, {}, 257, {},
     {"prologue_tokens", "prologue_blocks"}, {"routing_prologue": "three_step"}),
    ("prologue_top_k", "hopper", {"top_k": 3}, {}, 2, {},
     {"prologue_top_k"}, {"routing_prologue": "three_step"}),
    ("prologue_expert_log", "hopper_256e", {"num_experts": 512}, {}, None, {},
     {"prologue_expert_log"}, {"routing_prologue": "three_step"}),
    ("prologue_not_wfp4a16", "ampere", {"quant": Quant.WFP4A16}, {}, None, {},
     {"prologue_not_wfp4a16", "fused_gated_t_eq_weight", "fused_gated_two_byte", "finalize_tactic",
      "expand_prequant_not_block_scaled"},
     {"routing_prologue": "three_step", "fc1_activation": "separate"}),
    ("expand_w4afp8_not_fp8_input", "hopper_w4afp8", {"fp8_input": True}, {}, None, {},
     {"expand_w4afp8_not_fp8_input"}, {"expand_rows": "plain"}),
    ("tma_ws_sm", "hopper", {}, {"sm": 89}, None, {},
     {"tma_ws_sm", "fc1_not_tma_ws", "finalize_tma_ws", "finalize_sm90_not_wfp4a16", "gated_epilogue_tma_ws",
      "gated_epilogue_sm"},
     {"gemm_kernel": "ampere", "fc1_activation": "fused_gated", "finalize": "separate"}),
    ("tma_ws_specialisation", "hopper", {"dtype": DType.FP32}, {}, None, {},
     {"tma_ws_specialisation", "fc1_not_tma_ws", "finalize_tma_ws", "fused_gated_not_fp32", "fused_gated_two_byte",
      "finalize_tactic", "gated_epilogue_tma_ws", "gated_epilogue_gemm"},
     {"gemm_kernel": "ampere", "fc1_activation": "separate", "finalize": "separate"}),
    ("fc1_not_tma_ws", "hopper", {}, {}, None, {"gemm_kernel": "ampere"},
     {"fc1_not_tma_ws", "finalize_tma_ws", "gated_epilogue_tma_ws"},
     {"gemm_kernel": "ampere", "fc1_activation": "fused_gated", "finalize": "separate"}),
    ("fc1_non_gated", "ampere", {"activation": "silu"}, {}, None, {},
     {"fc1_non_gated", "fc2_prequant_gated"}, {"fc1_activation": "epilogue"}),
    ("fc1_non_gated_on_tma", "hopper", {"activation": "relu"}, {}, None, {},
     {"fc1_non_gated", "fc2_prequant_gated"}, {"fc1_activation": "separate"}),
    ("fused_gated_activation", "ampere", {"activation": "swiglu_clamp"}, {}, None, {},
     {"fused_gated_activation"}, {"fc1_activation": "separate"}),
    ("fused_gated_geglu", "ampere", {"activation": "geglu"}, {}, None, {}, set(), {}),
    ("fused_gated_t_eq_weight", "ampere", {"quant": Quant.W8A16}, {}, None, {},
     {"fused_gated_t_eq_weight", "fused_gated_two_byte"},
     {"fc1_activation": "separate"}),
    ("fused_gated_not_fp32", "ampere", {"dtype": DType.FP32}, {}, None, {},
     {"fused_gated_not_fp32", "fused_gated_two_byte", "tma_ws_specialisation", "finalize_tactic",
      "gated_epilogue_gemm"},
     {"fc1_activation": "separate"}),
    ("fused_gated_not_fp8", "ada", {"quant": Quant.FP8}, {}, None, {},
     {"fused_gated_not_fp8", "fused_gated_t_eq_weight", "fused_gated_two_byte"},
     {"fc1_activation": "separate"}),
    ("fused_gated_k_n_mod_64", "ampere", {"intermediate_size": 14336 + 32}, {}, None, {},
     {"fused_gated_k_n_mod_64"}, {"fc1_activation": "separate"}),
    ("fused_gated_k_mod_64", "ampere", {"hidden_size": 4000}, {}, None, {},
     {"fused_gated_k_n_mod_64"}, {"fc1_activation": "separate"}),
    # moe-build's gated epilogue (not in the seed): W1's gate/up rows interleave in blocks of 8 features.
    ("gated_epilogue_inter_mod_8", "hopper", {"intermediate_size": 14336 + 4}, {}, None, {},
     {"gated_epilogue_inter_mod_8", "fused_gated_k_n_mod_64"}, {"fc1_activation": "separate"}),
    ("gated_epilogue_inter_mod_8_only", "hopper", {"intermediate_size": 14336 + 8}, {}, None, {},
     {"fused_gated_k_n_mod_64"}, {}),
    ("gated_epilogue_sm", "hopper", {}, {"sm": 100}, None, {},
     {"gated_epilogue_sm", "plugin_kernels_sm"}, {"fc1_activation": "separate"}),
    ("gated_epilogue_swiglu_clamp", "hopper", {"activation": "swiglu_clamp"}, {}, None, {},
     {"fused_gated_activation"}, {}),
    # ... and on the weight-only mixed-input wgmma GEMM1, which Mixtral's W4A16 layer runs from 64 tokens (16 rows
    # an expert; the decode kernel below, whose GEMM1 the activation kernel reads); its GEMM2 takes the finalize there
    # as the decode kernel does at 1 token
    ("gated_epilogue_woq_mixed_input", "hopper_awq", {}, {}, 64, {},
     {"gated_epilogue_woq_mixed_input"}, {"fc1_activation": "gated_epilogue"}),
    # ... W4AFP8 too (W4A16's GEMMs) with a static GEMM2 input scale, which the epilogue quantizes by; with per-row
    # scales (the base's) the activation kernel writes GEMM2's input
    ("gated_epilogue_gemm_w4afp8_static", "hopper_w4afp8", {"act_scale": ActScale.STATIC}, {}, 64, {},
     {"gated_epilogue_gemm"}, {"fc1_activation": "gated_epilogue"}),
    # the weight-only finalize in the decode and mixed-input kernels' epilogues only: in groups of 32 GEMM2 leaves the
    # decode kernel for the mma tiles
    ("finalize_woq_not_mixed_input", "hopper_awq", {"quant_group_size": 32}, {}, 64, {},
     {"finalize_tactic_rows"}, {"finalize": "separate"}),
    # W4A16 AWQ with stored scales: moe-build's 16-bit expansion scales the rows it copies (the seed fuses the scale
    # into the expansion for W4AFP8 only); neither holds without the scales
    ("use_awq", "hopper_awq", {"quant": Quant.W8A16}, {}, None, {},
     {"use_awq", "expand_awq_scale_16bit"}, {"fc2_prequant": "none", "expand_rows": "plain"}),
    # AutoAWQ and compressed-tensors fold the AWQ scales into the weights: no pre-quant scales to apply
    ("use_awq", "hopper_awq", {"quant_prequant_scales": False}, {}, None, {},
     {"use_awq", "expand_awq_scale_16bit"}, {"fc2_prequant": "none", "expand_rows": "plain"}),
    ("fc2_prequant_gated", "hopper_awq", {"activation": "silu"}, {}, None, {},
     {"fc2_prequant_gated", "fc1_non_gated"}, {"fc2_prequant": "separate"}),
    ("finalize_topk_deterministic", "hopper_top4", {}, {"deterministic": True}, None, {},
     {"finalize_topk_deterministic"}, {"finalize": "separate"}),
    ("finalize_topk_deterministic_k2", "hopper", {}, {"deterministic": True}, None, {}, set(), {}),
    # below intermediate size 2048: separate on the decode kernel's sizes (256 experts, top-2: 17..512 tokens)
    ("finalize_tactic_rows", "hopper_256e", {"intermediate_size": 1408}, {}, 64, {},
     {"finalize_tactic_rows"}, {"finalize": "separate"}),
    ("finalize_tactic_inter", "hopper_256e", {"intermediate_size": 1984}, {}, 200, {},
     {"finalize_tactic_rows"}, {"finalize": "separate"}),
    # ... but fused on the smallest calls (tokens * top_k <= 32) and past 4 rows per expert (with 8 experts
    # every call of more than 32 rows has more than 4 rows per expert)
    ("finalize_tactic_small_calls", "hopper_256e", {"intermediate_size": 1408}, {}, 16, {}, set(), {}),
    ("finalize_tactic_few_experts", "hopper", {"intermediate_size": 1408}, {}, 64, {}, set(), {}),
    ("finalize_env", "hopper", {}, {"finalize_fusion_disabled_by_env": True}, None, {},
     {"finalize_env"}, {"finalize": "separate"}),
    ("finalize_no_lora", "hopper", {"lora": True}, {}, None, {},
     {"finalize_no_lora"}, {"finalize": "separate"}),
    # moe-build's own: an expert-parallel rank whose rows arrive grouped by expert returns every (token, k) row, and
    # the tokens' ranks do the finalize
    ("finalize_where_experts_run", "hopper", {"ep_size": 2, "ep_rank": 0}, {}, None, {"ep_format": "permuted"},
     {"finalize_where_experts_run"}, {"finalize": "separate"}),
    ("finalize_sm90_not_wfp4a16", "hopper", {"quant": Quant.WFP4A16}, {}, None, {},
     {"prologue_not_wfp4a16", "finalize_sm90_not_wfp4a16", "fused_gated_t_eq_weight", "fused_gated_two_byte",
      "finalize_tactic", "expand_prequant_not_block_scaled"},
     {"routing_prologue": "three_step", "fc1_activation": "separate", "finalize": "separate"}),
    # the FINALIZE GEMM2 tactics: 16-bit (sm90 finalize) and FP8 (fp8 finalize), none for weight-only GEMMs
    # NVFP4 (sm >= 100) has no GEMM of ours with the FINALIZE epilogue; every weight-only quant but wfp4a16 (the
    # seed's own gate) has it on the decode kernel
    ("finalize_tactic", "blackwell_fp8", {"quant": Quant.NVFP4}, {}, None, {},
     {"finalize_tactic", "fused_gated_not_fp8", "expand_prequant_not_block_scaled", "expand_per_expert_act_scale",
      "gated_epilogue_gemm"},
     {"finalize": "separate"}),
    # FP8 with rowwise scales keeps moe-build's gated epilogue on Hopper (the FP8 wgmma GEMM has it); block-128 only
    # where GEMM1 is short (rules.gated_epilogue_block_decode, whose bands test_planner_plan checks), not Mixtral's
    ("finalize_tactic_fp8", "hopper", {"quant": Quant.FP8}, {}, None, {},
     {"fused_gated_not_fp8", "fused_gated_t_eq_weight", "fused_gated_two_byte"}, {}),
    ("finalize_tactic_fp8_block", "hopper_fp8", {"quant": Quant.FP8_BLOCK}, {}, None, {},
     {"expand_prequant_not_block_scaled"}, {"fc1_activation": "separate"}),
    ("ootb_gather_pays", "ootb", {"num_experts": 16}, {}, None, {},
     {"ootb_gather_pays"}, {"expert_compute": "per_expert_gather"}),
    ("ootb_nonzero", "ootb_many_experts", {}, {"flavour": Flavour.TENSORRT_RTX}, None, {},
     {"ootb_nonzero", "flavour_plugin_layers"}, {"expert_compute": "dense_masked"}),
]

# (gate, base, spec changes, target changes): the change makes the planner refuse by this rule.
REFUSALS: list[tuple[str, str, dict, dict]] = [
    ("plugin_output_dtype", "hopper", {"output_dtype": "fp16"}, {}),
    ("plugin_fp8_sm", "ampere", {"quant": Quant.FP8}, {}),
    ("plugin_fp4_sm", "hopper", {"quant": Quant.NVFP4}, {}),
    ("plugin_output_fp8_fp4", "hopper_fp8", {"output_dtype": "fp8"}, {}),
    ("ootb_weight_only_quant", "ootb", {"quant": Quant.W8A16}, {}),
    ("ootb_sm", "ootb", {}, {"sm": 100}),
    ("flavour_sm", "ootb", {}, {"sm": 90, "flavour": Flavour.TENSORRT_RTX}),
    ("ootb_quant_implemented", "ootb", {"quant": Quant.W4AFP8}, {}),
    ("ootb_fp8_sm", "ootb", {"quant": Quant.FP8}, {"sm": 86}),
    ("ootb_lora", "ootb", {"lora": True}, {}),
]


def _apply(base: str, spec_kw: dict, target_kw: dict, tokens: int | None, force: dict | None = None) -> Plan:
    spec, target, base_tokens = BASES[base]
    spec = spec.with_overrides(**{k: _coerce(k, v) for k, v in spec_kw.items()}) if spec_kw else spec
    target = dataclasses.replace(target, **target_kw) if target_kw else target
    return make_plan(spec, target, tokens or base_tokens, force)


def _coerce(key: str, value: Any) -> Any:
    from moe_build.spec import Activation, OutputDType
    if key == "activation" and isinstance(value, str):
        return Activation(value)
    if key == "output_dtype" and isinstance(value, str):
        return OutputDType(value)
    return value


# The seed's matrix (plan.MATRIX_STAGES): the plugin path's fusion stages and the OOTB stage. The weight layouts
# and GEMM tactics that follow from them have tests of their own (test_planner_plan.py, test_planner_tactics.py).


def _held(plan: Plan) -> dict[str, bool]:
    gates = list(plan.path_gates) + [g for s in plan.stages if s.stage in MATRIX_STAGES for g in s.gates]
    return {g.name: g.held for g in gates}


def _decisions(plan: Plan) -> dict[str, str]:
    return {"path": plan.path, **{s: c for s, c in plan.choices().items() if s in MATRIX_STAGES}}


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_flip_changes_exactly_the_expected_decisions(row):
    name, base, spec_kw, target_kw, tokens, force, flips, changes = row
    before = _apply(base, {}, {}, None)
    after = _apply(base, spec_kw, target_kw, tokens, force)
    b, a = _decisions(before), _decisions(after)
    changed = {k: a.get(k) for k in set(a) | set(b) if a.get(k) != b.get(k)}
    if after.path != before.path:
        assert changed.get("path") == changes["path"]
        return
    assert changed == changes, f"{name}: decisions changed {changed}, expected {changes}"
    hb, ha = _held(before), _held(after)
    flipped = {g for g in set(hb) & set(ha) if hb[g] != ha[g]}
    assert flipped == flips, f"{name}: gates flipped {flipped}, expected {flips}"


@pytest.mark.parametrize("row", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_flip_to_refusal_names_the_rule(row):
    rule, base, spec_kw, target_kw = row
    _apply(base, {}, {}, None)  # the base itself plans
    with pytest.raises(UnsupportedCombination) as info:
        _apply(base, spec_kw, target_kw, None)
    assert info.value.rule == rule
    assert info.value.exit_code == 2


def test_prologue_smem_gate_against_the_device_limit():
    spec = dataclasses.replace(MIXTRAL, top_k=8)
    # 2 * T * K * 8 + (E + 1) * 4 bytes: 800 tokens need 102436 B, over sm89's 99 KiB, under sm90's 227 KiB.
    assert R.fused_prologue_smem_bytes(800, 8, 8) == 2 * 800 * 8 * 8 + 9 * 4
    assert not R.prologue_smem(spec, SM89, 800).held
    assert R.prologue_smem(spec, SM90, 800).held
    assert R.prologue_smem(spec, SM89, 256).held


def test_fused_gated_sm_and_block_scaled_rules_in_isolation():
    class OldGpu:  # SM75 is outside moe-build's targets, so build the rule input by hand
        sm = 75
    assert not R.fused_gated_sm(OldGpu()).held and R.fused_gated_sm(SM80).held
    assert not R.expand_prequant_not_block_scaled(dataclasses.replace(MIXTRAL, quant=Quant.NVFP4)).held
    assert R.expand_prequant_not_block_scaled(dataclasses.replace(MIXTRAL, quant=Quant.W4AFP8)).held
    assert R.expand_per_expert_act_scale(dataclasses.replace(MIXTRAL, quant=Quant.NVFP4)).held
    assert not R.expand_per_expert_act_scale(dataclasses.replace(MIXTRAL, quant=Quant.FP8)).held


def test_every_gate_the_planner_emits_is_covered_by_a_row():
    covered = {r[0] for r in ROWS} | {r[0] for r in REFUSALS} | {g for r in ROWS for g in (r[6] or set())}
    covered |= {"prologue_smem", "fused_gated_sm", "expand_prequant_not_block_scaled", "expand_per_expert_act_scale"}
    emitted: set[str] = set()
    for base in BASES:
        plan = _apply(base, {}, {}, None)
        emitted |= set(_held(plan))
    emitted |= set(_held(_apply("ootb", {}, {}, None)))
    assert emitted - covered == set()


def test_tma_ws_sm_set_matches_the_seed():
    held = {sm: R.tma_ws_sm(dataclasses.replace(SM90, sm=sm)).held for sm in (80, 86, 89, 90, 100, 103, 120, 121)}
    assert held == {80: False, 86: False, 89: False, 90: True, 100: True, 103: True, 120: True, 121: True}


def test_expert_log_boundary():
    # floor(log2(E + 1)) + 1 <= 9  <=>  E + 1 < 512  <=>  E <= 510
    ok = MoESpec(64, 64, 510, 2)
    bad = MoESpec(64, 64, 511, 1)
    assert R.prologue_expert_log(ok).held and R.prologue_expert_log(ok).value == 9
    assert not R.prologue_expert_log(bad).held and R.prologue_expert_log(bad).value == 10


def test_ep_size_drives_expert_log():
    spec = MoESpec(64, 64, 1024, 2, ep_size=4)
    assert R.prologue_expert_log(spec).held
    assert not R.prologue_expert_log(dataclasses.replace(spec, ep_size=1)).held
