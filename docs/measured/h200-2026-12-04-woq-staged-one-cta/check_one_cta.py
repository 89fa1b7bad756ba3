"""s09 experiment check: the staged int4 kernel at 16 warps, one CTA an SM (rows of 8-row chunks past 104 KB), against
fp64 with tests/gpu/test_woq_gemm.py's own helpers (fresh random data, NaN-poisoned outputs, its error bound)."""
import itertools
import sys

import torch

sys.path.insert(0, "tests/gpu")
from test_woq_gemm import finalize_run, run  # noqa: E402
from moe_build.weights.woq import WoqKind  # noqa: E402

n_ok = 0
for k_split, (group, zeros), dtype, (n, counts) in itertools.product(
        [1, 2, 4], [(128, True), (0, False), (64, True)], [torch.bfloat16, torch.float16],
        [(320, [8, 0, 3, 1, 9, 5]), (4096, [6, 2])]):
    run(WoqKind.INT4, counts, n, 14336, group, zeros=zeros, bias=True, dtype=dtype,
        tactic=f"decode:staged_ksplit{k_split}:after_trigger:plain")
    n_ok += 1
for k_split, dtype in itertools.product([1, 2, 4], [torch.bfloat16, torch.float16]):
    finalize_run(WoqKind.INT4, 128, True, 4096, 14336, 16, 2, k_split, bias=True, dtype=dtype, staged=True)
    n_ok += 1
print(f"one-CTA staged checks passed: {n_ok}")
