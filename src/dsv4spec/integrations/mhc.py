"""What the mHC hooks of every engine check and map the same way: the engines' ``mhc_pre``,
``mhc_post`` and ``mhc_fused_post_pre`` take the same arguments (SGLang 0.5.23's and vLLM
0.33.0's TileLang wrappers share their signatures up to the tiling arguments), so which calls
dsv4spec's ops cover, and with which arguments, does not depend on the engine.
"""

from __future__ import annotations

from typing import Any

import torch

HC = 4


def streams_ok(residual: Any) -> bool:
    """``residual`` is ``[T, 4, H]`` bf16 (the engines' kernels take bf16 only), contiguous,
    T > 0 and H > 0."""
    return (isinstance(residual, torch.Tensor) and residual.dim() == 3
            and residual.shape[1] == HC and residual.shape[0] > 0 and residual.shape[2] > 0
            and residual.dtype == torch.bfloat16 and residual.is_contiguous())


def post_shapes_ok(x: Any, residual: torch.Tensor, post_layer_mix: Any,
                   comb_res_mix: Any) -> bool:
    """The post inputs beside a ``residual [T, 4, H]`` that :func:`streams_ok` accepted: ``x``
    ``[T, H]`` bf16, ``post_layer_mix`` ``[T, 4, 1]`` or ``[T, 4]`` and contiguous,
    ``comb_res_mix`` ``[T, 4, 4]`` (their dtypes are left to the caller)."""
    T, hc, H = residual.shape
    return (isinstance(x, torch.Tensor) and isinstance(post_layer_mix, torch.Tensor)
            and isinstance(comb_res_mix, torch.Tensor) and x.dtype == torch.bfloat16
            and tuple(x.shape) == (T, H)
            and tuple(post_layer_mix.shape) in ((T, hc, 1), (T, hc))
            and post_layer_mix.is_contiguous() and tuple(comb_res_mix.shape) == (T, hc, hc))


def pre_kwargs(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat,
               norm_weight, norm_eps, hidden_size) -> dict | None:
    """dsv4spec's ``mhc_pre`` arguments for an engine's, or None where they do not map exactly.

    The engines add ``hc_pre_eps`` to the pre weights' sigmoid and use ``hc_sinkhorn_eps`` in the
    Sinkhorn (``softmax + eps``, then each normalisation's ``/ (sum + eps)``); dsv4spec's op has
    one ``hc_eps`` for both, so the call maps only when the two are equal (DSV4 passes its
    ``hc_eps`` twice): ``hc_eps = hc_pre_eps``. ``rms_eps`` is the factor r's epsilon in both,
    ``hc_post_mult_value`` is ``post_mult`` and ``sinkhorn_repeat`` is ``sinkhorn_iters`` (one
    softmax + column pass, then ``sinkhorn_repeat - 1`` row/column passes in both). The engines
    round ``norm_weight`` to bf16 before the fused RMSNorm; ours would use a float32 weight as
    is, so only a bf16 ``[hidden_size]`` weight maps (DSV4's RMSNorm weight is bf16). Without
    ``norm_weight``, ``norm_eps`` is ignored, as the engines ignore it.
    """
    if hc_pre_eps != hc_sinkhorn_eps:
        return None
    kwargs = {"rms_eps": float(rms_eps), "hc_eps": float(hc_pre_eps),
              "sinkhorn_iters": sinkhorn_repeat, "post_mult": float(hc_post_mult_value)}
    if norm_weight is not None:
        if (not isinstance(norm_weight, torch.Tensor) or norm_weight.dtype != torch.bfloat16
                or tuple(norm_weight.shape) != (hidden_size,) or norm_eps is None):
            return None
        kwargs["norm_weight"] = norm_weight
        kwargs["norm_eps"] = float(norm_eps)
    return kwargs
