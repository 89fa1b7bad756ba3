"""The fused runner against the fp64 reference on a real GPU, for every plan it can be given.

Fresh random data per case (seed printed on failure), NaN-poisoned outputs (every element must
be written), bf16/fp16 tolerance 1e-2 on the rel-norm error. Routing is pinned by passing the
same fp32 logits (or top-k) to both sides, so a near-tie cannot pick different experts.
"""
from __future__ import annotations

import dataclasses
import gc
import random

import pytest
import torch

from moe_build.errors import MoeBuildError, UnsupportedCombination
from moe_build.reference import moe_reference
from moe_build.spec import Activation, DType, MoESpec, Routing, RoutingMethod, SharedExperts
from moe_build.target import Flavour, Target
from moe_build.weights import MoEWeights

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

TOL = 1e-2
# Every plan-path combination the runner has kernels for on this GPU (the planner refuses the rest).
FORCES = [
    {},
    {"routing_prologue": "three_step"},
    {"finalize": "separate"},
    {"fc1_activation": "separate"},
    {"gemm_kernel": "ampere"},
    {"gemm_kernel": "ampere", "fc1_activation": "separate"},
]
FORCE_IDS = ["default", "three_step", "finalize_separate", "fc1_separate", "ampere", "ampere_fc1_separate"]
BASE = MoESpec(256, 512, 8, 2, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True))


def _target(deterministic: bool = False) -> Target:
    major, minor = torch.cuda.get_device_capability()
    return Target(sm=major * 10 + minor, flavour=Flavour.TENSORRT, deterministic=deterministic)


def _runner(spec: MoESpec, force: dict[str, str] | None, max_tokens: int, seed: int,
            deterministic: bool = False):  # noqa: ANN202
    from moe_build.runner import MoERunner
    weights = MoEWeights.random(spec, seed=seed)
    try:
        return MoERunner(spec, weights, target=_target(deterministic), max_tokens=max_tokens, force=force), weights
    except UnsupportedCombination as e:
        pytest.skip(f"planner refuses {force} for this spec: {e}")


def _dtype(spec: MoESpec) -> torch.dtype:
    return {DType.BF16: torch.bfloat16, DType.FP16: torch.float16, DType.FP32: torch.float32}[spec.dtype]


def check(spec: MoESpec, force: dict[str, str] | None = None, tokens: int = 16, routing_input: str = "logits",
          max_tokens: int | None = None) -> None:
    """Run one fresh case and assert rel-norm error < TOL with every output element written."""
    seed = random.SystemRandom().randrange(1 << 30)
    runner, weights = _runner(spec, force, max_tokens or max(tokens, 1), seed)
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    hidden = torch.randn(tokens, spec.hidden_size, generator=g).to("cuda", _dtype(spec))
    call_and_check(runner, weights, hidden, torch.empty_like(hidden), routing_input, g, f"seed {seed}")


