"""Rollback of C128 compressor-ring rows written by rejected draft tokens (docs/design.md).

After a verify step, for every batch row ``b`` and every draft index ``j`` in
``[accept_lens[b], num_draft_tokens)``, ring row ``req_pool_indices[b] * ring + (seq_lens[b] + j)
% ring`` of every C128 state becomes neutral (``kv = 0``, ``score = -inf``); every other row stays
bit-identical. Three implementations, one contract:

- :func:`clear_unaccepted_c128_draft_states_reference`: pure torch, the single source of truth;
- :func:`clear_unaccepted_c128_draft_states`: one Triton launch for one state (per-layer baseline);
- :class:`C128DraftCleanup`: one Triton launch for all states through a device pointer table.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsv4spec.capture import capture_cuda_graph
from dsv4spec.kernels import triton_runs_on
from dsv4spec.kernels.c128_cleanup import (
    GRID_AXIS_LIMIT,
    c128_cleanup_fused_precompile,
    c128_cleanup_fused_triton,
    c128_cleanup_triton,
    cleanup_launch_config,
)

STATE_DTYPES = (torch.float32, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _target_rows(
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, accept_lens: torch.Tensor,
    ring_size: int, num_draft_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[B, num_draft_tokens]`` (int64) and the mask of those to neutralise."""
    j = torch.arange(num_draft_tokens, device=seq_lens.device, dtype=torch.int64)
    positions = (seq_lens.to(torch.int64)[:, None] + j) % ring_size
    rows = req_pool_indices.to(torch.int64)[:, None] * ring_size + positions
    rejected = j >= accept_lens.to(torch.int64)[:, None]
    return rows, rejected


def clear_unaccepted_c128_draft_states_reference(
    state: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    accept_lens: torch.Tensor, *, ring_size: int, num_draft_tokens: int,
) -> torch.Tensor:
    """Neutralise the rows of rejected drafts in one state, in place (pure torch, any device).

    Parameters
    ----------
    state : Tensor ``[rows, 2 * half]``
        ``[kv | score]`` rows; row ``slot * ring_size + position % ring_size``.
    req_pool_indices, seq_lens, accept_lens : Tensor ``[B]``, integer
        Request slot, committed length before verify, and accepted count (verified-in token
        included, in ``[1, num_draft_tokens]``) of each batch row.
    ring_size, num_draft_tokens : int
        Rows per slot; positions written by verify per batch row.

    Returns
    -------
    Tensor
        ``state``. Rows outside ``[0, rows)`` are skipped, as in the kernels.
    """
    if num_draft_tokens <= 1 or req_pool_indices.numel() == 0:
        return state
    rows, rejected = _target_rows(req_pool_indices, seq_lens, accept_lens, ring_size,
                                  num_draft_tokens)
    keep = rejected & (rows >= 0) & (rows < state.shape[0])
    rows = rows[keep]
    half = state.shape[1] // 2
    state[rows, :half] = 0
    state[rows, half:] = float("-inf")
    return state


