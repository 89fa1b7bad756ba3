"""ExpertParallelMoE's switches on a machine without a GPU: dual-batch overlap (`overlap`) and the nvlink kernels'
SM caps (`dispatch_sms` / `combine_sms`) are refused in one line naming the field before anything is built, the
two micro-batches cover a call's tokens, and each micro-batch's share of recv_capacity keeps room for every row
where the whole call had it. The layer itself runs on GPUs only (tests/gpu/ep_worker.py)."""
from __future__ import annotations

import pytest
import torch

from moe_build.errors import MoeBuildError
from moe_build.kernels.ops.ep import _max_sms
from moe_build.runner import expert_parallel as ep
from moe_build.runner.expert_parallel import (ExpertParallelMoE, micro_batch_capacity, micro_batch_spans,
                                              rank_layer)
from moe_build.spec import MoESpec
from moe_build.target import Flavour, Target
from moe_build.weights import MoEWeights

SPEC = MoESpec(64, 32, 8, 2, ep_size=2)
H100 = Target(sm=90, flavour=Flavour.TENSORRT)


@pytest.fixture(scope="module")
def weights() -> MoEWeights:
    return MoEWeights.random(SPEC, seed=5)


@pytest.mark.parametrize("kwargs, field", [
    ({"overlap": "yes"}, "overlap"), ({"overlap": 1}, "overlap"), ({"overlap": None}, "overlap"),
    ({"dispatch_sms": 0}, "dispatch_sms"), ({"dispatch_sms": -2}, "dispatch_sms"),
    ({"dispatch_sms": 2.5}, "dispatch_sms"), ({"dispatch_sms": True}, "dispatch_sms"),
    ({"combine_sms": 0}, "combine_sms"), ({"combine_sms": "8"}, "combine_sms"),
    ({"pad_multiple": 0}, "pad_multiple"), ({"pad_multiple": 2.0}, "pad_multiple"),
    ({"pad_multiple": True}, "pad_multiple"), ({"expert_capacity": 0}, "expert_capacity"),
    ({"expert_capacity": "64"}, "expert_capacity"),
])
def test_bad_switches_are_refused_in_one_line_before_anything_is_built(weights: MoEWeights, kwargs: dict,
                                                                       field: str) -> None:
    with pytest.raises(MoeBuildError) as info:
        rank_layer(SPEC, weights, 0, **kwargs)
    assert info.value.field == field and "\n" not in str(info.value) and info.value.allowed


@pytest.mark.parametrize("field", ["dispatch_sms", "combine_sms"])
def test_sm_caps_are_the_nvlink_dispatchs_only(weights: MoEWeights, field: str, monkeypatch) -> None:
    """With the nccl dispatch NCCL sizes its own kernels: a cap there is refused (before any collective)."""
    monkeypatch.setattr(ep, "require_cuda", lambda device: torch.device("cuda", 0))
    with pytest.raises(MoeBuildError) as info:
        ExpertParallelMoE(SPEC.for_rank(0), weights.for_rank(SPEC, 0), max_tokens=8, target=H100,
                          force={"dispatch": "nccl"}, **{field: 4})
    assert info.value.field == field and "nvlink" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("tokens", range(0, 12))
def test_micro_batches_split_a_call_in_two_halves(tokens: int) -> None:
    (lo0, hi0), (lo1, hi1) = micro_batch_spans(tokens)
    assert lo0 == 0 and hi0 == lo1 and hi1 == tokens  # every token once, in order
    assert 0 <= (hi0 - lo0) - (hi1 - lo1) <= 1  # the first takes the odd token; one token leaves the second empty


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 64, 257, 4096])
@pytest.mark.parametrize("ep_size", [2, 4, 8])
def test_micro_batch_capacity_keeps_room_for_every_row(max_tokens: int, ep_size: int) -> None:
    half = micro_batch_spans(max_tokens)[0][1]
    # room for every row of the whole call: room for every row of the larger micro-batch
    assert micro_batch_capacity(ep_size * max_tokens, max_tokens) == ep_size * half
    for capacity in (1, max_tokens, ep_size * max_tokens - 1):
        share = micro_batch_capacity(capacity, max_tokens)
        assert 1 <= share <= capacity and 2 * share >= capacity


def test_kernel_sm_cap_argument() -> None:
    """The kernels' max_sms: 0 for their own grid, else the positive cap (the layer validated it already)."""
    assert _max_sms(None) == 0 and _max_sms(3) == 3
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="sms"):
            _max_sms(bad)


@pytest.mark.parametrize("force, kwargs, field", [
    ({}, {"expert_capacity": 16}, "expert_capacity"),                         # contiguous: no max rows
    ({"ep_format": "batched"}, {}, "expert_capacity"),                        # batched needs its max rows
    ({}, {"pad_multiple": 8}, "pad_multiple"),                                # padding is the permuted format's
    ({"ep_format": "batched"}, {"expert_capacity": 16, "pad_multiple": 8}, "pad_multiple"),
    ({"ep_format": "permuted"}, {"recv_capacity": 16}, "recv_capacity"),      # sized on the device, no capacity
])
def test_format_settings_must_match_the_plans_format(weights: MoEWeights, force: dict, kwargs: dict, field: str,
                                                    monkeypatch) -> None:
    """Refused in one line from the plan alone, before any buffer or collective."""
    monkeypatch.setattr(ep, "require_cuda", lambda device: torch.device("cuda", 0))
    with pytest.raises(MoeBuildError) as info:
        ExpertParallelMoE(SPEC.for_rank(0), weights.for_rank(SPEC, 0), max_tokens=8, target=H100,
                          force={"dispatch": "nvlink", **force}, **kwargs)
    assert info.value.field == field and "\n" not in str(info.value)
