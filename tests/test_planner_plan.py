"""Plan-level behaviour: token bands, forcing, serialisation, purity."""
from __future__ import annotations

import dataclasses

import pytest

from moe_build.errors import MoeBuildError, UnsupportedCombination
from moe_build.planner import Plan, make_plan, rules as R
from moe_build.planner.gates import StageDecision
from moe_build.spec import DType, MoESpec, Quant
from moe_build.spec.layer import MAX_SIZES
from moe_build.target import Flavour, MoePlugin, Target

SPEC = MoESpec(4096, 14336, 8, 2)
SM90 = Target(sm=90, flavour=Flavour.TENSORRT)


def bands(d: StageDecision) -> list[list]:
    return [b.to_list() for b in d.bands]


@pytest.mark.parametrize("tokens,choice", [(1, "fused"), (256, "fused"), (257, "three_step"), (8192, "three_step")])
def test_prologue_bands(tokens, choice):
    d = make_plan(SPEC, SM90, tokens).stage("routing_prologue")
    assert d.choice == choice and bands(d) == [[1, 256, "fused"], [257, None, "three_step"]]
    assert d.choice_for(100) == "fused" and d.choice_for(300) == "three_step"


def test_prologue_three_step_at_every_count_when_a_static_gate_fails():
    d = make_plan(dataclasses.replace(SPEC, top_k=3), SM90, 1).stage("routing_prologue")
    assert d.choice == "three_step" and bands(d) == [[1, None, "three_step"]]


@pytest.mark.parametrize("tokens,choice", [(1, "prologue"), (4, "prologue"), (5, "separate"), (8192, "separate")])
def test_routing_in_the_prologue_up_to_four_tokens(tokens, choice):
    d = make_plan(SPEC, SM90, tokens).stage("routing")
    assert d.choice == choice and bands(d) == [[1, R.ROUTING_IN_PROLOGUE_MAX_TOKENS, "prologue"], [5, None, "separate"]]
    assert {g.name: g.held for g in d.gates} == {"routing_local": True, "routing_in_prologue_tokens": tokens <= 4}


def test_routing_in_either_prologue_up_to_four_tokens():
    """The three-step prologue's first launch routes too: forced, or where a static gate of the fused one fails
    (top-k 3; WFP4A16, which the matrix keeps off the fused prologue). Its one block counts at most 1024 rows, which
    the largest top-k a spec may have fills at no count the rule allows."""
    for plan in (make_plan(SPEC, SM90, 1, force={"routing_prologue": "three_step"}),
                 make_plan(dataclasses.replace(SPEC, top_k=3), SM90, 1)):
        assert plan.stage("routing_prologue").choice == "three_step"
        d = plan.stage("routing")
        assert d.choice == "prologue" and bands(d) == [[1, 4, "prologue"], [5, None, "separate"]]
    assert R.ROUTING_IN_PROLOGUE_MAX_TOKENS * MAX_SIZES["top_k"] <= 1024


def test_routing_separate_where_the_experts_are_split():
    split = make_plan(MoESpec(256, 128, 64, 4, ep_size=2, ep_rank=0), SM90, 1).stage("routing")  # routed where
    assert split.choice == "separate" and bands(split) == [[1, None, "separate"]]                # the tokens live
    with pytest.raises(UnsupportedCombination) as info:
        make_plan(SPEC, SM90, 16, force={"routing": "prologue"})
    assert info.value.rule == "routing_in_prologue_tokens"
    forced = make_plan(SPEC, SM90, 1, force={"routing": "separate"}).stage("routing")
    assert (forced.choice, forced.forced, bands(forced)) == ("separate", True, [[1, None, "separate"]])


def test_token_independent_stages_hold_for_all_tokens():
    plan = make_plan(SPEC, SM90, 7)
    for name in ("expand_rows", "gemm_kernel", "fc1_activation", "fc2_prequant", "w1_order", "weight_layout"):
        assert bands(plan.stage(name)) == [[1, None, plan.stage(name).choice]]


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
    narrow = dataclasses.replace(SPEC, intermediate_size=768, num_experts=64)  # separate at 17..128 tokens
    plan = make_plan(narrow, SM90, 32, force={"finalize": "fused"})
    d = plan.stage("finalize")
    assert (d.choice, d.forced, bands(d)) == ("fused", True, [[1, None, "fused"]])
    assert not next(g for g in d.gates if g.name == "finalize_tactic_rows").held
    assert make_plan(narrow, SM90, 32).stage("finalize").choice == "separate"


