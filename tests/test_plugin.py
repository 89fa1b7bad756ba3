"""MoEPlugin's build side on a CPU: the pure rules, and the IPluginV3 methods through TensorRT-RTX.

TensorRT-RTX has the IPluginV3 interfaces but no plugin layers, so its classes are instantiated
and their methods called directly here, with hand-made descriptors. Tests that need the
bindings skip cleanly without them; the pure-rule tests always run.
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from moe_build.errors import MoeBuildError
from moe_build.planner import make_plan
from moe_build.runner.sequence import w1_interleaved, weights_blocked
from moe_build.spec import ActScale, Activation, DType, MoESpec, Quant, Routing, RoutingMethod, SharedExperts
from moe_build.target import Flavour, Target, TokenProfile
from moe_build.weights import MoEWeights, block_64x64, interleave_gate_up
from moe_build.weights.fp8 import FP8_DTYPE, ScaleGranularity
from moe_build.plugins import enqueue as plugin_enqueue
from moe_build.plugins import moe_plugin as mp
from moe_build.plugins.build_rules import check_input_dims, check_profile, output_dims, supports_io, workspace_size
from moe_build.plugins.enqueue import RunnerCache, _make_runner, run_enqueue
from moe_build.plugins.fields import (FIELD_NAMES, FIELD_PLAN, FIELD_SPEC, check_spec_and_plan, decode_fields,
                                     encode_fields, fields_from_collection, forced_choices)
from moe_build.plugins.slots import input_slots, output_dtype, plan_weights, scale_granularity

PROFILE = TokenProfile(min=1, opt=16, max=512)
PLAIN = MoESpec(hidden_size=64, intermediate_size=32, num_experts=8, top_k=2, dtype=DType.BF16)
FULL = MoESpec(hidden_size=64, intermediate_size=32, num_experts=8, top_k=2, dtype=DType.FP16, expert_bias=True,
               routing=Routing(method=RoutingMethod.SIGMOID_GROUPED, num_groups=2, topk_groups=1,
                               correction_bias=True),
               shared=SharedExperts(count=1, intermediate_size=48, sigmoid_gate=True))
FP32_RELU = MoESpec(hidden_size=64, intermediate_size=32, num_experts=4, top_k=1, dtype=DType.FP32,
                    activation=Activation.RELU)


def target(sm: int = 90) -> Target:
    return Target(sm=sm, flavour=Flavour.TENSORRT, profile=PROFILE)


def plan_for(spec: MoESpec, sm: int = 90, force: dict[str, str] | None = None):
    return make_plan(spec, target(sm), tokens=16, force=force)


@pytest.fixture(scope="module")
def trt():
    return pytest.importorskip("tensorrt_rtx_bindings")


def plugin(trt, spec: MoESpec = PLAIN, **kw):
    return mp.plugin_classes(trt).MoEPlugin(spec, plan_for(spec, **kw))


# ---- pure rules --------------------------------------------------------------------------------

def test_input_order_plain_spec():
    slots = input_slots(PLAIN)
    assert [(s.name, s.shape) for s in slots] == [
        ("hidden", (None, 64)), ("router_logits", (None, 8)), ("w1", (8, 64, 64)), ("w2", (8, 64, 32))]
    assert slots[0].dtypes == (torch.bfloat16,)
    assert slots[1].dtypes == (torch.float32, torch.bfloat16)


def test_input_order_follows_optional_weights():
    slots = input_slots(FULL)
    assert [s.name for s in slots] == ["hidden", "router_logits", "w1", "w2", "b1", "b2", "correction_bias",
                                       "shared_w1", "shared_w2", "shared_gate"]
    by_name = {s.name: s for s in slots}
    assert by_name["correction_bias"].dtypes == (torch.float32,)
    assert by_name["shared_w1"].shape == (96, 64) and by_name["shared_gate"].shape == (1, 64)
    assert by_name["b1"].dtypes == (torch.float16,)


def test_input_slots_match_the_canonical_weight_check():
    """Every weight slot must be what MoEWeights.check demands, or add_moe_plugin would feed wrong shapes."""
    w = MoEWeights.random(FULL)
    w.check(FULL)
    for slot in input_slots(FULL)[2:]:
        assert tuple(getattr(w, slot.name).shape) == slot.shape


def test_fp32_logits_are_the_only_choice_for_fp32_models():
    assert input_slots(FP32_RELU)[1].dtypes == (torch.float32,)
    assert input_slots(FP32_RELU)[2].shape == (4, 32, 64)  # non-gated: N1 = I


def test_output_dims_take_hidden_rows_and_columns():
    assert output_dims([(7, 64), (7, 8), (8, 64, 64)]) == [7, 64]
    sentinel = object()  # works on symbolic dims too: passes the expressions through untouched
    assert output_dims([(sentinel, 64)])[0] is sentinel
    with pytest.raises(MoeBuildError, match="rank 3"):
        output_dims([(1, 7, 64)])
    with pytest.raises(MoeBuildError, match="no inputs"):
        output_dims([])


def test_check_input_dims():
    good = [(-1, 64), (-1, 8), (8, 64, 64), (8, 64, 32)]
    check_input_dims(PLAIN, good)
    check_input_dims(PLAIN, [(5, 64), (5, 8), (8, 64, 64), (8, 64, 32)])
    with pytest.raises(MoeBuildError, match="'w2'.*shape \\(8, 64, 32\\)"):
        check_input_dims(PLAIN, good[:3] + [(8, 32, 64)])
    with pytest.raises(MoeBuildError, match="got 3 inputs"):
        check_input_dims(PLAIN, good[:3])
    with pytest.raises(MoeBuildError, match="router_logits.*5 rows, hidden has 6"):
        check_input_dims(PLAIN, [(6, 64), (5, 8)] + good[2:])


def test_supports_io_table():
    n = len(input_slots(FULL))
    fp32, fp16, bf16, i32 = torch.float32, torch.float16, torch.bfloat16, torch.int32
    want = {0: {fp16}, 1: {fp32, fp16}, 2: {fp16}, 3: {fp16}, 4: {fp16}, 5: {fp16}, 6: {fp32}, 7: {fp16},
            8: {fp16}, 9: {fp16}, n: {fp16}}
    for pos, ok in want.items():
        for dtype in (fp32, fp16, bf16, i32, None):
            assert supports_io(FULL, pos, dtype, True, n) == (dtype in ok), (pos, dtype)
            assert not supports_io(FULL, pos, dtype, False, n), (pos, dtype)
    assert not supports_io(FULL, 0, fp16, True, n - 1)  # wrong input count: nothing fits


def test_field_round_trip_is_byte_identical():
    plan = plan_for(FULL)
    fields = encode_fields(FULL, plan)
    assert set(fields) == set(FIELD_NAMES)
    spec2, plan2 = decode_fields(fields)
    assert spec2 == FULL and plan2.to_dict() == json.loads(json.dumps(plan.to_dict()))
    assert encode_fields(spec2, plan2) == fields


def test_forced_choices_survive_the_round_trip():
    plan = plan_for(PLAIN, force={"finalize": "separate"})
    _, plan2 = decode_fields(encode_fields(PLAIN, plan))
    assert forced_choices(plan2) == {"finalize": "separate"}
    assert plan2.stage("finalize").choice == "separate"


def _tampered(edit):
    fields = encode_fields(PLAIN, plan_for(PLAIN))
    spec, plan = (json.loads(fields[k]) for k in (FIELD_SPEC, FIELD_PLAN))
    edit(spec, plan)
    return {"spec": json.dumps(spec).encode(), "plan": json.dumps(plan).encode()}


def _set_choice(plan, stage, choice):
    next(s for s in plan["stages"] if s["stage"] == stage)["choice"] = choice


@pytest.mark.parametrize("edit, message", [
    (lambda s, p: _set_choice(p, "finalize", "separate"), "differs from what the planner decides.*finalize"),
    (lambda s, p: s.update(hidden_size=128), "made for a different spec"),
    (lambda s, p: (s.update(hidden_size=128), p["spec"].update(hidden_size=128)), "differs from what the planner"),
    (lambda s, p: s.update(top_k=9), "describes no valid layer.*top_k"),
    (lambda s, p: s.update(colour="red"), "is not a moe-build spec"),
    (lambda s, p: p.update(path="ootb"), "'ootb'-path plan"),
    (lambda s, p: p.update(schema="moe-build.plan/0"), "schema"),
    (lambda s, p: p["target"].update(sm=7), "invalid target"),
    (lambda s, p: p.pop("stages"), "is not a moe-build plan"),
])
def test_tampered_fields_are_refused(edit, message):
    with pytest.raises(MoeBuildError, match=message):
        decode_fields(_tampered(edit))


def test_malformed_fields_are_refused():
    good = encode_fields(PLAIN, plan_for(PLAIN))
    with pytest.raises(MoeBuildError, match="'plan'.*missing"):
        decode_fields({"spec": good["spec"]})
    with pytest.raises(MoeBuildError, match="unknown field"):
        decode_fields({**good, "tactic": b"1"})
    with pytest.raises(MoeBuildError, match="'spec'.*not valid JSON"):
        decode_fields({**good, "spec": good["spec"][:-1]})
    with pytest.raises(MoeBuildError, match="'spec'.*not UTF-8"):
        decode_fields({**good, "spec": b"\xff" + good["spec"]})
    with pytest.raises(MoeBuildError, match="'plan'.*not an object"):
        decode_fields({**good, "plan": b"[1]"})
    with pytest.raises(MoeBuildError, match="'plan'.*nested too deeply"):
        decode_fields({**good, "plan": b"[" * 100_000 + b"]" * 100_000})
    with pytest.raises(MoeBuildError, match="'spec'.*hidden_size.*1..65536"):
        spec = json.loads(good["spec"])
        decode_fields({**good, "spec": json.dumps({**spec, "hidden_size": 1 << 40}).encode()})


def test_plugin_refuses_what_its_inputs_cannot_carry():
    quant = dataclasses.replace(PLAIN, quant=Quant.NVFP4)  # FP4 weights and activations: no kernels
    with pytest.raises(MoeBuildError, match="no nvfp4 weights or scales.*none, fp8, fp8_block, w8a16, w4a16_awq"):
        encode_fields(quant, plan_for(quant, sm=100))
    fp8_hidden = dataclasses.replace(PLAIN, quant=Quant.W4AFP8, fp8_input=True)
    with pytest.raises(MoeBuildError, match="fp8_input.*16-bit"):
        encode_fields(fp8_hidden, plan_for(fp8_hidden))
    lora = dataclasses.replace(PLAIN, lora=True)
    with pytest.raises(MoeBuildError, match="lora"):
        encode_fields(lora, plan_for(lora))


def test_a_forced_fused_prologue_still_covers_the_whole_profile():
    """A forced fused prologue holds at the plan's 16 tokens but not past 256: its bands take the three-step
    prologue there, so the runner has a kernel at every count of the 512-token profile, and the fields
    round-trip (the planner reproduces the forced plan)."""
    plan = plan_for(PLAIN, force={"routing_prologue": "fused"})
    d = plan.stage("routing_prologue")
    assert d.forced and d.choice_for(256) == "fused" and d.choice_for(PROFILE.max) == "three_step"
    assert decode_fields(encode_fields(PLAIN, plan))[1] == plan


def test_profile_check():
    plan = plan_for(PLAIN)
    check_profile(plan, PROFILE.max)
    with pytest.raises(MoeBuildError, match="allows 513 tokens"):
        check_profile(plan, PROFILE.max + 1)


# ---- the IPluginV3 methods through TensorRT-RTX ------------------------------------------------

def dyn_desc(trt, dims, dtype, fmt=None, max_rows=None):
    d = trt.DynamicPluginTensorDesc()
    desc = trt.PluginTensorDesc()
    desc.dims, desc.type = trt.Dims(list(dims)), dtype
    desc.format = fmt if fmt is not None else trt.TensorFormat.LINEAR
    d.desc = desc
    rows = max_rows if max_rows is not None else dims[0]
    d.min, d.opt, d.max = (trt.Dims([1 if i == 0 and x == -1 else x for i, x in enumerate(dims)]),
                           trt.Dims([max(1, x) for x in dims]),
                           trt.Dims([rows if i == 0 else x for i, x in enumerate(dims)]))
    return d


def io_descs(trt, spec, rows=-1, max_rows=PROFILE.max):
    slots = input_slots(spec)
    descs = [dyn_desc(trt, [rows if d is None else d for d in s.shape], mp.trt_dtype_of(trt, s.dtypes[0]),
                      max_rows=max_rows if s.shape[0] is None else None) for s in slots]
    out = dyn_desc(trt, [rows, spec.hidden_size], mp.trt_dtype_of(trt, output_dtype(spec)), max_rows=max_rows)
    return descs, [out]


def test_identity_and_capabilities(trt):
    p = plugin(trt)
    assert (p.plugin_name, p.plugin_namespace, p.plugin_version, p.num_outputs) == ("MoEPlugin", "moe_build", "1", 1)
    for cap in (trt.PluginCapabilityType.CORE, trt.PluginCapabilityType.BUILD, trt.PluginCapabilityType.RUNTIME):
        assert p.get_capability_interface(cap) is p
    assert isinstance(p, (trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime))


@pytest.mark.parametrize("spec, name", [(PLAIN, "BF16"), (FULL, "HALF")])
def test_output_data_types(trt, spec, name):
    p = plugin(trt, spec)
    ins = [mp.trt_dtype_of(trt, s.dtypes[0]) for s in input_slots(spec)]
    assert p.get_output_data_types(ins) == [getattr(trt.DataType, name)]


def test_output_shapes_through_dims_exprs(trt):
    """Real IDimensionExprs only exist inside a TensorRT build (RTX has no plugin layers, and a bare
    IExprBuilder crashes), so the DimsExprs here hold empty entries: this checks the method's wiring
    (one 2-D output, rank checks); the row/column rule itself is test_output_dims_*."""
    p = plugin(trt, FULL)
    inputs = [trt.DimsExprs(len(s.shape)) for s in input_slots(FULL)]
    out = p.get_output_shapes(inputs, [], trt.IExprBuilder())
    assert len(out) == 1 and isinstance(out[0], trt.DimsExprs) and len(out[0]) == 2
    bad = list(inputs)
    bad[0] = trt.DimsExprs(3)
    with pytest.raises(MoeBuildError, match="input ranks"):
        p.get_output_shapes(bad, [], trt.IExprBuilder())


def test_supports_format_combination_table(trt):
    p = plugin(trt, PLAIN)
    ins, outs = io_descs(trt, PLAIN)
    n = len(ins)
    accepted = {0: {"BF16"}, 1: {"FLOAT", "BF16"}, 2: {"BF16"}, 3: {"BF16"}, 4: {"BF16"}}
    for pos, ok in accepted.items():
        for name in ("FLOAT", "HALF", "BF16", "INT32", "INT8", "FP8"):
            for fmt in (trt.TensorFormat.LINEAR, trt.TensorFormat.CHW32):
                in_out = ins + outs
                in_out[pos].desc.type = getattr(trt.DataType, name)
                in_out[pos].desc.format = fmt
                got = p.supports_format_combination(pos, in_out, n)
                assert got == (name in ok and fmt == trt.TensorFormat.LINEAR), (pos, name, fmt)


def test_configure_and_shape_change_check_dims(trt):
    p = plugin(trt, FULL)
    ins, outs = io_descs(trt, FULL)
    p.configure_plugin(ins, outs)
    p.on_shape_change([d.desc for d in io_descs(trt, FULL, rows=9)[0]], [outs[0].desc])
    wrong = list(ins)
    wrong[2] = dyn_desc(trt, [8, 32, 64], trt.DataType.HALF)  # w1 without the up rows
    with pytest.raises(MoeBuildError, match="'w1'"):
        p.configure_plugin(wrong, outs)
    with pytest.raises(MoeBuildError, match="'w1'"):
        p.on_shape_change([d.desc for d in wrong], [outs[0].desc])
    with pytest.raises(MoeBuildError, match="allows 1024 tokens"):
        p.configure_plugin(io_descs(trt, FULL, max_rows=1024)[0], outs)


def test_workspace_size_asks_for_the_profile_max(trt, monkeypatch):
    seen = []
    monkeypatch.setattr(mp, "workspace_size", lambda spec, plan, tokens: seen.append((spec, tokens)) or 4096)
    p = plugin(trt, PLAIN)
    ins, outs = io_descs(trt, PLAIN, max_rows=300)
    assert p.get_workspace_size(ins, outs) == 4096
    assert seen == [(PLAIN, 300)]


def test_workspace_size_is_the_runners(kernel_library):
    from moe_build.runner import workspace_bytes
    plan = plan_for(PLAIN)
    small, large = workspace_size(PLAIN, plan, 16), workspace_size(PLAIN, plan, 512)
    assert small == workspace_bytes(PLAIN, plan, 16)
    assert 0 < small < large


def test_serialization_round_trip_through_the_creator(trt):
    p = plugin(trt, FULL, force={"finalize": "separate"})
    fields = p.get_fields_to_serialize()
    assert [f.name for f in fields] == list(FIELD_NAMES)
    assert all(f.type == trt.PluginFieldType.CHAR for f in fields)
    creator = mp.plugin_classes(trt).MoEPluginCreator()
    for phase in (trt.TensorRTPhase.BUILD, trt.TensorRTPhase.RUNTIME):
        q = creator.create_plugin("moe", fields, phase)
        assert q.spec == FULL and q.plan.to_dict() == json.loads(json.dumps(p.plan.to_dict()))
        assert fields_from_collection(q.get_fields_to_serialize()) == fields_from_collection(fields)


def test_creator_refuses_a_tampered_field(trt):
    p = plugin(trt)  # the collection points into the plugin's arrays: keep it alive while reading
    fields = fields_from_collection(p.get_fields_to_serialize())
    plan = json.loads(fields["plan"])
    _set_choice(plan, "gemm_kernel", "ampere")
    import numpy as np
    # PluginField does not own its data: keep the arrays alive for as long as the collection is used.
    arrays = {"spec": np.frombuffer(fields["spec"], dtype=np.int8),
              "plan": np.frombuffer(json.dumps(plan).encode(), dtype=np.int8)}
    bad = trt.PluginFieldCollection([trt.PluginField(k, a, trt.PluginFieldType.CHAR) for k, a in arrays.items()])
    creator = mp.plugin_classes(trt).MoEPluginCreator()
    with pytest.raises(MoeBuildError, match="MoEPlugin field 'plan'.*gemm_kernel"):
        creator.create_plugin("moe", bad, trt.TensorRTPhase.RUNTIME)


def test_clone_is_independent(trt):
    p = plugin(trt, FULL)
    q = p.clone()
    assert q is not p and type(q) is type(p)
    assert q.spec == p.spec and q.plan == p.plan and q._cache is not p._cache
    assert fields_from_collection(q.get_fields_to_serialize()) == fields_from_collection(
        p.get_fields_to_serialize())
    attached = p.attach_to_context(None)
    assert attached is not p and attached.plan == p.plan


def test_no_tactics(trt):
    p = plugin(trt)
    assert p.get_valid_tactics() == []
    p.set_tactic(0)


def test_registry_lookup(trt):
    creator = mp.register_moe_plugin(trt)
    assert mp.register_moe_plugin(trt) is creator
    registry = trt.get_plugin_registry()
    found = registry.get_creator("MoEPlugin", "1", "moe_build")
    assert found is creator
    assert (found.name, found.plugin_version, found.plugin_namespace) == ("MoEPlugin", "1", "moe_build")
    assert [f.name for f in found.field_names] == list(FIELD_NAMES)
    assert registry.get_creator("MoEPlugin", "2", "moe_build") is None
    assert registry.get_creator("MoEPlugin", "1", "") is None
    # A second creator for the same key is refused by the registry; registering yields the first.
    assert mp.register_moe_plugin.__wrapped__(trt) is creator


def test_enqueue_adapter_translates_descriptors(trt, monkeypatch):
    calls = []
    monkeypatch.setattr(mp, "run_enqueue", lambda *a: calls.append(a))
    for module in (mp, plugin_enqueue):  # get_workspace_size's name, and the one enqueue's sizing reads
        monkeypatch.setattr(module, "workspace_size", lambda spec, plan, tokens: 1000 + tokens)
    p = plugin(trt, FULL)
    ins, outs = io_descs(trt, FULL, rows=5)
    ptrs = list(range(100, 100 + len(ins)))
    p.enqueue([d.desc for d in ins], [outs[0].desc], ptrs, [999], 777, 555)
    (spec, plan, in_ptrs, shapes, dtypes, out_ptr, out_dtype, ws_ptr, ws_bytes, stream, cache), = calls
    assert spec == FULL and plan == p.plan and in_ptrs == ptrs and out_ptr == 999
    assert shapes[0] == (5, 64) and shapes[2] == (8, 64, 64) and len(shapes) == len(ins)
    assert dtypes[:2] == [torch.float16, torch.float32] and out_dtype == torch.float16
    # the workspace TensorRT gave: what the plugin asks for at the profile's max tokens (512 here), not the
    # need at this call's 5 tokens, so that run_enqueue's check compares the two
    assert (ws_ptr, ws_bytes, stream) == (777, 1000 + PROFILE.max, 555) and cache is p._cache
    p.get_workspace_size(ins, outs)  # a build-time answer (the profile's max of its inputs) is what is given
    p.enqueue([d.desc for d in ins], [outs[0].desc], ptrs, [999], 777, 555)
    assert calls[-1][8] == 1000 + int(ins[0].max[0])


def test_run_enqueue_refuses_a_workspace_smaller_than_the_call_needs(monkeypatch):
    monkeypatch.setattr(plugin_enqueue, "workspace_size", lambda spec, plan, tokens: 1000 + tokens)
    plan = plan_for(FULL)
    shapes = [(5, 64) if slot.shape[0] is None else slot.shape for slot in input_slots(FULL)]
    shapes[1] = (5, FULL.num_experts)
    dtypes = [slot.dtypes[0] for slot in input_slots(FULL)]
    with pytest.raises(MoeBuildError, match="workspace.*1004 bytes given, 1005 needed"):
        run_enqueue(FULL, plan, [1] * len(shapes), shapes, dtypes, 2, torch.float16, 3, 1004, 4)


def test_runner_cache_memo_keeps_the_last_entries_and_forgets_them_with_the_runner():
    cache = RunnerCache()
    made = []

    def make(value):
        return lambda: made.append(value) or value

    assert cache.memo(("before",), make("before")) == "before"
    assert cache.get(("w", 1), make("runner-1")) == "runner-1"
    assert cache.memo(("before",), make("lost")) == "before"  # the first runner drops nothing
    assert cache.memo(("a",), make("a")) == "a" and cache.memo(("a",), make("a2")) == "a"
    for i in range(RunnerCache.MEMO_ENTRIES):
        cache.memo(("k", i), make(i))
    assert cache.memo(("k", 0), make("again")) == 0  # still among the last MEMO_ENTRIES keys
    assert cache.memo(("a",), make("a3")) == "a3"    # the least recently used key was dropped
    assert cache.get(("w", 1), make("unused")) == "runner-1"
    assert cache.get(("w", 2), make("runner-2")) == "runner-2"  # new weight addresses: a new runner...
    assert cache.memo(("k", 0), make("fresh")) == "fresh"        # ...and nothing kept from the old one
    assert "unused" not in made


def test_run_enqueue_checks_before_touching_memory():
    """The core refuses wrong inputs with a clear line before any pointer is dereferenced (CPU-safe)."""
    plan = plan_for(PLAIN)
    shapes = [(4, 64), (4, 8), (8, 64, 64), (8, 64, 32)]
    dtypes = [torch.bfloat16, torch.float32, torch.bfloat16, torch.bfloat16]
    args = dict(output_pointer=1, output_dtype_=torch.bfloat16, workspace_pointer=1, workspace_bytes=0,
                stream_pointer=0)
    with pytest.raises(MoeBuildError, match="'w1'.*dtype"):
        run_enqueue(PLAIN, plan, [1] * 4, shapes, dtypes[:2] + [torch.float16, torch.bfloat16], **args)
    with pytest.raises(MoeBuildError, match="output"):
        run_enqueue(PLAIN, plan, [1] * 4, shapes, dtypes, **{**args, "output_dtype_": torch.float32})
    with pytest.raises(MoeBuildError, match="exceeds the plan's profile max"):
        run_enqueue(PLAIN, plan, [1] * 4, [(513, 64), (513, 8)] + shapes[2:], dtypes, **args)
    run_enqueue(PLAIN, plan, [0] * 4, [(0, 64), (0, 8)] + shapes[2:], dtypes, **args)  # no tokens: no work


class RecordingNetwork:
    """A TensorRT-RTX network plus the add_plugin_v3 that only full TensorRT has, recording its call."""

    def __init__(self, network):
        self._network = network
        self.plugin_call = None

    def __getattr__(self, name):
        return getattr(self._network, name)

    def add_plugin_v3(self, inputs, shape_inputs, plugin):
        self.plugin_call = (inputs, shape_inputs, plugin)
        return type("Layer", (), {"name": ""})()


def rtx_network(trt):
    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    return builder, builder.create_network(0)


def plugin_network(trt, hidden_size: int, experts: int):
    """(builder, the recording network, hidden [T, hidden_size] bf16, logits [T, experts] fp32): a real TensorRT-RTX
    network ready for add_moe_plugin (the builder kept alive beside it)."""
    builder, network = rtx_network(trt)
    hidden = network.add_input("hidden", trt.DataType.BF16, (-1, hidden_size))
    logits = network.add_input("logits", trt.DataType.FLOAT, (-1, experts))
    return builder, RecordingNetwork(network), hidden, logits


def test_add_moe_plugin_needs_full_tensorrt(trt):
    builder, network = rtx_network(trt)
    assert not hasattr(network, "add_plugin_v3")
    with pytest.raises(MoeBuildError, match="plugin-path engines need full TensorRT"):
        mp.add_moe_plugin(network, trt, PLAIN, plan_for(PLAIN), None, None, MoEWeights.random(PLAIN))
    assert network.num_layers == 0  # refused before touching the network


@pytest.mark.parametrize("as_constants", [True, False])
def test_add_moe_plugin_feeds_inputs_in_order(trt, as_constants):
    builder, network = rtx_network(trt)
    net = RecordingNetwork(network)
    hidden = network.add_input("hidden", trt.DataType.HALF, (-1, 64))
    logits = network.add_input("logits", trt.DataType.FLOAT, (-1, 8))
    weights = MoEWeights.random(FULL)
    layer, keep = mp.add_moe_plugin(net, trt, FULL, plan_for(FULL), hidden, logits, weights,
                                    weights_as_constants=as_constants)
    inputs, shape_inputs, plugin_obj = net.plugin_call
    slots = input_slots(FULL)
    assert inputs[:2] == [hidden, logits] and shape_inputs == [] and layer.name == "moe"
    assert plugin_obj.spec == FULL and plugin_obj in keep
    for slot, tensor in zip(slots[2:], inputs[2:]):
        assert tuple(tensor.shape) == slot.shape and tensor.dtype == mp.trt_dtype_of(trt, slot.dtypes[0])
        assert tensor.is_network_input != as_constants
    if as_constants:
        # The sm90 plan runs the gated epilogue, so W1 and b1 are baked gate/up-interleaved by 8: row 16b + r
        # is gate feature 8b + r (r < 8) or up feature 8b + r - 8 (stacked rows I + 8b + r - 8).
        plan = plan_for(FULL)
        assert plan.stage("fc1_activation").choice == "gated_epilogue" and w1_interleaved(plan)
        hosts = dict(zip([slot.name for slot in slots[2:]], [k for k in keep if isinstance(k, torch.Tensor)]))
        w1, b1, inter = weights.w1.to(torch.float16), weights.b1.to(torch.float16), FULL.intermediate_size
        rows = [8 * (j // 16) + j % 16 if j % 16 < 8 else inter + 8 * (j // 16) + j % 16 - 8 for j in range(2 * inter)]
        assert torch.equal(hosts["w1"], w1[:, rows]) and torch.equal(hosts["b1"], b1[:, rows])
        assert torch.equal(hosts["w2"], weights.w2.to(torch.float16))  # the rest as given


def test_plan_weights_block_w1_and_w2_where_the_sm90_gemms_read_blocks():
    """Sizes that are multiples of 64 on sm90 and an engine sized for prefill: the engine holds W1
    interleaved then blocked, and W2 blocked (one copy each, what the runner is then told it gets). The
    plan's weight_layout is decided at the profile's max tokens (512: 256 rows per expert), not at the
    plan's 16; with a profile of at most 64 tokens (32 rows) and on sm80 the weights stay row-major."""
    spec = MoESpec(hidden_size=128, intermediate_size=64, num_experts=4, top_k=2, dtype=DType.FP16)
    weights = MoEWeights.random(spec)
    plan = plan_for(spec)
    assert plan.tokens == 16 and w1_interleaved(plan) and weights_blocked(plan)
    small = make_plan(spec, Target(sm=90, flavour=Flavour.TENSORRT, profile=TokenProfile(min=1, opt=16, max=64)),
                      tokens=16)
    assert not weights_blocked(small)
    given = plan_weights(plan, weights)
    assert torch.equal(given.w1, block_64x64(interleave_gate_up(weights.w1)))
    assert torch.equal(given.w2, block_64x64(weights.w2))
    sm80 = plan_for(spec, sm=80)
    assert not weights_blocked(sm80) and plan_weights(sm80, weights) is weights


