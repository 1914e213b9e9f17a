"""vLLM versions as data: the packaged manifests are what their sources give, and at
registration a hook installs only where the running vLLM's source matches one of them."""

import json
import logging
import shutil
from pathlib import Path

import pytest

from dsv4spec.integrations import manifest
from dsv4spec.integrations.vllm import plugin, register
from dsv4spec.integrations.vllm.source import SRC_ENV, vllm_src

from ..manifest_copies import EditedSource
from .conftest import _vllm_modules

LOGGER = "dsv4spec.integrations.vllm"
MODEL = "models/deepseek_v4/nvidia/model.py"
TILELANG = "model_executor/kernels/mhc/tilelang.py"


def test_the_packaged_manifest_is_what_this_versions_source_gives(vllm_source):
    packaged = {m["version"]: m for m in manifest.packaged_manifests("vllm")}
    assert set(packaged) == set(plugin.SUPPORTED_VLLM_VERSIONS)
    regenerated = json.loads(json.dumps(manifest.generate(plugin.ENGINE_SPEC, vllm_src(),
                                                          vllm_source)))
    assert regenerated == packaged[vllm_source]


def test_the_generator_writes_the_packaged_file_byte_for_byte(vllm_source, tmp_path):
    from dsv4spec.integrations import write_manifest

    assert write_manifest.main(["vllm", str(vllm_src()), vllm_source, str(tmp_path)]) == 0
    name = manifest.manifest_name("vllm", vllm_source)
    packaged = Path(manifest.__file__).parent / manifest.MANIFEST_DIR / name
    assert (tmp_path / name).read_bytes() == packaged.read_bytes()


def test_the_manifests_list_what_the_plugin_hooks():
    for m in manifest.packaged_manifests("vllm"):
        assert set(m["hooks"]) == {hook.name for hook in plugin.HOOKS}
        assert set(m["modules"]) == set(plugin.MODEL_MODULES)
        for module, names in m["modules"].items():
            hooked = {h.attr for h in plugin.HOOKS if module in plugin.BOUND_IN[h.name]}
            assert set(names["calls"]) <= hooked | set(plugin.NOT_HOOKED)


def test_the_manifests_are_package_data():
    import tomllib

    root = Path(__file__).resolve().parents[3]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert f"{manifest.MANIFEST_DIR}/*.json" in data["package-data"]["dsv4spec.integrations"]


def _hash_of(source):
    return manifest.node_hash(__import__("ast").parse(source).body[0])


def test_a_change_of_meaning_changes_the_fingerprint_and_a_comment_does_not():
    base = 'def f(x, eps=1e-6):\n    """Doc."""\n    return x + eps\n'
    assert _hash_of(base) == _hash_of('def f(x, eps=1e-6):\n    # note\n    return x + eps\n')
    assert _hash_of(base) == _hash_of('\n\ndef f(x, eps=1e-6):\n    """Other."""\n'
                                      '    return (x + eps)\n')
    assert _hash_of(base) != _hash_of(base.replace("1e-6", "1e-5"))
    assert _hash_of(base) != _hash_of(base.replace("x + eps", "x - eps"))
    assert _hash_of(base) != _hash_of(base.replace("eps=1e-6", "eps=1e-6, tile=1"))


@pytest.fixture
def edited_vllm(vllm_source, monkeypatch, tmp_path):
    """:func:`conftest.vllm` over a copy of this version's source edited by ``edit(relpath,
    old, new)`` calls made before ``load()``."""
    root = tmp_path / "src"
    shutil.copytree(vllm_src(), root)
    monkeypatch.setenv(SRC_ENV, str(root))

    class Edited:
        version = vllm_source

        def edit(self, relpath, old, new):
            path = root / "vllm" / relpath
            text = path.read_text()
            assert old in text, old
            path.write_text(text.replace(old, new, 1))

        def load(self):
            self.gen = _vllm_modules(False, monkeypatch)
            return next(self.gen)

    edited = Edited()
    yield edited
    if hasattr(edited, "gen"):
        edited.gen.close()


def _hooked_names(vllm):
    return {f"{m.rsplit('.', 1)[1]}.{name}" for m, mod in vllm.models.items()
            for name, fn in vars(mod).items() if plugin.is_hooked(fn)}