def test_a_forced_tactic_refused_in_one_band_names_the_band_and_its_epilogue():
    # GEMM2's epilogue follows the finalize stage, separate at 17..128 tokens on this narrow layer: an evict_last
    # output (the gated and finalize epilogues' only) cannot be forced at every count, and the error says where
    narrow = dataclasses.replace(SPEC, intermediate_size=768, num_experts=64)
    assert make_plan(narrow, SM90, 32).stage("finalize").choice == "separate"
    with pytest.raises(MoeBuildError) as e:
        make_plan(narrow, SM90, 4096, force={"gemm2_tactic": "wgmma:pingpong64x128:plain:evict_last"})
    msg = str(e.value)
    assert msg.startswith("force: gemm2_tactic=wgmma:pingpong64x128:plain:evict_last: evict_last outputs")
    band = next(b for b in make_plan(narrow, SM90, 32).stage("finalize").bands if b.choice == "separate")
    assert f"at {band.lo}-{band.hi} tokens the GEMM2 epilogue is store" in msg and "\n" not in msg


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


def test_finalize_rule_follows_where_gemm2_leaves_the_decode_kernel():
    """Below intermediate size 2048 the fused finalize starts again exactly where GEMM2, with that epilogue,
    leaves the decode kernel (past 4 rows per expert): the two rules are measured together."""
    narrow = dataclasses.replace(SPEC, intermediate_size=768, num_experts=64)
    plan = make_plan(narrow, SM90, 1)
    last_separate = max(b.hi for b in plan.stage("finalize").bands if b.choice == "separate")
    gemm2 = plan.stage("gemm2_tactic")
    assert gemm2.choice_for(last_separate).startswith("decode:")
    assert gemm2.choice_for(last_separate + 1).startswith("wgmma:")


@pytest.mark.parametrize("experts,top_k,bands", [
    (64, 2, [[1, 16, "fused"], [17, 128, "separate"], [129, None, "fused"]]),   # 32 rows; 4 rows per expert
    (64, 8, [[1, 4, "fused"], [5, 32, "separate"], [33, None, "fused"]]),
    (64, 6, [[1, 5, "fused"], [6, 42, "separate"], [43, None, "fused"]]),      # 30 rows; 252 = 4 x 63 rows
    (64, 12, [[1, 2, "fused"], [3, 21, "separate"], [22, None, "fused"]]),
    (128, 8, [[1, 4, "fused"], [5, 64, "separate"], [65, None, "fused"]]),     # Qwen3-30B-A3B's routing
    (8, 2, [[1, None, "fused"]]),  # 8 experts: past 32 rows every call has more than 4 rows per expert
])
def test_finalize_bands_below_2048_intermediate(experts, top_k, bands):
    spec = dataclasses.replace(SPEC, intermediate_size=2040, top_k=top_k, num_experts=experts)
    for tokens in (1, 16, 300):
        d = make_plan(spec, SM90, tokens).stage("finalize")
        assert [b.to_list() for b in d.bands] == bands
        assert d.choice == d.choice_for(tokens)
    for lo, hi, choice in bands:  # the rule itself at both ends of each band
        for t in (lo, hi or 1 << 20):
            assert R.finalize_fused_at(spec, t) == (choice == "fused"), t


@pytest.mark.parametrize("inter,top_k,tokens", [(2048, 2, 8192), (14336, 12, 1), (2880, 4, 300)])
def test_finalize_fused_at_every_count_from_2048_intermediate(inter, top_k, tokens):
    spec = dataclasses.replace(SPEC, intermediate_size=inter, top_k=top_k, num_experts=max(SPEC.num_experts, top_k))
    d = make_plan(spec, SM90, tokens).stage("finalize")
    assert (d.choice, bands(d)) == ("fused", [[1, None, "fused"]])
    assert d.choice_for(1) == d.choice_for(1 << 20) == "fused"


def test_finalize_static_gate_failure_means_separate_at_every_count():
    d = make_plan(SPEC, dataclasses.replace(SM90, sm=89), 1).stage("finalize")
    assert (d.choice, bands(d)) == ("separate", [[1, None, "separate"]])


# ---- expert parallelism: the dispatch stage ------------------------------------------------------------

