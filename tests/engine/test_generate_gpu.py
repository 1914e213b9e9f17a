"""GPU: the engine with its verify (+ acceptance + rollback), draft-extend, draft-chain and decode
steps captured in CUDA graphs gives the same tokens as eager and as greedy decoding (float32 and
bf16, padded buckets); the rollback runs inside the verify graph; the trained checkpoint accepts
the same on the GPU as on the CPU."""

import pytest
import torch

from dsv4spec.engine import Engine, Request
from dsv4spec.model.build import TINY_CHECKPOINT, build_model
from dsv4spec.model.tokenizer import encode

PROMPTS = ["import os\n", "def main(", "class Parser:\n    def ", "x = [", "for i in ",
           "return ", "# ", "if __name__"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bs", [1, 3, 8])
def test_gpu_graph_replay_gives_the_eager_tokens(dtype, bs):
    model = build_model("tiny", TINY_CHECKPOINT, device="cuda", dtype=dtype)
    outputs = {}
    for mode in ("greedy", "eager", "graphs"):
        reqs = [Request(encode(p), 40) for p in PROMPTS[:bs]]
        engine = Engine(model, num_slots=8, max_seq_len=128,
                        num_draft_tokens=0 if mode == "greedy" else 4,
                        buckets=(1, 2, 4, 8), cuda_graphs=mode == "graphs")
        engine.generate(reqs)
        outputs[mode] = [r.output for r in reqs]
    assert outputs["graphs"] == outputs["eager"] == outputs["greedy"]


@pytest.mark.gpu
def test_gpu_the_verify_graph_contains_the_fused_rollback():
    from torch.profiler import ProfilerActivity, profile

    model = build_model("tiny", TINY_CHECKPOINT, device="cuda")
    reqs = [Request(encode(p), 12) for p in PROMPTS[:3]]
    engine = Engine(model, num_slots=4, max_seq_len=96, num_draft_tokens=4, buckets=(4,),
                    cuda_graphs=True)
    engine.generate(reqs)
    (n,) = engine.verify.runner.captured()
    graph = engine.verify.runner.graph(n)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sum("c128_cleanup_fused" in k for k in names) == 1, names[-20:]
    assert not any("c128_cleanup_kernel" in k for k in names)


@pytest.mark.gpu
def test_gpu_trained_checkpoint_accepts_as_on_the_cpu():
    accept = {}
    for device in ("cpu", "cuda"):
        model = build_model("tiny", TINY_CHECKPOINT, device=device)
        reqs = [Request(encode(p), 40) for p in PROMPTS[:4]]
        Engine(model, num_slots=4, max_seq_len=128, num_draft_tokens=4,
               cuda_graphs=device == "cuda").generate(reqs)
        accept[device] = [r.accept_lens for r in reqs]
        if device == "cpu":
            outputs = [r.output for r in reqs]
    assert accept["cuda"] == accept["cpu"]
    assert [r.output for r in reqs] == outputs
    assert sum(map(sum, accept["cpu"])) / sum(map(len, accept["cpu"])) > 1.5
