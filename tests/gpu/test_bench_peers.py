"""The bench's peers (moe_build.bench.peers) on a real GPU: each computes the layer (fp64 reference,
fresh random data, routing pinned by the same fp32 logits), and the ones that must not wait on the
GPU from the host do not, since `moe-build bench` times host-syncing fns apart from the rest.
"""
from __future__ import annotations

import random

import pytest
import torch

from moe_build.bench.timing import syncs_host
from moe_build.bench.peers import Peer, grouped_mm_peer, hf_eager_peer, naive_peer
from moe_build.reference import moe_reference
from moe_build.spec import MoESpec, Routing, RoutingMethod
from moe_build.weights import MoEWeights

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

SPEC = MoESpec(256, 192, 16, 4, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True))
TOL = 1e-2


def _peer(name: str, w: MoEWeights) -> Peer:
    if name == "grouped_mm":
        if torch.cuda.get_device_capability() < (9, 0):
            pytest.skip("torch._grouped_mm needs sm90")
        return grouped_mm_peer(SPEC, w)
    if name == "hf_eager":
        pytest.importorskip("transformers")
        return hf_eager_peer(SPEC, w, "qwen3_moe")[0]
    return naive_peer(SPEC, w)


@pytest.mark.parametrize("tokens", [1, 37, 300])
@pytest.mark.parametrize("name", ["naive", "grouped_mm", "hf_eager"])
def test_peer_matches_reference(name: str, tokens: int) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    w = MoEWeights.random(SPEC, seed=seed)
    peer = _peer(name, w.to("cuda", torch.bfloat16))
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, SPEC.hidden_size, generator=g).to(torch.bfloat16)
    logits = torch.randn(tokens, SPEC.num_experts, generator=g)
    ref = moe_reference(SPEC, w.to("cpu", torch.float64), hidden.double(), router_logits=logits)
    got = peer(hidden.cuda(), logits.cuda()).double().cpu()
    err = float((got - ref).norm() / ref.norm())
    assert err < TOL, f"{name} tokens={tokens} seed={seed}: rel err {err:.3g}"


@pytest.mark.parametrize("name,syncs", [("grouped_mm", False), ("naive", True)])
def test_host_sync(name: str, syncs: bool) -> None:
    w = MoEWeights.random(SPEC, seed=0).to("cuda", torch.bfloat16)
    hidden = torch.randn(64, SPEC.hidden_size, device="cuda").to(torch.bfloat16)
    logits = torch.randn(64, SPEC.num_experts, device="cuda")
    peer = _peer(name, w)
    assert syncs_host(lambda: peer(hidden, logits)) is syncs
