"""mb_ep_nccl_exchange (cpp/src/stages/ep_nccl.cu) on one GPU: a one-rank NCCL process group, whose communicator
the exchange borrows, sends every payload to itself; the bytes must come back as sent, and the exchange refuses a
rank count its communicator does not have. The multi-rank exchanges are tests/gpu/ep_worker.py's nccl cases. And
the nccl dispatch's two phases refuse a CUDA graph capture in one line (they read the counts on the host), where
its all-gather form (mb_ep_nccl_all_gather / mb_ep_nccl_reduce_scatter) captures."""
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
from moe_build.planner.gates import Band, StageDecision
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


def _payloads(rows: int, weights: int) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]:
    """Fresh random rows, ids and weights of `rows` rows (the three payloads of a dispatch), and poisoned buffers
    to receive them."""
    g = torch.Generator(device="cuda").manual_seed(random.SystemRandom().randrange(1 << 30))
    sends = (torch.randn(rows, 7168, device="cuda", generator=g).bfloat16(),
             torch.randint(-1, 1 << 20, (rows, 8), device="cuda", generator=g, dtype=torch.int32),
             torch.rand(rows, weights, device="cuda", generator=g))
    return sends, [torch.full_like(s, -7) for s in sends]


@pytest.mark.parametrize("rows", [0, 1, 257, 4096])
def test_every_payload_comes_back_as_sent(comm: int, rows: int) -> None:
    sends, recvs = _payloads(rows, 3)
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


# ---- the all-gather form: mb_ep_nccl_all_gather / mb_ep_nccl_reduce_scatter, and the dispatch that runs them ----

