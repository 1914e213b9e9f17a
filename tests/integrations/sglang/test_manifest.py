"""SGLang versions as data: the packaged manifest is what SGLang 0.5.23's source gives, and a
hook registers only where the running SGLang's source matches a manifest."""

import copy
import json
import logging
from pathlib import Path

import pytest

from dsv4spec.integrations import manifest
from dsv4spec.integrations.sglang import plugin
from dsv4spec.integrations.sglang.source import sglang_root

from ..manifest_copies import EditedSource
from .test_plugin import LOGGER, TARGETS, registered

MHC_POST = next(h for h in plugin.HOOKS if h.attr == "mhc_post")


def test_the_packaged_manifest_is_what_the_installed_sglangs_source_gives():
    version = plugin.installed_sglang_version()
    if sglang_root() is None or version not in plugin.SUPPORTED_SGLANG_VERSIONS:
        pytest.skip("SGLang 0.5.23 is not installed (`make setup`)")
    (packaged,) = [m for m in manifest.packaged_manifests("sglang") if m["version"] == version]
    regenerated = json.loads(json.dumps(manifest.generate(plugin.ENGINE_SPEC, sglang_root(),
                                                          version)))
    assert regenerated == packaged
    assert set(packaged["hooks"]) == {hook.name for hook in plugin.HOOKS}
    assert all(entry is not None for entry in packaged["hooks"].values())


def test_the_generator_writes_the_packaged_file_byte_for_byte(packaged_sglang, tmp_path):
    from dsv4spec.integrations import write_manifest

    version = packaged_sglang["version"]
    assert write_manifest.main(["sglang", str(sglang_root()), version, str(tmp_path)]) == 0
    name = manifest.manifest_name("sglang", version)
    packaged = Path(manifest.__file__).parent / manifest.MANIFEST_DIR / name
    assert (tmp_path / name).read_bytes() == packaged.read_bytes()


def _tested(edit):
    tested = copy.deepcopy(manifest.packaged_manifests("sglang"))
    for m in tested:
        edit(m)
    return tested


def _change_mhc_post(m):
    entry = m["hooks"][MHC_POST.name]
    label = f"kernels/ops/layernorm/mhc.py:{MHC_POST.attr}"
    entry["parts"][label] = "0" * 16
    entry["fingerprint"] = manifest.combined(entry["parts"])


def test_a_hook_whose_source_changed_is_not_registered_with_one_warning(sgl, monkeypatch,
                                                                        caplog):
    monkeypatch.setattr(plugin, "manifests", lambda: _tested(_change_mhc_post))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        installed = sgl.install()
        sgl.install()
    assert installed == [t for t in TARGETS if t != MHC_POST.target]
    assert MHC_POST.target not in registered(sgl)
    (message,) = [r.getMessage() for r in caplog.records if "matches no tested" in r.getMessage()]
    assert f"{MHC_POST.name} hook steps aside" in message
    assert f"kernels/ops/layernorm/mhc.py:{MHC_POST.attr} (changed)" in message
    assert plugin.ALLOW_UNTESTED in message


def test_allow_untested_registers_it_anyway(sgl, monkeypatch, caplog):
    monkeypatch.setattr(plugin, "manifests", lambda: _tested(_change_mhc_post))
    monkeypatch.setenv(plugin.ALLOW_UNTESTED, "1")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert sgl.install() == list(TARGETS)
    assert "registered anyway" in caplog.text


def test_no_manifest_registers_nothing(sgl, monkeypatch, caplog):
    monkeypatch.setattr(plugin, "manifests", lambda: [])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert sgl.install() == []
    assert registered(sgl) == {}
    assert len([r for r in caplog.records if "steps aside" in r.getMessage()]) == len(
        plugin.HOOKS)


def test_a_kernel_name_no_manifest_lists_warns_that_coverage_changed(sgl, monkeypatch, caplog):
    def drop(m):
        m["modules"]["sglang.srt.models.deepseek_v4"]["binds"].remove("mhc_fused_post_pre")

    monkeypatch.setattr(plugin, "manifests", lambda: _tested(drop))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert sgl.install() == list(TARGETS)
    (message,) = [r.getMessage() for r in caplog.records if "coverage changed" in r.getMessage()]
    assert "sglang.srt.models.deepseek_v4 binds mhc_fused_post_pre" in message


