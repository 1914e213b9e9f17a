"""DSV4 attention metadata: SGLang 0.5.23's page-table and compressed-metadata builders vs
dsv4spec's, bounded by the live length, in a CUDA graph and eager.

Method: a request-to-token table of 1M tokens of capacity (``--capacity``) per request, 256-token
pages (4,096 page-table columns, C128 page indices 8,192 wide), random slots; each request holds
``live`` tokens. Target-verify shape: ``bs * W`` query rows (W = 4 drafts per request, causal
lengths ``live + 1 .. live + W``), as ``make_forward_metadata_from_raw_verify`` builds them;
draft-decode shape: ``bs`` rows of length ``live``. Both providers' outputs are compared before
timing (small outputs bit-identical; tables bit-identical over each row's written extent, which
covers every position a consumer reads; see ``dsv4spec.ops.attention_metadata``). Device time per
call from ``time_in_graph`` (``do_bench_cudagraph``); ``eager_us`` is the host wall time per call
of back-to-back eager calls with one synchronize at the end (loops interleaved between
providers). SGLang's functions are its own files, loaded by path. ``calls_per_mtp_step`` says how
many times SGLang runs each builder in one MTP step (from its source, line numbers printed).

The verify row expansion (``--ops expand expand_shift``; key of the hook's table: ``qo_len``,
``--widths``): ``expand`` is the hooked method, SGLang's ``expand_extend_with_same_length`` (its
source, executed here) on the shifted lengths vs one launch of ``expand_same_length``;
``expand_shift`` adds the caller's ``seq_lens + W`` on SGLang's side and the shift folded into the
same launch on ours (what fusing the caller would save; no hook covers it). Outputs bit-identical
before timing.

``--ops compression``: SGLang's ``DSV4AttnMetadata.init_compression_metadata`` followed by
``init_flashmla_related`` (their source, executed here on a stand-in object with C4 and C128
layers, top-k 512, a 128-wide SWA table: its compressed-metadata kernel, three ``_pad_last_dim``
copies, a clamp and a fill) vs one launch of ``build_compression_metadata`` (the hooked pair);
every field compared before timing, the C128 page indices over each row's extent.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType, SimpleNamespace

import torch

from dsv4spec.bench import common
from dsv4spec.integrations.sglang.source import load_sglang_module, sglang_file
from dsv4spec.ops.attention_metadata import (
    build_compression_metadata,
    build_page_table_positions,
    c128_index_extent,
    expand_same_length,
    init_compressed_attn_metadata,
    page_table_extent,
)

PAGE_FILE = "kernels/ops/attention/dsv4/attn_metadata_kernels.py"
C128_FILE = "kernels/ops/attention/dsv4/metadata_kernel.py"
BACKEND_FILE = "srt/layers/attention/deepseek_v4_backend.py"
PAGE_SIZE = 256
SWA_WINDOW = 128  # SGLang's SWA_WINDOW for DSV4
CAPACITY = 1 << 20
DRAFTS = 4  # W: query rows per request in target verify (speculative_num_draft_tokens)
DRAFT_STEPS = 3  # draft-decode steps per MTP step with W = 4
BATCHES = (1, 8, 32, 128)
LIVE = (4096, 65536)
QUICK_MODES = ("verify",)
MODES = ("verify", "decode")
TABLE_OPS = ("page_table", "c128", "compression")
INDEX_TOPK = 512  # DSV4's indexer top-k (index_topk)
EXPAND_OPS = ("expand", "expand_shift")
OPS = TABLE_OPS + EXPAND_OPS
EXPAND_BATCHES = (1, 4, 8, 16, 32, 64, 128)
COLUMNS = ["op", "mode", "bs", "rows", "live", "qo_len", "provider", "median_us", "p20_us",
           "p80_us", "eager_us", "speedup_graph", "speedup_eager"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES),
                        help="batch sizes bs (requests)")
    parser.add_argument("--live", type=int, nargs="+", default=list(LIVE),
                        help="tokens each request holds")
    parser.add_argument("--capacity", type=int, default=CAPACITY,
                        help="context capacity per request in tokens (req_to_token's width)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=None,
                        help="query-row shapes: verify (bs * 4 rows), decode (bs rows); "
                             "default both, --quick verify only")
    parser.add_argument("--ops", nargs="+", choices=list(OPS), default=list(OPS),
                        help="page_table and c128: the live-length-bounded builders; expand: "
                             "the verify row expansion (the hooked method); expand_shift: with "
                             "the caller's seq_lens + W; compression: DSV4AttnMetadata's "
                             "init_compression_metadata + init_flashmla_related in one launch")
    parser.add_argument("--widths", type=int, nargs="+", default=[DRAFTS],
                        help="qo_len (query rows per request) of the expansion")
    parser.add_argument("--expand-batches", type=int, nargs="+", default=list(EXPAND_BATCHES),
                        help="batch sizes bs of the expansion")


class _Struct:
    """``msgspec.Struct`` where msgspec is not installed: keyword fields, as SGLang uses it."""

    def __init_subclass__(cls, **options: object) -> None:
        super().__init_subclass__()

    def __init__(self, **fields: object) -> None:
        for name, value in fields.items():
            setattr(self, name, value)


def _install_stubs() -> None:
    """``attn_metadata_kernels.py`` imports ``msgspec`` (its result structs) and ``async_h2d``
    from ``sglang.srt.utils.common`` (used only by a prefill helper never called here)."""
    from dsv4spec.bench.sglang_mhc import install_stubs

    try:
        import msgspec  # noqa: F401
    except ImportError:
        sys.modules["msgspec"] = ModuleType("msgspec")
        sys.modules["msgspec"].Struct = _Struct
    install_stubs()
    common_module = sys.modules["sglang.srt.utils.common"]
    if not hasattr(common_module, "async_h2d"):
        def async_h2d(*args, **kwargs):
            raise NotImplementedError("stand-in: SGLang's async_h2d is not loaded")

        common_module.async_h2d = async_h2d


def load_sglang_metadata_kernels(page_name: str | None = None,
                                 c128_name: str | None = None) -> tuple[ModuleType, ModuleType]:
    """SGLang's ``attn_metadata_kernels.py`` and ``metadata_kernel.py``, executed by path (module
    names: private ones by default). Raises ``FileNotFoundError`` without SGLang's source."""
    sglang_file(PAGE_FILE)
    _install_stubs()
    return (load_sglang_module(PAGE_FILE, name=page_name),
            load_sglang_module(C128_FILE, name=c128_name))


