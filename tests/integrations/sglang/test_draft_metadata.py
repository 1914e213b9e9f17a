"""The draft-decode metadata hook: SGLang's source pinned to the argument that the last step's
in-graph metadata is never read, and the hook through SGLang's own hook registry on a stand-in
multi-step backend carrying SGLang's own capture/replay methods (``standins.draft_backend_module``),
driven in the order SGLang's EAGLE draft runner drives them."""

import ast
import logging
import sys
import types

import pytest
import torch

from dsv4spec.integrations.hooks import GuardedHook, Hook, switch_on
from dsv4spec.integrations.sglang import draft_metadata, plugin, served_model
from dsv4spec.integrations.sglang.source import load_sglang_module, sglang_root

from . import standins
from .standins import BACKEND_FILE, MULTI_STEP, class_node, function_node

LOGGER = "dsv4spec.integrations.sglang"
SWITCH = "DSV4SPEC_SGLANG_METADATA"
TARGET = f"{standins.BACKEND_MOD}.{draft_metadata.TARGET_ATTR}"
RUNNER_FILE = "srt/speculative/eagle_draft_cuda_graph_runner.py"
WORKER_FILE = "srt/speculative/eagle_worker_v2.py"
STANDALONE_FILE = "srt/speculative/standalone_worker_v2.py"
DRAFT_UTILS_FILE = "srt/speculative/draft_utils.py"
DECODE_RUNNER_FILE = "srt/model_executor/runner/decode_cuda_graph_runner.py"
TRTLLM_FILE = "srt/layers/attention/deepseek_v4_trtllm_backend.py"
IN_GRAPH = "init_forward_metadata_in_graph"


def _is_sglang(name):
    return name == "sglang" or name.startswith("sglang.")


def _hook_entry():
    """plugin.py's entry for the target where present, else the entry it is to carry."""
    for hook in plugin.HOOKS:
        if hook.target == TARGET:
            return hook
    return Hook("DSV4 draft-decode metadata", SWITCH, standins.BACKEND_MOD,
                draft_metadata.TARGET_ATTR, draft_metadata.TARGET_PARAMS,
                draft_metadata.make_draft_metadata_hook)


def set_configured_steps(steps):
    spec = types.SimpleNamespace(speculative_num_steps=steps)
    sys.modules[standins.RUNTIME_CONTEXT_MOD].get_spec = lambda: spec


