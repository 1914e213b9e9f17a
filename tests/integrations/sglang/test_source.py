"""The installed SGLang's source has what the hooks assume (parsed with ``ast``, never imported)."""

import ast
import importlib.metadata
import sys

import pytest

from dsv4spec.bench.metadata import C128_FILE, PAGE_FILE
from dsv4spec.integrations.sglang import plugin
from dsv4spec.integrations.sglang.source import (
    ROOT_ENV,
    load_sglang_module,
    sglang_file,
    sglang_root,
    sglang_version,
)

from . import standins
from .standins import class_node, function_node

pytestmark = pytest.mark.skipif(sglang_root() is None, reason="SGLang's source is not installed")

FILES = {  # module of a hook target -> file inside the sglang package
    standins.POOL_MOD: standins.POOL_FILE,
    standins.NEXTN_MOD: standins.NEXTN_FILE,
    standins.DSPARK_MOD: standins.DSPARK_FILE,
    standins.TARGET_MOD: standins.TARGET_FILE,
    standins.MHC_MOD: standins.MHC_FILE,
    standins.PAGE_METADATA_MOD: PAGE_FILE,
    standins.C128_METADATA_MOD: C128_FILE,
    standins.BACKEND_MOD: standins.BACKEND_FILE,
}


def self_attributes_assigned(cls: ast.ClassDef, method: str = "__init__") -> set[str]:
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
    return {t.attr for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t0 in (n.targets if isinstance(n, ast.Assign) else [n.target])
            for t in ast.walk(t0)
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self"}


def attributes_read(fn: ast.FunctionDef) -> set[str]:
    """Dotted attribute chains read in ``fn``, e.g. ``pool.kv_score_buffer.kv_score``."""
    return {ast.unparse(n) for n in ast.walk(fn) if isinstance(n, ast.Attribute)}


def test_tested_version_is_installed():
    assert sglang_version() in plugin.SUPPORTED_SGLANG_VERSIONS


@pytest.mark.parametrize("hook", plugin.HOOKS, ids=lambda h: h.name)
def test_hook_targets_exist_with_the_parameters_the_hooks_take(hook):
    cls, _, name = hook.attr.rpartition(".")  # a method, or a module-level function
    fn = function_node(FILES[hook.module], name, cls or None)
    assert tuple(a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs) == (
        hook.params)
    assert not fn.args.vararg and not fn.args.kwarg


def test_rollback_original_reads_what_the_hook_reads():
    fn = function_node(standins.POOL_FILE, "clear_unaccepted_c128_draft_states",
                       "DeepSeekV4TokenToKVPool")
    # The hook repeats these early returns and this per-pool selection verbatim.
    first_if = next(n for n in fn.body if isinstance(n, ast.If))
    assert ast.unparse(first_if.test) == (
        "ONLINE_C128 or num_draft_tokens <= 1 or req_pool_indices.numel() == 0")
    assert isinstance(first_if.body[0], ast.Return) and first_if.body[0].value is None
    loop = next(n for n in fn.body if isinstance(n, ast.For))
    assert ast.unparse(loop.iter) == "self.compress_state_pools"
    assert ast.unparse(loop.body[0].test) == "pool is None or pool.ratio != 128"
    call = next(n for n in ast.walk(loop) if isinstance(n, ast.Call))
    assert ast.unparse(call) == (
        "clear_unaccepted_c128_draft_states(pool.kv_score_buffer.kv_score, req_pool_indices, "
        "seq_lens, accept_lens, ring_size=pool.ring_size, num_draft_tokens=num_draft_tokens)")
    assert {"self.compress_state_pools", "pool.ratio", "pool.kv_score_buffer.kv_score",
            "pool.ring_size"} <= attributes_read(fn)


def test_pool_module_names_online_c128_and_sglang_cleanup_kernel():
    tree, _ = standins.parse(standins.POOL_FILE)
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}
    assert "ONLINE_C128" in assigned
    imports = {(n.module, a.name) for n in tree.body if isinstance(n, ast.ImportFrom)
               for a in n.names}
    assert ("sglang.kernels.ops.kvcache.dsv4_c128_cleanup",
            "clear_unaccepted_c128_draft_states") in imports
    assert ("sglang.srt.mem_cache.deepseek_v4_compress_state", "CompressStatePool") in imports


def test_compress_state_pool_has_ratio_ring_size_and_kv_score_buffer():
    assert {"ratio", "ring_size"} <= self_attributes_assigned(
        class_node(standins.STATE_FILE, "CompressStatePool"))
    assert "kv_score_buffer" in self_attributes_assigned(
        class_node(standins.STATE_FILE, "CompressStatePool"), "_alloc_kv_score_buffer")
    fields = {n.target.id for n in class_node(standins.STATE_FILE, "KVAndScore").body
              if isinstance(n, ast.AnnAssign)}
    assert "kv_score" in fields