def test_plan_weights_keep_the_stacked_order_off_the_gated_epilogue():
    weights = MoEWeights.random(FULL)
    for plan in (plan_for(FULL, sm=80), plan_for(FULL, force={"fc1_activation": "separate"})):
        assert not w1_interleaved(plan) and plan_weights(plan, weights) is weights


def test_fp32_spec_is_refused_with_the_field():
    spec = FP32_RELU
    plan = make_plan(spec, Target(sm=90, flavour=Flavour.TENSORRT), 1)
    with pytest.raises(MoeBuildError) as info:
        check_spec_and_plan(spec, plan)
    assert info.value.field == "dtype"


# ---- FP8 layers (quant fp8 / fp8_block): FP8 weights and fp32 scales as plugin inputs -----------------

# mode -> (quant, act_scale, the checkpoint's weight-scale granularity). Sizes: N1 = 160 and I = 80 are not
# multiples of 128, so block scales cover partial blocks; no two scale shapes coincide.
FP8_MODES = {
    "tensor_static": (Quant.FP8, ActScale.STATIC, ScaleGranularity.TENSOR),
    "tensor_dynamic": (Quant.FP8, ActScale.DYNAMIC, ScaleGranularity.TENSOR),
    "channel": (Quant.FP8, ActScale.DYNAMIC, ScaleGranularity.CHANNEL),
    "block128": (Quant.FP8_BLOCK, ActScale.DYNAMIC, ScaleGranularity.BLOCK128),
}
FP32, BF16 = (torch.float32,), (torch.bfloat16,)
# the scale slots of each mode: per-tensor scales arrive as per-channel ones (plan_weights)
FP8_SCALE_SLOTS = {
    "tensor_static": [("fp8.w1_scale", (4, 160), FP32), ("fp8.w2_scale", (4, 320), FP32),
                      ("fp8.a1_scale", (1,), FP32), ("fp8.a2_scale", (1,), FP32)],
    "tensor_dynamic": [("fp8.w1_scale", (4, 160), FP32), ("fp8.w2_scale", (4, 320), FP32)],
    "channel": [("fp8.w1_scale", (4, 160), FP32), ("fp8.w2_scale", (4, 320), FP32)],
    "block128": [("fp8.w1_scale", (4, 2, 3), FP32), ("fp8.w2_scale", (4, 3, 1), FP32)],
}


