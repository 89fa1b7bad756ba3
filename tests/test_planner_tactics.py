"""The GEMM tactic table (moe_build/planner/tactics/) and the tactic stages of the plan.

What must hold: the bands a plan records give, at every token count, the tactic the rules give at that
count (no count falls between bands or into the wrong one); the rules say what their comments say at the
thresholds (expected values written here from the documented conditions); tactic names round-trip; a
forced tactic holds at every count and one the GEMM cannot run is refused naming the field.
"""
from __future__ import annotations

import dataclasses
import math
import random

import pytest

from moe_build.errors import MoeBuildError
from moe_build.planner import make_plan
from moe_build.planner.tactics import GemmCall, GemmTactic, RowCount, choose_tactic, tactic_bands, tactic_problem
from moe_build.planner.tactics.fp8 import FP8_BLOCK_SLOW_MEMORY
from moe_build.planner.tactics.woq import (WOQ_TILE_FIXED_ROW_K, WOQ_TILE_FIXED_ROWS, woq_digits_rows, woq_staged_rows,
                                           woq_tile_cost)
from moe_build.spec import MoESpec, Quant
from moe_build.target import DEFAULT_GPU, GPU_PARTS, SUPPORTED_SMS, Flavour, Target, TokenProfile, resolve_target

H100 = Target(sm=90, flavour=Flavour.TENSORRT, sm_count=132, l2_bytes=50 << 20)
A100 = Target(sm=80, flavour=Flavour.TENSORRT, sm_count=108, l2_bytes=40 << 20)
QWEN3 = MoESpec(2048, 768, 128, 8)       # 128 experts, top-8: avg rows = ceil(tokens / 16)
MIXTRAL = MoESpec(4096, 14336, 8, 2)     # 8 experts, top-2: avg rows = ceil(tokens / 4)
GPT_OSS = MoESpec(2880, 2880, 32, 4)     # avg rows = ceil(tokens / 8)
H200_MEMORY = 4_800 * 10**9              # an H200's peak DRAM rate (its data sheet)


def call(**kw: object) -> GemmCall:
    base = dict(sm=90, entry="sm90", epilogue="gated", n=1536, k=2048, experts=128, top_k=8, itemsize=2,
                weights_blocked=False, sm_count=132, l2_bytes=50 << 20,
                memory_bytes_per_s=DEFAULT_GPU[90].memory_bytes_per_s)
    return GemmCall(**{**base, **kw})  # type: ignore[arg-type]


def at(c: GemmCall, tokens: int) -> str:
    return choose_tactic(c, RowCount(tokens, c.top_k, c.experts)).name


def random_call(rng: random.Random) -> GemmCall:
    """A GEMM the planner could make: the sm90 entry on sm90 only, the finalize epilogue and 64 x 64 weight
    blocks with it only (the weight_layout and finalize stages' gates); 16-bit, FP8 (rowwise or block-128 scales)
    or weight-only (int4 in groups or per row, with 16-bit or e4m3 activations, int8, MXFP4), blocked weights
    16-bit only and the gated epilogue never quantized (the fc1_activation stage's gates)."""
    entry = rng.choice(["sm80", "sm90"])
    sm = 90 if entry == "sm90" else rng.choice([80, 86, 89, 90])
    quant = rng.choice(["none", "none", "rowwise", "block128", "int4", "int8", "mxfp4"])
    fp8 = quant if quant in ("rowwise", "block128") else "none"
    woq = quant if quant in ("int4", "int8", "mxfp4") else "none"
    epilogues = ["store"] + (["gated"] if quant == "none" else []) + (["finalize"] if entry == "sm90" else [])
    return call(sm=sm, entry=entry, epilogue=rng.choice(epilogues),
                n=rng.choice([128, 1536, 2880, 5760, 28672]), k=rng.choice([256, 768, 2048, 4096]),
                experts=rng.choice([4, 8, 16, 32, 60, 64, 128, 256]), top_k=rng.choice([1, 2, 4, 6, 8, 12]),
                itemsize=1 if quant in ("rowwise", "block128", "int8") else 2,
                weights_blocked=entry == "sm90" and quant == "none" and rng.random() < 0.3,
                sm_count=rng.choice([84, 108, 132]), l2_bytes=rng.choice([6, 40, 50, 60]) << 20,
                memory_bytes_per_s=rng.choice([936, 2_039, 3_352, 4_800]) * 10**9, fp8=fp8, woq=woq,
                woq_group=32 if woq == "mxfp4" else rng.choice([0, 64, 128]) if woq != "none" else 0)


@pytest.mark.parametrize("seed", range(40))
def test_bands_give_the_rules_answer_at_every_count(seed: int) -> None:
    rng = random.Random(seed)
    c = random_call(rng)
    bands = tactic_bands(c)
    assert bands[0][0] == 1 and bands[-1][1] is None
    assert all(a[1] is not None and a[1] + 1 == b[0] for a, b in zip(bands, bands[1:]))
    assert all(a[2] != b[2] for a, b in zip(bands, bands[1:]))  # adjacent bands differ
    counts = list(range(1, 4097)) + [rng.randrange(4097, 1 << 20) for _ in range(500)]
    for t in counts:
        band = next(b for b in bands if b[0] <= t and (b[1] is None or t <= b[1]))
        assert band[2] == choose_tactic(c, RowCount(t, c.top_k, c.experts)), (c, t)


def test_kernel_and_tiles_at_the_documented_thresholds() -> None:
    gated = call()  # Qwen3-30B-A3B GEMM1: 128 experts, top-8, gated epilogue
    assert at(gated, 128) == "decode:ksplit2:after_trigger:plain"        # 8 rows per expert
    assert at(gated, 129) == "wgmma:pingpong64x128:plain:evict_last"     # 9 rows: the wgmma kernel
    assert at(gated, 512) == "wgmma:pingpong64x128:placed:evict_last"    # 32 rows: placed from 32
    assert at(gated, 513) == "wgmma:pingpong64x256:placed:evict_last"    # 33 rows: one-CTA 64x256
    assert at(gated, 16384) == "wgmma:pingpong64x256:placed:evict_last"  # 1024 rows
    assert at(gated, 16385) == "wgmma:pingpong64x256c2:plain:evict_last"  # 1025 rows: 2x1 clusters
    store = call(epilogue="store", n=2048, k=768)
    assert at(store, 512) == "wgmma:pingpong64x128:plain:plain"
    assert at(store, 513) == "wgmma:pingpong64x256c2:plain:plain"       # past 32 rows
    fin = call(epilogue="finalize", n=2048, k=768)
    assert at(fin, 64) == "decode:ksplit2:after_trigger:plain"            # 4 rows
    assert at(fin, 65) == "wgmma:pingpong64x128:after_trigger:evict_last"  # 5 rows: the finalize GEMM leaves decode
    assert at(fin, 129) == "wgmma:pingpong64x128:after_trigger:evict_last"
    assert at(fin, 1024) == "wgmma:pingpong64x128:placed:evict_last"    # 64 rows
    assert at(fin, 1025) == "wgmma:pingpong64x256:placed:evict_last"


def test_placement_needs_an_expert_that_fits_in_l2() -> None:
    mixtral_gemm1 = call(n=2 * 14336, k=4096, experts=8, top_k=2)       # 235 MB per expert
    assert at(mixtral_gemm1, 4096) == "wgmma:pingpong64x256:plain:evict_last"
    small_l2 = call(l2_bytes=4 << 20)                                    # Qwen3 GEMM1: 6.3 MB per expert
    assert at(small_l2, 4096).split(":")[2] == "plain" and at(call(), 4096).split(":")[2] == "placed"


def test_narrow_columns_and_blocked_weights() -> None:
    gpt_oss_gemm2 = call(epilogue="store", n=2880, k=2880, experts=32, top_k=4)
    assert at(gpt_oss_gemm2, 4096) == "wgmma:pingpong64x192c2:plain:plain"  # 2880 = 15 x 192
    assert at(dataclasses.replace(gpt_oss_gemm2, weights_blocked=True), 4096) == "wgmma:pingpong64x256c2:plain:plain"
    assert at(call(epilogue="store", n=4096, k=14336, experts=8, top_k=2), 4096) == "wgmma:pingpong64x256c2:plain:plain"


def test_decode_k_split_follows_the_grid_size() -> None:
    # Mixtral GEMM2 (store, n = 4096): 16 columns x 4 warp groups = 64 columns a CTA, 64 column blocks;
    # 132 SMs: 8 slices while min(8 experts, rows) * 64 < 132, i.e. rows < 3 (one token of top-2).
    mixtral_gemm2 = call(epilogue="store", n=4096, k=14336, experts=8, top_k=2)
    assert at(mixtral_gemm2, 1) == "decode:ksplit8:after_trigger:plain"
    assert at(mixtral_gemm2, 2) == "decode:ksplit2:after_trigger:plain"
    # a small grid at any count: 4 experts x 2 column blocks < 132 CTAs
    tiny = call(epilogue="store", n=128, k=256, experts=4, top_k=2)
    assert {at(tiny, t) for t in (1, 8, 16)} == {"decode:ksplit8:after_trigger:plain"}


