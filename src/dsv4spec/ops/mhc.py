"""mHC boundary ops: ``mhc_pre`` (hc_pre, optionally with the sublayer RMSNorm), ``mhc_post``
(hc_post) and ``mhc_post_pre`` (one layer boundary: hc_post of layer i, then hc_pre of i + 1)."""

from __future__ import annotations

import functools

import torch

from dsv4spec.kernels import interpreter_enabled, triton_runs_on
from dsv4spec.kernels.mhc import (
    HC,
    POST_PDL,
    mhc_post_pre_triton,
    mhc_post_triton,
    mhc_pre_triton,
    post_tiling,
    tiling,
    triton_release,
)
from dsv4spec.ops import plan_scan
from dsv4spec.ops.checked_params import CheckedParams, remembered

IMPLS = ("auto", "reference", "triton")
PLANNED_OPS = ("mhc_pre", "mhc_post", "mhc_post_pre")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _sinkhorn(comb: torch.Tensor, hc_eps: float, iters: int) -> torch.Tensor:
    comb = torch.softmax(comb, -1) + hc_eps
    comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)
    return comb


def mhc_pre_reference(
    residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, *,
    rms_eps: float, hc_eps: float, sinkhorn_iters: int, post_mult: float = 2.0,
    norm_weight: torch.Tensor | None = None, norm_eps: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hc_pre in float64, literally: ``(post [T, hc], comb [T, hc, hc])`` in ``fn.dtype`` and
    ``layer_input [T, H]`` in ``residual.dtype`` (``sum_i pre_i x_i`` rounded, then, with
    ``norm_weight``, RMSNorm of that rounded value rounded again)."""
    T, hc, H = residual.shape
    xd = residual.reshape(T, hc * H).double()
    scale, base = hc_scale.double(), hc_base.double()
    r = torch.rsqrt(xd.square().mean(-1, keepdim=True) + rms_eps)
    m = (xd @ fn.double().T) * r
    pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = post_mult * torch.sigmoid(m[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = (m[:, 2 * hc:] * scale[2] + base[2 * hc:]).view(T, hc, hc)
    comb = _sinkhorn(comb, hc_eps, sinkhorn_iters)
    y = (pre.unsqueeze(-1) * xd.view(T, hc, H)).sum(1).to(residual.dtype)
    if norm_weight is not None:
        yd = y.double()
        yd = yd * torch.rsqrt(yd.square().mean(-1, keepdim=True) + norm_eps) * norm_weight.double()
        y = yd.to(residual.dtype)
    return post.to(fn.dtype), comb.to(fn.dtype), y


def mhc_post_reference(
    f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
) -> torch.Tensor:
    """hc_post in float64: ``x'_j = post_j f + sum_i comb[i, j] x_i`` (``comb`` applied
    transposed), rounded to ``residual.dtype``."""
    mixed = torch.einsum("tij,tih->tjh", comb.double(), residual.double())
    return (post.double().unsqueeze(-1) * f.double().unsqueeze(1) + mixed).to(residual.dtype)


def mhc_post_pre_reference(
    f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
    fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, **kw,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`mhc_post_reference` then :func:`mhc_pre_reference` on the rounded new residual:
    ``(residual', post', comb', layer_input)``."""
    new = mhc_post_reference(f, residual, post, comb)
    return (new, *mhc_pre_reference(new, fn, hc_scale, hc_base, **kw))


# ---------------------------------------------------------------------------------------------
# Checks


