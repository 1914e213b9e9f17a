"""The ops' remembered parameter checks (``CheckedParams``): they hold a model's weights weakly, so
a destroyed model frees them and forgets them, a later model gets entries of its own, and a tensor
that takes a dead one's id, or a weight moved back onto its remembered address, is checked again.
"""

import gc
import importlib
import weakref

import pytest
import torch

from dsv4spec.ops import hc_head_rmsnorm, mhc_pre
from dsv4spec.ops.checked_params import CheckedParams

MHC_OPS = importlib.import_module("dsv4spec.ops.mhc")
HC_HEAD_OPS = importlib.import_module("dsv4spec.ops.hc_head")  # the name is also the op's
HC, H = 4, 8


def mhc_weights(fn=None):
    """``fn, hc_scale, hc_base, norm_weight`` of one mhc_pre layer."""
    n = (2 + HC) * HC
    return (torch.randn(n, HC * H) if fn is None else fn, torch.rand(3) + 0.5, torch.randn(n),
            torch.rand(H) + 0.5)


def call_mhc_pre(x, weights):
    fn, hc_scale, hc_base, norm_weight = weights
    return mhc_pre(x, fn, hc_scale, hc_base, norm_weight=norm_weight, rms_eps=1e-6, hc_eps=1e-6,
                   sinkhorn_iters=3, norm_eps=1e-6, impl="reference")


def hc_head_weights(fn=None):
    """``hc_fn, hc_scale, hc_base, norm_weight`` of one hc_head + RMSNorm."""
    return (torch.randn(HC, HC * H) if fn is None else fn, torch.rand(1) + 0.5, torch.randn(HC),
            torch.rand(H) + 0.5)


def call_hc_head(x, weights):
    return hc_head_rmsnorm(x, *weights, norm_eps=1e-6, hc_eps=1e-6, impl="eager")


OPS = [
    pytest.param(MHC_OPS, mhc_weights, call_mhc_pre, id="mhc_pre"),
    pytest.param(HC_HEAD_OPS, hc_head_weights, call_hc_head, id="hc_head_rmsnorm"),
]


@pytest.fixture(autouse=True)
def _own_checked_params(monkeypatch):
    for ops in (MHC_OPS, HC_HEAD_OPS):
        monkeypatch.setattr(ops, "_CHECKED_PARAMS", CheckedParams(ops.CHECKED_PARAMS_LIMIT))


def streams():
    return torch.randn(2, HC, H)


def parameter_checks(monkeypatch, ops):
    """The parameter checks the op runs, counted: mhc_pre's check of its parameters, hc_head's
    check of each parameter (the four of a call that is not remembered)."""
    name = "_params_ok" if ops is MHC_OPS else "_param_ok"
    real, seen = getattr(ops, name), []
    monkeypatch.setattr(ops, name, lambda *args: seen.append(1) or real(*args))
    return seen


@pytest.mark.parametrize("ops,weights,call", OPS)
def test_a_dropped_models_weights_are_freed_and_forgotten(ops, weights, call):
    x = streams()
    params = [torch.nn.Parameter(t, requires_grad=False) for t in weights()]
    call(x, params)
    assert len(ops._CHECKED_PARAMS) == 1, "the remembered check is what this tests"
    alive = [weakref.ref(p) for p in params]
    del params
    gc.collect()
    assert [ref() for ref in alive] == [None] * 4
    assert len(ops._CHECKED_PARAMS) == 0


@pytest.mark.parametrize("ops,weights,call", OPS)
def test_past_the_limit_a_new_models_weights_are_remembered(monkeypatch, ops, weights, call):
    """The cache full of weights still alive (a model not freed), a new model's weights are
    remembered in place of the oldest: its next call skips the full check."""
    x, shared = streams(), weights()
    models = [weights(fn=torch.randn_like(shared[0])) for _ in range(ops.CHECKED_PARAMS_LIMIT)]
    for model in models:
        call(x, model)
    new = weights()
    checks = parameter_checks(monkeypatch, ops)
    call(x, new)
    checked_once = len(checks)
    assert checked_once > 0
    call(x, new)
    assert len(checks) == checked_once
    assert len(ops._CHECKED_PARAMS) == ops.CHECKED_PARAMS_LIMIT
    call(x, models[-1])
    assert len(checks) == checked_once
    call(x, models[0])  # the oldest was dropped for it
    assert len(checks) == 2 * checked_once


@pytest.mark.parametrize("ops,weights,call", OPS)
def test_a_tensor_with_a_dead_tensors_id_is_checked(ops, weights, call):
    """New tensors take the ids of a dropped model's weights and sit on the same memory (the
    same addresses), one of them with the wrong shape: the dead tensors' entry is gone, so the
    call takes the full check and refuses it, naming the weight."""
    x, model = streams(), list(weights())
    call(x, model)
    memory = [t.data for t in model]  # other tensors on the same storage: the addresses stay
    dead_ids = [id(t) for t in model]
    del model
    gc.collect()
    assert len(ops._CHECKED_PARAMS) == 0
    reused, made = {}, []
    for _ in range(1000):  # CPython hands freed objects' memory, so their ids, to new ones
        t = torch.empty(0)
        made.append(t)
        if id(t) in dead_ids:
            reused[id(t)] = t
        if len(reused) == len(dead_ids):
            break
    assert len(reused) == len(dead_ids), "no new tensor took a dead one's id"
    impostors = [reused[i] for i in dead_ids]
    for t, data in zip(impostors, memory, strict=True):
        t.data = data
    impostors[0].data = memory[0].view(-1)  # the remembered address, the wrong shape
    assert [t.data_ptr() for t in impostors] == [t.data_ptr() for t in memory]
    with pytest.raises(ValueError, match="fn"):
        call(x, impostors)


