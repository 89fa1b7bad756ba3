"""Routing for the finalize-epilogue GEMM tests (tests/gpu/test_fp8_gemm.py, tests/gpu/test_woq_gemm.py): tokens pick
top_k distinct experts among LOCAL experts (EMPTY never picked: empty segments; HEAVY about 20 times as often as the
others: a long segment) and REMOTE ones (another rank's: their permuted rows sort after the local experts', past
off[E], and must reach no output)."""
from __future__ import annotations

import torch

LOCAL, REMOTE, EMPTY, HEAVY = 10, 4, (2, 7), 4


def routed(tokens: int, top_k: int, seed: int, remote_first: bool = False) -> tuple[torch.Tensor, list[int]]:
    """(permuted_to_unpermuted [tokens * top_k] int32 on the GPU, rows of each local expert): the expanded rows
    t * top_k + j sorted by expert, stable, remote experts last. `remote_first`: token 0 takes remote experts only
    (top_k <= REMOTE), so its output row must keep what it held."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.rand(LOCAL + REMOTE, generator=gen) + 0.05
    probs[list(EMPTY)] = 0.0
    probs[HEAVY] *= 20.0
    ids = torch.multinomial(probs.expand(tokens, -1), top_k, replacement=False, generator=gen)
    if remote_first:
        assert top_k <= REMOTE, f"token 0 cannot take {top_k} of {REMOTE} remote experts"
        ids[0] = LOCAL + torch.randperm(REMOTE, generator=gen)[:top_k]
    ids = ids.flatten()
    order = torch.sort(ids, stable=True).indices
    counts = torch.bincount(ids, minlength=LOCAL + REMOTE)[:LOCAL].tolist()
    return order.to(torch.int32).cuda(), counts