def fp8_case(mode: str, seed: int = 0) -> tuple[MoESpec, MoEWeights]:
    """An FP8 layer of `mode` with random canonical weights (static activation scales 0.02 / 0.03)."""
    quant, act_scale, granularity = FP8_MODES[mode]
    spec = MoESpec(hidden_size=320, intermediate_size=80, num_experts=4, top_k=2, dtype=DType.BF16,
                   expert_bias=True, quant=quant, act_scale=act_scale)
    weights = MoEWeights.random(spec, seed=seed, dtype=torch.bfloat16).quantized_fp8(
        granularity, static=act_scale is ActScale.STATIC, a1_scale=0.02, a2_scale=0.03)
    return spec, weights


def raw_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("mode", FP8_MODES)
def test_fp8_input_slots(mode):
    """The fixed order: hidden, logits, FP8 W1 / W2, their scales (then the static activation scales), then
    the optional model-dtype weights; scale shapes as the runner reads them after plan_weights."""
    spec, _ = fp8_case(mode)
    fp8 = (FP8_DTYPE,)
    want = [("hidden", (None, 320), BF16), ("router_logits", (None, 4), (torch.float32, torch.bfloat16)),
            ("w1", (4, 160, 320), fp8), ("w2", (4, 320, 80), fp8), *FP8_SCALE_SLOTS[mode],
            ("b1", (4, 160), BF16), ("b2", (4, 320), BF16)]
    assert [(s.name, s.shape, s.dtypes) for s in input_slots(spec)] == want
    block = FP8_MODES[mode][0] is Quant.FP8_BLOCK
    assert scale_granularity(spec) is (ScaleGranularity.BLOCK128 if block else ScaleGranularity.CHANNEL)


