"""The FP8 bench (`moe-build bench --quant`) on the CPU: its floor arithmetic, ceilings, option parsing,
variant list, targets, and the expert-chunked fp64 reference its checks use.

What it must guarantee: an FP8 point's floor counts one byte per weight element plus the fp32 scales the
FP8 GEMMs read (per output channel for fp8, per 128 x 128 block for fp8_block) and divides the FLOPs by
the e4m3 matmul rate, timed side by side like the other ceilings (falling back to the burst ones and
saying so); a bf16 run's ceilings gain no FP8 field; bad --quant values and combinations are refused on
one line with exit 2 before any GPU work; the default FP8 variants are ours, each fusion forced off
(the FP8 input quantizations and the finalize: a plan the planner accepts for every FP8 bench layer, forcing
off what the default plan fuses at some bench token count) and the three comparisons; and the reference
that reads only the touched experts, a chunk at a time, equals moe_reference on the whole layer.
Expected floor values are worked out by hand from the definitions.
"""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from cli_process import assert_one_line_error, run_moe_build
from moe_build.bench import fp8_layer
from moe_build.bench.layer import point_floor
from moe_build.bench.timing import TIMER_KEYS, CeilingCalls, ceiling_rates
from moe_build.bench.workload import (FP8_SHAPES, TOKENS, InputSet, bench_spec, check_rows,
                                      expert_elements, floor_us, fp8_bench_spec, reference_by_experts)
from moe_build.errors import MoeBuildError
from moe_build.planner import make_plan
from moe_build.planner import rules as R
from moe_build.reference import moe_reference
from moe_build.spec import MoESpec, Quant, Routing, RoutingMethod
from moe_build.spec.presets import PRESETS
from moe_build.target import Flavour, Target, TokenProfile
from moe_build.weights import MoEWeights
from moe_build.weights.fp8 import ScaleGranularity

COPY, READ, MATMUL, FP8_MATMUL = (TIMER_KEYS[k] for k in ("copy", "read", "matmul", "fp8_matmul"))
CEILINGS = {"bytes_per_s": 4.0e12, "bf16_flops_per_s": 8.0e14, "fp8_flops_per_s": 1.6e15}


def test_fp8_floor_qwen3_channel_scales_by_hand() -> None:
    # W1 1536 x 2048 + W2 2048 x 768 = 4,718,592 e4m3 bytes, + 4 * (1536 + 2048) = 14,336 bytes of scales:
    # 4,732,928 bytes per expert; 100 experts + 2 * 16 * 2048 * 2 = 131,072 activation bytes = 473,423,872
    # bytes over 4e12 B/s = 118.355968 us; 2 * 16 * 8 * 4,718,592 = 1,207,959,552 FLOPs over 1.6e15 = 0.75497472 us
    f = floor_us(fp8_bench_spec("qwen3-30b-a3b", Quant.FP8), 16, 100.0, CEILINGS)
    assert f["bytes"] == 473_423_872
    assert f["flops"] == 1_207_959_552
    assert f["bytes_us"] == pytest.approx(118.355968)
    assert f["flops_us"] == pytest.approx(0.75497472)
    assert f["floor_us"] == pytest.approx(118.355968) and f["bound"] == "bytes"


def test_fp8_floor_deepseek_v3_block_scales_by_hand() -> None:
    # W1 4096 x 7168 + W2 7168 x 2048 = 44,040,192 bytes; blocks 32 x 56 + 56 x 16 = 2688 scales = 10,752
    # bytes: 44,050,944 per expert, x 256 = 11,277,041,664, + 2 * 4096 * 7168 * 2 = 117,440,512 activation
    # bytes = 11,394,482,176 bytes / 4e12 = 2848.620544 us; 2 * 4096 * 8 * 44,040,192 = 2,886,218,022,912
    # FLOPs / 1.6e15 = 1803.88626432 us
    f = floor_us(fp8_bench_spec("deepseek-v3", Quant.FP8_BLOCK), 4096, 256.0, CEILINGS)
    assert f["bytes"] == 11_394_482_176
    assert f["flops"] == 2_886_218_022_912
    assert f["floor_us"] == pytest.approx(2848.620544) and f["bound"] == "bytes"
    assert f["flops_us"] == pytest.approx(1803.88626432)


