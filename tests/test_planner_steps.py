"""The FP8 row steps' tactics (moe_build/planner/tactics/steps.py) and their stages in the plan.

What must hold: a kernel is offered only where it takes the step (the C entry points' refusals, restated here from
cpp/include/moe_build_kernels.h's mb_step_tactic); the rules switch at the row counts their comments give (expected
bands written here by hand from those counts and the layers' top-k, 132 SMs); a layer without a step has "none"; a
forced tactic holds at every count, and one the step's kernel cannot run is refused naming the stage.
"""
from __future__ import annotations

import dataclasses

import pytest

from moe_build.errors import MoeBuildError
from moe_build.planner import STEP_STAGES, make_plan
from moe_build.planner.tactics import RowCount, RowStep, step_problem, step_tactic
from moe_build.planner.tactics.steps import takes
from moe_build.spec import MoESpec, Quant
from moe_build.spec.layer import ActScale
from moe_build.target import Flavour, Target

H100 = Target(sm=90, flavour=Flavour.TENSORRT, sm_count=132, l2_bytes=50 << 20)
MIXTRAL = MoESpec(4096, 14336, 8, 2)     # gated rows of 2 x 14336: past a warp's 1536 columns a half
QWEN3 = MoESpec(2048, 768, 128, 8)       # gated rows of 2 x 768: 96 units, 3 a lane
GPT_OSS = MoESpec(2880, 2880, 32, 4)     # 360 units a row, 12 a lane
SMEM_90 = 227 * 1024


def step(cols: int, gated: bool = False, prequant: bool = False, scaling: str = "per_row",
         dequantized: bool = False, expansion: bool = False) -> RowStep:
    return RowStep(cols, gated, prequant, scaling, dequantized, expansion, 132, SMEM_90)


def test_warp_rows_takes_whole_units_without_a_prequant_scale_up_to_its_width():
    assert takes(step(4096), "warp_rows")                      # 512 units: 16 a lane
    assert not takes(step(4104), "warp_rows")                  # 513 units: 17 a lane
    assert not takes(step(4092), "warp_rows")                  # not whole 16-byte units
    assert not takes(step(2048, prequant=True), "warp_rows")
    assert takes(step(1536, gated=True), "warp_rows")          # gated: 6 units a lane, each half
    assert not takes(step(1544, gated=True), "warp_rows")
    assert not takes(step(2048, scaling="static", dequantized=True), "warp_rows")  # the 16-bit kernel only