def test_sm80_entry_runs_decode_then_mma_tiles() -> None:
    c = call(sm=80, entry="sm80", epilogue="store", n=2048, k=768)
    assert at(c, 128) == "decode:ksplit2:plain:plain"
    assert [at(c, t) for t in (129, 256, 257, 1024, 1025)] == [
        "mma:16x64:plain:plain", "mma:16x64:plain:plain", "mma:64x128:plain:plain", "mma:64x128:plain:plain",
        "mma:128x128:plain:plain"]
    assert at(dataclasses.replace(c, sm=90), 1) == "decode:ksplit2:after_trigger:plain"  # forced ampere on Hopper


@pytest.mark.parametrize("name", ["decode:ksplit1:plain:plain", "decode:ksplit8:after_trigger:plain",
                                  "mma:128x128:plain:plain", "wgmma:coop128x256:plain:plain",
                                  "wgmma:pingpong64x192c2:after_trigger:evict_last",
                                  "wgmma:coop128x128c2:after_trigger:evict_last", "wgmma:coop128x192:plain:plain",
                                  "wgmma:coop128x192c2:after_trigger:plain"])
def test_tactic_names_round_trip(name: str) -> None:
    assert GemmTactic.parse(name).name == name


@pytest.mark.parametrize("name,field", [("wgmma:pingpong64x128:plain", "KERNEL:TILE"), ("tpu:x:plain:plain", "kernel"),
                                        ("decode:64x128:plain:plain", "ksplit"), ("mma:64x64:plain:plain", "tile"),
                                        ("wgmma:pingpong64x128:soon:plain", "launch"),
                                        ("wgmma:pingpong64x128:plain:l1", "output_l2")])
def test_bad_tactic_names_are_one_line_errors(name: str, field: str) -> None:
    with pytest.raises(MoeBuildError, match=field) as info:
        GemmTactic.parse(name)
    assert info.value.field == "force" and "\n" not in str(info.value)


def test_fp8_fast_short_finalize_leaves_decode_for_narrow_clusters() -> None:
    """FP8_FINALIZE_C2_MAX_AVG_ROWS: with fast accumulation a finalize GEMM2 of K up to 4096
    (FP8_FINALIZE_C2_MAX_K) takes pingpong64x128c2 from the end of the decode band to 48 rows per expert at any width,
    then pingpong64x128 below 5760 columns; longer K, the plain store, promoted accumulation and block-128 scales keep
    pingpong64x128; the same GEMM2 leaves the decode kernel past 1 row per expert (FP8_FINALIZE_DECODE_MAX_AVG_ROWS),
    longer K past 6. Qwen3-30B-A3B's GEMM2 (2048 columns, 128 experts, top-8): avg rows ceil(tokens / 16)."""
    qwen3_down = call(epilogue="finalize", n=2048, k=768, itemsize=1, fp8="rowwise", fp8_accumulation="fast")
    assert [at(qwen3_down, t) for t in (16, 17, 256, 768, 769)] == [
        "decode:ksplit1:after_trigger:plain", "wgmma:pingpong64x128c2:after_trigger:evict_last",
        "wgmma:pingpong64x128c2:after_trigger:evict_last", "wgmma:pingpong64x128c2:after_trigger:evict_last",
        "wgmma:pingpong64x128:after_trigger:evict_last"]
    assert at(dataclasses.replace(qwen3_down, epilogue="store"), 256) == "wgmma:pingpong64x128:plain:plain"
    assert at(dataclasses.replace(qwen3_down, k=4096), 256) == "wgmma:pingpong64x128c2:after_trigger:evict_last"
    assert at(dataclasses.replace(qwen3_down, k=4097), 256) == "wgmma:pingpong64x128:after_trigger:evict_last"
    # FP8_FINALIZE_DECODE_MAX_AVG_ROWS: K up to 4096 leaves the decode kernel past 1 row (above: 16 -> 17 tokens),
    # Mixtral-8x7B's GEMM2 (K 14336) past 6 (avg rows ceil(tokens / 4))
    mixtral_down = call(epilogue="finalize", n=4096, k=14336, experts=8, top_k=2, itemsize=1, fp8="rowwise",
                        fp8_accumulation="fast")
    assert [at(mixtral_down, t).split(":")[0] for t in (5, 24, 25)] == ["decode", "decode", "wgmma"]
    assert at(dataclasses.replace(qwen3_down, epilogue="store"), 17).startswith("decode:")
    assert at(dataclasses.replace(qwen3_down, fp8_accumulation="promoted"), 256) == \
        "wgmma:pingpong64x128:after_trigger:evict_last"
    assert at(dataclasses.replace(qwen3_down, fp8="block128", fp8_accumulation="promoted"), 256) == \
        "wgmma:pingpong64x128:after_trigger:evict_last"


@pytest.mark.parametrize("c,name,problem", [
    (call(entry="sm80"), "wgmma:pingpong64x128:plain:plain", "sm90 GEMMs"),
    (call(weights_blocked=True), "mma:64x128:plain:plain", "row-major"),
    (call(weights_blocked=True), "wgmma:pingpong64x192c2:plain:plain", "64 x 64"),
    (call(epilogue="store"), "wgmma:pingpong64x128:placed:plain", "placed launch"),
    (call(), "wgmma:pingpong64x256c2:placed:evict_last", "placed launch"),
    (call(epilogue="store"), "wgmma:pingpong64x128:plain:evict_last", "evict_last"),
    (call(), "decode:ksplit2:plain:evict_last", "evict_last"),
    (call(), "mma:64x128:after_trigger:plain", "plainly"),
])
def test_tactics_a_gemm_cannot_run(c: GemmCall, name: str, problem: str) -> None:
    assert problem in (tactic_problem(c, GemmTactic.parse(name)) or "")


def test_every_rule_tactic_is_runnable() -> None:
    rng = random.Random(7)
    for _ in range(200):
        c = random_call(rng)
        for _, _, tactic in tactic_bands(c):
            assert tactic_problem(c, tactic) is None, (c, tactic)
        # weight-only GEMMs: row-major weights, the plain store or (GEMM2 on the sm90 entry) the finalize epilogue
        plain = dataclasses.replace(c, fp8="none", woq="none", woq_group=0, weights_blocked=False)
        for woq in ("int4", "int8", "mxfp4"):
            epilogue = rng.choice(["store", "finalize"]) if c.entry == "sm90" else "store"
            w = dataclasses.replace(plain, woq=woq, epilogue=epilogue, woq_group=32 if woq == "mxfp4" else 128)
            for _, _, tactic in tactic_bands(w):
                assert tactic_problem(w, tactic) is None, (w, tactic)
        # FP8 GEMMs: row-major weights, the plain store or (GEMM2 on the sm90 entry) the finalize epilogue
        for fp8 in ("rowwise", "block128"):
            epilogue = rng.choice(["store", "finalize"]) if c.entry == "sm90" else "store"
            f = dataclasses.replace(plain, fp8=fp8, itemsize=1, epilogue=epilogue)
            for _, _, tactic in tactic_bands(f):
                assert tactic_problem(f, tactic) is None, (f, tactic)


def test_fp8_finalize_gemm2_tactics() -> None:
    """The FP8 GEMM2 with the finalize epilogue keeps the FP8 kernel and tile thresholds (decode while rowwise
    has <= 6 rows per expert and < 256 rows, block128 < 64 rows on a GPU of faster memory than FP8_BLOCK_SLOW_MEMORY,
    here an H200's; pingpong64x128 to 32 rows per expert, then
    coop128x128), launches after a trigger to 64 rows per expert and plainly above, never by placement (at 32
    rows a 16-bit finalize GEMM2 would be placed), and writes under evict_last on the wgmma kernel."""
    qwen3_down = call(epilogue="finalize", n=2048, k=768, itemsize=1, fp8="rowwise")  # avg rows ceil(tokens / 16)
    assert [at(qwen3_down, t) for t in (31, 32, 512, 513, 1024, 1025)] == [
        "decode:ksplit1:after_trigger:plain", "wgmma:pingpong64x128:after_trigger:evict_last",
        "wgmma:pingpong64x128:after_trigger:evict_last", "wgmma:coop128x128:after_trigger:evict_last",
        "wgmma:coop128x128:after_trigger:evict_last", "wgmma:coop128x128:plain:evict_last"]
    assert at(dataclasses.replace(qwen3_down, fp8="none", itemsize=2), 512) == "wgmma:pingpong64x128:placed:evict_last"
    # on an H200, decode below 64 rows: 7 tokens (56 x 16 CTAs: two an SM)
    block = dataclasses.replace(qwen3_down, fp8="block128", memory_bytes_per_s=H200_MEMORY)
    assert [at(block, t) for t in (7, 8)] == ["decode:twocta_ksplit1:after_trigger:plain",
                                              "wgmma:pingpong64x128:after_trigger:evict_last"]
    assert at(dataclasses.replace(qwen3_down, epilogue="store"), 1025) == "wgmma:coop128x128:plain:plain"
    # few experts: the average bound first (Mixtral-8x7B, avg rows ceil(tokens / 4): 6 at 24 tokens, 7 at 25)
    mixtral_down = call(epilogue="finalize", n=4096, k=14336, experts=8, top_k=2, itemsize=1, fp8="rowwise")
    assert [at(mixtral_down, t).split(":")[0] for t in (24, 25)] == ["decode", "wgmma"]