def test_fp8_floor_block_scales_round_up_and_flops_bound() -> None:
    # GPT-OSS: H = I = 2880 is 22.5 blocks of 128, so 23 are stored: W1 (5760 x 2880) has 45 x 23 block
    # scales, W2 (2880 x 2880) 23 x 23: (1035 + 529) * 4 = 6256 bytes beside 24,883,200 weight bytes.
    # At 4096 tokens, 32 experts: 32 * 24,889,456 + 2 * 4096 * 2880 * 2 = 843,648,512 bytes / 4e12 =
    # 210.912128 us; 2 * 4096 * 4 * 24,883,200 = 815,372,697,600 FLOPs / 1.6e15 = 509.607936 us (flops-bound)
    f = floor_us(fp8_bench_spec("gpt-oss-20b", Quant.FP8_BLOCK), 4096, 32.0, CEILINGS)
    assert f["bytes"] == 843_648_512
    assert f["bytes_us"] == pytest.approx(210.912128)
    assert f["floor_us"] == pytest.approx(509.607936) and f["bound"] == "flops"


def test_bf16_floor_is_unchanged_by_the_fp8_terms() -> None:
    # bf16: 2 bytes per weight element and no scales, FLOPs over the bf16 rate: 100 * 4,718,592 * 2 +
    # 131,072 = 943,849,472 bytes / 4e12 = 235.962368 us
    f = floor_us(bench_spec("qwen3-30b-a3b"), 16, 100.0, CEILINGS)
    assert f["bytes"] == 943_849_472 and f["floor_us"] == pytest.approx(235.962368)
    assert f["flops_us"] == pytest.approx(1_207_959_552 / 8.0e14 * 1e6)


def test_rates_with_and_without_the_fp8_matmul() -> None:
    copy_ms, read_ms, mm_ms, fp8_ms = 0.52, 0.25, 1.4, 0.8
    bf16_only = CeilingCalls.rates(copy_ms, read_ms, mm_ms)
    assert "fp8_flops_per_s" not in bf16_only  # a bf16 run's JSON keeps its fields
    with_fp8 = CeilingCalls.rates(copy_ms, read_ms, mm_ms, fp8_ms)
    assert with_fp8["fp8_flops_per_s"] == pytest.approx(2 * 8192 ** 3 / 0.8e-3)
    assert {k: v for k, v in with_fp8.items() if k != "fp8_flops_per_s"} == bf16_only
    medians = {COPY: copy_ms, READ: read_ms, MATMUL: mm_ms}
    assert ceiling_rates(medians) == bf16_only
    assert ceiling_rates(medians, fp8=True) is None  # the FP8 matmul was not timed
    assert ceiling_rates({**medians, FP8_MATMUL: fp8_ms}, fp8=True) == with_fp8


def test_fp8_point_floor_side_by_side_and_burst() -> None:
    spec = fp8_bench_spec("qwen3-30b-a3b", Quant.FP8)
    touched = random.uniform(8, 128)
    medians = {COPY: 0.52, READ: 0.25, MATMUL: 1.4, FP8_MATMUL: 0.8}
    rec = point_floor(spec, 256, touched, medians, CEILINGS)
    side = CeilingCalls.rates(0.52, 0.25, 1.4, 0.8)
    assert rec["ceilings_source"] == "side_by_side"
    assert rec["floor_us"] == pytest.approx(floor_us(spec, 256, touched, side)["floor_us"])
    assert rec["burst_floor_us"] == pytest.approx(floor_us(spec, 256, touched, CEILINGS)["floor_us"])
    medians.pop(FP8_MATMUL)
    rec = point_floor(spec, 256, touched, medians, CEILINGS)
    assert rec["ceilings_source"] == "burst" and rec["floor_us"] == pytest.approx(rec["burst_floor_us"])


@pytest.mark.parametrize("text,expected", [("none", []), ("fp8", ["fp8"]), ("fp8_block", ["fp8_block"]),
                                           ("fp8, fp8_block", ["fp8", "fp8_block"]),
                                           ("fp8_block,fp8,fp8_block", ["fp8_block", "fp8"]),
                                           ("fp8_static,fp8", ["fp8_static", "fp8"])])
def test_parse_quants(text: str, expected: list[str]) -> None:
    assert [m.name for m in fp8_layer.parse_quants(text)] == expected


def test_modes_are_the_checkpoint_forms() -> None:
    """fp8 and fp8_static are the same per-channel layer with dynamic (compressed-tensors) and static (ModelOpt)
    activation scales; fp8_block DeepSeek-V3's blocks, dynamic."""
    from moe_build.spec import ActScale
    modes = fp8_layer.MODES
    assert (modes["fp8"].quant, modes["fp8"].act_scale) == (Quant.FP8, ActScale.DYNAMIC)
    assert (modes["fp8_static"].quant, modes["fp8_static"].act_scale) == (Quant.FP8, ActScale.STATIC)
    assert (modes["fp8_block"].quant, modes["fp8_block"].act_scale) == (Quant.FP8_BLOCK, ActScale.DYNAMIC)


