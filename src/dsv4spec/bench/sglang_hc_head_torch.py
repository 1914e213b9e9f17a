"""SGLang's DSpark draft hc_head (``hc_head_torch``), loaded from SGLang's own source, and the
providers that time it, eager and compiled, beside dsv4spec's fused hc_head (``sglang``,
``sglang_compiled``, ``dsv4spec``: see :mod:`dsv4spec.bench.dspark`): what ``dsv4spec bench
dspark`` and ``dsv4spec tune``'s ``dspark_hc_head`` grid measure.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence

import torch

from dsv4spec.bench.hc_head import EPS, float64_reference, make_inputs, refcheck
from dsv4spec.ops import hc_head

PROVIDERS = ("sglang", "sglang_compiled", "dsv4spec")
SOURCE_FILE = "srt/models/deepseek_v4.py"
FUNCTION = "hc_head_torch"


def load_sglang_hc_head_torch() -> Callable[..., torch.Tensor]:
    """SGLang's ``hc_head_torch``, executed from its own source file (just that function).

    Raises ``FileNotFoundError`` without SGLang's source and ``ImportError`` where the function
    is missing or reads a name other than ``torch`` and ``F`` (a changed function is not timed
    as if it were the one measured before).
    """
    from dsv4spec.integrations.sglang.source import sglang_file

    path = sglang_file(SOURCE_FILE)
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == FUNCTION]
    if len(found) != 1:
        raise ImportError(f"{path}: no top-level {FUNCTION}")
    node = found[0]
    bound = {a.arg for a in (*node.args.args, *node.args.kwonlyargs)}
    bound |= {t.id for n in ast.walk(node) if isinstance(n, ast.Assign) for t in ast.walk(n)
              if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
    # names the body and the defaults read (annotations are never evaluated at a call)
    read = [*node.body, *node.args.defaults, *(d for d in node.args.kw_defaults if d)]
    free = {n.id for part in read for n in ast.walk(part) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)} - bound
    if free - {"torch", "F"}:
        raise ImportError(f"{path}: {FUNCTION} reads {sorted(free - {'torch', 'F'})}, not only "
                          "torch and F")
    namespace = {"torch": torch, "F": torch.nn.functional}
    exec(compile(ast.Module([node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[FUNCTION]


def _compiled(fn: Callable) -> Callable:
    """A fresh ``torch.compile`` of ``fn`` for one shape: Dynamo's caches are dropped first, so a
    sweep over many shapes never reaches its recompile limit (past it Dynamo runs ``fn``
    eagerly, and the row would time the chain, not its compiled kernels)."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def providers(sglang_fn: Callable, H: int, T: int, names: Sequence[str] = PROVIDERS,
              device: str = "cuda", seed: int | None = None) -> dict[str, Callable]:
    """``{name: callable}`` of the providers in ``names`` on fresh inputs ``[T, 4, H]``, each run
    once and checked against the float64 reference (``RuntimeError`` where one is off)."""
    inputs = make_inputs(T, H, device=device, seed=seed if seed is not None else 7 * H + T)
    x, hc_fn, hc_scale, hc_base, _ = inputs
    ref = float64_reference(inputs, rmsnorm=False)
    kw = {"norm_eps": EPS["norm_eps"], "hc_eps": EPS["hc_eps"]}
    compiled = _compiled(sglang_fn) if "sglang_compiled" in names else None
    every = {
        "sglang": lambda: sglang_fn(x, hc_fn, hc_scale, hc_base, **kw),
        "sglang_compiled": lambda: compiled(x, hc_fn, hc_scale, hc_base, **kw),
        "dsv4spec": lambda: hc_head(x, hc_fn, hc_scale, hc_base, **kw, impl="triton"),
    }
    fns = {name: every[name] for name in names}
    for name, fn in fns.items():
        fn()  # first sight: compiles
        refcheck("triton", fn(), ref)
    return fns
