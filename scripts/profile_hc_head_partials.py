"""Run hc_head's partials launch alone a few times, for a profiler (GPU).

    PYTHONPATH=src ncu --clock-control none -k regex:partials python3 \\
        scripts/profile_hc_head_partials.py [T] [H]

Launches the CUDA-core partials kernel, then the tensor-core one, 3 times each at T tokens
(default 1024) and width H (default 7168), bf16.
"""

import sys

import torch

from dsv4spec.bench.hc_head import make_inputs
from dsv4spec.kernels import hc_head as kernels


def main() -> None:
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    H = int(sys.argv[2]) if len(sys.argv) > 2 else 7168
    x, fn, *_ = make_inputs(T, H)
    for mma in (False, True):
        launch = kernels.partials_launch(x, fn, False, mma=mma, pdl=False)[0]
        for _ in range(3):
            launch()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
