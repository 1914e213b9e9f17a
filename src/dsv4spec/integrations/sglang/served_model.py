"""Which model SGLang serves: every hook runs dsv4spec's path only for DeepSeek-V4.

The hooked functions and methods are shared with other models. GLM-5-next reaches SGLang's
``hc_pre`` / ``hc_post`` and ``apply_mhc_post_pre_boundary`` through the same module globals
(``srt/models/glm5_next.py``), at widths and ``hc_mult`` the mHC tables cover; DeepSeek-V4.1 runs
the same model and attention-backend classes (SGLang rewrites its architecture to
``DeepseekV4ForCausalLM``, ``srt/configs/deepseek_v41.py``), with page-table readers the
unwritten-tail argument of :mod:`dsv4spec.ops.attention_metadata` does not cover
(``expand_index_page_table``, DeepSelect's ``topk_page_transform``, the candidate table's paged
logits metadata). The measurements and the arguments are for DeepSeek-V4 alone.

The served model is read from the HF config's ``model_type`` (``"deepseek_v4"``; DSV4.1's is
``"deepseek_v41"``, GLM-5-next's ``"glm5_next"``), not the architecture name, through
``sglang.srt.runtime_context.process_model_config()``: SGLang's own accessor for the process's
``ModelConfig``, built from the published server arguments and memoised on them, which SGLang's
layers call at run time too (``srt/layers/attention/dsa/utils.py``). Nothing is imported: a
process that has not loaded SGLang's runtime context, or where the config is not readable yet
(not published), is not known to serve DeepSeek-V4, and the hooks step aside.

One process may serve several models in turn: SGLang's ``publish`` is last-publish-wins (an
engine rebuilt in the process after the previous one shut down), and ``use_context`` activates a
model-owned context from ``create_context``. So the verdict is remembered per published
server-arguments object, the one the active context holds (``_CONTEXT._server_args``, what
``get_server_args()`` returns): each hook call reads which that is (a few lookups, no call
into SGLang) and reuses the verdict read under it, and a new publish or another context is read
afresh. Where nothing is published the verdict is read at every call and not remembered, unless
a model type is readable all the same (a stand-in context).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch

from dsv4spec.integrations.hooks import STEP_ASIDE

logger = logging.getLogger("dsv4spec.integrations.sglang")

DSV4_MODEL_TYPE = "deepseek_v4"
RUNTIME_CONTEXT_MODULE = "sglang.srt.runtime_context"

# id(published server arguments) -> (those arguments, the verdict read under them). The entry
# holds the arguments, so their id is not reused while it exists; a handful of engines a process
# switches between stay remembered (and warned about once each), the oldest dropped past the limit.
_verdicts: dict[int, tuple[object, bool]] = {}
VERDICTS_LIMIT = 8


def served_model_type() -> str | None:
    """The HF ``model_type`` of the model SGLang serves in this process, or None where SGLang's
    runtime context is not loaded or does not answer (not published, renamed)."""
    context = sys.modules.get(RUNTIME_CONTEXT_MODULE)
    if context is None:
        return None
    try:
        model_type = context.process_model_config().hf_config.model_type
    except Exception:  # noqa: BLE001 - unreadable: not known to be DSV4
        return None
    return model_type if isinstance(model_type, str) else None


def published_arguments() -> object | None:
    """The server arguments SGLang's active runtime context holds (what ``get_server_args()``
    returns; None where nothing is published or no runtime context is loaded), read inline: the
    per-engine verdicts are keyed on it, at every hook call."""
    try:
        return sys.modules[RUNTIME_CONTEXT_MODULE]._CONTEXT._server_args
    except (KeyError, AttributeError):
        return None


def serves_dsv4() -> bool:
    """Whether SGLang serves DeepSeek-V4 (``model_type == "deepseek_v4"``) in this process, for
    the server arguments published now.

    Remembered per published arguments: the object SGLang's active runtime context holds (the
    last ``publish``, or the context ``use_context`` activated). False where the model type cannot
    be read: asked again at the next call while nothing is published; once arguments
    are published, remembered for them (an unreadable model type is not DeepSeek-V4, and the
    model config is not rebuilt at every call).
    """
    published = published_arguments()
    entry = _verdicts.get(id(published))
    if entry is not None:
        return entry[1]
    return _read_verdict(published)


def _read_verdict(published: object | None) -> bool:
    model_type = served_model_type()
    if model_type is None:
        if published is None:
            return False
        verdict = False
        logger.warning("dsv4spec: SGLang's model config does not say which model it serves: "
                       "every dsv4spec hook steps aside and SGLang's own code runs")
    else:
        verdict = model_type == DSV4_MODEL_TYPE
        if not verdict:
            logger.warning("dsv4spec: SGLang serves model_type %r, not %r: every dsv4spec hook "
                           "steps aside and SGLang's own code runs", model_type, DSV4_MODEL_TYPE)
    if len(_verdicts) >= VERDICTS_LIMIT:
        _verdicts.pop(next(iter(_verdicts)), None)
    _verdicts[id(published)] = (published, verdict)
    return verdict


def only_for_dsv4(fast: Callable[..., Any]) -> Callable[..., Any]:
    """``fast`` where SGLang serves DeepSeek-V4, else :data:`STEP_ASIDE` without calling it.

    Under ``torch.compile`` tracing it steps aside before reading anything (every fast path
    does there, and SGLang's configuration objects are not traceable).
    """

    @functools.wraps(fast)
    def gated(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling() or not serves_dsv4():
            return STEP_ASIDE
        return fast(*args, **kwargs)

    return gated