def test_an_unreadable_source_registers_nothing_and_never_raises(sgl, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise SyntaxError("invalid syntax")

    monkeypatch.setattr(manifest, "hook_parts", broken)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert sgl.install() == []
    assert "could not be read (SyntaxError" in caplog.text


# Per hook, the engine code its fast path reproduces or rests on, one part of each file: the
# packaged manifest lists every one, and a changed copy of any makes that hook step aside.
_POOL = "srt/mem_cache/deepseek_v4_memory_pool.py"
_MHC = "kernels/ops/layernorm/mhc.py"
_MODEL = "srt/models/deepseek_v4.py"
_BACKEND = "srt/layers/attention/deepseek_v4_backend.py"
_METADATA_KERNEL = "kernels/ops/attention/dsv4/metadata_kernel.py"
REPRODUCES = {
    "C128 rollback": (
        f"{_POOL}:DeepSeekV4TokenToKVPool.clear_unaccepted_c128_draft_states",
        f"{_POOL}:ONLINE_C128",
        "kernels/ops/kvcache/dsv4_c128_cleanup.py:clear_unaccepted_c128_draft_states",
        "kernels/ops/kvcache/dsv4_c128_cleanup.py:_clear_unaccepted_c128_draft_states_kernel",
        # calls it through getattr(pool, "clear_unaccepted_c128_draft_states", None)
        "srt/speculative/eagle_worker_common.py:run_eagle_verify"),
    "draft hc_head": ("srt/models/deepseek_v4_nextn.py:DeepseekV4ModelNextN.hc_head",
                      "srt/models/deepseek_v4_nextn.py:DeepseekV4ModelNextN.forward"),
    "target hc_head": (f"{_MODEL}:DeepseekV4Model.hc_head", f"{_MODEL}:hc_head_torch",
                       "kernels/ops/layernorm/mhc_head.py:fused_hc_head",
                       "kernels/ops/layernorm/mhc_head.py:_hc_head_kernel",
                       f"{_MODEL}:DeepseekV4Model._forward_impl"),
    "mHC mhc_pre": (f"{_MHC}:mhc_pre", f"{_MHC}:mhc_pre_gemm_sqrsum_splitk_kernel",
                    f"{_MODEL}:DeepseekV4DecoderLayerBase.hc_pre"),
    "mHC mhc_post": (f"{_MHC}:mhc_post", f"{_MHC}:mhc_post_tilelang",
                     "srt/models/deepseek_v4_mhc.py:post"),
    "mHC mhc_fused_post_pre": (
        f"{_MHC}:mhc_fused_post_pre", f"{_MHC}:mhc_fused_post_pre_fma_tilelang",
        "srt/models/deepseek_common/amd/deepseek_v4_fused_mhc.py:apply_mhc_post_pre_boundary"),
    "DSV4 page table": (
        "kernels/ops/attention/dsv4/attn_metadata_kernels.py:build_page_table_positions_triton",
        "kernels/ops/attention/dsv4/attn_metadata_kernels.py:_page_table_positions_kernel"),
    "DSV4 compressed metadata": (f"{_METADATA_KERNEL}:_init_compressed_attn_metadata_triton",
                                 f"{_METADATA_KERNEL}:_init_compressed_attn_metadata_kernel"),
    "DSV4 verify row expansion": (
        f"{_BACKEND}:DeepseekV4AttnBackend.expand_extend_with_same_length",
        f"{_BACKEND}:DeepseekV4AttnBackend.make_forward_metadata_from_raw_verify"),
    "DSV4 compression metadata in one launch": (
        f"{_BACKEND}:DSV4AttnMetadata.init_compression_metadata",
        f"{_BACKEND}:_pad_last_dim",
        # imported into the backend as _init_compression_metadata_triton
        f"{_METADATA_KERNEL}:init_compression_metadata",
        f"{_METADATA_KERNEL}:_init_compressed_attn_metadata_kernel"),
    "DSV4 FlashMLA metadata": (f"{_BACKEND}:DSV4AttnMetadata.init_flashmla_related",
                               f"{_BACKEND}:DeepseekV4AttnBackend.make_core_attn_metadata"),
    "DSV4 draft-decode metadata": (
        f"{_BACKEND}:DeepseekV4MultiStepBackend.init_forward_metadata_in_graph",
        f"{_BACKEND}:DeepseekV4MultiStepBackend.init_forward_metadata_out_graph",
        "srt/speculative/eagle_draft_cuda_graph_runner.py:"
        "EAGLEDraftCudaGraphRunner.capture_one_shape",
        "srt/speculative/eagle_worker_v2.py:EagleDraftWorker.draft_forward",
        "srt/speculative/eagle_worker_v2.py:EagleDraftWorker._draft_forward_idle",
        "srt/speculative/draft_utils.py:DraftBackendFactory.create_decode_backend"),
    "DSpark draft hc_head": (
        "srt/models/deepseek_v4_dspark.py:DeepseekV4ForCausalLMDSpark.collapse_hc_head",
        f"{_MODEL}:hc_head_torch"),
}
_LABELS = [(hook, label) for hook, labels in REPRODUCES.items() for label in labels]


@pytest.fixture(scope="module")
def packaged_sglang():
    version = plugin.installed_sglang_version()
    if sglang_root() is None or version not in plugin.SUPPORTED_SGLANG_VERSIONS:
        pytest.skip("SGLang 0.5.23 is not installed (`make setup`)")
    (packaged,) = [m for m in manifest.packaged_manifests("sglang") if m["version"] == version]
    return packaged


@pytest.fixture(scope="module")
def sglang_copy(packaged_sglang, tmp_path_factory):
    edited = EditedSource(plugin.ENGINE_SPEC, sglang_root(), tmp_path_factory.mktemp("sglang"))
    yield edited
    edited.undo()


def test_every_hook_lists_what_its_fast_path_reproduces(packaged_sglang):
    assert set(REPRODUCES) == {hook.name for hook in plugin.HOOKS}
    missing = [(hook, label) for hook, label in _LABELS
               if label not in packaged_sglang["hooks"][hook]["parts"]]
    assert not missing, missing


def test_the_copy_of_sglangs_source_matches_the_manifest(sglang_copy, packaged_sglang):
    sglang_copy.undo()
    assert all(v.ok for v in sglang_copy.verdicts([packaged_sglang]).values())


@pytest.mark.parametrize("hook, label", _LABELS, ids=[f"{h}-{lbl}" for h, lbl in _LABELS])
def test_a_changed_copy_of_what_a_hook_reproduces_makes_it_step_aside(sglang_copy,
                                                                    packaged_sglang, hook,
                                                                    label):
    sglang_copy.change(label)
    verdicts = sglang_copy.verdicts([packaged_sglang])
    assert not verdicts[hook].ok and f"{label} (changed)" in verdicts[hook].reason
    # the hooks that do not rest on it still match: the change touched that part alone
    assert all(v.ok for name, v in verdicts.items()
               if label not in packaged_sglang["hooks"][name]["parts"])