BACKEND_CLASS = "DeepseekV4AttnBackend"
EXPAND_METHOD = "expand_extend_with_same_length"


@functools.cache
def _parsed(path: Path) -> tuple[ast.Module, str]:
    # deepseek_v4_backend.py is 5,000 lines; the stand-ins take several pieces of it per object
    text = path.read_text()
    return ast.parse(text), text


def sglang_method_source(relpath: str, cls: str, name: str) -> tuple[str, int]:
    """The source of SGLang's method ``cls.name`` in ``relpath`` (dedented) and its first line."""
    tree, text = _parsed(sglang_file(relpath))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return textwrap.dedent(ast.get_source_segment(text, item)), item.lineno
    raise LookupError(f"{cls}.{name} not in {relpath}")


def load_sglang_expand(module_globals: dict | None = None):
    """SGLang's own ``DeepseekV4AttnBackend.expand_extend_with_same_length`` (its source in
    ``deepseek_v4_backend.py``, executed here over ``module_globals``, by default only ``torch``,
    all the method reads besides ``self.cuda_int32_kwargs``). Raises ``FileNotFoundError``
    without SGLang's source."""
    source, _ = sglang_method_source(BACKEND_FILE, BACKEND_CLASS, EXPAND_METHOD)
    namespace: dict = {}
    exec(compile(source, str(sglang_file(BACKEND_FILE)), "exec"),
         {"torch": torch} if module_globals is None else module_globals, namespace)
    return namespace[EXPAND_METHOD]


