"""The process group a rank's dispatch runs over, checked against the rank's spec once (both backends)."""
from __future__ import annotations

import torch.distributed as dist

from ...errors import MoeBuildError
from ...spec import MoESpec


def rank_group(spec: MoESpec, group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """`group` (None: the default group), refused in one line unless it has ep_size ranks and this process is
    the spec's ep_rank in it."""
    group = group or dist.group.WORLD
    if dist.get_world_size(group) != spec.ep_size or dist.get_rank(group) != spec.ep_rank:
        raise MoeBuildError("ep_rank", f"this process is rank {dist.get_rank(group)} of {dist.get_world_size(group)}, "
                            f"the spec is rank {spec.ep_rank} of {spec.ep_size}",
                            "a process group of ep_size ranks, this process at ep_rank")
    return group
