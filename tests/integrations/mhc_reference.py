"""dsv4spec's float64 references in the engines' output shapes, and the epsilons the engines'
hook tests call with: large and distinct, so that a swapped or dropped one fails the comparisons.

SGLang's and vLLM's ``mhc_pre``, ``mhc_post`` and ``mhc_fused_post_pre`` return the same shapes
(``post_mix [T, 4, 1]``, ``comb_mix [T, 4, 4]``); vLLM's ``hc_head`` returns ``[T, H]`` with no
RMSNorm after it.
"""

import torch

from dsv4spec.ops import (
    hc_head_reference,
    mhc_post_pre_reference,
    mhc_post_reference,
    mhc_pre_reference,
)

RMS_EPS, HC_EPS, NORM_EPS, ITERS = 0.25, 1.0, 0.5, 20
HEAD_RMS_EPS, HEAD_HC_EPS = 0.125, 0.75


def reference(op, t, norm=True, own_residual=None):
    """dsv4spec's float64 reference for ``op`` on the inputs ``t``, in the engines' output
    shapes. With ``own_residual`` (the fused boundary's own new residual) the boundary's pre is
    the float64 pre of that residual: where the fp32 mix lands within rounding of a bf16 tie the
    residual takes the other neighbour (1 ulp), and the layer input sees that step, so a pre of
    the reference's own residual would charge the pre with the post's rounding."""
    if op == "hc_head":
        return hc_head_reference(t["residual"].double(), t["head_fn"].double(),
                                 t["head_scale"].double(), t["head_base"].double(),
                                 norm_eps=HEAD_RMS_EPS, hc_eps=HEAD_HC_EPS)
    kw = {"rms_eps": RMS_EPS, "hc_eps": HC_EPS, "sinkhorn_iters": ITERS, "post_mult": 2.0}
    if norm:
        kw.update(norm_weight=t["norm_weight"], norm_eps=NORM_EPS)
    weights = (t["fn"], t["hc_scale"], t["hc_base"])
    if op == "mhc_pre":
        post, comb, y = mhc_pre_reference(t["residual"], *weights, **kw)
        return post.unsqueeze(-1), comb, y
    post2 = t["post"].squeeze(-1)
    if op == "mhc_post":
        return mhc_post_reference(t["x"], t["residual"], post2, t["comb"])
    if own_residual is None:
        new, post, comb, y = mhc_post_pre_reference(t["x"], t["residual"], post2, t["comb"],
                                                    *weights, **kw)
    else:
        new = mhc_post_reference(t["x"], t["residual"], post2, t["comb"])
        post, comb, y = mhc_pre_reference(own_residual, *weights, **kw)
    return new, post.unsqueeze(-1), comb, y


def make_inputs(T, H, device, hc=4, seed=0, head=False):
    """Everything the engines' mHC functions take, as DSV4 passes it (post as [T, hc, 1], comb
    with rows summing to 1), and with ``head`` hc_head's parameters too, drawn after the rest."""
    g = torch.Generator().manual_seed(seed)
    n = (2 + hc) * hc
    t = {
        "residual": torch.randn(T, hc, H, generator=g).bfloat16(),
        "x": torch.randn(T, H, generator=g).bfloat16(),
        "post": torch.rand(T, hc, 1, generator=g) * 2,
        "comb": torch.rand(T, hc, hc, generator=g),
        "fn": torch.randn(n, hc * H, generator=g) * (hc * H) ** -0.5,
        "hc_scale": torch.rand(3, generator=g) + 0.5,
        "hc_base": torch.randn(n, generator=g) * 0.5,
        "norm_weight": (1 + 0.25 * torch.randn(H, generator=g)).bfloat16(),
    }
    if head:
        t["head_fn"] = torch.randn(hc, hc * H, generator=g) * (hc * H) ** -0.5
        t["head_scale"] = torch.rand(1, generator=g) + 0.5
        t["head_base"] = torch.randn(hc, generator=g) * 0.5
    t["comb"] = t["comb"] / t["comb"].sum(-1, keepdim=True)
    return {k: v.to(device) for k, v in t.items()}