@pytest.mark.parametrize("weight", [0, 3], ids=["fn", "norm_weight"])
@pytest.mark.parametrize("ops,weights,call", OPS)
def test_a_weight_moved_back_onto_its_remembered_address_is_checked(ops, weights, call, weight):
    """A weight given new storage fails its check; put back on its old storage with the wrong
    shape (the remembered address), it must fail again, not pass as remembered."""
    x, model = streams(), weights()
    call(x, model)
    moved, name = model[weight], ("fn", "norm_weight")[weight > 0]
    good = moved.data
    moved.data = torch.randn(3, 5)
    with pytest.raises(ValueError, match=name):
        call(x, model)
    moved.data = good.view(-1) if good.dim() > 1 else good[:-1]
    with pytest.raises(ValueError, match=name):
        call(x, model)
    moved.data = good
    call(x, model)


@pytest.mark.parametrize("ops,weights,call", OPS)
def test_set_storage_is_checked_again(ops, weights, call):
    x, model = streams(), weights()
    call(x, model)
    fn, good = model[0], model[0].data
    fn.set_(torch.randn(3, 5))
    with pytest.raises(ValueError, match="fn"):
        call(x, model)
    fn.set_(good)
    call(x, model)
    assert len(ops._CHECKED_PARAMS) == 1


def parameters(weights):
    return [torch.nn.Parameter(t, requires_grad=False) for t in weights()]


def engines_call(call, x, params):
    """SGLang's and vLLM's DeepSeek-V4 call: the weights' Parameters, and the norm weight as
    ``norm.weight.data``, a new tensor object on every call."""
    fn, hc_scale, hc_base, norm_weight = params
    return call(x, (fn, hc_scale, hc_base, norm_weight.data))


@pytest.mark.parametrize("ops,weights,call", OPS)
def test_the_engines_call_pattern_takes_the_remembered_check(monkeypatch, ops, weights, call):
    """After the first call, the engines' calls remember nothing more (an entry for a tensor that
    dies after the call costs more than the checks it skips) and check only the norm weight, in
    one pass: the other weights are their remembered entry."""
    x, params = streams(), parameters(weights)
    engines_call(call, x, params)
    remembered, checked = [], []
    real_remember, real_ok = CheckedParams.remember, ops._param_ok
    monkeypatch.setattr(CheckedParams, "remember",
                        lambda self, *a: remembered.append(a) or real_remember(self, *a))
    monkeypatch.setattr(ops, "_param_ok",
                        lambda t, shape, *a: checked.append(tuple(shape)) or real_ok(t, shape, *a))
    naming = parameter_checks(monkeypatch, ops) if ops is MHC_OPS else []
    for _ in range(5):
        engines_call(call, x, params)
    assert remembered == [] and naming == []
    assert checked == [(H,)] * 5
    (entry,) = ops._CHECKED_PARAMS.values()
    assert len(entry[0]) == 3 and all(ref() is p for ref, p in zip(entry[0], params, strict=False))


@pytest.mark.parametrize("ops,weights,call", OPS)
def test_a_norm_weight_reallocated_at_the_same_address_is_checked(ops, weights, call):
    """The engines' norm weight gone and new tensors made on its memory (the same address) with
    another dtype or shape: each call checks it, and refuses it naming it."""
    x, params = streams(), parameters(weights)
    for _ in range(2):
        engines_call(call, x, params)
    memory = params[3].data.untyped_storage()
    address = params[3].data_ptr()
    del params[3]
    gc.collect()
    for dtype, shape in ((torch.int32, (H,)), (torch.float32, (H // 2,)),
                         (torch.float32, (1, H))):
        impostor = torch.empty(0, dtype=dtype).set_(memory, 0, shape)
        assert impostor.data_ptr() == address
        with pytest.raises(ValueError, match="norm_weight"):
            call(x, (*params, impostor))


@pytest.mark.parametrize("ops,weights,call", OPS)
def test_a_dropped_model_called_the_engines_way_is_freed_and_forgotten(ops, weights, call):
    x, params = streams(), parameters(weights)
    for _ in range(3):
        engines_call(call, x, params)
    assert len(ops._CHECKED_PARAMS) == 1, "the remembered check is what this tests"
    alive = [weakref.ref(p) for p in params] + [weakref.ref(params[3].untyped_storage())]
    del params
    gc.collect()
    assert [ref() for ref in alive] == [None] * 5
    assert len(ops._CHECKED_PARAMS) == 0


# --- CheckedParams itself ------------------------------------------------------------------------


def test_an_entry_goes_with_the_first_of_its_tensors_to_die():
    checked = CheckedParams(4)
    a, b = torch.zeros(1), torch.zeros(1)
    checked.remember((id(a), id(b)), (a, b))
    checked.remember((id(a),), (a,))
    del b
    assert list(checked) == [(id(a),)]
    assert checked[(id(a),)][1] == (a.data_ptr(),)


def test_remembered_again_an_entry_is_the_newest_and_its_old_references_are_inert():
    checked = CheckedParams(2)
    a, b = torch.zeros(1), torch.zeros(1)
    checked.remember("a", (a,))
    checked.remember("b", (b,))
    a.data = torch.ones(2)
    checked.remember("a", (a,))  # checked again after new storage
    assert list(checked) == ["b", "a"] and checked["a"][1] == (a.data_ptr(),)
    c = torch.zeros(1)
    checked.remember("c", (c,))  # the oldest, "b", makes room
    assert list(checked) == ["a", "c"]
    del b
    assert list(checked) == ["a", "c"]


@pytest.mark.parametrize("limit", [0, -1, 1.0, True, None])
def test_limit_must_be_a_positive_int(limit):
    with pytest.raises(ValueError, match="limit"):
        CheckedParams(limit)
