"""The nccl dispatch borrows the NCCL communicator of torch.distributed's process group: a group without one is
refused in one line naming the dispatch, before any exchange (CPU: a one-rank gloo group)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from moe_build.errors import MoeBuildError
from moe_build.runner.dispatch.nccl import communicator


@pytest.fixture
def gloo_group(tmp_path):  # noqa: ANN001, ANN201
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_a_group_without_nccl_is_refused_naming_the_dispatch(gloo_group: dist.ProcessGroup) -> None:
    with pytest.raises(MoeBuildError) as e:
        communicator(gloo_group, torch.device("cuda", 0))
    msg = str(e.value)
    assert msg.startswith("dispatch:") and "NCCL backend" in msg and "init_process_group('nccl')" in msg
    assert "\n" not in msg
