"""Structural checks on each supported vLLM's own source (parsed, never imported): every mHC /
hc_head call of the NVIDIA DeepSeek-V4 modules resolves, at call time, to a name the plugin
replaces (or to one it lists as not hooked), directly or through a local name assigned only
from such names, with arguments that bind to the hook's parameters; the defaults the hooks rely
on (CUDA graphs by stream capture, the plugin group) are vLLM's."""

import ast
import inspect
import sys
from pathlib import Path

import pytest

from dsv4spec.integrations.vllm import plugin
from dsv4spec.integrations.vllm.source import vllm_file

from .standins import MODEL_FILES

ROOT = Path(__file__).resolve().parents[3]
HOOKED = {hook.attr: hook for hook in plugin.HOOKS}
KERNEL_NAMES = set(HOOKED) | set(plugin.NOT_HOOKED)
# Every call of those names in the NVIDIA model modules, per vLLM version: (module, line, name,
# enclosing function); a call through a local alias counts once per name the alias may hold.
CALL_SITES = {"0.33.0": [
    ("model", 730, "mhc_pre_broadcast_tilelang", "DeepseekV4DecoderLayer.forward"),
    ("model", 746, "mhc_pre_tilelang", "DeepseekV4DecoderLayer.forward"),
    ("model", 760, "mhc_fused_post_pre_tilelang", "DeepseekV4DecoderLayer.forward"),
    ("model", 788, "mhc_fused_post_pre_tilelang", "DeepseekV4DecoderLayer.forward"),
    ("model", 1008, "mhc_post_tilelang", "DeepseekV4Model.forward"),
    ("model", 1021, "mhc_post_tilelang", "DeepseekV4Model.forward"),
    ("model", 1040, "hc_head_fused_kernel_tilelang", "DeepseekV4Model.forward"),
    ("mtp", 204, "mhc_post_tilelang", "DeepSeekV4MultiTokenPredictorLayer.forward"),
    ("mtp", 286, "hc_head_fused_kernel_tilelang", "DeepSeekV4MultiTokenPredictor.compute_logits"),
    ("dspark", 266, "mhc_post_tilelang", "DSparkDeepseekV4Model.forward"),
    ("dspark", 270, "hc_head_fused_kernel_tilelang", "DSparkDeepseekV4Model.forward"),
], "0.34.0": [
    ("model", 741, "mhc_pre_broadcast_tilelang", "DeepseekV4DecoderLayer.forward"),
    ("model", 758, "mhc_pre_tilelang", "DeepseekV4DecoderLayer.forward"),
    # fused_post_pre: mhc_fused_post_pre_tilelang_reuse_residual where the caller hands its
    # residual over (DeepseekV4Model.forward, every layer), else mhc_fused_post_pre_tilelang
    # (the MTP block, DSpark's layers, a first layer that starts from residual = x)
    ("model", 772, "mhc_fused_post_pre_tilelang", "DeepseekV4DecoderLayer.forward"),
    ("model", 772, "mhc_fused_post_pre_tilelang_reuse_residual",
     "DeepseekV4DecoderLayer.forward"),
    ("model", 800, "mhc_fused_post_pre_tilelang", "DeepseekV4DecoderLayer.forward"),
    ("model", 800, "mhc_fused_post_pre_tilelang_reuse_residual",
     "DeepseekV4DecoderLayer.forward"),
    ("model", 1018, "mhc_post_tilelang", "DeepseekV4Model.forward"),
    ("model", 1031, "mhc_post_tilelang", "DeepseekV4Model.forward"),
    ("model", 1050, "hc_head_fused_kernel_tilelang", "DeepseekV4Model.forward"),
    ("mtp", 201, "mhc_post_tilelang", "DeepSeekV4MultiTokenPredictorLayer.forward"),
    ("mtp", 283, "hc_head_fused_kernel_tilelang", "DeepSeekV4MultiTokenPredictor.compute_logits"),
    ("dspark", 266, "mhc_post_tilelang", "DSparkDeepseekV4Model.forward"),
    ("dspark", 270, "hc_head_fused_kernel_tilelang", "DSparkDeepseekV4Model.forward"),
]}


# Hooked functions a version does not define yet.
NEW_IN = {"0.33.0": ("mhc_fused_post_pre_reuse_residual",)}


def test_the_versions_without_a_hooked_function_do_not_define_it(vllm_source):
    defined = {n.name for n in tree("model_executor/kernels/mhc/tilelang.py").body
               if isinstance(n, ast.FunctionDef)}
    assert {h.name for h in plugin.HOOKS if h.attr not in defined} == set(
        NEW_IN.get(vllm_source, ()))


