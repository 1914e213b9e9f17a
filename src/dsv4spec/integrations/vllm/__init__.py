"""vLLM plugin: dsv4spec's hc_head and mHC ops inside vLLM's DeepSeek-V4 (NVIDIA) models.

Supported vLLM versions: 0.33.0 and 0.34.0 (a hook installs where the running vLLM's source
matches one of their packaged manifests, see :mod:`dsv4spec.integrations.manifest`).

Installed through the ``vllm.general_plugins`` entry point ``dsv4spec`` (``pip install`` into
vLLM's environment, which it leaves as it is: docs/install.md); vLLM calls :func:`register` in
every process that loads a model. Five hooks under two switches and a master switch
``DSV4SPEC_VLLM`` (``0`` turns a switch's hooks off; default on), each replacing one name in the
DeepSeek-V4 modules that call it:

- ``DSV4SPEC_VLLM_HC_HEAD``: ``hc_head_fused_kernel_tilelang`` (target, MTP and DSpark drafts);
- ``DSV4SPEC_VLLM_MHC``: ``mhc_pre_tilelang``, ``mhc_post_tilelang``,
  ``mhc_fused_post_pre_tilelang`` and (0.34.0) ``mhc_fused_post_pre_tilelang_reuse_residual``.

Each runs dsv4spec's op only where :mod:`~dsv4spec.integrations.vllm.tables` says it measured
faster and vLLM's kernel everywhere else, and for good once dsv4spec's path raises. Importing
this package does not import ``vllm``.
"""

from dsv4spec.integrations.vllm.plugin import register

__all__ = ["register"]
