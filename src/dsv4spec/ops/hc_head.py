"""hc_head: collapse the hc_mult residual streams before the final norm (docs/design.md)."""

from __future__ import annotations

import functools

import torch

from dsv4spec.capture import compile_in_capture_mode
from dsv4spec.kernels import interpreter_enabled, triton_runs_on
from dsv4spec.kernels.hc_head import HC, hc_head_triton
from dsv4spec.kernels.hc_head_plan import plan_on
from dsv4spec.ops import plan_scan
from dsv4spec.ops.checked_params import CheckedParams, remembered

IMPLS = ("auto", "eager", "compiled", "triton")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def hc_head_reference(x, hc_fn, hc_scale, hc_base, *, norm_eps, hc_eps):
    """DSV4's hc_head, literally: ``x [..., hc_mult, H]`` -> ``[..., H]`` in ``x.dtype``."""
    hc, H = x.shape[-2:]
    # fp32 for bf16/fp16/fp32 (DSV4); fp64 input stays fp64 (exact reference-model runs)
    xf = x.reshape(*x.shape[:-2], hc * H).to(torch.promote_types(x.dtype, torch.float32))
    r = torch.rsqrt(xf.square().mean(-1, keepdim=True) + norm_eps)
    m = (xf @ hc_fn.T) * r
    w = torch.sigmoid(m * hc_scale + hc_base) + hc_eps
    y = (w.unsqueeze(-1) * xf.view(*x.shape[:-2], hc, H)).sum(-2)
    return y.to(x.dtype)


def hc_head_rmsnorm_reference(x, hc_fn, hc_scale, hc_base, norm_weight, *, norm_eps, hc_eps):
    """hc_head then the draft's shared-head RMSNorm, as the draft composes them.

    ``y = hc_head_reference(...)`` is rounded to ``x.dtype`` first; the RMSNorm runs in fp32 on
    that rounded ``y``: ``(y * rsqrt(mean(y^2) + norm_eps) * norm_weight).to(x.dtype)``.
    """
    y = hc_head_reference(x, hc_fn, hc_scale, hc_base, norm_eps=norm_eps, hc_eps=hc_eps)
    y = y.to(torch.promote_types(y.dtype, torch.float32))
    y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + norm_eps) * norm_weight
    return y.to(x.dtype)


_hc_head_compiled = compile_in_capture_mode(hc_head_reference, dynamic=False)
_hc_head_rmsnorm_compiled = compile_in_capture_mode(hc_head_rmsnorm_reference, dynamic=False)


