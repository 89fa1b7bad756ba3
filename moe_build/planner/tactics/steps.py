"""The FP8 row steps' tactics: which kernel quantizes a call's rows (mb_step_tactic, cpp/include/moe_build_kernels.h).

Four steps quantize rows to FP8 between the GEMMs (or, for W4AFP8, store the quantized values back in 16 bits): the
expansion of the tokens' rows (stages/expand_rows.cu), the quantize step of the expanded rows (W4AFP8 with a plain
expansion), the activation step that writes GEMM2's input, and the quantize step of the activated rows
(stages/fc1_activation.cu, the identity activation). Each has up to four kernels; the one a call runs is its step
tactic, chosen here from the step's row width and scales, the GPU and the rows of the call, and passed to the kernel,
which refuses one that cannot take the call. `StepTactic.takes` is that refusal's condition (the kernels also need
16-byte aligned rows, which the runner's buffers are); the rules below choose among the kernels that take a step.
"""
from __future__ import annotations

from dataclasses import dataclass

from .rows import RowCount

STEP_TACTICS = ("block_rows", "warp_rows", "staged_rows", "group_items")
EXPANSION_TACTICS = ("block_rows", "warp_rows")
SCALINGS = ("static", "per_row", "per_group")  # an FP8 step's input scale: calibrated, each row's, each 128 columns'
UNIT_COLS = 8  # a 16-byte unit of 16-bit values (fp8_quantize.cuh kVec)
WARP_ROW_MAX_UNITS_PER_LANE = 16  # fp8_quantize.cuh kWarpRowMaxPerLane: rows of up to 4096 columns
WARP_GATED_MAX_UNITS_PER_LANE = 6  # fc1_activation.cu kWarpGatedMaxPerLane: gated rows of up to 1536 columns a half
STAGED_STATIC_BYTES = 128  # the staged kernel's static shared array (fp8::block_max's 32 floats)


@dataclass(frozen=True)
class RowStep:
    """What the step tactic rules read about one FP8 row step: its rows' width (the output columns), whether it reads
    a gate and an up half, whether an AWQ pre-quant scale multiplies its rows, its scaling (SCALINGS), whether it
    stores the quantized values in 16 bits (W4AFP8) rather than e4m3 bytes and scales, whether it is the expansion
    (a token's row to its top_k rows), and the GPU's multiprocessors and per-block shared memory."""

    cols: int
    gated: bool
    prequant: bool
    scaling: str
    dequantized: bool
    expansion: bool
    sm_count: int
    smem_per_block: int

    def describe(self) -> str:
        return (f"cols={self.cols} gated={self.gated} prequant={self.prequant} scaling={self.scaling} "
                f"dequantized={self.dequantized} sms={self.sm_count} smem={self.smem_per_block}")