@pytest.mark.parametrize("text", ["", ",", "fp9", "FP8", "fp8,none", "w8a16", "nvfp4"])
def test_parse_quants_refuses(text: str) -> None:
    with pytest.raises(MoeBuildError) as e:
        fp8_layer.parse_quants(text)
    assert e.value.field == "quant" and "\n" not in str(e.value)


@pytest.mark.parametrize("args,field", [
    (["--quant", "fp9"], "quant"),
    (["--quant", "fp8,none"], "quant"),
    (["--quant", "fp8", "--sweep"], "quant"),
    (["--quant", "fp8", "--variants", "ours,naive"], "variants"),
    (["--quant", "fp8_block", "--shapes", "llama"], "shapes"),
    (["--shapes", "deepseek-v3"], "shapes"),  # the bf16 bench keeps its four shapes
    (["--quant", "fp8", "--tokens", "0"], "tokens"),
])
def test_cli_refuses_bad_values_on_one_line(args: list[str], field: str) -> None:
    r = run_moe_build("bench", *args, timeout=120)
    assert_one_line_error(r, field)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the command would run the bench")
def test_cli_accepts_good_values_up_to_the_device() -> None:
    r = run_moe_build("bench", "--quant", "fp8,fp8_block", "--shapes", "deepseek-v3,qwen3-30b-a3b", "--tokens", "1",
                      "--variants", "ours,ours:fc2_input_quant=separate,scaled_grouped_mm", timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith("moe-build: error: device:"), r.stderr


def test_default_fp8_variants() -> None:
    assert fp8_layer.FP8_VARIANTS == ("ours", "ours:fc1_input_quant=separate", "ours:fc2_input_quant=separate",
                                      "ours:fc1_activation=separate", "ours:finalize=separate",
                                      "ours:fp8_accumulation=promoted", "ours_bf16", "scaled_grouped_mm",
                                      "grouped_mm_dequant")
    fp8_layer.check_variants([*fp8_layer.FP8_VARIANTS, "ours:fc1_input_quant=separate+fc2_input_quant=separate"])
    for bad in ("naive", "grouped_mm", "hf_eager", "ours_fp8"):
        with pytest.raises(MoeBuildError):
            fp8_layer.check_variants(["ours", bad])


# block-128 layers that run the activation kernel at every bench count: Mixtral-8x7B's GEMM1 runs the gated epilogue
# only on the pingpong 64x128 tile (rules.gated_epilogue_block_wgmma), 32 to 160 tokens, and not at decode
# (rules.gated_epilogue_block_decode: 235 MB of W1 at 1 token)
BLOCK128_ACTIVATION_KERNEL_ONLY = {"mixtral-8x7b": {"fc1_activation"}}


@pytest.mark.parametrize("quant", [Quant.FP8, Quant.FP8_BLOCK])
@pytest.mark.parametrize("shape", FP8_SHAPES)
def test_forced_off_variants_are_plans_the_default_fuses(shape: str, quant: Quant) -> None:
    """Each forced-off variant forces its stage at every bench token count, on the sm90 runner's target, and
    the default plan fuses that stage at one of them at least (finalize is token-dependent); but some variants are
    the default plan (the table marks them off): block-128 layers promote by construction, and run the activation
    kernel at every bench count where GEMM1 runs the gated epilogue at none (Mixtral-8x7B: its pingpong 64x128 band
    holds no bench count); rowwise ones past FP8_QUANTIZING_MAX_K
    quantize GEMM2's input after GEMM1's gated epilogue at every count (the others in GEMM2 where it runs the decode
    kernel)."""
    spec = fp8_bench_spec(shape, quant)
    target = dataclasses.replace(Target(sm=90, flavour=Flavour.TENSORRT), profile=TokenProfile(1, 16, 4096))
    default = make_plan(spec, target, 4096)
    for variant in fp8_layer.FP8_RUNNER_VARIANTS[1:]:
        force = fp8_layer.runner_force(variant)
        forced = make_plan(spec, target, 4096, force=force)
        for stage, choice in force.items():
            assert all(forced.choices(t)[stage] == choice for t in TOKENS), variant
            default_differs = any(default.choices(t)[stage] != choice for t in TOKENS)
            block_off = {"fp8_accumulation"} | BLOCK128_ACTIVATION_KERNEL_ONLY.get(shape, set())
            already_off = {Quant.FP8: {"fc2_input_quant"} if spec.intermediate_size > R.FP8_QUANTIZING_MAX_K else set(),
                           Quant.FP8_BLOCK: block_off}[quant]
            assert default_differs == (stage not in already_off), variant


def test_deepseek_v3_bench_layer() -> None:
    spec = bench_spec("deepseek-v3")
    preset = PRESETS["deepseek-v3"]
    assert (spec.hidden_size, spec.intermediate_size, spec.num_experts, spec.top_k) == (7168, 2048, 256, 8)
    assert spec.routing == preset.routing and spec.routing.method is RoutingMethod.SIGMOID_GROUPED
    assert spec.shared.count == 0 and spec.quant is Quant.NONE
    assert fp8_bench_spec("deepseek-v3", Quant.FP8_BLOCK).quant is Quant.FP8_BLOCK


def _point(tokens: int, floor: float, ours: float, bf16: float, sgm: float, forced: tuple[float, float, float],
           plan: dict[str, str]) -> dict:
    rec = {"tokens": tokens, "floor_us": floor, "burst_floor_us": 0.9 * floor,
           "variants": {"ours": {"us": ours + 5.0, "graph_us": ours, "plan": plan},
                        "ours:fc1_input_quant=separate": {"graph_us": forced[0]},
                        "ours:fc2_input_quant=separate": {"graph_us": forced[1]},
                        "ours:finalize=separate": {"graph_us": forced[2]},
                        "ours_bf16": {"graph_us": bf16}, "scaled_grouped_mm": {"us": sgm},
                        "grouped_mm_dequant": {}}}
    fp8_layer.fp8_ratios(rec)
    return rec


FUSED = {"fc1_input_quant": "expand_rows", "fc2_input_quant": "fc1_activation", "finalize": "fused"}


def test_ratios_and_targets_small_point() -> None:
    # floor 10 us: the target is floor + 25 = 35 us (1.25 x 10 is smaller); ours 30 meets it; eager 35
    rec = _point(16, 10.0, 30.0, 36.0, 70.0, (33.0, 27.0, 31.5), FUSED)
    r, t = rec["ratios"], rec["targets"]
    assert r["ours_over_floor"] == pytest.approx(3.0) and r["ours_eager_over_floor"] == pytest.approx(3.5)
    assert r["ours_over_burst_floor"] == pytest.approx(30.0 / 9.0)
    assert r["ours_bf16_over_ours"] == pytest.approx(1.2)
    assert r["scaled_grouped_mm_over_ours"] == pytest.approx(2.0)  # eager over eager
    assert r["grouped_mm_dequant_over_ours"] is None
    assert r["forced_over_ours"] == {"ours:fc1_input_quant=separate": pytest.approx(1.1),
                                     "ours:fc2_input_quant=separate": pytest.approx(0.9),
                                     "ours:finalize=separate": pytest.approx(1.05)}
    assert t["floor"] == {"limit_us": pytest.approx(35.0), "met": True}
    assert "vs_bf16" not in t and t["vs_scaled_grouped_mm"] == {"met": True}
    assert t["fusions"] == {"ours:fc1_input_quant=separate": {"on": True, "wins": True},
                            "ours:fc2_input_quant=separate": {"on": True, "wins": False},
                            "ours:finalize=separate": {"on": True, "wins": True}}


def test_ratios_and_targets_large_point() -> None:
    # 4096 tokens: no floor target; ours_bf16 / ours = 1.5 < 1.6 misses; slower than the peer (eager
    # 1005 vs 900); the plan has fc2_input_quant and finalize separate already, so those variants are not
    # fusions turned on
    rec = _point(4096, 500.0, 1000.0, 1500.0, 900.0, (1100.0, 1000.0, 990.0),
                 {**FUSED, "fc2_input_quant": "separate", "finalize": "separate"})
    t = rec["targets"]
    assert "floor" not in t
    assert t["vs_bf16"] == {"at_least": 1.6, "met": False}
    assert t["vs_scaled_grouped_mm"] == {"met": False}
    assert t["fusions"]["ours:fc2_input_quant=separate"] == {"on": False, "wins": None}
    assert t["fusions"]["ours:finalize=separate"] == {"on": False, "wins": None}
    # the floor target at 1.25 x where the floor is large
    big = _point(256, 400.0, 510.0, 900.0, 2000.0, (520.0, 515.0, 512.0), FUSED)["targets"]["floor"]
    assert big == {"limit_us": pytest.approx(500.0), "met": False}


def test_table_lists_every_point() -> None:
    pts = [{**_point(16, 10.0, 30.0, 36.0, 70.0, (33.0, 27.0, 31.5), FUSED), "quant": "fp8", "shape": "qwen3-30b-a3b"},
           {**_point(4096, 500.0, 1000.0, 1500.0, 900.0, (1100.0, 1000.0, 990.0), FUSED), "quant": "fp8_block",
            "shape": "deepseek-v3"}]
    text = fp8_layer.table({"points": pts})
    lines = text.splitlines()
    assert len(lines) == 4 and "qwen3-30b-a3b" in lines[1] and "deepseek-v3" in lines[2]
    assert lines[-1].startswith("targets met: 2 of 4")


def _fp8_layer(routing: Routing, granularity: ScaleGranularity, seed: int) -> tuple[MoESpec, MoEWeights]:
    base = MoESpec(256, 192, 16, 4, routing=routing)
    quant = Quant.FP8_BLOCK if granularity is ScaleGranularity.BLOCK128 else Quant.FP8
    return base.with_overrides(quant=quant), MoEWeights.random(base, seed=seed).quantized_fp8(granularity)


ROUTINGS = [Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True),
            Routing(RoutingMethod.SIGMOID_GROUPED, renormalize=True, num_groups=4, topk_groups=2,
                    routed_scaling_factor=2.5, correction_bias=True)]


