"""The weight-only bench's pure parts on a CPU: its layers (group sizes that divide every K), the stored bytes its
floor counts (worked by hand), the targets it marks, and its one-line refusals (the timing runs on a GPU only)."""
from __future__ import annotations

import random

import pytest
import torch

from cli_process import assert_one_line_error, run_moe_build
from moe_build.bench import woq_layer
from moe_build.bench.layer import runner_force
from moe_build.bench.workload import SHAPES, InputSet, bench_spec, check_rows, reference_by_experts
from moe_build.planner import make_plan
from moe_build.spec import ActScale, Quant
from moe_build.target import Flavour, Target
from moe_build.weights import MoEWeights
from moe_build.weights.woq import WoqKind


@pytest.mark.parametrize("name", list(SHAPES))
def test_bench_layers_have_groups_that_divide_both_gemms_k(name: str) -> None:
    spec = bench_spec(name)
    group = woq_layer.layer_group(spec, Quant.W4A16_AWQ)
    assert spec.hidden_size % group == 0 and spec.intermediate_size % group == 0
    assert group == (64 if name == "gpt-oss-20b" else 128)  # GPT-OSS-20B's 2880 = 22.5 x 128 = 45 x 64
    assert woq_layer.layer_group(spec, Quant.W8A16) is None and woq_layer.layer_group(spec, Quant.WFP4A16) == 32
    assert woq_layer.layer_group(spec, Quant.W4AFP8) == group


@pytest.mark.parametrize("name", list(SHAPES))
def test_w4afp8_bench_layers_plan_the_fused_expansion_and_time_it_forced_off(name: str) -> None:
    """W4AFP8 as ModelOpt's W4A8_AWQ stores it (static FP8 input scales, AWQ scales): its default plan fuses the FC1
    pre-quant scale into the expansion (the column "ours") and, at 1 token, the finalize into the decode GEMM2; the
    bench's forced-off columns plan the plain expansion, the separate FC2 scale, the separate finalize and the token
    digits made by steps of their own (its static scale runs W4A16's GEMMs on the dequantized rows), each the only
    change but the separate FC2 scale's, which takes the token digits out of the activation with it (the plan's
    digits_fc2_prequant gate)."""
    spec = woq_layer.woq_bench_spec(name, Quant.W4AFP8)
    assert spec.act_scale is ActScale.STATIC and spec.quant_prequant_scales and not spec.quant_zero_points
    target = Target(sm=90, flavour=Flavour.TENSORRT)
    plan = make_plan(spec, target, tokens=16)
    assert (plan.choices(16)["expand_rows"], plan.choices(16)["fc2_prequant"]) == ("prequant_fused", "fused")
    assert plan.choices(1)["finalize"] == "fused"
    assert woq_layer.FORCED[Quant.W4AFP8] == ("ours:expand_rows=plain", "ours:fc2_prequant=separate",
                                              "ours:finalize=separate", "ours:token_digits=separate",
                                              "ours:fc1_activation=separate")
    # the FP8 row steps whose kernels follow a forced stage: the expansion's (none where it no longer quantizes) and
    # the quantize step's after it; the activation step's (none where GEMM2's input is scaled after it) and that step's
    follows = {"expand_rows": {"expand_rows_tactic", "fc1_input_quant_tactic"},
               "fc2_prequant": {"token_digits", "fc1_activation_tactic", "fc2_input_quant_tactic"}}
    for variant in woq_layer.FORCED[Quant.W4AFP8][:-1]:
        force = runner_force(variant)
        forced = make_plan(spec, target, tokens=16, force=force)
        changed = {k for t in (1, 16) for k, v in plan.choices(t).items() if forced.choices(t)[k] != v}
        assert changed == set(force).union(*(follows.get(stage, set()) for stage in force))
    # the gated epilogue runs past the decode band (the mixed-input GEMM1's), on W1 interleaved for every count
    forced = make_plan(spec, target, tokens=4096, force=runner_force("ours:fc1_activation=separate"))
    assert plan.choices(4096)["fc1_activation"] == "gated_epilogue"
    changed = {k for k, v in plan.choices(4096).items() if forced.choices(4096)[k] != v}
    assert changed == {"fc1_activation", "w1_order"}, changed


