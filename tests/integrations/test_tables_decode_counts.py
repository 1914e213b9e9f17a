"""Every decode count (1-64 tokens) asked of each table-gated hook's own decision function, both
engines, both widths, in a graph and eagerly, for an H200 under each stack (its device file) and
for another GPU of its architecture (the architecture file): a count left to the engine was
measured a loss, or lies between two measured points of its segment (no tiling switch of ours or
the engine's kernel between) not both won by the carry margin, or has no measured point on one
side in its segment and the file lists it as ``unmeasured``; the list names no count measured
since (it only shrinks by measuring); and no count is served as ours without a measured win at
it or clear wins on both sides of it in its segment."""

import json

import pytest

from dsv4spec.integrations import plans, tables
from dsv4spec.integrations.sglang import hc_head, mhc
from dsv4spec.integrations.vllm import hc_head as vllm_hc_head
from dsv4spec.integrations.vllm import mhc as vllm_mhc

from .test_tables import H200, SM90, switches

DECODE = range(1, 65)
WIDTHS = (4096, 7168)
# (file, the GPU named to the plugins, stack): the H200 reads its file, a GPU no file names
# (None: the architecture files alone) the architecture file's
FILES = [("NVIDIA_H200.json", H200, "3.6"), ("NVIDIA_H200.triton3.8.json", H200, "3.8"),
         ("sm_90.json", None, "3.6"), ("sm_90.triton3.8.json", None, "3.8")]


def _sglang_mhc(op):
    return lambda T, H, graph: mhc.prefers_dsv4spec(op, T, H, graph, SM90)


def _vllm_mhc(op):
    return lambda T, H, graph: vllm_mhc.prefers_dsv4spec(op, T, H, graph, SM90)


DECIDES = {
    ("sglang", "mhc_pre"): _sglang_mhc("mhc_pre"),
    ("sglang", "mhc_post"): _sglang_mhc("mhc_post"),
    ("sglang", "mhc_fused_post_pre"): _sglang_mhc("mhc_fused_post_pre"),
    ("sglang", "target_hc_head"): lambda T, H, g: hc_head.target_prefers_dsv4spec(T, H, g, SM90),
    ("sglang", "dspark_hc_head"): lambda T, H, g: hc_head.dspark_prefers_dsv4spec(T, H, g, SM90),
    ("vllm", "hc_head"): lambda T, H, g: vllm_hc_head.hc_head_prefers_dsv4spec(T, H, g, SM90),
    ("vllm", "mhc_pre"): _vllm_mhc("mhc_pre"),
    ("vllm", "mhc_post"): _vllm_mhc("mhc_post"),
    ("vllm", "mhc_fused_post_pre"): _vllm_mhc("mhc_fused_post_pre"),
}


def segment_of(engine, hook, key, stack, count):
    cuts = {*switches(hook, key, stack), *plans.ENGINE_TILING_SWITCHES.get((engine, hook), ())}
    return (max([1, *(s for s in cuts if s <= count)]),
            min([1 << 30, *(s - 1 for s in cuts if s > count)]))


def audit(name, device, stack):
    """``(faults, gaps)``: the decisions no measurement backs, and per (engine, hook, mode,
    key) the decode counts left to the engine in segments without any measured point."""
    data = json.loads((tables.PACKAGED_DIR / name).read_text())
    margin = data["derived"]["margin"] if data["device"] is None else None
    faults, gaps = [], {}
    with tables.assuming(device, stack):
        for (engine, hook), decides in DECIDES.items():
            entry = data["engines"][engine][hook]
            cap = entry["max_count"] or max(DECODE)
            for mode in tables.MODES:
                clearly = max(tables.CARRY_MARGIN[mode], margin or 1.0)
                for H in WIDTHS:
                    rows = sorted(entry["points"][mode][str(H)])

                    def won(row, by=margin):
                        return row[1] < row[2] if by is None else row[2] >= by * row[1]

                    for T in DECODE:
                        if T > cap:
                            continue
                        lo, hi = segment_of(engine, hook, H, stack, T)
                        segment = [r for r in rows if lo <= r[0] <= hi]
                        here = [r for r in segment if r[0] == T]
                        below = [r for r in segment if r[0] < T][-1:]
                        above = [r for r in segment if r[0] > T][:1]
                        # not measured: between two points of its segment, both won clearly
                        between = bool(below and above) and won(below[0], clearly) and won(
                            above[0], clearly)
                        what = (engine, hook, mode, H, T)
                        if decides(T, H, mode == "graph"):
                            if not (won(here[0]) if here else between):
                                faults.append(("ours, measured the engine's", *what))
                        elif here:
                            if won(here[0]):
                                faults.append(("the engine's, measured ours", *what))
                        elif not (below and above):
                            gaps.setdefault((engine, hook, mode, str(H)), []).append(T)
                        elif between:
                            faults.append(("the engine's, between two clear wins", *what))
    return data, faults, gaps


