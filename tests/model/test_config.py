import hashlib
import json

import pytest

from dsv4spec.model import ModelConfig, preset
from dsv4spec.model.config import PRESETS, RELEASED_CONFIGS

PRO_RATIOS = [128, 128] + [4, 128] * 29 + [4] + [0]
FLASH_RATIOS = [0, 0] + [4, 128] * 20 + [4] + [0]
# SHA-256 of the packaged configs: the released models' config.json, keys sorted, compared
# with the published files when they were added. Pinned so any edit of them fails here.
RELEASED_SHA256 = {
    "flash": "1eb532b3fff0a9c7eb362a01a7771a1e164629cab3d098291b2a232dbf537033",
    "pro": "dd4cdd4fb63ee0ebe0c7de4fea981a6dbd97ba5c45d4b71a0ec901c0e5d9dac5",
}


@pytest.mark.parametrize("which", ["flash", "pro"])
def test_shipped_configs_are_the_released_ones(which):
    data = RELEASED_CONFIGS[which].read_bytes()
    assert hashlib.sha256(data).hexdigest() == RELEASED_SHA256[which]
    raw = json.loads(data)
    assert list(raw) == sorted(raw) and len(raw["compress_ratios"]) == raw["num_hidden_layers"] + 1


@pytest.mark.parametrize("which,layers,hidden,c128,c4,ratios", [
    pytest.param("flash", 43, 4096, 20, 21, FLASH_RATIOS, id="DSV4-Flash"),
    pytest.param("pro", 61, 7168, 31, 30, PRO_RATIOS, id="DSV4-Pro"),
])
def test_released_configs_parse(which, layers, hidden, c128, c4, ratios):
    cfg = ModelConfig.from_hf(RELEASED_CONFIGS[which])
    assert (cfg.num_hidden_layers, cfg.hidden_size) == (layers, hidden)
    assert (cfg.num_c128_layers, cfg.num_c4_layers) == (c128, c4)
    assert list(cfg.compress_ratios) == ratios
    geometry = (cfg.head_dim, cfg.qk_rope_head_dim, cfg.sliding_window, cfg.hc_mult)
    assert geometry == (512, 64, 128, 4)
    assert cfg.hc_sinkhorn_iters == 20 and cfg.compress_rope_theta == 160000
    assert cfg.rope_scaling.factor == 16
    assert cfg.rope_scaling.original_max_position_embeddings == 65536
    raw = json.loads(RELEASED_CONFIGS[which].read_text())
    assert cfg.intermediate_size == raw["moe_intermediate_size"]  # the dense FFN's width
    assert (cfg.state_ring_size(128, True), cfg.state_ring_size(128, False)) == (256, 128)
    assert (cfg.state_ring_size(4, True), cfg.state_ring_size(4, False)) == (16, 8)
    assert cfg.state_width == 1024


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid(name):
    cfg = preset(name)
    assert cfg.num_c128_layers > 0 and cfg.num_c4_layers > 0
    assert cfg.compress_ratios[-1] == 0 and cfg.num_nextn_predict_layers == 1


@pytest.mark.parametrize("name,which", [("flash-shape", "flash"), ("pro-shape", "pro")])
def test_shape_presets_keep_the_released_geometry(name, which):
    cfg, released = preset(name), ModelConfig.from_hf(RELEASED_CONFIGS[which])
    for key in ("num_hidden_layers", "compress_ratios", "hidden_size", "head_dim",
                "qk_rope_head_dim", "sliding_window", "hc_mult", "compress_ratio"):
        assert getattr(cfg, key) == getattr(released, key), key
    assert cfg.num_attention_heads < released.num_attention_heads


def test_tiny_crosses_blocks_quickly():
    cfg = preset("tiny")
    assert cfg.compress_ratio == 16 and cfg.state_ring_size(16, True) == 32


def _pro(**changes):
    raw = json.loads(RELEASED_CONFIGS["pro"].read_text())
    raw.update(changes)
    return raw


@pytest.mark.parametrize("changes,key", [
    pytest.param(dict(compress_ratios=PRO_RATIOS[:-1]), "compress_ratios", id="one entry short"),
    pytest.param(dict(compress_ratios=[8] + PRO_RATIOS[1:]), r"compress_ratios\[0\]",
                 id="unknown ratio 8"),
    pytest.param(dict(compress_ratios=PRO_RATIOS[:-1] + [4]), r"compress_ratios\[61\]",
                 id="MTP layer with a compressor"),
    pytest.param(dict(qk_rope_head_dim=512), "qk_rope_head_dim", id="rotary part does not fit"),
    pytest.param(dict(qk_rope_head_dim=63), "qk_rope_head_dim", id="odd rotary part"),
    pytest.param(dict(o_groups=5), "o_groups", id="groups do not divide heads"),
    pytest.param(dict(hidden_size=0), "hidden_size", id="zero width"),
    pytest.param(dict(num_nextn_predict_layers=2), "num_nextn_predict_layers", id="two MTP"),
    pytest.param(dict(hc_eps=-1.0), "hc_eps", id="negative hc_eps"),
    pytest.param(dict(num_hidden_layers=None), "num_hidden_layers", id="missing key"),
])
def test_bad_configs_are_refused_naming_the_key(changes, key):
    with pytest.raises(ValueError, match=key):
        ModelConfig.from_hf(_pro(**changes))


def test_compress_ratio_must_exceed_the_overlapping_one():
    with pytest.raises(ValueError, match="compress_ratio"):
        preset("tiny").replace(compress_ratio=4)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")
