"""int4 codes in 16-row tiles (weight_layout=int4_tiles): where each byte lands, as cpp/include/moe_build_kernels.h
states MB_WOQ_INT4_TILES (the expectations below are written from that statement, not from woq.int4_tiles); the
plan's choice by the profile's max tokens; the runner's weights and operands in that form."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from moe_build.errors import UnsupportedCombination
from moe_build.planner import make_plan
from moe_build.runner.sequence import plan_weights, w1_interleaved
from moe_build.spec import MoESpec, Quant
from moe_build.target import Flavour, Target, TokenProfile
from moe_build.weights import MoEWeights
from moe_build.weights.woq import WoqKind, int4_rows, int4_tiles, stored_operand, wgmma_operand


def header_offset(row: int, kbyte: int, row_bytes: int) -> int:
    """The header's MB_WOQ_INT4_TILES: tile t = row / 16 holds its rows' bytes at 8 k t (16 row_bytes), batch j (k
    128j .. 128j + 127, bytes 64j ..) the 1024 bytes from 1024j, row r % 16's 64 at 64 (r % 16); a last batch of
    k % 128 k holds its rows' (k % 128) / 2 bytes each, row by row."""
    tile, r, j, byte = row // 16, row % 16, kbyte // 64, kbyte % 64
    last_partial = j == row_bytes // 64
    width = row_bytes % 64 if last_partial else 64
    return tile * 16 * row_bytes + 1024 * j + width * r + byte


@pytest.mark.parametrize("k", [128, 256, 2880, 4096, 352, 96])
def test_every_byte_lands_where_the_header_says(k: int) -> None:
    """Every byte of a 3-expert stack of 48 rows, at k of whole batches, GPT-OSS-20B's 2880 (a half batch last), and
    k % 128 of 96 and 32 (352; 96 alone: one partial batch); the inverse gives the rows back."""
    row_bytes = k // 2
    codes = torch.randint(0, 256, (3, 48, row_bytes), dtype=torch.uint8, generator=torch.Generator().manual_seed(k))
    tiles = int4_tiles(codes)
    assert tiles.shape == codes.shape and tiles.dtype == torch.uint8
    rows = torch.arange(48).repeat_interleave(row_bytes)
    kbytes = torch.arange(row_bytes).repeat(48)
    where = torch.tensor([header_offset(int(r), int(b), row_bytes) for r, b in zip(rows, kbytes)])
    for x in range(3):
        assert torch.equal(tiles[x].flatten()[where], codes[x].flatten()), x
    assert torch.equal(int4_rows(tiles), codes)


def test_rows_not_whole_tiles_are_refused() -> None:
    with pytest.raises(ValueError, match="40 rows are not whole tiles of 16"):
        int4_tiles(torch.zeros(2, 40, 64, dtype=torch.uint8))


SPEC = MoESpec(256, 512, 8, 2, quant=Quant.W4A16_AWQ, quant_group_size=128)


def h100(max_tokens: int) -> Target:
    return Target(sm=90, flavour=Flavour.TENSORRT, profile=TokenProfile(1, 1, max_tokens))


def first_mixed_input_count(spec: MoESpec) -> int:
    """The first count either GEMM's tactic bands put on the mixed-input wgmma kernel (a woq128x* tile)."""
    plan = make_plan(spec, h100(4096))
    return min(b.lo for stage in ("gemm1_tactic", "gemm2_tactic") for b in plan.stage(stage).bands
               if b.choice.startswith("wgmma:woq"))


@pytest.mark.parametrize("quant", [Quant.W4A16_AWQ, Quant.W4AFP8])
def test_plan_tiles_int4_codes_below_the_mixed_input_bands(quant: Quant) -> None:
    """int4_tiles up to the count before the first mixed-input wgmma band (which reads rows), row_major from it."""
    spec = dataclasses.replace(SPEC, quant=quant)
    first = first_mixed_input_count(spec)
    assert first > 1
    below, at = make_plan(spec, h100(first - 1)), make_plan(spec, h100(first))
    assert below.stage("weight_layout").choice == "int4_tiles"
    assert "16-row tiles" in below.stage("weight_layout").summary
    assert at.stage("weight_layout").choice == "row_major"
    gate = {g.name: g for g in at.stage("weight_layout").gates}["int4_tiles_pay"]
    assert not gate.held and gate.value == f"max_tokens={first} mixed_input_from={first}"


def test_forced_tiles_past_the_mixed_input_bands_name_the_rows_copy() -> None:
    plan = make_plan(SPEC, h100(4096), force={"weight_layout": "int4_tiles"})
    stage = plan.stage("weight_layout")
    assert stage.choice == "int4_tiles" and stage.forced
    assert "rows copy (twice the codes' memory)" in stage.summary
    assert make_plan(SPEC, h100(4), force={"weight_layout": "row_major"}).stage("weight_layout").choice == "row_major"


@pytest.mark.parametrize("quant", [Quant.NONE, Quant.W8A16, Quant.WFP4A16, Quant.FP8])
def test_tiles_are_refused_without_int4_codes(quant: Quant) -> None:
    spec = dataclasses.replace(SPEC, quant=quant, quant_group_size=32 if quant is Quant.WFP4A16 else 128)
    assert make_plan(spec, h100(16)).stage("weight_layout").choice != "int4_tiles"
    with pytest.raises(UnsupportedCombination, match="int4_tiles_quant"):
        make_plan(spec, h100(16), force={"weight_layout": "int4_tiles"})


@pytest.mark.parametrize("group, zeros", [(128, True), (64, False), (None, False)])
def test_runner_weights_in_tiles_mean_the_same_layer(group: int | None, zeros: bool) -> None:
    """plan_weights under int4_tiles: W1 / W2 (the MoEWeights' and the WoqWeights' same tensors) in tiles, every
    expert dequantizing to the rows' weights; the decode kernels' operand is the tiles (kind int4_tiles) and the
    mixed-input kernel's the rows."""
    w = MoEWeights.random(SPEC, seed=3).quantized_woq(WoqKind.INT4, group, asymmetric=zeros, seed=3)
    spec = SPEC.with_overrides(quant_group_size=group or 128, **w.woq.storage_flags())
    plan = make_plan(spec, h100(16))
    tiled = plan_weights(plan, w)
    ordered = (w.gate_up_interleaved() if w1_interleaved(plan) else w).woq  # W1 in the plan's w1_order, in rows
    q = tiled.woq
    assert q.int4_tiles and tiled.w1 is q.w1 and tiled.w2 is q.w2
    for name in ("w1", "w2"):
        assert torch.equal(getattr(q, name), int4_tiles(getattr(ordered, name))), name
        for x in range(SPEC.num_experts):
            assert torch.equal(q.dequantized_w(name, x), ordered.dequantized_w(name, x)), (name, x)
        decode = stored_operand(q, name)
        assert decode.kernel_kind == "int4_tiles" and decode.data is getattr(q, name)
        assert torch.equal(wgmma_operand(q, name, torch.bfloat16).data, getattr(ordered, name))
    rows = plan_weights(make_plan(spec, h100(4096)), w)
    assert not rows.woq.int4_tiles and stored_operand(rows.woq, "w1").kernel_kind == "int4"