def test_a_matching_source_installs_every_hook_whatever_the_version_string(
        edited_vllm, monkeypatch, caplog):
    edited_vllm.edit(MODEL, "        hidden_states = self.norm(hidden_states)\n",
                     "        # a comment\n        hidden_states = self.norm(hidden_states)\n")
    vllm = edited_vllm.load()
    monkeypatch.setattr(plugin, "installed_vllm_version", lambda: "0.99.0")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        patched = register()
    assert len(patched) == len(_hooked_names(vllm)) > 0
    assert not [r for r in caplog.records if "matches no tested" in r.getMessage()]
    verdicts = plugin.verdicts(vllm.model)
    assert {h: v.matches for h, v in verdicts.items() if not v.absent} == {
        h.name: [edited_vllm.version] for h in plugin.HOOKS
        if not verdicts[h.name].absent}


def test_a_changed_call_site_makes_its_hooks_step_aside_with_one_warning(
        edited_vllm, monkeypatch, caplog):
    edited_vllm.edit(MODEL, "        hidden_states = self.norm(hidden_states)\n",
                     "        hidden_states = self.norm(hidden_states * 1)\n")
    vllm = edited_vllm.load()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        register()
        register()
    hooked = _hooked_names(vllm)
    # DeepseekV4Model.forward calls hc_head and mhc_post: both step aside in every module
    assert not any(n.endswith(("hc_head_fused_kernel_tilelang", ".mhc_post_tilelang"))
                   for n in hooked)
    assert "model.mhc_fused_post_pre_tilelang" in hooked and "model.mhc_pre_tilelang" in hooked
    warnings = [r.getMessage() for r in caplog.records if "matches no tested" in r.getMessage()]
    assert len(warnings) == 2
    for hook in ("hc_head", "mhc_post"):
        (message,) = [w for w in warnings if f"vLLM {hook} hook steps aside" in w]
        assert f"{MODEL}:DeepseekV4Model.forward (changed)" in message
        closest = message.split("closest tested version ")[1].split(";")[0].split(" / ")
        assert edited_vllm.version in closest
        assert plugin.ALLOW_UNTESTED in message


def test_allow_untested_installs_a_hook_whose_source_changed(edited_vllm, monkeypatch, caplog):
    edited_vllm.edit(TILELANG, "    out = torch.empty_like(residual)\n",
                     "    out = torch.zeros_like(residual)\n")
    vllm = edited_vllm.load()
    monkeypatch.setenv(plugin.ALLOW_UNTESTED, "1")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        register()
    assert {"model.mhc_post_tilelang", "mtp.mhc_post_tilelang",
            "dspark.mhc_post_tilelang"} <= _hooked_names(vllm)
    (message,) = [r.getMessage() for r in caplog.records if "matches no tested" in r.getMessage()]
    assert "mhc_post hook installed anyway" in message
    assert f"{TILELANG}:mhc_post_tilelang (changed)" in message


def test_a_new_kernel_name_bound_by_a_model_module_warns_that_coverage_changed(
        edited_vllm, caplog):
    edited_vllm.edit(TILELANG, "\ndef mhc_post_tilelang(",
                     "\ndef mhc_new_boundary_tilelang(x):\n    return x\n\n\n"
                     "def mhc_post_tilelang(")
    edited_vllm.edit(MODEL, "    mhc_post_tilelang,\n",
                     "    mhc_new_boundary_tilelang,\n    mhc_post_tilelang,\n")
    vllm = edited_vllm.load()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        register()
    (message,) = [r.getMessage() for r in caplog.records if "coverage changed" in r.getMessage()]
    assert plugin.TARGET_MODULE in message and "mhc_new_boundary_tilelang" in message
    assert "matches no tested" not in caplog.text, "the hooks' own sources are unchanged"
    assert "model.mhc_post_tilelang" in _hooked_names(vllm)


def test_no_manifest_means_no_hook(vllm, monkeypatch, caplog):
    monkeypatch.setattr(plugin, "_manifests", [])
    before = {m: dict(vars(mod)) for m, mod in vllm.models.items()}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert register() == []
    assert _hooked_names(vllm) == set()
    assert all(vars(mod)[k] is v for m, mod in vllm.models.items()
               for k, v in before[m].items() if k.endswith("_tilelang"))
    steps = [r for r in caplog.records if "steps aside" in r.getMessage()]
    assert len(steps) == sum(not v.absent for v in plugin.verdicts(vllm.model).values())


