"""The DSV4-style reference model: configuration and presets (``config``), mHC (``mhc``), rotary
embedding (``rope``), the compression math (``compressor``), the target and MTP block (``model``),
weights (``weights``), the model factory and packaged checkpoints (``build``) and the byte
tokenizer (``tokenizer``)."""

from dsv4spec.model.config import PRESETS, ModelConfig, YarnScaling, preset

__all__ = ["PRESETS", "ModelConfig", "YarnScaling", "preset"]
