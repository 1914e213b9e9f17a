"""Request state: the C128 compressor rings (with the fused rollback) and the model's state."""

from dsv4spec.cache.c128_pool import C128StatePool
from dsv4spec.cache.model_state import ModelState

__all__ = ["C128StatePool", "ModelState"]