def test_fp8_rowwise_decode_split_keeps_one_wave_of_short_slices() -> None:
    """FP8_DECODE_WAVE_SLICE_BYTES: rowwise decode K slices double while they stay >= 1024 bytes, but not to slices
    under 2048 bytes where the CTAs (non-empty experts x column blocks of 128 / k_split rows) fit in one wave of two
    an SM and the doubled ones would be more than one wave and at most one and a half (132 SMs: 264 < CTAs <= 396);
    longer slices split on, and block-128 scales keep their own rule."""
    gpt_oss_up = call(n=5760, k=2880, experts=32, top_k=4, itemsize=1, fp8="rowwise")
    # 1 token: 4 experts x 45 column blocks = 180 CTAs unsplit, 360 at 2 slices of 1440 bytes: stays unsplit;
    # 2 tokens: 8 experts, 360 CTAs unsplit (already past one wave): 2 slices
    assert [at(gpt_oss_up, t) for t in (1, 2)] == ["decode:ksplit1:after_trigger:plain",
                                                  "decode:ksplit2:after_trigger:plain"]
    gpt_oss_down = call(epilogue="finalize", n=2880, k=2880, experts=32, top_k=4, itemsize=1, fp8="rowwise")
    # 1 token: 4 x 23 = 92 unsplit, 180 at 2 slices (one wave): 2 slices; 2 tokens: 184 unsplit, 360 at 2: unsplit
    assert [at(gpt_oss_down, t) for t in (1, 2)] == ["decode:ksplit2:after_trigger:plain",
                                                    "decode:ksplit1:after_trigger:plain"]
    qwen3_up = call(k=2048, itemsize=1, fp8="rowwise")  # 12 column blocks unsplit, 24 at 2 slices of 1024 bytes
    # 1 token (8 experts): 96 / 192; 2 tokens (16): 192 / 384; 3 tokens (24): 288 unsplit, already past one wave
    assert [at(qwen3_up, t) for t in (1, 2, 3)] == ["decode:ksplit2:after_trigger:plain",
                                                   "decode:ksplit1:after_trigger:plain",
                                                   "decode:ksplit2:after_trigger:plain"]
    # slices of 2048 bytes and more split on: DeepSeek-V3's GEMM1 at 1 token (8 experts x 32 = 256 unsplit, 512 at 2)
    dsv3_up = call(n=4096, k=7168, experts=256, top_k=8, itemsize=1, fp8="rowwise")
    assert at(dsv3_up, 1) == "decode:ksplit4:after_trigger:plain"
    mixtral_down = call(epilogue="finalize", n=4096, k=14336, experts=8, top_k=2, itemsize=1, fp8="rowwise")
    assert at(mixtral_down, 3) == "decode:ksplit8:after_trigger:plain"  # 6 x 32 = 192 unsplit, 384 at 2
    assert at(dataclasses.replace(gpt_oss_up, fp8="block128"), 1) == "decode:twocta_ksplit1:after_trigger:plain"


def test_fp8_rowwise_finalize_gemm2_keeps_minimum_slices_whole_past_one_wave() -> None:
    """A rowwise GEMM2 with the finalize epilogue does not halve into slices of 1024 bytes (the minimum) where its
    unsplit CTAs fill a wave of two an SM (132 SMs: >= 264); the plain store, longer slices and fewer CTAs split."""
    dsv3_down = call(epilogue="finalize", n=7168, k=2048, experts=256, top_k=8, itemsize=1, fp8="rowwise")
    # 56 column blocks unsplit: 1 token 8 experts x 56 = 448 CTAs, past one wave at every count
    assert {at(dsv3_down, t) for t in (1, 2, 4, 16, 31)} == {"decode:ksplit1:after_trigger:plain"}
    assert at(dataclasses.replace(dsv3_down, epilogue="store"), 1) == "decode:ksplit2:after_trigger:plain"
    # 4 column blocks (n 512): 8 experts x 4 = 32 CTAs, 64 at 2 slices, both in one wave: 2 slices
    assert at(dataclasses.replace(dsv3_down, n=512), 1) == "decode:ksplit2:after_trigger:plain"
    # top-1 over 64 experts, n 8448 (66 column blocks): 2 tokens 132 CTAs unsplit, 264 at 2 slices (one wave):
    # 2 slices; 4 tokens 264 unsplit, one wave already: unsplit (3 tokens stay unsplit by the short second wave)
    wide = call(epilogue="finalize", n=8448, k=2048, experts=64, top_k=1, itemsize=1, fp8="rowwise")
    assert [at(wide, t) for t in (2, 4)] == ["decode:ksplit2:after_trigger:plain", "decode:ksplit1:after_trigger:plain"]
    # slices of 1440 bytes split on: GPT-OSS-20B's GEMM2 at 4 tokens (16 experts x 23 = 368 CTAs unsplit)
    gpt_oss_down = call(epilogue="finalize", n=2880, k=2880, experts=32, top_k=4, itemsize=1, fp8="rowwise")
    assert at(gpt_oss_down, 4) == "decode:ksplit2:after_trigger:plain"


def test_fp8_fast_accumulation_keeps_pingpong_to_128_rows() -> None:
    """FP8_FAST_NARROW_MAX_AVG_ROWS: with fast accumulation (rowwise scales) pingpong64x128 runs to 128 rows per
    expert, then coop128x192 (from FP8_WIDE_MIN_AVG_ROWS); promoted accumulation keeps pingpong to 32 rows and
    block-128 scales to 40 (FP8_BLOCK_NARROW_MAX_AVG_ROWS), then coop128x128 (block-128 stays there). Qwen3's GEMM1:
    avg rows ceil(tokens / 16)."""
    fast = call(epilogue="store", itemsize=1, fp8="rowwise", fp8_accumulation="fast")
    assert [at(fast, t) for t in (512, 513, 2048, 2049)] == [
        "wgmma:pingpong64x128:plain:plain", "wgmma:pingpong64x128:plain:plain", "wgmma:pingpong64x128:plain:plain",
        "wgmma:coop128x192:plain:plain"]
    promoted = dataclasses.replace(fast, fp8_accumulation="promoted")
    assert [at(promoted, t) for t in (512, 513, 2049)] == [
        "wgmma:pingpong64x128:plain:plain", "wgmma:coop128x128:plain:plain", "wgmma:coop128x192:plain:plain"]
    block = dataclasses.replace(fast, fp8="block128", fp8_accumulation="promoted")
    assert [at(block, t) for t in (512, 513, 640, 641, 2049)] == [
        "wgmma:pingpong64x128:plain:plain", "wgmma:pingpong64x128:plain:plain", "wgmma:pingpong64x128:plain:plain",
        "wgmma:coop128x128:plain:plain", "wgmma:coop128x128:plain:plain"]
    with pytest.raises(ValueError, match="fp8_accumulation 'slow'"):
        dataclasses.replace(fast, fp8_accumulation="slow")


def test_fp8_fast_accumulation_takes_pingpong128_where_measured() -> None:
    """fp8_pingpong128_rule: with fast accumulation the gated GEMM1 takes pingpong128x128 in 2x1 clusters from 256
    average rows per expert, and the single-CTA tile from 33 where k is at least 7168 (DeepSeek-V3's), and the finalize
    GEMM2 pingpong128x128c2 from 192; the plain store, promoted accumulation and block-128 scales keep their tiles."""
    mixtral_up = call(epilogue="gated", n=28672, k=4096, experts=8, top_k=2, itemsize=1, fp8="rowwise",
                      fp8_accumulation="fast")  # avg rows = tokens / 4
    assert [at(mixtral_up, t) for t in (1020, 1021, 1024)] == [
        "wgmma:coop128x192:plain:evict_last", "wgmma:pingpong128x128c2:plain:evict_last",
        "wgmma:pingpong128x128c2:plain:evict_last"]
    mixtral_down = dataclasses.replace(mixtral_up, epilogue="finalize", n=4096, k=14336)
    assert [at(mixtral_down, t) for t in (764, 765, 4096)] == [
        "wgmma:coop128x192:plain:evict_last", "wgmma:pingpong128x128c2:plain:evict_last",
        "wgmma:pingpong128x128c2:plain:evict_last"]
    assert at(dataclasses.replace(mixtral_up, epilogue="store"), 4096).startswith("wgmma:coop128x192:")
    assert at(dataclasses.replace(mixtral_up, fp8_accumulation="promoted"), 4096).startswith("wgmma:coop128x192:")
    assert at(dataclasses.replace(mixtral_up, fp8="block128", fp8_accumulation="promoted"), 4096).startswith(
        "wgmma:coop128x128:")
    dsv3_up = call(epilogue="gated", n=4096, k=7168, experts=256, itemsize=1, fp8="rowwise", fp8_accumulation="fast")
    assert [at(dsv3_up, t) for t in (1024, 1025, 4096)] == [
        "wgmma:pingpong64x128:plain:evict_last", "wgmma:pingpong128x128:plain:evict_last",
        "wgmma:pingpong128x128:plain:evict_last"]
    assert at(dataclasses.replace(dsv3_up, k=7167), 1025) == "wgmma:pingpong64x128:plain:evict_last"
    assert at(dataclasses.replace(dsv3_up, k=7167), 8192) == "wgmma:pingpong128x128c2:plain:evict_last"
    assert at(dsv3_up, 8192) == "wgmma:pingpong128x128:plain:evict_last"


