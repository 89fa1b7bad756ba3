"""The FP8 bench's comparisons and ceilings on a real GPU (moe_build.bench.peers, bench.timing, bench.workload).

What they must guarantee for `moe-build bench --quant` to compare like with like: the scaled_grouped_mm
peer computes the FP8 layer it is given (fp64 reference with the same FP8 weights and per-row
activation quantization; block-128 weights reach it requantized per channel, and it computes that
layer), without waiting on the GPU from the host; the dequant peer computes the bf16 layer of the
dequantized weights; the e4m3 ceiling matmul computes x @ y and the read ceiling gives a plausible rate;
and the GPU-side helpers (FP8 weights made one expert at a time, the expert-chunked reference) agree
with the CPU definitions. Fresh random data per case (seed in the failure message), routing pinned by
giving both sides the same logits. Bounds: FP8 3% (the bf16 intermediates move values across e4m3
rounding steps, as in tests/gpu/test_runner_fp8.py), bf16 1% (as tests/gpu/test_bench_peers.py).
"""
from __future__ import annotations

import random

import pytest
import torch

from moe_build.bench.peers import grouped_mm_peer, rowwise_fp8_weights, scaled_grouped_mm_peer
from moe_build.bench.timing import CeilingCalls, measure_ceilings, syncs_host
from moe_build.bench.workload import (InputSet, check_rows, device_fp8_weights, fp8_bench_spec,
                                      reference_by_experts)
from moe_build.reference import moe_reference
from moe_build.spec import ActScale, MoESpec, Quant, Routing, RoutingMethod
from moe_build.weights import MoEWeights
from moe_build.weights.fp8 import ScaleGranularity

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

FP8_TOL, BF16_TOL = 0.03, 1e-2
ROUTINGS = {"softmax_topk": Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True),
            "sigmoid_grouped": Routing(RoutingMethod.SIGMOID_GROUPED, renormalize=True, num_groups=4, topk_groups=2,
                                       routed_scaling_factor=2.5, correction_bias=True)}


def need_sm90() -> None:
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("torch._scaled_grouped_mm and torch._grouped_mm need sm90")


def _case(routing: str, granularity: ScaleGranularity, tokens: int
          ) -> tuple[MoESpec, MoEWeights, torch.Tensor, torch.Tensor, int]:
    """A tiny FP8 layer (CPU weights) and its inputs, from a fresh seed."""
    seed = random.SystemRandom().randrange(1 << 30)
    base = MoESpec(256, 192, 16, 4, routing=ROUTINGS[routing])
    quant = Quant.FP8_BLOCK if granularity is ScaleGranularity.BLOCK128 else Quant.FP8
    w = MoEWeights.random(base, seed=seed).quantized_fp8(granularity)
    g = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(tokens, base.hidden_size, generator=g).to(torch.bfloat16)
    logits = torch.randn(tokens, base.num_experts, generator=g)
    return base.with_overrides(quant=quant), w, hidden, logits, seed


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double().cpu() - ref).norm() / ref.norm())


@pytest.mark.parametrize("tokens", [1, 37, 300])
@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("granularity", list(ScaleGranularity), ids=lambda g: g.value)
def test_scaled_grouped_mm_matches_reference(granularity: ScaleGranularity, routing: str, tokens: int) -> None:
    need_sm90()
    spec, w, hidden, logits, seed = _case(routing, granularity, tokens)
    rowwise = rowwise_fp8_weights(w.to("cuda", torch.bfloat16))
    rowwise_spec = spec.with_overrides(quant=Quant.FP8)
    got = scaled_grouped_mm_peer(rowwise_spec, rowwise)(hidden.cuda(), logits.cuda())
    ref = moe_reference(rowwise_spec, rowwise.to("cpu"), hidden, router_logits=logits)
    err = _rel(got, ref)
    assert err < FP8_TOL, f"{granularity.value} {routing} tokens={tokens} seed={seed}: rel err {err:.3g}"
    if granularity is not ScaleGranularity.BLOCK128:  # the same layer: the requantization is the identity
        assert _rel(got, moe_reference(spec, w, hidden, router_logits=logits)) == pytest.approx(err)


