"""One decode / verify step of a DSV4-shaped model (bf16), eager and replayed from a CUDA graph.

Method: random weights (``init_weights``) cast for serving (bf16, mHC parameters fp32); each
request prefilled eagerly with ``--context`` random tokens; then the step (``W`` tokens per
request at the next positions) is timed eagerly (host wall per call) and inside a CUDA graph
(``time_in_graph``, under ``capture_mode()``). ``mhc``: the layers' mHC boundaries through the fused
ops (``ops``: ``mhc_pre``, ``mhc_post_pre``, ``mhc_post``) or through ``hc_pre`` / ``hc_post``
compiled by Inductor under ``capture_mode()`` (``compiled``). A step is idempotent
(it reads state only below its start and rewrites the same rows), so repeating it is sound. The
graph's logits are checked against the eager step first. Kernels per step are counted eagerly and
under ``capture_mode()``; compilations of the mHC functions are reported after all captures.
"""

from __future__ import annotations

import argparse

import torch

from dsv4spec.bench import common
from dsv4spec.capture import capture_cuda_graph, capture_mode
from dsv4spec.model.build import build_model
from dsv4spec.model.mhc import hc_post_captured, hc_pre_captured
from dsv4spec.model.model import Layer

COLUMNS = ["preset", "mhc", "batch", "W", "graph_us", "eager_us", "kernels_eager",
           "kernels_captured", "rel_err_graph_vs_eager"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="pro-shape", choices=["pro-shape", "flash-shape",
                                                                  "tiny"],
                        help="model shape (random weights, bf16)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="batch sizes")
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 4],
                        help="tokens per request: 1 = decode, W > 1 = verify")
    parser.add_argument("--context", type=int, default=256,
                        help="tokens already in each request's state")
    parser.add_argument("--mhc", nargs="+", choices=["ops", "compiled"], default=["ops"],
                        help="how the layers cross their mHC boundaries: the fused ops, or "
                             "hc_pre / hc_post compiled by Inductor (both: one row each)")


def _measure(step) -> dict:
    eager_logits = step().float()
    with capture_mode():
        timing = common.time_in_graph(step, rep_ms=20)
        outs = []  # the captured call's logits: the graph's static output
        graph = capture_cuda_graph(lambda: outs.append(step()))
        out = outs[-1]
        graph.replay()
        torch.cuda.synchronize()
        err = float((out.float() - eager_logits).norm() / eager_logits.norm())
        kernels_captured = common.count_kernels(step)
    eager = common.time_eager(step, calls=2, repeats=3)["median_us"]
    return {"graph_us": timing["median_us"], "eager_us": eager,
            "kernels_eager": common.count_kernels(step), "kernels_captured": kernels_captured,
            "rel_err_graph_vs_eager": err}


def main(args: argparse.Namespace) -> int:
    env = common.environment()
    model = build_model(args.preset, device="cuda", dtype=torch.bfloat16)
    cfg = model.cfg
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for bs in args.batch:
        state = model.new_state(num_slots=bs, max_seq_len=args.context + 2 * max(args.widths),
                                max_num_draft_tokens=max(max(args.widths), 2))
        slots = torch.arange(bs, device="cuda")
        zeros = torch.zeros(bs, dtype=torch.long, device="cuda")
        prompt = torch.randint(0, cfg.vocab_size, (bs, args.context), device="cuda", generator=g)
        model(prompt, state, slots, zeros, zeros + args.context)
        for W in args.widths:
            toks = torch.randint(0, cfg.vocab_size, (bs, W), device="cuda", generator=g)
            starts, lengths = zeros + args.context, zeros + W

            def step():
                return model(toks, state, slots, starts, lengths)[0]

            for mode in args.mhc:
                Layer.mhc_ops = mode == "ops"
                rows.append({"preset": args.preset, "mhc": mode, "batch": bs, "W": W,
                             **_measure(step)})
                common.print_table(rows[-1:], COLUMNS)
    Layer.mhc_ops = True
    compilations = {"hc_pre": hc_pre_captured.compilations,
                    "hc_post": hc_post_captured.compilations}
    print(f"mHC compilations for {len(rows)} captured shapes: {compilations}")
    payload = {"environment": env, "compilations": compilations,
               "parameters": sum(p.numel() for p in model.parameters())}
    common.write_results(args.out, "model_step", payload, rows, COLUMNS,
                         notes=(__doc__ or "").split("\n\n", 1)[1].replace("\n", " "))
    return 0
