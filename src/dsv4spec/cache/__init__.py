"""KV-side state owned by the engine: the C128 compressor rings."""

from dsv4spec.cache.c128_pool import C128StatePool, count_c128_layers

__all__ = ["C128StatePool", "count_c128_layers"]
