"""``dsv4spec doctor``: its report without a GPU, the what-if of an H200 (the ranges it lists are
the plugins' own decision functions' answers), its exit status, its JSON keys, an engine source
that matches no tested version, and (on an H200) the whole report validated."""

import argparse
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from dsv4spec import doctor
from dsv4spec.cli import EXIT_USAGE, main
from dsv4spec.integrations import manifest, tables
from dsv4spec.integrations.sglang import hc_head as sglang_hc_head
from dsv4spec.integrations.sglang import metadata as sglang_metadata
from dsv4spec.integrations.sglang import mhc as sglang_mhc
from dsv4spec.integrations.sglang import plugin as sglang_plugin
from dsv4spec.integrations.vllm import hc_head as vllm_hc_head
from dsv4spec.integrations.vllm import mhc as vllm_mhc
from dsv4spec.integrations.vllm import plugin as vllm_plugin
from dsv4spec.integrations.vllm.source import vllm_src

ROOT = Path(__file__).resolve().parents[1]
H200 = {"device_name": "NVIDIA H200", "capability": (9, 0)}
SM90 = (9, 0)
KEYS = {"dsv4spec", "what_if", "gpu", "torch", "triton", "tables", "engines", "assumed_engines",
        "packaged_gpus", "numerics", "warnings", "problems", "exit"}


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(autouse=True)
def _no_user_tables(monkeypatch, tmp_path):
    # The packaged tables only, whatever the user's cache holds.
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path / "no-user-tables"))
    tables.clear_cache()


