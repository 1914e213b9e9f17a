"""Model configuration: DSV4's ``config.json`` keys, validated, plus named presets."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RELEASED_CONFIGS = {
    "flash": Path(__file__).with_name("configs") / "DeepSeek-V4-Flash.config.json",
    "pro": Path(__file__).with_name("configs") / "DeepSeek-V4-Pro.config.json",
}
OVERLAP_RATIO = 4  # the overlapping compressor (two blocks, rows split into halves)


@dataclass(frozen=True)
class YarnScaling:
    """YaRN rotary scaling of the compressor layers (``rope_scaling`` in ``config.json``)."""

    factor: float = 16.0
    original_max_position_embeddings: int = 65536
    beta_fast: float = 32.0
    beta_slow: float = 1.0


@dataclass(frozen=True)
class ModelConfig:
    """A DSV4-style target model and its MTP draft block.

    Keys and meanings follow DSV4's ``config.json``. Deviations of this reference model: a dense
    SwiGLU FFN of width ``intermediate_size`` instead of the MoE, and ratio-4 layers attend to
    every completed compressed entry (no lightning indexer). ``compress_ratio`` is the value of
    the non-overlapping ratio (128 in DSV4; a small preset may use 16 so short sequences cross many
    block boundaries). ``compress_ratios`` has one entry per layer plus one per MTP layer (0).
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    intermediate_size: int
    compress_ratios: tuple[int, ...]
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    sliding_window: int = 128
    compress_ratio: int = 128
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: YarnScaling | None = field(default_factory=YarnScaling)
    num_nextn_predict_layers: int = 1
    max_position_embeddings: int = 1048576  # the context: prompt plus generated tokens
    bos_token_id: int = 0
    eos_token_id: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "compress_ratios", tuple(self.compress_ratios))
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "q_lora_rank", "o_lora_rank", "o_groups", "intermediate_size", "head_dim",
                    "qk_rope_head_dim", "sliding_window", "hc_mult", "hc_sinkhorn_iters",
                    "max_position_embeddings")
        for key in positive:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key} must be a positive int, got {value!r}")
        for key in ("hc_eps", "rms_norm_eps"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)!r}")
        for key in ("rope_theta", "compress_rope_theta"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)!r}")
        if self.qk_rope_head_dim % 2 or self.qk_rope_head_dim >= self.head_dim:
            raise ValueError(f"qk_rope_head_dim must be even and smaller than head_dim="
                             f"{self.head_dim} (RoPE on the last dims), got "
                             f"{self.qk_rope_head_dim}")
        if self.num_attention_heads % self.o_groups:
            raise ValueError(f"o_groups={self.o_groups} must divide num_attention_heads="
                             f"{self.num_attention_heads}")
        if self.num_nextn_predict_layers not in (0, 1):
            raise ValueError(f"num_nextn_predict_layers must be 0 or 1, got "
                             f"{self.num_nextn_predict_layers}")
        if not isinstance(self.compress_ratio, int) or self.compress_ratio <= OVERLAP_RATIO:
            raise ValueError(f"compress_ratio must be an int > {OVERLAP_RATIO} (128 in DSV4), "
                             f"got {self.compress_ratio!r}")
        expected = self.num_hidden_layers + self.num_nextn_predict_layers
        if len(self.compress_ratios) != expected:
            raise ValueError(f"compress_ratios has {len(self.compress_ratios)} entries, expected "
                             f"{expected} (num_hidden_layers + num_nextn_predict_layers)")
        allowed = (0, OVERLAP_RATIO, self.compress_ratio)
        for i, r in enumerate(self.compress_ratios):
            if r not in allowed:
                raise ValueError(f"compress_ratios[{i}] = {r!r} is not one of {allowed}")
        for i in range(self.num_hidden_layers, expected):
            if self.compress_ratios[i] != 0:
                raise ValueError(f"compress_ratios[{i}] (the MTP layer) must be 0: the MTP block "
                                 f"is sliding-window only, got {self.compress_ratios[i]}")

    @property
    def layer_ratios(self) -> tuple[int, ...]:
        """Compression ratio of each target layer (the MTP entries dropped)."""
        return self.compress_ratios[: self.num_hidden_layers]

    @property
    def num_c128_layers(self) -> int:
        """Layers with the non-overlapping compressor (ratio ``compress_ratio``)."""
        return sum(r == self.compress_ratio for r in self.layer_ratios)

    @property
    def num_c4_layers(self) -> int:
        return sum(r == OVERLAP_RATIO for r in self.layer_ratios)

    @property
    def state_width(self) -> int:
        """Row width of a non-overlapping compressor's state ring: ``[kv | score]``."""
        return 2 * self.head_dim

    def state_ring_size(self, ratio: int, speculative: bool) -> int:
        """Rows per request of a compressor's state ring: one block, two under speculation
        (SGLang's 128 / 256 for ratio 128, 8 / 16 for ratio 4)."""
        block = 2 * ratio if ratio == OVERLAP_RATIO else ratio
        return 2 * block if speculative else block

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf(cls, source: str | Path | dict, **overrides: Any) -> ModelConfig:
        """Read a Hugging Face style ``config.json`` (path or dict) with DSV4's key names.

        Unknown keys (MoE routing, quantisation, ...) are ignored; ``intermediate_size`` falls
        back to ``moe_intermediate_size`` (our dense FFN's width); ``overrides`` replace values.
        A missing key raises ``ValueError`` naming it.
        """
        raw = dict(source) if isinstance(source, dict) else json.loads(Path(source).read_text())
        raw.setdefault("intermediate_size", raw.get("moe_intermediate_size"))
        scaling = raw.get("rope_scaling")
        if isinstance(scaling, dict):
            raw["rope_scaling"] = YarnScaling(**{k: scaling[k] for k in (
                "factor", "original_max_position_embeddings", "beta_fast", "beta_slow")
                if k in scaling})
        names = {f.name for f in dataclasses.fields(cls)}
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}
        values = {k: v for k, v in raw.items() if k in names and v is not None}
        values.update(overrides)
        for key in sorted(required - set(values)):
            raise ValueError(f"config is missing {key!r}")
        return cls(**values)


def _released(which: str, **overrides: Any) -> ModelConfig:
    return ModelConfig.from_hf(RELEASED_CONFIGS[which], **overrides)


# The released layer counts, compress_ratios, hidden size, head_dim 512 / RoPE 64, window 128 and
# hc_mult 4, with few heads, small ranks, FFN and vocabulary: one H200 holds them in bf16 and
# every path the two ops touch has its real size.
_SHAPE = dict(num_attention_heads=4, q_lora_rank=256, o_lora_rank=256, o_groups=2,
              intermediate_size=1024, vocab_size=1024)
PRESETS: dict[str, Any] = {
    # CPU tests in seconds, float64-capable: ratio 16 so short sequences cross many blocks.
    "tiny": lambda: ModelConfig(
        vocab_size=260, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
        q_lora_rank=32, o_lora_rank=32, o_groups=2, intermediate_size=128, head_dim=32,
        qk_rope_head_dim=8, sliding_window=16, compress_ratio=16,
        compress_ratios=(16, 4, 16, 4, 0), bos_token_id=256, eos_token_id=257),
    "flash-shape": lambda: _released("flash", **_SHAPE),
    "pro-shape": lambda: _released("pro", **_SHAPE),
}


def preset(name: str) -> ModelConfig:
    """A named preset: ``tiny``, ``flash-shape`` or ``pro-shape``."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return PRESETS[name]()
