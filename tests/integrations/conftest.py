import pytest

H200, H200_SMS = "NVIDIA H200", 132  # benchmarks/results/metadata/*.json: "sm_count": "132"


@pytest.fixture
def h200_tables(monkeypatch):
    """The tables' lookups see an H200 (132 SMs) as the sm_90 GPU: the packaged H200 file decides
    (on the CPU, no GPU named, the sm_90 file derived from it would)."""
    from dsv4spec.integrations import tables
    from dsv4spec.integrations.sglang import hc_head, metadata, mhc
    from dsv4spec.integrations.vllm.tables import DEEPGEMM_TABLES as VLLM_DEEPGEMM_TABLES
    from dsv4spec.integrations.vllm.tables import TABLES as VLLM_TABLES

    def reload():
        tables.clear_cache()
        for table in [*mhc.TABLES.values(), *metadata.TABLES.values(),
                      hc_head.TARGET_HC_HEAD_FASTER, *VLLM_TABLES.values(),
                      *mhc.DEEPGEMM_TABLES.values(), *VLLM_DEEPGEMM_TABLES.values()]:
            table.reload()

    sm90 = (9, 0)
    monkeypatch.setattr(tables, "_device_name", lambda arch: H200 if tuple(arch) == sm90 else None)
    monkeypatch.setattr(tables, "_device_sm_count",
                        lambda arch: H200_SMS if tuple(arch) == sm90 else None)
    reload()
    yield
    reload()  # read again, unpatched, on next use
