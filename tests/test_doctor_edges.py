"""``dsv4spec doctor`` at the edges of its verdicts: a hook the engine's version does not define
(reported, never a problem), the numerics' ``ok``, a stack-gated hook under a Triton no table was
measured with, the count each numerics check runs at, a malformed user file, and the gates with
no kernel (the draft-decode metadata) without a GPU."""

import json
from pathlib import Path

import pytest

from dsv4spec import doctor
from dsv4spec.integrations import tables
from dsv4spec.integrations.sglang.hc_head import PRECOMPILE_MAX_TOKENS

from .test_doctor import H200, an_h200, fake_sglang_source, no_gpu  # noqa: F401

VLLM_0_33 = Path(__file__).resolve().parents[1] / ".vllm-src" / "0.33.0"
REUSE = "mhc_fused_post_pre_reuse_residual"


@pytest.fixture(autouse=True)
def _no_user_tables(monkeypatch, tmp_path):
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path / "user"))
    tables.clear_cache()
    yield
    tables.clear_cache()


def test_a_hook_the_version_does_not_define_is_reported_not_a_problem():
    """vLLM 0.33.0 has no reuse_residual boundary: the hook is absent (its verdict not ok, not a
    mismatch), counted apart from the defined hooks, and no problem."""
    if not (VLLM_0_33 / "vllm").is_dir():
        pytest.skip("vLLM 0.33.0's source is not unpacked (`make setup`)")
    report = doctor.build_report(**H200, triton_stack="3.6", numerics=False,
                                 sources={"vllm": VLLM_0_33})
    hooks = report["engines"]["vllm"]["hooks"]
    verdict = json.loads(json.dumps(report))["engines"]["vllm"]["hooks"][REUSE]["verdict"]
    assert verdict["ok"] is False and verdict["absent"] is True
    assert not hooks[REUSE]["installs"] and not hooks[REUSE]["acts"]
    assert all(hooks[name]["verdict"]["ok"] for name in hooks if name != REUSE)
    assert not [p for p in report["problems"] if "vLLM" in p]
    text = " ".join(doctor.render(report).split())
    defined = len(hooks) - 1
    assert f"{defined} of {defined} hooks match tested 0.33.0 (1 not defined by" in text


def test_the_numerics_ok_is_false_where_any_check_failed(an_h200, monkeypatch,  # noqa: F811
                                                        tmp_path):
    from dsv4spec.bench import stack
    from dsv4spec.integrations import manifest

    failing = [None]

    def check(case, T, H, seed):
        if case == failing[0]:
            raise AssertionError("off float64")
        return None, 1e-6

    monkeypatch.setattr(stack, "checked", check)
    monkeypatch.setattr(manifest, "verdicts", lambda spec, root, m: {
        h: manifest.Verdict(h, ["0.5.23"]) for h in spec.hooks})
    sources = {"sglang": fake_sglang_source(tmp_path)}
    numerics = doctor.build_report(sources=sources)["numerics"]
    assert numerics["run"] and len(numerics["checks"]) > 1 and numerics["ok"] is True
    failing[0] = numerics["checks"][-1]["case"]
    numerics = doctor.build_report(sources=sources)["numerics"]
    assert [c["error"] is None for c in numerics["checks"]].count(False) >= 1
    assert any(c["error"] is None for c in numerics["checks"])
    assert numerics["ok"] is False


def test_a_stack_gated_hook_serves_only_under_a_stack_with_a_table():
    """Under a Triton no table was measured with, the hooks gated on the stack (the rollback,
    the MTP draft's hc_head) neither serve nor list ranges."""
    served = doctor.build_report(**H200, triton_stack="3.6", numerics=False)
    unmeasured = doctor.build_report(**H200, triton_stack="3.99", numerics=False)
    for name in ("C128 rollback", "draft hc_head"):
        assert served["engines"]["sglang"]["hooks"][name]["serves"], name
        hook = unmeasured["engines"]["sglang"]["hooks"][name]
        assert hook["kind"] == "stack" and not hook["serves"], name
        assert all(not spans for modes in hook["ranges"].values() for keyed in modes.values()
                   for spans in keyed.values()), name
    draft = served["engines"]["sglang"]["hooks"]["draft hc_head"]["ranges"][""]
    assert draft["graph"]["*"] == draft["eager"]["*"] == [[1, PRECOMPILE_MAX_TOKENS]]


def hook_entry(op, ranges, acts=True):
    return {"acts": acts, "ops": [op], "key": "hidden_size", "ranges": {"": ranges}}


def test_each_numerics_check_runs_at_the_smallest_count_any_acting_hook_serves():
    report = {"engines": {"one": {"hooks": {
        "a": hook_entry("mhc_pre", {"graph": {"4096": [[5, 8]]},
                                    "eager": {"4096": [[3, 4], [9, 9]], "7168": [[6, 6]]}}),
        "b": hook_entry("mhc_pre", {"graph": {"7168": [[2, 2]]}, "eager": {}}),
        "idle": hook_entry("mhc_pre", {"graph": {"4096": [[1, 1]]}, "eager": {}}, acts=False),
        "rollback": {"acts": True, "ops": ["C128DraftCleanup"], "key": None, "ranges": {}},
    }}}}
    points = {(case, H): T for case, H, T in doctor.numerics_points(report)}
    assert points[("mhc_pre", 4096)] == 3 and points[("mhc_pre", 7168)] == 2
    widthless = [T for (case, H), T in points.items() if H is None]
    assert widthless == [doctor.WIDTHLESS_COUNT] and doctor.WIDTHLESS_COUNT > 1


def test_a_malformed_user_file_is_listed_with_its_error():
    path = tables.user_dir() / tables.device_file_name("NVIDIA H200")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    report = doctor.build_report(**H200, triton_stack="3.6", numerics=False)
    (listed,) = [f for f in report["tables"]["files"] if f["path"] == str(path)]
    assert listed["stack"] is None and listed["error"]
    assert report["tables"]["serving"] == []  # a malformed file voids the chain


def test_a_gate_with_no_kernel_serves_only_where_there_is_a_gpu(no_gpu):  # noqa: F811
    without = doctor.build_report(numerics=False)["engines"]["sglang"]["hooks"]
    with_gpu = doctor.build_report(**H200, triton_stack="3.6",
                                   numerics=False)["engines"]["sglang"]["hooks"]
    no_kernel = [name for name, hook in with_gpu.items() if hook["kind"] == "no kernel"]
    assert no_kernel, "the draft-decode metadata hook hands no launch of ours"
    for name in no_kernel:
        assert with_gpu[name]["serves"] and not without[name]["serves"], name