def test_fp8_fast_accumulation_runs_wide_narrow_gemms_in_clusters() -> None:
    """FP8_NARROW_C2_MIN_N: past 32 rows per expert (where an expert has two or three 64-row tiles) a fast-accumulating
    GEMM at least 5760 columns wide takes pingpong64x128c2, its row tiles two by two on one multicast weight tile (to
    128 rows, then coop128x192); narrower ones keep pingpong64x128, and promoted accumulation and block-128 scales do
    not change. DeepSeek-V3's GEMM2 (7168 columns, 256 experts, top-8): avg rows ceil(tokens / 32)."""
    dsv3_down = call(epilogue="finalize", n=7168, k=2048, experts=256, itemsize=1, fp8="rowwise",
                     fp8_accumulation="fast")
    assert [at(dsv3_down, t) for t in (2048, 2049, 4096, 4097)] == [
        "wgmma:pingpong64x128c2:after_trigger:evict_last", "wgmma:pingpong64x128c2:plain:evict_last",
        "wgmma:pingpong64x128c2:plain:evict_last", "wgmma:coop128x192:plain:evict_last"]
    assert at(dataclasses.replace(dsv3_down, n=5759), 4096) == "wgmma:pingpong64x128:plain:evict_last"
    assert at(dataclasses.replace(dsv3_down, epilogue="store", n=5759), 1025) == "wgmma:pingpong64x128:plain:plain"
    assert at(dataclasses.replace(dsv3_down, epilogue="store"), 1025) == "wgmma:pingpong64x128c2:plain:plain"
    assert at(dataclasses.replace(dsv3_down, n=5760), 4096) == "wgmma:pingpong64x128c2:plain:evict_last"
    assert at(dataclasses.replace(dsv3_down, fp8_accumulation="promoted"), 4096) == \
        "wgmma:coop128x128:plain:evict_last"
    assert at(dataclasses.replace(dsv3_down, fp8="block128", fp8_accumulation="promoted"), 4096) == \
        "wgmma:coop128x128:plain:evict_last"


@pytest.mark.parametrize("c,name,problem", [
    (call(epilogue="finalize", fp8="rowwise"), "wgmma:pingpong64x128:placed:evict_last", "plainly or after a trigger"),
    (call(epilogue="store", fp8="rowwise"), "wgmma:coop128x128:plain:evict_last", "evict_last"),
    (call(epilogue="finalize", fp8="block128"), "wgmma:coop128x256:plain:evict_last", "block128 tiles"),
    (call(epilogue="finalize", fp8="rowwise"), "mma:64x128:plain:plain", "no FP8 kernel"),
    (call(epilogue="store", fp8="block128"), "wgmma:coop128x192:plain:plain", "block128 tiles"),
    (call(epilogue="finalize", fp8="block128"), "wgmma:coop128x192c2:plain:evict_last", "block128 tiles"),
    (call(epilogue="finalize", fp8="rowwise"), "wgmma:coop128x128c2:placed:evict_last", "plainly or after a trigger"),
    (call(epilogue="store", fp8="rowwise"), "wgmma:coop128x192c2:plain:evict_last", "evict_last"),
    (call(epilogue="store", fp8="rowwise"), "wgmma:pingpong64x256c2:plain:plain", "rowwise tiles"),
    (call(epilogue="finalize", fp8="block128"), "wgmma:pingpong128x128:plain:evict_last", "block128 tiles"),
    (call(epilogue="gated", fp8="rowwise", fp8_accumulation="promoted"), "wgmma:pingpong128x128:plain:evict_last",
     "fast accumulation only"),
])
def test_tactics_the_fp8_gemm_cannot_run(c: GemmCall, name: str, problem: str) -> None:
    assert problem in (tactic_problem(c, GemmTactic.parse(name)) or "")
    assert tactic_problem(call(epilogue="finalize", fp8="rowwise"),
                          GemmTactic.parse("wgmma:coop128x256:after_trigger:evict_last")) is None


@pytest.mark.parametrize("fp8,tile", [("rowwise", "coop128x128c2"), ("rowwise", "coop128x192"),
                                      ("rowwise", "coop128x192c2"), ("block128", "coop128x128c2"),
                                      ("rowwise", "pingpong64x128c2"), ("block128", "pingpong64x128c2")])
@pytest.mark.parametrize("epilogue", ["store", "finalize"])
def test_the_fp8_gemm_runs_its_wide_tiles(fp8: str, tile: str, epilogue: str) -> None:
    """The 2x1-cluster and 128x192 FP8 tiles can be forced with either epilogue, plainly or after a trigger; the
    16-bit GEMMs refuse them."""
    f = call(epilogue=epilogue, fp8=fp8, itemsize=1)
    l2 = "evict_last" if epilogue == "finalize" else "plain"
    for launch in ("plain", "after_trigger"):
        assert tactic_problem(f, GemmTactic.parse(f"wgmma:{tile}:{launch}:{l2}")) is None
    assert "FP8 GEMM's tile" in (tactic_problem(call(), GemmTactic.parse(f"wgmma:{tile}:plain:plain")) or "")


@pytest.mark.parametrize("epilogue", ["store", "gated", "finalize"])
def test_the_fp8_pingpong_128_tile_runs_with_fast_accumulation(epilogue: str) -> None:
    """pingpong128x128 (a warpgroup's tile two 64-row wgmmas) holds no promoted accumulators: rowwise scales with fast
    accumulation run it with every epilogue; the 16-bit and weight-only GEMMs refuse it."""
    f = call(epilogue=epilogue, fp8="rowwise", fp8_accumulation="fast", itemsize=1)
    l2 = "plain" if epilogue == "store" else "evict_last"
    for launch in ("plain", "after_trigger"):
        assert tactic_problem(f, GemmTactic.parse(f"wgmma:pingpong128x128:{launch}:{l2}")) is None
    assert "FP8 GEMM's tile" in (tactic_problem(call(), GemmTactic.parse("wgmma:pingpong128x128:plain:plain")) or "")
    assert "FP8 GEMM's tile" in (tactic_problem(call(woq="int8"), GemmTactic.parse("wgmma:pingpong128x128:plain:plain"))
                                 or "")


def test_weight_only_gemms_run_decode_then_the_woq_mma_tiles() -> None:
    """Where the mixed-input kernel cannot take the weights (group 32 here), or on the sm80 entry: decode to 8
    average rows per expert, then the 64-row woq mma tile (on sm80 to 64 rows, then the 128-row one); the decode K
    split doubled while the CTAs (non-empty experts x column blocks) fit one per SM."""
    c = call(epilogue="store", woq="int4", woq_group=32)  # Qwen3-30B-A3B's GEMM1: 8 experts x 12 blocks at 1 token
    assert [at(c, t) for t in (1, 2, 128, 129, 1024, 1025, 2544)] == [
        "decode:ksplit2:after_trigger:plain", "decode:ksplit1:after_trigger:plain",
        "decode:ksplit1:after_trigger:plain", "mma:64x128:plain:plain", "mma:64x128:plain:plain",
        "mma:64x128:plain:plain", "mma:64x128:plain:plain"]
    assert at(dataclasses.replace(c, entry="sm80"), 1024) == "mma:64x128:plain:plain"
    assert at(dataclasses.replace(c, woq_group=128, entry="sm80"), 1025) == "mma:128x128:plain:plain"
    # Mixtral's GEMM2 at 1 token: 2 experts x 32 / 64 / 128 column blocks at 1 / 2 / 4 slices (int8 in groups of 32,
    # which the digits tile does not take)
    mixtral_down = call(epilogue="store", woq="int8", itemsize=1, woq_group=32, n=4096, k=14336, experts=8, top_k=2)
    assert at(mixtral_down, 1) == "decode:ksplit4:after_trigger:plain"
    assert at(dataclasses.replace(mixtral_down, sm_count=100), 1) == "decode:ksplit2:after_trigger:plain"
    assert call(woq="int4", n=4096, k=4096).expert_weight_bytes == 4096 * 4096 // 2


@pytest.mark.parametrize("name, problem", [("wgmma:pingpong64x128:plain:evict_last", "plainly, with plain outputs"),
                                           ("wgmma:coop128x128:plain:plain", "the FP8 GEMM's tile"),
                                           ("mma:16x64:plain:plain", "tiles are 64x128, 128x128"),
                                           ("decode:ksplit2:placed:plain", "plainly or after a trigger")])
def test_tactics_the_weight_only_gemm_cannot_run(name: str, problem: str) -> None:
    assert problem in (tactic_problem(call(epilogue="store", woq="mxfp4"), GemmTactic.parse(name)) or "")


