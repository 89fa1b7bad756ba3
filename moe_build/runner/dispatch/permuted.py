"""What both dispatches' grouped formats share (seed 004's dispatch_with_permute / combine_with_unpermute, the plan's
ep_format permuted or batched): how the received rows are laid out by expert, and the handle a dispatch returns for
the experts and the combine. The layout itself is stages/ep_permute.cu's."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch


@dataclass(frozen=True)
class PermuteLayout:
    """How dispatch_with_permute lays the rows out: groups padded to `pad_multiple` rows (contiguous), or
    `expert_capacity` rows per local expert where > 0 (batched)."""

    pad_multiple: int = 1
    expert_capacity: int = 0

    def rows(self, ep: int, cap: int, top_k: int, local_experts: int) -> int:
        """Rows the layout can take up (rounded up to whole tokens of top_k rows, the experts' workspace unit, at
        least one): every received row's every pair local, each group padded."""
        if self.expert_capacity:
            need = local_experts * self.expert_capacity
        else:
            need = ep * cap * min(top_k, local_experts) + local_experts * (self.pad_multiple - 1)
        return max(1, -(-need // top_k)) * top_k


@dataclass
class PermutedDispatched:
    """One dispatch_with_permute's rows, grouped by local expert, and what combine_with_unpermute needs (seed 004's
    `handle`): the layout of stages/ep_permute.cu, every tensor on the device, sized once."""

    rows: torch.Tensor            # [P, H]: expert e's rows from expert_offsets[e] (padding past its count)
    expert_offsets: torch.Tensor  # [E + 1] int64: where each expert's group starts; [E]: the layout's end
    expert_counts: torch.Tensor   # [E] int32: each expert's received (token, k) pairs (batched: at most max rows)
    row_src_rank: torch.Tensor    # [P] int32: the rank each row's output goes back to (-1: padding)
    row_return: torch.Tensor      # [P] int32: its (token * K + k) there
    overflow: torch.Tensor        # [1] int32: 1 where the batched format dropped a pair past an expert's max rows


def sum_pairs(kernels: ModuleType, returned: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              identity: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """combine_with_unpermute's last step where the tokens live: each token t's K rows returned[t * K + k] weighted
    and summed in k order into `out` [T, H], as one GPU's separate finalize (mb_finalize over the identity map
    `identity` [>= T * K] int32; topk_ids global, so every pair counts)."""
    T, K = topk_ids.shape
    if T == 0:
        return out
    return kernels.finalize(returned, topk_weights, topk_ids, identity[: T * K], out=out, num_experts=0)