@pytest.fixture
def fake(monkeypatch):
    """SGLang's hook registry (its own file), the stand-in backend module and a runtime context
    publishing speculative_num_steps; ``fake.install()`` registers the hook and applies it."""
    if sglang_root() is None:
        pytest.skip("SGLang's source is not installed")
    monkeypatch.delenv(SWITCH, raising=False)
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if _is_sglang(name)}
    try:
        standins.install_packages()
        registry = load_sglang_module(standins.REGISTRY_FILE, name=standins.REGISTRY_MOD)
        standins.add_module(standins.REGISTRY_MOD, registry)
        registry.HookRegistry.reset()
        context = standins.add_module(standins.RUNTIME_CONTEXT_MOD,
                                      types.ModuleType(standins.RUNTIME_CONTEXT_MOD))
        standins.serve_model(context)  # DeepSeek-V4, as SGLang's context reports it
        monkeypatch.setattr(served_model, "_verdicts", {})
        module = standins.add_module(standins.BACKEND_MOD, standins.draft_backend_module())
        original = module.DeepseekV4MultiStepBackend.init_forward_metadata_in_graph
        hook = _hook_entry()

        def install():
            if switch_on(hook.switch):
                registry.HookRegistry.register(hook.target, hook.make(hook.resolve()),
                                               registry.HookType.AROUND)
            registry.HookRegistry.apply_hooks()

        yield types.SimpleNamespace(module=module, registry=registry, original=original,
                                    install=install)
        registry.HookRegistry.reset()
    finally:
        for name in [name for name in sys.modules if _is_sglang(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


def capture_batch(module, bs, topk, num_steps, seed=0):
    """What EAGLEDraftCudaGraphRunner.capture_one_shape hands the backend (DECODE, out_cache_loc
    of bs * topk * num_steps slots)."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, 1 << 16, (bs,), generator=g)
    return types.SimpleNamespace(
        batch_size=bs, forward_mode=module.ForwardMode.DECODE,
        req_pool_indices=torch.randperm(bs * 3, generator=g)[:bs], seq_lens=seq_lens,
        seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens.clone(),
        out_cache_loc=torch.randperm(bs * topk * num_steps * 2, generator=g)[:bs * topk
                                                                              * num_steps],
        positions=torch.zeros(bs * topk, dtype=torch.int64), spec_info=None)


def capture_and_replay(module, backend, fb, replay_fb):
    """SGLang's draft runner on one batch size: capture (run_once = the in-graph build, warm-up,
    post-warm-up, capture), then a replay's metadata refresh; returns the metadata the draft loop
    reads (steps 0 .. n-2) after the capture."""
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    backend.init_forward_metadata_in_graph(fb)  # warm-up run_once
    backend.on_after_cuda_graph_warmup()
    backend.init_forward_metadata_in_graph(fb)  # captured run_once
    read = [(step.forward_metadata, step.tail_forward_metadata)
            for step in backend.attn_backends[:-1]]
    backend.init_forward_metadata_out_graph(replay_fb)  # execute(): the replay's refresh
    return read


def state(read):
    """The tensors the draft loop reads, by step: the full metadata's fields and the tail."""
    out = []
    for metadata, tail in read:
        core = metadata.core_attn_metadata
        out.append((type(metadata).__name__, core.page_table, core.raw_out_loc,
                    core.swa_out_cache_loc, metadata.low_ratio_req_indices, tail))
    return out


def assert_same_state(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            if isinstance(u, torch.Tensor):
                assert u.dtype == v.dtype and torch.equal(u, v)
            else:
                assert u == v


def sglang_run(fake, topk, num_steps, bs, seed=0):
    """SGLang's own method (unhooked) through the same sequence."""
    module = fake.module
    backend = module.DeepseekV4MultiStepBackend(topk, num_steps)
    module.upgrades.clear()
    fb, replay = (capture_batch(module, bs, topk, num_steps, seed),
                  capture_batch(module, bs, topk, num_steps, seed + 1))
    read = [(m, t) for m, t in _call_original(fake, backend, fb, replay)]
    return backend, read, [step for step, _ in module.upgrades]


def _call_original(fake, backend, fb, replay):
    hooked = type(backend).init_forward_metadata_in_graph
    type(backend).init_forward_metadata_in_graph = fake.original
    try:
        return capture_and_replay(fake.module, backend, fb, replay)
    finally:
        type(backend).init_forward_metadata_in_graph = hooked


# --- the argument, pinned to SGLang's source ---------------------------------------------------

def _calls(node, attr):
    return [c for c in ast.walk(node) if isinstance(c, ast.Call)
            and isinstance(c.func, ast.Attribute) and c.func.attr == attr]


def test_sglang_multi_step_method_builds_every_step():
    method = function_node(BACKEND_FILE, IN_GRAPH, MULTI_STEP)
    assert [a.arg for a in method.args.args] == list(draft_metadata.TARGET_PARAMS)
    (loop,) = method.body
    assert isinstance(loop, ast.For) and ast.unparse(loop.iter) == "self.attn_backends"
    assert [ast.unparse(c) for c in _calls(loop, IN_GRAPH)] == [
        "attn_backend.init_forward_metadata_in_graph(forward_batch)"]


def test_the_only_sglang_caller_is_the_eagle_draft_runner():
    """Every call of init_forward_metadata_in_graph on a multi-step draft backend in SGLang's
    srt tree: the EAGLE draft runner's run_once. The other callers hold other backends."""
    root = sglang_root() / "sglang" / "srt"
    callers = {}
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        if IN_GRAPH not in text:
            continue
        for call in _calls(ast.parse(text), IN_GRAPH):
            rel = str(path.relative_to(root.parent))
            callers.setdefault(rel, []).append(ast.unparse(call.func.value))
    # the multi-step object is only ever called 'draft_attn_backend'
    multi = {rel: sorted(set(v)) for rel, v in callers.items()
             if any("draft_attn_backend" == name.split(".")[-1] for name in v)}
    assert multi == {RUNNER_FILE: ["self.draft_attn_backend"],
                     "srt/speculative/frozen_kv_mtp_cuda_graph_runner.py":
                         ["self.draft_attn_backend"]}
    # frozen-KV MTP's draft backend is the runner's own (topk 1) or triton / trtllm_mha
    init = function_node("srt/speculative/frozen_kv_mtp_worker_v2.py",
                         "_init_draft_attn_backend", "FrozenKVMTPDraftWorker")
    assert "DeepseekV4" not in ast.unparse(init)
    # the EAGLE runner: run_once builds the metadata, then runs the worker's draft_forward
    run_once = next(n for n in ast.walk(function_node(RUNNER_FILE, "capture_one_shape",
                                                      "EAGLEDraftCudaGraphRunner"))
                    if isinstance(n, ast.FunctionDef) and n.name == "run_once")
    calls = [ast.unparse(c.func) for c in ast.walk(run_once) if isinstance(c, ast.Call)]
    assert calls.index("self.draft_attn_backend.init_forward_metadata_in_graph") < calls.index(
        "self.eagle_worker.draft_forward")
    # DecodeCudaGraphRunner's in-graph prep is reached from its capture_one_shape, which the
    # EAGLE runner overrides
    assert function_node(RUNNER_FILE, "capture_one_shape", "EAGLEDraftCudaGraphRunner")
    prep = [n.name for n in class_node(DECODE_RUNNER_FILE, "DecodeCudaGraphRunner").body
            if isinstance(n, ast.FunctionDef)
            and _calls(n, "_run_in_graph_metadata_prep")]
    assert prep == ["capture_one_shape"]


def test_sglang_draft_loop_never_runs_the_last_step():
    loop = function_node(WORKER_FILE, "draft_forward", "EagleDraftWorker")
    (for_loop,) = [n for n in ast.walk(loop) if isinstance(n, ast.For)
                   and ast.unparse(n.iter) == "range(self.speculative_num_steps)"]
    body = for_loop.body
    breaks = [i for i, s in enumerate(body) if isinstance(s, ast.If)
              and ast.unparse(s.test) == "i == self.speculative_num_steps - 1"
              and isinstance(s.body[0], ast.Break)]
    reads = [i for i, s in enumerate(body)
             if "self.draft_attn_backend.attn_backends[i]" in ast.unparse(s)]
    assert len(breaks) == 1 and reads and min(reads) > breaks[0]
    idle = function_node(WORKER_FILE, "_draft_forward_idle", "EagleDraftWorker")
    (idle_loop,) = [n for n in ast.walk(idle) if isinstance(n, ast.For)]
    assert ast.unparse(idle_loop.iter) == "range(self.speculative_num_steps - 1)"
    # the standalone worker inherits draft_forward
    assert "draft_forward" not in {n.name for n in class_node(
        STANDALONE_FILE, "StandaloneDraftWorker").body if isinstance(n, ast.FunctionDef)}
    # no multi-step draft backend for one step
    create = function_node(DRAFT_UTILS_FILE, "create_decode_backend", "DraftBackendFactory")
    first = create.body[0]
    assert ast.unparse(first.test) == "self.speculative_num_steps <= 1"
    assert ast.unparse(first.body[0]) == "return None"


def test_sglang_replay_and_eager_paths_skip_the_last_step():
    out_graph = function_node(BACKEND_FILE, "init_forward_metadata_out_graph", MULTI_STEP)
    text = ast.unparse(out_graph)
    assert "range(1, self.speculative_num_steps - 1)" in text
    assert "self.attn_backends[0].init_forward_metadata_out_graph(inner_fb)" in text
    eager = function_node(BACKEND_FILE, "init_forward_metadata", MULTI_STEP)
    assert "range(self.speculative_num_steps - 1)" in ast.unparse(eager)
    # the trtllm multi-step class only changes the step class
    trtllm = class_node(TRTLLM_FILE, "DeepseekV4TrtllmMultiStepBackend")
    assert [n.name for n in trtllm.body if isinstance(n, ast.FunctionDef)] == [
        "_make_step_backend"]
    assert IN_GRAPH not in {n.name for n in class_node(TRTLLM_FILE,
                                                       "DeepseekV4TrtllmAttnBackend").body
                            if isinstance(n, ast.FunctionDef)}


def test_sglang_step_build_writes_only_its_own_backend():
    """The step-level in-graph build assigns only to self.* attributes and to the metadata
    object it holds; it never assigns to the batch."""
    method = function_node(BACKEND_FILE, IN_GRAPH, "DeepseekV4AttnBackend")
    targets = set()
    for node in ast.walk(method):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                targets.add(ast.unparse(t).split(".")[0].split("[")[0])
    assert targets <= {"self", "metadata", "core", "out_cache_loc", "block_size",
                       "seq_lens_casual", "req_pool_indices_repeated", "swa_page_indices",
                       "swa_topk_lengths", "(swa_page_indices, swa_topk_lengths)"}, targets
    assert "forward_batch" not in {t.split(".")[0] for t in targets}


# --- the hook through SGLang's registry --------------------------------------------------------

def test_registry_installs_the_guarded_hook(fake):
    set_configured_steps(3)
    fake.install()
    cls = fake.module.DeepseekV4MultiStepBackend
    assert cls.init_forward_metadata_in_graph.__wrapped__ is fake.original
    (entry,) = fake.registry.HookRegistry._hooks[TARGET]
    assert isinstance(entry[1], GuardedHook)


@pytest.mark.parametrize("topk,num_steps,bs", [(1, 2, 1), (1, 3, 4), (1, 5, 7), (4, 3, 2),
                                               (8, 4, 3)])
def test_hooked_builds_steps_before_the_last_with_sglang_state(fake, topk, num_steps, bs):
    set_configured_steps(num_steps)
    _, expected, sglang_steps = sglang_run(fake, topk, num_steps, bs)
    # SGLang's own: every step, twice (warm-up and capture)
    assert sglang_steps == list(range(num_steps)) * 2
    fake.install()
    module = fake.module
    backend = module.DeepseekV4MultiStepBackend(topk, num_steps)
    module.upgrades.clear()
    read = capture_and_replay(module, backend, capture_batch(module, bs, topk, num_steps),
                              capture_batch(module, bs, topk, num_steps, 1))
    assert [step for step, _ in module.upgrades] == list(range(num_steps - 1)) * 2
    assert_same_state(state(read), state(expected))
    # the last step keeps the raw metadata its capture-time refresh gave it
    last = backend.attn_backends[-1]
    bucket = last.cuda_graph_metadata_of_bucket_and_bs[module._GraphBucket.DECODE_OR_IDLE]
    assert isinstance(last.forward_metadata, module.DSV4RawDecodeMetadata)
    assert last.forward_metadata is bucket[bs] is last._current_capture_raw


def test_later_sglang_calls_run_on_the_state_the_hook_leaves(fake):
    """Another batch size's capture, replays (live and idle), warm-up hooks, the eager path:
    SGLang's own methods, after the hook, as SGLang orders them."""
    set_configured_steps(3)
    fake.install()
    module = fake.module
    backend = module.DeepseekV4MultiStepBackend(1, 3)
    for bs in (4, 2):
        capture_and_replay(module, backend, capture_batch(module, bs, 1, 3),
                           capture_batch(module, bs, 1, 3, 5))
    idle = capture_batch(module, 2, 1, 3, 9)
    idle.actual_forward_mode = module.ForwardMode.IDLE
    backend.init_forward_metadata_out_graph(idle)
    backend.on_after_cuda_graph_warmup()
    bucket = module._GraphBucket.DECODE_OR_IDLE
    assert set(backend.attn_backends[-1].cuda_graph_metadata_of_bucket_and_bs[bucket]) == {4, 2}


def test_switch_off_keeps_sglang(fake, monkeypatch):
    monkeypatch.setenv(SWITCH, "0")
    set_configured_steps(3)
    fake.install()
    module = fake.module
    assert module.DeepseekV4MultiStepBackend.init_forward_metadata_in_graph is fake.original
    backend = module.DeepseekV4MultiStepBackend(1, 3)
    module.upgrades.clear()
    capture_and_replay(module, backend, capture_batch(module, 2, 1, 3),
                       capture_batch(module, 2, 1, 3, 1))
    assert [step for step, _ in module.upgrades] == [0, 1, 2] * 2


def test_a_fault_in_ours_falls_back_once_and_switches_off(fake, monkeypatch, caplog):
    set_configured_steps(3)
    fake.install()
    module = fake.module
    calls = []

    def broken(backend, forward_batch):
        calls.append(1)
        raise RuntimeError("boom")

    monkeypatch.setattr(draft_metadata, "steps_the_draft_loop_reads", broken)
    _, expected, _ = sglang_run(fake, 1, 3, 2)
    backend = module.DeepseekV4MultiStepBackend(1, 3)
    module.upgrades.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        read = capture_and_replay(module, backend, capture_batch(module, 2, 1, 3),
                                  capture_batch(module, 2, 1, 3, 1))
    assert calls == [1]  # off after the first fault
    assert [step for step, _ in module.upgrades] == [0, 1, 2] * 2
    assert_same_state(state(read), state(expected))
    warnings = [r for r in caplog.records if r.name == LOGGER and "RuntimeError: boom" in
                r.getMessage()]
    assert len(warnings) == 1


def test_sglang_exception_in_a_step_build_propagates_untouched(fake, caplog):
    """A step's build is SGLang's own code: its exception reaches SGLang's caller as it would
    from SGLang's method, without the steps being built again by SGLang's method and without
    switching the hook off."""
    set_configured_steps(3)
    fake.install()
    module = fake.module
    backend = module.DeepseekV4MultiStepBackend(1, 3)
    fb = capture_batch(module, 2, 1, 3)
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    failing = backend.attn_backends[1]

    def sglang_fails(forward_batch):
        raise RuntimeError("SGLang's own error")

    failing.init_forward_metadata_in_graph = sglang_fails
    module.upgrades.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        with pytest.raises(RuntimeError, match="SGLang's own error"):
            backend.init_forward_metadata_in_graph(fb)
    assert [step for step, _ in module.upgrades] == [0], "step 0 once, nothing re-run"
    hook = fake.registry.HookRegistry._hooks[TARGET][0][1]
    assert hook.enabled and not [r for r in caplog.records if r.name == LOGGER]


def test_other_models_keep_sglang_method(fake):
    set_configured_steps(3)
    standins.serve_model(sys.modules[standins.RUNTIME_CONTEXT_MOD], "deepseek_v41")
    fake.install()
    module = fake.module
    backend = module.DeepseekV4MultiStepBackend(1, 3)
    fb = capture_batch(module, 2, 1, 3)
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    module.upgrades.clear()
    backend.init_forward_metadata_in_graph(fb)
    assert [step for step, _ in module.upgrades] == [0, 1, 2]


def _one_step(fake):
    set_configured_steps(1)
    return fake.module.DeepseekV4MultiStepBackend(1, 1), {}


def _configured_differently(fake):
    set_configured_steps(4)
    return fake.module.DeepseekV4MultiStepBackend(1, 3), {}


def _nothing_configured(fake):
    vars(sys.modules[standins.RUNTIME_CONTEXT_MOD]).pop("get_spec", None)
    return fake.module.DeepseekV4MultiStepBackend(1, 3), {}


def _unknown_subclass(fake):
    set_configured_steps(3)

    class Other(fake.module.DeepseekV4MultiStepBackend):
        pass

    Other.__module__ = standins.BACKEND_MOD
    return Other(1, 3), {}


def _step_out_of_order(fake):
    set_configured_steps(3)
    backend = fake.module.DeepseekV4MultiStepBackend(1, 3)
    first, second = backend.attn_backends[:2]
    first.speculative_step_id, second.speculative_step_id = 1, 0
    return backend, {}


def _not_decode(fake):
    set_configured_steps(3)
    return (fake.module.DeepseekV4MultiStepBackend(1, 3),
            {"forward_mode": fake.module.ForwardMode.IDLE})


def _out_of_tree_platform(fake):
    set_configured_steps(3)
    platforms = standins.add_module(draft_metadata.PLATFORMS_MODULE,
                                    types.ModuleType(draft_metadata.PLATFORMS_MODULE))
    platforms.current_platform = types.SimpleNamespace(is_out_of_tree=lambda: True)
    return fake.module.DeepseekV4MultiStepBackend(1, 3), {}


def _unreadable_platform(fake):
    set_configured_steps(3)
    standins.add_module(draft_metadata.PLATFORMS_MODULE,
                        types.ModuleType(draft_metadata.PLATFORMS_MODULE))
    return fake.module.DeepseekV4MultiStepBackend(1, 3), {}


@pytest.mark.parametrize("case", [
    pytest.param(_one_step, id="one step"),
    pytest.param(_configured_differently, id="worker steps differ"),
    pytest.param(_nothing_configured, id="no runtime configuration"),
    pytest.param(_unknown_subclass, id="unknown multi-step class"),
    pytest.param(_step_out_of_order, id="step ids out of order"),
    pytest.param(_not_decode, id="not a decode batch"),
    pytest.param(_out_of_tree_platform, id="out-of-tree platform"),
    pytest.param(_unreadable_platform, id="platform unreadable"),
])
def test_uncovered_calls_step_aside(fake, case):
    fake.install()
    backend, batch_fields = case(fake)
    n = backend.speculative_num_steps
    fb = capture_batch(fake.module, 2, 1, n)
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    for name, value in batch_fields.items():
        setattr(fb, name, value)
    fake.module.upgrades.clear()
    if "forward_mode" in batch_fields:  # SGLang's step build on a non-decode batch: its own
        sglang_error = None
        try:
            fake.original(backend, fb)
        except Exception as e:  # noqa: BLE001
            sglang_error = type(e)
        fake.module.upgrades.clear()
        backend.init_forward_metadata_out_graph(capture_batch(fake.module, 2, 1, n),
                                                in_capture=True)
        if sglang_error is not None:
            with pytest.raises(sglang_error):
                backend.init_forward_metadata_in_graph(fb)
            return
    backend.init_forward_metadata_in_graph(fb)
    assert sorted(step for step, _ in fake.module.upgrades) == list(range(n))
    hook = fake.registry.HookRegistry._hooks[TARGET][0][1]
    assert hook.enabled
