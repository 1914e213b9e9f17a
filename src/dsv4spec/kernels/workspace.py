"""Scratch buffers that eager launches reuse instead of allocating per call."""

from __future__ import annotations

from collections import OrderedDict

import torch

from dsv4spec.capture import stream_capturing

# Every cache together holds at most this many bytes: a serving engine's memory planner does not
# see them, so they stay small (a few fp32 partial sums per token) and bounded.
WORKSPACE_CACHE_BYTES = 32 << 20


class WorkspaceCache:
    """fp32 scratch tensors keyed by (device, stream, shape), least recently used dropped first.

    Reuse is safe because launches on one stream run in order and each user overwrites every
    element it later reads; a call on another stream gets its own buffer, and a call being
    captured into a CUDA graph allocates from the graph's pool instead (its replays must not
    share a buffer with eager calls). ``max_bytes`` caps what the cache holds; a buffer larger
    than the cap is allocated per call.
    """

    def __init__(self, max_bytes: int = WORKSPACE_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._buffers: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._buffers)

    def buffers(self) -> list[torch.Tensor]:
        return list(self._buffers.values())

    def clear(self) -> None:
        self._buffers.clear()
        self.nbytes = 0

    def get(self, like: torch.Tensor, shape: tuple, device_index: int) -> torch.Tensor:
        """An fp32 tensor of ``shape`` on ``like``'s device, for the current stream."""
        if device_index >= 0:
            if stream_capturing(device_index):
                return like.new_empty(shape, dtype=torch.float32)
            key = (device_index, torch._C._cuda_getCurrentRawStream(device_index), shape)
        else:
            key = (device_index, 0, shape)
        buffer = self._buffers.get(key)
        if buffer is not None:
            self._buffers.move_to_end(key)
            return buffer
        buffer = like.new_empty(shape, dtype=torch.float32)
        nbytes = buffer.numel() * 4
        if nbytes <= self.max_bytes:
            while self.nbytes + nbytes > self.max_bytes:
                self.nbytes -= self._buffers.popitem(last=False)[1].numel() * 4
            self._buffers[key] = buffer
            self.nbytes += nbytes
        return buffer
