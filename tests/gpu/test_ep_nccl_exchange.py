"""mb_ep_nccl_exchange (cpp/src/stages/ep_nccl.cu) on one GPU: a one-rank NCCL process group, whose communicator
the exchange borrows, sends every payload to itself; the bytes must come back as sent, and the exchange refuses a
rank count its communicator does not have. The multi-rank exchanges are tests/gpu/ep_worker.py's nccl cases. And
the nccl dispatch refuses a CUDA graph capture in one line (it reads the counts on the host)."""
from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from moe_build import kernels as K
from moe_build.errors import MoeBuildError
from moe_build.kernels import KernelError
from moe_build.runner.dispatch.nccl import NcclDispatch, communicator
from moe_build.spec import MoESpec

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]


@pytest.fixture(scope="module")
def comm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    store = Path(tmp_path_factory.mktemp("nccl")) / "store"
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    yield communicator(dist.group.WORLD, torch.device("cuda", 0))
    dist.destroy_process_group()


@pytest.mark.parametrize("rows", [0, 1, 257, 4096])
def test_every_payload_comes_back_as_sent(comm: int, rows: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(random.SystemRandom().randrange(1 << 30))
    sends = (torch.randn(rows, 7168, device="cuda", generator=g).bfloat16(),
             torch.randint(-1, 1 << 20, (rows, 8), device="cuda", generator=g, dtype=torch.int32),
             torch.rand(rows, 3, device="cuda", generator=g))
    recvs = [torch.full_like(s, -7) for s in sends]  # poisoned
    K.ep_nccl_exchange(comm, [rows], [rows], list(zip(sends, recvs)))
    for s, r in zip(sends, recvs):
        assert torch.equal(r.view(torch.uint8), s.view(torch.uint8))


def test_a_rank_count_the_communicator_lacks_is_refused(comm: int) -> None:
    x = torch.zeros(4, 16, device="cuda")
    with pytest.raises(KernelError, match="the communicator has 1 ranks, ep_size is 2"):
        K.ep_nccl_exchange(comm, [4, 0], [4, 0], [(x, torch.empty_like(x))])


def test_rows_that_do_not_match_the_counts_are_refused(comm: int) -> None:
    x = torch.zeros(4, 16, device="cuda")
    with pytest.raises(ValueError, match=r"payloads\[0\]: 4 rows to send and 4 to receive"):
        K.ep_nccl_exchange(comm, [4], [4], [(x, torch.empty(3, 16, device="cuda"))])


def test_the_nccl_dispatch_refuses_a_graph_capture(comm: int) -> None:
    d = NcclDispatch(MoESpec(256, 128, 8, 2, ep_size=1, ep_rank=0), K)
    hidden = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    ids = torch.tensor([[0, 1]] * 4, dtype=torch.int32, device="cuda")
    w = torch.full((4, 2), 0.5, device="cuda")
    got = d.dispatch(hidden, ids, w)  # eagerly: the one rank receives its own tokens
    assert torch.equal(got.hidden, hidden) and torch.equal(got.topk_ids, ids)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), pytest.raises(MoeBuildError, match="^dispatch: the nccl dispatch reads the row counts"):
        with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=s):
            d.dispatch(hidden, ids, w)