def takes(step: RowStep, tactic: str) -> bool:
    """Whether the kernel `tactic` takes `step` (the kernel's own refusal, mb_step_tactic). A dequantized step with a
    static scale runs the 16-bit step's one kernel (block_rows)."""
    if tactic == "block_rows":
        return True
    if step.dequantized and step.scaling == "static":
        return False
    whole = step.cols % UNIT_COLS == 0
    per_lane = -(-(step.cols // UNIT_COLS) // 32)
    if tactic == "warp_rows":
        widest = WARP_GATED_MAX_UNITS_PER_LANE if step.gated else WARP_ROW_MAX_UNITS_PER_LANE
        return whole and not step.prequant and per_lane <= widest
    if step.expansion:
        return False
    if tactic == "staged_rows":
        return whole and 2 * staged_row_bytes(step) <= step.smem_per_block - STAGED_STATIC_BYTES
    return whole and not step.prequant and step.scaling != "per_row" and not step.dequantized  # group_items


def staged_row_bytes(step: RowStep) -> int:
    """A stage of the staged kernel's ring: one input row (both halves where gated) of 16-bit units."""
    return (2 if step.gated else 1) * (step.cols // UNIT_COLS) * 16


# The expansion a warp a token (warp_rows) where it takes the rows and the call has at least
# EXPAND_WARP_MIN_ROWS_PER_SM permuted rows an SM; below, the block kernel, whose several warps a token keep more loads
# in flight. H200, bench/layer_steps_probe.py, the expansion and its predecessor at 256 tokens: Mixtral-8x7B (top-2,
# 512 rows) 8.0 us on the block kernel against 10.3 on the warp kernel, GPT-OSS-20B (1024 rows) 11.2 against 10.4,
# DeepSeek-V2-Lite (1536) 13.7 against 11.1, Qwen3-30B-A3B (2048) 16.7 against 13.9; at 4096 tokens 10-30% less on
# every bench shape.
EXPAND_WARP_MIN_ROWS_PER_SM = 6


def expansion_tactic_rule(step: RowStep, rows: RowCount) -> str:
    if takes(step, "warp_rows") and not rows.rows_below(EXPAND_WARP_MIN_ROWS_PER_SM * step.sm_count):
        return "warp_rows"
    return "block_rows"


# The activation / quantize step:
# - half a warp a (row, 128-column group) (group_items) where it takes the step and the rows are fewer than the SMs:
#   the staged kernel runs a block a row, so a decode call's few rows ran on as many SMs (Mixtral-8x7B's block-128
#   activation step at 1 token, 2 rows of 2 x 14336 columns: 4.6 us between GEMM1's end and GEMM2's start on an H100
#   with the staged kernel, 1.9 with this one; bench/layer_timeline_probe.py, docs/performance.md "The activation
#   step spread over the GPU at decode");
# - a warp a row (warp_rows) where it takes the step and the call has a row for every warp the GPU holds, at most
#   WARP_ROWS_MIN_ROWS_PER_SM an SM (four blocks of eight warps at the kernel's fewest registers; 64 registers or
#   fewer a thread, 65-80 three, more two, ptxas of sm_90a): fewer rows leave warps idle while each walks its whole
#   row alone, where the staged kernel spreads a row over three warps or more (GPT-OSS-20B at 256 tokens, 1024 rows of
#   2880 columns, 8 warps an SM: 10.0 us on this kernel against the staged kernel's 5.7; H200,
#   bench/layer_steps_probe.py); from 4096 tokens it is 10-30% faster than the staged kernel (block-128 activation
#   steps at 1024 / 4096 tokens, H200: Qwen3-30B-A3B 16.8 -> 14.1 / 52.0 -> 40.1 us, DeepSeek-V2-Lite 21.8 -> 18.9 /
#   69.1 -> 61.9);
# - the staged kernel (staged_rows) where a ring of two rows fits a block's shared memory: a persistent block copies
#   the next rows into the ring while it quantizes one (Mixtral-8x7B's 8192 rows x 14336 columns on an H200: 355 us
#   on the block kernel, whose loads leave an SM idle while it computes, where the bytes take about 140);
# - else a block a row (block_rows).
WARP_ROWS_MIN_ROWS_PER_SM = 32


def row_step_tactic_rule(step: RowStep, rows: RowCount) -> str:
    if takes(step, "group_items") and rows.rows_below(step.sm_count):
        return "group_items"
    if takes(step, "warp_rows") and not rows.rows_below(WARP_ROWS_MIN_ROWS_PER_SM * step.sm_count):
        return "warp_rows"
    if takes(step, "staged_rows"):
        return "staged_rows"
    return "block_rows"


def step_tactic(step: RowStep, rows: RowCount) -> str:
    """The rules above for one step at one token count."""
    return expansion_tactic_rule(step, rows) if step.expansion else row_step_tactic_rule(step, rows)


def step_problem(step: RowStep, tactic: str) -> str | None:
    """Why a forced step tactic cannot run `step` (None where it can)."""
    allowed = EXPANSION_TACTICS if step.expansion else STEP_TACTICS
    if tactic not in allowed:
        return f"the step's kernels are {', '.join(allowed)}"
    if takes(step, tactic):
        return None
    needs = {"warp_rows": "whole 16-byte units, no pre-quant scale, rows of at most 4096 columns (gated: 1536)",
             "staged_rows": "whole 16-byte units and a ring of two rows within a block's shared memory",
             "group_items": "whole 16-byte units, a static or per-group scale, no pre-quant scale, e4m3 bytes out"}
    if step.dequantized and step.scaling == "static":
        return "with a static scale the W4AFP8 step runs the 16-bit step's kernel, block_rows"
    return f"{tactic} takes {needs[tactic]} ({step.describe()})"
