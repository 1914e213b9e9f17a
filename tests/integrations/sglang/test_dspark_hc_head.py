"""The DSpark draft hc_head hook, installed through SGLang's registry, on SGLang's own
``DeepseekV4ForCausalLMDSpark.collapse_hc_head`` (executed from its source, calling SGLang's own
``hc_head_torch`` with the last stage's weights and the model's ``norm_eps`` and ``hc_eps``).

The rows are DSpark's: ``T = bs * N`` draft rows of ``[T, hc_mult, H]`` residual streams. The
epsilons are large and distinct (0.25 and 1.0) so a swapped or dropped epsilon fails the
comparison.
"""

import logging

import pytest
import torch

from dsv4spec.integrations.hooks import GuardedHook
from dsv4spec.integrations.sglang import hc_head as hooks
from dsv4spec.ops import hc_head_reference

from .conftest import DSPARK
from .test_guards import FAULTS, failure_records, raising
from .test_hc_head import (
    DTYPES,
    EPS,
    HC_EPS,
    NORM_EPS,
    assert_eps_used,
    assert_matches,
    make_inputs,
)

LOGGER = "dsv4spec.integrations.sglang"
N = 7  # dspark_block_size of the current DSV4 recipes


@pytest.fixture(autouse=True)
def measured_faster_everywhere(request, monkeypatch):
    """The CPU tests run ours wherever the hook may (the interpreter stands in for sm_90, whose
    tables hold no row at the tests' widths); the GPU test reads the real tables."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setattr(hooks, "dspark_prefers_dsv4spec", lambda T, H, in_graph, arch: True)


def dspark_model(sgl, params, **kwargs):
    hc_fn, hc_scale, hc_base = params
    return sgl.dspark.DeepseekV4ForCausalLMDSpark(NORM_EPS, HC_EPS, hc_fn, hc_scale, hc_base,
                                                  **kwargs)


def sglang_collapse(sgl, model, x):
    return sgl.originals[DSPARK].__wrapped__(model, x)


def installed_hook(sgl) -> GuardedHook:
    (entry,) = sgl.registry._hooks[DSPARK]
    return entry[1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bs, H", [
    pytest.param(1, 40, id="bs=1 T=7 H=40"),
    pytest.param(2, 100, id="bs=2 T=14 H=100 odd width, masked tail"),
])
def test_dspark_hook_matches_sglangs_collapse_hc_head(sgl, launches, bs, H, dtype):
    sgl.install()
    x, *params = make_inputs(bs * N, H, dtype)
    model = dspark_model(sgl, params)
    launches.clear()
    y = model.collapse_hc_head(x)
    assert sgl.originals[DSPARK].calls == 0
    assert launches, "dsv4spec's kernel ran"
    assert_matches(y, sglang_collapse(sgl, model, x), "vs SGLang's collapse_hc_head")
    assert_matches(y, hc_head_reference(x, *params, **EPS), "vs reference")
    assert_eps_used(y, (x, *params))


def test_dspark_hook_takes_the_last_stages_weights(sgl):
    sgl.install()
    x, *params = make_inputs(N, 40, torch.float32)
    model = dspark_model(sgl, params)
    other = make_inputs(N, 40, torch.float32, seed=1)[1:]
    for stage in model.stages[:-1]:  # earlier stages' weights, were they read, would differ
        stage.hc_head_fn, stage.hc_head_scale, stage.hc_head_base = other
    y = model.collapse_hc_head(x)
    assert sgl.originals[DSPARK].calls == 0
    assert_matches(y, sglang_collapse(sgl, model, x), "vs SGLang's collapse_hc_head")
    assert not torch.allclose(y, hc_head_reference(x, *other, **EPS))


def test_dsv41_dspark_steps_aside(sgl, launches):
    """DSV4.1 (``hc_pre_from_prev_sublayer``): forward() has collapsed the streams already and
    the stages hold no hc_head weights; SGLang's method returns ``x`` as it is."""
    sgl.install()
    model = sgl.dspark.DeepseekV4ForCausalLMDSpark(NORM_EPS, HC_EPS,
                                                   hc_pre_from_prev_sublayer=True)
    x = torch.randn(2 * N, 40)
    launches.clear()
    assert model.collapse_hc_head(x) is x
    assert sgl.originals[DSPARK].calls == 1 and launches == []
    assert installed_hook(sgl).enabled


