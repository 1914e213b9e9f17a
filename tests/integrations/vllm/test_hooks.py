"""The four hooks through the names vLLM's DeepSeek-V4 modules call, against vLLM's own functions.

vLLM's ``tilelang.py`` runs for real (its shape, dtype and view handling); its TileLang kernels
are stood in by vLLM's torch reference on CPU (``standins.kernels_module``). The epsilons are
large and distinct so that a swapped or dropped one fails the comparisons; H = 128 lets vLLM's
one-launch fused boundary (T <= 32) and its post + GEMM path (T > 32) both run.
"""

import ast
import logging
import sys

import pytest
import torch
from triton.compiler.errors import CompilationError

from dsv4spec.integrations.hooks import INTERPRETER_ARCHITECTURE
from dsv4spec.integrations.vllm import hc_head as hc_head_hooks
from dsv4spec.integrations.vllm import mhc as mhc_hooks
from dsv4spec.integrations.vllm import plugin, register
from dsv4spec.integrations.vllm.tables import TABLES

from ..mhc_reference import HC_EPS, HEAD_HC_EPS, HEAD_RMS_EPS, ITERS, NORM_EPS, RMS_EPS, reference
from ..mhc_reference import make_inputs as mhc_inputs
from .conftest import NAMES
from .standins import DEVICE

H = 128
LOGGER = "dsv4spec.integrations.vllm"
REUSE = "mhc_fused_post_pre_reuse_residual"  # vLLM 0.34.0's target boundary
OPS = ("mhc_pre", "mhc_post", "mhc_fused_post_pre", "hc_head", REUSE)
# Where each op is called: the module whose binding a hooked call goes through.
CALLERS = {"mhc_pre": ("model",), "mhc_post": ("model", "mtp", "dspark"),
           "mhc_fused_post_pre": ("model",), "hc_head": ("model", "mtp", "dspark"),
           REUSE: ("model",)}
# The table each op reads (the reuse_residual boundary runs the boundary's kernels).
TABLE = {op: op for op in OPS} | {REUSE: "mhc_fused_post_pre"}
# bf16 outputs: one bf16 ulp of the largest element (fp32 sums in a different order);
# float32 mixes: fp32 sums over hc*H products.
BF16_TOL = dict(rtol=1.6e-2, atol=1.6e-2)
F32_TOL = dict(rtol=1e-5, atol=1e-5)


FAULTS = [
    pytest.param(lambda: RuntimeError("CUDA error: an illegal memory access"), id="RuntimeError"),
    pytest.param(lambda: AttributeError("'NoneType' object has no attribute 'launch'"),
                 id="AttributeError"),
    pytest.param(lambda: CompilationError("def kernel(): ...", ast.parse("x").body[0],
                                          "injected"), id="CompilationError"),
]


@pytest.fixture(autouse=True)
def _op_in_this_version(request, vllm_source):
    """An op parametrized in a test runs only on the versions that define its function."""
    op = getattr(request.node, "callspec", None) and request.node.callspec.params.get("op")
    if op == REUSE and vllm_source == "0.33.0":
        pytest.skip(f"vLLM {vllm_source} has no {NAMES[REUSE]}")


def make_inputs(T, H=H, hc=4, seed=0):
    return mhc_inputs(T, H, DEVICE, hc, seed, head=True)


def call_args(op, t, norm=True, eps=(HC_EPS, HC_EPS)):
    """(args, kwargs) of vLLM's ``op`` as DeepSeek-V4's model calls it (model.py 746/760)."""
    if op == "hc_head":
        return (t["residual"], t["head_fn"], t["head_scale"], t["head_base"], HEAD_RMS_EPS,
                HEAD_HC_EPS), {}
    if op == "mhc_post":
        return (t["x"], t["residual"], t["post"], t["comb"]), {}
    pre = (t["fn"], t["hc_scale"], t["hc_base"], RMS_EPS, *eps, 2.0, ITERS)
    kw = {"norm_weight": t["norm_weight"], "norm_eps": NORM_EPS} if norm else {}
    if op == "mhc_pre":
        return (t["residual"], *pre), kw
    return (t["x"], t["residual"], t["post"], t["comb"], *pre), {"n_splits": 1, "tile_n": 1,
                                                                  **kw}


