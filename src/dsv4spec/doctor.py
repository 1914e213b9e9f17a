"""``dsv4spec doctor``: what dsv4spec's engine plugins would do on this machine, in one screen.

The GPU and its architecture; torch and Triton; the installed SGLang and vLLM, whether each
imports, and whether each plugin's hooks support them (their source against the packaged
manifests); the measured-faster table files for this GPU (those of the Triton stack serving it,
and those of other stacks); per hook, whether it would act and over which ranges in a CUDA graph
and eagerly (asked of the plugins' own decision functions), or the switch that turns it off as
it is set; and every op the acting hooks would launch, run once on this GPU against its
reference (float64, or bit for bit).

``--device-name``, ``--capability`` and ``--triton-stack`` ask what would happen on another GPU
or under another Triton (the tables and the ranges; the numerics need that GPU and are skipped).
``--sglang-source`` and ``--vllm-source`` check an engine source tree that is not installed.
``--engine sglang==0.5.23`` (or ``vllm==0.34.0``, ``vllm`` for each packaged version) answers for
a tested engine version from its packaged manifest, without the engine; where no engine is found
(none installed, no source given), every packaged version is answered for. A what-if naming no
GPU (``--engine`` or ``--triton-stack`` alone) on a machine without one answers for every GPU
the packaged tables cover: each device file's GPU (measured) and each architecture file's other
GPUs (derived from the measured GPU's points). ``--json`` prints the report as one JSON object
with the keys ``dsv4spec``, ``what_if``, ``gpu``, ``torch``, ``triton``, ``tables``,
``engines``, ``assumed_engines``, ``packaged_gpus``, ``numerics``, ``warnings``, ``problems``
and ``exit`` (docs/doctor.md).

Exit status 0: everything that would act is validated: a CUDA GPU (or the ones assumed), each
engine found imports and has every hook's source matching a tested version, a table of the
Triton stack serves the GPU, and every numerics check passed (in a what-if none is run: 0 says
the rest is validated; a what-if without an engine is answered for the engines' packaged
manifests). 1: something is not (``problems`` says what), or nothing would act: no CUDA GPU
(every hook steps aside, the engines' own code runs), neither engine found on this machine
(outside a what-if), no table for this GPU and Triton. 2: a bad argument.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch

from dsv4spec import __version__
from dsv4spec.integrations import manifest, tables
from dsv4spec.integrations.hooks import PATH_MISMATCH, rows_for, switch_on
from dsv4spec.kernels import DIRECT_LAUNCH_LAYOUTS, triton_version
from dsv4spec.usage import (
    TRITON_FOR_TORCH,
    UsageError,
    switch_setting,
    triton_for_installed_torch,
    triton_hint,
)

# engine -> (its name for people, its plugin module)
ENGINES = {"sglang": ("SGLang", "dsv4spec.integrations.sglang.plugin"),
           "vllm": ("vLLM", "dsv4spec.integrations.vllm.plugin")}
NO_GPU = "no CUDA GPU: every hook steps aside, the engines' own code runs"
ROCM = "a ROCm GPU: every hook steps aside, the engines' own code runs"
TUNE_HINT = "`dsv4spec tune` (and `dsv4spec tune --engine vllm`) measures it and writes its table"
# The count of a widthless numerics case (the rollback's batch, the metadata's requests).
WIDTHLESS_COUNT = 4
# Short names of the tables' keys and counts in the text report.
SHORT = {"hidden_size": "H", "num_tokens": "T", "page_table_width": "width",
         "query_rows": "rows", "requests": "bs"}
WIDTH = 100
# What the counts and keys of the hook lines are, in the DSV4 models' terms.
LEGEND = ("T: tokens per call (the target's verify: bs x (drafts + 1), so bs x 4 with MTP's 3 "
          "drafts and bs x 8 with DSpark's N = 7; DSpark's draft: bs x 7 rows; MTP's drafts after "
          "the first: bs); H: hidden size (7168: DSV4-Pro, 4096: DSV4-Flash); rows: query rows; "
          "width: page-table width in pages; bs: requests; qo_len: query length per request")


# What NVIDIA GPUs report: Kepler's 3.0 to Blackwell's 12.x, minors single digits (sm_XY names
# the architecture by two digits). A major past 12 needs a GPU released after this list.
CAPABILITY_MAJORS = range(3, 13)
CAPABILITY_MINORS = range(10)


def _capability(text: str) -> tuple[int, int]:
    parts = text.split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected MAJOR.MINOR (9.0 for sm_90), got {text!r}")
    major, minor = int(parts[0]), int(parts[1])
    if major not in CAPABILITY_MAJORS or minor not in CAPABILITY_MINORS:
        raise argparse.ArgumentTypeError(
            f"{text} is no NVIDIA GPU's compute capability (major {CAPABILITY_MAJORS[0]}-"
            f"{CAPABILITY_MAJORS[-1]}, minor {CAPABILITY_MINORS[0]}-{CAPABILITY_MINORS[-1]}: 9.0 "
            f"for sm_90)")
    return major, minor


def _stack(text: str) -> str:
    try:
        return tables.stack_of(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a Triton version (3.8), got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--device-name", default=None, metavar="NAME",
                        help='assume a GPU of this name, as CUDA reports it ("NVIDIA H200"); '
                             "needs --capability without a CUDA GPU")
    parser.add_argument("--capability", type=_capability, default=None, metavar="M.m",
                        help="assume a GPU of this compute capability (9.0: sm_90); alone, no "
                             "device table is looked up, only the architecture's")
    parser.add_argument("--triton-stack", type=_stack, default=None, metavar="M.m",
                        help="assume this Triton release (3.8) in place of the running one")
    parser.add_argument("--sglang-source", type=Path, default=None, metavar="DIR",
                        help="check the SGLang source under DIR (holding sglang/) in place of "
                             "the installed one")
    parser.add_argument("--vllm-source", type=Path, default=None, metavar="DIR",
                        help="check the vLLM source under DIR (holding vllm/) in place of the "
                             "installed one")
    parser.add_argument("--engine", action="append", default=None, metavar="NAME[==VERSION]",
                        help="answer for a tested engine version from its packaged manifest, "
                             "without the engine (sglang==0.5.23, vllm==0.34.0; a name alone: "
                             "each packaged version); repeatable. Default, where no engine is "
                             "found: every packaged version")


def engine_versions(specs: list[str] | None) -> list[tuple[str, str]]:
    """``--engine`` values as (engine, version) pairs with a packaged manifest, in the order
    given (a name alone: each packaged version, oldest first); ``UsageError`` naming
    ``--engine`` for an unknown engine or an untested version."""
    out: list[tuple[str, str]] = []
    for spec in specs or []:
        engine, _, version = str(spec).strip().lower().partition("==")
        if engine not in ENGINES:
            raise UsageError("--engine", f"unknown engine {spec!r} (one of {sorted(ENGINES)})")
        tested = [m["version"] for m in _manifests(engine)]
        if version and version not in tested:
            raise UsageError("--engine", f"no packaged manifest of {ENGINES[engine][0]} "
                             f"{version} (tested: {', '.join(tested)})")
        for v in [version] if version else tested:
            if (engine, v) not in out:
                out.append((engine, v))
    return out


def _manifests(engine: str) -> list[dict]:
    """The packaged manifests of ``engine``, oldest first."""
    plugin = importlib.import_module(ENGINES[engine][1])
    return sorted(plugin.manifests(), key=lambda m: _version_key(m["version"]))


def main(args: argparse.Namespace) -> int:
    report = build_report(device_name=args.device_name, capability=args.capability,
                          triton_stack=args.triton_stack,
                          sources={"sglang": args.sglang_source, "vllm": args.vllm_source},
                          engines=engine_versions(args.engine))
    print(json.dumps(report, indent=1) if args.json else render(report))
    return report["exit"]


# ---------------------------------------------------------------------------------------------
# The report


def build_report(device_name: str | None = None, capability: tuple[int, int] | None = None,
                 triton_stack: str | None = None,
                 sources: dict[str, Path | None] | None = None,
                 numerics: bool = True,
                 engines: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """The doctor's report as a JSON-able dict (see the module docstring for its keys).
    ``device_name``, ``capability``, ``triton_stack``: the what-if (any given: the numerics are
    skipped); ``sources``: engine -> a source tree to check in place of the installed one;
    ``numerics``: False skips them (tests); ``engines``: (engine, version) pairs answered for
    from their packaged manifests (a what-if too; default, where no engine is found: every
    packaged version)."""
    sources = sources or {}
    for engine, root in sources.items():
        if engine not in ENGINES:
            raise ValueError(f"sources: unknown engine {engine!r} (one of {sorted(ENGINES)})")
        if root is not None and not (Path(root) / engine).is_dir():
            raise UsageError(f"--{engine}-source", f"{root} holds no {engine}/ folder")
    if triton_version() is None:
        return _report_without_triton()
    gpu_what_if = device_name is not None or capability is not None or triton_stack is not None
    what_if = gpu_what_if or bool(engines)
    # A what-if naming no GPU on a machine without one: every GPU the packaged tables cover.
    each_packaged = (what_if and device_name is None and capability is None
                     and not torch.cuda.is_available())
    gpu = _gpu(device_name, capability, triton_stack, gpu_what_if, each_packaged)
    report: dict[str, Any] = {
        "dsv4spec": __version__, "what_if": what_if, "gpu": gpu,
        "torch": {"version": torch.__version__, "cuda": torch.version.cuda,
                  "hip": torch.version.hip},
        "triton": {"version": triton_version(), "running_stack": tables.running_stack(),
                   "stack": gpu["stack"],
                   "direct_launch": DIRECT_LAUNCH_LAYOUTS.get(triton_version())},
    }
    architecture = None if gpu["architecture"] is None else tuple(gpu["architecture"])
    assumed = (tables.assuming(gpu["name"], gpu["stack"]) if gpu_what_if and not each_packaged
               else contextlib.nullcontext())
    with _collected_warnings() as warnings:
        with assumed:
            report["tables"] = _tables(gpu, architecture)
            found = {engine: _engine_source(engine, sources.get(engine)) for engine in ENGINES}
            report["engines"] = {engine: _engine_on(base, architecture, gpu["name"])
                                 for engine, base in found.items()}
            if not engines and not any(e["source"] for e in report["engines"].values()):
                engines = [(engine, m["version"]) for engine in ENGINES
                           for m in _manifests(engine)]
            answered = [_engine_source(engine, None, version) for engine, version in engines or []]
            report["assumed_engines"] = [_engine_on(base, architecture, gpu["name"])
                                         for base in answered]
        shown = [base for base in found.values() if base.fields["source"] is not None]
        report["packaged_gpus"] = ([_packaged_answer(each, gpu["stack"], shown, answered)
                                    for each in packaged_gpus()] if each_packaged else [])
    report["numerics"] = _numerics(report, gpu, what_if, numerics)
    report["warnings"] = list(dict.fromkeys(warnings))
    report["problems"] = _problems(report)
    report["exit"] = 1 if report["problems"] else 0
    return report


def stack_without_triton() -> str:
    """Where no Triton is installed, the stack of the release ``triton_hint`` names: the one
    dsv4spec pairs with the installed torch, else the newest it pairs with any."""
    _, _, release = triton_for_installed_torch()
    return tables.stack_of(release or max(TRITON_FOR_TORCH.values(), key=_version_key))


def _report_without_triton() -> dict[str, Any]:
    """The report where Triton is not installed: nothing of dsv4spec can run (its ops are Triton
    kernels, and its hooks' modules import them), so it says so, what to install, what the
    engines found are and which packaged tables that Triton would read; no hook lines."""
    stack = stack_without_triton()
    packaged = []
    for path in sorted(tables.PACKAGED_DIR.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            if tables.file_stack(json.loads(path.read_text(encoding="utf-8"))) == stack:
                packaged.append(path.name)
    engines = {}
    for engine, (name, module) in ENGINES.items():
        version, root = _installed(engine, importlib.import_module(module))
        engines[engine] = {"name": name, "installed": version,
                           "source": None if root is None else str(root)}
    problem = (f"Triton is not installed (a CPU-only torch brings none): dsv4spec's ops are "
               f"Triton kernels, so none of its hooks can load and the engines' own code runs "
               f"everywhere (neither engine starts without Triton either); "
               f"{triton_hint()}, then run dsv4spec doctor again for the hooks")
    return {"dsv4spec": __version__, "what_if": False, "gpu": _gpu(None, None, stack, False),
            "torch": {"version": torch.__version__, "cuda": torch.version.cuda,
                      "hip": torch.version.hip},
            "triton": {"version": None, "running_stack": None, "stack": stack,
                       "direct_launch": None},
            "tables": {"packaged_for_stack": packaged}, "engines": engines,
            "assumed_engines": [], "packaged_gpus": [],
            "numerics": {"run": False, "skipped": "Triton is not installed", "checks": [],
                         "ok": None, "seconds": None},
            "warnings": [], "problems": [problem], "exit": 1}


def _gpu(device_name: str | None, capability: tuple[int, int] | None, stack: str | None,
         what_if: bool, each_packaged: bool = False) -> dict[str, Any]:
    """The GPU the report is for: the visible one (the current device), or the one assumed;
    with ``each_packaged``, none (every GPU the packaged tables cover is answered for)."""
    visible = torch.cuda.is_available()
    name = arch = None
    if visible:
        index = torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        arch = None if torch.version.hip else tuple(torch.cuda.get_device_capability(index))
    out = {"visible": visible, "name": name, "index": torch.cuda.current_device() if visible
           else None, "architecture": arch, "sm": None,
           "stack": stack or tables.running_stack(), "assumed": what_if or each_packaged,
           "steps_aside": None}
    if what_if and not each_packaged:
        if capability is None and (arch is None or device_name is not None):
            raise UsageError("--capability", "give the assumed GPU's compute capability "
                             "(9.0 for an H200)" + ("" if visible else ": no CUDA GPU is visible"))
        if capability is not None:
            out["name"], out["architecture"] = device_name, capability
        elif device_name is not None:
            out["name"] = device_name
    elif not visible and not each_packaged:
        out["steps_aside"] = NO_GPU
    elif visible and torch.version.hip:
        out["steps_aside"] = ROCM
    if out["architecture"] is not None:
        out["architecture"] = list(out["architecture"])
        out["sm"] = tables.architecture_name(tuple(out["architecture"]))
    return out


# Other GPUs of a measured architecture, named where the report answers for its architecture
# file (those of the measured GPU left out).
OTHER_GPUS = {"sm_90": ("H100", "H800", "H20", "H200")}


def packaged_gpus() -> list[dict[str, Any]]:
    """The GPUs the packaged tables cover, each once whatever its stacks: one per device file
    (``basis`` ``measured``), then one per architecture file (``derived``: the architecture's
    other GPUs, which read it), each with the ``label`` the report gives it."""
    devices: dict[str, dict[str, Any]] = {}
    architectures: dict[str, dict[str, Any]] = {}
    for path in sorted(tables.PACKAGED_DIR.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            sm = re.fullmatch(r"sm_([1-9][0-9]*)([0-9])", data["architecture"])
            device, derived = data["device"], data.get("derived") or {}
        except (OSError, ValueError, TypeError, KeyError):
            continue  # the tables line of each GPU names an unreadable file of its chain
        if sm is None:
            continue
        architecture = [int(sm[1]), int(sm[2])]
        if device:
            devices.setdefault(device, {"name": device, "architecture": architecture,
                                        "basis": "measured", "label": f"{device} (measured)"})
        else:
            architectures.setdefault(data["architecture"], {
                "name": None, "architecture": architecture, "basis": "derived",
                "from": derived.get("device")})
    for arch, entry in architectures.items():
        measured = {_short_gpu(d["name"]) for d in devices.values() if d["architecture"]
                    == entry["architecture"]}
        others = [gpu for gpu in OTHER_GPUS.get(arch, ()) if gpu not in measured]
        entry["label"] = (f"other {arch} GPUs" + (f" such as the {', '.join(others)}" if others
                                                  else "")
                          + (f" (derived from the {_short_gpu(entry['from'])}'s points)"
                             if entry["from"] else ""))
        del entry["from"]
    return [*devices.values(), *architectures.values()]


def _short_gpu(device_name: str) -> str:
    """``NVIDIA H200`` -> ``H200``."""
    return device_name.removeprefix("NVIDIA ").strip()


def _packaged_answer(each: dict[str, Any], stack: str, found: list[_Found],
                     answered: list[_Found]) -> dict[str, Any]:
    """What the engines found and the versions answered for would do on a GPU of
    :func:`packaged_gpus` under ``stack``: its tables and hooks, as ``--device-name`` (or
    ``--capability`` alone, for an architecture's other GPUs) answers."""
    architecture = tuple(each["architecture"])
    gpu = {**each, "sm": tables.architecture_name(architecture), "stack": stack}
    with tables.assuming(each["name"], stack):
        return {**gpu, "tables": _tables(gpu, architecture),
                "engines": {f.engine: _engine_on(f, architecture, each["name"]) for f in found},
                "assumed_engines": [_engine_on(f, architecture, each["name"]) for f in answered]}


@contextlib.contextmanager
def _collected_warnings() -> Iterator[list[str]]:
    """The WARNING lines dsv4spec's plugins log meanwhile (a missing table, a malformed file, a
    switch value), kept for the report instead of printed."""
    logger = logging.getLogger("dsv4spec")
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, PATH_MISMATCH, False):  # the DeepGEMM cases are reported apart
                return
            # a packaged file by its name, as the tables line names it (not this machine's path)
            text = record.getMessage().replace(str(tables.PACKAGED_DIR) + os.sep, "packaged ")
            messages.append(" ".join(text.split()))

    handler = Collect(logging.WARNING)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _tables(gpu: dict, architecture: tuple[int, int] | None) -> dict[str, Any]:
    """The table files for this GPU: each file of its chain under this stack that exists, then
    those named for it under other stacks (``<device>.triton<M.m>.json``), with the stack each
    was measured under (or why it is unreadable), and those serving, in order."""
    out: dict[str, Any] = {"user_dir": str(tables.user_dir()),
                           "packaged_dir": str(tables.PACKAGED_DIR), "files": [], "serving": []}
    if architecture is None:
        return out
    for path in [*tables.candidates(gpu["name"], architecture, gpu["stack"]),
                 *_other_stack_files(gpu["name"], architecture)]:
        if not path.is_file() or any(f["path"] == str(path) for f in out["files"]):
            continue
        try:
            stack, _ = tables.read_file_with_stack(path)
            out["files"].append({"path": str(path), "stack": stack, "error": None})
        except (OSError, ValueError, UnicodeDecodeError) as e:
            out["files"].append({"path": str(path), "stack": None, "error": str(e)})
    out["serving"] = [str(p) for p in tables.chain_files(architecture, gpu["name"])]
    # the files of rows measured against the engines' DeepGEMM path, read first where it is on
    out["deepgemm_serving"] = [str(p) for p in tables.chain_files(architecture, gpu["name"],
                                                                  deepgemm=True)]
    return out


def _other_stack_files(device_name: str | None, architecture: tuple[int, int]) -> list[Path]:
    """The files named for this GPU with a stack (``NVIDIA_H200.triton3.8.json``,
    ``sm_90.triton3.8.json``), in the order of its chain: the user directory's device files,
    the packaged device files, the packaged architecture files."""
    stems = [(where, tables.device_file_name(device_name).removesuffix(".json"))
             for where in (tables.user_dir(), tables.PACKAGED_DIR)] if device_name else []
    stems.append((tables.PACKAGED_DIR, tables.architecture_name(architecture)))
    found = []
    for where, stem in stems:
        if where.is_dir():
            found += sorted((path for path in where.iterdir()
                             if path.name.startswith(f"{stem}.triton") and path.suffix == ".json"),
                            key=lambda path: _version_key(path.name[len(stem) + 7:-5]))
    return found


class _Found(NamedTuple):
    """An engine's source and manifest verdicts, whatever the GPU: ``fields`` its report but the
    hooks; ``found``, whether its source or a tested version is answered for."""

    engine: str
    plugin: Any
    fields: dict[str, Any]
    verdicts: dict[str, manifest.Verdict]
    found: bool


def _engine_source(engine: str, source: Path | None, assumed: str | None = None) -> _Found:
    """One engine's source and verdicts: ``source`` (a tree given), else the installed one; with
    ``assumed`` (a tested version), that version's as its packaged manifest records it."""
    name, module = ENGINES[engine]
    plugin = importlib.import_module(module)
    tested = plugin.manifests()
    if assumed is not None:
        version, root = assumed, None
        verdicts = _manifest_verdicts(plugin, assumed, tested)
    else:
        version, root = ((None, Path(source)) if source is not None
                         else _installed(engine, plugin))
        verdicts = manifest.verdicts(plugin.ENGINE_SPEC, root, tested) if root is not None else {}
    coverage = {}
    if root is not None:
        for model_module in plugin.ENGINE_SPEC.model_modules:
            new = manifest.uncovered(plugin.ENGINE_SPEC, root, tested, model_module)
            if new:
                coverage[model_module] = new
    installed = root is not None and source is None
    fields = {"name": name, "installed": None if assumed else version,
              "assumed": assumed, "source": None if root is None else str(root),
              "source_given": source is not None,
              "import_error": import_error(engine) if installed else None,
              "tested": [m["version"] for m in tested], "coverage_changed": coverage}
    return _Found(engine, plugin, fields, verdicts, root is not None or assumed is not None)


def _engine_on(found: _Found, architecture: tuple[int, int] | None,
               device_name: str | None) -> dict[str, Any]:
    """The engine of ``found`` on a GPU of ``architecture`` named ``device_name``: each hook's
    manifest verdict, switch, gate and ranges."""
    plugin = found.plugin
    gates = plugin.gates()
    hooks = {}
    for hook in plugin.HOOKS:
        verdict = found.verdicts.get(hook.name)
        gate = gates.get(hook.name)
        on = plugin.switched_on(hook)
        hooks[hook.name] = {
            "target": hook.target, "switch": hook.switch, "switched_on": on,
            "switch_setting": _switch_setting(plugin, hook),
            "verdict": None if verdict is None else {
                "ok": verdict.ok, "matches": verdict.matches, "absent": verdict.absent,
                "reason": verdict.reason},
            "installs": found.found and on and plugin.installs(verdict),
            **_gate_report(found.engine, gate, architecture, device_name)}
    for entry in hooks.values():  # a hook that hands over another's launch acts where it does
        if entry["follows"] is not None:
            followed = hooks.get(entry["follows"], {})
            entry["serves"] = bool(followed.get("serves"))
    for entry in hooks.values():
        entry["acts"] = bool(entry["installs"] and entry["serves"])
    return {**found.fields, "hooks": hooks}


def _switch_setting(plugin: Any, hook: Any) -> str:
    """The environment switch that turns ``hook`` off as it is set (the plugin's master switch
    first, where it has one), or its own switch's setting where none does."""
    for switch in (getattr(plugin, "MASTER_SWITCH", None), hook.switch):
        if switch is not None and not switch_on(switch):
            return switch_setting(switch, True)
    return switch_setting(hook.switch, True)


# engine -> why ``import <engine>`` fails in this environment (None: it imports), asked once
_import_errors: dict[str, str | None] = {}
IMPORT_TIMEOUT_S = 120


def import_error(engine: str) -> str | None:
    """Why ``import <engine>`` fails in a fresh interpreter of this environment (its exception's
    last line), or None where it imports; asked once per process, in a subprocess, so that the
    doctor itself imports neither engine."""
    if engine not in _import_errors:
        try:
            done = subprocess.run([sys.executable, "-c", f"import {engine}"],
                                  capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            _import_errors[engine] = f"it did not finish in {IMPORT_TIMEOUT_S} s"
        except OSError as e:
            _import_errors[engine] = f"{type(e).__name__}: {e}"
        else:
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            _import_errors[engine] = (None if done.returncode == 0 else lines[-1] if lines
                                      else f"exit status {done.returncode}")
    return _import_errors[engine]


def _manifest_verdicts(plugin: Any, version: str,
                       tested: list[dict]) -> dict[str, manifest.Verdict]:
    """Each hook's verdict for the tested ``version`` as its manifest records it: matching that
    version where the manifest fingerprints the hook, not defined where it holds none."""
    recorded = next(m for m in tested if m["version"] == version)["hooks"]
    return {hook: manifest.Verdict(hook, [version]) if recorded.get(hook) else manifest.Verdict(
        hook, [], absent=True, reason=f"{plugin.ENGINE_SPEC.engine} {version} does not define it")
        for hook in plugin.ENGINE_SPEC.hooks}


def _installed(engine: str, plugin: Any) -> tuple[str | None, Path | None]:
    """The installed engine's version and source root, as its plugin finds them (nothing of the
    engine imported)."""
    if engine == "sglang":
        from dsv4spec.integrations.sglang.source import sglang_root

        try:
            root = sglang_root()
        except Exception:  # noqa: BLE001 - the plugin's rule: an unreadable root steps aside
            root = None
        return plugin.installed_sglang_version(), root
    return plugin.installed_vllm_version(), plugin.installed_source_root()


def _gate_report(engine: str, gate: Any, architecture: tuple[int, int] | None,
                 device_name: str | None) -> dict[str, Any]:
    """What a hook's gate says on this GPU: its kind, table file, ops, and per case and mode the
    ranges of counts its decision function gives to dsv4spec, per key."""
    out: dict[str, Any] = {"kind": None, "ops": [], "table": None, "table_file": None,
                           "key": None, "count": None, "between_keys": None, "ranges": {},
                           "serves": False, "follows": None, "note": ""}
    if gate is None:  # a hook without a declared gate: reported, never assumed to serve
        out["kind"] = "undeclared"
        return out
    out.update(ops=list(gate.ops), follows=gate.follows, note=gate.note, key=gate.key,
               count=gate.count)
    if gate.follows is not None:
        out["kind"] = "follows"
        return out
    if gate.table is None and gate.prefers is None and not gate.stack_gated:
        out["kind"] = "no kernel"
        out["serves"] = architecture is not None
        return out
    if architecture is None:
        out["kind"] = "table" if gate.table is not None else "stack"
        return out
    stack_ok = not gate.stack_gated or tables.stack_validated(architecture, device_name)
    if gate.table is not None:
        out["kind"] = "table"
        out["table"] = gate.table.hook
        path, entry = tables.hook_entry(gate.table.engine, gate.table.hook, architecture,
                                        device_name)
        out["table_file"] = None if path is None else str(path)
        if gate.deepgemm_table is not None:
            path_on, _ = tables.hook_entry(gate.table.engine, gate.table.hook, architecture,
                                           device_name, deepgemm=True)
            out["deepgemm_table_file"] = None if path_on is None else str(path_on)
        if entry is not None:
            out.update(key=entry["key"], count=entry["count"],
                       between_keys=entry["between_keys"])
    else:
        out["kind"] = "stack"
        out["table_file"] = next(iter(tables.chain_files(architecture, device_name)), None)
        out["table_file"] = None if out["table_file"] is None else str(out["table_file"])
    if gate.prefers is None:
        out["serves"] = stack_ok
        return out
    for label, case in gate.cases.items():
        ranges = served_ranges(gate, architecture, case) if stack_ok else {}
        out["ranges"][label] = {mode: {("*" if key is None else str(key)): spans
                                       for key, spans in keyed.items()}
                                for mode, keyed in ranges.items()}
    out["serves"] = any(spans for modes in out["ranges"].values() for keyed in modes.values()
                        for spans in keyed.values())
    return out


def served_ranges(gate: Any, architecture: tuple[int, int],
                  case: dict[str, Any] | None = None) -> dict[str, dict[Any, list[list[int]]]]:
    """Per mode and key, the inclusive ranges of counts at which ``gate.prefers`` gives a call to
    dsv4spec on ``architecture``: every count from 1 past the largest its table holds (past
    ``gate.max_count`` without a table) asked of the decision function itself, at the table's
    measured keys (key None without a table: every key). In the case ``deep_gemm=True`` the
    rows measured against the engine's DeepGEMM path are the table where they cover the GPU."""
    case = case or {}
    table = gate.table
    if case.get("deep_gemm") and gate.deepgemm_table is not None:
        table = rows_for(table, gate.deepgemm_table, architecture, True)
    if table is not None:
        modes = table.get(architecture)
        if modes is None:
            return {mode: {} for mode in tables.MODES}
        keys = sorted({key for mode in tables.MODES for key in modes[mode]})
        top = max((hi for mode in tables.MODES for spans in modes[mode].values()
                   for _, hi in spans), default=0)
    else:
        keys, top = [None], gate.max_count or 0
    out: dict[str, dict[Any, list[list[int]]]] = {}
    for mode in tables.MODES:
        in_graph = mode == "graph"
        out[mode] = {key: spans_of(c for c in range(1, top + 2)
                                   if gate.prefers(c, key, in_graph, architecture, **case))
                     for key in keys}
    return out


def spans_of(counts) -> list[list[int]]:
    """Increasing counts as inclusive ``[lo, hi]`` ranges: ``1 2 3 7`` -> ``[[1, 3], [7, 7]]``."""
    spans: list[list[int]] = []
    for count in counts:
        if spans and count == spans[-1][1] + 1:
            spans[-1][1] = count
        else:
            spans.append([count, count])
    return spans


# ---------------------------------------------------------------------------------------------
# Numerics


def numerics_points(report: dict) -> list[tuple[str, int | None, int]]:
    """(case of bench stack, H or None, T) for each op the acting hooks would launch: each width
    a hook serves (every DSV4 width where it serves any), at the smallest count served there;
    the widthless cases (the rollback, the metadata) once."""
    from dsv4spec.bench import stack

    points: dict[tuple[str, int | None], int] = {}
    for engine in report["engines"].values():
        for entry in engine["hooks"].values():
            if not entry["acts"]:
                continue
            widths = _served_widths(entry)
            for op in entry["ops"]:
                case = stack.OP_CASES.get(op, f"unchecked op {op}")
                if case in stack.WIDTHLESS:
                    points.setdefault((case, None), WIDTHLESS_COUNT)
                    continue
                for H, T in (widths or {W: 1 for W in stack.WIDTHS}).items():
                    points[(case, H)] = min(points.get((case, H), T), T)
    return [(case, H, T) for (case, H), T in sorted(points.items(), key=str)]


def _served_widths(entry: dict) -> dict[int, int]:
    """Hidden size -> the smallest count a hook serves there (all DSV4 widths for a gate that
    serves every key; {} where its key is not a hidden size)."""
    from dsv4spec.bench import stack

    if entry["key"] != "hidden_size":
        return {}
    widths: dict[int, int] = {}
    for modes in entry["ranges"].values():
        for keyed in modes.values():
            for key, spans in keyed.items():
                if not spans:
                    continue
                for H in (stack.WIDTHS if key == "*" else (int(key),)):
                    widths[H] = min(widths.get(H, spans[0][0]), spans[0][0])
    return widths


def _numerics(report: dict, gpu: dict, what_if: bool, enabled: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"run": False, "skipped": None, "checks": [], "ok": None,
                           "seconds": None}
    if what_if:
        out["skipped"] = "a what-if: the numerics need the GPU and the Triton assumed"
    elif gpu["steps_aside"] is not None:
        out["skipped"] = gpu["steps_aside"].split(":")[0]
    elif not enabled:
        out["skipped"] = "not asked for"
    if out["skipped"] is not None:
        return out
    points = numerics_points(report)
    if not points:
        out["skipped"] = "no hook would launch an op here"
        return out
    from dsv4spec.bench import stack

    out["run"] = True
    start = time.perf_counter()
    for seed, (case, H, T) in enumerate(points, 1):
        check = {"case": case, "H": H, "T": T, "max_rel_err": None, "error": None}
        try:
            if case not in stack.OPS:
                raise LookupError(f"bench stack has no check for {case.split()[-1]}")
            _, check["max_rel_err"] = stack.checked(case, T, H, seed)
            torch.cuda.synchronize()  # a fault of an asynchronous launch surfaces here
        except Exception as e:  # noqa: BLE001 - a failed check is the report, not a crash
            check["error"] = f"{type(e).__name__}: {' '.join(str(e).split())}"
        out["checks"].append(check)
    out["seconds"] = round(time.perf_counter() - start, 2)
    out["ok"] = all(c["error"] is None for c in out["checks"])
    return out


def _problems(report: dict) -> list[str]:
    """Why the report is not validated (empty: exit 0)."""
    problems = []
    gpu = report["gpu"]
    if gpu["steps_aside"] is not None:
        problems.append(gpu["steps_aside"])
    found = {k: e for k, e in report["engines"].items() if e["source"] is not None}
    if not found and not report["what_if"]:
        problems.append("neither SGLang nor vLLM found: no plugin would load")
    if gpu["architecture"] is not None and not report["tables"]["serving"]:
        problems.append(_no_table(_gpu_label(gpu), gpu["stack"], report["tables"]))
    for each in report["packaged_gpus"]:
        if not each["tables"]["serving"]:
            problems.append(_no_table(each["label"], each["stack"], each["tables"]))
    for key, engine in found.items():
        if engine["import_error"] is not None:
            problems.append(f"{engine['name']}: `import {key}` fails: {engine['import_error']}; "
                            f"{engine['name']} cannot start here, so none of its hooks loads")
        for name, entry in engine["hooks"].items():
            verdict = entry["verdict"]
            if entry["kind"] == "undeclared":
                problems.append(f"{engine['name']} {name}: the plugin declares no gate for it")
            if verdict is not None and not verdict["ok"] and not verdict["absent"]:
                problems.append(f"{engine['name']} {name}: its source matches no tested "
                                f"{engine['name']} ({', '.join(engine['tested']) or 'none'}): "
                                f"{verdict['reason']}" + (" (installed anyway)" if entry[
                                    "installs"] else ""))
    answered = [*found.values(), *report["assumed_engines"]]
    if (gpu["architecture"] is not None and answered
            and not any(e["acts"] for engine in answered for e in engine["hooks"].values())):
        problems.append("no hook would act on this GPU")
    for each in report["packaged_gpus"]:
        answered = [*each["engines"].values(), *each["assumed_engines"]]
        if answered and not any(e["acts"] for engine in answered
                                for e in engine["hooks"].values()):
            problems.append(f"no hook would act on {each['label']}")
    numerics = report["numerics"]
    for check in numerics["checks"]:
        if check["error"] is not None:
            problems.append(f"numerics {_point(check)}: {check['error']}")
    return problems


def _no_table(label: str, stack: str, files: dict) -> str:
    """The problem of a GPU no table of ``stack`` serves, naming the stacks its files need."""
    others = sorted({f["stack"] for f in files["files"] if f["stack"] not in (None, stack)},
                    key=_version_key)
    return (f"no table serves {label} under Triton {stack}: every table-gated hook steps aside"
            + (f" (its files need Triton {' or '.join(others)})" if others else "")
            + f"; {TUNE_HINT}")


# ---------------------------------------------------------------------------------------------
# Text


def render(report: dict) -> str:
    """The report as text for one screen."""
    gpu = report["gpu"]
    lines = [f"dsv4spec {report['dsv4spec']} doctor" + (" (what-if)" if report["what_if"]
                                                        else "")]
    if report["packaged_gpus"]:
        lines += _wrapped("GPU", "none visible: answered for each GPU the packaged tables cover "
                                 "(--device-name NAME --capability M.m asks for another)")
    elif gpu["architecture"] is None:
        lines.append(_row("GPU", f"none: {gpu['steps_aside']}" if not gpu["visible"]
                          else f"{gpu['name']}: {gpu['steps_aside']}"))
    else:
        where = "assumed" if gpu["assumed"] else f"cuda:{gpu['index']}"
        lines.append(_row("GPU", f"{_gpu_label(gpu)}, {where}"))
    t, tr = report["torch"], report["triton"]
    backend = f"CUDA {t['cuda']}" if t["cuda"] else f"HIP {t['hip']}" if t["hip"] else "CPU"
    if tr["version"] is None:
        triton_text = "Triton not installed"
    else:
        stack = tr["stack"] + ("" if tr["stack"] == tr["running_stack"] else
                               f" assumed, running {tr['running_stack']}")
        triton_text = f"Triton {tr['version']} (stack {stack})" + _direct_launch_note(tr)
    lines += _wrapped("torch", f"{t['version']} ({backend}); {triton_text}")
    if tr["version"] is None:
        return "\n".join(lines + _lines_without_triton(report))
    if not report["packaged_gpus"]:
        lines += _tables_lines(report["tables"], gpu)
    answered: dict[str, list[str]] = {}  # the versions whose hook lines follow
    if gpu["architecture"] is not None or report["packaged_gpus"]:
        for engine in report["assumed_engines"]:
            answered.setdefault(engine["name"], []).append(engine["assumed"])
    for engine in report["engines"].values():
        lines += _wrapped(engine["name"], _engine_line(engine, answered.get(engine["name"], [])))
    shown = [e for e in report["engines"].values() if e["source"] is not None]
    hooks = []
    if gpu["architecture"] is not None:
        for engine in shown + report["assumed_engines"]:
            hooks += _hooks_lines(engine, gpu, report["tables"]["serving"])
    for each in report["packaged_gpus"]:
        hooks += _wrapped("GPU", f"{each['label']}, assumed")
        hooks += _tables_lines(each["tables"], each)
        for engine in [*each["engines"].values(), *each["assumed_engines"]]:
            hooks += _hooks_lines(engine, each, each["tables"]["serving"])
    lines += hooks
    if hooks:
        lines += _wrapped("legend", LEGEND)
    lines += _numerics_lines(report["numerics"])
    for message in report["warnings"]:
        lines += _wrapped("warning", message)
    for problem in report["problems"]:
        lines += _wrapped("problem", problem)
    verdict = ("validated" + (" as far as a what-if can (no numerics)" if report["what_if"]
                              else "") if report["exit"] == 0 else "not validated")
    lines.append(_row("result", f"{verdict} (exit {report['exit']})"))
    return "\n".join(lines)


def _lines_without_triton(report: dict) -> list[str]:
    """The rest of :func:`_report_without_triton`'s screen: tables, engines, the problem."""
    stack, packaged = report["triton"]["stack"], report["tables"]["packaged_for_stack"]
    lines = _wrapped("tables", f"packaged for Triton {stack}, which the line below installs: "
                               + (", ".join(packaged) or "none"))
    for engine in report["engines"].values():
        lines += _wrapped(engine["name"], f"{engine['installed']} installed"
                          if engine["installed"] else "not installed")
    for problem in report["problems"]:
        lines += _wrapped("problem", problem)
    return lines + [_row("result", f"not validated (exit {report['exit']})")]


def _direct_launch_note(triton_report: dict) -> str:
    """What the running Triton release means for eager calls, where it is not a release the
    direct launch binds and the tables read are its stack's."""
    if (triton_report["direct_launch"] is not None
            or triton_report["stack"] != triton_report["running_stack"]):
        return ""
    return (f"; no direct launch under this release (only {', '.join(DIRECT_LAUNCH_LAYOUTS)}"
            "): the tables' eager rows do not hold, every eager call runs the engine's code")


def _row(label: str, text: str) -> str:
    return f"{label:<10}{text}"


def _wrapped(label: str, text: str, indent: int = 10) -> list[str]:
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and indent + len(line) + 1 + len(word) > WIDTH:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return [_row(label if i == 0 else "", text) for i, text in enumerate(lines)]


def _gpu_label(gpu: dict) -> str:
    sm = gpu.get("sm") or "?"
    if gpu.get("basis") == "derived":
        return f"other {sm} GPUs"
    return f"{gpu['name']} ({sm})" if gpu["name"] else sm


def _short_path(path: str) -> str:
    p = Path(path)
    for base, label in ((tables.PACKAGED_DIR, "packaged"), (tables.user_dir(), "user dir")):
        if p.parent == Path(base):
            return f"{p.name} ({label})"
    return path


def _tables_lines(files: dict, gpu: dict) -> list[str]:
    if gpu["architecture"] is None:
        packaged = sorted(p.name for p in tables.PACKAGED_DIR.glob("*.json"))
        return _wrapped("tables", f"packaged: {', '.join(packaged)}; user dir "
                        f"{files['user_dir']} (--device-name NAME --capability M.m asks what "
                        "a GPU would use)")
    serving = [_short_path(p) for p in files["serving"]]
    others = [f"{_short_path(f['path'])}: " + (f"Triton {f['stack']}" if f["error"] is None
                                               else f"unreadable ({f['error']})")
              for f in files["files"] if f["path"] not in files["serving"]]
    text = (f"{', '.join(serving)} serve{'s' if len(serving) == 1 else ''} Triton {gpu['stack']}"
            if serving else f"none of Triton {gpu['stack']} for {_gpu_label(gpu)}: {TUNE_HINT}")
    if others:
        text += (f"; also {'; '.join(others)}" if serving
                 else f"; its files of another Triton serve only under that one: "
                      f"{'; '.join(others)}")
    deepgemm = [_short_path(p) for p in files.get("deepgemm_serving", [])]
    if deepgemm:
        text += (f"; where the engine runs DeepGEMM, its mHC hooks read first "
                 f"{', '.join(deepgemm)} (rows measured against DeepGEMM's path)")
    return _wrapped("tables", text)


def _engine_line(engine: dict, answered: list[str]) -> str:
    """What was found of an engine; ``answered``: its tested versions answered for below."""
    if engine["source"] is None:
        name = engine["name"].lower()
        newest = max(engine["tested"], key=_version_key) if engine["tested"] else None
        if answered:
            return (f"not installed (--{name}-source DIR checks a source tree); answered for "
                    f"{', '.join(answered)} from the packaged manifest"
                    + ("s" if len(answered) > 1 else ""))
        return (f"not installed (--{name}-source DIR checks a source tree; --engine "
                f"{name}=={newest} answers for a tested version)" if newest else "not installed")
    where = (f"source {engine['source']}" if engine["source_given"]
             else f"{engine['installed'] or 'version unknown'} at {engine['source']}")
    verdicts = [e["verdict"] for e in engine["hooks"].values() if e["verdict"] is not None]
    defined = [v for v in verdicts if not v["absent"]]
    matching = [v for v in defined if v["ok"]]
    versions = sorted({m for v in matching for m in v["matches"]}, key=_version_key)
    text = f"{where}: {len(matching)} of {len(defined)} hooks match tested " + (
        " / ".join(versions) if versions else "none")
    absent = len(verdicts) - len(defined)
    if absent:
        text += f" ({absent} not defined by this version)"
    if len(matching) < len(defined):
        text += f"; the rest step aside (tested: {', '.join(engine['tested']) or 'none'})"
    if engine["import_error"] is not None:
        text += (f"; {'the source matches, but ' if matching else ''}`import "
                 f"{engine['name'].lower()}` fails: {engine['import_error']}")
    return text


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def _hooks_lines(engine: dict, gpu: dict, serving_files: list[str]) -> list[str]:
    """One line per hook (wrapped): what it does here; its table file where not the first one
    serving (the tables line names that)."""
    acting = sum(e["acts"] for e in engine["hooks"].values())
    serving = next(iter(serving_files), None)
    what = engine["name"] + (f" {engine['assumed']} (its packaged manifest)" if engine["assumed"]
                             else "")
    lines = [f"{what} hooks on {_gpu_label(gpu)} under Triton {gpu['stack']}: "
             f"{acting} of {len(engine['hooks'])} act"]
    width = max(len(name) for name in engine["hooks"]) + 2
    for name, entry in engine["hooks"].items():
        text = _hook_text(entry, serving)
        for i, line in enumerate(_wrapped("", text, 2 + width)):
            lines.append(f"  {name if i == 0 else '':<{width}}{line[10:]}")
    return lines


def _hook_text(entry: dict, serving: str | None = None) -> str:
    verdict = entry["verdict"]
    if not entry["switched_on"]:
        return f"off ({entry['switch_setting']})"
    if verdict is not None and verdict["absent"]:
        return "not defined by this version"
    if not entry["installs"]:
        return "steps aside: its source matches no tested version"
    if entry["kind"] == "follows":
        return (f"where {entry['follows']} acts" if entry["serves"]
                else f"steps aside, as {entry['follows']} does")
    if entry["kind"] == "no kernel":
        return entry["note"]
    if not entry["serves"]:
        return ("steps aside: no table of this stack serves this GPU" if entry["table_file"]
                is None else "steps aside: its table gives dsv4spec no count here")
    if entry["kind"] == "stack" and not entry["ranges"]:
        text = entry["note"] or "every call"
    else:
        parts = []
        for label, modes in entry["ranges"].items():
            text = _modes_text(modes, entry)
            on_file = entry.get("deepgemm_table_file") if label == "DeepGEMM on" else None
            if on_file and on_file not in (serving, entry["table_file"]):
                text += f" [{Path(on_file).name}]"
            parts.append(f"{label}: {text}" if label else text)
        text = "; ".join(parts)
    file = entry["table_file"]
    return text + (f" [{Path(file).name}]" if file and file != serving else "")


def _modes_text(modes: dict, entry: dict) -> str:
    key, count = SHORT.get(entry["key"], entry["key"]), SHORT.get(entry["count"], entry["count"])
    runs = entry["between_keys"] == "nearer_smaller"
    texts = {mode: _keyed_text(keyed, key, count, runs) for mode, keyed in modes.items()}
    if len(set(texts.values())) == 1:
        return f"graph+eager {next(iter(texts.values()))}"
    return " | ".join(f"{mode} {text}" for mode, text in texts.items())


def _keyed_text(keyed: dict, key: str, count: str, runs: bool) -> str:
    """``T 1-11 at H 4096; T 1-16 at H 7168``: the keys sharing ranges together; with ``runs``
    (keys between measured keys take the nearer smaller one's ranges), three or more measured
    keys in a row sharing ranges as ``a..b``."""
    groups: dict[str, list[str]] = {}
    order = list(keyed)
    for k, spans in keyed.items():
        if spans:
            groups.setdefault(", ".join(f"{lo}-{hi}" if hi > lo else f"{lo}" for lo, hi in spans),
                              []).append(k)
    if not groups:
        return "none"
    parts = []
    for spans, keys in groups.items():
        if keys == ["*"]:
            parts.append(f"{count} {spans} at every {key}")
            continue
        positions = [order.index(k) for k in keys]
        if runs and len(keys) >= 3 and positions == list(range(positions[0],
                                                               positions[-1] + 1)):
            where = f"{keys[0]}..{keys[-1]}"
        else:
            where = ", ".join(keys)
        parts.append(f"{count} {spans} at {key} {where}")
    return "; ".join(parts)


def _point(check: dict) -> str:
    return f"{check['case']}" + (f" H={check['H']}" if check["H"] else "") + f" T={check['T']}"


def _numerics_lines(numerics: dict) -> list[str]:
    if not numerics["run"]:
        return [_row("numerics", f"skipped: {numerics['skipped']}")]
    checks = numerics["checks"]
    failed = [c for c in checks if c["error"] is not None]
    worst = max((c["max_rel_err"] for c in checks if c["max_rel_err"] is not None), default=0.0)
    text = (f"{len(checks)} checks against the references in {numerics['seconds']:.1f} s: "
            + (f"all pass (largest error {worst:.2g} off float64)" if not failed else
               f"{len(failed)} failed") + f" ({', '.join(_point(c) for c in checks)})")
    return _wrapped("numerics", text)

