"""GEMM tactics: how each grouped GEMM runs at each token count, from one table of measured rules.

A tactic names the kernel, its tile, its launch and its outputs' L2 policy (tactic.py); the kernel library runs
exactly the tactic it is given, and this package is the only place that chooses one. The rules read the GEMM's shape
and the average rows per expert (rows.py), so each GEMM's tactic is a function of the token count; `tactic_bands`
turns it into bands of token counts, which the plan records and the runner looks up per call.

One file per GEMM family holds its rules, each one small function under a comment quoting its condition and the
measurement behind it: dense.py (16-bit), fp8.py, woq.py (weight-only); decode_kernel.py and launch.py hold what they
share, table.py picks the family, problems.py says why a forced tactic cannot run (docs/performance.md has the token
sweep that checks the whole table; docs/experiments.md what was tried and dropped). steps.py holds the same for the
FP8 row steps between the GEMMs (the expansion, the activation and the quantize steps): which of their kernels runs.
"""
from .problems import tactic_problem
from .rows import RowCount, token_bands
from .steps import STEP_TACTICS, RowStep, step_problem, step_tactic
from .table import choose_tactic, tactic_bands
from .tactic import GemmCall, GemmTactic

__all__ = ["STEP_TACTICS", "GemmCall", "GemmTactic", "RowCount", "RowStep", "choose_tactic", "step_problem",
           "step_tactic", "tactic_bands", "tactic_problem", "token_bands"]
