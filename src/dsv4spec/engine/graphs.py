"""Per-batch-size-bucket runners over static buffers, optionally captured in CUDA graphs.

SGLang captures its decode-time forwards once per batch-size bucket and pads a batch's rows up to
the bucket. :class:`BucketRunner` does that for any device-side step function: it owns static
input buffers sized for the largest bucket, copies a call's inputs into their prefix, fills the
padding rows with fixed values (the scratch slot, ``valid = False``), and runs the step on the
bucket's prefix, eagerly or by replaying a graph captured (under ``capture_mode()``, so the
functions marked for it run Inductor-compiled) the first time the bucket is used.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dsv4spec.capture import capture_cuda_graph, capture_mode

# SGLang's batch-size buckets with speculation on
BUCKETS = (*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8))

Outputs = tuple[torch.Tensor, ...]


class BucketRunner:
    """Run ``step(inputs) -> tuple of [n, ...] tensors`` on a bucket of ``n`` rows.

    Parameters
    ----------
    step : callable
        Device-side function of a dict of input tensors (each the bucket's ``[n, ...]`` prefix of
        a static buffer); no host sync, no data-dependent shapes, when ``graphs=True``.
    inputs : dict
        Name -> ``(shape per row, dtype, padding value)``.
    buckets : tuple of int
        Batch sizes to pad to (only those up to ``max_batch`` are kept).
    max_batch : int
    device : torch.device
    graphs : bool
        Capture each bucket's step in a CUDA graph on first use and replay it.
    """

    def __init__(self, step: Callable[[dict[str, torch.Tensor]], Outputs],
                 inputs: dict[str, tuple[tuple[int, ...], torch.dtype, object]], *,
                 buckets: tuple[int, ...], max_batch: int, device: torch.device,
                 graphs: bool = False) -> None:
        self.step, self.graphs = step, graphs
        self.buckets = tuple(sorted(b for b in buckets if b <= max_batch)) or (max_batch,)
        top = self.buckets[-1]
        self.padding = {name: pad for name, (_, _, pad) in inputs.items()}
        self.buffers = {name: torch.full((top, *shape), pad, dtype=dtype, device=device)
                        for name, (shape, dtype, pad) in inputs.items()}
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, Outputs]] = {}

    def bucket(self, batch: int) -> int:
        for b in self.buckets:
            if b >= batch:
                return b
        raise ValueError(f"batch {batch} exceeds the largest bucket {self.buckets[-1]}")

    def _run(self, n: int) -> Outputs:
        return self.step({name: buf[:n] for name, buf in self.buffers.items()})

    def _capture(self, n: int) -> tuple[torch.cuda.CUDAGraph, Outputs]:
        out: Outputs = ()

        def run() -> None:
            nonlocal out
            out = self._run(n)  # the captured run's outputs are the graph's static outputs

        with capture_mode():
            graph = capture_cuda_graph(run, warmups=2)
        return graph, out

    def captured(self) -> list[int]:
        """Buckets captured so far."""
        return sorted(self._graphs)

    def graph(self, bucket: int) -> torch.cuda.CUDAGraph:
        """The captured graph of ``bucket`` (replaying it reruns the step on the buffers)."""
        return self._graphs[bucket][0]

    def __call__(self, **inputs: torch.Tensor) -> Outputs:
        """Copy ``inputs`` (each ``[B, ...]``, all buffers given) in, pad, run; outputs ``[:B]``."""
        if inputs.keys() != self.buffers.keys():
            raise TypeError(f"expected inputs {sorted(self.buffers)}, got {sorted(inputs)}")
        B = next(iter(inputs.values())).shape[0]
        n = self.bucket(B)
        for name, value in inputs.items():
            buf = self.buffers[name]
            buf[:B].copy_(value)
            buf[B:n].fill_(self.padding[name])
        if not self.graphs:
            out = self._run(n)
        else:
            if n not in self._graphs:
                self._graphs[n] = self._capture(n)
            graph, out = self._graphs[n]
            graph.replay()
        return tuple(t[:B] for t in out)