def call_and_check(runner, weights: MoEWeights, hidden: torch.Tensor, out: torch.Tensor,  # noqa: ANN001
                   routing_input: str, g: torch.Generator, case: str, logits: torch.Tensor | None = None,
                   workspace: torch.Tensor | None = None) -> None:
    """One runner call on `hidden` into `out` (poisoned with NaN first), routing pinned from `g` (logits written
    into `logits` where given), against the fp64 reference: rel-norm error < TOL, every element written."""
    spec = runner.spec
    tokens = hidden.shape[0]
    out.fill_(float("nan"))
    kwargs: dict[str, torch.Tensor] = {}
    ref_kwargs: dict[str, torch.Tensor] = {}
    if routing_input == "logits":
        lg = torch.randn(tokens, spec.num_experts, generator=g)
        kwargs["router_logits"] = lg.cuda() if logits is None else logits.copy_(lg)
        ref_kwargs["router_logits"] = lg
    elif routing_input == "topk":
        ids = torch.stack([torch.randperm(spec.num_experts, generator=g)[: spec.top_k] for _ in range(tokens)])
        w = torch.rand(tokens, spec.top_k, generator=g)
        kwargs.update(topk_ids=ids.cuda(), topk_weights=w.cuda())
        ref_kwargs.update(topk_ids=ids, topk_weights=w)
    else:  # routing from hidden: the reference gets the very logits the runner's router GEMM makes
        wr, br = runner.weights.router_weight, runner.weights.router_bias
        lg = hidden @ wr.t() if br is None else torch.addmm(br, hidden, wr.t())
        # bf16 logits tie often; routing.cu breaks ties toward the lower expert id, so nudge the
        # reference's copy the same way (1e-7 * id cannot reorder distinct bf16 logits of this size)
        ref_kwargs["router_logits"] = lg.double().cpu() - 1e-7 * torch.arange(spec.num_experts)
    runner(hidden, out=out, workspace=workspace, **kwargs)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), f"unwritten/non-finite output ({case}, plan {runner.plan.choices()})"
    ref = moe_reference(spec, weights, hidden.cpu(), **ref_kwargs)
    err = float((out.double().cpu() - ref).norm() / ref.norm())
    assert err < TOL, f"rel err {err:.3g} ({case}, steps {runner.kernel_sequence(tokens, routing_input)})"


@pytest.mark.parametrize("force", FORCES, ids=FORCE_IDS)
@pytest.mark.parametrize("tokens", [1, 255, 256, 257])
def test_every_fusion_combination_matches_reference(force: dict[str, str], tokens: int) -> None:
    check(BASE, force, tokens, max_tokens=512)


@pytest.mark.parametrize("weight_layout", ["row_major", "blocked64"])
@pytest.mark.parametrize("tokens,max_tokens", [(1, 16), (255, 512), (257, 512)])
def test_forced_weight_layout_matches_reference(weight_layout: str, tokens: int, max_tokens: int) -> None:
    """Either layout forced against the rule (blocked weights in a decode-sized runner, row-major in a
    prefill-sized one) runs the same GEMMs on them correctly (sm90 GEMMs only read blocked weights)."""
    if weight_layout == "blocked64" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("blocked weights are read by the sm90 GEMMs only")
    check(BASE, {"weight_layout": weight_layout}, tokens, max_tokens=max_tokens)


def _band_edges(spec: MoESpec, max_tokens: int) -> list[int]:
    """Both ends of every tactic band of both GEMMs within 1..max_tokens (the counts where a tactic starts
    or stops), for the device's own plan."""
    from moe_build.planner import make_plan
    from moe_build.runner.runner import device_target
    plan = make_plan(spec, device_target(torch.device("cuda"), max_tokens), max_tokens)
    return sorted({max_tokens, *plan.band_edges(max_tokens, ("gemm1_tactic", "gemm2_tactic"))})


# 64 experts, top-6 (DeepSeek-V2-Lite's routing at a small size): avg rows = ceil(tokens * 6 / 64), so
# 1..2048 tokens cross the decode kernel, both wgmma pingpong tiles, placement and the finalize bands.
BANDED = MoESpec(512, 384, 64, 6, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True))


@pytest.mark.parametrize("tokens", _band_edges(BANDED, 2048) if torch.cuda.is_available() else [1])
def test_every_tactic_band_of_the_plan_matches_reference(tokens: int) -> None:
    """The runner at each end of each tactic band the planner gives this device: every tactic the plan
    can pick for the layer, at the counts where a rule switches, against the fp64 reference."""
    check(BANDED, None, tokens, max_tokens=2048)


@pytest.mark.parametrize("force", FORCES, ids=FORCE_IDS)
@pytest.mark.parametrize("activation", list(Activation), ids=[a.value for a in Activation])
def test_all_activations(force: dict[str, str], activation: Activation) -> None:
    check(dataclasses.replace(BASE, activation=activation), force, 64)