def test_without_a_gpu_every_hook_steps_aside_and_the_exit_status_is_1(no_gpu, capsys):
    rc = main(["doctor"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "GPU       none: no CUDA GPU: every hook steps aside, the engines' own code runs" in out
    assert "numerics  skipped: no CUDA GPU" in out
    assert "result    not validated (exit 1)" in out
    for line in ("torch ", "tables ", "SGLang ", "vLLM "):
        assert any(row.startswith(line) for row in out.splitlines()), (line, out)
    report = doctor.build_report()
    assert report["exit"] == 1 and report["problems"][0] == doctor.NO_GPU
    assert not any(hook["acts"] for engine in report["engines"].values()
                   for hook in engine["hooks"].values())


def test_json_parses_and_has_the_documented_keys(no_gpu, capsys):
    rc = main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == report["exit"] == 1
    assert set(report) == KEYS
    documented = (ROOT / "docs" / "doctor.md").read_text()
    assert all(f"`{key}`" in documented and f"``{key}``" in doctor.__doc__ for key in KEYS)
    assert set(report["engines"]) == {"sglang", "vllm"}
    hook = report["engines"]["sglang"]["hooks"]["mHC mhc_pre"]
    assert {"target", "switched_on", "switch_setting", "verdict", "installs", "kind", "ops",
            "table_file", "ranges", "serves", "acts"} <= set(hook)
    assert "import_error" in report["engines"]["sglang"]
    for key in ("switch_setting", "import_error"):
        assert f"`{key}`" in documented, key


def direct_spans(decide, keys, top):
    """Per mode and key, the counts 1..top + 1 at which ``decide(count, key, in_graph)`` holds,
    as ranges: the decision functions asked directly."""
    return {mode: {str(key): doctor.spans_of(c for c in range(1, top + 2)
                                             if decide(c, key, mode == "graph"))
                   for key in keys}
            for mode in tables.MODES}


def direct_decisions():
    """hook -> (engine, case label, decide(count, key, in_graph)) for every table-gated hook of
    both plugins: each plugin's decision function called by its own name."""
    M = sglang_metadata
    out = {}
    for op in sglang_mhc.TABLES:
        cases = {"": False} if op == "mhc_post" else {"DeepGEMM off": False, "DeepGEMM on": True}
        for label, deep_gemm in cases.items():
            out[("sglang", f"mHC {op}", label)] = (
                lambda op, d: lambda c, k, g: sglang_mhc.prefers_dsv4spec(op, c, k, g, SM90, d))(
                op, deep_gemm)
    out[("sglang", "target hc_head", "")] = lambda c, k, g: sglang_hc_head.target_prefers_dsv4spec(
        c, k, g, SM90)
    for hook, op in (("DSV4 page table", M.PAGE_TABLE), ("DSV4 compressed metadata", M.COMPRESSED),
                     ("DSV4 verify row expansion", M.EXPAND),
                     ("DSV4 compression metadata in one launch", M.COMPRESSION)):
        out[("sglang", hook, "")] = (lambda op: lambda c, k, g: M.prefers_dsv4spec(
            op, c, k, g, SM90))(op)
    out[("vllm", "hc_head", "")] = lambda c, k, g: vllm_hc_head.hc_head_prefers_dsv4spec(
        c, k, g, SM90)
    for hook, op in (("mhc_pre", "mhc_pre"), ("mhc_post", "mhc_post"),
                     ("mhc_fused_post_pre", "mhc_fused_post_pre"),
                     ("mhc_fused_post_pre_reuse_residual", "mhc_fused_post_pre")):
        cases = {"": False} if op == "mhc_post" else {"DeepGEMM off": False, "DeepGEMM on": True}
        for label, deep_gemm in cases.items():
            out[("vllm", hook, label)] = (lambda op, d: lambda c, k, g: vllm_mhc.prefers_dsv4spec(
                op, c, k, g, SM90, d))(op, deep_gemm)
    return out


@pytest.mark.parametrize("stack, file", [("3.6", "NVIDIA_H200.json"),
                                         ("3.8", "NVIDIA_H200.triton3.8.json")])
def test_what_if_an_h200_lists_the_ranges_the_decision_functions_give(stack, file):
    report = doctor.build_report(**H200, triton_stack=stack, numerics=False)
    assert report["what_if"] and report["gpu"]["sm"] == "sm_90"
    assert report["numerics"]["skipped"].startswith("a what-if")
    served_by = tables.PACKAGED_DIR / file
    assert report["tables"]["serving"][0] == str(served_by)
    engines = tables.read_file(served_by)
    # with DeepGEMM on, the mHC hooks' rows measured against its path decide
    on_file = tables.PACKAGED_DIR / tables.device_file_name("NVIDIA H200", stack, deepgemm=True)
    assert report["tables"]["deepgemm_serving"][0] == str(on_file)
    on_engines = tables.read_file(on_file)
    with tables.assuming("NVIDIA H200", stack):
        for (engine, hook, label), decide in direct_decisions().items():
            entry = report["engines"][engine]["hooks"][hook]
            table = engines[engine][entry["table"]]
            if label == "DeepGEMM on" and entry["table"] in on_engines.get(engine, {}):
                table = on_engines[engine][entry["table"]]
                assert entry["deepgemm_table_file"] == str(on_file), hook
            keys = sorted({k for mode in tables.MODES for k in table[mode]})
            top = max(hi for mode in tables.MODES for spans in table[mode].values()
                      for _, hi in spans)
            assert entry["table_file"] == str(served_by), hook
            assert entry["ranges"][label] == direct_spans(decide, keys, top), (engine, hook, label)
    sglang = report["engines"]["sglang"]["hooks"]
    fused_7168 = sglang["mHC mhc_fused_post_pre"]["ranges"]["DeepGEMM off"]["graph"]["7168"]
    assert fused_7168 == [list(span) for span in
                          engines["sglang"]["mhc_fused_post_pre"]["graph"][7168]]
    assert fused_7168[0][0] == 1 and fused_7168[-1][1] == 32
    # the drafts' gate serves every width to the precompiled count; the rollback every call
    assert sglang["draft hc_head"]["ranges"][""]["graph"] == {"*": [[1, 16384]]}
    assert sglang["C128 rollback"]["serves"] and not sglang["C128 rollback"]["ranges"]


def test_a_decision_inside_a_hook_is_what_the_report_shows(monkeypatch):
    """The hc_head hooks' precompiled-count cap lives in their decision functions, so the report
    (which asks those functions) follows it."""
    monkeypatch.setattr(sglang_hc_head, "PRECOMPILE_MAX_TOKENS", 3)
    monkeypatch.setattr(vllm_hc_head, "PRECOMPILE_MAX_TOKENS", 3)
    report = doctor.build_report(**H200, triton_stack="3.6", numerics=False)
    target = report["engines"]["sglang"]["hooks"]["target hc_head"]["ranges"][""]
    assert target["graph"] == {"4096": [[1, 3]], "7168": [[1, 3]]}
    vllm = report["engines"]["vllm"]["hooks"]["hc_head"]["ranges"][""]
    assert vllm["eager"] == {"4096": [[1, 3]], "7168": [[1, 3]]}


@pytest.fixture
def no_engine(monkeypatch):
    """Neither SGLang nor vLLM installed."""
    monkeypatch.setattr(doctor, "_installed", lambda engine, plugin: (None, None))


def test_what_if_without_an_engine_answers_for_every_packaged_version(no_engine, capsys):
    rc = main(["doctor", "--device-name", "NVIDIA H200", "--capability", "9.0",
               "--triton-stack", "3.8"])
    out = capsys.readouterr().out
    assert rc == 0, out
    for header in ("SGLang 0.5.23 (its packaged manifest) hooks on NVIDIA H200 (sm_90) under "
                   "Triton 3.8: 13 of 13 act",
                   "vLLM 0.33.0 (its packaged manifest) hooks on NVIDIA H200 (sm_90) under "
                   "Triton 3.8: 4 of 5 act",
                   "vLLM 0.34.0 (its packaged manifest) hooks on NVIDIA H200 (sm_90) under "
                   "Triton 3.8: 5 of 5 act"):
        assert header in out, out
    flat = " ".join(out.split())
    assert "H: hidden size (7168: DSV4-Pro, 4096: DSV4-Flash)" in flat
    assert "bs x 4 with MTP's 3 drafts and bs x 8 with DSpark's N = 7" in flat
    assert ("vLLM not installed (--vllm-source DIR checks a source tree); answered for 0.33.0, "
            "0.34.0 from the packaged manifests") in flat
    assert "--engine" not in flat  # never told to pass what it answers for
    report = doctor.build_report(**H200, triton_stack="3.8", numerics=False)
    assert report["exit"] == 0 and not report["problems"]
    assumed = {(e["name"], e["assumed"]): e for e in report["assumed_engines"]}
    assert set(assumed) == {("SGLang", "0.5.23"), ("vLLM", "0.33.0"), ("vLLM", "0.34.0")}
    # the same decision functions as for an installed engine
    for (name, _), entry in assumed.items():
        engine = report["engines"][name.lower()]
        assert engine["source"] is None and entry["installed"] is None
        for hook, answer in entry["hooks"].items():
            assert answer["ranges"] == engine["hooks"][hook]["ranges"], hook
    reuse = assumed[("vLLM", "0.33.0")]["hooks"]["mhc_fused_post_pre_reuse_residual"]
    assert reuse["verdict"]["absent"] and not reuse["acts"]
    assert all(h["acts"] for h in assumed[("vLLM", "0.34.0")]["hooks"].values())


def test_the_engine_option_answers_for_the_versions_named(capsys):
    report = doctor.build_report(**H200, numerics=False, engines=doctor.engine_versions(
        ["vllm==0.34.0"]))
    assert [(e["name"], e["assumed"]) for e in report["assumed_engines"]] == [("vLLM", "0.34.0")]
    assert report["what_if"] and report["exit"] == 0
    assert doctor.engine_versions(["vllm"]) == [("vllm", "0.33.0"), ("vllm", "0.34.0")]
    assert doctor.engine_versions(["SGLang==0.5.23", "sglang==0.5.23"]) == [("sglang", "0.5.23")]
    for bad in ("vllm==0.1", "trt"):
        with pytest.raises(doctor.UsageError) as raised:
            doctor.engine_versions([bad])
        assert raised.value.argument == "--engine"
    assert main(["doctor", "--engine", "vllm==0.1"]) == EXIT_USAGE
    assert "argument --engine" in capsys.readouterr().err


def test_this_machine_without_an_engine_is_not_validated(no_gpu, no_engine):
    report = doctor.build_report(numerics=False)
    assert "neither SGLang nor vLLM found: no plugin would load" in report["problems"]
    assert report["exit"] == 1


@pytest.mark.parametrize("version", ["3.8.1", "3.8.0+gitabc"])
def test_a_triton_the_direct_launch_does_not_bind_shows_eager_calls_stepping_aside(monkeypatch,
                                                                                   version):
    """Under a patch release of the 3.8 stack or a local build the report says, beside the
    Triton release, that eager calls run the engines' code; every eager range is empty, the
    graph ranges are the 3.8 file's, and the tables' one WARNING is among the warnings."""
    import triton

    monkeypatch.setattr(triton, "__version__", version)
    monkeypatch.setattr(tables, "running_stack", lambda: tables.stack_of(triton.__version__))
    report = doctor.build_report(**H200, triton_stack="3.8", numerics=False)
    assert report["triton"]["direct_launch"] is None
    ranges = [modes for engine in report["engines"].values()
              for hook in engine["hooks"].values() if hook["kind"] == "table"
              for modes in hook["ranges"].values()]
    assert ranges and not any(spans for modes in ranges for spans in modes["eager"].values())
    assert any(spans for modes in ranges for spans in modes["graph"].values())
    told = [w for w in report["warnings"] if "direct launch" in w]
    assert len(told) == 1 and f"Triton {version} is not a release" in told[0]
    text = " ".join(doctor.render(report).split())
    assert (f"Triton {version} (stack 3.8); no direct launch under this release (only 3.6.0, "
            "3.8.0): the tables' eager rows do not hold, every eager call runs the engine's "
            "code") in text
    monkeypatch.setattr(triton, "__version__", "3.8.0")
    report = doctor.build_report(**H200, triton_stack="3.8", numerics=False)
    assert report["triton"]["direct_launch"] == "generic"
    assert "direct launch" not in " ".join(doctor.render(report).split())


def test_what_if_with_no_table_for_the_gpu_says_to_tune(capsys):
    rc = main(["doctor", "--device-name", "NVIDIA B200", "--capability", "10.0"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "none of Triton 3.6 for NVIDIA B200 (sm_100)" in out and "dsv4spec tune" in out


def test_what_if_numerics_plan_covers_every_op_the_acting_hooks_launch():
    from dsv4spec.bench import stack

    report = doctor.build_report(**H200, triton_stack="3.6", numerics=False)
    for engine in report["engines"].values():  # as if both engines were found and matched
        for hook in engine["hooks"].values():
            hook["acts"] = hook["serves"]
    points = doctor.numerics_points(report)
    assert {case for case, _, _ in points} == {
        "boundary", "mhc_pre", "mhc_post", "hc_head", "rollback", "page_table", "c128",
        "compression", "expand"}
    assert all(case in stack.OPS for case, _, _ in points)
    for case, H, T in points:
        assert (H is None) == (case in stack.WIDTHLESS) and T >= 1
        assert H in (None, 4096, 7168)


def test_every_hook_of_both_plugins_declares_its_gate():
    for plugin in (sglang_plugin, vllm_plugin):
        gates = plugin.gates()
        assert set(gates) == {hook.name for hook in plugin.HOOKS}
        for name, gate in gates.items():
            assert gate.follows is None or gate.follows in gates, name


def fake_sglang_source(tmp_path) -> Path:
    (tmp_path / "sglang").mkdir()
    return tmp_path


def test_an_engine_source_matching_no_tested_version_is_reported(monkeypatch, tmp_path, capsys):
    def one_hook_differs(spec, root, manifests):
        verdicts = {h: manifest.Verdict(h, ["0.5.23"]) for h in spec.hooks}
        if spec.engine == "sglang":
            verdicts["mHC mhc_pre"] = manifest.Verdict(
                "mHC mhc_pre", [], reason="closest tested version 0.5.23; differs in "
                "kernels/ops/layernorm/mhc.py:mhc_pre (changed)")
        return verdicts

    source = fake_sglang_source(tmp_path)
    argv = ["doctor", "--device-name", "NVIDIA H200", "--capability", "9.0",
            "--sglang-source", str(source)]
    monkeypatch.setattr(manifest, "verdicts", lambda spec, root, m: {
        h: manifest.Verdict(h, ["0.5.23"]) for h in spec.hooks})
    assert main(argv) == 0, capsys.readouterr().out  # every hook matches: validated
    capsys.readouterr()
    monkeypatch.setattr(manifest, "verdicts", one_hook_differs)
    rc = main(argv)
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 1, out
    assert "12 of 13 hooks match tested 0.5.23" in out
    assert "mHC mhc_pre steps aside: its source matches no tested version" in out
    assert "problem SGLang mHC mhc_pre: its source matches no tested SGLang (0.5.23): closest " \
           "tested version 0.5.23; differs in kernels/ops/layernorm/mhc.py:mhc_pre (changed)" in out
    report = doctor.build_report(**H200, sources={"sglang": source}, numerics=False)
    hook = report["engines"]["sglang"]["hooks"]["mHC mhc_pre"]
    assert not hook["installs"] and not hook["acts"] and hook["serves"]
    monkeypatch.setenv(sglang_plugin.ALLOW_UNTESTED, "1")
    report = doctor.build_report(**H200, sources={"sglang": source}, numerics=False)
    assert report["engines"]["sglang"]["hooks"]["mHC mhc_pre"]["acts"]
    assert any("(installed anyway)" in p for p in report["problems"])


@pytest.fixture
def an_h200(monkeypatch):
    """torch as if it saw an H200 as cuda:0 (for what the report does with a visible GPU)."""
    for name, value in (("is_available", True), ("current_device", 0),
                        ("get_device_name", "NVIDIA H200"), ("get_device_capability", (9, 0)),
                        ("device_count", 1), ("synchronize", None),
                        ("get_device_properties",
                         types.SimpleNamespace(multi_processor_count=132, name="NVIDIA H200"))):
        monkeypatch.setattr(torch.cuda, name, lambda *args, value=value: value)


def test_every_numerics_check_decides_the_exit_status(an_h200, monkeypatch, tmp_path, capsys):
    from dsv4spec.bench import stack

    ran = []

    def check(case, T, H, seed):
        ran.append((case, H, T))
        if case == failing[0]:
            raise AssertionError(f"{case} H={H} T={T}: output 0 is 0.5 off float64")
        return None, 1e-6

    failing = [None]
    monkeypatch.setattr(stack, "checked", check)
    monkeypatch.setattr(manifest, "verdicts", lambda spec, root, m: {
        h: manifest.Verdict(h, ["0.5.23"]) for h in spec.hooks})
    argv = ["doctor", "--sglang-source", str(fake_sglang_source(tmp_path))]
    assert main(argv) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "GPU       NVIDIA H200 (sm_90), cuda:0" in out and "all pass" in out
    assert {case for case, _, _ in ran} >= {"boundary", "mhc_pre", "hc_head", "rollback"}
    failing[0] = "mhc_pre"
    assert main(argv) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "problem numerics mhc_pre H=4096 T=1: AssertionError: mhc_pre H=4096 T=1: output 0 " \
           "is 0.5 off float64" in out


@pytest.mark.parametrize("argv, argument", [
    (["--device-name", "NVIDIA H200"], "--capability"),
    (["--capability", "9"], "--capability"),
    (["--triton-stack", "three"], "--triton-stack"),
    (["--vllm-source", "/no/such/dir"], "--vllm-source"),
])
def test_bad_arguments_exit_2_naming_the_argument(no_gpu, argv, argument, capsys):
    try:
        rc = main(["doctor", *argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE and f"argument {argument}" in err and "\n" not in err.strip(), err


def test_a_capability_no_nvidia_gpu_has_is_refused_naming_capability(no_gpu, capsys):
    for value in ("99.9", "9.10", "2.0", "13.0", "0.0"):
        try:
            rc = main(["doctor", "--device-name", "NVIDIA H200", "--capability", value])
        except SystemExit as e:  # argparse's own errors
            rc = e.code
        err = capsys.readouterr().err
        assert rc == EXIT_USAGE and err.count("\n") == 1, (value, err)
        assert f"argument --capability: {value} is no NVIDIA GPU's compute capability" in err
    parser = argparse.ArgumentParser()
    doctor.add_arguments(parser)
    for value, parsed in (("3.0", (3, 0)), ("8.9", (8, 9)), ("10.3", (10, 3)), ("12.1", (12, 1))):
        assert parser.parse_args(["--capability", value]).capability == parsed


@pytest.mark.gpu
def test_on_an_h200_with_the_packaged_tables_everything_is_validated(capsys):
    if torch.cuda.get_device_name() != "NVIDIA H200":
        pytest.skip("the packaged device tables are an H200's")
    argv = ["doctor", "--json"]
    if vllm_src() is not None:
        argv += ["--vllm-source", str(vllm_src())]
    elif sglang_plugin.installed_sglang_version() is None:
        pytest.skip("neither vLLM's nor SGLang's source is here")
    rc = main(argv)
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report["problems"]
    numerics = report["numerics"]
    assert numerics["run"] and numerics["ok"] and numerics["checks"]
    assert numerics["seconds"] < 30


def test_an_engine_alone_without_a_gpu_answers_for_every_packaged_gpu(no_gpu, no_engine, capsys):
    """``--engine sglang==0.5.23`` on a machine without a GPU: the H200 its device files were
    measured on, and the other sm_90 GPUs its architecture files serve, each as
    ``--device-name`` (or ``--capability`` alone) answers for it; never told to pass the
    ``--engine`` it was given."""
    stack = tables.running_stack()
    rc = main(["doctor", "--engine", "sglang==0.5.23"])
    out = capsys.readouterr().out
    assert rc == 0, out
    flat = " ".join(out.split())
    for text in ("GPU none visible: answered for each GPU the packaged tables cover",
                 "GPU NVIDIA H200 (measured), assumed",
                 f"SGLang 0.5.23 (its packaged manifest) hooks on NVIDIA H200 (sm_90) under Triton "
                 f"{stack}: 13 of 13 act",
                 "GPU other sm_90 GPUs such as the H100, H800, H20 (derived from the H200's "
                 "points), assumed",
                 f"SGLang 0.5.23 (its packaged manifest) hooks on other sm_90 GPUs under Triton "
                 f"{stack}:",
                 "SGLang not installed (--sglang-source DIR checks a source tree); answered for "
                 "0.5.23 from the packaged manifest", "legend T: tokens per call"):
        assert text in flat, (text, out)
    assert "--engine sglang" not in flat
    engines = doctor.engine_versions(["sglang==0.5.23"])
    report = doctor.build_report(numerics=False, engines=engines)
    assert report["what_if"] and report["exit"] == 0 and not report["problems"]
    by_name = {each["name"]: each for each in report["packaged_gpus"]}
    # the H100's files: both engines' mHC and hc_head rows under Triton 3.6 (DeepGEMM off and on)
    assert list(by_name) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200", None]
    measured, derived = by_name["NVIDIA H200"], by_name[None]
    assert (measured["label"], measured["basis"], measured["name"]) == (
        "NVIDIA H200 (measured)", "measured", "NVIDIA H200")
    assert (derived["basis"], derived["name"], derived["architecture"]) == ("derived", None,
                                                                            [9, 0])
    assert derived["label"] == ("other sm_90 GPUs such as the H100, H800, H20 (derived from the "
                                "H200's points)")
    assert [Path(p).name for p in derived["tables"]["serving"]] == [
        tables.device_file_name("sm_90", None if stack == "3.6" else stack)]
    # each answered as the what-if naming it answers
    for each, what_if in ((measured, H200), (derived, {"capability": (9, 0)})):
        alone = doctor.build_report(**what_if, numerics=False, engines=engines)
        assert each["tables"]["serving"] == alone["tables"]["serving"]
        assert each["assumed_engines"] == alone["assumed_engines"], each["label"]
    # the derived table serves fewer counts than the H200's own
    ranges = [e["assumed_engines"][0]["hooks"]["mHC mhc_post"]["ranges"][""]["graph"]
              for e in (measured, derived)]
    assert ranges[0] != ranges[1]


def test_a_triton_stack_alone_without_a_gpu_answers_for_every_packaged_gpu(no_gpu, no_engine):
    report = doctor.build_report(triton_stack="3.8", numerics=False)
    assert [each["label"].split(" (")[0] for each in report["packaged_gpus"]] == [
        "NVIDIA H100 80GB HBM3", "NVIDIA H200", "other sm_90 GPUs such as the H100, H800, H20"]
    assert [[Path(p).name for p in each["tables"]["serving"]]
            for each in report["packaged_gpus"]] == [
        ["sm_90.triton3.8.json"], ["NVIDIA_H200.triton3.8.json", "sm_90.triton3.8.json"],
        ["sm_90.triton3.8.json"]]
    assert {(e["name"], e["assumed"]) for each in report["packaged_gpus"]
            for e in each["assumed_engines"]} == {("SGLang", "0.5.23"), ("vLLM", "0.33.0"),
                                                  ("vLLM", "0.34.0")}
    assert report["exit"] == 0, report["problems"]


@pytest.mark.parametrize("switch, value, shown", [
    ("DSV4SPEC_VLLM_MHC", "maybe", "DSV4SPEC_VLLM_MHC='maybe', not a switch value: taken as off"),
    ("DSV4SPEC_VLLM_MHC", "false", "DSV4SPEC_VLLM_MHC=false"),
    ("DSV4SPEC_VLLM", "no", "DSV4SPEC_VLLM=no"),
])
def test_a_hook_switched_off_shows_its_switch_as_set(monkeypatch, switch, value, shown):
    monkeypatch.setenv(switch, value)
    report = doctor.build_report(**H200, numerics=False,
                                 engines=doctor.engine_versions(["vllm==0.34.0"]))
    hook = report["assumed_engines"][0]["hooks"]["mhc_pre"]
    assert not hook["switched_on"] and hook["switch_setting"] == shown
    text = " ".join(doctor.render(report).split())
    assert f"mhc_pre off ({shown})" in text, text
    assert "=0)" not in text


def test_under_a_triton_without_tables_the_tables_line_names_the_files_of_other_stacks(capsys):
    rc = main(["doctor", "--device-name", "NVIDIA H200", "--capability", "9.0",
               "--triton-stack", "3.7", "--engine", "vllm==0.34.0"])
    flat = " ".join(capsys.readouterr().out.split())
    assert rc == 1
    assert ("tables none of Triton 3.7 for NVIDIA H200 (sm_90): `dsv4spec tune`" in flat), flat
    for name, stack in (("NVIDIA_H200.json", "3.6"), ("NVIDIA_H200.triton3.8.json", "3.8"),
                        ("sm_90.json", "3.6"), ("sm_90.triton3.8.json", "3.8")):
        assert f"{name} (packaged): Triton {stack}" in flat, (name, flat)
    assert "its files of another Triton serve only under that one:" in flat
    assert ("problem no table serves NVIDIA H200 (sm_90) under Triton 3.7: every table-gated "
            "hook steps aside (its files need Triton 3.6 or 3.8)") in flat


def test_an_installed_engine_that_does_not_import_is_reported(no_gpu, monkeypatch, tmp_path,
                                                              capsys):
    """Its source matches the manifest, but the engine cannot start: a problem, named."""
    root = fake_sglang_source(tmp_path)
    failure = "ModuleNotFoundError: No module named 'sgl_kernel'"
    monkeypatch.setattr(doctor, "_installed", lambda engine, plugin: (
        ("0.5.23", root) if engine == "sglang" else (None, None)))
    monkeypatch.setattr(manifest, "verdicts", lambda spec, root, m: {
        h: manifest.Verdict(h, ["0.5.23"]) for h in spec.hooks})
    monkeypatch.setattr(doctor, "import_error", lambda engine: failure)
    rc = main(["doctor", "--engine", "sglang==0.5.23"])
    flat = " ".join(capsys.readouterr().out.split())
    assert rc == 1
    assert (f"13 of 13 hooks match tested 0.5.23; the source matches, but `import sglang` fails: "
            f"{failure}") in flat, flat
    assert (f"problem SGLang: `import sglang` fails: {failure}; SGLang cannot start here, so "
            "none of its hooks loads") in flat
    report = doctor.build_report(numerics=False)
    assert report["engines"]["sglang"]["import_error"] == failure
    assert report["engines"]["vllm"]["import_error"] is None
    # a source tree given is not the installed engine: no import asked of it
    report = doctor.build_report(numerics=False, sources={"sglang": root})
    assert report["engines"]["sglang"]["import_error"] is None


def test_the_import_check_runs_in_a_fresh_interpreter(monkeypatch):
    monkeypatch.setattr(doctor, "_import_errors", {})
    assert doctor.import_error("json") is None
    assert doctor.import_error("dsv4spec_no_such_engine") == (
        "ModuleNotFoundError: No module named 'dsv4spec_no_such_engine'")
    assert "dsv4spec_no_such_engine" not in sys.modules