@pytest.mark.parametrize("relpath, cls, eps", [
    pytest.param(standins.NEXTN_FILE, "DeepseekV4ModelNextN", "rms_norm_eps", id="draft"),
    pytest.param(standins.TARGET_FILE, "DeepseekV4Model", "norm_eps", id="target"),
])
def test_hc_head_owners_hold_the_epsilons_the_hooks_read(relpath, cls, eps):
    assert {eps, "hc_eps"} <= self_attributes_assigned(class_node(relpath, cls))
    assert {f"self.{eps}", "self.hc_eps"} <= attributes_read(function_node(relpath, "hc_head", cls))


def test_dspark_collapse_hc_head_is_what_the_hook_replaces():
    """The DSpark hook reads the same attributes as SGLang's collapse_hc_head: DSV4.1's switch,
    the last stage's hc_head weights, and the epsilons the model takes from its config."""
    cls = class_node(standins.DSPARK_FILE, "DeepseekV4ForCausalLMDSpark")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assigned = {ast.unparse(t): ast.unparse(n.value) for n in ast.walk(init)
                if isinstance(n, ast.Assign) for t in n.targets}
    assert assigned["self.norm_eps"] == "float(config.rms_norm_eps)"
    assert assigned["self.hc_eps"] == "float(config.hc_eps)"
    assert "self.hc_pre_from_prev_sublayer" in assigned
    fn = function_node(standins.DSPARK_FILE, "collapse_hc_head", "DeepseekV4ForCausalLMDSpark")
    first = fn.body[0]
    assert isinstance(first, ast.If) and ast.unparse(first.test) == (
        "self.hc_pre_from_prev_sublayer")
    assert ast.unparse(first.body[-1]) == "return x"
    (call,) = [n for n in ast.walk(fn) if isinstance(n, ast.Call)
               and ast.unparse(n.func) == "hc_head_torch"]
    assert ast.unparse(call) == ("hc_head_torch(x, last.hc_head_fn, last.hc_head_scale, "
                                 "last.hc_head_base, norm_eps=self.norm_eps, hc_eps=self.hc_eps)")
    assert "last = self.stages[-1]" in {ast.unparse(n) for n in fn.body}
    tree, _ = standins.parse(standins.DSPARK_FILE)
    imports = {(n.module, a.name) for n in tree.body if isinstance(n, ast.ImportFrom)
               for a in n.names}
    assert (standins.TARGET_MOD, "hc_head_torch") in imports


def test_target_hc_head_calls_sglang_fused_kernel():
    fn = function_node(standins.TARGET_FILE, "hc_head", "DeepseekV4Model")
    imports = {(n.module, a.name) for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)
               for a in n.names}
    assert (standins.MHC_HEAD_MOD, "fused_hc_head") in imports


def test_files_loaded_by_path_import_nothing_from_sglang():
    for relpath in (standins.CLEANUP_FILE, standins.MHC_HEAD_FILE, standins.REGISTRY_FILE):
        tree, _ = standins.parse(relpath)
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "sglang" for n in names), (relpath, names)


def test_root_from_environment(monkeypatch, tmp_path):
    (tmp_path / "sglang" / "kernels").mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("raise RuntimeError('never executed')\n")
    (tmp_path / "sglang" / "kernels" / "probe.py").write_text("VALUE = 7\n")
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    monkeypatch.delitem(sys.modules, "_dsv4spec_test_probe", raising=False)
    assert sglang_root() == tmp_path
    assert sglang_file("kernels/probe.py") == tmp_path / "sglang" / "kernels" / "probe.py"
    assert load_sglang_module("kernels/probe.py", name="_dsv4spec_test_probe").VALUE == 7
    monkeypatch.delitem(sys.modules, "_dsv4spec_test_probe")
    with pytest.raises(FileNotFoundError):
        sglang_file("kernels/absent.py")
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "nowhere"))
    assert sglang_root() is None
    with pytest.raises(FileNotFoundError):
        sglang_file("kernels/probe.py")


def test_a_source_tree_without_metadata_gets_its_version_from_its_version_file(
        tmp_path, monkeypatch):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    monkeypatch.setenv("DSV4SPEC_SGLANG_ROOT", str(tmp_path))

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert sglang_version() is None  # no metadata, no version file, not installed
    (tmp_path / "sglang" / "_version.py").write_text(
        "version: str\n__version__ = version = '0.5.23'\n")
    assert sglang_version() == "0.5.23"
