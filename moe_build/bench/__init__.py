"""Timing the fused runner against its peers and the hardware floor (`moe-build bench`)."""
