"""Engines: the TensorRT flavours, building an engine with its manifest, verifying and running it."""
