"""The model tail as one op, ``mhc_post_head``: the last layer's hc_post, then hc_head of the new
streams (and the final RMSNorm), in 2 launches where the sequence takes 3 (4 with the norm), up
to 192 tokens. The new streams come back too: the MTP draft reads them. docs/design.md (mHC) has
the argument and the measurement."""

from __future__ import annotations

import torch

from dsv4spec.kernels.mhc import mhc_post_head_triton
from dsv4spec.ops.hc_head import check_hc_head_inputs, hc_head_reference
from dsv4spec.ops.mhc import (
    _check_float,
    _check_impl,
    _check_tensor,
    _direct_call_ok,
    _post_inputs_ok,
    _use_triton,
    mhc_post_reference,
)


def mhc_post_head_reference(
    f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
    hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, *, norm_eps: float,
    hc_eps: float, norm_weight: torch.Tensor | None = None, final_norm_eps: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~dsv4spec.ops.mhc_post_reference` (float64, rounded to ``residual.dtype``), then
    :func:`~dsv4spec.ops.hc_head_reference` of those rounded streams, then with ``norm_weight``
    the RMSNorm of that rounded hidden state in fp32, rounded again (the model's ``norm``)."""
    new = mhc_post_reference(f, residual, post, comb)
    y = hc_head_reference(new, hc_fn, hc_scale, hc_base, norm_eps=norm_eps, hc_eps=hc_eps)
    if norm_weight is not None:
        yf = y.to(torch.promote_types(y.dtype, torch.float32))
        yf = yf * torch.rsqrt(yf.square().mean(-1, keepdim=True) + final_norm_eps) * norm_weight
        y = yf.to(residual.dtype)
    return new, y


def _check_head(residual, hc_fn, hc_scale, hc_base, norm_eps, hc_eps, norm_weight,
                final_norm_eps, impl) -> None:
    # hc_head's parameters and epsilons through hc_head's own check (impl is this op's, checked
    # below), then the final norm's
    check_hc_head_inputs(residual, hc_fn, hc_scale, hc_base, None, norm_eps, hc_eps, "auto")
    if norm_weight is not None:
        H = residual.shape[2]
        _check_tensor("norm_weight", norm_weight, (H,), (torch.float32, residual.dtype),
                      residual.device)
        if final_norm_eps is None:
            raise ValueError("final_norm_eps must be given with norm_weight")
        _check_float("final_norm_eps", final_norm_eps)
    elif final_norm_eps is not None:
        _check_float("final_norm_eps", final_norm_eps)
    if impl != "auto":
        _check_impl(impl, residual)


@torch.library.custom_op("dsv4spec::mhc_post_head", mutates_args=())
def _mhc_post_head_op(
    f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
    hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    norm_weight: torch.Tensor | None, norm_eps: float, hc_eps: float, final_norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    T, _, H = residual.shape
    out = (torch.empty_like(residual), residual.new_empty((T, H)))
    return mhc_post_head_triton(f, residual, post, comb, hc_fn, hc_scale, hc_base, norm_eps,
                                hc_eps, norm_weight, final_norm_eps, out=out)


@_mhc_post_head_op.register_fake
def _(f, residual, post, comb, hc_fn, hc_scale, hc_base, norm_weight, norm_eps, hc_eps,
      final_norm_eps):
    T, _, H = residual.shape
    return torch.empty_like(residual), residual.new_empty((T, H))


def mhc_post_head(
    f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
    hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, *, norm_eps: float,
    hc_eps: float, norm_weight: torch.Tensor | None = None, final_norm_eps: float | None = None,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model tail: :func:`~dsv4spec.ops.mhc_post` of the last layer, then
    :func:`~dsv4spec.ops.hc_head` of the new streams, then (with ``norm_weight``) the final
    RMSNorm, as one op.

    The fused path is 2 launches: the first forms each slice of the new streams (rounded to
    ``residual.dtype``, stored) and accumulates hc_head's 4 dot products and the streams' Gram
    sums from those rounded values; the second writes the hidden state. Above
    ``TAIL_FUSED_MAX_TOKENS`` (192) tokens, where the two epsilons of the norms agree, it runs
    ``mhc_post`` then hc_head's own launches instead, which measured faster there. The final
    RMSNorm takes ``sum(y^2)`` as ``w^T G w`` of the fp32 ``y`` (as
    :func:`~dsv4spec.ops.mhc_pre` does for the sublayer norm), not of ``y`` rounded; the
    difference is below the output's rounding.

    Parameters
    ----------
    f, residual, post, comb
        As in :func:`~dsv4spec.ops.mhc_post` (the last layer's sublayer output, streams and
        weights).
    hc_fn : Tensor ``[hc_mult, hc_mult * H]`` float32
    hc_scale : Tensor ``[1]`` float32
    hc_base : Tensor ``[hc_mult]`` float32
    norm_eps, hc_eps : float
        hc_head's, as in :func:`~dsv4spec.ops.hc_head`.
    norm_weight : Tensor ``[H]``, optional
        float32 or ``residual.dtype``: the final RMSNorm's weight (needs ``final_norm_eps``).
    impl : {"auto", "reference", "triton"}
        As in :func:`~dsv4spec.ops.mhc_pre`.

    Returns
    -------
    (residual' ``[T, hc, H]``, hidden ``[T, H]``), both in ``residual.dtype``.

    Raises
    ------
    ValueError, TypeError
        On a wrong shape, dtype, device, layout or value, naming the argument, before any launch.
    """
    _post_inputs_ok(f, residual, post, comb)
    _check_head(residual, hc_fn, hc_scale, hc_base, norm_eps, hc_eps, norm_weight,
                final_norm_eps, impl)
    neps, heps = float(norm_eps), float(hc_eps)
    if not _use_triton(impl, residual):
        return mhc_post_head_reference(f, residual, post, comb, hc_fn, hc_scale, hc_base,
                                       norm_eps=neps, hc_eps=heps, norm_weight=norm_weight,
                                       final_norm_eps=final_norm_eps)
    feps = 0.0 if final_norm_eps is None else float(final_norm_eps)
    if _direct_call_ok(f, residual, post, comb, hc_fn, norm_weight):
        return mhc_post_head_triton(f, residual, post, comb, hc_fn, hc_scale, hc_base, neps,
                                    heps, norm_weight, feps)
    return _mhc_post_head_op(f, residual, post, comb, hc_fn, hc_scale, hc_base, norm_weight,
                             neps, heps, feps)

