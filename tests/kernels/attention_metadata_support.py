"""Shared by the attention-metadata tests: SGLang 0.5.23's two builders loaded by path, inputs,
poisoned outputs, and a fix for Triton 3.6's interpreter under NumPy 2 (loop bounds read from
tensors).

Triton 3.6's interpreter turns a tensor into a Python ``range`` bound with
``int(handle.data)``; its scalars are 1-element 1-D arrays, which NumPy >= 2.3 refuses to
convert. SGLang's ``_page_table_positions_kernel`` loops to a kernel argument and ours to a
loaded length, so both need the bound read as the array's single element.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from dsv4spec.integrations.sglang.source import sglang_root

POISON = -0x5A5A5A5B  # an int32 no builder writes


@contextlib.contextmanager
def interpreter_loop_bounds() -> Iterator[None]:
    """Inside: the interpreter reads a 1-element tensor as a loop bound (no-op on CUDA)."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patch(tensor, scope):
        original(tensor, scope)
        # Set after the scope's own patch: the scope restores the pre-launch attribute.
        tensor.__index__ = lambda self: int(np.asarray(self.handle.data).reshape(-1)[0])

    interpreter._patch_lang_tensor = patch
    try:
        yield
    finally:
        interpreter._patch_lang_tensor = original


def sglang_builders():
    """SGLang's ``attn_metadata_kernels`` and ``metadata_kernel`` modules (by path), or skip."""
    if sglang_root() is None:
        pytest.skip("SGLang's source is not installed")
    from dsv4spec.bench.metadata import load_sglang_metadata_kernels

    saved = {name: sys.modules.get(name) for name in list(sys.modules)
             if name == "sglang" or name.startswith("sglang.")}
    try:
        return load_sglang_metadata_kernels()
    finally:  # the stand-in packages stay out of other tests' way
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            if name not in saved:
                del sys.modules[name]


def make_batch(requests: int, seq_lens: list[int], context: int, *, device: str = "cpu",
               seed: int = 0, index_dtype: torch.dtype = torch.int64,
               rows_per_request: int = 1) -> dict:
    """A request-to-token table ``[requests, context]`` of random int32 slots and query rows:
    row ``i`` has causal length ``seq_lens[i]`` and request ``i // rows_per_request``."""
    g = torch.Generator().manual_seed(seed)
    req_to_token = torch.randint(0, 1 << 24, (requests, context), generator=g,
                                 dtype=torch.int32)
    order = torch.randperm(requests, generator=g)
    rows = len(seq_lens)
    req_pool = order[torch.arange(rows) // rows_per_request % requests]
    lengths = torch.tensor(seq_lens, dtype=torch.int32)
    out_loc = torch.randint(0, 1 << 24, (rows,), generator=g, dtype=torch.int64)
    return {"req_to_token": req_to_token.to(device),
            "req_pool": req_pool.to(index_dtype).to(device), "seq_lens": lengths.to(device),
            "positions": (lengths - 1).to(device), "out_loc": out_loc.to(device)}


@contextlib.contextmanager
def poisoned_empty() -> Iterator[None]:
    """Inside: ``torch.empty`` returns int32 tensors filled with :data:`POISON` (memory a
    builder leaves unwritten keeps it)."""
    original = torch.empty

    def empty(*args, **kwargs):
        t = original(*args, **kwargs)
        if t.dtype in (torch.int32, torch.int64):
            t.fill_(POISON)
        return t

    torch.empty = empty
    try:
        yield
    finally:
        torch.empty = original


def written_mask(shape: tuple[int, int], extent: torch.Tensor) -> torch.Tensor:
    """``[R, C]`` bool: column ``c`` of row ``r`` below ``extent[r]``."""
    columns = torch.arange(shape[1], device=extent.device)
    return columns[None, :] < extent[:, None]


def assert_compression_fields_equal(ours, theirs, seq_lens: torch.Tensor) -> torch.Tensor | None:
    """Every field of SGLang's compression metadata on ``theirs`` equals ``ours``'s (an object or
    a named tuple with the same field names): dtype, shape, strides and values, the C128 page
    indices over each row's extent. Returns that extent's mask (None without C128 indices)."""
    from dsv4spec.bench.metadata import COMPRESSION_FIELDS
    from dsv4spec.ops.attention_metadata import c128_index_extent

    written = None
    for name in COMPRESSION_FIELDS:
        a, b = getattr(ours, name), getattr(theirs, name)
        if b is None:
            assert a is None, name
            continue
        assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride()), name
        if name == "c128_page_indices":
            written = written_mask(tuple(a.shape), c128_index_extent(seq_lens, a.shape[1]))
            assert torch.equal(a[written], b[written]), name
        else:
            assert torch.equal(a, b), name
    return written

