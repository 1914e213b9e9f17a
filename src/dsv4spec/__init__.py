"""dsv4spec: fast, proven-lossless ops for DeepSeek-V4 MTP speculative decoding."""

__version__ = "0.1.0"