@pytest.mark.parametrize("top_k", [1, 2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("force", FORCES[:3], ids=FORCE_IDS[:3])
def test_top_k(top_k: int, force: dict[str, str]) -> None:
    check(dataclasses.replace(BASE, num_experts=16, top_k=top_k), force, 100)


@pytest.mark.parametrize("experts", [8, 16, 64, 128, 256])
@pytest.mark.parametrize("tokens", [1, 256, 257])
def test_expert_counts(experts: int, tokens: int) -> None:
    check(dataclasses.replace(BASE, num_experts=experts, top_k=8 if experts >= 64 else 2), None, tokens)


@pytest.mark.parametrize("hidden,inter", [(128, 192), (200, 328), (264, 136), (1024, 704)])
@pytest.mark.parametrize("force", FORCES, ids=FORCE_IDS)
def test_sizes_multiple_of_64_and_not(hidden: int, inter: int, force: dict[str, str]) -> None:
    check(dataclasses.replace(BASE, hidden_size=hidden, intermediate_size=inter), force, 77)


def test_many_tokens() -> None:
    check(dataclasses.replace(BASE, hidden_size=128, intermediate_size=256, num_experts=16), None, 8192)


@pytest.mark.parametrize("routing_input", ["hidden", "logits", "topk"])
@pytest.mark.parametrize("routing", [
    Routing(RoutingMethod.SOFTMAX_TOPK),
    Routing(RoutingMethod.TOPK_SOFTMAX, router_bias=True),
    Routing(RoutingMethod.SIGMOID_GROUPED, renormalize=True, num_groups=4, topk_groups=2,
            routed_scaling_factor=2.5, correction_bias=True),
], ids=["softmax_topk", "topk_softmax_bias", "sigmoid_grouped"])
def test_routing_methods_and_inputs(routing: Routing, routing_input: str) -> None:
    check(dataclasses.replace(BASE, num_experts=16, top_k=4, routing=routing), None, 100, routing_input)


@pytest.mark.parametrize("force", FORCES, ids=FORCE_IDS)
def test_expert_bias_and_clamped_swiglu(force: dict[str, str]) -> None:
    spec = dataclasses.replace(BASE, activation=Activation.SWIGLU_CLAMP, expert_bias=True,
                               routing=Routing(RoutingMethod.TOPK_SOFTMAX, router_bias=True))
    check(spec, force, 64)


@pytest.mark.parametrize("sigmoid_gate", [False, True])
def test_shared_experts(sigmoid_gate: bool) -> None:
    spec = dataclasses.replace(BASE, shared=SharedExperts(count=1, intermediate_size=384, sigmoid_gate=sigmoid_gate))
    check(spec, None, 50)


@pytest.mark.parametrize("dtype", [DType.FP16, DType.BF16])
def test_fp16_and_bf16(dtype: DType) -> None:
    check(dataclasses.replace(BASE, dtype=dtype), None, 33)


def _fixed_inputs(spec: MoESpec, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(random.SystemRandom().randrange(1 << 30))
    hidden = torch.randn(tokens, spec.hidden_size, generator=g).to("cuda", torch.bfloat16)
    return hidden, torch.randn(tokens, spec.num_experts, generator=g).cuda()


@pytest.mark.parametrize("top_k", [2, 4])
@pytest.mark.parametrize("tokens", [16, 1000])
def test_deterministic_mode_is_bit_identical(top_k: int, tokens: int) -> None:
    spec = dataclasses.replace(BASE, num_experts=16, top_k=top_k)
    runner, _ = _runner(spec, None, tokens, seed=3, deterministic=True)
    hidden, logits = _fixed_inputs(spec, tokens)
    first = runner(hidden, router_logits=logits).clone()
    for _ in range(5):
        assert torch.equal(runner(hidden, router_logits=logits), first)


@pytest.mark.parametrize("force", FORCES, ids=FORCE_IDS)
def test_cuda_graph_replay_equals_eager(force: dict[str, str]) -> None:
    runner, _ = _runner(BASE, force, 300, seed=4, deterministic=True)
    graphed = runner.capture_graph(200, "logits")
    hidden, logits = _fixed_inputs(BASE, 200)
    graphed.hidden.copy_(hidden)
    graphed.router_logits.copy_(logits)
    replayed = graphed.replay().clone()
    assert torch.equal(replayed, runner(hidden, router_logits=logits))


def test_graph_keeps_its_runner_alive() -> None:
    """The graph's kernels read the runner's weights and workspace: a caller that keeps only the graph
    (`GraphedMoE(MoERunner(...), tokens)`) must not free them under it."""
    runner, _ = _runner(BASE, None, 300, seed=8, deterministic=True)
    graphed = runner.capture_graph(200, "logits")
    hidden, logits = _fixed_inputs(BASE, 200)
    expected = runner(hidden, router_logits=logits).clone()
    gc.collect()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    del runner
    gc.collect()
    assert torch.cuda.memory_allocated() == held
    junk = torch.full(((torch.cuda.memory_reserved() - held) // 4,), float("nan"), device="cuda")  # takes freed blocks
    graphed.hidden.copy_(hidden)
    graphed.router_logits.copy_(logits)
    assert torch.equal(graphed.replay(), expected)
    del junk


@pytest.mark.parametrize("force", FORCES, ids=FORCE_IDS)
def test_no_allocation_per_call(force: dict[str, str]) -> None:
    spec = dataclasses.replace(BASE, shared=SharedExperts(count=1, intermediate_size=128, sigmoid_gate=True))
    runner, _ = _runner(spec, force, 512, seed=5)
    hidden, logits = _fixed_inputs(spec, 300)
    out = torch.empty_like(hidden)
    runner(hidden, out=out)  # first call: library handles (cuBLAS workspace) may allocate once
    # Earlier tests' cyclic garbage goes now, not inside the window (a pytest.raises traceback holding a wrapper's
    # 5.5 KB of outputs was once collected there, and the count fell).
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    gc.disable()
    try:
        for tokens in (300, 1, 256, 257):
            runner(hidden[:tokens], out=out[:tokens])
            runner(hidden[:tokens], router_logits=logits[:tokens], out=out[:tokens])
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before
    finally:
        gc.enable()


def test_a_dropped_runner_frees_its_memory_at_once() -> None:
    """Reference counting alone frees a runner after calls (its per-token caches hold no cycle
    through it), so its weights and workspace do not wait for the cyclic collector."""
    gc.collect()  # earlier tests' cyclic garbage, if any, goes now rather than inside the window
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    runner, _ = _runner(BASE, None, 512, seed=7)
    hidden, logits = _fixed_inputs(BASE, 300)
    for tokens in (300, 1):
        runner(hidden[:tokens], router_logits=logits[:tokens])
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() > before
    gc.disable()
    try:
        del runner, hidden, logits
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before
    finally:
        gc.enable()


@pytest.mark.parametrize("force", FORCES, ids=FORCE_IDS)
def test_external_workspace_matches_own_workspace(force: dict[str, str]) -> None:
    from moe_build.runner import workspace_bytes
    spec = dataclasses.replace(BASE, shared=SharedExperts(count=1, intermediate_size=128))
    runner, _ = _runner(spec, force, 512, seed=6, deterministic=True)
    hidden, logits = _fixed_inputs(spec, 300)
    own = runner(hidden, router_logits=logits).clone()
    flat = torch.full((workspace_bytes(spec, runner.plan, 300),), 0xFF, dtype=torch.uint8, device="cuda")
    assert torch.equal(runner(hidden, router_logits=logits, workspace=flat), own)
    with pytest.raises(ValueError, match="workspace"):
        runner(hidden, router_logits=logits, workspace=flat[:-1])


def test_gated_epilogue_runner_keeps_only_the_interleaved_w1() -> None:
    """With the sm90 gated epilogue the runner converts W1 / b1 once and holds no stacked device copy;
    sized for prefill (512 tokens: 128 rows per expert) with sm90 GEMMs and sizes that are multiples of
    64 it also holds W1 / W2 in 64 x 64 blocks (test_every_fusion_combination_matches_reference runs such
    runners, max_tokens=512, against the reference), and with other sizes, the Ampere GEMMs or a
    decode-sized runner it keeps them row-major."""
    from moe_build.runner import MoERunner
    from moe_build.weights import block_64x64, interleave_gate_up
    spec = dataclasses.replace(BASE, expert_bias=True)
    weights = MoEWeights.random(spec, seed=3)  # on the CPU: the runner makes the device copies
    runner = MoERunner(spec, weights, target=_target(), max_tokens=512)
    if runner.plan.stage("fc1_activation").choice != "gated_epilogue":
        pytest.skip("the gated epilogue is an sm90 plan")
    dt = _dtype(spec)
    assert runner.w1_interleaved and runner.weights_blocked
    assert torch.equal(runner.weights.w1.cpu(), block_64x64(interleave_gate_up(weights.w1.to(dt))))
    assert torch.equal(runner.weights.b1.cpu(), interleave_gate_up(weights.b1.to(dt)))
    assert torch.equal(runner.weights.w2.cpu(), block_64x64(weights.w2.to(dt)))
    separate = MoERunner(spec, weights, target=_target(), max_tokens=512, force={"fc1_activation": "separate"})
    assert not separate.w1_interleaved and separate.weights_blocked
    assert torch.equal(separate.weights.w1.cpu(), block_64x64(weights.w1.to(dt)))
    ampere = MoERunner(spec, weights, target=_target(), max_tokens=512, force={"gemm_kernel": "ampere"})
    assert not ampere.weights_blocked and torch.equal(ampere.weights.w2.cpu(), weights.w2.to(dt))
    odd = dataclasses.replace(spec, intermediate_size=96)  # 96 % 64 != 0: no blocks
    odd_runner = MoERunner(odd, MoEWeights.random(odd, seed=4), target=_target(), max_tokens=512)
    assert not odd_runner.weights_blocked
    decode = MoERunner(spec, weights, target=_target(), max_tokens=64)  # 16 rows per expert
    assert decode.w1_interleaved and not decode.weights_blocked
    assert torch.equal(decode.weights.w1.cpu(), interleave_gate_up(weights.w1.to(dt)))
    forced = MoERunner(spec, weights, target=_target(), max_tokens=64, force={"weight_layout": "blocked64"})
    assert forced.weights_blocked and torch.equal(forced.weights.w2.cpu(), block_64x64(weights.w2.to(dt)))
    row_major = MoERunner(spec, weights, target=_target(), max_tokens=512, force={"weight_layout": "row_major"})
    assert not row_major.weights_blocked and torch.equal(row_major.weights.w2.cpu(), weights.w2.to(dt))
    # a runner given a plan runs it as it is: weights already in its layouts are taken as they are
    prepared = MoERunner(spec, runner.weights, plan=runner.plan, weights_prepared=True)
    assert prepared.weights.w1.data_ptr() == runner.weights.w1.data_ptr()
    with pytest.raises(MoeBuildError, match="force"):
        MoERunner(spec, weights, plan=runner.plan, force={"finalize": "separate"})
    with pytest.raises(MoeBuildError, match="plan"):
        MoERunner(odd, MoEWeights.random(odd, seed=4), plan=runner.plan)


def test_calls_on_two_streams_may_overlap() -> None:
    """Two micro-batches through one runner on two streams, queued alternately so that they run at once:
    each stream gets its own workspace, so each output matches its fp64 reference (with one shared
    workspace each call would overwrite the other's maps and rows). Graph capture adds one more."""
    from moe_build.runner import MoERunner
    seed = random.SystemRandom().randrange(1 << 30)
    weights = MoEWeights.random(BASE, seed=seed)
    runner = MoERunner(BASE, weights, target=_target(), max_tokens=512)
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    dt = _dtype(BASE)
    cases = [(torch.randn(t, BASE.hidden_size, generator=g), torch.randn(t, BASE.num_experts, generator=g))
             for t in (512, 300)]
    dev_cases = [(x.to("cuda", dt), logits.cuda()) for x, logits in cases]
    outs = [torch.full_like(x, float("nan")) for x, _ in dev_cases]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    for _ in range(8):
        for stream, (x, logits), out in zip(streams, dev_cases, outs):
            with torch.cuda.stream(stream):
                runner(x, router_logits=logits, out=out)
    torch.cuda.synchronize()
    for (x, logits), out in zip(cases, outs):
        ref = moe_reference(BASE, weights, x.to(dt), router_logits=logits)
        err = float((out.double().cpu() - ref).norm() / ref.norm())
        assert err < TOL, f"rel err {err:.3g} (seed {seed})"
    workspaces = {id(runner.workspace)}
    for stream in streams:
        with torch.cuda.stream(stream):
            workspaces.add(id(runner.workspace))
    assert len(workspaces) == 3, "one workspace per stream"
    runner.capture_graph(16, "logits").replay()
    runner.capture_graph(64, "logits").replay()
    assert len(runner._workspaces) == 4, "graphs share the capture stream's workspace"


@pytest.mark.parametrize("tokens", (16, 300))
def test_out_overlapping_hidden_is_refused(tokens: int) -> None:
    """Past 256 tokens the three-step map build zeroes `out` before the expansion reads hidden, and no
    kernel sees both: the runner refuses the overlap itself, at either prologue, naming `out`."""
    runner, _ = _runner(BASE, None, max_tokens=tokens, seed=5)
    dt = _dtype(BASE)
    buf = torch.randn(tokens + 1, BASE.hidden_size, device="cuda").to(dt)
    hidden, logits = buf[:tokens], torch.randn(tokens, BASE.num_experts, device="cuda").to(dt)
    before = buf.clone()
    for out in (buf[:tokens], buf[1:]):
        with pytest.raises(MoeBuildError, match="out"):
            runner(hidden, router_logits=logits, out=out)
    assert torch.equal(buf, before), "a refused call must leave both buffers untouched"


@pytest.mark.parametrize("force", FORCES, ids=FORCE_IDS)
def test_replayed_calls_follow_each_calls_inputs(force: dict[str, str]) -> None:
    """A call whose addresses (buffers, workspace, stream) and token count a call before had replays that call's
    recorded launches (runner/programs.py). Three rounds over the same buffers, each call on new random contents and
    checked against the fp64 reference of its own inputs: the first round records, the next two replay (the
    runner keeps no new program); token counts, routing inputs, the runner's and a caller's workspace taken in
    turn, with the shared experts' torch step among the launches; then new buffers record anew."""
    from moe_build.runner import workspace_bytes
    spec = dataclasses.replace(BASE, shared=SharedExperts(count=1, intermediate_size=128))
    seed = random.SystemRandom().randrange(1 << 30)
    runner, weights = _runner(spec, force, 300, seed)
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    H, dt = spec.hidden_size, _dtype(spec)
    flat = torch.empty(workspace_bytes(spec, runner.plan, 300), dtype=torch.uint8, device="cuda")
    cases = [(t, r, w) for t in (1, 16, 257) for r in ("logits", "hidden", "topk") for w in (None, flat)]
    bufs = {t: (torch.empty(t, H, dtype=dt, device="cuda"), torch.empty(t, H, dtype=dt, device="cuda"),
                torch.empty(t, spec.num_experts, device="cuda")) for t in (1, 16, 257)}
    for round in range(3):
        for t, routing_input, ws in cases:
            hidden, out, logits = bufs[t]
            hidden.copy_(torch.randn(t, H, generator=g))
            call_and_check(runner, weights, hidden, out, routing_input, g,
                           f"seed {seed}, round {round}, {t} tokens, {routing_input}, workspace {ws is not None}",
                           logits=logits, workspace=ws)
        if round == 0:
            recorded = len(runner._programs)
    assert len(runner._programs) == recorded  # rounds 1 and 2 replayed every call
    hidden = torch.randn(16, H, generator=g).to("cuda", dt)
    call_and_check(runner, weights, hidden, torch.empty_like(hidden), "logits", g, f"seed {seed}, new buffers")
    assert len(runner._programs) == recorded + 1
