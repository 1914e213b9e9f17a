"""Public ops: references, Triton dispatch and validated helpers."""

from dsv4spec.ops.c128_cleanup import (
    C128CleanupGraph,
    C128DraftCleanup,
    clear_unaccepted_c128_draft_states,
    clear_unaccepted_c128_draft_states_reference,
)

__all__ = [
    "C128CleanupGraph",
    "C128DraftCleanup",
    "clear_unaccepted_c128_draft_states",
    "clear_unaccepted_c128_draft_states_reference",
]
from dsv4spec.ops.hc_head import (  # noqa: E402, F401
    hc_head,
    hc_head_reference,
    hc_head_rmsnorm,
    hc_head_rmsnorm_reference,
)
from dsv4spec.ops.mhc import (  # noqa: E402, F401
    mhc_post,
    mhc_post_pre,
    mhc_post_pre_reference,
    mhc_post_reference,
    mhc_pre,
    mhc_pre_reference,
)
from dsv4spec.ops.mhc_post_head import (  # noqa: E402, F401
    mhc_post_head,
    mhc_post_head_reference,
)
