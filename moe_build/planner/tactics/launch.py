"""How a GEMM's kernel is launched and how it writes its outputs to L2: the rules the 16-bit and FP8 tactics share
(the weight-only GEMMs launch their tiles plainly, woq.py)."""
from __future__ import annotations

from .rows import RowCount
from .tactic import PLACED_TILES, GemmCall


# wgmma launch: the gated GEMM1 and the finalize GEMM2 start by placement (after a trigger, each CTA at
# the tiles a plain launch puts on its SM) from 32 average rows per expert, on the one-CTA pingpong tiles,
# where one expert's weights of the GEMM fit in L2 (Qwen3-30B-A3B at 4096 tokens 580.9-581.2 vs 586.1-586.4
# us on the H200; Mixtral-8x7B's 117-235 MB experts lost with it: H100 4096 tokens +138 to +240 us). Below
# 32 rows placement was 0.6-1.8 us behind the unplaced launch; there the finalize GEMM still launches after
# a trigger up to 64 rows (256 tokens: Qwen3 306.0-306.8 vs 310.0-310.3 us, GPT-OSS-20B 393.9-394.6 vs
# 401.0-401.5), and every other wgmma GEMM plainly (launched early without placement, past 64 rows, the
# finalize GEMM lost up to 10% on the H100: its tiles lost the plain launch's layout over the chip).
# The FP8 GEMM has no placed launch (its 64x128x128 tile does not take the placed scheduler): its finalize
# GEMM2 launches after a trigger up to 64 rows and plainly above (the 16-bit thresholds; FP8's not measured yet).
PLACED_MIN_AVG_ROWS = 32
FINALIZE_EARLY_MAX_AVG_ROWS = 64


def wgmma_launch_rule(call: GemmCall, rows: RowCount, tile: str) -> str:
    if call.epilogue == "store":
        return "plain"
    if (call.fp8 == "none" and tile in PLACED_TILES and call.expert_weight_bytes <= call.l2_bytes
            and not rows.avg_at_most(PLACED_MIN_AVG_ROWS - 1)):
        return "placed"
    if call.epilogue == "finalize" and rows.avg_at_most(FINALIZE_EARLY_MAX_AVG_ROWS):
        return "after_trigger"
    return "plain"


# output L2 policy: the wgmma gated and finalize epilogues write under evict_last. Both write what is read
# again soon (GEMM2 reads GEMM1's rows next; the finalize adds top_k rows into each output row from experts
# spread over the whole GEMM), while the weights stream through L2. H100, whole layers at 4096 tokens: Qwen3
# 671.2-673.2 us vs 690.8-691.4, DeepSeek-V2-Lite 782.0-786.3 vs 794.3-804.3, Mixtral 4556-4717 vs 4782-5483;
# 12-30 us faster at 1024 tokens and 5-20 at 256 on all four bench shapes. The FP8 finalize epilogue writes
# the same way (FP8 not measured yet).
def output_l2_rule(call: GemmCall, kernel: str) -> str:
    return "evict_last" if kernel == "wgmma" and call.epilogue != "store" else "plain"


# decode launch: after a trigger from sm90 on (its CTAs load weights while the expansion finishes; the
# attribute does not exist below sm90).
def decode_launch_rule(call: GemmCall) -> str:
    return "after_trigger" if call.sm >= 90 else "plain"