def tree(relpath):
    return ast.parse(vllm_file(relpath).read_text())


def short(module):
    return module.rsplit(".", 1)[1]


def kernel_names(value):
    """The kernel names an expression may evaluate to, if it is a kernel name or a conditional
    between such expressions; None otherwise."""
    if isinstance(value, ast.Name):
        return {value.id} if value.id in KERNEL_NAMES else None
    if isinstance(value, ast.IfExp):
        body, orelse = kernel_names(value.body), kernel_names(value.orelse)
        return None if body is None or orelse is None else body | orelse
    return None


def aliases(function):
    """Local name -> the kernel names ``function`` assigns to it (every assignment to it)."""
    assigned = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            names = kernel_names(node.value)
            for target in node.targets:
                if isinstance(target, ast.Name) and names is not None:
                    assigned.setdefault(target.id, set()).update(names)
    return assigned


def calls(module_tree):
    """(line, name, enclosing qualname, call) of every call of a kernel name, directly or
    through a local alias (once per name the alias may hold)."""
    found = []

    def visit(node, scope, local):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = aliases(child) if not isinstance(child, ast.ClassDef) else {}
                visit(child, [*scope, child.name], inner)
                continue
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name):
                if child.func.id in KERNEL_NAMES:
                    found.append((child.lineno, child.func.id, ".".join(scope), child))
                for name in sorted(local.get(child.func.id, ())):
                    found.append((child.lineno, name, ".".join(scope), child))
            visit(child, scope, local)

    visit(module_tree, [], {})
    return found


def bindings(module_tree):
    """Every name the module binds anywhere other than its module-level imports of the
    kernels module: assignments, parameters, other imports, definitions, globals."""
    bound = set()
    for node in ast.walk(module_tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Global):
            bound.update(node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if not (isinstance(node, ast.ImportFrom) and node.module == plugin.KERNELS_MODULE
                    and node in module_tree.body):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return bound


def test_the_call_sites_are_the_pinned_ones(vllm_source):
    found = []
    for module, relpath in MODEL_FILES.items():
        found += [(short(module), line, name, scope)
                  for line, name, scope, _ in calls(tree(relpath))]
    assert sorted(found) == sorted(CALL_SITES[vllm_source])


def test_every_alias_of_a_kernel_name_holds_kernel_names_only():
    """A local name a kernel name is assigned to (0.34.0's ``fused_post_pre``) is assigned
    nothing else anywhere in its function, is never a parameter, and is read from the module's
    globals when assigned, in the same call: the replaced names reach its calls too."""
    for relpath in MODEL_FILES.values():
        for function in ast.walk(tree(relpath)):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            local = aliases(function)
            params = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
            assert not set(local) & params
            for node in ast.walk(function):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) \
                        and node.id in local:
                    parent = next(a for a in ast.walk(function) if isinstance(a, ast.Assign)
                                  and node in a.targets)
                    assert kernel_names(parent.value) is not None, \
                        f"{relpath}:{node.lineno}: {node.id} assigned a non-kernel value"


@pytest.mark.parametrize("module", plugin.MODEL_MODULES, ids=short)
def test_each_called_name_is_a_module_level_import_never_rebound(module):
    """A call looks the name up in the module's globals when it runs, so replacing the module
    attribute reaches every call site; nothing else in the module may bind the name."""
    t = tree(MODEL_FILES[module])
    imported = {}
    for node in t.body:
        if isinstance(node, ast.ImportFrom) and node.module == plugin.KERNELS_MODULE:
            for alias in node.names:
                assert alias.asname is None, f"{alias.name} imported as {alias.asname}"
                imported[alias.name] = node.lineno
    called = {name for _, name, _, _ in calls(t)}
    assert called <= set(imported), "every called kernel name is imported at module level"
    assert not called & bindings(t), "no kernel name is bound anywhere else in the module"
    assert all(scope for _, _, scope, _ in calls(t)), "every call runs inside a function"
    hooked_here = {hook.attr for hook in plugin.HOOKS if module in plugin.BOUND_IN[hook.name]}
    assert hooked_here & set(imported) == called & set(HOOKED), "the plugin patches exactly " \
        "the hooked names this module calls"
    assert set(imported) - called - set(plugin.NOT_HOOKED) == set()


def _function_params(name):
    for node in tree("model_executor/kernels/mhc/tilelang.py").body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            a = node.args
            assert not a.vararg and not a.kwarg and not a.kwonlyargs
            return tuple(arg.arg for arg in a.posonlyargs + a.args), node
    raise AssertionError(f"{name} not defined in tilelang.py")


