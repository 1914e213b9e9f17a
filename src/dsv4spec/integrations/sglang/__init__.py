"""SGLang plugin: dsv4spec's fused ops inside SGLang's DeepSeek-V4 MTP serving path.

Supported SGLang versions: 0.5.23.

Installed through the ``sglang.srt.plugins`` entry point ``dsv4spec`` (``pip install
dsv4spec[sglang]``); SGLang calls :func:`register` in every process. Six AROUND hooks under
four switches (``0`` turns a switch's hooks off; default on):

- ``DSV4SPEC_SGLANG_ROLLBACK``: ``DeepSeekV4TokenToKVPool.clear_unaccepted_c128_draft_states``,
  one fused launch for every C128 state instead of one per layer;
- ``DSV4SPEC_SGLANG_DRAFT_HC_HEAD``: ``DeepseekV4ModelNextN.hc_head``, the fused hc_head kernel
  instead of the draft's eager chain;
- ``DSV4SPEC_SGLANG_TARGET_HC_HEAD``: ``DeepseekV4Model.hc_head``, the fused hc_head kernel where
  it measured faster than SGLang's ``fused_hc_head``;
- ``DSV4SPEC_SGLANG_MHC``: ``mhc_pre``, ``mhc_post`` and ``mhc_fused_post_pre`` of
  ``sglang.kernels.ops.layernorm.mhc``, dsv4spec's mHC ops where the measured tables of
  :mod:`dsv4spec.integrations.sglang.mhc` say they are faster (empty until measured: SGLang's
  own everywhere).

Each falls back to SGLang's original wherever dsv4spec's path cannot apply. Importing this
package does not import ``sglang``.
"""

from dsv4spec.integrations.sglang.plugin import register

__all__ = ["register"]