@pytest.mark.parametrize("moe_plugin, expected", [("auto", "nvlink"), ("disable", "allreduce")])
def test_dispatch_follows_ep_size_and_path(moe_plugin, expected):
    target = Target(sm=90 if moe_plugin == "auto" else 89, flavour=Flavour.TENSORRT, moe_plugin=MoePlugin(moe_plugin))
    single = make_plan(MoESpec(256, 128, 16, 4), target, 8)
    assert single.stage("dispatch").choice == "none"
    assert not single.stage("dispatch").gates[0].held
    ep = make_plan(MoESpec(256, 128, 16, 4, ep_size=4), target, 8)
    d = ep.stage("dispatch")
    assert d.choice == expected and all(g.held for g in d.gates) and d.gates[0].name == "ep_parallel"
    assert "4 experts per rank" in d.summary or "its 4 experts" in d.summary
    with pytest.raises(MoeBuildError) as info:
        make_plan(MoESpec(256, 128, 16, 4, ep_size=4), target, 8, force={"dispatch": "none"})
    assert info.value.field == "force"
    with pytest.raises(MoeBuildError) as info:
        make_plan(MoESpec(256, 128, 16, 4), target, 8, force={"dispatch": expected})
    assert info.value.field == "force"


def test_dispatch_over_nvlink_within_one_domain_else_nccl():
    target = Target(sm=90, flavour=Flavour.TENSORRT)
    eight = make_plan(MoESpec(256, 128, 64, 4, ep_size=8), target, 8).stage("dispatch")
    sixteen = make_plan(MoESpec(256, 128, 64, 4, ep_size=16), target, 8).stage("dispatch")
    assert (eight.choice, sixteen.choice) == ("nvlink", "nccl")
    assert [(g.name, g.held) for g in sixteen.gates] == [("ep_parallel", True), ("ep_nvlink_domain", False)]
    forced = make_plan(MoESpec(256, 128, 64, 4, ep_size=8), target, 8, force={"dispatch": "nccl"})
    assert forced.stage("dispatch").choice == "nccl" and forced.stage("dispatch").forced
    with pytest.raises(MoeBuildError):
        make_plan(MoESpec(256, 128, 64, 4, ep_size=16), target, 8, force={"dispatch": "nvlink"})


def test_ep_plans_use_the_experts_per_rank():
    # 1024 experts: floor(log2(1025)) + 1 = 11 > 9 refuses the fused prologue; 256 per rank (4 ranks) allows it.
    target = Target(sm=90, flavour=Flavour.TENSORRT)
    whole = make_plan(MoESpec(256, 128, 1024, 2), target, 8)
    split = make_plan(MoESpec(256, 128, 1024, 2, ep_size=4, ep_rank=3), target, 8)
    assert whole.stage("routing_prologue").choice == "three_step"
    assert split.stage("routing_prologue").choice == "fused"


@pytest.mark.parametrize("kw, field", [({"ep_size": 3}, "ep_size"), ({"ep_size": 0}, "ep_size"),
                                        ({"ep_size": 4, "ep_rank": 4}, "ep_rank"),
                                        ({"ep_size": 4, "ep_rank": -1}, "ep_rank"),
                                        ({"ep_size": 4, "ep_rank": True}, "ep_rank")])
def test_ep_fields_are_checked(kw, field):
    with pytest.raises(MoeBuildError) as info:
        MoESpec(256, 128, 16, 4, **kw)
    assert info.value.field == field


def test_rank_spec_holds_its_experts():
    spec = MoESpec(256, 128, 16, 4, ep_size=4)
    assert (spec.local_experts, spec.stored_experts, spec.first_local_expert) == (4, 16, 0)
    r2 = spec.for_rank(2)
    assert (r2.local_experts, r2.stored_experts, r2.first_local_expert) == (4, 4, 8)
    assert MoESpec.from_dict(r2.to_dict()) == r2


@pytest.mark.parametrize("quant", ["fp8_block", "fp8"])
def test_fp8_gemm2_input_quantized_in_the_activation_at_every_count(quant: str) -> None:
    """rules.fc2_quant_in_activation: where the activation runs as a kernel, it quantizes GEMM2's input at every
    count, 1 token included (one band); forcing the separate quantize kernel holds at every count."""
    from moe_build.spec import Quant
    force = {"fc1_activation": "separate"}
    spec = MoESpec(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8, quant=Quant(quant))
    for tokens in (1, 2, 4096):
        d = make_plan(spec, SM90, tokens=tokens, force=force).stage("fc2_input_quant")
        assert d.choice == "fc1_activation" and {b.choice for b in d.bands} == {"fc1_activation"}, tokens
        assert next(g for g in d.gates if g.name == "fc1_activation_kernel").held
    for forced in ("separate", "fc1_activation"):
        d = make_plan(spec, SM90, tokens=1, force={**force, "fc2_input_quant": forced}).stage("fc2_input_quant")
        assert d.choice == forced and {b.choice for b in d.bands} == {forced}
    plain = make_plan(dataclasses.replace(spec, quant=Quant.NONE), SM90).stage("fc2_input_quant")
    assert plain.choice == "none"


