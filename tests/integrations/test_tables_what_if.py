"""The tables' device files and what-if at their edges: a device file that records no SM count,
a visible GPU's SM count against an assumed GPU's, entering and leaving ``assuming`` (nested too),
a Triton version given as the assumed stack, and the stack rule for a GPU with a file of its own."""

import types

import pytest

from dsv4spec.integrations import tables
from dsv4spec.integrations.sglang import mhc

from .test_tables import (  # noqa: F401
    H200,
    H200_SMS,
    SM90,
    fresh,
    one_hook_file,
    plugin_decides,
    write_user,
)

OTHER = "NVIDIA H200 NVL"  # a GPU name no packaged file has


@pytest.fixture
def visible_gpu(monkeypatch):
    """``visible_gpu(name, sms)``: CUDA reports one sm_90 GPU of that name and SM count (what
    the tables ask torch; nothing is launched)."""
    def make(name, sms):
        cuda = tables.torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "current_device", lambda: 0)
        monkeypatch.setattr(cuda, "device_count", lambda: 1)
        monkeypatch.setattr(cuda, "get_device_capability", lambda index=None: SM90)
        monkeypatch.setattr(cuda, "get_device_name", lambda index=None: name)
        monkeypatch.setattr(cuda, "get_device_properties",
                            lambda index=None: types.SimpleNamespace(multi_processor_count=sms))
    return make


def top(entry, mode="graph", key=7168):
    return max(hi for _, hi in entry[mode][key])


def test_a_device_file_without_an_sm_count_is_taken_whole_on_any_gpu(fresh):  # noqa: F811
    """Nothing says which plans the file's GPU ran, so no range is cut on a GPU of other SMs."""
    data = one_hook_file("target_hc_head")
    del data["measured"]["sm_count"]
    write_user(OTHER, data)
    for sms in (78, H200_SMS, 200):
        path, entry = tables.hook_entry("sglang", "target_hc_head", SM90, OTHER, sm_count=sms)
        assert path == tables.user_dir() / tables.device_file_name(OTHER)
        assert top(entry) == 16384, sms
    # the control: the same file with the H200's count is cut on a GPU of 78 SMs
    write_user(OTHER, one_hook_file("target_hc_head"))
    tables.clear_cache()
    assert top(tables.hook_entry("sglang", "target_hc_head", SM90, OTHER, sm_count=78)[1]) < 256


@pytest.mark.parametrize("sms", [78, 160])
def test_a_gpu_of_fewer_or_more_sms_than_measured_is_cut(fresh, sms):  # noqa: F811
    entry = tables.hook_entry("sglang", "target_hc_head", SM90, H200, sm_count=sms)[1]
    assert top(entry) < 16384
    assert top(tables.hook_entry("sglang", "target_hc_head", SM90, H200,
                                 sm_count=H200_SMS)[1]) == 16384


def test_an_assumed_gpu_is_taken_to_have_its_files_sm_count(fresh, visible_gpu):  # noqa: F811
    visible_gpu(H200, 78)  # a partitioned H200 is the visible GPU
    assert tables._device_sm_count(SM90) == 78
    assert top(tables.hook_entry("sglang", "target_hc_head", SM90)[1]) < 256
    assert not plugin_decides("target_hc_head", 7168, 256, True, SM90)
    with tables.assuming(H200):
        assert tables._device_sm_count(SM90) is None
        assert top(tables.hook_entry("sglang", "target_hc_head", SM90)[1]) == 16384
        assert plugin_decides("target_hc_head", 7168, 256, True, SM90)
    assert not plugin_decides("target_hc_head", 7168, 256, True, SM90)


def test_an_assumed_gpu_reads_its_own_file_not_the_visible_ones(fresh, visible_gpu):  # noqa: F811
    visible_gpu(H200, H200_SMS)
    write_user(OTHER, one_hook_file("mhc_post", graph={"7168": [[1, 2]]}))
    assert tables._device_name(SM90) == H200
    assert plugin_decides("mhc_post", 7168, 4096, True, SM90)  # the H200's packaged file
    with tables.assuming(OTHER):
        assert tables._device_name(SM90) == OTHER
        assert [c for c in (1, 2, 3, 4096) if plugin_decides("mhc_post", 7168, c, True, SM90)] \
            == [1, 2]


def test_the_tables_read_again_on_entering_and_leaving_a_what_if(fresh):  # noqa: F811
    """No GPU (the interpreter): the architecture file decides outside; inside, the assumed GPU's
    own file; after the block the architecture file again, whatever was read inside."""
    write_user(OTHER, one_hook_file("mhc_post", graph={"7168": [[1, 2]]}))
    outside = [c for c in (1, 2, 3, 4096) if plugin_decides("mhc_post", 7168, c, True, SM90)]
    assert outside != [1, 2]  # sm_90.json's ranges are not the assumed GPU's
    with tables.assuming(OTHER):
        assert [c for c in (1, 2, 3, 4096)
                if plugin_decides("mhc_post", 7168, c, True, SM90)] == [1, 2]
        assert mhc.SGLANG_MHC_POST_FASTER.sources[SM90] == (
            tables.user_dir() / tables.device_file_name(OTHER))
    assert [c for c in (1, 2, 3, 4096)
            if plugin_decides("mhc_post", 7168, c, True, SM90)] == outside
    assert mhc.SGLANG_MHC_POST_FASTER.sources[SM90].name == "sm_90.json"


def test_leaving_a_nested_what_if_returns_to_the_outer_one(fresh):  # noqa: F811
    write_user(OTHER, one_hook_file("mhc_post", graph={"7168": [[1, 2]]}))
    with tables.assuming(OTHER):
        with tables.assuming(H200):
            assert plugin_decides("mhc_post", 7168, 4096, True, SM90)
        assert not plugin_decides("mhc_post", 7168, 4096, True, SM90)
        assert tables.chain_files(SM90)[0].parent == tables.user_dir()
    assert tables._assumed is None


def test_an_assumed_gpu_without_a_stack_reads_the_running_stacks_files(fresh):  # noqa: F811
    running = tables.running_stack()
    with tables.assuming(H200):
        files = tables.chain_files(SM90)
    assert files and all(tables.read_file_with_stack(p)[0] == running for p in files)
    assert files[0].name == tables.device_file_name(H200, None if running == "3.6" else running)


def test_an_assumed_triton_version_is_read_as_its_stack(fresh):  # noqa: F811
    with tables.assuming(H200, "3.8.0+git1234"):
        files = tables.chain_files(SM90)
    assert [p.name for p in files] == ["NVIDIA_H200.triton3.8.json", "sm_90.triton3.8.json"]


def test_a_gpu_with_a_file_of_its_own_is_validated_for_its_stack(fresh, monkeypatch):  # noqa: F811
    """Under a Triton no packaged file was measured with, the GPU named by the caller is
    validated by its own user file; the architecture alone (no name) is not."""
    monkeypatch.setattr(tables, "running_stack", lambda: "3.9")
    data = one_hook_file("mhc_post")
    data["measured"]["triton"] = "3.9.0"
    own = write_user(OTHER, data)
    assert tables.stack_validated(SM90, OTHER)
    assert tables.chain_files(SM90, OTHER) == [own]
    assert not tables.stack_validated(SM90)
    assert tables.chain_files(SM90) == []


@pytest.mark.parametrize("sm_count", [0, -1, 1.5, "132", True])
def test_a_device_files_sm_count_must_be_a_positive_int(sm_count):
    data = one_hook_file("mhc_post")
    data["measured"]["sm_count"] = sm_count
    with pytest.raises(ValueError, match="sm_count"):
        tables.validate(data)