@pytest.mark.parametrize("mode", FP8_MODES)
def test_fp8_slots_fit_the_planned_weights(mode):
    """What add_moe_plugin feeds (plan_weights of canonical FP8 weights) fits every slot and passes the
    canonical check, with the granularity the plugin derives from the quant mode."""
    spec, weights = fp8_case(mode)
    planned = plan_weights(plan_for(spec), weights)
    planned.check(spec)
    assert planned.fp8.granularity is scale_granularity(spec)
    named = dict(planned.named())
    for slot in input_slots(spec)[2:]:
        t = named[slot.name]
        assert t.dtype == slot.dtypes[0], slot.name
        assert tuple(t.shape) == slot.shape or (slot.shape == (1,) and t.numel() == 1), slot.name


@pytest.mark.parametrize("mode", FP8_MODES)
def test_fp8_fields_round_trip(mode):
    spec, _ = fp8_case(mode)
    plan = plan_for(spec)
    fields = encode_fields(spec, plan)
    spec2, plan2 = decode_fields(fields)
    assert spec2 == spec and (spec2.quant, spec2.act_scale) == FP8_MODES[mode][:2]
    assert plan2.to_dict() == json.loads(json.dumps(plan.to_dict()))
    assert encode_fields(spec2, plan2) == fields
    assert input_slots(spec2) == input_slots(spec)