def cloned(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def assert_like(got, want, tol_against=None):
    """Same dtypes, shapes and strides as vLLM's result; values close to ``tol_against``."""
    got, want = as_tuple(got), as_tuple(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
    for g, r in zip(got, as_tuple(tol_against if tol_against is not None else want)):
        tol = BF16_TOL if g.dtype == torch.bfloat16 else F32_TOL
        torch.testing.assert_close(g.double(), r.to(g.device).double(), **tol)


def original(vllm, op):
    return getattr(vllm.peer.module, NAMES[op])


def hooked(vllm, op, where="model"):
    return getattr(vllm.models[plugin.__dict__[f"{where.upper()}_MODULE"] if where != "model"
                               else plugin.TARGET_MODULE], NAMES[op])


def measure(monkeypatch, op, modes=("graph", "eager"), spans=((1, 64),), width=H):
    """A table entry for the test width (the interpreter stands in for sm_90)."""
    for mode in modes:
        monkeypatch.setitem(TABLES[TABLE[op]][INTERPRETER_ARCHITECTURE][mode], width, spans)


def launches(vllm):
    return vllm.kernels.impl.launches


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("T", [3, 33], ids=["T=3 fused kernel", "T=33 post+GEMM"])
def test_measured_call_gives_vllms_result_without_vllms_kernels(vllm, monkeypatch, op, T):
    measure(monkeypatch, op)
    register()
    t = make_inputs(T)
    args, kwargs = call_args(op, t)
    want = original(vllm, op)(*cloned(args), **kwargs)  # vLLM's reuse_residual may write it
    assert launches(vllm), "vLLM's function ran its (stood-in) kernels"
    launches(vllm).clear()
    for where in CALLERS[op]:
        got = hooked(vllm, op, where)(*args, **kwargs)
        assert not launches(vllm), f"dsv4spec's op served {op} at {where}"
        assert_like(got, want)
        assert_like(got, want, tol_against=reference(op, t))


@pytest.mark.parametrize("op", ["mhc_pre", "mhc_fused_post_pre"])
def test_without_norm_weight(vllm, monkeypatch, op):
    measure(monkeypatch, op)
    register()
    t = make_inputs(2, seed=1)
    args, kwargs = call_args(op, t, norm=False)
    want = original(vllm, op)(*args, **kwargs)
    launches(vllm).clear()
    got = hooked(vllm, op)(*args, **kwargs)
    assert not launches(vllm)
    assert_like(got, want, tol_against=reference(op, t, norm=False))


def test_mhc_post_takes_a_two_dimensional_post_mix_as_vllm_does(vllm, monkeypatch):
    measure(monkeypatch, "mhc_post")
    register()
    t = make_inputs(2)
    args = (t["x"], t["residual"], t["post"].squeeze(-1), t["comb"])
    want = original(vllm, "mhc_post")(*args)
    launches(vllm).clear()
    assert_like(hooked(vllm, "mhc_post")(*args), want)
    assert not launches(vllm)


@pytest.mark.parametrize("op", OPS)
def test_unmeasured_width_keeps_vllms_kernels(vllm, op):
    """The shipped tables hold H = 7168 only: at the test width vLLM's kernels serve."""
    register()
    t = make_inputs(2)
    args, kwargs = call_args(op, t)
    got = hooked(vllm, op)(*args, **kwargs)
    assert launches(vllm)
    launches(vllm).clear()
    want = original(vllm, op)(*args, **kwargs)
    for g, w in zip(as_tuple(got), as_tuple(want)):
        assert torch.equal(g, w)


def _aside_cases():
    return {
        "T beyond the table": ("mhc_post", dict(T=5), lambda mp: None, (1, 4)),
        "distinct epsilons": ("mhc_pre", {}, lambda mp: None, None),
        "float32 norm weight": ("mhc_fused_post_pre", {}, lambda mp: None, None),
        "batch invariant": ("mhc_post", {}, lambda mp: mp.setenv("VLLM_BATCH_INVARIANT", "1"),
                            None),
        "DeepGEMM in use": ("mhc_pre", {}, lambda mp: mp.setattr(mhc_hooks, "_deep_gemm", True),
                            None),
        "ROCm": ("hc_head", {}, lambda mp: mp.setattr(hc_head_hooks, "on_rocm", lambda: True),
                 None),
        "ROCm (mHC)": ("mhc_post", {}, lambda mp: mp.setattr(mhc_hooks, "on_rocm", lambda: True),
                       None),
        "another architecture": ("mhc_fused_post_pre", {}, lambda mp: mp.setattr(
            mhc_hooks, "gpu_architecture", lambda index: (10, 0)), None),
        "another architecture (hc_head)": ("hc_head", {}, lambda mp: mp.setattr(
            hc_head_hooks, "gpu_architecture", lambda index: (10, 0)), None),
        "DeepGEMM in use above 32 tokens": ("mhc_fused_post_pre", dict(T=33), lambda mp: mp.setattr(
            mhc_hooks, "_deep_gemm", True), None),
        "torch.compile tracing": ("hc_head", {}, lambda mp: mp.setattr(
            torch.compiler, "is_compiling", lambda: True), None),
        "torch.compile tracing (mhc_post)": ("mhc_post", {}, lambda mp: mp.setattr(
            torch.compiler, "is_compiling", lambda: True), None),
        "torch.compile tracing (mhc_pre)": ("mhc_pre", {}, lambda mp: mp.setattr(
            torch.compiler, "is_compiling", lambda: True), None),
        "torch.compile tracing (boundary)": ("mhc_fused_post_pre", {}, lambda mp: mp.setattr(
            torch.compiler, "is_compiling", lambda: True), None),
    }


@pytest.mark.parametrize("case", list(_aside_cases()))
def test_step_aside_runs_vllms_function(vllm, monkeypatch, case):
    op, shape, setup, spans = _aside_cases()[case]
    measure(monkeypatch, op, spans=spans or ((1, 64),))
    setup(monkeypatch)
    register()
    t = make_inputs(shape.get("T", 2))
    eps = (HC_EPS, HC_EPS * 0.5) if case == "distinct epsilons" else (HC_EPS, HC_EPS)
    args, kwargs = call_args(op, t, eps=eps)
    if case == "float32 norm weight":
        kwargs["norm_weight"] = kwargs["norm_weight"].float()
    got = hooked(vllm, op)(*args, **kwargs)
    assert launches(vllm), f"{case}: vLLM's kernels ran"
    launches(vllm).clear()
    want = original(vllm, op)(*args, **kwargs)
    for g, w in zip(as_tuple(got), as_tuple(want)):
        assert torch.equal(g, w)


@pytest.mark.parametrize("op,bad", [
    ("mhc_post", "float32 residual"), ("mhc_post", "non-contiguous residual"),
    ("mhc_pre", "hc_mult 2"), ("mhc_fused_post_pre", "empty"), ("hc_head", "float32 input"),
    ("hc_head", "empty"), ("mhc_pre", "extra leading dimension"),
])
def test_inputs_outside_the_ops_step_aside(vllm, monkeypatch, op, bad):
    measure(monkeypatch, op)
    register()
    t = make_inputs(0 if bad == "empty" else 2, hc=2 if bad == "hc_mult 2" else 4)
    r = t["residual"]
    if bad in ("float32 residual", "float32 input"):
        t["residual"] = r.float()
    elif bad == "non-contiguous residual":
        t["residual"] = r.transpose(1, 2).contiguous().transpose(1, 2)
    elif bad == "extra leading dimension":
        t["residual"] = r.unsqueeze(0)
    fast = getattr(mhc_hooks if op != "hc_head" else hc_head_hooks, f"fast_{op}")
    args, kwargs = call_args(op, t)
    from dsv4spec.integrations.hooks import STEP_ASIDE

    assert fast(*args, **kwargs) is STEP_ASIDE


def test_rejected_inputs_step_aside_with_one_warning(vllm, monkeypatch, caplog):
    """Inputs that pass the hook's checks but that the op refuses (a float64 comb): vLLM's
    function serves them, one warning, and the hook stays on."""
    measure(monkeypatch, "mhc_post")
    register()
    t = make_inputs(2)
    t["comb"] = t["comb"].double()
    args = (t["x"], t["residual"], t["post"], t["comb"].float())
    calls = []
    monkeypatch.setattr(mhc_hooks, "mhc_post",
                        lambda *a, **k: calls.append(1) or (_ for _ in ()).throw(
                            ValueError("comb must be float32")))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        hooked(vllm, "mhc_post")(*args)
        hooked(vllm, "mhc_post")(*args)
    assert calls == [1, 1]
    assert len([r for r in caplog.records if "rejected" in r.getMessage()]) == 1
    assert plugin.installed()["mhc_post"].enabled


_FAULT_TARGETS = {"mhc_pre": (mhc_hooks, "mhc_pre"), "mhc_post": (mhc_hooks, "mhc_post"),
                  "mhc_fused_post_pre": (mhc_hooks, "mhc_post_pre"),
                  REUSE: (mhc_hooks, "mhc_post_pre"),
                  "hc_head": (hc_head_hooks, "hc_head")}


@pytest.mark.parametrize("make_error", FAULTS)
@pytest.mark.parametrize("op", OPS)
def test_failure_runs_vllm_and_switches_the_hook_off(vllm, monkeypatch, caplog, op, make_error):
    measure(monkeypatch, op)
    calls = []

    def fail(*args, **kwargs):
        calls.append(1)
        raise make_error()

    monkeypatch.setattr(*_FAULT_TARGETS[op], fail)
    register()
    t = make_inputs(2)
    args, kwargs = call_args(op, t)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first = hooked(vllm, op)(*args, **kwargs)
        second = hooked(vllm, op, CALLERS[op][-1])(*args, **kwargs)
    assert calls == [1], "the op ran once, then the hook stayed off in every module"
    want = original(vllm, op)(*args, **kwargs)
    for g in (first, second):
        for a, b in zip(as_tuple(g), as_tuple(want)):
            assert torch.equal(a, b)
    records = [r for r in caplog.records if "hook failed" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert records[0].exc_info is not None and records[0].exc_info[0] is type(make_error())
    assert not plugin.installed()[op].enabled


def test_exceptions_of_vllms_own_function_propagate(vllm, monkeypatch):
    """An exception raised by vLLM's function (here its own shape assertion, where the hook
    steps aside) is vLLM's: it reaches the caller and the hook stays on."""
    register()
    t = make_inputs(2)
    args, kwargs = call_args("mhc_fused_post_pre", t)
    bad = (args[0][:, :-1], *args[1:])
    with pytest.raises(AssertionError):
        hooked(vllm, "mhc_fused_post_pre")(*bad, **kwargs)
    assert plugin.installed()["mhc_fused_post_pre"].enabled


@pytest.mark.parametrize("op", ["mhc_post", "mhc_fused_post_pre"])
def test_capture_rule(vllm, monkeypatch, op):
    """Inside a capture only a shape compiled eagerly runs ours; a shape the graph table gives
    to dsv4spec and the eager table to vLLM is launched once eagerly (dropped) to compile it."""
    measure(monkeypatch, op, modes=("graph",))
    capturing = [False]
    monkeypatch.setattr(mhc_hooks, "_capturing", lambda index: capturing[0])
    register()
    first, second = make_inputs(2, seed=3), make_inputs(3, seed=4)
    fn = hooked(vllm, op)
    capturing[0] = True
    args, kwargs = call_args(op, first)
    fn(*args, **kwargs)
    assert launches(vllm), "a first sight inside a capture keeps vLLM's kernels"
    launches(vllm).clear()
    capturing[0] = False
    args, kwargs = call_args(op, second)
    fn(*args, **kwargs)  # eager: vLLM's serves, ours is compiled on the side
    assert launches(vllm) and mhc_hooks._compiled
    launches(vllm).clear()
    capturing[0] = True
    got = fn(*args, **kwargs)
    assert not launches(vllm), "compiled before the capture: ours is captured"
    assert_like(got, original(vllm, op)(*args, **kwargs), tol_against=reference(op, second))


def test_hc_head_first_sight_inside_a_capture_steps_aside(vllm, monkeypatch):
    measure(monkeypatch, "hc_head")
    monkeypatch.setattr(hc_head_hooks, "stream_capturing", lambda index: True)
    monkeypatch.setattr(hc_head_hooks.torch.Tensor, "get_device", lambda self: 0)
    register()
    t = make_inputs(2)
    args, _ = call_args("hc_head", t)
    from dsv4spec.integrations.hooks import STEP_ASIDE

    assert hc_head_hooks.fast_hc_head(*args) is STEP_ASIDE
    assert not hc_head_hooks._ready, "nothing decided (or compiled) inside the capture"


@pytest.mark.parametrize("T,kernels", [(3, ["fused", "big_fuse"]),
                                       (33, ["post", "prenorm_gemm", "big_fuse"])])
def test_vllms_boundary_takes_its_two_paths(vllm, T, kernels):
    """The stand-ins run under vLLM's own dispatch: one fused launch up to 32 tokens, post +
    GEMM above (so both of vLLM's paths are what the hook is compared with)."""
    args, kwargs = call_args("mhc_fused_post_pre", make_inputs(T))
    original(vllm, "mhc_fused_post_pre")(*args, **kwargs)
    assert launches(vllm) == kernels


def test_deep_gemm_keeps_the_boundary_ours_up_to_32_tokens(vllm, monkeypatch):
    """vLLM's one-launch fused boundary (T <= 32) never runs DeepGEMM: the table decides there."""
    measure(monkeypatch, "mhc_fused_post_pre")
    monkeypatch.setattr(mhc_hooks, "_deep_gemm", True)
    register()
    t = make_inputs(3)
    args, kwargs = call_args("mhc_fused_post_pre", t)
    got = hooked(vllm, "mhc_fused_post_pre")(*args, **kwargs)
    assert not launches(vllm)
    assert_like(got, original(vllm, "mhc_fused_post_pre")(*args, **kwargs),
                tol_against=reference("mhc_fused_post_pre", t))


def test_deep_gemm_is_read_from_vllm_once_loaded(vllm, monkeypatch):
    calls = []
    module = sys.modules["vllm.utils.deep_gemm"]
    monkeypatch.setattr(module, "is_deep_gemm_supported", lambda: calls.append(1) or False)
    assert mhc_hooks.vllm_deep_gemm() is False
    assert mhc_hooks.vllm_deep_gemm() is False
    assert calls == [1], "remembered: vLLM's answer is fixed at start"


def test_deep_gemm_not_yet_loaded_counts_as_in_use(vllm, monkeypatch):
    """Before vLLM has loaded ``vllm.utils.deep_gemm`` nobody knows which GEMM vLLM would run:
    mhc_pre steps aside (and asks again at the next call)."""
    from dsv4spec.integrations.hooks import STEP_ASIDE

    measure(monkeypatch, "mhc_pre")
    module = sys.modules.pop("vllm.utils.deep_gemm")
    args, kwargs = call_args("mhc_pre", make_inputs(2))
    try:
        assert mhc_hooks.fast_mhc_pre(*args, **kwargs) is STEP_ASIDE
        assert mhc_hooks._deep_gemm is None
    finally:
        sys.modules["vllm.utils.deep_gemm"] = module
    assert mhc_hooks.fast_mhc_pre(*args, **kwargs) is not STEP_ASIDE


@pytest.fixture
def residual_sized(monkeypatch):
    """``residual_sized(numel)``: the allocations through torch's allocating functions since the
    last call, of at least ``numel`` elements."""
    sizes: list[int] = []

    def recording(allocate):
        def allocating(*args, **kwargs):
            out = allocate(*args, **kwargs)
            sizes.append(out.numel())
            return out
        return allocating

    for owner, name in ((torch, "empty"), (torch, "empty_like"), (torch, "zeros"),
                        (torch, "zeros_like"), (torch.Tensor, "new_empty"),
                        (torch.Tensor, "new_zeros"), (torch.Tensor, "clone")):
        monkeypatch.setattr(owner, name, recording(getattr(owner, name)))

    def since(numel):
        big = [n for n in sizes if n >= numel]
        sizes.clear()
        return big

    return since


def _unchanged(args, copies):
    return all(torch.equal(a, c) for a, c in zip(args, copies) if isinstance(a, torch.Tensor))


@pytest.mark.parametrize("T", [3, 32, 33, 40], ids=lambda T: f"T={T}")
def test_reuse_residual_boundary_writes_in_place_where_vllms_does(vllm, monkeypatch,
                                                                   residual_sized, T):
    """vLLM 0.34.0's ``mhc_fused_post_pre_tilelang_reuse_residual`` overwrites ``residual`` and
    returns that storage above 32 tokens (its post + GEMM path); at 32 or fewer (its fused
    kernel) it returns a new residual and writes none of its inputs. The hook does the same,
    with vLLM's values and, in place, no residual-sized allocation, from a shape's second call
    on: its first, which compiles the shape, returns a new residual and leaves its inputs."""
    if not hasattr(vllm.peer.module, NAMES[REUSE]):
        pytest.skip("vLLM 0.33.0 has no reuse_residual boundary")
    monkeypatch.setattr(mhc_hooks, "REUSE_IN_PLACE_FROM_TOKENS", 33)
    measure(monkeypatch, REUSE)
    register()
    hook = hooked(vllm, REUSE)
    t = make_inputs(T)
    args, kwargs = call_args(REUSE, t)
    copies = cloned(args)
    first = hook(*args, **kwargs)
    assert first[0].data_ptr() != t["residual"].data_ptr() and _unchanged(args, copies)
    numel = t["residual"].numel()
    t = make_inputs(T)
    args, kwargs = call_args(REUSE, t)
    want = reference(REUSE, t)
    vllms = original(vllm, REUSE)(*cloned(args), **kwargs)
    in_place = T > 32
    assert (vllms[0].data_ptr() != args[1].data_ptr()), "vLLM's ran on copies"
    launches(vllm).clear()
    residual_sized(numel)
    got = hook(*args, **kwargs)
    allocated = residual_sized(numel)
    assert not launches(vllm), "dsv4spec's op served the reuse_residual boundary"
    assert_like(got, vllms, tol_against=want)
    assert all(torch.equal(g, f) for g, f in zip(got, first)), "the same bits as out of place"
    if in_place:
        assert got[0].data_ptr() == t["residual"].data_ptr() and got[0].shape == copies[1].shape
        assert not allocated, "no new residual"
        assert _unchanged(args[:1] + args[2:], copies[:1] + copies[2:])
    else:
        assert got[0].data_ptr() != t["residual"].data_ptr() and _unchanged(args, copies)
        assert allocated == [numel]
    # vLLM's own writes in place exactly there
    vllms = original(vllm, REUSE)(*copies, **kwargs)
    assert (vllms[0].data_ptr() == copies[1].data_ptr()) == in_place


def test_reuse_residual_boundary_returns_a_new_residual_until_in_place_is_switched_on(
        vllm, monkeypatch, residual_sized):
    """The in-place write is off by default (it waits for a GPU run): above 32 tokens the hook
    still returns a new residual with vLLM's values and leaves every input as it was."""
    if not hasattr(vllm.peer.module, NAMES[REUSE]):
        pytest.skip("vLLM 0.33.0 has no reuse_residual boundary")
    assert mhc_hooks.REUSE_IN_PLACE_FROM_TOKENS is None
    measure(monkeypatch, REUSE)
    register()
    hook = hooked(vllm, REUSE)
    for _ in range(2):  # the second call of a shape is the one that would write in place
        t = make_inputs(40)
        args, kwargs = call_args(REUSE, t)
        copies = cloned(args)
        numel = t["residual"].numel()
        residual_sized(numel)
        got = hook(*args, **kwargs)
        assert residual_sized(numel) == [numel], "a new residual"
        assert got[0].data_ptr() != t["residual"].data_ptr() and _unchanged(args, copies)
        assert_like(got, original(vllm, REUSE)(*copies, **kwargs), tol_against=reference(REUSE, t))


def test_reuse_residual_boundary_warming_a_graph_shape_leaves_vllm_its_input(vllm, monkeypatch):
    """A shape the graph table gives to ours and the eager one to vLLM: the hook launches ours
    once eagerly (compiling it for the capture) and vLLM's function then serves the call with
    the same arguments, so that launch must not write ``residual`` even where in place is
    allowed."""
    if not hasattr(vllm.peer.module, NAMES[REUSE]):
        pytest.skip("vLLM 0.33.0 has no reuse_residual boundary")
    monkeypatch.setattr(mhc_hooks, "REUSE_IN_PLACE_FROM_TOKENS", 33)
    measure(monkeypatch, REUSE, modes=("graph",))
    measure(monkeypatch, REUSE, modes=("eager",), spans=())
    register()
    t = make_inputs(40)
    args, kwargs = call_args(REUSE, t)
    want = original(vllm, REUSE)(*cloned(args), **kwargs)
    launches(vllm).clear()
    got = hooked(vllm, REUSE)(*args, **kwargs)
    assert launches(vllm), "vLLM's function served the eager call"
    assert_like(got, want)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
