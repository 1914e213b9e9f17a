"""SGLang plugin: dsv4spec's fused ops inside SGLang's DeepSeek-V4 MTP and DSpark serving paths.

Supported SGLang versions: 0.5.23.

Installed through the ``sglang.srt.plugins`` entry point ``dsv4spec`` (``pip install`` into
SGLang's environment, which it leaves as it is: docs/install.md); SGLang calls :func:`register`
in every process. Thirteen AROUND hooks under six switches (``0`` turns a switch's hooks off;
default on; the list: ``plugin.HOOKS``):

- ``DSV4SPEC_SGLANG_ROLLBACK``: ``DeepSeekV4TokenToKVPool.clear_unaccepted_c128_draft_states``,
  one fused launch for every C128 state instead of one per layer;
- ``DSV4SPEC_SGLANG_DRAFT_HC_HEAD``: ``DeepseekV4ModelNextN.hc_head``, the fused hc_head kernel
  instead of the draft's eager chain;
- ``DSV4SPEC_SGLANG_DSPARK_HC_HEAD``: ``DeepseekV4ForCausalLMDSpark.collapse_hc_head``, the fused
  hc_head kernel instead of DSpark's ``hc_head_torch`` chain over the draft block's rows;
- ``DSV4SPEC_SGLANG_TARGET_HC_HEAD``: ``DeepseekV4Model.hc_head``, the fused hc_head kernel where
  it measured faster than SGLang's ``fused_hc_head``;
- ``DSV4SPEC_SGLANG_MHC``: ``mhc_pre``, ``mhc_post`` and ``mhc_fused_post_pre`` of
  ``sglang.kernels.ops.layernorm.mhc``, dsv4spec's mHC ops where the measured tables of
  :mod:`dsv4spec.integrations.sglang.mhc` say they are faster;
- ``DSV4SPEC_SGLANG_METADATA``: six DSV4 attention-metadata targets (the page table and the C128
  page indices bounded by the live length, the verify row expansion, ``DSV4AttnMetadata``'s
  compression and FlashMLA fields in one launch, the draft-decode steps the draft loop reads;
  :mod:`dsv4spec.integrations.sglang.metadata`, :mod:`dsv4spec.integrations.sglang.
  draft_metadata`).

Every hook runs dsv4spec's path only while SGLang serves DeepSeek-V4 (the HF config's
``model_type``, :mod:`dsv4spec.integrations.sglang.served_model`) and falls back to SGLang's
original wherever dsv4spec's path cannot apply. A failure before dsv4spec's first launch of a
call switches that hook off and SGLang's original serves the call; a failure after a launch
inside a CUDA-graph capture cannot be undone (the capture is invalidated), so everything that
can fail is checked before the first launch. Importing this package does not import ``sglang``.
"""

from dsv4spec.integrations.sglang.plugin import register

__all__ = ["register"]
