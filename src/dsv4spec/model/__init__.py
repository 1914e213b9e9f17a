"""A DSV4-style reference model: configuration and presets (the forward is being built)."""

from dsv4spec.model.config import PRESETS, ModelConfig, YarnScaling, preset

__all__ = ["PRESETS", "ModelConfig", "YarnScaling", "preset"]
