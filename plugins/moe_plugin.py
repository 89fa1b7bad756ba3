"""`MoEPlugin`: the plugin path's fused MoE layer as a TensorRT IPluginV3.

The plugin's rules live in TensorRT-free modules, so each can be checked where it can run: its inputs (slots.py),
its fields and their checks (fields.py), its build-side rules (build_rules.py) and the body of its enqueue
(enqueue.py, PyTorch only). This module holds the thin adapters (`plugin_classes(trt)`) that subclass the IPluginV3
interfaces of whichever TensorRT-family module they are given (full `tensorrt`, or `tensorrt_rtx_bindings`, which
has the interfaces but no `add_plugin_v3`) and translate TensorRT's descriptors to those rules, and
`add_moe_plugin`, which puts the layer in a network.
"""
from __future__ import annotations

import functools
from types import ModuleType, SimpleNamespace
from typing import Any, Sequence

import torch

from moe_build.errors import MoeBuildError
from moe_build.planner import Plan
from moe_build.spec import MoESpec
from moe_build.weights import MoEWeights
from moe_build.weights.fp8 import FP8_DTYPE

from .build_rules import check_input_dims, check_profile, output_dims, plan_max_tokens, supports_io, workspace_size
from .enqueue import RunnerCache, cached_workspace_size, run_enqueue
from .fields import (FIELD_NAMES, PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION, decode_fields, encode_fields,
                     fields_from_collection)
from .slots import input_slots, output_dtype, plan_weights

# TensorRT DataType member names of the dtypes the plugin moves (same in both flavours).
TRT_DTYPE_NAME = {torch.float32: "FLOAT", torch.float16: "HALF", torch.bfloat16: "BF16", FP8_DTYPE: "FP8",
                  torch.int8: "INT8"}


def torch_dtype_of(trt: ModuleType, trt_dtype: Any) -> torch.dtype | None:
    """The torch dtype of a TensorRT DataType, None for types the plugin never moves."""
    for dtype, name in TRT_DTYPE_NAME.items():
        if trt_dtype == getattr(trt.DataType, name):
            return dtype
    return None


def trt_dtype_of(trt: ModuleType, dtype: torch.dtype) -> Any:
    return getattr(trt.DataType, TRT_DTYPE_NAME[dtype])


