"""The layer as a network: the OOTB decomposed ONNX graph (the plugin path's layer is `moe_build.plugins`)."""