def _check_param(name, t, shape, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if t.dtype != torch.float32:
        raise ValueError(f"{name} must be float32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} like x, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def check_hc_head_inputs(x, hc_fn, hc_scale, hc_base, norm_weight, norm_eps, hc_eps, impl):
    """The full check of a :func:`hc_head` (``norm_weight=None``) or :func:`hc_head_rmsnorm` call.

    Returns None on valid arguments; raises ``TypeError`` or ``ValueError`` naming the argument
    otherwise. The ops run it on every call that :func:`inputs_look_valid` does not accept.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"x must be [..., hc_mult, H] (2+ dims), got shape {list(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous, got strides {x.stride()}")
    hc, H = x.shape[-2:]
    if H == 0 or hc == 0:
        raise ValueError(f"x must have hc_mult > 0 and H > 0, got shape {list(x.shape)}")
    _check_param("hc_fn", hc_fn, (hc, hc * H), x.device)
    _check_param("hc_scale", hc_scale, (1,), x.device)
    _check_param("hc_base", hc_base, (hc,), x.device)
    if norm_weight is not None:
        _check_param("norm_weight", norm_weight, (H,), x.device)
    for name, eps in (("norm_eps", norm_eps), ("hc_eps", hc_eps)):
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
            raise ValueError(f"{name} must be a float >= 0, got {eps!r}")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "triton":
        if hc != HC:
            raise ValueError(f"impl='triton' needs hc_mult == {HC}, got x.shape[-2] = {hc}")
        if not triton_runs_on(x.device):
            raise ValueError(
                f"impl='triton' needs a CUDA tensor (or TRITON_INTERPRET=1 on CPU), x is on "
                f"{x.device} and TRITON_INTERPRET is {'on' if interpreter_enabled() else 'off'}"
            )


# The name the ops call, looked up at call time (tests count the full checks through it).
_check_hc_head_inputs = check_hc_head_inputs


@torch.library.custom_op("dsv4spec::hc_head", mutates_args=())
def _hc_head_op(
    x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    norm_eps: float, hc_eps: float,
) -> torch.Tensor:
    return hc_head_triton(x, hc_fn, hc_scale, hc_base, norm_eps, hc_eps)


@_hc_head_op.register_fake
def _(x, hc_fn, hc_scale, hc_base, norm_eps, hc_eps):
    return x.new_empty((x.shape[0], x.shape[2]))


@torch.library.custom_op("dsv4spec::hc_head_rmsnorm", mutates_args=())
def _hc_head_rmsnorm_op(
    x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    norm_weight: torch.Tensor, norm_eps: float, hc_eps: float,
) -> torch.Tensor:
    return hc_head_triton(x, hc_fn, hc_scale, hc_base, norm_eps, hc_eps, norm_weight=norm_weight)


@_hc_head_rmsnorm_op.register_fake
def _(x, hc_fn, hc_scale, hc_base, norm_weight, norm_eps, hc_eps):
    return x.new_empty((x.shape[0], x.shape[2]))


def _resolve(impl, x):
    if x.numel() == 0:
        return "eager"
    if impl == "auto":
        triton_ok = x.is_cuda or triton_runs_on(x.device)  # is_cuda first: the common case
        return "triton" if x.shape[-2] == HC and triton_ok else "eager"
    return impl


# Weights arrive as plain tensors or as a model's nn.Parameter (SGLang holds them so); either is
# a dense tensor the kernels read directly. Other subclasses take the full check and the op.
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _param_ok(t, shape, is_cuda, device_index) -> bool:
    return (type(t) in _PLAIN_TYPES and t.dtype is torch.float32 and t.shape == shape
            and ((t.is_cuda and t.get_device() == device_index) if is_cuda else t.is_cpu)
            and t.is_contiguous())


# (ids of hc_fn, hc_scale, hc_base; whether norm_weight is None; hc, H, device index) -> (weak
# references to those tensors and to norm_weight where it is remembered with them, their
# addresses). The parameters are a model's weights, the same tensors call after call: once they
# pass, a call with the same tensors at the same addresses skips their checks. An entry goes when
# one of its tensors dies, so its ids cannot be another tensor's; a weight given new storage
# (``param.data = ...``, ``set_``) changes its address and is checked again. (In-place metadata
# changes that keep the address, e.g. ``hc_fn.t_()``, are not detected.) A norm weight passed as
# ``param.data``, a new tensor every call, is not remembered and is checked alone
# (:func:`~dsv4spec.ops.checked_params.remembered`).
CHECKED_PARAMS_LIMIT = 64
_CHECKED_PARAMS = CheckedParams(CHECKED_PARAMS_LIMIT)


def _params_look_valid(hc_fn, hc_scale, hc_base, norm_weight, hc, H, is_cuda, index) -> bool:
    key = (id(hc_fn), id(hc_scale), id(hc_base), norm_weight is None, hc, H, index)
    entry = _CHECKED_PARAMS.get(key)
    if entry is not None:
        # the key's ids are these very tensors (the entry dies with them); unrolled, as a
        # generator over them costs more host time than the comparisons
        refs, addresses = entry
        if (hc_fn.data_ptr() == addresses[0] and hc_scale.data_ptr() == addresses[1]
                and hc_base.data_ptr() == addresses[2]):
            if norm_weight is None:
                return True
            if len(addresses) < 4 or refs[3]() is not norm_weight:
                # not the norm weight remembered with them (``norm.weight.data``): checked alone
                return _param_ok(norm_weight, (H,), is_cuda, index)
            if norm_weight.data_ptr() == addresses[3]:
                return True
        # moved: checked again below, and the old address must not pass should new storage land
        # there
        _CHECKED_PARAMS.forget(key)
    ok = (_param_ok(hc_fn, (hc, hc * H), is_cuda, index)
          and _param_ok(hc_scale, (1,), is_cuda, index)
          and _param_ok(hc_base, (hc,), is_cuda, index)
          and (norm_weight is None or _param_ok(norm_weight, (H,), is_cuda, index)))
    if ok:
        _CHECKED_PARAMS.remember(key, remembered(hc_fn, hc_scale, hc_base, norm_weight))
    return ok


def inputs_look_valid(x, hc_fn, hc_scale, hc_base, norm_weight, norm_eps, hc_eps, impl) -> bool:
    """The common valid call (CUDA or CPU tensors), checked in one pass; False sends it to the
    full check, :func:`check_hc_head_inputs`, which raises naming the argument (or accepts what
    this path does not cover, e.g. tensor subclasses).

    An eager call is launch-bound, so the checks' host time counts: device equality is read
    from ``is_cuda``/``get_device()`` here instead of building ``torch.device`` objects, and the
    parameters' checks are remembered per tensor (:func:`_params_look_valid`).
    """
    if type(x) is not torch.Tensor or x.dim() != 3:
        return False
    _, hc, H = x.shape
    is_cuda = x.is_cuda
    if not (is_cuda or x.is_cpu):
        return False
    index = x.get_device()
    return (
        x.dtype in _DTYPES and hc > 0 and H > 0 and x.is_contiguous()
        and type(norm_eps) is float and norm_eps >= 0 and type(hc_eps) is float and hc_eps >= 0
        and (impl == "auto" or impl == "eager" or impl == "compiled"
             or (impl == "triton" and hc == HC and (is_cuda or interpreter_enabled())))
        and _params_look_valid(hc_fn, hc_scale, hc_base, norm_weight, hc, H, is_cuda, index)
    )


def _direct_call_ok(x) -> bool:
    """Whether an eager call may skip the ``torch.library`` op and launch the kernels itself.

    The custom op exists for tracing (``torch.compile``, fake tensors, dispatch modes, functorch);
    on a plain eager tensor it only adds host time (the library-op vs ``LaunchCache`` launcher
    rows of ``benchmarks/results/eager_cost/eager_cost_tensor_cores.md``).
    """
    return (
        type(x) is torch.Tensor
        and not torch.compiler.is_compiling()
        and torch._C._len_torch_dispatch_stack() == 0
        and not torch._C._is_torch_function_mode_enabled()
        and not torch._C._functorch.is_functorch_wrapped_tensor(x)
        and not (x.requires_grad and torch.is_grad_enabled())
    )


def _dispatch(x, hc_fn, hc_scale, hc_base, norm_weight, norm_eps, hc_eps, impl):
    if not inputs_look_valid(x, hc_fn, hc_scale, hc_base, norm_weight, norm_eps, hc_eps, impl):
        _check_hc_head_inputs(x, hc_fn, hc_scale, hc_base, norm_weight, norm_eps, hc_eps, impl)
    impl = _resolve(impl, x)
    if impl == "triton":
        x3 = x if x.dim() == 3 else x.reshape(-1, *x.shape[-2:])
        if _direct_call_ok(x3):
            y = hc_head_triton(x3, hc_fn, hc_scale, hc_base, float(norm_eps), float(hc_eps),
                               norm_weight=norm_weight)
        elif norm_weight is None:
            y = _hc_head_op(x3, hc_fn, hc_scale, hc_base, float(norm_eps), float(hc_eps))
        else:
            y = _hc_head_rmsnorm_op(
                x3, hc_fn, hc_scale, hc_base, norm_weight, float(norm_eps), float(hc_eps)
            )
        return y if x.dim() == 3 else y.view(*x.shape[:-2], x.shape[-1])
    kw = {"norm_eps": norm_eps, "hc_eps": hc_eps}
    if norm_weight is None:
        fn = _hc_head_compiled if impl == "compiled" else hc_head_reference
        return fn(x, hc_fn, hc_scale, hc_base, **kw)
    fn = _hc_head_rmsnorm_compiled if impl == "compiled" else hc_head_rmsnorm_reference
    return fn(x, hc_fn, hc_scale, hc_base, norm_weight, **kw)


def hc_head(x, hc_fn, hc_scale, hc_base, *, norm_eps, hc_eps, impl="auto"):
    """Collapse the ``hc_mult`` residual streams into one hidden state (DSV4 ``hc_head``).

    With ``xf = x.reshape(T, hc_mult*H).float()``::

        r = rsqrt(mean(xf^2) + norm_eps)                 # over all hc_mult*H values
        w = sigmoid((xf @ hc_fn.T) * r * hc_scale + hc_base) + hc_eps    # [T, hc_mult]
        y = sum_i w[:, i] * xf[:, i, :]                  # fp32, returned in x.dtype

    Parameters
    ----------
    x : torch.Tensor
        ``[T, hc_mult, H]`` (any leading dims), bfloat16, float16 or float32, contiguous.
    hc_fn : torch.Tensor
        ``[hc_mult, hc_mult*H]`` float32.
    hc_scale : torch.Tensor
        ``[1]`` float32.
    hc_base : torch.Tensor
        ``[hc_mult]`` float32.
    norm_eps, hc_eps : float
        Epsilons of the RMS factor and of the stream weights (1e-6 in DSV4).
    impl : {"auto", "eager", "compiled", "triton"}
        ``"auto"``: the fused Triton kernel (2 launches) on CUDA, and on CPU under
        ``TRITON_INTERPRET=1``, for hc_mult = 4; the reference elsewhere and for empty input.
        ``"eager"``: the reference. ``"compiled"``: the reference through
        ``dsv4spec.capture.compile_in_capture_mode`` (Inductor under ``capture_mode()`` only).
        ``"triton"``: the fused kernel (empty input still takes the reference).

    Returns
    -------
    torch.Tensor
        ``[T, H]`` (leading dims kept) in ``x.dtype``; empty ``x`` gives an empty result.

    Raises
    ------
    ValueError, TypeError
        On a wrong shape, dtype, device or layout, naming the argument.
    """
    return _dispatch(x, hc_fn, hc_scale, hc_base, None, norm_eps, hc_eps, impl)


def hc_head_rmsnorm(x, hc_fn, hc_scale, hc_base, norm_weight, *, norm_eps, hc_eps, impl="auto"):
    """:func:`hc_head` followed by the draft's shared-head RMSNorm, fused in the same 2 launches.

    ``y = hc_head(x, ...)`` (in ``x.dtype``), then in fp32
    ``out = (y * rsqrt(mean(y^2, over H) + norm_eps) * norm_weight).to(x.dtype)``; the same
    ``norm_eps`` serves both (DSV4's ``rms_norm_eps``). The fused kernel computes ``sum(y^2)`` as
    ``w^T G w`` from the Gram matrix ``G`` of the streams, in fp32, instead of from ``y`` rounded to
    ``x.dtype``: the results agree within the output's rounding.

    Parameters
    ----------
    x, hc_fn, hc_scale, hc_base, norm_eps, hc_eps, impl
        As in :func:`hc_head`.
    norm_weight : torch.Tensor
        ``[H]`` float32, the RMSNorm weight.

    Returns
    -------
    torch.Tensor
        ``[T, H]`` (leading dims kept) in ``x.dtype``.
    """
    return _dispatch(x, hc_fn, hc_scale, hc_base, norm_weight, norm_eps, hc_eps, impl)


# ---------------------------------------------------------------------------------------------
# Launch plans, queried without a device (the measured-faster tables: dsv4spec.integrations.plans)


def launch_plan(num_tokens: int, hidden_size: int, num_sms: int, *, rmsnorm: bool = False,
                dtype: torch.dtype = torch.bfloat16) -> tuple[tuple, tuple]:
    """``(tiling, grid)`` of hc_head's default launches (with the RMSNorm: ``rmsnorm``) at
    ``num_tokens`` tokens of width ``hidden_size`` on an sm_90+ GPU of ``num_sms`` SMs: the tiling
    is the kernels, blocks, warps and launch flags, the grid the split count (``plan_scan``)."""
    plan_scan.check_count("num_tokens", num_tokens)
    return _planner(hidden_size, num_sms, rmsnorm, dtype)(num_tokens)


def _planner(hidden_size, num_sms, rmsnorm, dtype) -> plan_scan.Plan:
    """``launch_plan`` of one width, GPU and norm flag as a function of T, arguments checked."""
    plan_scan.check_count("hidden_size", hidden_size)
    plan_scan.check_count("num_sms", num_sms)
    rmsnorm = bool(rmsnorm)

    def plan(T):
        cfg, _, warps = plan_on(T, hidden_size, num_sms, True, True, rmsnorm, dtype=dtype)
        tiling, grid = plan_scan.tiling_and_grid(cfg)
        return (*tiling, *warps), grid

    return plan


@functools.lru_cache(maxsize=64)
def tiling_switches(hidden_size: int, max_tokens: int, num_sms: int, *, rmsnorm: bool = False,
                    dtype: torch.dtype = torch.bfloat16) -> tuple[int, ...]:
    """The token counts T, ``2 <= T <= max_tokens``, at which hc_head's tiling at width
    ``hidden_size`` differs from T - 1's (:func:`launch_plan`, run at every count)."""
    return plan_scan.tiling_switches(_planner(hidden_size, num_sms, rmsnorm, dtype), max_tokens)


@functools.lru_cache(maxsize=64)
def first_plan_difference(hidden_size: int, max_tokens: int, num_sms: int, other_num_sms: int,
                          *, rmsnorm: bool = False,
                          dtype: torch.dtype = torch.bfloat16) -> int | None:
    """The smallest token count up to ``max_tokens`` at which hc_head launches another plan
    (tiling or split count) on a GPU of ``other_num_sms`` SMs than on one of ``num_sms``; None
    where there is none."""
    return plan_scan.first_difference(_planner(hidden_size, num_sms, rmsnorm, dtype),
                                      _planner(hidden_size, other_num_sms, rmsnorm, dtype),
                                      max_tokens)