def test_fp8_rowwise_gemm1_runs_the_gated_epilogue_on_sm90() -> None:
    """rules.gated_epilogue_gemm: an FP8 layer with rowwise scales runs the gated activation in GEMM1's epilogue
    on sm90 (W1 interleaved), so the activation kernel, which could quantize GEMM2's input, does not run (forcing it
    there is refused); sm89 keeps the activation kernel (block-128 scales: the next test)."""
    from moe_build.spec import Quant
    spec = MoESpec(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8, quant=Quant.FP8)
    for tokens in (1, 2, 4096):
        plan = make_plan(spec, SM90, tokens=tokens)
        assert plan.stage("fc1_activation").choice == "gated_epilogue"
        assert plan.stage("w1_order").choice == "gate_up_interleaved"
        d = plan.stage("fc2_input_quant")
        assert d.choice != "fc1_activation" and "fc1_activation" not in {b.choice for b in d.bands}, tokens
        assert not next(g for g in d.gates if g.name == "fc1_activation_kernel").held
    with pytest.raises(MoeBuildError, match="fc2_input_quant"):
        make_plan(spec, SM90, force={"fc2_input_quant": "fc1_activation"})
    assert make_plan(spec, Target(sm=89, flavour=Flavour.TENSORRT)).stage("fc1_activation").choice == "separate"


@pytest.mark.parametrize("hidden,inter,experts,top_k,last", [
    (2048, 768, 128, 8, 3),  # Qwen3-30B-A3B: 25 MB of W1 a touched expert, 3 x 8 x 25 MB <= 80 MiB
    (2048, 1408, 64, 6, 2),  # DeepSeek-V2-Lite
    (2880, 2880, 32, 4, 1),  # GPT-OSS-20B: 66 MB at 1 token
    (7168, 2048, 256, 8, 0),  # DeepSeek-V3: 235 MB at 1 token
    (4096, 14336, 8, 2, 0),  # Mixtral-8x7B: I past FP8_QUANTIZING_MAX_K (and 235 MB at 1 token)
    (2048, 1416, 64, 6, 2)])  # I not a multiple of 64: no gate/up halves on the wgmma kernel
def test_fp8_block128_gated_epilogue_where_gemm1_is_short_or_wgmma(hidden, inter, experts, top_k, last) -> None:
    """rules.gated_epilogue_block_decode / gated_epilogue_block_wgmma: block-128 scales run GEMM1's gated epilogue (W1
    stacked, rules.w1_interleaved) at the counts where GEMM1 runs the decode kernel, GEMM2 can quantize its input
    (I <= FP8_QUANTIZING_MAX_K) and GEMM1 reads at most FP8_BLOCK_GATED_MAX_GEMM1_BYTES of touched experts' W1 (tokens
    1..`last`; 0: never), GEMM2 quantizing its input there, and at every count where GEMM1 runs the pingpong 64x128
    wgmma tile where I is a multiple of 64 (the gate/up halves), the quantize step after it; the activation kernel
    between and on the coop 128x128 tile past them. GEMM1's tactic follows the epilogue. Forcing the gated epilogue
    (it cannot hold at every count) or the activation kernel's quantization where the gated epilogue is planned is
    refused; forcing the activation kernel gives one band; forcing a pingpong 64x128 GEMM1 gives the gated epilogue
    at every count where I takes the halves, else refuses it."""
    spec = MoESpec(hidden_size=hidden, intermediate_size=inter, num_experts=experts, top_k=top_k,
                   quant=Quant.FP8_BLOCK)
    assert min(experts, last * top_k) * 2 * inter * hidden <= R.FP8_BLOCK_GATED_MAX_GEMM1_BYTES
    halves = inter % 64 == 0
    plan = make_plan(spec, SM90, tokens=1)
    d = plan.stage("fc1_activation")
    gate = next(g for g in d.gates if g.name == "gated_epilogue_block128_decode")
    assert gate.token_dependent and gate.held == (last > 0)
    assert plan.stage("w1_order").choice == "stacked"
    gemm1 = plan.stage("gemm1_tactic").bands
    wgmma = next(b.lo for b in gemm1 if b.choice.startswith("wgmma:pingpong64x128:"))
    coop = next(b.lo for b in gemm1 if b.choice.startswith("wgmma:coop128x128:"))
    assert last + 1 < wgmma < coop
    fc1 = ([[1, last, "gated_epilogue"]] if last else []) + [[last + 1, wgmma - 1 if halves else None, "separate"]] \
        + ([[wgmma, coop - 1, "gated_epilogue"], [coop, None, "separate"]] if halves else [])
    fc2 = ([[1, last, "gemm2"]] if last else []) + [[last + 1, wgmma - 1 if halves else None, "fc1_activation"]] \
        + ([[wgmma, coop - 1, "separate"], [coop, None, "fc1_activation"]] if halves else [])
    assert bands(d) == fc1
    assert bands(plan.stage("fc2_input_quant")) == fc2
    assert d.choice == ("gated_epilogue" if last else "separate")
    for tokens in (1, last, last + 1, wgmma - 1, wgmma, coop - 1, coop, 4096):
        if tokens < 1:
            continue
        c = plan.choices(tokens)
        assert (c["fc1_activation"] == "gated_epilogue") == (tokens <= last or (halves and wgmma <= tokens < coop))
        assert c["gemm1_tactic"].startswith("decode:") == (tokens < wgmma)
    at_4096 = make_plan(spec, SM90, tokens=4096).stage("fc1_activation")
    assert not next(g for g in at_4096.gates if g.name == "gated_epilogue_block128_wgmma").held
    if last:
        with pytest.raises(UnsupportedCombination, match="fc2_input_quant=fc1_activation"):
            make_plan(spec, SM90, force={"fc2_input_quant": "fc1_activation"})
    with pytest.raises(UnsupportedCombination, match="gated_epilogue_block128_decode"):
        make_plan(spec, SM90, force={"fc1_activation": "gated_epilogue"})
    separate = make_plan(spec, SM90, tokens=1, force={"fc1_activation": "separate"})
    assert bands(separate.stage("fc1_activation")) == [[1, None, "separate"]]
    assert bands(separate.stage("fc2_input_quant")) == [[1, None, "fc1_activation"]]
    assert separate.stage("w1_order").choice == "stacked"
    on_wgmma = make_plan(spec, SM90, tokens=1, force={"gemm1_tactic": "wgmma:pingpong64x128:plain:plain"})
    assert bands(on_wgmma.stage("fc1_activation")) == [[1, None, "gated_epilogue" if halves else "separate"]]