@pytest.mark.parametrize("mode", FP8_MODES)
def test_fp8_supports_io_takes_exactly_each_slots_dtype(mode):
    spec, _ = fp8_case(mode)
    slots = input_slots(spec)
    n = len(slots)
    candidates = (torch.float32, torch.float16, torch.bfloat16, FP8_DTYPE, torch.int8, torch.int32, None)
    for pos in range(n + 1):
        ok = set(slots[pos].dtypes) if pos < n else {torch.bfloat16}
        for dtype in candidates:
            assert supports_io(spec, pos, dtype, True, n) == (dtype in ok), (pos, dtype)
    by_name = {s.name: i for i, s in enumerate(slots)}
    assert supports_io(spec, by_name["w1"], FP8_DTYPE, True, n)
    assert not supports_io(spec, by_name["w1"], torch.bfloat16, True, n)
    assert not supports_io(spec, by_name["fp8.w2_scale"], FP8_DTYPE, True, n)


def test_fp8_supports_format_combination_translates_fp8(trt):
    spec, _ = fp8_case("tensor_static")
    p = mp.plugin_classes(trt).MoEPlugin(spec, plan_for(spec))
    ins, outs = io_descs(trt, spec)
    n = len(ins)
    names = ("FLOAT", "HALF", "BF16", "FP8", "INT8", "INT32")
    for pos, slot in enumerate(list(input_slots(spec)) + [None]):
        ok = {mp.trt_dtype_of(trt, d) for d in (slot.dtypes if slot else (torch.bfloat16,))}
        for name in names:
            in_out = ins + outs
            in_out[pos].desc.type = getattr(trt.DataType, name)
            assert p.supports_format_combination(pos, in_out, n) == (getattr(trt.DataType, name) in ok), (pos, name)
    assert mp.torch_dtype_of(trt, trt.DataType.FP8) == FP8_DTYPE and mp.trt_dtype_of(trt, FP8_DTYPE) == trt.DataType.FP8


