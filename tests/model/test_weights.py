import re

import pytest
import torch

from dsv4spec.model import preset
from dsv4spec.model.model import Transformer, init_weights
from dsv4spec.model.weights import load_weights, save_weights

# The tensor names of DeepSeek-V4-Pro's released checkpoint for the parts this model has (the
# reference model keeps DSV4's checkpoint names: docs/design.md, "The reference model"); the dense
# FFN (ffn.w1/w2/w3) in place of the MoE is one of the deviations from DSV4 listed there.
DSV4_NAMES = [
    r"embed\.weight", r"head\.weight", r"norm\.weight", r"hc_head_(fn|base|scale)",
    r"(layers\.\d+|mtp\.0)\.(attn_norm|ffn_norm)\.weight",
    r"(layers\.\d+|mtp\.0)\.hc_(attn|ffn)_(fn|base|scale)",
    r"(layers\.\d+|mtp\.0)\.attn\.(wq_a|q_norm|wq_b|wkv|kv_norm|wo_a|wo_b)\.weight",
    r"(layers\.\d+|mtp\.0)\.attn\.attn_sink",
    r"layers\.\d+\.attn\.compressor\.(norm\.weight|wkv\.weight|wgate\.weight|ape)",
    r"mtp\.0\.(e_proj|h_proj|enorm|hnorm|norm)\.weight", r"mtp\.0\.hc_head_(fn|base|scale)",
]
OURS = r"(layers\.\d+|mtp\.0)\.ffn\.w[123]\.weight"


def test_parameter_names_follow_the_dsv4_checkpoint():
    with torch.device("meta"):
        model = Transformer(preset("pro-shape"))
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for name in shapes:
        assert any(re.fullmatch(p, name) for p in DSV4_NAMES + [OURS]), name
    # shapes DSV4-Pro fixes whatever the preset's head count and ranks
    assert shapes["hc_head_fn"] == (4, 28672) and shapes["layers.0.hc_attn_fn"] == (24, 28672)
    assert shapes["layers.0.hc_attn_scale"] == (3,) and shapes["mtp.0.hc_head_scale"] == (1,)
    assert shapes["layers.0.attn.compressor.ape"] == (128, 512)  # layer 0 is ratio 128
    assert shapes["layers.2.attn.compressor.ape"] == (4, 1024)  # layer 2 is ratio 4
    assert shapes["layers.2.attn.compressor.wkv.weight"] == (1024, 7168)
    assert shapes["layers.0.attn.wkv.weight"] == (512, 7168)
    assert not any(n.startswith("mtp.0.attn.compressor") for n in shapes)


def test_save_load_round_trip_is_exact(tmp_path):
    a = init_weights(Transformer(preset("tiny")).double(), seed=1)
    b = Transformer(preset("tiny")).double()
    save_weights(a, tmp_path / "w.safetensors")
    load_weights(b, tmp_path / "w.safetensors")
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb), na


@pytest.mark.parametrize("edit,match", [
    pytest.param(lambda t: t.pop("layers.1.attn.wkv.weight"), "missing 'layers.1.attn.wkv",
                 id="missing"),
    pytest.param(lambda t: t.update({"layers.9.x": torch.zeros(1)}), "unexpected.*layers.9.x",
                 id="unexpected"),
    pytest.param(lambda t: t.update({"norm.weight": torch.zeros(3)}), "'norm.weight' has shape",
                 id="mis-shaped"),
])
def test_bad_checkpoints_are_refused_by_name(tmp_path, edit, match):
    from safetensors.torch import load_file, save_file

    model = init_weights(Transformer(preset("tiny")), seed=2)
    save_weights(model, tmp_path / "w.safetensors")
    tensors = load_file(str(tmp_path / "w.safetensors"))
    edit(tensors)
    save_file(tensors, str(tmp_path / "bad.safetensors"))
    before = {n: p.clone() for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match=match):
        load_weights(model, tmp_path / "bad.safetensors")
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
