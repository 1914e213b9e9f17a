"""dsv4spec's float64 references in the engines' output shapes, and the epsilons the engines'
hook tests call with: large and distinct, so that a swapped or dropped one fails the comparisons.

SGLang's and vLLM's ``mhc_pre``, ``mhc_post`` and ``mhc_fused_post_pre`` return the same shapes
(``post_mix [T, 4, 1]``, ``comb_mix [T, 4, 4]``); vLLM's ``hc_head`` returns ``[T, H]`` with no
RMSNorm after it.
"""

from dsv4spec.ops import (
    hc_head_reference,
    mhc_post_pre_reference,
    mhc_post_reference,
    mhc_pre_reference,
)

RMS_EPS, HC_EPS, NORM_EPS, ITERS = 0.25, 1.0, 0.5, 20
HEAD_RMS_EPS, HEAD_HC_EPS = 0.125, 0.75


def reference(op, t, norm=True):
    """dsv4spec's float64 reference for ``op`` on the inputs ``t``, in the engines' output
    shapes."""
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
    new, post, comb, y = mhc_post_pre_reference(t["x"], t["residual"], post2, t["comb"],
                                                *weights, **kw)
    return new, post.unsqueeze(-1), comb, y