def test_stored_bytes_by_hand() -> None:
    """int4 group 128 with zero points, W1 [2, 256, 256] / W2 [2, 256, 128]: per expert (256*256 + 256*128) / 2 data
    bytes, 4-byte scales and 1-byte zeros per (row, group): 256 * 2 + 256 * 1 groups."""
    base = bench_spec("qwen3-30b-a3b").with_overrides(hidden_size=256, intermediate_size=128, num_experts=8, top_k=2)
    w = MoEWeights.random(base, seed=0).quantized_woq(WoqKind.INT4, 128, asymmetric=True, awq=True)
    data = (256 * 256 + 256 * 128) // 2
    groups = 256 * (256 // 128) + 256 * (128 // 128)
    assert woq_layer.stored_expert_bytes(w.woq) == data + 4 * groups + groups


@pytest.mark.parametrize("kind", [WoqKind.INT4, WoqKind.INT8, WoqKind.MXFP4], ids=lambda k: k.value)
def test_the_bf16_reference_dequantizes_the_stored_experts_by_chunk(kind: WoqKind) -> None:
    """The bench's bf16 reference reads the quantized experts and dequantizes a chunk of them at a time: the same
    numbers as the reference of a whole bf16 copy (MoEWeights.dequantized) in the same chunks, bit for bit,
    on fresh random data."""
    seed = random.SystemRandom().randrange(1 << 30)
    base = bench_spec("qwen3-30b-a3b").with_overrides(hidden_size=256, intermediate_size=128, num_experts=8, top_k=2)
    group = {WoqKind.INT4: 64, WoqKind.INT8: None, WoqKind.MXFP4: 32}[kind]
    w = MoEWeights.random(base, seed=seed).quantized_woq(kind, group, asymmetric=kind is WoqKind.INT4,
                                                         awq=kind is WoqKind.INT4)
    g = torch.Generator().manual_seed(seed)
    inp = InputSet(torch.randn(40, 256, generator=g).to(torch.bfloat16), torch.randn(40, 8, generator=g), 0)
    rows = check_rows(base, inp, None)
    copy = reference_by_experts(base, w.dequantized(torch.bfloat16), inp, rows, chunk=1)
    assert torch.equal(reference_by_experts(base, w, inp, rows, chunk=1), copy), seed
    assert float(copy.abs().max()) > 0, seed


def _record(tokens: int, floor: float, ours: float, bf16: float, forced: float | None = None) -> dict:
    variants = {"ours": {"graph_us": ours, "us": ours + 10}, "ours_bf16": {"graph_us": bf16}}
    if forced is not None:
        variants["ours:fc2_prequant=separate"] = {"graph_us": forced}
    return {"tokens": tokens, "floor_us": floor, "variants": variants}


def test_targets_follow_the_issue() -> None:
    """Within 1.3x of the floor (or floor + 25 us) at 1 and 16 tokens, faster than bf16 at 256, within 1.25x of bf16
    at 4096, and each forced-off fusion timed against ours."""
    cases = [(_record(1, 10.0, 34.0, 50.0), "floor", True), (_record(16, 100.0, 131.0, 400.0), "floor", False),
             (_record(256, 100.0, 300.0, 299.0), "vs_bf16", False), (_record(4096, 1e3, 1240.0, 1000.0), "vs_bf16", True),
             (_record(4096, 1e3, 1260.0, 1000.0), "vs_bf16", False)]
    for rec, target, met in cases:
        woq_layer.woq_ratios(rec)
        assert rec["targets"][target]["met"] is met, (rec["tokens"], rec["targets"])
    rec = _record(16, 100.0, 120.0, 400.0, forced=126.0)
    woq_layer.woq_ratios(rec)
    assert rec["targets"]["fusions"]["ours:fc2_prequant=separate"]["wins"] is True
    assert rec["ratios"]["forced_over_ours"]["ours:fc2_prequant=separate"] == pytest.approx(1.05)


@pytest.mark.parametrize("args, field", [(("--quant", "w4a16_awq,fp8"), "quant"), (("--quant", "w4afp8,fp8"), "quant"),
                                         (("--quant", "w8a16", "--sweep"), "quant"),
                                         (("--quant", "wfp4a16", "--variants", "ours,scaled_grouped_mm"), "variants"),
                                         (("--quant", "w4a16_awq", "--shapes", "nope"), "shapes"),
                                         (("--quant", "w8a16", "--tokens", "0"), "tokens")])
def test_bad_weight_only_bench_options_are_one_line_errors(args: tuple[str, ...], field: str) -> None:
    r = run_moe_build("bench", *args, timeout=120)
    assert_one_line_error(r, field)


def test_an_unknown_bench_quant_lists_every_mode() -> None:
    """The weight-only modes are bench modes too: the refusal lists them beside the FP8 ones."""
    r = run_moe_build("bench", "--quant", "int3", timeout=120)
    assert_one_line_error(r, "quant")
    for mode in ("fp8_block", "w4a16_awq", "w8a16", "wfp4a16", "w4afp8", "w4afp8_dynamic"):
        assert mode in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the command would run the bench")
def test_weight_only_bench_without_a_gpu_says_so() -> None:
    r = run_moe_build("bench", "--quant", "w4a16_awq", "--tokens", "1", timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith("moe-build: error: device:"), r.stderr
    # chosen variants are accepted up to the device
    r = run_moe_build("bench", "--quant", "w4a16_awq", "--tokens", "1", "--variants",
                      "ours,ours:fc2_prequant=separate,ours_bf16", timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith("moe-build: error: device:"), r.stderr


def test_default_weight_only_variants() -> None:
    """ours, each fusion the plan turns on forced off, then the bf16 runner and the dequantized torch peer; a chosen
    list may name any of them and any other forced stage."""
    assert woq_layer.default_variants(Quant.W4A16_AWQ) == ("ours", "ours:expand_rows=plain",
                                                           "ours:fc2_prequant=separate", "ours:finalize=separate",
                                                           "ours:token_digits=separate",
                                                           "ours:fc1_activation=separate", "ours_bf16",
                                                           "grouped_mm_dequant")
    assert woq_layer.default_variants(Quant.W8A16) == ("ours", "ours:finalize=separate",
                                                       "ours:fc1_activation=separate", "ours_bf16",
                                                       "grouped_mm_dequant")
    assert woq_layer.default_variants(Quant.WFP4A16) == ("ours", "ours_bf16", "grouped_mm_dequant")
    woq_layer.check_variants([*woq_layer.default_variants(Quant.W4AFP8), "ours:gemm1_tactic=decode:ksplit1:plain:plain"])


def test_w4afp8_dynamic_bench_layers_take_each_rows_scale_at_run_time() -> None:
    """--quant w4afp8_dynamic: W4AFP8 with each row's FP8 scale taken at run time (compressed-tensors' scheme) on
    the same int4 experts and AWQ scales as w4afp8; its digits tile's token digits come from steps of their own
    (rules.digits_row_scale_pays), so the forced-off columns leave token_digits=separate out; the FC2 scale in the
    activation at 1 token too."""
    assert woq_layer.QUANTS["w4afp8"] == (Quant.W4AFP8, ActScale.STATIC)
    assert woq_layer.QUANTS["w4afp8_dynamic"] == (Quant.W4AFP8, ActScale.DYNAMIC)
    assert woq_layer.QUANTS["w4a16_awq"] == (Quant.W4A16_AWQ, ActScale.DYNAMIC)
    spec = woq_layer.woq_bench_spec("qwen3-30b-a3b", Quant.W4AFP8, ActScale.DYNAMIC)
    assert spec.act_scale is ActScale.DYNAMIC and spec.quant_prequant_scales
    assert woq_layer.default_variants(Quant.W4AFP8, ActScale.DYNAMIC) == (
        "ours", "ours:expand_rows=plain", "ours:fc2_prequant=separate", "ours:finalize=separate", "ours_bf16",
        "grouped_mm_dequant")
    plan = make_plan(spec, Target(sm=90, flavour=Flavour.TENSORRT), tokens=1)
    assert (plan.choices(1)["token_digits"], plan.choices(1)["fc2_prequant"]) == ("separate", "fused")