@pytest.mark.parametrize("hook", plugin.HOOKS, ids=lambda h: h.name)
def test_hook_parameters_are_vllms(hook, vllm_source):
    if hook.name in NEW_IN.get(vllm_source, ()):
        pytest.skip(f"{hook.attr} is not in vLLM {vllm_source}")
    params, _ = _function_params(hook.attr)
    assert params == hook.params
    fast = plugin.fast_path(hook.name)
    assert tuple(inspect.signature(fast).parameters) == params, "same names, same order"
    defaults = {k: v.default for k, v in inspect.signature(fast).parameters.items()
                if v.default is not inspect.Parameter.empty}
    _, node = _function_params(hook.attr)
    vllm_defaults = dict(zip(params[len(params) - len(node.args.defaults):],
                             (ast.literal_eval(d) for d in node.args.defaults)))
    assert defaults == vllm_defaults


@pytest.mark.parametrize("site", sorted({s for sites in CALL_SITES.values() for s in sites
                                          if s[2] in HOOKED}),
                         ids=lambda s: f"{s[0]}:{s[1]}:{s[2]}")
def test_each_call_binds_to_the_hooks_parameters(site, vllm_source):
    if site not in CALL_SITES[vllm_source]:
        pytest.skip(f"not a call site of vLLM {vllm_source}")
    module, line, name, _ = site
    call = next(c for ln, n, _, c in calls(tree(MODEL_FILES[f"vllm.models.deepseek_v4.nvidia."
                                                            f"{module}"]))
                if ln == line and n == name)
    assert not any(isinstance(a, ast.Starred) for a in call.args)
    assert all(k.arg is not None for k in call.keywords)
    params = inspect.Signature([inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                for p in HOOKED[name].params])
    params.bind_partial(*call.args, **{k.arg: k.value for k in call.keywords})
    required = HOOKED[name].params[:len(HOOKED[name].params) - len(
        _function_params(name)[1].args.defaults)]
    supplied = set(HOOKED[name].params[:len(call.args)]) | {k.arg for k in call.keywords}
    assert set(required) <= supplied


def test_only_the_nvidia_modules_call_the_tilelang_functions():
    """The other platforms' DeepSeek-V4 modules (AMD, XPU, CPU) and the shared ones do not
    import the TileLang functions: they keep their own kernels, untouched by the plugin."""
    root = vllm_file("models/deepseek_v4/__init__.py").parent
    importers = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and "kernels.mhc" in node.module:
                if node.module == plugin.KERNELS_MODULE or any(
                        a.name == "tilelang" for a in node.names):
                    importers.add(path.relative_to(root.parent.parent).as_posix())
            if isinstance(node, ast.Import) and any("kernels.mhc.tilelang" in a.name
                                                     for a in node.names):
                importers.add(path.relative_to(root.parent.parent).as_posix())
    assert importers == set(MODEL_FILES.values())


@pytest.mark.parametrize("draft", ["mtp", "dspark"])
def test_the_drafts_layers_are_the_targets_decoder_layer(draft):
    """The MTP block and DSpark's layers are model.py's DeepseekV4DecoderLayer: their mhc_pre
    and boundary calls go through model.py's names."""
    t = tree(f"models/deepseek_v4/nvidia/{draft}.py")
    assert any(isinstance(n, ast.ImportFrom) and n.level == 1 and n.module == "model"
               and "DeepseekV4DecoderLayer" in {a.name for a in n.names} for n in t.body)


def test_dsv4_runs_with_breakable_cuda_graphs_by_default():
    """vLLM stream-captures DSV4's forward: the hooks' capture rule applies to it."""
    t = tree("config/vllm.py")
    node = next(n for n in t.body if isinstance(n, ast.Assign)
                and n.targets[0].id == "DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES")
    names = {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    assert {"DeepseekV4ForCausalLM", "DeepSeekV4MTPModel"} <= names


def test_the_entry_point_is_in_vllms_general_plugin_group():
    tomllib = pytest.importorskip("tomllib")
    group = next(n.value.value for n in tree("plugins/__init__.py").body
                 if isinstance(n, ast.Assign) and n.targets[0].id == "DEFAULT_PLUGINS_GROUP")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][group] == {"dsv4spec": "dsv4spec.integrations.vllm:register"}
    module, _, attr = project["entry-points"][group]["dsv4spec"].partition(":")
    assert getattr(sys.modules.get(module) or __import__(module, fromlist=[attr]), attr) \
        is plugin.register