def _good_dims(spec: MoESpec, rows: int = -1) -> list[tuple[int, ...]]:
    return [tuple(rows if d is None else d for d in s.shape) for s in input_slots(spec)]


@pytest.mark.parametrize("mode, slot, dims, want", [
    ("block128", "fp8.w1_scale", (4, 160), "(4, 2, 3)"),     # channel scales for a block-scaled layer
    ("block128", "fp8.w2_scale", (4, 3, 2), "(4, 3, 1)"),
    ("tensor_dynamic", "fp8.w1_scale", (4,), "(4, 160)"),   # per-tensor scales must arrive per channel
    ("channel", "fp8.w2_scale", (4, 160), "(4, 320)"),
    ("tensor_static", "fp8.a2_scale", (2,), "(1,)"),
])
def test_fp8_check_input_dims_names_the_scale_slot(mode, slot, dims, want):
    spec, _ = fp8_case(mode)
    good = _good_dims(spec)
    check_input_dims(spec, good)
    bad = list(good)
    bad[[s.name for s in input_slots(spec)].index(slot)] = dims
    with pytest.raises(MoeBuildError) as info:
        check_input_dims(spec, bad)
    text = str(info.value)
    assert len(text.splitlines()) == 1 and f"MoEPlugin input {slot!r}" in text and f"shape {want}" in text


def test_fp8_check_input_dims_counts_the_activation_scales():
    static, _ = fp8_case("tensor_static")
    dynamic, _ = fp8_case("tensor_dynamic")
    with pytest.raises(MoeBuildError, match="got 10 inputs, the spec needs 8"):
        check_input_dims(dynamic, _good_dims(static))
    with pytest.raises(MoeBuildError, match="got 8 inputs, the spec needs 10"):
        check_input_dims(static, _good_dims(dynamic))


def test_fp8_configure_plugin_refuses_a_wrong_scale_shape(trt):
    spec, _ = fp8_case("block128")
    p = mp.plugin_classes(trt).MoEPlugin(spec, plan_for(spec))
    ins, outs = io_descs(trt, spec)
    p.configure_plugin(ins, outs)
    wrong = list(ins)
    wrong[4] = dyn_desc(trt, [4, 160], trt.DataType.FLOAT)
    with pytest.raises(MoeBuildError, match="'fp8.w1_scale'.*shape \\(4, 2, 3\\)"):
        p.configure_plugin(wrong, outs)
    with pytest.raises(MoeBuildError, match="'fp8.w1_scale'"):
        p.on_shape_change([d.desc for d in wrong], [outs[0].desc])


@pytest.mark.parametrize("mode", FP8_MODES)
def test_fp8_workspace_size_is_the_runners(mode, kernel_library):
    from moe_build.runner import workspace_bytes
    spec, _ = fp8_case(mode)
    plan = plan_for(spec)
    sizes = [workspace_size(spec, plan, t) for t in (1, 16, PROFILE.max)]
    assert sizes == [workspace_bytes(spec, plan, t) for t in (1, 16, PROFILE.max)]
    assert 0 < sizes[0] <= sizes[1] < sizes[2]


