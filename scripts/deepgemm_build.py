"""Compile sgl-deep-gemm's ``_C.so`` in an unpacked bundle against the running torch, with the
release's own ``deep_gemm/build_ext.py`` (what ``import deep_gemm`` does where ``_C.so`` is
absent), so the failure, if any, is a compiler log rather than an import error.

    python scripts/deepgemm_build.py [--dry-run] SITE

SITE holds ``deep_gemm/`` (the wheel's package without ``_C.so``), ``csrc/`` (the release's
sources) and ``include-extra/`` (elfutils' headers, put on CPATH: deep_jit includes
``elfutils/libdwfl.h``): ``scripts/deepgemm-bundle.sh sgl`` builds it. The release needs a C++20
compiler with ``<format>`` (GCC 13 or newer). ``--dry-run`` prints the command and checks
that the source and every include folder it names exist (CUDA's only where a toolkit is
found), without compiling; it needs torch, not a GPU. ``build_ext.py`` is loaded by path, so
``deep_gemm`` itself is never imported here.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

# include folders build_ext.py names for a source checkout, which the wheel's
# deep_gemm/include replaces (it carries cute, cutlass and deep_jit)
CHECKOUT_ONLY = ("third-party/cutlass/include", "third-party/deep_jit/include")


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cuda_home() -> str | None:
    """The toolkit build_ext.py would use: CUDA_HOME or CUDA_PATH, else where nvcc says it is
    (its ``--dryrun`` TOP: a link or wrapper script on PATH hides the toolkit from
    cuda_helpers.find_cuda_home's grandparent-folder rule), else /usr/local/cuda; None if absent."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home is None and shutil.which("nvcc"):
        dry = subprocess.run(["nvcc", "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True)
        top = re.search(r"^#\$ TOP=(.*)$", dry.stdout + dry.stderr, re.M)
        home = os.path.realpath(top[1]) if top else None
    home = home or "/usr/local/cuda"
    return home if os.path.isdir(home) else None


def command(site: Path, cuda: str) -> list[str]:
    build_ext = load(site / "deep_gemm" / "build_ext.py", "_deepgemm_build_ext")
    return build_ext.get_compile_command(str(site), str(site / "deep_gemm" / "_C.so"), cuda)


def compiler_major(cxx: str) -> int | None:
    try:
        out = subprocess.run([cxx, "-dumpversion"], capture_output=True, text=True).stdout
    except OSError:
        return None
    return int(out.split(".")[0]) if out.strip() else None


def problems(cmd: list[str], site: Path, cuda_found: bool) -> list[str]:
    """What the command names that is missing (CUDA's folders only where a toolkit was found)."""
    out = []
    major = compiler_major(cmd[0])
    if major is None or (("g++" in cmd[0] or cmd[0] == "c++") and major < 13):
        out.append(f"{cmd[0]} {major}: the release needs <format> (GCC 13 or newer)")
    if not (site / "include-extra" / "elfutils" / "libdwfl.h").is_file():
        out.append(f"no elfutils headers in {site / 'include-extra'} (libdw-dev)")
    sources = [a for a in cmd if a.endswith(".cpp")]
    if len(sources) != 1:
        out.append(f"expected one .cpp source, got {sources}")
    out += [f"missing source {s}" for s in sources if not os.path.isfile(s)]
    if "-o" not in cmd or not cmd[cmd.index("-o") + 1].endswith("_C.so"):
        out.append("no -o .../_C.so")
    for arg in cmd:
        if not arg.startswith("-I"):
            continue
        folder = arg[2:]
        if any(folder == str(site / c) for c in CHECKOUT_ONLY):
            continue
        if not os.path.isdir(folder) and (cuda_found or "/include" not in folder
                                          or folder.startswith(str(site))):
            out.append(f"missing include folder {folder}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path, help="the unpacked bundle: deep_gemm/ and csrc/")
    parser.add_argument("--dry-run", action="store_true", help="print and check, compile nothing")
    args = parser.parse_args(argv)
    site = args.site.resolve()
    if not (site / "deep_gemm" / "build_ext.py").is_file():
        print(f"deepgemm_build: {site} holds no deep_gemm/build_ext.py", file=sys.stderr)
        return 2
    cuda = cuda_home()
    if cuda is not None:
        os.environ.setdefault("CUDA_HOME", cuda)  # the kernels' JIT finds the same toolkit
    extra = site / "include-extra"
    if extra.is_dir():
        os.environ["CPATH"] = os.pathsep.join(filter(None, (str(extra), os.environ.get("CPATH"))))
        print(f"[deepgemm_build] CPATH={os.environ['CPATH']}")
    cmd = command(site, cuda or "/usr/local/cuda")
    print("[deepgemm_build] " + shlex.join(cmd), flush=True)
    found = problems(cmd, site, cuda is not None)
    for p in found:
        print(f"[deepgemm_build] {p}", file=sys.stderr)
    if args.dry_run:
        print(f"[deepgemm_build] dry run: {'well-formed' if not found else 'see above'}; CUDA "
              f"toolkit {'at ' + cuda if cuda else 'not found here (the GPU machine has one)'}")
        return 1 if found else 0
    if found or cuda is None:
        return 1
    subprocess.check_call(cmd)
    print(f"[deepgemm_build] built {site / 'deep_gemm' / '_C.so'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
