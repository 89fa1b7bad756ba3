"""The tactic table: each GEMM call's tactic by its family's rules, at one token count and in bands over all."""
from __future__ import annotations

from .dense import dense_tactic
from .fp8 import fp8_tactic
from .rows import RowCount, token_bands
from .tactic import GemmCall, GemmTactic
from .woq import woq_tactic


def choose_tactic(call: GemmCall, rows: RowCount) -> GemmTactic:
    """The tactic of one GEMM at one token count: the FP8 GEMM's rules (fp8.py), the weight-only GEMM's (woq.py),
    or the 16-bit GEMM's (dense.py)."""
    if call.fp8 != "none":
        return fp8_tactic(call, rows)
    if call.woq != "none":
        return woq_tactic(call, rows)
    return dense_tactic(call, rows)


def tactic_bands(call: GemmCall) -> list[tuple[int, int | None, GemmTactic]]:
    """The table's tactics for `call` (choose_tactic) as token_bands."""
    return token_bands(call.top_k, call.experts, lambda rows: choose_tactic(call, rows))