@pytest.mark.parametrize("rows", [0, 1, 257, 4096])
def test_the_all_gather_lands_every_payload_as_sent(comm: int, rows: int) -> None:
    sends, recvs = _payloads(rows, 8)
    K.ep_nccl_all_gather(comm, 0, [rows], list(zip(sends, recvs)))
    for s, r in zip(sends, recvs):
        assert torch.equal(r.view(torch.uint8), s.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows", [1, 300])
def test_the_reduce_scatter_of_one_rank_is_its_partial(comm: int, dtype: torch.dtype, rows: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(random.SystemRandom().randrange(1 << 30))
    partial = torch.randn(rows, 2048, device="cuda", generator=g).to(dtype)
    out = torch.full_like(partial, float("nan"))
    K.ep_nccl_reduce_scatter(comm, 0, [rows], partial, out)
    assert torch.equal(out, partial)


def test_the_all_gather_form_refuses_counts_the_communicator_or_the_rows_do_not_have(comm: int) -> None:
    x = torch.zeros(4, 16, device="cuda")
    with pytest.raises(KernelError, match="the communicator has 1 ranks, ep_size is 2"):
        K.ep_nccl_all_gather(comm, 0, [4, 4], [(x, torch.empty(8, 16, device="cuda"))])
    with pytest.raises(KernelError, match="mb_ep_nccl_reduce_scatter: the communicator has 1 ranks, ep_size is 2"):
        K.ep_nccl_reduce_scatter(comm, 0, [4, 4], torch.zeros(8, 16, device="cuda"), x)
    with pytest.raises(ValueError, match=r"payloads\[0\]: 4 rows to send and 4 to receive"):
        K.ep_nccl_all_gather(comm, 0, [4], [(x, torch.empty(3, 16, device="cuda"))])
    with pytest.raises(ValueError, match="rows: a row count >= 0 for every rank"):
        K.ep_nccl_all_gather(comm, 0, [-1], [(x, x)])


def _all_gather_dispatch() -> NcclDispatch:
    """A one-rank dispatch told the plan's all-gather band (a one-rank spec plans no dispatch at all)."""
    exchange = StageDecision("nccl_exchange", "all_gather", "exact", (), (Band(1, None, "all_gather"),))
    return NcclDispatch(MoESpec(256, 128, 8, 2, ep_size=1, ep_rank=0), K, exchange=exchange)


def test_the_all_gather_dispatch_returns_its_rows_and_captures(comm: int) -> None:
    """Given every rank's count, the dispatch all-gathers (the one rank receives its own tokens, ids local) and the
    combine reduce-scatters them back; with nothing read on the host, a CUDA graph captures the pair, which the
    two-phase form refuses (above)."""
    d = _all_gather_dispatch()
    g = torch.Generator(device="cuda").manual_seed(random.SystemRandom().randrange(1 << 30))
    hidden = torch.randn(5, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    ids = torch.randint(0, 8, (5, 2), device="cuda", dtype=torch.int32, generator=g)
    w = torch.rand(5, 2, device="cuda", generator=g)
    got = d.dispatch(hidden, ids, w, [5])
    assert got.gathered and torch.equal(got.hidden, hidden) and torch.equal(got.topk_ids, ids)
    assert torch.equal(got.topk_weights, w)
    out = torch.full_like(hidden, float("nan"))
    d.combine(got.hidden, got, out)
    assert torch.equal(out, hidden)
    graph, replayed = torch.cuda.CUDAGraph(), torch.full_like(hidden, float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        again = d.dispatch(hidden, ids, w, [5])
        d.combine(again.hidden, again, replayed)
    torch.cuda.synchronize()
    replayed.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, hidden)


def test_eager_all_gather_calls_replay_into_kept_buffers_and_follow_each_calls_inputs(comm: int) -> None:
    """A second eager call with the same tensors replays the first's launches into the same buffers (the same
    Dispatched back, nothing allocated); each call's output is its own inputs', here over three rounds of fresh
    values in the same tensors, and another token count or stream is a call of its own."""
    d = _all_gather_dispatch()
    g = torch.Generator(device="cuda").manual_seed(random.SystemRandom().randrange(1 << 30))
    hidden = torch.empty(5, 256, device="cuda", dtype=torch.bfloat16)
    ids = torch.empty(5, 2, device="cuda", dtype=torch.int32)
    w = torch.empty(5, 2, device="cuda")
    out = torch.empty_like(hidden)
    first = None
    for _ in range(3):
        hidden.copy_(torch.randn(5, 256, device="cuda", generator=g))
        ids.copy_(torch.randint(0, 8, (5, 2), device="cuda", dtype=torch.int32, generator=g))
        w.copy_(torch.rand(5, 2, device="cuda", generator=g))
        got = d.dispatch(hidden, ids, w, [5])
        first = first or got
        assert got is first
        assert torch.equal(got.hidden, hidden) and torch.equal(got.topk_ids, ids) and torch.equal(got.topk_weights, w)
        out.fill_(float("nan"))
        d.combine(got.hidden, got, out)
        assert torch.equal(out, hidden)
    assert d.dispatch(hidden[:4], ids[:4], w[:4], [4]) is not first
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        other = d.dispatch(hidden, ids, w, [5])
    torch.cuda.synchronize()
    assert other is not first and torch.equal(other.hidden, hidden)


@pytest.mark.parametrize("count", [0, 1, 777, 300_000])
def test_local_ids_are_the_ranks_experts_and_minus_one_elsewhere(count: int) -> None:
    """mb_ep_local_ids against torch's mapping of the same ids (global ids of 256 experts and -1; this rank holds
    experts 64-95), in place, across the grid's stride at 300000 ids."""
    g = torch.Generator(device="cuda").manual_seed(random.SystemRandom().randrange(1 << 30))
    ids = torch.randint(-1, 256, (count,), device="cuda", dtype=torch.int32, generator=g)
    want = torch.where((ids >= 64) & (ids < 96), ids - 64, torch.full_like(ids, -1))
    assert K.ep_local_ids(ids, 64, 32) is ids
    torch.cuda.synchronize()
    assert torch.equal(ids, want)


def test_the_all_gather_dispatch_refuses_counts_that_do_not_fit_the_call(comm: int) -> None:
    d = _all_gather_dispatch()
    hidden = torch.zeros(4, 256, device="cuda", dtype=torch.bfloat16)
    ids = torch.zeros(4, 2, device="cuda", dtype=torch.int32)
    w = torch.zeros(4, 2, device="cuda")
    for counts, message in (([3], "gives rank 0 3 tokens, the call has 4"), ([4, 4], "expected 1 token counts")):
        with pytest.raises(MoeBuildError, match=f"^tokens_per_rank: {message}"):
            d.dispatch(hidden, ids, w, counts)