@pytest.mark.parametrize("tokens", [1, 37, 300])
@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("granularity", [ScaleGranularity.CHANNEL, ScaleGranularity.BLOCK128], ids=lambda g: g.value)
def test_dequant_peer_matches_bf16_reference(granularity: ScaleGranularity, routing: str, tokens: int) -> None:
    need_sm90()
    spec, w, hidden, logits, seed = _case(routing, granularity, tokens)
    w16 = w.dequantized(torch.bfloat16, "cuda")
    spec16 = spec.with_overrides(quant=Quant.NONE)
    got = grouped_mm_peer(spec16, w16)(hidden.cuda(), logits.cuda())
    ref = moe_reference(spec16, w16.to("cpu"), hidden, router_logits=logits)
    err = _rel(got, ref)
    assert err < BF16_TOL, f"{granularity.value} {routing} tokens={tokens} seed={seed}: rel err {err:.3g}"


def test_scaled_grouped_mm_does_not_sync_host() -> None:
    need_sm90()
    spec, w, hidden, logits, _ = _case("sigmoid_grouped", ScaleGranularity.CHANNEL, 64)
    peer = scaled_grouped_mm_peer(spec, w.to("cuda", torch.bfloat16))
    h, lg = hidden.cuda(), logits.cuda()
    assert not syncs_host(lambda: peer(h, lg))


def test_scaled_grouped_mm_refuses_block_and_static_scales() -> None:
    spec, w, *_ = _case("softmax_topk", ScaleGranularity.BLOCK128, 1)
    with pytest.raises(ValueError):
        scaled_grouped_mm_peer(spec.with_overrides(quant=Quant.FP8), w.to("cuda", torch.bfloat16))
    base = MoESpec(256, 192, 16, 4, routing=ROUTINGS["softmax_topk"])
    static = MoEWeights.random(base).quantized_fp8(ScaleGranularity.TENSOR, static=True)
    with pytest.raises(ValueError):
        scaled_grouped_mm_peer(base.with_overrides(quant=Quant.FP8, act_scale=ActScale.STATIC), static.to("cuda"))


def test_fp8_ceiling_matmul_and_read_rate() -> None:
    """The e4m3 ceiling matmul computes x @ y of its e4m3 operands (fp64 reference on sampled rows, output
    poisoned first), and every burst rate is plausible: reads between 100 GB/s and 100 TB/s, matmuls
    between 1 and 10,000 TFLOP/s."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("torch._scaled_mm needs compute capability 8.9 or later")
    calls = CeilingCalls(fp8=True)
    calls.z.fill_(float("nan"))
    calls.fp8_matmul(0)
    rows = torch.randint(0, CeilingCalls.MATMUL_N, (8,), device="cuda")
    ref = calls.x8.float()[rows].double() @ calls.y8.double()  # no FP8 indexing kernel needed
    assert torch.isfinite(calls.z).all()
    assert _rel(calls.z[rows], ref.cpu()) < 1e-2
    rates = measure_ceilings(calls, iters=3)
    assert 1e11 < rates["read_bytes_per_s"] < 1e14, rates
    assert rates["bytes_per_s"] == max(rates["read_bytes_per_s"], rates["copy_bytes_per_s"])
    assert 1e12 < rates["bf16_flops_per_s"] < 1e16 and 1e12 < rates["fp8_flops_per_s"] < 1e16, rates


@pytest.mark.parametrize("quant", [Quant.FP8, Quant.FP8_BLOCK])
def test_device_fp8_weights_and_chunked_reference(quant: Quant) -> None:
    """FP8 weights made on the GPU one expert at a time are a valid layer of the bench's granularity,
    and the expert-chunked reference on GPU tensors equals moe_reference on the whole layer."""
    spec = fp8_bench_spec("qwen3-30b-a3b", quant).with_overrides(num_experts=16, hidden_size=256,
                                                                 intermediate_size=192)
    w = device_fp8_weights(spec, seed=random.SystemRandom().randrange(1 << 30))
    w.check(spec)
    assert w.fp8.granularity is (ScaleGranularity.BLOCK128 if quant is Quant.FP8_BLOCK else ScaleGranularity.CHANNEL)
    inp = InputSet(torch.randn(50, 256, device="cuda").to(torch.bfloat16), torch.randn(50, 16, device="cuda"), 0)
    rows = check_rows(spec, inp, w.correction_bias)
    whole = moe_reference(spec, w.to("cpu"), inp.hidden[rows].cpu(), router_logits=inp.logits[rows].cpu())
    got = reference_by_experts(spec, w, inp, rows, chunk=1)
    assert float((got - whole).abs().max()) <= 1e-12 * float(whole.abs().max())