@pytest.mark.parametrize("routing", ROUTINGS, ids=["softmax_topk", "sigmoid_grouped"])
@pytest.mark.parametrize("granularity", [ScaleGranularity.CHANNEL, ScaleGranularity.BLOCK128], ids=lambda g: g.value)
def test_reference_by_experts_equals_the_whole_layer(routing: Routing, granularity: ScaleGranularity) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    spec, w = _fp8_layer(routing, granularity, seed)
    g = torch.Generator().manual_seed(seed)
    inp = InputSet(torch.randn(70, 256, generator=g).to(torch.bfloat16), torch.randn(70, 16, generator=g), 0)
    rows = check_rows(spec, inp, w.correction_bias)
    whole = moe_reference(spec, w, inp.hidden[rows], router_logits=inp.logits[rows])
    for chunk in (1, 5 * expert_elements(spec), 1 << 40):  # top_k experts a chunk, a few, all at once
        got = reference_by_experts(spec, w, inp, rows, chunk=chunk)
        assert float((got - whole).abs().max()) <= 1e-12 * float(whole.abs().max()), (chunk, seed)
    w16 = w.dequantized(torch.bfloat16)
    spec16 = spec.with_overrides(quant=Quant.NONE)
    whole16 = moe_reference(spec16, w16, inp.hidden[rows], router_logits=inp.logits[rows])
    got16 = reference_by_experts(spec16, w16, inp, rows, chunk=1)
    assert float((got16 - whole16).abs().max()) <= 1e-12 * float(whole16.abs().max()), seed
    # the bench's bf16 reference reads the FP8 experts, dequantized a chunk at a time as dequantized() rounds them
    assert torch.equal(reference_by_experts(spec16, w, inp, rows, chunk=1), got16), seed