def _check_index_tensors(
    device: torch.device, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    accept_lens: torch.Tensor,
) -> None:
    named = (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens),
             ("accept_lens", accept_lens))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in INDEX_DTYPES:
            raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D [batch], got shape {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, the states are on {device}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    batch = req_pool_indices.shape[0]
    for name, t in named[1:]:
        if t.shape[0] != batch:
            raise ValueError(f"{name} has {t.shape[0]} entries, req_pool_indices has {batch}")


def _index_ok(t, device) -> bool:
    return (type(t) is torch.Tensor and (t.dtype is torch.int32 or t.dtype is torch.int64)
            and t.dim() == 1 and t.device == device and t.is_contiguous())


def _index_tensors_look_valid(
    device: torch.device, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    accept_lens: torch.Tensor,
) -> bool:
    """The common valid call in one pass (an eager clear is launch-bound: its checks count);
    False sends the call to :func:`_check_index_tensors`, which names what is wrong."""
    return (_index_ok(req_pool_indices, device) and _index_ok(seq_lens, device)
            and _index_ok(accept_lens, device)
            and req_pool_indices.shape[0] == seq_lens.shape[0] == accept_lens.shape[0])


def _check_index_values(
    num_rows: int, ring_size: int, num_draft_tokens: int, req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor, accept_lens: torch.Tensor,
) -> None:
    """Value checks (synchronises with the device): every target row lies in the state."""
    if req_pool_indices.numel() == 0 or num_draft_tokens <= 1:
        return
    accept = accept_lens.to(torch.int64)
    if bool(((accept < 1) | (accept > num_draft_tokens)).any()):
        raise ValueError(f"accept_lens must lie in [1, num_draft_tokens={num_draft_tokens}], "
                         f"got min {int(accept.min())}, max {int(accept.max())}")
    if bool((seq_lens < 0).any()):
        raise ValueError(f"seq_lens must be >= 0, got min {int(seq_lens.min())}")
    slots = req_pool_indices.to(torch.int64)
    max_slot = (num_rows - ring_size) // ring_size
    if bool(((slots < 0) | (slots > max_slot)).any()):
        raise ValueError(f"req_pool_indices must lie in [0, {max_slot}] for {num_rows} rows and "
                         f"ring_size {ring_size}, got min {int(slots.min())}, "
                         f"max {int(slots.max())}")


def _check_state(state: torch.Tensor, ring_size: int, name: str = "state") -> None:
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(state).__name__}")
    if state.dtype not in STATE_DTYPES:
        raise ValueError(f"{name} must be float32 or bfloat16, got {state.dtype}")
    if state.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, 2*half], got shape {tuple(state.shape)}")
    if not state.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    width = state.shape[1]
    if width <= 0 or width % 2:
        raise ValueError(f"{name} width must be positive and even ([kv | score]), got {width}")
    if not isinstance(ring_size, int) or ring_size <= 0:
        raise ValueError(f"ring_size must be a positive int, got {ring_size!r}")
    if state.shape[0] < ring_size:
        raise ValueError(f"{name} has {state.shape[0]} rows, fewer than one ring ({ring_size})")


def clear_unaccepted_c128_draft_states(
    state: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    accept_lens: torch.Tensor, *, ring_size: int, num_draft_tokens: int, check: bool = False,
) -> torch.Tensor:
    """Neutralise rejected-draft rows of ONE state with one Triton launch (per-layer baseline).

    Same contract and arguments as :func:`clear_unaccepted_c128_draft_states_reference`. Runs the
    reference where Triton cannot run (CPU without ``TRITON_INTERPRET=1``). ``check=True``
    validates index values first (host sync) and raises ``ValueError`` instead of masking.
    """
    _check_state(state, ring_size)
    _check_index_tensors(state.device, req_pool_indices, seq_lens, accept_lens)
    if check:
        _check_index_values(state.shape[0], ring_size, num_draft_tokens, req_pool_indices,
                            seq_lens, accept_lens)
    if num_draft_tokens <= 1 or req_pool_indices.numel() == 0:
        return state
    if not triton_runs_on(state.device):
        return clear_unaccepted_c128_draft_states_reference(
            state, req_pool_indices, seq_lens, accept_lens, ring_size=ring_size,
            num_draft_tokens=num_draft_tokens)
    c128_cleanup_triton(state, ring_size, req_pool_indices, seq_lens, accept_lens,
                        num_draft_tokens)
    return state


