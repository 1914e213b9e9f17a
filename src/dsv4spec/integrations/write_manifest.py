"""The generator of the packaged manifests (:mod:`dsv4spec.integrations.manifest`), from each
plugin's ``ENGINE_SPEC``: it sits above both plugins, which read the manifests through that
module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dsv4spec.integrations import manifest
from dsv4spec.integrations.manifest import MANIFEST_DIR, EngineSpec, generate, manifest_name


def main(argv: list[str] | None = None) -> int:
    """``python -m dsv4spec.integrations.write_manifest ENGINE SOURCE_ROOT VERSION [OUT_DIR]``:
    write the manifest of ENGINE (``vllm`` or ``sglang``) at VERSION from the source under
    SOURCE_ROOT (the directory holding the package folder) into OUT_DIR (default: the packaged
    ``manifests/``)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4) or args[0] not in ("vllm", "sglang"):
        print(main.__doc__, file=sys.stderr)
        return 2
    engine, root, version = args[:3]
    spec = engine_spec(engine)
    if not (Path(root) / spec.package).is_dir():
        print(f"{root} holds no {spec.package}/ folder", file=sys.stderr)
        return 2
    out = Path(args[3]) if len(args) == 4 else Path(manifest.__file__).parent / MANIFEST_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / manifest_name(engine, version)
    path.write_text(json.dumps(generate(spec, Path(root), version), indent=1) + "\n")
    print(f"{engine} {version}: manifest written to {path}")
    return 0


def engine_spec(engine: str) -> EngineSpec:
    """The spec of ``engine`` (``"vllm"`` or ``"sglang"``), from its plugin."""
    if engine == "vllm":
        from dsv4spec.integrations.vllm.plugin import ENGINE_SPEC
    elif engine == "sglang":
        from dsv4spec.integrations.sglang.plugin import ENGINE_SPEC
    else:
        raise ValueError(f"engine must be 'vllm' or 'sglang', got {engine!r}")
    return ENGINE_SPEC


if __name__ == "__main__":
    sys.exit(main())
