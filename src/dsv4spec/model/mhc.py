"""Manifold-constrained hyper-connections (mHC, docs/design.md): ``hc_pre`` and ``hc_post``.

The residual is ``X [T, hc, H]``. Before each sublayer ``hc_pre`` mixes the streams into the
sublayer's input and produces the ``post`` weights and the doubly stochastic ``comb`` matrix that
``hc_post`` uses to write the sublayer's output back into the streams. Both are pure functions of
their tensors (parameters passed in), so every layer shares one compiled graph per shape under
``compile_in_capture_mode`` instead of compiling per layer.
"""

from __future__ import annotations

import torch

from dsv4spec.capture import compile_in_capture_mode


def hc_pre(
    x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
    norm_eps: float, hc_eps: float, sinkhorn_iters: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mix the streams into one sublayer input.

    Parameters
    ----------
    x : Tensor ``[T, hc, H]``
        The residual streams.
    fn : Tensor ``[(2 + hc) * hc, hc * H]`` float32
        Rows ``[pre (hc) | post (hc) | comb (hc * hc)]``.
    scale : Tensor ``[3]`` float32
        Scales of the pre, post and comb logits.
    base : Tensor ``[(2 + hc) * hc]`` float32
    norm_eps, hc_eps : float
        ``rms_norm_eps`` (the RMS factor) and ``hc_eps`` (weights and Sinkhorn).
    sinkhorn_iters : int
        ``hc_sinkhorn_iters``: the softmax's column normalisation, then ``iters - 1`` row and
        column passes.

    Returns
    -------
    y : Tensor ``[T, H]`` in ``x.dtype``
        ``sum_i pre_i x_i`` (the layer's RMSNorm comes after).
    post : Tensor ``[T, hc]`` in ``fn.dtype``
        ``2 * sigmoid(...)``.
    comb : Tensor ``[T, hc, hc]`` in ``fn.dtype``
        Rows and columns summing to 1.
    """
    T, hc, H = x.shape
    # In the parameters' dtype: float32 as in DSV4 (bf16 streams upcast), float64 in exact tests.
    xf = x.reshape(T, hc * H).to(fn.dtype)
    r = torch.rsqrt(xf.square().mean(-1, keepdim=True) + norm_eps)
    m = (xf @ fn.T) * r
    pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * torch.sigmoid(m[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = (m[:, 2 * hc:] * scale[2] + base[2 * hc:]).view(T, hc, hc)
    comb = torch.softmax(comb, -1) + hc_eps
    comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)
    y = (pre.unsqueeze(-1) * xf.view(T, hc, H)).sum(1)
    return y.to(x.dtype), post, comb


def hc_post(
    f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
) -> torch.Tensor:
    """Write the sublayer output ``f [T, H]`` back: ``x'_j = post_j f + sum_i comb[i, j] x_i``.

    ``comb`` is applied transposed (its row ``i`` says where stream ``i`` goes). Returns
    ``[T, hc, H]`` in ``x.dtype``.
    """
    mixed = torch.einsum("tij,tih->tjh", comb, x.to(comb.dtype))
    return (post.unsqueeze(-1) * f.to(comb.dtype).unsqueeze(1) + mixed).to(x.dtype)


# Inductor under capture_mode() only (docs/design.md), one graph per shape shared by every layer.
hc_pre_captured = compile_in_capture_mode(hc_pre, dynamic=False)
hc_post_captured = compile_in_capture_mode(hc_post, dynamic=False)