class C128DraftCleanup:
    """Fused rollback of every C128 state in one kernel launch.

    Validates the states once, keeps strong references to them, builds the device ``int64``
    table of their base addresses once (do it before any CUDA-graph capture), and caches the
    launch geometry. :meth:`clear` then costs one launch: no host sync, no allocation, and a
    CUDA-graph replay reads the index tensors' current values.

    Parameters
    ----------
    states : sequence of Tensor ``[rows, 2 * half]``
        Same shape, dtype (float32 or bfloat16), device and strides; contiguous.
    ring_size : int
        Rows per request slot (256 with speculation).
    max_num_draft_tokens : int
        Largest ``num_draft_tokens`` :meth:`clear` will see; sizes the grid-limit check.
    """

    def __init__(self, states: Sequence[torch.Tensor], *, ring_size: int,
                 max_num_draft_tokens: int = 8) -> None:
        self.ring_size = ring_size
        self.max_num_draft_tokens = max_num_draft_tokens
        self.refresh(states)

    def refresh(self, states: Sequence[torch.Tensor] | None = None) -> None:
        """Re-validate and rebuild the pointer table (after a state was reallocated).

        When the states keep their count, shape, dtype and device, the new addresses are written
        into the existing table in place, so CUDA graphs that captured :meth:`clear` (the
        caller's, and :meth:`graphed`'s) clear the new states on their next replay. Otherwise
        a new table is built, and graphs captured before must be captured again (:meth:`graphed`
        drops its own).
        """
        states = list(self._states if states is None else states)
        self._validate(states)
        first = states[0]
        pointers = [t.data_ptr() for t in states]
        same_layout = hasattr(self, "table") and (
            (len(states), first.shape, first.dtype, first.device)
            == (self.num_states, (self.num_rows, self.width), self.dtype, self.device))
        self._states = states
        self.num_states = len(states)
        self.num_rows, self.width = first.shape
        self.half = self.width // 2
        self.dtype = first.dtype
        self.device = first.device
        self.backend = "triton" if triton_runs_on(self.device) else "torch"
        self._pointers = pointers
        new_table = torch.tensor(pointers, dtype=torch.int64, device=self.device)
        if same_layout:
            self.table.copy_(new_table)
        else:
            self.table = new_table
            self._graphs: dict = {}

    def _validate(self, states: list[torch.Tensor]) -> None:
        if len(states) == 0:
            raise ValueError("states is empty: C128DraftCleanup needs at least one state")
        for i, t in enumerate(states):
            _check_state(t, self.ring_size, name=f"states[{i}]")
        first = states[0]
        for i, t in enumerate(states[1:], start=1):
            if t.dtype != first.dtype:
                raise ValueError(f"states mix dtypes: states[0] is {first.dtype}, "
                                 f"states[{i}] is {t.dtype}")
            if t.shape != first.shape:
                raise ValueError(f"states mix shapes: states[0] is {tuple(first.shape)}, "
                                 f"states[{i}] is {tuple(t.shape)}")
            if t.stride() != first.stride():
                raise ValueError(f"states mix strides: states[0] has {first.stride()}, "
                                 f"states[{i}] has {t.stride()}")
            if t.device != first.device:
                raise ValueError(f"states mix devices: states[0] is on {first.device}, "
                                 f"states[{i}] is on {t.device}")
        _, _, n_col = cleanup_launch_config(first.shape[1] // 2, self.max_num_draft_tokens)
        if len(states) * n_col > GRID_AXIS_LIMIT:
            raise ValueError(f"{len(states)} states x {n_col} column blocks exceed the grid "
                             f"axis limit {GRID_AXIS_LIMIT}; split the states into groups")

    @property
    def states(self) -> list[torch.Tensor]:
        return list(self._states)

    def is_stale(self) -> bool:
        """True if a held state no longer lives at the address in the table (cheap, host only)."""
        return any(t.data_ptr() != p for t, p in zip(self._states, self._pointers))

    def clear(
        self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, accept_lens: torch.Tensor,
        *, num_draft_tokens: int, check: bool = False,
    ) -> None:
        """Neutralise the rows of rejected drafts in every state, in one launch.

        ``req_pool_indices``, ``seq_lens``, ``accept_lens``: ``[B]`` int32/int64 on the states'
        device. ``check=True`` (host sync) also verifies the pointer table is not stale
        and the index values address rows inside the states, raising ``ValueError`` otherwise;
        without it, out-of-range rows are skipped in the kernel.
        """
        if not _index_tensors_look_valid(self.device, req_pool_indices, seq_lens, accept_lens):
            _check_index_tensors(self.device, req_pool_indices, seq_lens, accept_lens)
        if num_draft_tokens > self.max_num_draft_tokens:
            raise ValueError(f"num_draft_tokens={num_draft_tokens} exceeds "
                             f"max_num_draft_tokens={self.max_num_draft_tokens}")
        if check:
            if self.is_stale():
                raise ValueError("pointer table is stale: a state was reallocated; "
                                 "call refresh()")
            _check_index_values(self.num_rows, self.ring_size, num_draft_tokens,
                                req_pool_indices, seq_lens, accept_lens)
        if num_draft_tokens <= 1 or req_pool_indices.shape[0] == 0:
            return
        if self.backend == "torch":
            for state in self._states:
                clear_unaccepted_c128_draft_states_reference(
                    state, req_pool_indices, seq_lens, accept_lens, ring_size=self.ring_size,
                    num_draft_tokens=num_draft_tokens)
            return
        c128_cleanup_fused_triton(
            self.table, self.dtype, self.num_states, self.num_rows, self.half, self.ring_size,
            req_pool_indices, seq_lens, accept_lens, num_draft_tokens)

    def precompile(self, num_draft_tokens: int,
                   index_dtypes: tuple[torch.dtype, ...] = (torch.int64,) * 3) -> None:
        """Compile :meth:`clear`'s kernel for every batch size with these index dtypes
        (req_pool_indices, seq_lens, accept_lens), launching nothing (a no-op off CUDA)."""
        if self.backend == "triton" and num_draft_tokens > 1:
            c128_cleanup_fused_precompile(
                self.table, self.dtype, self.num_states, self.num_rows, self.half,
                self.ring_size, tuple(index_dtypes), num_draft_tokens)

    def graphed(self, batch_size: int, num_draft_tokens: int,
                index_dtype: torch.dtype = torch.int32) -> C128CleanupGraph:
        """The clear for one (batch size, ``num_draft_tokens``) over static index buffers, as a
        CUDA graph: for eager callers that can write their indices into those buffers, e.g. as
        the ``out=`` of the ops that compute them, one replay instead of a launch. Cached per
        arguments; see :class:`C128CleanupGraph`."""
        key = (batch_size, num_draft_tokens, index_dtype)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = C128CleanupGraph(self, batch_size, num_draft_tokens,
                                                         index_dtype)
        return graph


class C128CleanupGraph:
    """:meth:`C128DraftCleanup.clear` over static index buffers, captured in a CUDA graph.

    Write ``req_pool_indices``, ``seq_lens`` and ``accept_lens`` (``[batch_size]``, on the states'
    device), then call :meth:`replay`. A replay costs one graph launch and reads the buffers'
    values at that time: no checks, no allocation, nothing rebuilt. Rows the caller leaves
    at their initial values (slot 0, length 0, ``accept_lens = num_draft_tokens``) clear nothing,
    so a smaller batch can pad. Values are the caller's to keep in range: out-of-range rows are
    skipped by the kernel, as in :meth:`C128DraftCleanup.clear`. Where no CUDA graph can be
    captured (CPU), :meth:`replay` runs that clear on the same buffers.

    Get one from :meth:`C128DraftCleanup.graphed` (it is captured there, so do that before
    capturing graphs of your own). After :meth:`C128DraftCleanup.refresh` it clears the new
    states (the pointer table is updated in place) unless their layout changed; then ask
    ``graphed`` again.
    """

    def __init__(self, cleanup: C128DraftCleanup, batch_size: int, num_draft_tokens: int,
                 index_dtype: torch.dtype = torch.int32) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(num_draft_tokens, int) or not (
                1 <= num_draft_tokens <= cleanup.max_num_draft_tokens):
            raise ValueError(f"num_draft_tokens must be an int in [1, max_num_draft_tokens="
                             f"{cleanup.max_num_draft_tokens}], got {num_draft_tokens!r}")
        if index_dtype not in INDEX_DTYPES:
            raise TypeError(f"index_dtype must be int32 or int64, got {index_dtype}")
        self.cleanup = cleanup
        self.batch_size = batch_size
        self.num_draft_tokens = num_draft_tokens
        device = cleanup.device
        self.req_pool_indices = torch.zeros(batch_size, dtype=index_dtype, device=device)
        self.seq_lens = torch.zeros(batch_size, dtype=index_dtype, device=device)
        self.accept_lens = torch.full((batch_size,), num_draft_tokens, dtype=index_dtype,
                                      device=device)
        self._graph = None
        if device.type == "cuda" and cleanup.backend == "triton":
            # The warm-up run clears nothing: every row accepts all.
            self._graph = capture_cuda_graph(self._clear, device)

    def _clear(self) -> None:
        self.cleanup.clear(self.req_pool_indices, self.seq_lens, self.accept_lens,
                           num_draft_tokens=self.num_draft_tokens)

    def replay(self) -> None:
        """Clear the rows the buffers' current values name, in every state."""
        if self._graph is None:
            self._clear()
        else:
            self._graph.replay()
