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
``ModelConfig``, built once from the published server arguments and memoised on them, which
SGLang's layers call at run time too (``srt/layers/attention/dsa/utils.py``). Nothing is imported:
a process that has not loaded SGLang's runtime context, or where the config is not readable yet
(not published), is not known to serve DeepSeek-V4, and the hooks step aside; the verdict is
remembered once read, or once the server arguments are published, since the served model is
fixed at server start.
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

_serves_dsv4: bool | None = None  # the verdict, once the model type was read


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


def _published() -> bool:
    """Whether SGLang has published its server arguments (``get_server_args()`` raises before)."""
    try:
        return sys.modules[RUNTIME_CONTEXT_MODULE].get_server_args() is not None
    except Exception:  # noqa: BLE001 - not published, or not SGLang's context
        return False


def serves_dsv4() -> bool:
    """Whether SGLang serves DeepSeek-V4 (``model_type == "deepseek_v4"``) in this process.

    False where it cannot be read: asked again at the next call while SGLang has not published
    its server arguments, remembered once they are published (then an unreadable model type is
    not DeepSeek-V4, and the model config is not rebuilt at every call); remembered once read.
    """
    global _serves_dsv4
    if _serves_dsv4 is not None:
        return _serves_dsv4
    model_type = served_model_type()
    if model_type is None:
        if not _published():
            return False
        _serves_dsv4 = False
        logger.warning("dsv4spec: SGLang's model config does not say which model it serves: "
                       "every dsv4spec hook steps aside and SGLang's own code runs")
        return False
    _serves_dsv4 = model_type == DSV4_MODEL_TYPE
    if not _serves_dsv4:
        logger.warning("dsv4spec: SGLang serves model_type %r, not %r: every dsv4spec hook steps "
                       "aside and SGLang's own code runs", model_type, DSV4_MODEL_TYPE)
    return _serves_dsv4


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
