"""A DSV4-style reference model, being built: configuration and presets (``config``), mHC
(``mhc``), rotary embedding (``rope``) and the compression math (``compressor``)."""

from dsv4spec.model.config import PRESETS, ModelConfig, YarnScaling, preset

__all__ = ["PRESETS", "ModelConfig", "YarnScaling", "preset"]