def test_weight_only_int4_decode_stages_token_rows_where_they_fit() -> None:
    """The int4 forms with one scale per row or per 128 k (k % 128 == 0), or per 64 k (k % 64 == 0), run the decode
    kernel staged (token rows in shared memory) while a chunk's rows, min(8, tokens * top_k), fit its 104 KB:
    (104 KB - 256) // (k_split * (slice in whole 128-k batches * 2 + 64)) rows, gemm/woq_decode.cu staged_smem; the
    band ends where they stop fitting. Every other form, and a forced staged tactic whose 8-row chunks do not fit, is
    refused."""
    mixtral_down = call(epilogue="store", woq="int4", woq_group=128, n=4096, k=14336, experts=8, top_k=2)
    assert [woq_staged_rows(mixtral_down, s) for s in (1, 2, 4, 8)] == [3, 3, 3, 3]  # 106240 // 28736 etc.
    assert woq_staged_rows(dataclasses.replace(mixtral_down, k=12416), 1) == 4  # 106240 // 24896
    assert woq_staged_rows(dataclasses.replace(mixtral_down, k=4096), 1) == 8   # capped at a chunk's 8 rows
    # 1 token: 2 rows fit (split 4; with 16-bit activations the digits tile takes them, woq_digits_rule); 2 tokens:
    # 4 rows do not fit one CTA: the staged kernel in clusters of four along K (woq_staged_cluster_rule), K split 1;
    # on sm80 (no clusters) the register-ring kernel at the rule's K split 2
    assert [at(mixtral_down, t) for t in (1, 2)] == ["decode:digits_ksplit4:after_trigger:plain",
                                                     "decode:stagedc4_ksplit1:after_trigger:plain"]
    assert at(dataclasses.replace(mixtral_down, sm=80, entry="sm80"), 2) == "decode:ksplit2:plain:plain"
    assert tactic_bands(mixtral_down)[0][:2] == (1, 1)
    for other in (dict(woq_group=32), dict(woq="int8", itemsize=1, woq_group=32), dict(k=14336 - 64)):
        assert at(dataclasses.replace(mixtral_down, **other), 1).startswith("decode:ksplit")
    # int8 per row: the digits tile as int4's forms (woq_digits_weights)
    assert at(dataclasses.replace(mixtral_down, woq="int8", itemsize=1, woq_group=0), 1) == (
        "decode:digits_ksplit4:after_trigger:plain")
    # MXFP4: the digits tile (woq_digits_rule) at 1 token, the ring kernel at 2 (its 4 rows' digits do not fit)
    mxfp4_down = dataclasses.replace(mixtral_down, woq="mxfp4", woq_group=32)
    assert [at(mxfp4_down, t) for t in (1, 2)] == ["decode:digits_ksplit4:after_trigger:plain",
                                                   "decode:ksplit2:after_trigger:plain"]
    for group64 in (dict(woq_group=64), dict(woq_group=64, k=14336 - 64)):  # k % 128 == 64: a half batch at the end
        g64 = dataclasses.replace(mixtral_down, **group64)  # 16-bit rows: the digits tile takes them (woq_digits_rule)
        assert at(g64, 1) == "decode:digits_ksplit4:after_trigger:plain"
    gpt_oss_up = call(epilogue="store", woq="int4", woq_group=64, n=5760, k=2880, experts=32, top_k=4)
    assert woq_staged_rows(gpt_oss_up, 1) == 8  # 106240 // (23 * 128 * 2 + 64) = 17, capped at 8
    assert woq_staged_rows(dataclasses.replace(gpt_oss_up, k=2880 * 8), 1) == 2  # 106240 // (180 * 256 + 64)
    staged = GemmTactic.parse("decode:staged_ksplit2:plain:plain")
    assert (staged.kernel, staged.tile, staged.k_split, staged.name) == ("decode", "staged", 2,
                                                                         "decode:staged_ksplit2:plain:plain")
    small = dataclasses.replace(mixtral_down, k=4096)
    assert tactic_problem(small, staged) is None
    assert "do not fit" in tactic_problem(mixtral_down, staged)
    assert "one scale per row or per 128 k" in tactic_problem(dataclasses.replace(small, woq_group=32), staged)
    assert tactic_problem(dataclasses.replace(small, woq_group=64, k=4096 - 64), staged) is None
    assert "weight-only int4 GEMM's" in tactic_problem(call(epilogue="store"), staged)
    with pytest.raises(MoeBuildError, match=r"plain, staged \(in clusters of four\), on digits or at two CTAs an SM"):
        GemmTactic.parse("decode:staged2:plain:plain")


def test_weight_only_staged_tile_in_clusters_of_four_along_k() -> None:
    """stagedc4: the staged kernel with K split over the four CTAs of a cluster, each holding its quarter of the token
    rows: Mixtral-8x7B's GEMM2 (k 14336) takes 8-row chunks, (104 KB - 256) // (3584 * 2 + 64) = 14 capped at 8 (one
    CTA: 3); sm90 only (clusters); the staged tile's int4 forms only."""
    mixtral_down = call(epilogue="finalize", woq="int4", woq_group=128, n=4096, k=14336, experts=8, top_k=2)
    assert woq_staged_rows(mixtral_down, 1, 4) == 8 and woq_staged_rows(mixtral_down, 1) == 3
    assert woq_staged_rows(dataclasses.replace(mixtral_down, k=388 * 128), 1, 4) == 4  # 106240 // (12416 * 2 + 64)
    c4 = GemmTactic.parse("decode:stagedc4_ksplit1:after_trigger:plain")
    assert (c4.tile, c4.k_split, c4.name) == ("stagedc4", 1, "decode:stagedc4_ksplit1:after_trigger:plain")
    assert tactic_problem(mixtral_down, c4) is None
    assert "do not fit" in tactic_problem(dataclasses.replace(mixtral_down, k=388 * 128), c4)
    assert "clusters: sm90" in tactic_problem(dataclasses.replace(mixtral_down, sm=80, entry="sm80"), c4)
    assert "one scale per row or per 128 k" in tactic_problem(dataclasses.replace(mixtral_down, woq_group=32), c4)
    assert "weight-only int4 GEMM's" in tactic_problem(call(epilogue="store"), c4)


def test_weight_only_digits_tile_where_the_token_digits_fit() -> None:
    """The digits tile (token digits on the int8 mma) takes the int4 forms with one scale per row or per 128 k and
    k % 128 == 0, or per 64 k and k % 64 == 0, MXFP4 with k % 64 == 0, and int8 with one scale per row and k % 64 == 0
    or per 128 k and k % 128 == 0, with 16-bit activations, while a chunk's
    digits fit the kernel's 104 KB:
    (104 KB - 16) // (k_split * slice groups * 400) rows, a half group at K's end counted whole,
    gemm/woq_decode_digits.cu digits_smem. A forced digits tactic whose 8-row chunks do not fit, or another form, is
    refused."""
    mixtral_down = call(epilogue="store", woq="int4", woq_group=128, n=4096, k=14336, experts=8, top_k=2)
    assert [woq_digits_rows(mixtral_down, s) for s in (1, 2, 4, 8)] == [2, 2, 2, 2]  # 106480 // 44800
    mixtral_up = dataclasses.replace(mixtral_down, n=28672, k=4096)
    assert woq_digits_rows(mixtral_up, 1) == 8  # 106480 // 12800 = 8
    assert woq_digits_rows(dataclasses.replace(mixtral_up, k=4608), 1) == 7  # 36 groups: 106480 // 14400
    assert woq_digits_rows(dataclasses.replace(mixtral_up, woq_group=64), 1) == 8
    assert woq_digits_rows(dataclasses.replace(mixtral_up, woq_group=64, k=34 * 128 - 64), 1) == 7  # 106480 // 13600
    gpt_oss_up = call(epilogue="store", woq="int4", woq_group=64, n=5760, k=2880, experts=32, top_k=4)
    assert [woq_digits_rows(gpt_oss_up, s) for s in (1, 2, 4)] == [8, 8, 8]  # 23, 12, 6 groups a slice
    for other in (dict(woq_group=32), dict(woq="int8", itemsize=1, woq_group=64), dict(k=4096 - 64),
                  dict(woq="mxfp4", woq_group=32, k=4096 - 32), dict(woq="int8", itemsize=1, k=4096 - 64)):
        assert woq_digits_rows(dataclasses.replace(mixtral_up, **other), 1) == 0
    for int8 in (dict(woq_group=128), dict(woq_group=0), dict(woq_group=0, k=4096 - 64)):  # the same records as int4's
        assert woq_digits_rows(dataclasses.replace(mixtral_up, woq="int8", itemsize=1, **int8), 1) == 8
    gpt_oss_mxfp4 = dataclasses.replace(gpt_oss_up, woq="mxfp4", woq_group=32)  # the same records as int4's
    assert [woq_digits_rows(gpt_oss_mxfp4, s) for s in (1, 2, 4)] == [8, 8, 8]
    assert woq_digits_rows(dataclasses.replace(mixtral_down, woq="mxfp4", woq_group=32), 1) == 2
    digits = GemmTactic.parse("decode:digits_ksplit2:after_trigger:plain")
    assert (digits.kernel, digits.tile, digits.k_split, digits.name) == ("decode", "digits", 2,
                                                                         "decode:digits_ksplit2:after_trigger:plain")
    assert tactic_problem(mixtral_up, digits) is None
    assert "do not fit" in tactic_problem(mixtral_down, digits)
    assert "one scale per row or per 128 k" in tactic_problem(dataclasses.replace(mixtral_up, woq_group=32), digits)
    assert tactic_problem(dataclasses.replace(mixtral_up, woq_group=64, k=4096 - 64), digits) is None
    assert tactic_problem(gpt_oss_mxfp4, digits) is None
    assert "or MXFP4 with k a multiple of 64" in tactic_problem(
        dataclasses.replace(gpt_oss_mxfp4, k=2880 - 32), digits)
    assert "or int8 with one scale per row" in tactic_problem(
        dataclasses.replace(mixtral_up, woq="int8", itemsize=1, woq_group=64), digits)
    assert tactic_problem(dataclasses.replace(mixtral_up, woq="int8", itemsize=1, woq_group=0, k=2880), digits) is None
    assert "weight-only int4 GEMM's" in tactic_problem(call(epilogue="store"), digits)


