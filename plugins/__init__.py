"""TensorRT plugins of moe-build: `MoEPlugin`, the plugin path's fused MoE layer (moe_plugin.py; its inputs in
slots.py, its fields in fields.py, its build-side rules in build_rules.py, the body of its enqueue in enqueue.py)."""
