"""moe-build: ahead-of-time builder of fused Mixture-of-Experts TensorRT engines."""
__version__ = "0.1.0"
