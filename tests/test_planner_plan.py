"""Plan-level behaviour: token ranges, forcing, serialisation, purity."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from moe_build.errors import MoeBuildError, UnsupportedCombination
from moe_build.planner import Plan, make_plan, rules as R
from moe_build.spec import MoESpec
from moe_build.target import Flavour, MoePlugin, Target

SPEC = MoESpec(4096, 14336, 8, 2)
SM90 = Target(sm=90, flavour=Flavour.TENSORRT)


@pytest.mark.parametrize("tokens,choice,rng,outside", [
    (1, "fused", (1, 256), "three_step"),
    (256, "fused", (1, 256), "three_step"),
    (257, "three_step", (257, None), "fused"),
    (8192, "three_step", (257, None), "fused"),
])
def test_prologue_token_range(tokens, choice, rng, outside):
    d = make_plan(SPEC, SM90, tokens).stage("routing_prologue")
    assert (d.choice, d.token_range, d.choice_outside_range) == (choice, rng, outside)
    assert d.choice_for(100) == "fused" and d.choice_for(300) == "three_step"


def test_prologue_unbounded_three_step_when_a_static_gate_fails():
    d = make_plan(dataclasses.replace(SPEC, top_k=3), SM90, 1).stage("routing_prologue")
    assert (d.choice, d.token_range, d.choice_outside_range) == ("three_step", (1, None), None)


def test_token_independent_stages_hold_for_all_tokens():
    plan = make_plan(SPEC, SM90, 7)
    for name in ("expand_rows", "gemm_kernel", "fc1_activation", "fc2_prequant"):
        assert plan.stage(name).token_range == (1, None)


def test_force_fallback_is_always_allowed_and_marked():
    plan = make_plan(SPEC, SM90, 16, force={"finalize": "separate", "routing_prologue": "three_step"})
    assert plan.stage("finalize").choice == "separate" and plan.stage("finalize").forced
    assert plan.stage("routing_prologue").choice == "three_step"


def test_force_fused_where_a_gate_fails_is_refused_with_the_gate():
    with pytest.raises(UnsupportedCombination) as info:
        make_plan(SPEC, dataclasses.replace(SM90, sm=80), 16, force={"finalize": "fused"})
    assert info.value.rule == "finalize_tma_ws"
    with pytest.raises(UnsupportedCombination) as info:
        make_plan(SPEC, SM90, 300, force={"routing_prologue": "fused"})
    assert info.value.rule == "prologue_tokens"


def test_force_fused_finalize_overrides_only_the_tactic_gate():
    narrow = dataclasses.replace(SPEC, intermediate_size=768)
    plan = make_plan(narrow, SM90, 32, force={"finalize": "fused"})
    d = plan.stage("finalize")
    assert (d.choice, d.forced, d.token_range) == ("fused", True, (1, None))
    assert not next(g for g in d.gates if g.name == "finalize_tactic_rows").held
    assert make_plan(narrow, SM90, 32).stage("finalize").choice == "separate"


def test_force_unknown_stage_or_choice():
    with pytest.raises(MoeBuildError, match="force"):
        make_plan(SPEC, SM90, 1, force={"expert_compute": "dense_masked"})
    with pytest.raises(MoeBuildError, match="allowed"):
        make_plan(SPEC, SM90, 1, force={"finalize": "maybe"})


def test_plan_round_trips_through_dict():
    plan = make_plan(SPEC, SM90, 16, force={"gemm_kernel": "ampere"})
    again = Plan.from_dict(plan.to_dict())
    assert again == plan


def test_planner_is_pure():
    a = make_plan(SPEC, SM90, 16).to_dict()
    b = make_plan(SPEC, SM90, 16).to_dict()
    assert a == b


def test_bad_token_count():
    with pytest.raises(MoeBuildError, match="tokens"):
        make_plan(SPEC, SM90, 0)


def test_cost_rule_does_not_block_forcing_but_capability_does():
    ootb = Target(sm=89, flavour=Flavour.TENSORRT, moe_plugin=MoePlugin.DISABLE)
    d = make_plan(SPEC, ootb, 1, force={"expert_compute": "per_expert_gather"}).stage("expert_compute")
    assert d.choice == "per_expert_gather" and d.forced  # 8 experts / top-2 does not pay, but it can run
    rtx = dataclasses.replace(ootb, flavour=Flavour.TENSORRT_RTX)
    with pytest.raises(UnsupportedCombination) as info:
        make_plan(SPEC, rtx, 1, force={"expert_compute": "per_expert_gather"})
    assert info.value.rule == "ootb_nonzero"


def test_finalize_rule_starts_where_the_gemms_leave_the_decode_kernel():
    """The narrow shapes' FINALIZE rule is measured against the GEMM path rule; the two bounds must agree."""
    src = (Path(__file__).resolve().parents[1] / "cpp" / "src" / "gemm_common.cuh").read_text()
    bound = re.search(r"kDecodeMaxAvgRows\s*=\s*(\d+);", src)
    assert bound is not None and int(bound.group(1)) == R.DECODE_MAX_ROWS_PER_EXPERT


@pytest.mark.parametrize("top_k,tokens,choice,rng,outside", [  # 8 experts (12 for top-12)
    (2, 32, "separate", (1, 32), "fused"),      # 64 rows: 8 per expert, the decode kernel's last size
    (2, 33, "fused", (33, None), "separate"),   # 66 rows
    (2, 8192, "fused", (33, None), "separate"),
    (8, 1, "separate", (1, 8), "fused"),
    (8, 9, "fused", (9, None), "separate"),     # 72 rows
    (6, 10, "separate", (1, 10), "fused"),      # 60 rows
    (6, 11, "fused", (11, None), "separate"),   # 66 rows
    (12, 8, "separate", (1, 8), "fused"),       # 96 rows over 12 experts
    (12, 9, "fused", (9, None), "separate"),
])
def test_finalize_token_range_below_2048_intermediate(top_k, tokens, choice, rng, outside):
    spec = dataclasses.replace(SPEC, intermediate_size=2040, top_k=top_k, num_experts=max(SPEC.num_experts, top_k))
    d = make_plan(spec, SM90, tokens).stage("finalize")
    assert (d.choice, d.token_range, d.choice_outside_range) == (choice, rng, outside)
    lo = rng[0] if choice == "fused" else rng[1] + 1  # the first count with the fused epilogue
    assert (d.choice_for(lo - 1), d.choice_for(lo), d.choice_for(1 << 20)) == ("separate", "fused", "fused")


@pytest.mark.parametrize("inter,top_k,tokens", [(2048, 2, 8192), (14336, 12, 1), (2880, 4, 300)])
def test_finalize_fused_at_every_count_from_2048_intermediate(inter, top_k, tokens):
    spec = dataclasses.replace(SPEC, intermediate_size=inter, top_k=top_k, num_experts=max(SPEC.num_experts, top_k))
    d = make_plan(spec, SM90, tokens).stage("finalize")
    assert (d.choice, d.token_range, d.choice_outside_range) == ("fused", (1, None), None)
    assert d.choice_for(1) == d.choice_for(1 << 20) == "fused"


def test_finalize_static_gate_failure_means_separate_at_every_count():
    d = make_plan(SPEC, dataclasses.replace(SM90, sm=89), 1).stage("finalize")
    assert (d.choice, d.token_range, d.choice_outside_range) == ("separate", (1, None), None)
