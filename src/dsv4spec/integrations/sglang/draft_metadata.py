"""AROUND hook on SGLang's multi-step DSV4 draft backend: the draft-decode graph builds the
attention metadata of the steps the draft loop runs, not of the one it never runs (the idea of
upstream SGLang PRs #32194 and #32319).

Target (SGLang 0.5.23): ``sglang.srt.layers.attention.deepseek_v4_backend.
DeepseekV4MultiStepBackend.init_forward_metadata_in_graph``, which calls
``init_forward_metadata_in_graph`` on every one of its ``speculative_num_steps`` step backends.
The draft loop reads only steps ``0 .. speculative_num_steps - 2``. The argument, from SGLang's
source (``tests/integrations/sglang/test_draft_metadata.py`` pins each point to it):

- The one caller of the multi-step method is ``run_once`` in ``EAGLEDraftCudaGraphRunner.
  capture_one_shape`` (``srt/speculative/eagle_draft_cuda_graph_runner.py``), run by the warm-up,
  the FlashInfer autotune and the capture of each draft-decode graph; its ``forward_batch`` is
  in DECODE mode. The eager path (``DeepseekV4MultiStepBackend.init_forward_metadata``) calls
  each step's own ``init_forward_metadata`` for steps ``0 .. n-2`` and never reaches the hooked
  method; ``DecodeCudaGraphRunner.capture_one_shape`` is overridden by the EAGLE runner; the
  draft-extend runners, the frozen-KV MTP runner, DSpark and UNO hold other backends.
- ``run_once`` then runs ``EagleDraftWorker.draft_forward`` (``StandaloneDraftWorker``
  inherits it), whose loop breaks at ``i == speculative_num_steps - 1`` before the forward that
  installs ``attn_backends[i]``; its idle loop runs ``range(speculative_num_steps - 1)``. The
  worker's and the backend's step counts come from the same ``get_spec().speculative_num_steps``
  (the adaptive path swaps both together), and the draft decode backend is never built for one
  step (``DraftBackendFactory.create_decode_backend`` returns None).
- One step's in-graph build writes only that step backend: it replaces ``forward_metadata``
  (raw decode -> full), clears ``tail_forward_metadata``, and fills tensors it allocates itself;
  it reads the batch without changing it. So the other steps' metadata comes out the same.
- Replay never touches the last step: ``init_forward_metadata_out_graph`` refreshes steps
  ``0 .. n-2`` only. At capture it gives every step a raw decode metadata
  (``in_capture=True``); the last step keeps that raw object, which
  ``on_after_cuda_graph_warmup`` handles as SGLang's own raw path (it only re-creates FlashMLA
  schedules on full metadata and puts the raw back).

The hook steps aside (SGLang's method runs) unless all of this is what it sees: one of SGLang's
two CUDA multi-step classes with SGLang's step classes, ``speculative_num_steps >= 2`` matching
``get_spec()``'s and the step list, each step's ``speculative_step_id`` its index, a DECODE batch,
an in-tree platform (an out-of-tree platform brings its own draft graph runner), no
``torch.compile`` tracing, and DeepSeek-V4 served (:mod:`~dsv4spec.integrations.sglang.
served_model`). The per-step calls are SGLang's own, in SGLang's order, made outside the guard:
an exception from one of them is SGLang's and propagates untouched, as it would from SGLang's
method (the guard covers only the decision, which launches nothing).

Not done here, with the reason:

- the eager device-to-device copies before each draft replay (``init_forward_metadata_out_graph``
  -> ``replay_cuda_graph_metadata_from``): each captured step holds its own ``out_cache_loc``
  buffer that its recorded build reads, so those copies are not redundant without sharing that
  buffer across steps at capture time, a change to the capture, not to one call;
- the full-width page table of an SWA-only draft: ``make_core_attn_metadata`` hands the page
  table to ``init_compression_metadata``, the indexer and ``fill_all_compressed_indices``
  depending on the ratios present; dropping it means proving every reader absent per
  configuration, which this module does not do.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

import torch

from dsv4spec.integrations.hooks import STEP_ASIDE, Gate, GuardedHook
from dsv4spec.integrations.sglang.served_model import only_for_dsv4

logger = logging.getLogger("dsv4spec.integrations.sglang")

BACKEND_MODULE = "sglang.srt.layers.attention.deepseek_v4_backend"
TRTLLM_MODULE = "sglang.srt.layers.attention.deepseek_v4_trtllm_backend"
# SGLang's CUDA multi-step DSV4 draft backends and the step classes their _make_step_backend
# builds; a class outside these may build or run its steps differently.
MULTI_STEP_CLASSES = frozenset({(BACKEND_MODULE, "DeepseekV4MultiStepBackend"),
                                (TRTLLM_MODULE, "DeepseekV4TrtllmMultiStepBackend")})
STEP_CLASSES = frozenset({(BACKEND_MODULE, "DeepseekV4AttnBackend"),
                          (TRTLLM_MODULE, "DeepseekV4TrtllmAttnBackend")})
# The hooked method, as plugin.py's Hook entry names it.
TARGET_ATTR = "DeepseekV4MultiStepBackend.init_forward_metadata_in_graph"
TARGET_PARAMS = ("self", "forward_batch")
PLATFORMS_MODULE = "sglang.srt.platforms"
RUNTIME_CONTEXT_MODULE = "sglang.srt.runtime_context"


def _class_key(obj: Any) -> tuple[str, str]:
    cls = type(obj)
    return cls.__module__, cls.__qualname__


def _in_tree_platform() -> bool:
    """Whether SGLang runs on an in-tree platform, whose draft graph runner is the EAGLE one
    (a process that has not loaded SGLang's platforms has no out-of-tree runner)."""
    platforms = sys.modules.get(PLATFORMS_MODULE)
    if platforms is None:
        return True
    try:
        return not platforms.current_platform.is_out_of_tree()
    except Exception:  # noqa: BLE001 - unreadable: not proven in-tree
        return False


def _configured_steps() -> int | None:
    """``get_spec().speculative_num_steps``, the draft worker's step count, or None."""
    context = sys.modules.get(RUNTIME_CONTEXT_MODULE)
    try:
        steps = context.get_spec().speculative_num_steps
    except Exception:  # noqa: BLE001 - not loaded, not published, or renamed
        return None
    return steps if isinstance(steps, int) else None


def steps_the_draft_loop_reads(backend: Any, forward_batch: Any) -> list | None:
    """The step backends whose in-graph metadata SGLang's draft loop reads (steps ``0 .. n-2``),
    or None where the argument in this module's docstring does not cover the call."""
    if torch.compiler.is_compiling() or _class_key(backend) not in MULTI_STEP_CLASSES:
        return None
    num_steps = getattr(backend, "speculative_num_steps", None)
    steps = getattr(backend, "attn_backends", None)
    if not (isinstance(num_steps, int) and num_steps >= 2 and isinstance(steps, list)
            and len(steps) == num_steps and _configured_steps() == num_steps):
        return None
    for index, step in enumerate(steps):
        if (_class_key(step) not in STEP_CLASSES
                or getattr(step, "speculative_step_id", None) != index
                or getattr(step, "speculative_num_steps", None) != num_steps):
            return None
    mode = getattr(forward_batch, "forward_mode", None)
    if getattr(mode, "name", None) != "DECODE" or not _in_tree_platform():
        return None
    return steps[:-1]


def _build_steps(steps: list, forward_batch: Any) -> None:
    for step in steps:
        step.init_forward_metadata_in_graph(forward_batch)


def _sglang_decides(*args: Any, **kwargs: Any) -> Any:
    return STEP_ASIDE


class DraftMetadataHook(GuardedHook):
    """A GuardedHook whose fast path only decides (the steps' builds, or STEP_ASIDE); the
    builds, SGLang's own calls, run after the guard, so their exceptions propagate."""

    def __call__(self, original: Any, *args: Any, **kwargs: Any) -> Any:
        build = super().__call__(_sglang_decides, *args, **kwargs)
        if build is STEP_ASIDE:
            return original(*args, **kwargs)
        return build()


def make_draft_metadata_hook(module: Any = None) -> GuardedHook:
    """The AROUND hook for ``DeepseekV4MultiStepBackend.init_forward_metadata_in_graph``."""

    def init_forward_metadata_in_graph(self: Any, forward_batch: Any) -> Any:
        steps = steps_the_draft_loop_reads(self, forward_batch)
        if steps is None:
            return STEP_ASIDE
        return functools.partial(_build_steps, steps, forward_batch)

    return DraftMetadataHook("DSV4 draft-decode metadata",
                             only_for_dsv4(init_forward_metadata_in_graph), logger, "SGLang")


# How the hook decides, for reports (dsv4spec doctor): it launches nothing of dsv4spec; each
# call is decided from SGLang's configuration (steps_the_draft_loop_reads).
GATES: dict[str, Gate] = {
    "DSV4 draft-decode metadata": Gate(
        note="launches no dsv4spec kernel: builds only the draft steps SGLang's loop reads"),
}