def test_fp8_run_enqueue_checks_dtypes_before_touching_memory():
    spec, _ = fp8_case("tensor_static")
    plan = plan_for(spec)
    slots = input_slots(spec)
    shapes = _good_dims(spec, rows=4)
    dtypes = [s.dtypes[0] for s in slots]
    args = dict(output_pointer=1, output_dtype_=torch.bfloat16, workspace_pointer=1, workspace_bytes=0,
                stream_pointer=0)
    for name, dtype in (("w1", torch.bfloat16), ("fp8.w1_scale", torch.bfloat16), ("fp8.a1_scale", FP8_DTYPE)):
        bad = list(dtypes)
        bad[[s.name for s in slots].index(name)] = dtype
        with pytest.raises(MoeBuildError, match=f"'{name}'.*dtype"):
            run_enqueue(spec, plan, [1] * len(slots), shapes, bad, **args)


@pytest.mark.parametrize("mode", FP8_MODES)
def test_fp8_runner_is_made_from_the_plan_with_the_scale_inputs(mode, monkeypatch):
    """What enqueue builds, on the CPU: the slot tensors as they are (no copy, no re-decision) in an
    MoEWeights whose Fp8Scales have the plugin's granularity, the plan given, weights_prepared=True."""
    import moe_build.runner as runner_module
    made = []

    class RecordingRunner:
        def __init__(self, spec, weights, **kw):
            made.append((spec, weights, kw))

    monkeypatch.setattr(runner_module, "MoERunner", RecordingRunner)
    spec, weights = fp8_case(mode)
    plan = plan_for(spec)
    planned = dict(plan_weights(plan, weights).named())
    given = {s.name: planned[s.name].reshape(s.shape) for s in input_slots(spec)[2:]}
    _make_runner(spec, plan, given)
    (got_spec, w, kw), = made
    assert got_spec == spec and kw == {"plan": plan, "device": given["w1"].device, "weights_prepared": True}
    assert w.w1 is given["w1"] and w.w2 is given["w2"] and w.b1 is given["b1"] and w.b2 is given["b2"]
    assert w.fp8.granularity is scale_granularity(spec)
    assert w.fp8.w1_scale is given["fp8.w1_scale"] and w.fp8.w2_scale is given["fp8.w2_scale"]
    assert w.fp8.a1_scale is given.get("fp8.a1_scale") and w.fp8.a2_scale is given.get("fp8.a2_scale")
    assert w.fp8.static == (FP8_MODES[mode][1] is ActScale.STATIC)
    assert w.router_weight.shape == (4, 320) and w.router_weight.dtype == torch.bfloat16
    w.check(spec)


def recording_trt(trt, record: list):
    """`trt` whose `Weights(dtype, pointer, count)` also records (dtype, the bytes at pointer): what a
    constant layer will hold (TensorRT-RTX cannot give FP8 weights back as an array)."""
    import ctypes
    import types
    module = types.ModuleType("recording_trt")
    module.__dict__.update({k: getattr(trt, k) for k in dir(trt) if not k.startswith("__")})

    def weights(dtype, pointer, count):
        record.append((dtype, ctypes.string_at(pointer, count * mp.torch_dtype_of(trt, dtype).itemsize)))
        return trt.Weights(dtype, pointer, count)

    module.Weights = weights
    return module


@pytest.mark.parametrize("mode", FP8_MODES)
def test_add_moe_plugin_bakes_fp8_constants(trt, mode):
    spec, weights = fp8_case(mode)
    plan = plan_for(spec)
    record: list = []
    builder, net, hidden, logits = plugin_network(trt, 320, 4)
    layer, keep = mp.add_moe_plugin(net, recording_trt(trt, record), spec, plan, hidden, logits, weights)
    inputs, _, plugin_obj = net.plugin_call
    slots = input_slots(spec)[2:]
    assert plugin_obj.spec == spec and plugin_obj in keep and inputs[:2] == [hidden, logits]
    assert [d for d, _ in record] == [mp.trt_dtype_of(trt, s.dtypes[0]) for s in slots]
    names = [net.get_layer(i).name for i in range(net.num_layers)]
    assert names == [f"moe.{s.name}" for s in slots]
    planned = dict(plan_weights(plan, weights).named())
    for slot, tensor, (_, data) in zip(slots, inputs[2:], record):
        assert tensor.dtype == mp.trt_dtype_of(trt, slot.dtypes[0]) and tuple(tensor.shape) == slot.shape
        assert not tensor.is_network_input
        assert data == raw_bytes(planned[slot.name]), slot.name
    baked = {s.name: data for s, (_, data) in zip(slots, record)}
    # the FP8 weights as given, row-major, W1's gate and up rows interleaved by 8 where the plan runs the gated
    # epilogue (sm90, rowwise scales) ...
    assert trt.DataType.FP8 == inputs[2].dtype == inputs[3].dtype
    interleaved = plan.stage("w1_order").choice == "gate_up_interleaved"
    assert interleaved == (mode != "block128")
    order = interleave_gate_up if interleaved else (lambda t: t)
    assert baked["w1"] == raw_bytes(order(weights.w1.view(torch.uint8))) and baked["w2"] == raw_bytes(weights.w2)
    # ... and their scales: per-tensor ones repeated per output row, the others as given; W1's in W1's row order
    f = weights.fp8
    if f.granularity is ScaleGranularity.TENSOR:
        assert baked["fp8.w1_scale"] == raw_bytes(order(f.w1_scale[:, None].repeat_interleave(160, dim=1)))
        assert baked["fp8.w2_scale"] == raw_bytes(f.w2_scale.repeat_interleave(320))
    else:
        assert baked["fp8.w1_scale"] == raw_bytes(order(f.w1_scale)) and baked["fp8.w2_scale"] == raw_bytes(f.w2_scale)
    if f.static:
        assert baked["fp8.a1_scale"] == raw_bytes(torch.tensor([0.02])) and len(baked["fp8.a2_scale"]) == 4


def test_add_moe_plugin_fp8_weights_as_network_inputs(trt):
    spec, weights = fp8_case("block128")
    builder, net, hidden, logits = plugin_network(trt, 320, 4)
    mp.add_moe_plugin(net, trt, spec, plan_for(spec), hidden, logits, weights, weights_as_constants=False)
    inputs = net.plugin_call[0][2:]
    assert [(t.name, t.dtype, tuple(t.shape)) for t in inputs] == [
        (f"moe.{s.name}", mp.trt_dtype_of(trt, s.dtypes[0]), s.shape) for s in input_slots(spec)[2:]]
    assert inputs[0].dtype == trt.DataType.FP8 and inputs[2].dtype == trt.DataType.FLOAT