def test_a_failing_fingerprint_steps_aside_and_never_raises(vllm, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(manifest, "hook_parts", broken)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert register() == []
    assert _hooked_names(vllm) == set()
    assert "could not be read (RecursionError" in caplog.text


# Per hook, the engine code its fast path reproduces or rests on, one part of each file (vLLM's
# function, its TileLang kernels, the model functions calling it): each version's manifest lists
# every one (where the version defines the hook), and a changed copy of any makes that hook step
# aside.
_KERNELS = "model_executor/kernels/mhc/tilelang_kernels.py"
_MTP = "models/deepseek_v4/nvidia/mtp.py"
_DSPARK = "models/deepseek_v4/nvidia/dspark.py"
REPRODUCES = {
    "hc_head": (f"{TILELANG}:hc_head_fused_kernel_tilelang", f"{_KERNELS}:hc_head_fuse_tilelang",
                f"{MODEL}:DeepseekV4Model.forward",
                f"{_MTP}:DeepSeekV4MultiTokenPredictor.compute_logits",
                f"{_DSPARK}:DSparkDeepseekV4Model.forward"),
    "mhc_pre": (f"{TILELANG}:mhc_pre_tilelang", f"{TILELANG}:_hc_prenorm_gemm_outputs",
                f"{_KERNELS}:mhc_pre_big_fuse_with_norm_tilelang",
                f"{_KERNELS}:hc_prenorm_gemm_tilelang", f"{MODEL}:DeepseekV4DecoderLayer.forward"),
    "mhc_post": (f"{TILELANG}:mhc_post_tilelang", f"{_KERNELS}:mhc_post_tilelang",
                 f"{MODEL}:DeepseekV4Model.forward",
                 f"{_MTP}:DeepSeekV4MultiTokenPredictorLayer.forward",
                 f"{_DSPARK}:DSparkDeepseekV4Model.forward"),
    "mhc_fused_post_pre": (f"{TILELANG}:mhc_fused_post_pre_tilelang",
                           f"{_KERNELS}:mhc_fused_tilelang",
                           f"{_KERNELS}:mhc_fused_post_pre_split_config",
                           f"{MODEL}:DeepseekV4DecoderLayer.forward"),
    "mhc_fused_post_pre_reuse_residual": (
        f"{TILELANG}:mhc_fused_post_pre_tilelang_reuse_residual",
        f"{TILELANG}:_mhc_fused_post_pre_tilelang_impl", f"{_KERNELS}:mhc_fused_tilelang",
        f"{MODEL}:DeepseekV4DecoderLayer.forward"),
}
_LABELS = [(hook, label) for hook, labels in REPRODUCES.items() for label in labels]


def _packaged(version):
    return {m["version"]: m for m in manifest.packaged_manifests("vllm")}[version]


@pytest.fixture(scope="module")
def vllm_copies(tmp_path_factory):
    """A copy of each version's source (made at first use), for :class:`EditedSource`."""
    copies = {}

    def copy(version):
        if version not in copies:
            copies[version] = EditedSource(plugin.ENGINE_SPEC, vllm_src(),
                                           tmp_path_factory.mktemp(f"vllm-{version}"))
        copies[version].undo()
        return copies[version]

    yield copy
    for edited in copies.values():
        edited.undo()


def test_every_hook_lists_what_its_fast_path_reproduces(vllm_source):
    assert set(REPRODUCES) == {hook.name for hook in plugin.HOOKS}
    hooks = _packaged(vllm_source)["hooks"]
    missing = [(hook, label) for hook, label in _LABELS
               if hooks[hook] is not None and label not in hooks[hook]["parts"]]
    assert not missing, missing


def test_the_copy_of_vllms_source_matches_the_manifest(vllm_source, vllm_copies):
    verdicts = vllm_copies(vllm_source).verdicts([_packaged(vllm_source)])
    assert all(v.ok or v.absent for v in verdicts.values())


@pytest.mark.parametrize("hook, label", _LABELS, ids=[f"{h}-{lbl}" for h, lbl in _LABELS])
def test_a_changed_copy_of_what_a_hook_reproduces_makes_it_step_aside(vllm_source, vllm_copies,
                                                                    hook, label):
    packaged = _packaged(vllm_source)
    if packaged["hooks"][hook] is None:
        pytest.skip(f"vLLM {vllm_source} defines no {plugin.ENGINE_SPEC.hooks[hook].qualname}")
    edited = vllm_copies(vllm_source)
    edited.change(label)
    verdicts = edited.verdicts([packaged])
    assert not verdicts[hook].ok and f"{label} (changed)" in verdicts[hook].reason
    # the hooks that do not rest on it still match: the change touched that part alone
    assert all(v.ok or v.absent for name, v in verdicts.items()
               if label not in (packaged["hooks"][name] or {}).get("parts", {}))