def test_dspark_hook_steps_aside_when_dsv41_is_served(sgl, serves, launches):
    serves("deepseek_v41")
    sgl.install()
    x, *params = make_inputs(N, 40, torch.bfloat16)
    model = dspark_model(sgl, params)
    launches.clear()
    y = model.collapse_hc_head(x)
    assert sgl.originals[DSPARK].calls == 1 and launches == []
    assert torch.equal(y, sglang_collapse(sgl, model, x))


def test_switched_off_leaves_sglangs_collapse_hc_head(sgl, monkeypatch, launches):
    monkeypatch.setenv("DSV4SPEC_SGLANG_DSPARK_HC_HEAD", "0")
    assert DSPARK not in sgl.install()
    assert sgl.dspark.DeepseekV4ForCausalLMDSpark.collapse_hc_head is sgl.originals[DSPARK]
    x, *params = make_inputs(N, 40, torch.bfloat16)
    model = dspark_model(sgl, params)
    launches.clear()
    y = model.collapse_hc_head(x)
    assert sgl.originals[DSPARK].calls == 1 and launches == []
    assert torch.equal(y, sglang_collapse(sgl, model, x))


@pytest.mark.parametrize("make_error", FAULTS)
def test_failure_runs_sglang_for_good_with_one_warning(sgl, monkeypatch, caplog, make_error):
    calls = []
    monkeypatch.setattr(hooks, "hc_head", raising(make_error, calls))
    sgl.install()
    x, *params = make_inputs(2 * N, 40, torch.bfloat16)
    model = dspark_model(sgl, params)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first = model.collapse_hc_head(x)
        second = model.collapse_hc_head(x)
    assert calls == [1], "the op ran once, then the hook stayed off"
    assert sgl.originals[DSPARK].calls == 2
    expected = sglang_collapse(sgl, model, x)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    records = failure_records(caplog)
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert records[0].exc_info is not None and records[0].exc_info[0] is type(make_error())
    assert not installed_hook(sgl).enabled


def test_inputs_the_op_rejects_run_sglang_with_one_warning(sgl, caplog, launches):
    sgl.install()
    x, hc_fn, hc_scale, hc_base = make_inputs(N, 40, torch.bfloat16)
    model = dspark_model(sgl, (hc_fn, hc_scale.reshape(()), hc_base))  # ours wants [1]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        y = model.collapse_hc_head(x)
        launches.clear()
        model.collapse_hc_head(x)
    assert launches == [], "rejected before any launch"
    assert sgl.originals[DSPARK].calls == 2
    assert torch.equal(y, sglang_collapse(sgl, model, x))
    assert len([r for r in caplog.records if "rejected the inputs" in r.getMessage()]) == 1
    assert installed_hook(sgl).enabled


@pytest.mark.parametrize("reason", ["empty", "hc_mult=2", "torch.compile", "deterministic",
                                    "not measured faster", "beyond the precompiled range"])
def test_uncovered_calls_run_sglang(sgl, monkeypatch, launches, reason):
    T, hc = (0 if reason == "empty" else N), (2 if reason == "hc_mult=2" else 4)
    if reason == "torch.compile":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    elif reason == "deterministic":
        monkeypatch.setattr(hooks, "_deterministic", True)
    elif reason == "not measured faster":
        monkeypatch.setattr(hooks, "dspark_prefers_dsv4spec", lambda T, H, in_graph, arch: False)
    elif reason == "beyond the precompiled range":
        monkeypatch.setattr(hooks, "PRECOMPILE_MAX_TOKENS", N - 1)
    sgl.install()
    x, *params = make_inputs(T, 40, torch.bfloat16, hc=hc)
    model = dspark_model(sgl, params)
    launches.clear()
    y = model.collapse_hc_head(x)
    assert sgl.originals[DSPARK].calls == 1 and launches == []
    assert torch.equal(y, sglang_collapse(sgl, model, x))