def test_weight_only_digits_rule() -> None:
    """The planner takes the digits tile where a chunk's digits fit and the average rows per expert is at most 3, on
    layers of 64 experts or more, at most 2 on layers of 32 or more, or up to 4 rows in all (int4 per row, per 64 k
    or per 128 k; int8 per row or per 128 k); the staged tile elsewhere in the decode band."""
    mixtral_up = call(epilogue="store", woq="int4", woq_group=128, n=28672, k=4096, experts=8, top_k=2)
    assert [at(mixtral_up, t) for t in (1, 2, 3)] == ["decode:digits_ksplit1:after_trigger:plain"] * 2 + [
        "decode:staged_ksplit1:after_trigger:plain"]  # 6 rows in all on 8 experts
    qwen_up = call(epilogue="store", woq="int4", woq_group=128, n=1536, k=2048, experts=128, top_k=8)
    assert at(qwen_up, 48).startswith("decode:digits_") and at(qwen_up, 49).startswith("decode:staged_")
    assert at(dataclasses.replace(qwen_up, woq_group=0), 16).startswith("decode:digits_")  # one scale per row
    assert at(dataclasses.replace(qwen_up, woq_group=64), 16).startswith("decode:digits_")  # two scales a group
    for other in (dict(woq_group=32), dict(woq="int8", itemsize=1, woq_group=64)):
        assert not at(dataclasses.replace(qwen_up, **other), 16).startswith("decode:digits_")
    assert at(dataclasses.replace(qwen_up, woq="int8", itemsize=1), 16).startswith("decode:digits_")  # int8 as int4
    gpt_oss_up = call(epilogue="store", woq="int4", woq_group=64, n=5760, k=2880, experts=32, top_k=4)
    assert at(gpt_oss_up, 1).startswith("decode:digits_")  # 4 rows in all
    # 32-63 experts: to 2 average rows per expert (64 rows on 32 experts at 16 tokens), then the staged tile
    assert at(gpt_oss_up, 16).startswith("decode:digits_") and at(gpt_oss_up, 17).startswith("decode:staged_")
    assert at(dataclasses.replace(gpt_oss_up, experts=31), 2).startswith("decode:staged_")  # 8 rows, 31 experts
    bands = [(lo, hi, t.name.split(":")[1]) for lo, hi, t in tactic_bands(mixtral_up)]
    assert bands[0] == (1, 2, "digits_ksplit1")


def test_weight_only_mxfp4_digits_rule() -> None:
    """MXFP4 (on the tile in its quarters form) takes the digits tile as int4 does on layers of 64 experts or more: to
    3 average rows per expert; on fewer experts to 4 average rows per expert, where a chunk's digits fit; past the
    tile, the register-ring kernel (tile none) to the decode band's end."""
    def mxfp4(**shape: int) -> GemmCall:
        return call(epilogue="store", woq="mxfp4", woq_group=32, **shape)

    qwen_up = mxfp4(n=1536, k=2048, experts=128, top_k=8)  # 3 rows per expert at 48 tokens
    assert at(qwen_up, 48).startswith("decode:digits_") and at(qwen_up, 49) == "decode:ksplit1:after_trigger:plain"
    dsv2_down = mxfp4(n=2048, k=1408, experts=64, top_k=6)  # 64 / 6: 3 rows per expert to 32 tokens
    assert at(dsv2_down, 32).startswith("decode:digits_") and not at(dsv2_down, 33).startswith("decode:digits_")
    gpt_oss_up = mxfp4(n=5760, k=2880, experts=32, top_k=4)  # fewer than 64 experts: 4 rows, 32 tokens
    assert at(gpt_oss_up, 32).startswith("decode:digits_") and at(gpt_oss_up, 33).startswith("decode:ksplit")
    mixtral_up = mxfp4(n=28672, k=4096, experts=8, top_k=2)  # 4 rows per expert at 16 tokens
    assert at(mixtral_up, 16).startswith("decode:digits_")
    assert at(mixtral_up, 17) == "decode:ksplit1:after_trigger:plain"
    mixtral_down = mxfp4(n=4096, k=14336, experts=8, top_k=2)  # 2 rows' digits fit a chunk: 1 token only
    assert at(mixtral_down, 1).startswith("decode:digits_") and not at(mixtral_down, 2).startswith("decode:digits_")
    for shape in (qwen_up, dsv2_down):  # 64 experts or more: int4's digits bands, token for token
        int4 = dataclasses.replace(shape, woq="int4", woq_group=128 if shape.k % 128 == 0 else 64)
        digits = [[(lo, hi, t.name) for lo, hi, t in tactic_bands(c) if t.tile == "digits"] for c in (shape, int4)]
        assert digits[0] and digits[0] == digits[1]


def test_weight_only_gemms_take_the_cheapest_tile_height_by_the_routed_counts() -> None:
    """Past 128 average rows per expert the mixed-input tile is the height of least expected cost an expert: its tiles
    (ceil of a binomial count over the height) times the height plus 96 rows and 20000 / k. DeepSeek-V2-Lite's GEMM1
    at 4096 tokens (384 +- 18.7 rows, k 2048: a tile costs its height + 105.8): two 224-row tiles hold every expert
    (659.6) where 256-row ones cost 723.6, 192-row ones 2.49 tiles (741.4), 320-row ones 851.5; at 16 rows an expert
    past 1024 woq128x256 whatever the counts; woq128x320c2 only on weight tiles in pairs (GPT-OSS-20B's n 2880 at 512
    rows takes 192: three tiles hold 512 +- 21.2 where 256-row ones take 2.5)."""
    dsv2 = call(epilogue="store", woq="int4", woq_group=128, n=2816, k=2048, experts=64, top_k=6)
    assert at(dsv2, 4096) == "wgmma:woq128x224:plain:plain"
    assert at(dataclasses.replace(dsv2, woq="int8", woq_group=0), 4096) == "wgmma:woq128x224:plain:plain"
    qwen3 = call(epilogue="store", woq="int4", woq_group=128)  # 256 +- 15.5 rows at 4096 tokens: one 320-row tile
    assert at(qwen3, 4096) == "wgmma:woq128x320c2:plain:plain"
    assert at(qwen3, 16384) == "wgmma:woq128x256:plain:plain" and at(qwen3, 16385) == "wgmma:woq128x256:plain:plain"
    gpt_oss = call(epilogue="store", woq="int4", woq_group=64, n=2880, k=2880, experts=32, top_k=4)
    assert at(gpt_oss, 4096) == "wgmma:woq128x192:plain:plain"
    problem = tactic_problem(gpt_oss, GemmTactic.parse("wgmma:woq128x320c2:plain:plain"))
    assert problem is not None and "even count of 128-row weight tiles (n 2880 makes 23)" in problem
    assert tactic_problem(qwen3, GemmTactic.parse("wgmma:woq128x320c2:plain:plain")) is None
    for t in (4096, 2049, 3072):
        assert tactic_problem(dsv2, GemmTactic.parse(at(dsv2, t))) is None