def test_fp8_gemm2_quantizes_its_input_where_it_runs_the_decode_kernel() -> None:
    """rules.fc2_quant_after_gated_epilogue / fc2_quant_gemm2_k / fc2_quant_gemm2_call / fc2_quant_gemm2_waves:
    after GEMM1's gated epilogue, GEMM2 quantizes its own input at exactly the counts where its tactic is the decode
    kernel with the finalize fused and its CTAs (touched experts x column blocks) are at most 8 an SM, and the
    separate quantize kernel runs at the others (bands over every count); forced, it must hold at every count where
    GEMM2 runs the decode kernel, however many CTAs; an intermediate size past FP8_QUANTIZING_MAX_K and a separate
    finalize keep the quantize kernel (the activation kernel's, where it runs)."""
    from moe_build.planner import rules as R
    from moe_build.spec import Quant
    spec = MoESpec(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8, quant=Quant.FP8)
    plan = make_plan(spec, SM90, tokens=1)
    d, tactic = plan.stage("fc2_input_quant"), plan.stage("gemm2_tactic")
    assert d.choice == "gemm2" and tactic.choice.startswith("decode:")
    limit = R.FP8_QUANTIZING_MAX_CTAS_PER_SM * SM90.sm_count
    for tokens in range(1, 300):
        gemm2 = plan.choices(tokens)["gemm2_tactic"]
        ctas = min(128, 8 * tokens) * -(-2048 // (16 * 8 // int(gemm2.split(":")[1][len("ksplit"):]))) \
            if gemm2.startswith("decode:") else None
        here = "gemm2" if ctas is not None and ctas <= limit else "separate"
        assert plan.choices(tokens)["fc2_input_quant"] == here, (tokens, gemm2, ctas)
    assert [b.choice for b in d.bands] == ["gemm2", "separate"]
    assert any(plan.choices(t)["gemm2_tactic"].startswith("decode:") for t in range(d.bands[0].hi + 1, 300))
    call, waves = (next(g for g in d.gates if g.name == n) for n in ("gemm2_quantizing_call", "gemm2_quantizing_waves"))
    assert call.held and waves.held and call.token_dependent and waves.token_dependent
    assert "finalize=fused" in call.value
    assert make_plan(spec, SM90, tokens=4096).stage("fc2_input_quant").choice == "separate"
    # forced: only where every count's GEMM2 is the decode kernel
    with pytest.raises(MoeBuildError, match="gemm2_quantizing_call.*gemm2_tactic=decode"):
        make_plan(spec, SM90, force={"fc2_input_quant": "gemm2"})
    pinned = make_plan(spec, SM90, tokens=4096, force={"fc2_input_quant": "gemm2",
                                                        "gemm2_tactic": "decode:ksplit1:after_trigger:plain"})
    assert pinned.stage("fc2_input_quant").choice == "gemm2" and pinned.stage("fc2_input_quant").forced
    assert not next(g for g in pinned.stage("fc2_input_quant").gates if g.name == "gemm2_quantizing_waves").held
    # (block-128 scales with a forced activation kernel, and a forced activation kernel: the activation kernel)
    for other, force, here in ((dataclasses.replace(spec, quant=Quant.FP8_BLOCK), {"fc1_activation": "separate"},
                                "fc1_activation"),
                               (dataclasses.replace(spec, intermediate_size=R.FP8_QUANTIZING_MAX_K + 128), {},
                                "separate"),
                               (spec, {"finalize": "separate"}, "separate"),
                               (spec, {"fc1_activation": "separate"}, "fc1_activation")):
        d = make_plan(other, SM90, tokens=1, force=force).stage("fc2_input_quant")
        assert d.choice == here and "gemm2" not in {b.choice for b in d.bands}, (other, force)
    with pytest.raises(MoeBuildError, match="gemm2_quantizing_k"):
        make_plan(dataclasses.replace(spec, intermediate_size=R.FP8_QUANTIZING_MAX_K + 128), SM90,
                  force={"fc2_input_quant": "gemm2", "gemm2_tactic": "decode:ksplit1:after_trigger:plain"})


def test_fp8_static_scale_quantized_in_gemm1s_epilogue() -> None:
    """rules.fc2_quant_static_scale: with a static GEMM2 input scale (ModelOpt per-tensor FP8) GEMM1's gated epilogue
    writes GEMM2's FP8 input at every count, its four gates shown; a dynamic scale keeps the decode-band gemm2 /
    separate bands; block-128 and the activation kernel keep their forms; forcing gemm1 where a gate fails is
    refused naming the gate and the field."""
    from moe_build.spec import ActScale
    spec = MoESpec(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8, quant=Quant.FP8,
                   act_scale=ActScale.STATIC)
    plan = make_plan(spec, SM90, tokens=1)
    d = plan.stage("fc2_input_quant")
    assert d.choice == "gemm1" and not d.forced and bands(d) == [[1, None, "gemm1"]]
    gates = {g.name: g for g in d.gates}
    assert all(gates[n].held for n in ("fp8_gemms", "fp8_rowwise_scales", "fc2_static_scale", "gemm1_gated_epilogue"))
    assert gates["fc2_static_scale"].value == "static"
    assert {plan.choices(t)["fc2_input_quant"] for t in (1, 16, 256, 4096, 8192)} == {"gemm1"}
    dynamic = dataclasses.replace(spec, act_scale=ActScale.DYNAMIC)
    assert {make_plan(dynamic, SM90, tokens=t).stage("fc2_input_quant").choice for t in (1, 4096)} == \
        {"gemm2", "separate"}
    with pytest.raises(UnsupportedCombination, match="fc2_static_scale=dynamic") as info:
        make_plan(dynamic, SM90, force={"fc2_input_quant": "gemm1"})
    assert info.value.field == "act_scale"
    with pytest.raises(UnsupportedCombination, match="gemm1_gated_epilogue"):
        make_plan(spec, SM90, force={"fc2_input_quant": "gemm1", "fc1_activation": "separate"})
    assert make_plan(spec, SM90, tokens=16, force={"fc1_activation": "separate"}).stage("fc2_input_quant").choice \
        == "fc1_activation"
    assert make_plan(spec, SM90, tokens=16, force={"fc2_input_quant": "separate"}).stage("fc2_input_quant").choice \
        == "separate"


def test_fp8_quantizing_max_k_is_the_librarys() -> None:
    """rules.FP8_QUANTIZING_MAX_K is the kernel library's MB_FP8_QUANTIZING_MAX_K (the planner reads no library)."""
    import re
    from pathlib import Path
    from moe_build.planner import rules as R
    header = (Path(__file__).parents[1] / "cpp" / "include" / "moe_build_kernels.h").read_text()
    assert int(re.search(r"#define MB_FP8_QUANTIZING_MAX_K (\d+)", header).group(1)) == R.FP8_QUANTIZING_MAX_K


def test_fp8_accumulation_is_fast_with_rowwise_scales_on_the_wgmma_kernel() -> None:
    """rules.fp8_rowwise_scales / fp8_wgmma_kernel: the FP8 wgmma GEMMs accumulate fast (TensorRT-LLM's Hopper FP8
    MoE schedule) with rowwise scales, promoted with block-128 scales (which scale each 128-k block's sum as it is
    promoted) or on the Ampere kernel; "none" without FP8 GEMMs. Forcing promoted always holds, fast only where both
    gates do, none never on an FP8 layer."""
    from moe_build.spec import Quant
    spec = MoESpec(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8, quant=Quant.FP8)
    d = make_plan(spec, SM90, tokens=16).stage("fp8_accumulation")
    assert (d.choice, d.fallback, d.forced) == ("fast", "promoted", False)
    assert bands(d) == [[1, None, "fast"]]
    assert [(g.name, g.held) for g in d.gates] == [("fp8_gemms", True), ("fp8_wgmma_kernel", True),
                                                   ("fp8_rowwise_scales", True)]
    forced = make_plan(spec, SM90, tokens=16, force={"fp8_accumulation": "promoted"}).stage("fp8_accumulation")
    assert (forced.choice, forced.forced) == ("promoted", True)
    ampere = make_plan(spec, SM90, tokens=16, force={"gemm_kernel": "ampere"}).stage("fp8_accumulation")
    assert ampere.choice == "promoted" and not next(g for g in ampere.gates if g.name == "fp8_wgmma_kernel").held
    block = dataclasses.replace(spec, quant=Quant.FP8_BLOCK)
    d = make_plan(block, SM90, tokens=16).stage("fp8_accumulation")
    assert d.choice == "promoted" and not next(g for g in d.gates if g.name == "fp8_rowwise_scales").held
    with pytest.raises(UnsupportedCombination, match="fp8_rowwise_scales=fp8_block fails .quant == fp8.") as info:
        make_plan(block, SM90, tokens=16, force={"fp8_accumulation": "fast"})
    assert info.value.field == "quant"  # the one-line error names the user's field
    with pytest.raises(MoeBuildError, match="fp8_accumulation=none"):
        make_plan(spec, SM90, tokens=16, force={"fp8_accumulation": "none"})
    plain = dataclasses.replace(spec, quant=Quant.NONE)
    assert make_plan(plain, SM90).stage("fp8_accumulation").choice == "none"
    with pytest.raises(UnsupportedCombination, match="fp8_gemms"):
        make_plan(plain, SM90, force={"fp8_accumulation": "promoted"})
    w4afp8 = dataclasses.replace(spec, quant=Quant.W4AFP8)  # FP8 activations, but the weight-only GEMMs
    assert make_plan(w4afp8, SM90).stage("fp8_accumulation").choice == "none"


def test_expand_rows_fuses_the_awq_scale_for_w4a16_with_stored_scales() -> None:
    """moe-build's gate beside the seed's: a W4A16 AWQ layer that stores its pre-quant scales scales GEMM1's rows in
    the 16-bit expansion; without the scales (AutoAWQ, compressed-tensors fold them) or for W8A16 the expansion is
    plain, and forcing the fusion there names the rule that fails for that quant mode (W4AFP8: the seed's)."""
    awq = dataclasses.replace(SPEC, quant=Quant.W4A16_AWQ, quant_prequant_scales=True)
    d = make_plan(awq, SM90, 16).stage("expand_rows")
    held = {g.name: g.held for g in d.gates}
    assert d.choice == "prequant_fused" and held["expand_awq_scale_16bit"] and not held["expand_w4afp8_not_fp8_input"]
    assert make_plan(awq, SM90, 16, force={"expand_rows": "plain"}).stage("expand_rows").choice == "plain"
    folded = dataclasses.replace(awq, quant_prequant_scales=False)
    assert make_plan(folded, SM90, 16).stage("expand_rows").choice == "plain"
    with pytest.raises(UnsupportedCombination, match="expand_awq_scale_16bit"):
        make_plan(dataclasses.replace(SPEC, quant=Quant.W8A16), SM90, 16, force={"expand_rows": "prequant_fused"})
    w4afp8 = dataclasses.replace(SPEC, quant=Quant.W4AFP8, fp8_input=True)
    with pytest.raises(UnsupportedCombination, match="expand_w4afp8_not_fp8_input"):
        make_plan(w4afp8, SM90, 16, force={"expand_rows": "prequant_fused"})


@pytest.mark.parametrize("quant", [Quant.W4A16_AWQ, Quant.W8A16])
@pytest.mark.parametrize("hidden,inter,experts,top_k", [(4096, 14336, 8, 2), (2048, 1408, 64, 6), (2048, 768, 128, 8)])
def test_weight_only_gated_epilogue_where_gemm1_runs_the_mixed_input_kernel(quant, hidden, inter, experts,
                                                                           top_k) -> None:
    """rules.gated_epilogue_woq_mixed: int4 / int8 layers with 16-bit activations run the gated activation in GEMM1's
    epilogue exactly at the counts where GEMM1's tactic is a mixed-input wgmma tile (one band from there up), and the
    activation kernel below it; W1 interleaved for every count (rules.w1_interleaved: a gated band exists). Forcing the
    gated epilogue is refused at the first separate count; forcing it off gives one band and W1 stacked."""
    spec = MoESpec(hidden_size=hidden, intermediate_size=inter, num_experts=experts, top_k=top_k, quant=quant)
    plan = make_plan(spec, SM90, tokens=4096)
    d = plan.stage("fc1_activation")
    assert d.choice == "gated_epilogue" and plan.stage("w1_order").choice == "gate_up_interleaved"
    assert [b[2] for b in bands(d)] == ["separate", "gated_epilogue"] and bands(d)[-1][1] is None
    first = bands(d)[1][0]
    for tokens in (1, first - 1, first, 4096):
        c = plan.choices(tokens)
        wgmma = c["gemm1_tactic"].split(":")[1].startswith("woq128x")
        assert (c["fc1_activation"] == "gated_epilogue") == wgmma == (tokens >= first), (tokens, c["gemm1_tactic"])
    with pytest.raises(UnsupportedCombination, match="fc1_activation=gated_epilogue.*at 1 tokens.*gemm1=decode:"):
        make_plan(spec, SM90, force={"fc1_activation": "gated_epilogue"})
    off = make_plan(spec, SM90, tokens=4096, force={"fc1_activation": "separate"})
    assert bands(off.stage("fc1_activation")) == [[1, None, "separate"]]
    assert off.stage("w1_order").choice == "stacked"
    # a GEMM1 tactic forced off the mixed-input kernel at every count leaves the activation kernel at every count
    digits = make_plan(spec, SM90, tokens=4096, force={"gemm1_tactic": "decode:ksplit1:after_trigger:plain"})
    assert bands(digits.stage("fc1_activation")) == [[1, None, "separate"]]
    wgmma = make_plan(spec, SM90, tokens=1, force={"gemm1_tactic": "wgmma:woq128x64:plain:plain"})
    assert bands(wgmma.stage("fc1_activation")) == [[1, None, "gated_epilogue"]]


@pytest.mark.parametrize("quant, dtype", [(Quant.WFP4A16, DType.FP16), (Quant.W4AFP8, DType.BF16)])
def test_no_weight_only_gated_epilogue_for_fp16_mxfp4_or_fp8_activations(quant, dtype) -> None:
    """MXFP4 with fp16 activations has no mixed-input kernel (its e5m2 form takes bf16 scales) and W4AFP8's
    activation quantizes GEMM2's input per row: the activation kernel at every count, W1 stacked."""
    plan = make_plan(MoESpec(2048, 768, 128, 8, quant=quant, dtype=dtype), SM90, tokens=4096)
    assert bands(plan.stage("fc1_activation")) == [[1, None, "separate"]]
    assert plan.stage("w1_order").choice == "stacked"


def test_bf16_mxfp4_takes_the_gated_epilogue_on_its_mixed_input_band() -> None:
    """MXFP4 with bf16 activations runs the mixed-input GEMM1 (its e5m2 form) past a decode band of 7 rows per
    expert, with the gated activation in the epilogue there; W1 interleaved for it, which the decode band's activation
    kernel reads too."""
    plan = make_plan(MoESpec(2048, 768, 128, 8, quant=Quant.WFP4A16, dtype=DType.BF16), SM90, tokens=4096)
    assert bands(plan.stage("fc1_activation")) == [[1, 112, "separate"], [113, None, "gated_epilogue"]]
    assert plan.stage("gemm1_tactic").choice_for(113) == "wgmma:woq128x32:plain:plain"
    assert plan.stage("w1_order").choice == "gate_up_interleaved"


def test_mxfp4_plan_names_the_runners_weight_copies() -> None:
    """The runner holds MXFP4 weights again, beside the stored form, for each kind of band its plan runs (the
    quarters order for the digits tile, e5m2 for the mixed-input kernel): each GEMM's summary names the copies its
    bands take and no other (fp16 activations have no mixed-input band, so no e5m2 copy)."""
    for dtype, e5m2 in ((DType.BF16, True), (DType.FP16, False)):
        plan = make_plan(MoESpec(2048, 768, 128, 8, quant=Quant.WFP4A16, dtype=dtype), SM90, tokens=4096)
        for stage in ("gemm1_tactic", "gemm2_tactic"):
            d = plan.stage(stage)
            assert any(choice.split(":")[1].startswith("digits") for _, _, choice in bands(d)), d.bands
            assert "quarters order" in d.summary and ("as e5m2" in d.summary) == e5m2, (dtype, d.summary)