def test_staged_rows_takes_a_ring_of_two_rows_within_shared_memory():
    # a stage is a row of 16-bit units, both halves where gated; two of them within 227 KB less 128 bytes
    cols = (SMEM_90 - 128) // 2 // 2 // 8 * 8                  # the widest whole-unit row whose two stages fit
    assert takes(step(cols), "staged_rows")
    assert not takes(step(cols + 8), "staged_rows")
    assert takes(step(cols // 2 // 8 * 8, gated=True), "staged_rows")
    assert not takes(step(cols // 2 // 8 * 8 + 8, gated=True), "staged_rows")
    assert takes(step(14336, gated=True, prequant=True), "staged_rows")
    assert not takes(step(4096, expansion=True), "staged_rows")


def test_group_items_takes_static_or_group_scales_into_e4m3_bytes():
    assert takes(step(2048, scaling="static"), "group_items")
    assert takes(step(2048, scaling="per_group"), "group_items")
    assert not takes(step(2048, scaling="per_row"), "group_items")
    assert not takes(step(2048, scaling="per_group", prequant=True), "group_items")
    assert not takes(step(2048, scaling="per_group", dequantized=True), "group_items")
    assert not takes(step(2044, scaling="per_group"), "group_items")


@pytest.mark.parametrize("rows,expected", [(131, "group_items"), (132, "staged_rows"), (4223, "staged_rows"),
                                           (4224, "warp_rows")])
def test_row_step_switches_at_one_row_an_sm_and_at_32(rows, expected):
    # per-group scales, 768 columns gated: every kernel takes it; 132 SMs
    assert step_tactic(step(768, gated=True, scaling="per_group"), RowCount(rows, 1, 128)) == expected


@pytest.mark.parametrize("rows,expected", [(791, "block_rows"), (792, "warp_rows")])
def test_expansion_takes_a_warp_a_token_from_six_rows_an_sm(rows, expected):
    assert step_tactic(step(4096, expansion=True), RowCount(rows, 1, 8)) == expected


def test_a_step_no_kernel_but_the_block_takes_runs_block_rows_at_every_count():
    odd = step(4092, gated=True, scaling="per_group")
    assert {step_tactic(odd, RowCount(r, 1, 8)) for r in (1, 131, 132, 5000, 100000)} == {"block_rows"}


def plan(spec: MoESpec, quant: Quant, tokens: int = 1, **kw) -> dict:
    return {d.stage: d for d in make_plan(dataclasses.replace(spec, quant=quant, **kw), H100, tokens).stages}


def bands(d) -> list[list]:
    return [b.to_list() for b in d.bands]


def test_block128_activation_bands_by_rows():
    stages = plan(QWEN3, Quant.FP8_BLOCK)
    # top-8: group items while 8 t < 132 (t <= 16), the warp kernel from 8 t >= 4224 (t >= 528)
    assert bands(stages["fc1_activation_tactic"]) == [[1, 16, "group_items"], [17, 527, "staged_rows"],
                                                      [528, None, "warp_rows"]]
    # the expansion of 2048-column rows, a warp a token from 8 t >= 792 (t >= 99)
    assert bands(stages["expand_rows_tactic"]) == [[1, 98, "block_rows"], [99, None, "warp_rows"]]
    assert stages["fc1_input_quant_tactic"].choice == "none"
    mixtral = plan(MIXTRAL, Quant.FP8_BLOCK)
    # 2 x 14336 gated columns: too wide for a warp; group items while 2 t < 132
    assert bands(mixtral["fc1_activation_tactic"]) == [[1, 65, "group_items"], [66, None, "staged_rows"]]


def test_rowwise_quantize_step_has_no_group_items():
    stages = plan(GPT_OSS, Quant.FP8)
    # per-row scales: the staged kernel, then a warp a row from 4 t >= 4224 (t >= 1056); 2880 columns, 12 a lane
    assert bands(stages["fc2_input_quant_tactic"]) == [[1, 1055, "staged_rows"], [1056, None, "warp_rows"]]


def test_w4afp8_static_steps_run_the_16bit_kernels():
    stages = plan(QWEN3, Quant.W4AFP8, act_scale=ActScale.STATIC)
    assert bands(stages["fc1_activation_tactic"]) == [[1, None, "block_rows"]]
    assert bands(stages["expand_rows_tactic"]) == [[1, None, "block_rows"]]


def test_w4afp8_prequant_scales_keep_warp_kernels_off():
    stages = plan(QWEN3, Quant.W4AFP8, quant_prequant_scales=True)
    # per-row scales, the FC1 pre-quant scale in the expansion: the block kernel at every count
    assert bands(stages["expand_rows_tactic"]) == [[1, None, "block_rows"]]
    # the FC2 pre-quant scale in the activation (fc2_prequant=fused): the staged ring at every count
    assert bands(stages["fc1_activation_tactic"]) == [[1, None, "staged_rows"]]


def test_the_steps_a_plan_runs_have_tactics_and_the_others_none():
    # rowwise FP8, the activation and its quantization forced apart: the quantize step runs, the activation step not
    p = make_plan(dataclasses.replace(QWEN3, quant=Quant.FP8), H100, 1,
                  {"fc1_activation": "separate", "fc2_input_quant": "separate"})
    stages = {d.stage: d for d in p.stages}
    assert stages["fc1_activation_tactic"].choice == "none"
    # per-row scales: no group items; the warp kernel from 8 t >= 4224
    assert bands(stages["fc2_input_quant_tactic"]) == [[1, 527, "staged_rows"], [528, None, "warp_rows"]]
    # W4AFP8 with the FC2 pre-quant scale as a step of its own: the 16-bit activation, then the quantize step
    p = make_plan(dataclasses.replace(QWEN3, quant=Quant.W4AFP8, quant_prequant_scales=True), H100, 1,
                  {"fc2_prequant": "separate"})
    stages = {d.stage: d for d in p.stages}
    assert stages["fc1_activation_tactic"].choice == "none"
    assert bands(stages["fc2_input_quant_tactic"]) == [[1, None, "staged_rows"]]  # a pre-quant scale: no warp kernel


@pytest.mark.parametrize("quant", [Quant.NONE, Quant.W4A16_AWQ])
def test_layers_without_fp8_steps_have_none(quant):
    stages = plan(QWEN3, quant)
    assert {stages[s].choice for s in STEP_STAGES} == {"none"}


def test_forced_step_tactic_holds_everywhere_and_is_refused_where_it_cannot_run():
    p = make_plan(dataclasses.replace(QWEN3, quant=Quant.FP8_BLOCK), H100, 1, {"fc1_activation_tactic": "warp_rows"})
    d = next(d for d in p.stages if d.stage == "fc1_activation_tactic")
    assert d.forced and bands(d) == [[1, None, "warp_rows"]]
    with pytest.raises(MoeBuildError, match="fc1_activation_tactic=warp_rows: warp_rows takes"):
        make_plan(dataclasses.replace(MIXTRAL, quant=Quant.FP8_BLOCK), H100, 1, {"fc1_activation_tactic": "warp_rows"})
    with pytest.raises(MoeBuildError, match="the step's kernels are block_rows, warp_rows"):
        make_plan(dataclasses.replace(QWEN3, quant=Quant.FP8_BLOCK), H100, 1, {"expand_rows_tactic": "staged_rows"})
    with pytest.raises(MoeBuildError, match="has no FP8 quantize step"):
        make_plan(dataclasses.replace(QWEN3, quant=Quant.FP8_BLOCK), H100, 1, {"fc1_input_quant_tactic": "block_rows"})


def test_step_problem_names_what_the_kernel_needs():
    assert step_problem(step(4096), "warp_rows") is None
    assert "no pre-quant scale" in step_problem(step(4096, prequant=True), "warp_rows")
    assert "16-bit step's kernel" in step_problem(step(4096, scaling="static", dequantized=True), "staged_rows")