def expected_tiles_binomial(avg: int, experts: int, top_k: int, height: int) -> float:
    """E[ceil(X / height)] given X >= 1 for X ~ binomial(tokens, top_k / experts) at avg = tokens * top_k / experts,
    summed over the exact probabilities (the definition the planner's normal approximation stands for)."""
    p = top_k / experts
    tokens = round(avg / p)
    logs = [math.lgamma(tokens + 1) - math.lgamma(x + 1) - math.lgamma(tokens - x + 1) + x * math.log(p)
            + (tokens - x) * math.log1p(-p) for x in range(tokens + 1)]
    probs = [math.exp(v) for v in logs]
    return sum(pr * max(1, -(-x // height)) for x, pr in enumerate(probs))


@pytest.mark.parametrize("avg, experts, top_k", [(144, 128, 8), (256, 128, 8), (384, 64, 6), (512, 32, 4),
                                                  (1024, 8, 2)])
@pytest.mark.parametrize("height", [128, 160, 192, 224, 256, 320])
def test_weight_only_tile_cost_counts_the_routed_tiles(avg: int, experts: int, top_k: int, height: int) -> None:
    """The tile rule's expected tiles an expert (woq_tile_cost over its height plus fixed part) within 1% of the
    exact binomial expectation."""
    c = call(epilogue="store", woq="int4", woq_group=128, experts=experts, top_k=top_k)
    per_tile = height + WOQ_TILE_FIXED_ROWS + WOQ_TILE_FIXED_ROW_K / c.k
    got = woq_tile_cost(c, avg, height) / per_tile
    assert got == pytest.approx(expected_tiles_binomial(avg, experts, top_k, height), rel=0.01)


def test_weight_only_gemms_take_the_mixed_input_tiles_past_decode() -> None:
    """int4 / int8 weights per channel or in groups of 64 / 128 (n % 8, k % 64) on sm90 with 16-bit activations:
    past the decode band (8 average rows per expert, int8's 5; 12 where the staged int4 tile takes 8-row chunks in
    groups of 128 or per row) the mixed-input wgmma tiles at every count, 32 token rows to 24 rows per expert, 64 to 56,
    128 to 96, then the cheapest height by the routed counts (128 rows: 160, where half the experts would take two
    128-row tiles, from 118; 117 rows still 128, a second tile for 14% of the experts), 256 past 1024 rows. W4AFP8 keeps the mma tiles. MXFP4 (its e5m2 form) with bf16 activations past a decode band of 7 rows;
    with fp16 ones (or on sm80) the decode kernel to 12 rows, then the mma tiles."""
    c = call(epilogue="store", woq="int4", woq_group=128)  # 128 experts, top-8: avg rows = tokens / 16
    assert [at(c, t) for t in (128, 129, 192, 193, 384, 385, 896, 897, 1536, 1537, 1872, 1873, 2048, 65536)] == [
        "decode:staged_ksplit1:after_trigger:plain", "decode:staged_ksplit1:after_trigger:plain",
        "decode:staged_ksplit1:after_trigger:plain", "wgmma:woq128x32:plain:plain", "wgmma:woq128x32:plain:plain",
        "wgmma:woq128x64:plain:plain", "wgmma:woq128x64:plain:plain", "wgmma:woq128x128:plain:plain",
        "wgmma:woq128x128:plain:plain", "wgmma:woq128x128:plain:plain", "wgmma:woq128x128:plain:plain",
        "wgmma:woq128x160:plain:plain", "wgmma:woq128x160:plain:plain", "wgmma:woq128x256:plain:plain"]
    for t in (129, 193, 385, 897, 1537, 2048):
        assert tactic_problem(c, GemmTactic.parse(at(c, t))) is None
    # the staged tile's band to 12 rows needs its 8-row chunks to fit (int8 has no staged tile)
    assert at(dataclasses.replace(c, k=14336), 129) == "wgmma:woq128x32:plain:plain"
    assert at(dataclasses.replace(c, woq_group=64), 129) == "wgmma:woq128x32:plain:plain"  # GPT-OSS-20B's groups
    assert at(dataclasses.replace(c, woq_group=0), 129) == "decode:staged_ksplit1:after_trigger:plain"
    int8 = call(epilogue="store", woq="int8", itemsize=1, woq_group=0, n=4096, k=14336, experts=8, top_k=2)
    assert at(int8, 33) == "wgmma:woq128x32:plain:plain" and at(int8, 224) == "wgmma:woq128x64:plain:plain"
    assert at(int8, 225) == "wgmma:woq128x128:plain:plain"
    assert at(int8, 20).startswith("decode:") and at(int8, 21) == "wgmma:woq128x32:plain:plain"  # int8's band: 5 rows
    mxfp4 = dataclasses.replace(c, woq="mxfp4", woq_group=32)  # the decode kernel to 7 rows, then the mixed-input
    assert at(mxfp4, 112).startswith("decode:") and at(mxfp4, 113) == "wgmma:woq128x32:plain:plain"
    assert at(mxfp4, 1024) == "wgmma:woq128x128:plain:plain"
    assert tactic_problem(mxfp4, GemmTactic.parse("wgmma:woq128x64:plain:plain")) is None
    fp16_mxfp4 = dataclasses.replace(mxfp4, dtype="fp16")  # the e5m2 form's scales are bf16: decode to 12, then mma
    assert at(fp16_mxfp4, 192).startswith("decode:") and at(fp16_mxfp4, 193).startswith("mma:")
    assert at(fp16_mxfp4, 1024).startswith("mma:")
    assert at(dataclasses.replace(mxfp4, entry="sm80"), 192).startswith("decode:")
    assert "bf16" in tactic_problem(fp16_mxfp4, GemmTactic.parse("wgmma:woq128x64:plain:plain"))
    assert at(dataclasses.replace(c, n=1360), 1024) == "wgmma:woq128x128:plain:plain"  # n off 128: a partial tile
    assert at(dataclasses.replace(c, n=1364), 1024).startswith("mma:")  # n off 8: no mixed-input tile
    assert "mixed-input" in tactic_problem(dataclasses.replace(c, woq_group=32),
                                           GemmTactic.parse("wgmma:woq128x64:plain:plain"))
    assert "weight-only GEMM's tile" in tactic_problem(call(), GemmTactic.parse("wgmma:woq128x64:plain:plain"))


def test_weight_only_gemms_dequantize_for_wgmma_from_160_rows_per_expert() -> None:
    """Where the mixed-input kernel cannot take the weights (int4 in groups of 32, MXFP4 with fp16 activations): from
    160 average rows per expert (sm90, 16-bit activations) the weight-only GEMM's tactic is a 16-bit wgmma tile,
    launched plainly with plain outputs (the weights dequantized first); the sm80 entry keeps the mma tiles."""
    c = call(epilogue="store", woq="int4", woq_group=32)  # 128 experts, top-8: 160 rows per expert at 2560 tokens
    assert at(c, 2544) == "mma:64x128:plain:plain" and at(c, 2545).startswith("wgmma:")
    c = call(epilogue="store", woq="mxfp4", woq_group=32, dtype="fp16")
    assert at(c, 2544) == "mma:64x128:plain:plain" and at(c, 2545).startswith("wgmma:")
    assert tactic_problem(c, GemmTactic.parse(at(c, 2545))) is None
    assert at(dataclasses.replace(c, entry="sm80"), 4096).startswith("mma:")


def test_plan_records_tactic_bands_for_both_gemms() -> None:
    plan = make_plan(QWEN3, dataclasses.replace(H100, profile=TokenProfile(1, 16, 4096)), 256)
    g1, g2 = plan.stage("gemm1_tactic"), plan.stage("gemm2_tactic")
    assert g1.choice == g1.choice_for(256) == "wgmma:pingpong64x128:plain:evict_last"
    assert g1.choice_for(1) == "decode:ksplit2:after_trigger:plain"
    # GEMM2's epilogue follows the finalize stage: fused at 1-4 tokens (decode, the finalize epilogue),
    # separate (a plain-store GEMM2, decode to 8 rows) at 5-64, fused past 4 rows per expert (wgmma from 65)
    fin = plan.stage("finalize")
    assert [fin.choice_for(t) for t in (4, 5, 64, 65)] == ["fused", "separate", "separate", "fused"]
    assert g2.choice_for(4).startswith("decode:") and g2.choice_for(64).startswith("decode:")
    assert g2.choice_for(65) == "wgmma:pingpong64x128:after_trigger:evict_last"


@pytest.mark.parametrize("quant", [Quant.FP8, Quant.FP8_BLOCK])
def test_fp8_plan_fuses_the_finalize_at_every_count(quant: Quant) -> None:
    """rules.FINALIZE_ALWAYS_FUSED_QUANTS: an FP8 layer's finalize is fused at every count, also where the 16-bit
    rule leaves it separate (5-64 tokens of Qwen3-30B-A3B), and its GEMM2 runs the FP8 tactics of the finalize
    epilogue in each kernel band; forced separate, the plain store's."""
    plan = make_plan(dataclasses.replace(QWEN3, quant=quant), H100, 256)
    fin, g2 = plan.stage("finalize"), plan.stage("gemm2_tactic")
    assert [b.to_list() for b in fin.bands] == [[1, None, "fused"]]
    assert make_plan(QWEN3, H100, 256).stage("finalize").choice_for(16) == "separate"  # the 16-bit rule's band
    assert g2.choice_for(4).startswith("decode:") and g2.choice_for(4).endswith(":after_trigger:plain")
    # 520 rows: wgmma, finalize (rowwise scales accumulate fast: in 2x1 clusters to 48 rows an expert; block-128 keeps
    # the decode kernel to 512 rows on the H100, tactics.fp8.fp8_block_wide_band)
    tile = "pingpong64x128c2" if quant == Quant.FP8 else "pingpong64x128"
    assert g2.choice_for(65) == f"wgmma:{tile}:after_trigger:evict_last"
    separate = make_plan(dataclasses.replace(QWEN3, quant=quant), H100, 256, force={"finalize": "separate"})
    assert separate.stage("gemm2_tactic").choice_for(65) == "wgmma:pingpong64x128:plain:plain"


def test_forced_tactic_holds_at_every_count_and_is_checked() -> None:
    forced = make_plan(MIXTRAL, H100, 16, force={"gemm1_tactic": "wgmma:coop128x256:plain:evict_last"})
    d = forced.stage("gemm1_tactic")
    assert d.forced and [b.to_list() for b in d.bands] == [[1, None, "wgmma:coop128x256:plain:evict_last"]]
    with pytest.raises(MoeBuildError, match="gemm1_tactic.*sm90 GEMMs") as info:
        make_plan(MIXTRAL, A100, 16, force={"gemm1_tactic": "wgmma:pingpong64x128:plain:plain"})
    assert info.value.field == "force"
    with pytest.raises(MoeBuildError, match="gemm2_tactic.*placed"):  # GEMM2 is a plain store below 129 tokens
        make_plan(QWEN3, H100, 16, force={"gemm2_tactic": "wgmma:pingpong64x128:placed:evict_last"})


def test_tactics_follow_the_target_gpu() -> None:
    """The tactic rules read the multiprocessor count and L2 size, so they are part of the target (recorded
    in the plan): a smaller L2 turns GPT-OSS-20B's GEMM1 placement off."""
    big = make_plan(GPT_OSS, H100, 4096).stage("gemm1_tactic").choice
    small = make_plan(GPT_OSS, dataclasses.replace(H100, l2_bytes=24 << 20), 4096).stage("gemm1_tactic").choice
    assert big.split(":")[2] == "placed" and small.split(":")[2] == "plain"


def test_a_named_part_fills_the_target() -> None:
    """resolve_target(gpu=NAME) takes the part's SM, multiprocessors, L2 and memory rate (and says so in sm_source)
    without asking this machine; --sm alone takes the SM's default part, which is a part of that SM (SM 103, B300,
    borrows B200's figures)."""
    pcie = resolve_target(gpu="h100-pcie", flavour="tensorrt")
    assert (pcie.sm, pcie.sm_count, pcie.l2_bytes, pcie.memory_bytes_per_s, pcie.sm_source) == (
        90, 114, 50 << 20, 2_000 * 10**9, "gpu h100-pcie")
    for name, part in GPU_PARTS.items():
        t = resolve_target(gpu=name, sm=part.sm, flavour="tensorrt")
        assert (t.sm, t.sm_count, t.l2_bytes, t.memory_bytes_per_s) == (
            part.sm, part.sm_count, part.l2_bytes, part.memory_bytes_per_s), name
    assert set(DEFAULT_GPU) == set(SUPPORTED_SMS)
    assert all(part.sm == sm for sm, part in DEFAULT_GPU.items() if sm != 103) and DEFAULT_GPU[103].sm == 100
    h100 = resolve_target(sm=90, flavour="tensorrt")
    assert (h100.sm_count, h100.memory_bytes_per_s, h100.sm_source) == (132, 3_352 * 10**9, "flag")


def test_fp8_wide_tile_and_decode_slices() -> None:
    """Rowwise FP8 GEMMs take coop128x192 past 128 average rows per expert (block-128 ones stay on coop128x128),
    and the FP8 decode kernel splits K while each warp's slice keeps 1024 bytes, up to 8 slices, whatever the
    token count (Mixtral GEMM1, K = 4096: 4, as 8 would leave 512 bytes; GEMM2, K = 14336: 8; Qwen3 GEMM2,
    K = 768: none)."""
    up = call(epilogue="store", n=1536, k=2048, itemsize=1, fp8="rowwise")  # avg rows ceil(tokens / 16)
    assert [at(up, t) for t in (2048, 2049, 4096)] == [
        "wgmma:coop128x128:plain:plain", "wgmma:coop128x192:plain:plain", "wgmma:coop128x192:plain:plain"]
    assert at(dataclasses.replace(up, fp8="block128"), 4096) == "wgmma:coop128x128:plain:plain"
    mixtral_up = call(epilogue="store", n=28672, k=4096, experts=8, top_k=2, itemsize=1, fp8="rowwise")
    assert [at(mixtral_up, t) for t in (1, 16)] == ["decode:ksplit4:after_trigger:plain"] * 2
    assert at(dataclasses.replace(mixtral_up, n=4096, k=14336), 1) == "decode:ksplit8:after_trigger:plain"
    assert at(call(epilogue="store", n=2048, k=768, itemsize=1, fp8="rowwise"), 1) == "decode:ksplit1:after_trigger:plain"


def test_fp8_block_decode_band_past_64_rows_on_slower_memory() -> None:
    """tactics.fp8.fp8_block_wide_band: block-128 GEMMs stay on the decode kernel past 64 rows where the GPU's peak DRAM
    rate is at most FP8_BLOCK_SLOW_MEMORY (the H100's 3.35 TB/s, not the H200's 4.8), the layer has 64 experts or more,
    an expert at most 4 rows on average and the call at most 512 rows; elsewhere from 64 rows, as before."""
    assert DEFAULT_GPU[90].memory_bytes_per_s <= FP8_BLOCK_SLOW_MEMORY < H200_MEMORY
    qwen3_up = call(k=2048, n=1536, itemsize=1, fp8="block128")  # 128 experts, top-8: avg rows ceil(tokens / 16)
    qwen3_down = call(epilogue="finalize", n=2048, k=768, itemsize=1, fp8="block128")
    for c in (qwen3_up, qwen3_down):  # 64 tokens: 512 rows, 4 an expert; 65: 520 rows, 5
        assert [at(c, t).split(":")[0] for t in (8, 16, 64, 65)] == ["decode", "decode", "decode", "wgmma"]
        assert at(c, 16).startswith("decode:twocta_ksplit1")
        assert [at(dataclasses.replace(c, memory_bytes_per_s=H200_MEMORY), t).split(":")[0] for t in (7, 8, 16)] == [
            "decode", "wgmma", "wgmma"]
    dsv2_up = call(k=2048, n=2816, experts=64, top_k=6, itemsize=1, fp8="block128")  # avg rows ceil(6 tokens / 64)
    assert [at(dsv2_up, t).split(":")[0] for t in (32, 42, 43)] == ["decode", "decode", "wgmma"]  # 4.0 / 4.03 rows
    dsv3_up = call(n=4096, k=7168, experts=256, top_k=8, itemsize=1, fp8="block128")  # 512 rows at 64 tokens, 2 each
    assert [at(dsv3_up, t).split(":")[0] for t in (16, 64, 65)] == ["decode", "decode", "wgmma"]
    gpt_oss_up = call(n=5760, k=2880, experts=32, top_k=4, itemsize=1, fp8="block128")  # 32 experts: from 64 rows
    assert [at(gpt_oss_up, t).split(":")[0] for t in (15, 16)] == ["decode", "wgmma"]
    assert at(dataclasses.replace(qwen3_up, fp8="rowwise"), 64).startswith("wgmma")  # rowwise keeps its own band


def test_fp8_block_decode_slices_keep_the_cta_bound() -> None:
    """Block-128 FP8 decode GEMMs split K only while their CTAs are fewer than two per SM and slices keep 2048
    bytes: Mixtral GEMM1 (2 experts x 224 column blocks at 1 token) stays unsplit where rowwise takes 4 slices."""
    mixtral_up = call(epilogue="store", n=28672, k=4096, experts=8, top_k=2, itemsize=1, fp8="block128")
    assert [at(mixtral_up, t) for t in (1, 16)] == ["decode:twocta_ksplit1:after_trigger:plain"] * 2
    mixtral_down = dataclasses.replace(mixtral_up, n=4096, k=14336)  # 2 x 32 CTAs at 1 token: 4 slices
    assert at(mixtral_down, 1) == "decode:twocta_ksplit4:after_trigger:plain"


def test_fp8_block_decode_runs_two_ctas_an_sm_past_one_a_sm() -> None:
    """tactics.fp8.fp8_block_decode_tile_rule: the block-128 decode kernel held to two CTAs an SM (tile twocta) where
    the launch's CTAs, non-empty experts x column blocks, outnumber the SMs (132); one CTA an SM at or below; rowwise
    scales (two CTAs an SM at their own 124-126 registers) never take the tile, and a forced twocta is refused there."""
    qwen3_up = call(k=2048, n=1536, itemsize=1, fp8="block128")  # 12 column blocks a touched expert
    assert [at(qwen3_up, t) for t in (1, 2)] == ["decode:ksplit1:after_trigger:plain",  # 8 x 12 = 96
                                                "decode:twocta_ksplit1:after_trigger:plain"]  # 16 x 12 = 192
    dsv2_up = call(k=2048, n=2816, experts=64, top_k=6, itemsize=1, fp8="block128")  # 22 column blocks
    assert [at(dsv2_up, t) for t in (1, 2)] == ["decode:ksplit1:after_trigger:plain",  # 6 x 22 = 132: one wave
                                               "decode:twocta_ksplit1:after_trigger:plain"]
    assert not any("twocta" in at(dataclasses.replace(qwen3_up, fp8="rowwise"), t) for t in (1, 2, 7))
    assert tactic_problem(dataclasses.replace(qwen3_up, fp8="rowwise"),
                          GemmTactic.parse("decode:twocta_ksplit1:plain:plain")) is not None
    assert GemmTactic.parse("decode:twocta_ksplit2:after_trigger:plain").tile == "twocta"


def test_fp8_block_finalize_gemm2_with_long_slices_keeps_one_cta_an_sm() -> None:
    """A block-128 GEMM2 with the finalize epilogue whose warps' K slices pass 4096 bytes keeps one CTA an SM whatever
    its CTAs: Mixtral-8x7B's (K 14336) in 2 slices of 7168 from 3 tokens; in 4 slices of 3584 (2 tokens) and on
    GPT-OSS-20B's one slice of 2880 it takes two; the same slices with the plain store (GEMM1) take two."""
    mixtral_down = call(epilogue="finalize", n=4096, k=14336, experts=8, top_k=2, itemsize=1, fp8="block128")
    assert [at(mixtral_down, t) for t in (2, 3, 4, 16)] == [
        "decode:twocta_ksplit4:after_trigger:plain", "decode:ksplit2:after_trigger:plain",
        "decode:ksplit2:after_trigger:plain", "decode:ksplit2:after_trigger:plain"]
    assert at(dataclasses.replace(mixtral_down, epilogue="store"), 4) == "decode:twocta_ksplit2:after_trigger:plain"
    gpt_oss_down = call(epilogue="finalize", n=2880, k=2880, experts=32, top_k=4, itemsize=1, fp8="block128")
    assert [at(gpt_oss_down, t) for t in (4, 8)] == ["decode:twocta_ksplit1:after_trigger:plain"] * 2