def listed(data, top=max(DECODE)):
    """The file's ``unmeasured`` segments, as decode counts, per (engine, hook, mode, key)."""
    out = {}
    for engine, hooks in data["engines"].items():
        for hook, entry in hooks.items():
            for mode, keyed in entry.get("unmeasured", {}).items():
                for key, spans in keyed.items():
                    counts = [c for lo, hi in spans for c in range(lo, min(hi, top) + 1)]
                    if counts and (engine, hook) in DECIDES and int(key) in WIDTHS:
                        out[(engine, hook, mode, key)] = counts
    return out


@pytest.mark.parametrize("name, device, stack", FILES, ids=[f[0] for f in FILES])
def test_every_decode_count_left_to_the_engine_has_a_measured_loss_or_is_listed(
        name, device, stack, monkeypatch, tmp_path):
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path / "user"))
    data, faults, gaps = audit(name, device, stack)
    assert not faults, f"{len(faults)} decisions without a measurement behind them: {faults[:8]}"
    # both ways: a gap not listed is new, a listed one not found was measured (a stale list)
    assert gaps == listed(data), (
        f"unlisted: { {k: v for k, v in gaps.items() if listed(data).get(k) != v} }; "
        f"stale: { {k: v for k, v in listed(data).items() if gaps.get(k) != v} }")


def test_the_audit_fails_on_an_unlisted_gap_and_on_a_stale_list(monkeypatch, tmp_path):
    """The two ways the listed segments can be wrong, made on a copy of the 3.6 file: a gap the
    list lacks is new; a listed segment measured since is stale."""
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path / "user"))
    data = json.loads((tables.PACKAGED_DIR / "NVIDIA_H200.json").read_text())
    boundary = data["engines"]["sglang"]["mhc_fused_post_pre"]
    # ours switches at 5, 9 and 17, SGLang's at 8: measured at 4, 8, 16 and 32
    assert boundary["unmeasured"]["graph"]["7168"] == [[5, 7], [9, 15], [17, 31]]
    slot = ("sglang", "mhc_fused_post_pre", "graph", "7168")
    path = tmp_path / "user" / "NVIDIA_H200.json"
    path.parent.mkdir()
    monkeypatch.setattr(tables, "PACKAGED_DIR", tmp_path / "user")
    del boundary["unmeasured"]["graph"]["7168"]
    path.write_text(tables.dumps(data))
    _, _, gaps = audit("NVIDIA_H200.json", H200, "3.6")
    listed_counts = [*range(5, 8), *range(9, 16), *range(17, 32)]
    assert gaps[slot] == listed_counts and slot not in listed(data)  # unlisted
    boundary["unmeasured"]["graph"]["7168"] = [[5, 7], [9, 15], [17, 31]]
    boundary["points"]["graph"]["7168"] += [[5, 1.0, 2.0], [6, 1.0, 2.0], [7, 1.0, 2.0]]
    path.write_text(tables.dumps(data))
    _, faults, gaps = audit("NVIDIA_H200.json", H200, "3.6")
    assert gaps[slot] == listed_counts[3:] and listed(data)[slot] == listed_counts  # stale
    assert ("the engine's, measured ours", *slot[:3], 7168, 6) in faults


def test_a_count_served_against_its_segment_is_a_fault(monkeypatch, tmp_path):
    """A table that serves ours where the segment's points say the engine's fails the audit."""
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path / "user"))
    data = json.loads((tables.PACKAGED_DIR / "NVIDIA_H200.json").read_text())
    data["engines"]["sglang"]["mhc_post"]["graph"]["7168"] = [[1, 64]]  # lost at 16
    path = tmp_path / "user" / "NVIDIA_H200.json"
    path.parent.mkdir()
    path.write_text(tables.dumps(data))
    monkeypatch.setattr(tables, "PACKAGED_DIR", tmp_path / "user")
    _, faults, _ = audit("NVIDIA_H200.json", H200, "3.6")
    assert ("ours, measured the engine's", "sglang", "mhc_post", "graph", 7168, 16) in faults


def test_every_row_says_which_engine_path_it_was_measured_against():
    for name, _, _ in FILES:
        data = json.loads((tables.PACKAGED_DIR / name).read_text())
        against = {(e, h): x["measured_against"] for e, hooks in data["engines"].items()
                   for h, x in hooks.items()}
        assert all(against[(e, h)] == "tilelang, DeepGEMM off" for e, h in against
                   if e == "vllm" or h.startswith("mhc_")), name
        assert against[("sglang", "target_hc_head")] == "triton"
        assert against[("sglang", "dspark_hc_head")] == "torch"
    entry = json.loads((tables.PACKAGED_DIR / "NVIDIA_H200.json").read_text())[
        "engines"]["sglang"]["mhc_post"]
    for bad in ("", 3, ["tilelang"]):
        with pytest.raises(ValueError, match="measured_against"):
            tables.validate_hook({**entry, "measured_against": bad}, "mhc_post")
    with pytest.raises(ValueError, match="unmeasured"):
        tables.validate_hook({**entry, "unmeasured": {"prefill": {}}}, "mhc_post")