@functools.lru_cache(maxsize=None)
def plugin_classes(trt: ModuleType) -> SimpleNamespace:
    """`MoEPlugin` and `MoEPluginCreator` subclassing `trt`'s interfaces (one pair per module)."""
    import numpy as np

    class MoEPluginImpl(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
        """The TensorRT face of the MoE layer; every rule lives in the TensorRT-free modules."""

        def __init__(self, spec: MoESpec, plan: Plan):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.plugin_name, self.plugin_namespace, self.plugin_version = PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION
            self.num_outputs = 1
            self.spec, self.plan = spec, plan
            # PluginField points into its array without owning it: the plugin owns the field data.
            self._field_arrays = {name: np.frombuffer(data, dtype=np.int8)
                                  for name, data in encode_fields(spec, plan).items()}
            self._cache = RunnerCache()
            self._workspace_given: int | None = None  # bytes TensorRT allocated (get_workspace_size's answer)

        # IPluginV3 / core
        def get_capability_interface(self, capability_type: Any) -> Any:
            return self

        def clone(self) -> "MoEPluginImpl":
            return MoEPluginImpl(self.spec, self.plan)

        # build
        def get_output_data_types(self, input_types: Sequence[Any]) -> list[Any]:
            return [trt_dtype_of(trt, output_dtype(self.spec))]

        def get_output_shapes(self, inputs: Sequence[Any], shape_inputs: Sequence[Any], expr_builder: Any) -> list[Any]:
            slots = input_slots(self.spec)
            ranks = [len(d) for d in inputs]
            if ranks != [len(s.shape) for s in slots]:
                raise MoeBuildError(PLUGIN_NAME, f"input ranks {ranks} do not fit the spec",
                                    [f"{s.name}:{len(s.shape)}" for s in slots])
            return [trt.DimsExprs(output_dims([[d[i] for i in range(len(d))] for d in inputs]))]

        def supports_format_combination(self, pos: int, in_out: Sequence[Any], num_inputs: int) -> bool:
            desc = in_out[pos].desc
            return supports_io(self.spec, pos, torch_dtype_of(trt, desc.type), desc.format == trt.TensorFormat.LINEAR,
                               num_inputs)

        def configure_plugin(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
            check_input_dims(self.spec, [tuple(d.desc.dims) for d in inputs])
            check_profile(self.plan, int(inputs[0].max[0]))

        def get_workspace_size(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> int:
            self._workspace_given = workspace_size(self.spec, self.plan, max(1, int(inputs[0].max[0])))
            return self._workspace_given

        def get_valid_tactics(self) -> list[int]:
            return []  # one implementation per plan: the plan, not TensorRT's timing, picks kernels

        # runtime
        def set_tactic(self, tactic: int) -> None:
            pass  # no tactics are offered (get_valid_tactics), so there is nothing to select

        def on_shape_change(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
            check_input_dims(self.spec, [tuple(d.dims) for d in inputs])

        def attach_to_context(self, resource_context: Any) -> "MoEPluginImpl":
            return self.clone()  # each execution context gets its own runner cache

        def get_fields_to_serialize(self) -> Any:
            return trt.PluginFieldCollection([trt.PluginField(name, array, trt.PluginFieldType.CHAR)
                                              for name, array in self._field_arrays.items()])

        def enqueue(self, input_desc: Sequence[Any], output_desc: Sequence[Any], inputs: Sequence[int],
                    outputs: Sequence[int], workspace: int, stream: int) -> None:
            run_enqueue(self.spec, self.plan, list(inputs), [tuple(d.dims) for d in input_desc],
                        [torch_dtype_of(trt, d.type) for d in input_desc], outputs[0],
                        torch_dtype_of(trt, output_desc[0].type), workspace,
                        self._workspace_bytes(input_desc), stream, self._cache)

        def _workspace_bytes(self, input_desc: Sequence[Any]) -> int:
            """The workspace TensorRT gave: enqueue passes no size, but TensorRT allocates what
            `get_workspace_size` asked for at the profile's max tokens; an engine built by moe-build has the
            plan's profile, so a plugin made from an engine's fields computes the same size (run_enqueue then
            checks this call's need against it)."""
            if self._workspace_given is None:
                self._workspace_given = cached_workspace_size(self._cache, self.spec, self.plan,
                                                              plan_max_tokens(self.plan))
            return self._workspace_given

    class MoEPluginCreatorImpl(trt.IPluginCreatorV3One):
        """Makes `MoEPlugin`s from their fields (at build time and when an engine is loaded)."""

        def __init__(self) -> None:
            trt.IPluginCreatorV3One.__init__(self)
            self.name, self.plugin_namespace, self.plugin_version = PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION
            self._empty = np.zeros(0, dtype=np.int8)  # PluginField does not own its data
            self.field_names = trt.PluginFieldCollection([
                trt.PluginField(name, self._empty, trt.PluginFieldType.CHAR) for name in FIELD_NAMES])

        def create_plugin(self, name: str, field_collection: Any, phase: Any) -> MoEPluginImpl:
            spec, plan = decode_fields(fields_from_collection(field_collection))
            return MoEPluginImpl(spec, plan)

    MoEPluginImpl.__name__ = MoEPluginImpl.__qualname__ = "MoEPlugin"
    MoEPluginCreatorImpl.__name__ = MoEPluginCreatorImpl.__qualname__ = "MoEPluginCreator"
    return SimpleNamespace(MoEPlugin=MoEPluginImpl, MoEPluginCreator=MoEPluginCreatorImpl)


@functools.lru_cache(maxsize=None)
def register_moe_plugin(trt: ModuleType) -> Any:
    """Register one `MoEPluginCreator` with `trt`'s plugin registry (idempotent) and return it.

    Engines with the plugin can then be deserialized in this process: TensorRT finds the creator
    by (name, version, namespace) and rebuilds each plugin from its serialized fields.
    """
    creator = plugin_classes(trt).MoEPluginCreator()
    registry = trt.get_plugin_registry()
    if not registry.register_creator(creator, PLUGIN_NAMESPACE):
        existing = registry.get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE)
        if existing is None:
            raise MoeBuildError(PLUGIN_NAME, "the plugin registry refused the creator")
        return existing
    return creator


def add_moe_plugin(network: Any, trt: ModuleType, spec: MoESpec, plan: Plan, hidden: Any, router_logits: Any,
                   weights: MoEWeights, weights_as_constants: bool = True,
                   name: str = "moe") -> tuple[Any, list[Any]]:
    """Insert the MoE plugin layer into `network`; returns (layer, objects to keep alive until built).

    `hidden` [T, H] and `router_logits` [T, E] are network tensors. The expert weights become
    constant layers (`weights_as_constants`, baked into the engine, in `plan_weights` order) or
    network inputs named `{name}.{weight}` (supplied at run time, in that order). FP8 experts go in
    as they are stored: W1 / W2 as DataType.FP8 weights (`trt.Weights` takes the e4m3 bytes with that
    type; a constant's output type is its weights' type) and their scales as fp32, so the engine holds
    the checkpoint's numbers and nothing is dequantized. TensorRT reads constant data only when the
    engine is built, so the returned host buffers (and the Python plugin object) must outlive the build.
    """
    if not hasattr(network, "add_plugin_v3"):
        raise MoeBuildError("flavour", "plugin-path engines need full TensorRT: this network has no add_plugin_v3 "
                            "(TensorRT-RTX has no custom plugin layers); build with --moe-plugin disable", "tensorrt")
    weights.check(spec)
    given = dict(plan_weights(plan, weights).named())
    plugin = plugin_classes(trt).MoEPlugin(spec, plan)
    tensors, keep_alive = [hidden, router_logits], []
    for slot in input_slots(spec)[2:]:
        # check() has shown every shape fits the spec; reshape only gives a scalar activation scale its [1].
        stored = given[slot.name].detach().to("cpu", slot.stored or slot.dtypes[0])
        host = slot.carried(stored.reshape(slot.shape).contiguous())
        if weights_as_constants:
            keep_alive.append(host)
            w = trt.Weights(trt_dtype_of(trt, slot.dtypes[0]), host.data_ptr(), host.numel())
            layer = network.add_constant(trt.Dims(list(slot.shape)), w)
            layer.name = f"{name}.{slot.name}"
            tensors.append(layer.get_output(0))
        else:
            tensors.append(network.add_input(f"{name}.{slot.name}", trt_dtype_of(trt, slot.dtypes[0]),
                                             trt.Dims(list(slot.shape))))
    layer = network.add_plugin_v3(tensors, [], plugin)
    layer.name = name
    return layer, keep_alive + [plugin]