# weight-only layers: (quant, stored kind, group (None: per channel), zero points, AWQ pre-quant scales)
WOQ_MODES = {"awq_g64_zeros": (Quant.W4A16_AWQ, 64, True, True), "int4_g32": (Quant.W4A16_AWQ, 32, False, False),
             "int8_channel": (Quant.W8A16, None, False, False), "mxfp4": (Quant.WFP4A16, 32, False, False)}


def woq_case(mode: str, seed: int = 0) -> tuple[MoESpec, MoEWeights]:
    """A weight-only layer of `mode` with random weights quantized to woq.py's canonical storage."""
    from moe_build.weights.woq import QUANT_KIND
    quant, group, zeros, awq = WOQ_MODES[mode]
    base = MoESpec(hidden_size=320, intermediate_size=64, num_experts=4, top_k=2, dtype=DType.BF16, expert_bias=True)
    weights = MoEWeights.random(base, seed=seed, dtype=torch.bfloat16).quantized_woq(
        QUANT_KIND[quant], group, asymmetric=zeros, awq=awq, seed=seed)
    spec = base.with_overrides(quant=quant, quant_group_size=group or 128, **weights.woq.storage_flags())
    return spec, weights


@pytest.mark.parametrize("mode", WOQ_MODES)
def test_woq_input_slots(mode):
    """hidden, logits, the stored W1 / W2 (packed uint8 or int8), their scales, the zero points and the AWQ
    pre-quant scales where the spec says the checkpoint has them, then the model-dtype biases; every uint8 tensor
    carried as INT8 (TensorRT's constants take no UINT8), stored as uint8."""
    spec, _ = woq_case(mode)
    quant, group, zeros, awq = WOQ_MODES[mode]
    packed = quant is not Quant.W8A16
    byte = ((torch.int8,), torch.uint8)  # carried as int8, stored as uint8
    data = byte if packed else ((torch.int8,), None)
    scale = byte if quant is Quant.WFP4A16 else ((torch.float32,), None)
    fp32 = ((torch.float32,), None)
    g1, g2 = (1, 1) if group is None else (320 // group, 64 // group)
    h, i = (160, 32) if packed else (320, 64)
    want = [("hidden", (None, 320), (BF16, None)),
            ("router_logits", (None, 4), ((torch.float32, torch.bfloat16), None)),
            ("w1", (4, 128, h), data), ("w2", (4, 320, i), data), ("woq.w1_scale", (4, 128, g1), scale),
            ("woq.w2_scale", (4, 320, g2), scale)]
    if zeros:
        want += [("woq.w1_zero", (4, 128, g1), byte), ("woq.w2_zero", (4, 320, g2), byte)]
    if awq:
        want += [("woq.fc1_act_scale", (320,), fp32), ("woq.fc2_act_scale", (64,), fp32)]
    want += [("b1", (4, 128), (BF16, None)), ("b2", (4, 320), (BF16, None))]
    assert [(s.name, s.shape, (s.dtypes, s.stored)) for s in input_slots(spec)] == want


@pytest.mark.parametrize("mode", WOQ_MODES)
def test_woq_slots_fit_the_planned_weights(mode):
    """What add_moe_plugin feeds (plan_weights of canonical weight-only weights) fits every slot, in order, and
    passes the canonical check; the slots hold every stored tensor."""
    spec, weights = woq_case(mode)
    planned = plan_weights(plan_for(spec), weights)
    planned.check(spec)
    named = dict(planned.named())
    slots = input_slots(spec)[2:]
    for slot in slots:
        t = named[slot.name]
        assert t.dtype == (slot.stored or slot.dtypes[0]) and tuple(t.shape) == slot.shape, slot.name
        carried = slot.carried(t)  # what TensorRT holds: the same bytes, and back
        assert carried.dtype == slot.dtypes[0] and carried.data_ptr() == t.data_ptr(), slot.name
        assert torch.equal(slot.as_stored(carried), t), slot.name
    stored = {f"woq.{n}" for n, _ in weights.woq.named() if n not in ("w1", "w2")}
    assert stored <= {s.name for s in slots}


@pytest.mark.parametrize("mode", WOQ_MODES)
def test_woq_fields_round_trip(mode):
    spec, _ = woq_case(mode)
    plan = plan_for(spec)
    fields = encode_fields(spec, plan)
    spec2, plan2 = decode_fields(fields)
    assert spec2 == spec and input_slots(spec2) == input_slots(spec)
    assert encode_fields(spec2, plan2) == fields


def test_woq_supports_io_takes_the_carried_byte_types(trt):
    """The packed codes and zero points are accepted as INT8 only (the type TensorRT carries them in), the fp32
    scales as fp32 only; TensorRT's UINT8 is not a type the plugin moves."""
    spec, _ = woq_case("awq_g64_zeros")
    slots = input_slots(spec)
    by_name = {s.name: i for i, s in enumerate(slots)}
    n = len(slots)
    assert supports_io(spec, by_name["w1"], torch.int8, True, n)
    assert not supports_io(spec, by_name["w1"], torch.uint8, True, n)
    assert supports_io(spec, by_name["woq.w1_zero"], torch.int8, True, n)
    assert not supports_io(spec, by_name["woq.w1_scale"], torch.int8, True, n)
    assert mp.torch_dtype_of(trt, trt.DataType.UINT8) is None and mp.trt_dtype_of(trt, torch.int8) == trt.DataType.INT8


@pytest.mark.parametrize("mode", WOQ_MODES)
@pytest.mark.parametrize("as_constants", [True, False])
def test_add_moe_plugin_feeds_woq_experts_as_stored(trt, mode, as_constants):
    """A weight-only layer into a real (TensorRT-RTX) network: every input in slot order with its slot's shape;
    the uint8 bytes (packed codes, e8m0 scales, zero points) as INT8, since a constant layer refuses UINT8 weights,
    holding the stored bytes exactly (constants), or as INT8 network inputs of those shapes."""
    spec, weights = woq_case(mode)
    plan = plan_for(spec)
    record: list = []
    builder, net, hidden, logits = plugin_network(trt, 320, 4)
    mp.add_moe_plugin(net, recording_trt(trt, record), spec, plan, hidden, logits, weights,
                      weights_as_constants=as_constants)
    inputs = net.plugin_call[0][2:]
    slots = input_slots(spec)[2:]
    stored = dict(plan_weights(plan, weights).named())
    for slot, tensor in zip(slots, inputs):
        byte = stored[slot.name].dtype in (torch.uint8, torch.int8)
        assert tensor.dtype == (trt.DataType.INT8 if byte else mp.trt_dtype_of(trt, slot.dtypes[0])), slot.name
        assert tuple(tensor.shape) == slot.shape and tensor.is_network_input != as_constants, slot.name
    if as_constants:
        assert [data for _, data in record] == [raw_bytes(stored[s.name]) for s in slots]
    else:
        assert record == [] and [t.name for t in inputs] == [f"moe.{s.name}" for s in slots]