ATTN_METADATA_CLASS = "DSV4AttnMetadata"
ATTN_METADATA_MEMBERS = ("has_c4", "has_c128", "init_compression_metadata",
                         "init_flashmla_related")
ATTN_METADATA_FUNCTIONS = ("_pad_last_dim", "_low_ratio_compression_metadata",
                           "_low_ratio_sparse_buffers")


def sglang_function_source(relpath: str, name: str) -> str:
    """The source of SGLang's module-level function ``name`` in ``relpath``."""
    tree, text = _parsed(sglang_file(relpath))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node)
    raise LookupError(f"{name} not in {relpath}")


class _FlashMLAScheduleStandIn:
    """What the stand-in ``_create_flashmla_metadata`` returns: a fresh object per call, numbered
    (SGLang's returns a fresh FlashMLA schedule, filled by the first attention call)."""

    created = 0

    def __init__(self) -> None:
        type(self).created += 1
        self.number = type(self).created


def load_sglang_attn_metadata(c128_mod: ModuleType, module: ModuleType | None = None) -> type:
    """A stand-in of SGLang's ``DSV4AttnMetadata`` carrying its own ``has_c4``, ``has_c128``,
    ``init_compression_metadata`` and ``init_flashmla_related`` (their source in
    ``deepseek_v4_backend.py``, executed over ``module``'s globals, a fresh module by default),
    with the module-level functions they call: SGLang's ``_pad_last_dim`` and low-ratio helpers
    (its source), ``_init_compression_metadata_triton`` = ``c128_mod.init_compression_metadata``
    (as the backend imports it) and a ``_create_flashmla_metadata`` returning a fresh
    :class:`_FlashMLAScheduleStandIn`. The instance's fields are keyword arguments, the others
    None as the dataclass leaves them. Raises ``FileNotFoundError`` without SGLang's source."""
    from typing import Optional, Tuple, TypeVar

    import torch.nn.functional as F

    module = module if module is not None else ModuleType("dsv4_attn_metadata_standin")
    g = module.__dict__
    g.update(torch=torch, F=F, Optional=Optional, Tuple=Tuple, T=TypeVar("T"),
             PAGE_INDEX_ALIGNED_SIZE=64, ceil_align=lambda x, y: -(-x // y) * y,
             _init_compression_metadata_triton=c128_mod.init_compression_metadata,
             _create_flashmla_metadata=_FlashMLAScheduleStandIn)
    for name in ATTN_METADATA_FUNCTIONS:
        exec(compile(sglang_function_source(BACKEND_FILE, name), str(sglang_file(BACKEND_FILE)),
                     "exec"), g)
    members = {}
    for name in ATTN_METADATA_MEMBERS:
        source, _ = sglang_method_source(BACKEND_FILE, ATTN_METADATA_CLASS, name)
        namespace: dict = {}
        exec(compile(source, str(sglang_file(BACKEND_FILE)), "exec"), g, namespace)
        members[name] = namespace[name]
    for name in ("has_c4", "has_c128"):
        members[name] = property(members[name])

    def __init__(self, **fields: object) -> None:
        for name in _ATTN_METADATA_FIELDS:
            setattr(self, name, None)
        self.low_ratios, self.request_window_layout = (), None
        for name, value in fields.items():
            setattr(self, name, value)

    members["__init__"] = __init__
    members["__module__"] = module.__name__
    return type(ATTN_METADATA_CLASS, (), members)


# DSV4AttnMetadata's tensor fields the two methods read or write (None unless given).
_ATTN_METADATA_FIELDS = (
    "page_size", "page_table", "raw_out_loc", "cuda_int32_kwargs", "seq_lens_casual",
    "positions_casual", "swa_page_indices", "swa_topk_lengths", "index_topk", "present_ratios",
    "swa_out_cache_loc", "c4_out_loc", "c4_topk_lengths_raw", "c4_topk_lengths_clamp1",
    "c4_sparse_topk_lengths", "c4_sparse_page_indices", "c4_sparse_raw_indices", "c128_out_loc",
    "c128_page_indices", "c128_topk_lengths_clamp1", "c1_out_loc", "c1_topk_lengths_clamp1",
    "c1_sparse_topk_lengths", "c1_sparse_page_indices", "c1_sparse_raw_indices", "c2_out_loc",
    "c2_topk_lengths_clamp1", "c2_sparse_topk_lengths", "c2_sparse_page_indices",
    "c2_sparse_raw_indices", "c0_flashmla_metadata", "c1_flashmla_metadata",
    "c2_flashmla_metadata", "c4_flashmla_metadata", "c128_flashmla_metadata",
)
# What init_compression_metadata + init_flashmla_related assign (decode, C4 and C128 layers).
COMPRESSION_FIELDS = ("c4_out_loc", "c4_topk_lengths_raw", "c4_topk_lengths_clamp1",
                      "c4_sparse_topk_lengths", "c4_sparse_page_indices", "c128_out_loc",
                      "c128_topk_lengths_clamp1", "c128_page_indices", "swa_page_indices")


def _line_of(lines: list[str], pattern: str, start: int = 0) -> int:
    for i in range(start, len(lines)):
        if re.search(pattern, lines[i]):
            return i + 1
    raise LookupError(pattern)


def calls_per_mtp_step(draft_steps: int = DRAFT_STEPS) -> list[dict]:
    """How many times each builder runs in one MTP step, with the SGLang lines that say so."""
    lines = sglang_file(BACKEND_FILE).read_text().splitlines()
    verify = _line_of(lines, r"def make_forward_metadata_from_raw_verify")
    decode = _line_of(lines, r"def make_forward_metadata_from_raw_decode")
    multi = _line_of(lines, r"class DeepseekV4MultiStepBackend")
    loop = _line_of(lines, r"for attn_backend in self\.attn_backends", multi)
    expand_verify = _line_of(lines, r"self\.expand_extend_with_same_length\(", verify)
    draft_extend = _line_of(lines, r"def init_forward_metadata_draft_extend")
    expand_draft_extend = _line_of(lines, r"self\.expand_extend_with_same_length\(",
                                   draft_extend)
    out_graph = _line_of(lines, r"def init_forward_metadata_out_graph")
    draft_extend_out_graph = _line_of(lines, r"self\.init_forward_metadata_draft_extend\(",
                                      out_graph)
    core = _line_of(lines, r"def make_core_attn_metadata")
    build = _line_of(lines, r"prep = build_pages\(", core)
    compress = _line_of(lines, r"core_attn_metadata\.init_compression_metadata\(", core)
    where = "deepseek_v4_backend.py"
    return [
        {"phase": "target verify", "calls": 1,
         "source": f"{where}:{_line_of(lines, r'self.make_core_attn_metadata', verify)} "
                   f"(make_forward_metadata_from_raw_verify, in the verify graph) -> "
                   f"make_core_attn_metadata: {where}:{build} build_pages, {where}:{compress} "
                   f"init_compression_metadata (need_compress=True)"},
        {"phase": "draft decode", "calls": draft_steps,
         "source": f"{where}:{loop} (DeepseekV4MultiStepBackend.init_forward_metadata_in_graph: "
                   f"one per step backend, speculative_num_steps = {draft_steps} at W = "
                   f"{draft_steps + 1}) -> {where}:"
                   f"{_line_of(lines, r'self.make_core_attn_metadata', decode)} "
                   f"(make_forward_metadata_from_raw_decode) -> the page table; the compressed "
                   f"metadata only where the draft's pool has ratio 4 or 128 layers "
                   f"({where}:{_line_of(lines, r'if self.has_c4 or self.has_c128')}; "
                   f"none for an SWA-only draft)"},
        {"phase": "target verify, row expansion", "calls": 1,
         "source": f"{where}:{expand_verify} (make_forward_metadata_from_raw_verify, fixed "
                   f"width: in the verify graph) -> expand_extend_with_same_length"},
        {"phase": "draft extend, row expansion", "calls": 1,
         "source": f"{where}:{expand_draft_extend} (init_forward_metadata_draft_extend; eager: "
                   f"the draft-extend graph runner builds it outside the graph, "
                   f"{where}:{draft_extend_out_graph} in init_forward_metadata_out_graph)"},
    ]


def make_inputs(bs: int, live: int, capacity: int, mode: str, device: str = "cuda",
                seed: int = 0) -> dict:
    g = torch.Generator(device=device).manual_seed(seed)
    pool_slots = 1 << 24  # token slots in the KV pool
    req_to_token = torch.randint(0, pool_slots, (bs, capacity), dtype=torch.int32,
                                 device=device, generator=g)
    requests = torch.randperm(bs, device=device, generator=g)
    if mode == "verify":
        seq_lens = (live + torch.arange(1, DRAFTS + 1, device=device)).repeat(bs)
        req_pool = requests.repeat_interleave(DRAFTS)
    else:
        seq_lens = torch.full((bs,), live, device=device)
        req_pool = requests
    seq_lens = seq_lens.to(torch.int32)
    rows = seq_lens.shape[0]
    out_loc = torch.randint(0, pool_slots, (rows,), dtype=torch.int64, device=device,
                            generator=g)
    swa = torch.randint(-1, pool_slots, (rows, SWA_WINDOW), dtype=torch.int32, device=device,
                        generator=g)
    return {"req_to_token": req_to_token, "req_pool": req_pool.to(torch.int64),
            "seq_lens": seq_lens, "positions": seq_lens - 1, "out_loc": out_loc, "swa": swa}


def providers(op: str, x: dict, capacity: int, page_mod: ModuleType, c128_mod: ModuleType,
              page_table: torch.Tensor, attn_metadata: type | None = None) -> dict:
    if op == "compression":
        def sglang():
            meta = attn_metadata(
                page_size=PAGE_SIZE, page_table=page_table, raw_out_loc=x["out_loc"],
                seq_lens_casual=x["seq_lens"], positions_casual=x["positions"],
                swa_page_indices=x["swa"], index_topk=INDEX_TOPK, present_ratios=(0, 4, 128))
            meta.init_compression_metadata()
            meta.init_flashmla_related()
            return tuple(getattr(meta, name) for name in COMPRESSION_FIELDS)

        return {"sglang": sglang, "dsv4spec": lambda: tuple(build_compression_metadata(
            x["seq_lens"], x["out_loc"], page_table, x["swa"], page_size=PAGE_SIZE,
            index_topk=INDEX_TOPK))}
    if op == "page_table":
        kwargs = {"max_seq_len": capacity, "page_size": PAGE_SIZE, "swa_window": SWA_WINDOW}
        return {
            "sglang": lambda: page_mod.build_page_table_positions_triton(
                req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
                seq_lens_casual=x["seq_lens"], **kwargs),
            "dsv4spec": lambda: build_page_table_positions(
                x["req_to_token"], x["req_pool"], x["seq_lens"], **kwargs),
        }
    args = (x["seq_lens"], x["positions"], x["out_loc"], page_table, PAGE_SIZE, True)
    return {
        "sglang": lambda: c128_mod._init_compressed_attn_metadata_triton(*args),
        "dsv4spec": lambda: init_compressed_attn_metadata(*args),
    }


def expand_inputs(bs: int, qo_len: int, device: str = "cuda", seed: int = 0) -> dict:
    """Verify-shaped expansion inputs: int64 lengths and slots, as SGLang's forward batch holds
    them, and the lengths already shifted by ``qo_len`` (what the hooked method receives)."""
    g = torch.Generator(device=device).manual_seed(seed)
    seq_lens = torch.randint(1, CAPACITY - qo_len, (bs,), device=device, generator=g)
    req_pool = torch.randperm(bs, device=device, generator=g)
    return {"seq_lens": seq_lens, "shifted": seq_lens + qo_len, "req_pool": req_pool,
            "backend": SimpleNamespace(cuda_int32_kwargs={"device": device,
                                                          "dtype": torch.int32})}


def expand_providers(op: str, x: dict, bs: int, qo_len: int, method) -> dict:
    if op == "expand":
        return {
            "sglang": lambda: method(x["backend"], bs=bs, qo_len=qo_len, seq_lens=x["shifted"],
                                     req_pool_indices=x["req_pool"]),
            "dsv4spec": lambda: tuple(expand_same_length(
                x["shifted"], x["req_pool"], bs=bs, qo_len=qo_len)[1:]),
        }

    def sglang_shift():
        shifted = x["seq_lens"] + qo_len
        return (shifted, *method(x["backend"], bs=bs, qo_len=qo_len, seq_lens=shifted,
                                 req_pool_indices=x["req_pool"]))

    return {
        "sglang": sglang_shift,
        "dsv4spec": lambda: tuple(expand_same_length(
            x["seq_lens"], x["req_pool"], bs=bs, qo_len=qo_len, shift=qo_len,
            return_shifted=True)),
    }


def expand_refcheck(op: str, ours: tuple, theirs: tuple) -> None:
    if len(ours) != len(theirs) or not all(
            a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(ours, theirs)):
        raise AssertionError(f"{op}: outputs differ from SGLang's")


def _time_pair(fns: dict, quick: bool) -> list[dict]:
    """Graph and eager times of the two providers, the speedups on dsv4spec's row."""
    block = [{"provider": name, **common.time_in_graph(fn, rep_ms=10 if quick else 30)}
             for name, fn in fns.items()]
    eager = common.time_eager_side_by_side(fns, repeats=5 if quick else 15)
    for r in block:
        r["eager_us"] = eager[r["provider"]]["median_us"]
    sgl, ours = block
    ours["speedup_graph"] = sgl["median_us"] / ours["median_us"]
    ours["speedup_eager"] = sgl["eager_us"] / ours["eager_us"]
    return block


def _bench_expansion(args: argparse.Namespace) -> list[dict]:
    method = load_sglang_expand()
    rows = []
    for op in (o for o in EXPAND_OPS if o in args.ops):
        for qo_len in args.widths:
            for bs in args.expand_batches:
                x = expand_inputs(bs, qo_len, seed=bs + qo_len)
                fns = expand_providers(op, x, bs, qo_len, method)
                expand_refcheck(op, fns["dsv4spec"](), fns["sglang"]())
                torch.cuda.synchronize()
                block = [{"op": op, "mode": "verify", "bs": bs, "rows": bs * qo_len,
                          "qo_len": qo_len, **r} for r in _time_pair(fns, args.quick)]
                sgl, ours = block
                rows += block
                print(f"{op} bs={bs} qo_len={qo_len}: SGLang {sgl['median_us']:.2f}/"
                      f"{sgl['eager_us']:.1f}, dsv4spec {ours['median_us']:.2f}/"
                      f"{ours['eager_us']:.1f} µs (graph/eager)", flush=True)
    return rows


def _rows_equal(ours: torch.Tensor, theirs: torch.Tensor, extent: torch.Tensor) -> bool:
    columns = torch.arange(ours.shape[1], device=ours.device)
    inside = columns[None, :] < extent[:, None]
    return bool(torch.equal(ours[inside], theirs[inside]))


def refcheck(op: str, ours, theirs, seq_lens: torch.Tensor, capacity: int) -> None:
    if op == "compression":
        c128 = COMPRESSION_FIELDS.index("c128_page_indices")
        small = [(a, b) for i, (a, b) in enumerate(zip(ours, theirs)) if i != c128]
        if not all(a.dtype == b.dtype and a.stride() == b.stride() for a, b in small):
            raise AssertionError(f"{op}: dtypes or strides differ from SGLang's")
        table = ours[c128], theirs[c128]
        extent = c128_index_extent(seq_lens, table[0].shape[1])
    elif op == "page_table":
        small = zip((ours.seq_lens_casual, ours.positions_casual, ours.swa_topk_lengths),
                    (theirs.seq_lens_casual, theirs.positions_casual, theirs.swa_topk_lengths))
        table, extent = (ours.page_table, theirs.page_table), page_table_extent(
            seq_lens, -(-capacity // PAGE_SIZE), PAGE_SIZE)
    else:
        small = zip(ours[:8], theirs[:8])
        table, extent = (ours[8], theirs[8]), c128_index_extent(seq_lens, ours[8].shape[1])
    if not all(torch.equal(a, b) for a, b in small):
        raise AssertionError(f"{op}: per-row outputs differ from SGLang's")
    if table[0].shape != table[1].shape or not _rows_equal(*table, extent):
        raise AssertionError(f"{op}: table differs from SGLang's within the written extent")


def main(args: argparse.Namespace) -> int:
    modes = args.modes or (QUICK_MODES if args.quick else MODES)
    env = common.environment()
    floor = common.launch_floor()
    print(f"{env['device']}: empty kernel {floor['empty_kernel_graph_us']:.2f} µs in a graph, "
          f"{floor['empty_kernel_eager_us']:.2f} µs eager", flush=True)
    page_mod, c128_mod = load_sglang_metadata_kernels()
    attn_metadata = load_sglang_attn_metadata(c128_mod) if "compression" in args.ops else None
    steps = calls_per_mtp_step()
    for s in steps:
        print(f"per MTP step, {s['phase']}: {s['calls']} call(s) of each builder; {s['source']}")
    rows = []
    table_ops = [op for op in TABLE_OPS if op in args.ops]
    for mode in modes if table_ops else ():
        for bs in args.batches:
            for live in args.live:
                x = make_inputs(bs, live, args.capacity, mode, seed=bs + live)
                sgl_prep = page_mod.build_page_table_positions_triton(
                    req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
                    seq_lens_casual=x["seq_lens"], max_seq_len=args.capacity,
                    page_size=PAGE_SIZE, swa_window=SWA_WINDOW)
                for op in table_ops:
                    fns = providers(op, x, args.capacity, page_mod, c128_mod,
                                    sgl_prep.page_table, attn_metadata)
                    refcheck(op, fns["dsv4spec"](), fns["sglang"](), x["seq_lens"],
                             args.capacity)
                    torch.cuda.synchronize()
                    block = [{"op": op, "mode": mode, "bs": bs, "rows": x["seq_lens"].shape[0],
                              "live": live, **r} for r in _time_pair(fns, args.quick)]
                    sgl, ours = block
                    rows += block
                    print(f"{op} {mode} bs={bs} live={live}: SGLang {sgl['median_us']:.2f}/"
                          f"{sgl['eager_us']:.1f}, dsv4spec {ours['median_us']:.2f}/"
                          f"{ours['eager_us']:.1f} µs (graph/eager)", flush=True)
                del x, sgl_prep
                torch.cuda.empty_cache()
    rows += _bench_expansion(args)
    common.print_table(rows, COLUMNS)
    payload = {"environment": env, "launch_floor": floor, "capacity_tokens": args.capacity,
               "page_size": PAGE_SIZE, "drafts_W": DRAFTS, "calls_per_mtp_step": steps}
    notes = (f"Launch floor (empty Triton kernel): {floor['empty_kernel_graph_us']:.2f} µs in a "
             f"graph, {floor['empty_kernel_eager_us']:.2f} µs eager. Calls per MTP step (each "
             "builder): " + "; ".join(f"{s['phase']} {s['calls']} ({s['source']})"
                                      for s in steps) + ". "
             + (__doc__ or "").split("\n\n", 1)[1].replace("\n", " "))
    paths = common.write_results(args.out, "metadata", payload, rows, COLUMNS, notes=notes)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
