"""The hc_head hooks' kernel preparation, the same for every engine: every Triton variant the
calls ``T = 1..PRECOMPILE_MAX_TOKENS`` need, compiled at once for one device, width and dtype
(outside a CUDA-graph capture: nothing may compile inside one), and one line saying so.
"""

from __future__ import annotations

import logging
import time

import torch

from dsv4spec.kernels.hc_head_precompile import PRECOMPILE_MAX_TOKENS, precompile


def precompile_hc_head(hidden_size: int, dtype: torch.dtype, device_index: int,
                       logger: logging.Logger) -> int:
    """Compile hc_head's kernels for ``T = 1..PRECOMPILE_MAX_TOKENS`` at width ``hidden_size``
    and ``dtype`` on ``cuda:device_index``; log how many and how long at WARNING (the time a
    server's first eager call spends); return how many variants were compiled."""
    start = time.perf_counter()
    count = precompile(hidden_size, dtype, device_index)
    logger.warning("dsv4spec: hc_head kernels for H = %d, %s, T = 1..%d on cuda:%d ready: "
                   "%d variants compiled in %.1f s", hidden_size, dtype,
                   PRECOMPILE_MAX_TOKENS, device_index, count, time.perf_counter() - start)
    return count
