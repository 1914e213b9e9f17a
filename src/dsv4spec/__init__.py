"""dsv4spec: fast ops for DeepSeek-V4 MTP speculative decoding, and a reference engine whose
speculative output is token-identical to greedy decoding in float64."""

__version__ = "0.1.0"