def _check_tensor(name, t, shape, dtypes, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if t.dtype not in dtypes:
        names = " or ".join(str(d) for d in dtypes)
        raise ValueError(f"{name} must be {names}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} like residual, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def _param_ok(t, shape, dtypes, device) -> bool:
    """:func:`_check_tensor`'s verdict in one pass, without naming anything."""
    return (isinstance(t, torch.Tensor) and t.shape == shape and t.dtype in dtypes
            and t.device == device and t.is_contiguous())


# Whether residual_out=residual (in place) is accepted for CUDA tensors. Launch 1 loads each
# token's four streams as a tile broadcast over fn's rows and stores the new streams at the same
# addresses with no barrier between, so a warp holding a replica could read a value another warp
# has already stored over; the interpreter (one program at a time) cannot show that. Refused on
# CUDA until tests/ops/test_mhc_residual_out.py's GPU test (which switches it on) has passed.
IN_PLACE_ON_CUDA = False


def _check_residual_out(residual_out, residual):
    _check_tensor("residual_out", residual_out, residual.shape, (residual.dtype,),
                  residual.device)
    if residual_out.data_ptr() == residual.data_ptr():
        if residual.is_cuda and not IN_PLACE_ON_CUDA:
            raise ValueError("residual_out: residual itself (in place) is not yet proven on "
                             "CUDA (a race between warps of the boundary's first launch is not "
                             "excluded); pass a separate tensor")
        return
    nbytes = residual.numel() * residual.element_size()
    if (residual_out.data_ptr() < residual.data_ptr() + nbytes
            and residual.data_ptr() < residual_out.data_ptr() + nbytes):
        raise ValueError("residual_out must be residual itself or share none of its memory")


def _check_residual(residual):
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual must be a torch.Tensor, got {type(residual).__name__}")
    if residual.dim() != 3:
        raise ValueError(f"residual must be [T, hc_mult, H], got shape {list(residual.shape)}")
    if residual.dtype not in _DTYPES:
        raise ValueError(f"residual must be bfloat16, float16 or float32, got {residual.dtype}")
    if not residual.is_contiguous():
        raise ValueError(f"residual must be contiguous, got strides {residual.stride()}")
    _, hc, H = residual.shape
    if hc == 0 or H == 0:
        raise ValueError(f"residual must have hc_mult > 0 and H > 0, got {list(residual.shape)}")


def _check_float(name, v, allow_zero=True):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
            v >= 0 if allow_zero else v > 0):
        raise ValueError(f"{name} must be a float {'>=' if allow_zero else '>'} 0, got {v!r}")


def _check_impl(impl, residual):
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "triton":
        hc = residual.shape[1]
        if hc != HC:
            raise ValueError(f"impl='triton' needs hc_mult == {HC}, got residual.shape[1] = {hc}")
        if not triton_runs_on(residual.device):
            raise ValueError(
                f"impl='triton' needs a CUDA tensor (or TRITON_INTERPRET=1 on CPU), residual is "
                f"on {residual.device} and TRITON_INTERPRET is "
                f"{'on' if interpreter_enabled() else 'off'}")


def _check_pre(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters, post_mult,
               norm_weight, norm_eps, impl):
    _check_residual(residual)
    _, hc, H = residual.shape
    dev, f32 = residual.device, (torch.float32,)
    _check_tensor("fn", fn, ((2 + hc) * hc, hc * H), f32, dev)
    _check_tensor("hc_scale", hc_scale, (3,), f32, dev)
    _check_tensor("hc_base", hc_base, ((2 + hc) * hc,), f32, dev)
    _check_float("rms_eps", rms_eps)
    _check_float("hc_eps", hc_eps)
    if (isinstance(sinkhorn_iters, bool) or not isinstance(sinkhorn_iters, int)
            or sinkhorn_iters < 1):
        raise ValueError(f"sinkhorn_iters must be an int >= 1, got {sinkhorn_iters!r}")
    if isinstance(post_mult, bool) or not isinstance(post_mult, (int, float)):
        raise ValueError(f"post_mult must be a float, got {post_mult!r}")
    if norm_weight is not None:
        _check_tensor("norm_weight", norm_weight, (H,), (torch.float32, residual.dtype), dev)
        _check_float("norm_eps", norm_eps)
    elif norm_eps is not None:
        _check_float("norm_eps", norm_eps)
    _check_impl(impl, residual)


def _check_post(f, residual, post, comb):
    _check_residual(residual)
    T, hc, H = residual.shape
    dev = residual.device
    _check_tensor("f", f, (T, H), (residual.dtype,), dev)
    _check_tensor("post", post, (T, hc), (torch.float32,), dev)
    _check_tensor("comb", comb, (T, hc, hc), (torch.float32,), dev)


# (ids of fn, hc_scale, hc_base; whether norm_weight is None; hc, H, device, dtype) -> (weak
# references to those tensors and to norm_weight where it is remembered with them, their
# addresses). A model's weights are the same tensors call after call: once they pass, a call with
# the same tensors at the same addresses skips their checks (an eager call is launch-bound). An
# entry goes when one of its tensors dies, so its ids cannot be another tensor's; new storage
# changes the address (:class:`~dsv4spec.ops.checked_params.CheckedParams`). The engines pass
# ``norm.weight.data``, a new tensor object on every call, beside the other weights' Parameters:
# it is not remembered (it dies after the call), so it is not in the key and is checked alone,
# in one pass, on each call.
CHECKED_PARAMS_LIMIT = 256
_CHECKED_PARAMS = CheckedParams(CHECKED_PARAMS_LIMIT)


def _params_key(residual, fn, hc_scale, hc_base, norm_weight) -> tuple:
    _, hc, H = residual.shape
    return (id(fn), id(hc_scale), id(hc_base), norm_weight is None, hc, H, residual.device,
            residual.dtype)


def _params_checked(residual, fn, hc_scale, hc_base, norm_weight) -> bool:
    _, hc, H = residual.shape
    # _params_key, inlined: an eager call is launch-bound
    key = (id(fn), id(hc_scale), id(hc_base), norm_weight is None, hc, H, residual.device,
           residual.dtype)
    entry = _CHECKED_PARAMS.get(key)
    if entry is None:
        return False
    refs, a = entry
    if fn.data_ptr() == a[0] and hc_scale.data_ptr() == a[1] and hc_base.data_ptr() == a[2]:
        if norm_weight is None:
            return True
        if len(a) < 4 or refs[3]() is not norm_weight:
            # not the norm weight remembered with them (``norm.weight.data``): checked alone
            return _param_ok(norm_weight, (H,), (torch.float32, residual.dtype),
                             residual.device)
        if norm_weight.data_ptr() == a[3]:
            return True
    # moved: checked in full, and the old address must not pass should new storage land there
    _CHECKED_PARAMS.forget(key)
    return False


def _params_ok(residual, fn, hc_scale, hc_base, norm_weight) -> bool:
    """:func:`_check_pre`'s verdict on the parameters, in one pass."""
    _, hc, H = residual.shape
    dev, f32, n = residual.device, (torch.float32,), (2 + hc) * hc
    return (_param_ok(fn, (n, hc * H), f32, dev) and _param_ok(hc_scale, (3,), f32, dev)
            and _param_ok(hc_base, (n,), f32, dev)
            and (norm_weight is None
                 or _param_ok(norm_weight, (H,), (torch.float32, residual.dtype), dev)))


def _remember_params(residual, fn, hc_scale, hc_base, norm_weight) -> None:
    _CHECKED_PARAMS.remember(_params_key(residual, fn, hc_scale, hc_base, norm_weight),
                             remembered(fn, hc_scale, hc_base, norm_weight))


def _pre_inputs_ok(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters, post_mult,
                   norm_weight, norm_eps, impl) -> None:
    """Raise naming the argument on a bad input; the parameters' checks are remembered."""
    if (type(residual) is torch.Tensor and residual.dim() == 3 and residual.dtype in _DTYPES
            and residual.is_contiguous() and residual.shape[1] > 0 and residual.shape[2] > 0
            and type(rms_eps) is float and rms_eps >= 0 and type(hc_eps) is float
            and hc_eps >= 0 and type(sinkhorn_iters) is int and sinkhorn_iters >= 1
            and type(post_mult) is float
            and (norm_eps is None or (type(norm_eps) is float and norm_eps >= 0))
            and (norm_weight is None or norm_eps is not None)
            and (impl == "auto" or impl == "reference"
                 or (impl == "triton" and residual.shape[1] == HC
                     and (residual.is_cuda or interpreter_enabled())))):
        if _params_checked(residual, fn, hc_scale, hc_base, norm_weight):
            return
        if _params_ok(residual, fn, hc_scale, hc_base, norm_weight):
            _remember_params(residual, fn, hc_scale, hc_base, norm_weight)
            return
    _check_pre(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters, post_mult,
               norm_weight, norm_eps, impl)
    if norm_weight is not None and norm_eps is None:
        raise ValueError("norm_eps must be given with norm_weight")
    _remember_params(residual, fn, hc_scale, hc_base, norm_weight)


def _post_inputs_ok(f, residual, post, comb) -> None:
    if (type(residual) is torch.Tensor and residual.dim() == 3 and residual.dtype in _DTYPES
            and residual.is_contiguous() and type(f) is torch.Tensor and type(post) is torch.Tensor
            and type(comb) is torch.Tensor and f.dtype == residual.dtype
            and post.dtype == torch.float32 and comb.dtype == torch.float32
            and f.device == residual.device == post.device == comb.device
            and f.is_contiguous() and post.is_contiguous() and comb.is_contiguous()):
        T, hc, H = residual.shape
        if (hc > 0 and H > 0 and f.shape == (T, H) and post.shape == (T, hc)
                and comb.shape == (T, hc, hc)):
            return
    _check_post(f, residual, post, comb)


def _use_triton(impl, residual) -> bool:
    if residual.shape[0] == 0 or impl == "reference":
        return False
    if impl == "triton":
        return True
    return residual.shape[1] == HC and (residual.is_cuda or triton_runs_on(residual.device))


def _direct_call_ok(*tensors) -> bool:
    """Whether an eager call may skip the ``torch.library`` op and launch the kernels itself: the
    op exists for tracing (``torch.compile``, fake tensors, dispatch modes, functorch)."""
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() != 0
            or torch._C._is_torch_function_mode_enabled()):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        # a model's weights are nn.Parameter: plain tensors for the kernels
        if ((type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter)
                or torch._C._functorch.is_functorch_wrapped_tensor(t)
                or (grad and t.requires_grad)):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# torch.library ops (tracing); eager calls launch directly