def test_dequantized_bf16_is_the_exact_dequantization_rounded_once() -> None:
    spec, w = _fp8_layer(ROUTINGS[0], ScaleGranularity.BLOCK128, seed=5)
    w16 = w.dequantized(torch.bfloat16)
    exact = w.dequantized(torch.float64)
    assert w16.fp8 is None and w16.w1.dtype == torch.bfloat16
    assert torch.equal(w16.w1, exact.w1.to(torch.bfloat16)) and torch.equal(w16.w2, exact.w2.to(torch.bfloat16))


def test_check_rows_keeps_the_experts_within_the_budget() -> None:
    spec, w = _fp8_layer(ROUTINGS[0], ScaleGranularity.CHANNEL, seed=7)
    inp = InputSet(torch.randn(300, 256).to(torch.bfloat16), torch.randn(300, 16), 0)
    every = check_rows(spec, inp, None)
    assert every[0] == 0 and every[-1] == 299 and len(every) > 30  # a budget this layer never reaches
    budget = 6 * expert_elements(spec)
    few = check_rows(spec, inp, None, budget=budget)
    assert 0 in few.tolist() and len(few) < len(every)
    ids = torch.softmax(inp.logits[few].double(), dim=-1).topk(spec.top_k, dim=-1).indices
    assert ids.unique().numel() * expert_elements(spec) <= budget
    one = check_rows(spec, inp, None, budget=1)  # the first row always
    assert one.tolist() == [0]
