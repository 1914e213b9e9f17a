"""GPU: the engine with the verify + acceptance + rollback step captured in CUDA graphs gives the
same tokens as eager, and as greedy decoding (float32 and bf16, padded buckets)."""

import pytest
import torch

from dsv4spec.engine import Engine, Request
from dsv4spec.engine.run import load_model
from dsv4spec.engine.train_tiny import encode

PROMPTS = ["import os\n", "def main(", "class Parser:\n    def ", "x = [", "for i in ",
           "return ", "# ", "if __name__"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bs", [1, 3, 8])
def test_gpu_graph_replay_gives_the_eager_tokens(dtype, bs):
    model = load_model("tiny", None, "cuda", dtype)
    outputs = {}
    for mode in ("greedy", "eager", "graphs"):
        reqs = [Request(encode(p), 40) for p in PROMPTS[:bs]]
        engine = Engine(model, num_slots=8, max_seq_len=128,
                        num_draft_tokens=0 if mode == "greedy" else 4,
                        buckets=(1, 2, 4, 8), cuda_graphs=mode == "graphs")
        engine.generate(reqs)
        outputs[mode] = [r.output for r in reqs]
    assert outputs["graphs"] == outputs["eager"] == outputs["greedy"]
