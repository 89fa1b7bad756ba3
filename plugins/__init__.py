"""TensorRT plugins of moe-build: `MoEPlugin`, the plugin path's fused MoE layer (see moe_plugin.py)."""
from .moe_plugin import (FIELD_NAMES, PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION, InputSlot, add_moe_plugin,
                         decode_fields, encode_fields, input_slots, plugin_classes, register_moe_plugin, run_enqueue)

__all__ = ["FIELD_NAMES", "PLUGIN_NAME", "PLUGIN_NAMESPACE", "PLUGIN_VERSION", "InputSlot", "add_moe_plugin",
           "decode_fields", "encode_fields", "input_slots", "plugin_classes", "register_moe_plugin", "run_enqueue"]
