"""Greedy generation with MTP speculative decoding over the reference model."""

from dsv4spec.engine.generate import ROLLBACKS, Engine, Request

__all__ = ["ROLLBACKS", "Engine", "Request"]