@torch.library.custom_op("dsv4spec::mhc_pre", mutates_args=())
def _mhc_pre_op(
    residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    norm_weight: torch.Tensor | None, rms_eps: float, hc_eps: float, sinkhorn_iters: int,
    post_mult: float, norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    T, hc, H = residual.shape
    f32 = torch.float32  # outputs of an op may not share storage: three allocations here
    out = (residual.new_empty((T, hc), dtype=f32), residual.new_empty((T, hc, hc), dtype=f32),
           residual.new_empty((T, H)))
    return mhc_pre_triton(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters,
                          post_mult, norm_weight, norm_eps, out=out)


@_mhc_pre_op.register_fake
def _(residual, fn, hc_scale, hc_base, norm_weight, rms_eps, hc_eps, sinkhorn_iters, post_mult,
      norm_eps):
    T, hc, H = residual.shape
    f32 = torch.float32
    return (residual.new_empty((T, hc), dtype=f32), residual.new_empty((T, hc, hc), dtype=f32),
            residual.new_empty((T, H)))


@torch.library.custom_op("dsv4spec::mhc_post", mutates_args=())
def _mhc_post_op(f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
                 comb: torch.Tensor) -> torch.Tensor:
    return mhc_post_triton(f, residual, post, comb)


@_mhc_post_op.register_fake
def _(f, residual, post, comb):
    return torch.empty_like(residual)


@torch.library.custom_op("dsv4spec::mhc_post_pre", mutates_args=())
def _mhc_post_pre_op(
    f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
    fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    norm_weight: torch.Tensor | None, rms_eps: float, hc_eps: float, sinkhorn_iters: int,
    post_mult: float, norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    T, hc, H = residual.shape
    f32 = torch.float32
    out = (torch.empty_like(residual), residual.new_empty((T, hc), dtype=f32),
           residual.new_empty((T, hc, hc), dtype=f32), residual.new_empty((T, H)))
    return mhc_post_pre_triton(f, residual, post, comb, fn, hc_scale, hc_base, rms_eps, hc_eps,
                               sinkhorn_iters, post_mult, norm_weight, norm_eps, out=out)


@_mhc_post_pre_op.register_fake
def _(f, residual, post, comb, fn, hc_scale, hc_base, norm_weight, rms_eps, hc_eps,
      sinkhorn_iters, post_mult, norm_eps):
    T, hc, H = residual.shape
    f32 = torch.float32
    return (torch.empty_like(residual), residual.new_empty((T, hc), dtype=f32),
            residual.new_empty((T, hc, hc), dtype=f32), residual.new_empty((T, H)))


# ---------------------------------------------------------------------------------------------
# Public ops


def mhc_pre(
    residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, *,
    rms_eps: float, hc_eps: float, sinkhorn_iters: int, post_mult: float = 2.0,
    norm_weight: torch.Tensor | None = None, norm_eps: float | None = None, impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mix the ``hc_mult`` residual streams into one sublayer input (DSV4 ``hc_pre``).

    With ``xf = residual.reshape(T, hc*H).float()`` and ``m = (xf @ fn.T) * r``,
    ``r = rsqrt(mean(xf^2) + rms_eps)``, the 24 logits split as ``[pre | post | comb]``::

        pre  = sigmoid(m_pre * hc_scale[0] + hc_base_pre) + hc_eps
        post = post_mult * sigmoid(m_post * hc_scale[1] + hc_base_post)
        comb = softmax(m_comb * hc_scale[2] + hc_base_comb, -1) + hc_eps      # [hc, hc]
        comb = comb / (comb.sum(-2) + hc_eps)                                 # columns
        repeat sinkhorn_iters - 1 times: rows, then columns, each ``/ (sum + hc_eps)``
        layer_input = sum_i pre_i * xf[:, i, :]        # fp32, rounded to residual.dtype

    With ``norm_weight``, ``layer_input`` is then the sublayer RMSNorm of that rounded value,
    ``y * rsqrt(mean(y^2) + norm_eps) * norm_weight`` in fp32, rounded again. The fused kernel
    takes ``sum(y^2)`` as ``w^T G w`` from the streams' Gram matrix in fp32 (not from the rounded
    ``y``), as SGLang's fused kernel also does.

    Matches SGLang 0.5.23's ``mhc_pre`` with ``hc_pre_eps = hc_sinkhorn_eps = hc_eps`` and
    ``hc_post_mult_value = post_mult``. SGLang's kernels differ from its torch path in that
    ``mhc_pre_big_fuse_with_norm`` rounds ``norm_weight`` to bf16, and DeepGEMM's prenorm GEMM
    (used where installed) multiplies ``fn`` as tf32; this op keeps ``fn`` and the norm weight
    in fp32.

    Parameters
    ----------
    residual : Tensor ``[T, hc_mult, H]``
        bfloat16, float16 or float32, contiguous.
    fn : Tensor ``[(2 + hc_mult) * hc_mult, hc_mult * H]`` float32
    hc_scale : Tensor ``[3]`` float32
    hc_base : Tensor ``[(2 + hc_mult) * hc_mult]`` float32
    rms_eps, hc_eps : float
        DSV4's ``rms_norm_eps`` (the factor r) and ``hc_eps`` (pre weights and the Sinkhorn).
    sinkhorn_iters : int
        ``hc_sinkhorn_iters`` (20 in DSV4), >= 1.
    post_mult : float
        2 in DSV4.
    norm_weight : Tensor ``[H]``, optional
        float32 or ``residual.dtype``: fuse the sublayer RMSNorm (needs ``norm_eps``).
    impl : {"auto", "reference", "triton"}
        ``"auto"``: the fused Triton kernels (2 launches; 3 from 128 bf16 tokens, where ``fn`` is
        split for the tensor cores first) on CUDA, and on CPU under
        ``TRITON_INTERPRET=1``, for hc_mult = 4; the float64 reference elsewhere and for empty
        input. ``"triton"`` refuses other hc_mult with a ValueError.

    Returns
    -------
    post : Tensor ``[T, hc_mult]`` float32
    comb : Tensor ``[T, hc_mult, hc_mult]`` float32, rows and columns summing to ~1
    layer_input : Tensor ``[T, H]`` in ``residual.dtype``

    Raises
    ------
    ValueError, TypeError
        On a wrong shape, dtype, device, layout or value, naming the argument, before any launch.
    """
    _pre_inputs_ok(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters, post_mult,
                   norm_weight, norm_eps, impl)
    kw = {"rms_eps": float(rms_eps), "hc_eps": float(hc_eps), "sinkhorn_iters": sinkhorn_iters,
          "post_mult": float(post_mult)}
    if not _use_triton(impl, residual):
        return mhc_pre_reference(residual, fn, hc_scale, hc_base, norm_weight=norm_weight,
                                 norm_eps=norm_eps, **kw)
    neps = 0.0 if norm_eps is None else float(norm_eps)
    if _direct_call_ok(residual, fn, norm_weight):
        return mhc_pre_triton(residual, fn, hc_scale, hc_base, kw["rms_eps"], kw["hc_eps"],
                              sinkhorn_iters, kw["post_mult"], norm_weight, neps)
    return _mhc_pre_op(residual, fn, hc_scale, hc_base, norm_weight, kw["rms_eps"], kw["hc_eps"],
                       sinkhorn_iters, kw["post_mult"], neps)


def mhc_post(
    f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, *,
    impl: str = "auto",
) -> torch.Tensor:
    """Write a sublayer's output back into the streams (DSV4 ``hc_post``).

    ``residual'[:, j] = post[:, j] * f + sum_i comb[:, i, j] * residual[:, i]`` in fp32, rounded
    to ``residual.dtype``: ``comb`` is applied transposed (its row i says where stream i goes).

    Parameters
    ----------
    f : Tensor ``[T, H]``, ``residual.dtype``
    residual : Tensor ``[T, hc_mult, H]`` bfloat16, float16 or float32
    post : Tensor ``[T, hc_mult]`` float32
    comb : Tensor ``[T, hc_mult, hc_mult]`` float32
    impl : {"auto", "reference", "triton"}
        As in :func:`mhc_pre` (one launch).

    Returns
    -------
    Tensor ``[T, hc_mult, H]`` in ``residual.dtype``.
    """
    _post_inputs_ok(f, residual, post, comb)
    if impl != "auto":
        _check_impl(impl, residual)
    if not _use_triton(impl, residual):
        return mhc_post_reference(f, residual, post, comb)
    if _direct_call_ok(f, residual, post, comb):
        return mhc_post_triton(f, residual, post, comb)
    return _mhc_post_op(f, residual, post, comb)


def mhc_post_pre(
    f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
    fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, *,
    rms_eps: float, hc_eps: float, sinkhorn_iters: int, post_mult: float = 2.0,
    norm_weight: torch.Tensor | None = None, norm_eps: float | None = None, impl: str = "auto",
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer boundary: :func:`mhc_post` of layer i, then :func:`mhc_pre` of layer i + 1.

    The fused path is 2 launches: the first forms each slice of the new residual, rounds it to
    ``residual.dtype``, stores it and accumulates the next ``hc_pre``'s partial sums from those
    rounded values (what the unfused sequence sees; SGLang's ``mhc_fused_post_pre`` rounds the
    same way); the second is ``mhc_pre``'s finalize.

    Parameters
    ----------
    f, residual, post, comb
        As in :func:`mhc_post` (the finishing layer's sublayer output, streams and weights).
    fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters, post_mult, norm_weight, norm_eps, impl
        As in :func:`mhc_pre` (the next layer's).
    residual_out : Tensor ``[T, hc, H]``, optional
        Where residual' is written and returned: a contiguous tensor like ``residual`` that
        shares none of its memory, or, on the CPU only, ``residual`` itself (in place; refused
        on CUDA until proven there: :data:`IN_PLACE_ON_CUDA`).

    Returns
    -------
    (residual' ``[T, hc, H]``, post' ``[T, hc]``, comb' ``[T, hc, hc]``, layer_input ``[T, H]``)
    """
    _post_inputs_ok(f, residual, post, comb)
    _pre_inputs_ok(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters, post_mult,
                   norm_weight, norm_eps, impl)
    if residual_out is not None:
        _check_residual_out(residual_out, residual)
    kw = {"rms_eps": float(rms_eps), "hc_eps": float(hc_eps), "sinkhorn_iters": sinkhorn_iters,
          "post_mult": float(post_mult)}
    if not _use_triton(impl, residual):
        out = mhc_post_pre_reference(f, residual, post, comb, fn, hc_scale, hc_base,
                                     norm_weight=norm_weight, norm_eps=norm_eps, **kw)
    else:
        neps = 0.0 if norm_eps is None else float(norm_eps)
        if _direct_call_ok(f, residual, post, comb, fn, norm_weight, residual_out):
            T, hc, H = residual.shape
            given = None if residual_out is None else (
                residual_out, residual.new_empty((T, hc), dtype=torch.float32),
                residual.new_empty((T, hc, hc), dtype=torch.float32), residual.new_empty((T, H)))
            return mhc_post_pre_triton(f, residual, post, comb, fn, hc_scale, hc_base,
                                       kw["rms_eps"], kw["hc_eps"], sinkhorn_iters,
                                       kw["post_mult"], norm_weight, neps, out=given)
        out = _mhc_post_pre_op(f, residual, post, comb, fn, hc_scale, hc_base, norm_weight,
                               kw["rms_eps"], kw["hc_eps"], sinkhorn_iters, kw["post_mult"],
                               neps)
    if residual_out is None:
        return out
    return residual_out.copy_(out[0]), *out[1:]


# ---------------------------------------------------------------------------------------------
# Launch plans, queried without a device (the measured-faster tables: dsv4spec.integrations.plans)


def launch_plan(op: str, num_tokens: int, hidden_size: int, num_sms: int, *,
                dtype: torch.dtype = torch.bfloat16,
                triton_version: str | None = None) -> tuple[tuple, tuple]:
    """``(tiling, grid)`` of ``op``'s default launches (``"mhc_pre"``, ``"mhc_post"``,
    ``"mhc_post_pre"``) at ``num_tokens`` tokens of width ``hidden_size`` on an sm_90+ GPU of
    ``num_sms`` SMs, under ``triton_version`` (default the imported Triton): the tiling is the
    kernels, blocks, warps and launch flags, the grid the split count (``plan_scan``)."""
    plan_scan.check_count("num_tokens", num_tokens)
    return _planner(op, hidden_size, num_sms, dtype, triton_version)(num_tokens)


def _planner(op, hidden_size, num_sms, dtype, triton_version) -> plan_scan.Plan:
    """``launch_plan`` of one op, width, GPU and Triton as a function of T, arguments checked."""
    if op not in PLANNED_OPS:
        raise ValueError(f"op must be one of {PLANNED_OPS}, got {op!r}")
    plan_scan.check_count("hidden_size", hidden_size)
    plan_scan.check_count("num_sms", num_sms)
    if op == "mhc_post":  # one launch over (tokens, H-blocks): no split
        return lambda T: ((*post_tiling(T), POST_PDL), ())
    release = None if triton_version is None else triton_release(triton_version)
    boundary = op == "mhc_post_pre"

    def plan(T):
        cfg = tiling(T, hidden_size, num_sms, dtype=dtype, boundary=boundary, on_gpu=True,
                     release=release)
        return plan_scan.tiling_and_grid(cfg)

    return plan


@functools.lru_cache(maxsize=64)
def tiling_switches(op: str, hidden_size: int, max_tokens: int, num_sms: int, *,
                    dtype: torch.dtype = torch.bfloat16,
                    triton_version: str | None = None) -> tuple[int, ...]:
    """The token counts T, ``2 <= T <= max_tokens``, at which ``op``'s tiling at width
    ``hidden_size`` differs from T - 1's (:func:`launch_plan`, run at every count)."""
    return plan_scan.tiling_switches(
        _planner(op, hidden_size, num_sms, dtype, triton_version), max_tokens)


@functools.lru_cache(maxsize=64)
def first_plan_difference(op: str, hidden_size: int, max_tokens: int, num_sms: int,
                          other_num_sms: int, *, dtype: torch.dtype = torch.bfloat16,
                          triton_version: str | None = None) -> int | None:
    """The smallest token count up to ``max_tokens`` at which ``op`` launches another plan
    (tiling or split count) on a GPU of ``other_num_sms`` SMs than on one of ``num_sms``; None
    where there is none."""
    return plan_scan.first_difference(
        _planner(op, hidden_size, num_sms, dtype, triton_version),
        _planner(op, hidden_size, other_num_sms, dtype, triton_version), max_tokens)