def test_dspark_hook_asks_the_tables_with_its_size_mode_and_architecture(sgl, monkeypatch,
                                                                         launches):
    asked = []
    monkeypatch.setattr(hooks, "dspark_prefers_dsv4spec",
                        lambda T, H, in_graph, arch: asked.append((T, H, in_graph, arch)) or
                        T != 2 * N)
    sgl.install()
    _, *params = make_inputs(1, 40, torch.bfloat16)
    model = dspark_model(sgl, params)
    for bs in (1, 2):
        x = make_inputs(bs * N, 40, torch.bfloat16, seed=bs)[0]
        launches.clear()
        y = model.collapse_hc_head(x)
        assert (launches == []) == (bs == 2), f"bs={bs}"
        assert_matches(y, sglang_collapse(sgl, model, x), f"bs={bs}")
    arch = hooks.INTERPRETER_ARCHITECTURE
    assert asked == [(N, 40, False, arch), (2 * N, 40, False, arch)]
    assert sgl.originals[DSPARK].calls == 1


class OnCuda0(torch.Tensor):
    """A CPU tensor that reports device index 0, as a CUDA tensor would (the capture query is
    asked per device index; on the CPU it is never asked)."""

    def get_device(self):
        return 0


def test_first_sight_inside_a_capture_steps_aside(sgl, monkeypatch, launches):
    """Inside a capture nothing compiles: a first sight there runs SGLang's chain and decides
    nothing; the next call outside a capture compiles every variant, then runs ours."""
    capturing, compiled = [True], []
    monkeypatch.setattr(hooks, "stream_capturing", lambda index: capturing[0])
    monkeypatch.setattr(hooks, "gpu_architecture", lambda index: (9, 0))
    monkeypatch.setattr(hooks, "precompile_hc_head",
                        lambda H, dtype, index, logger: compiled.append((H, dtype, index)))
    sgl.install()
    x, *params = make_inputs(2 * N, 40, torch.bfloat16)
    model = dspark_model(sgl, params)
    launches.clear()
    y = model.collapse_hc_head(x.as_subclass(OnCuda0))
    assert sgl.originals[DSPARK].calls == 1 and launches == [] and compiled == []
    assert hooks._ready == {}, "decided nothing inside the capture"
    assert torch.equal(y.as_subclass(torch.Tensor), sglang_collapse(sgl, model, x))
    capturing[0] = False
    real = hooks.hc_head  # the kernel itself runs on the CPU tensor (the interpreter's device)
    monkeypatch.setattr(hooks, "hc_head",
                        lambda x, *args, **kwargs: real(x.as_subclass(torch.Tensor), *args,
                                                        **kwargs))
    y = model.collapse_hc_head(x.as_subclass(OnCuda0))
    assert compiled == [(40, torch.bfloat16, 0)]
    assert hooks._ready == {(0, 40, torch.bfloat16): (9, 0)}
    assert sgl.originals[DSPARK].calls == 1 and launches, "ours, once compiled"
    assert_matches(y, sglang_collapse(sgl, model, x), "vs SGLang's collapse_hc_head")


@pytest.mark.gpu
@pytest.mark.parametrize("H", [4096, 7168])
def test_gpu_dspark_hook_under_sglangs_capture_pattern(sgl, H):
    """SGLang's draft graph capture (full_cuda_graph_backend.capture_one): per batch size, two
    eager runs of the forward with its tail (the folded proposal calls collapse_hc_head), then
    the capture. Every captured T = bs * N runs ours; replays with new x equal SGLang's chain
    within bf16 rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    sgl.install()
    _, *params = make_inputs(1, H, torch.bfloat16)
    model = dspark_model(sgl, params)
    for bs in (1, 8, 64):
        x = make_inputs(bs * N, H, torch.bfloat16)[0]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # the warm-ups
                model.collapse_hc_head(x)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                y = model.collapse_hc_head(x)
        torch.cuda.current_stream().wait_stream(stream)
        assert sgl.originals[DSPARK].calls == 0, f"bs={bs}: SGLang's chain ran"
        for seed in (1, 2):
            x.copy_(make_inputs(bs * N, H, torch.bfloat16, seed=seed)[0])
            graph.replay()
            torch.cuda.synchronize()
            assert_matches(y, sglang_collapse(sgl, model, x), f"bs={bs} replay {seed}")
    assert installed_hook(sgl).enabled
