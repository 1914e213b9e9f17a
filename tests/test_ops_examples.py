"""The Python examples of docs/ops.md run as written: each ```python block, in a fresh
interpreter (a user's: no TRITON_INTERPRET), in a scratch working directory, each in its own
namespace. A block right after the line ``<!-- readme-test: needs a CUDA GPU -->`` runs only
where CUDA is."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

OPS_DOC = Path(__file__).resolve().parents[1] / "docs" / "ops.md"
GPU_MARK = "<!-- readme-test: needs a CUDA GPU -->"
BLOCK = re.compile(r"^(?P<mark>[^\n]*)\n```python\n(?P<code>.*?)^```$", re.M | re.S)

RUNNER = """
import json, sys, traceback
results = []
for index, code in json.load(sys.stdin):
    try:
        exec(compile(code, f"docs/ops.md python block {index}", "exec"), {"__name__": "__main__"})
        results.append([index, None])
    except BaseException:
        results.append([index, traceback.format_exc()])
print("RESULTS " + json.dumps(results))
"""


def python_blocks() -> list[tuple[int, str, bool]]:
    """(index, code, needs a GPU) of every ```python block in docs/ops.md."""
    return [(i, m["code"], m["mark"].strip() == GPU_MARK)
            for i, m in enumerate(BLOCK.finditer(OPS_DOC.read_text()))]


def test_ops_doc_has_python_examples_and_marks_few_as_gpu_only():
    blocks = python_blocks()
    assert len(blocks) >= 7
    assert sum(gpu for _, _, gpu in blocks) <= 2
    for _, code, gpu in blocks:  # elsewhere the device is picked at run time
        statements = "\n".join(line.split("#")[0] for line in code.splitlines())
        assert gpu == ('device="cuda"' in statements), code


def test_ops_doc_python_blocks_run_as_written(tmp_path):
    cuda = torch.cuda.is_available()
    todo = [(i, code) for i, code, gpu in python_blocks() if cuda or not gpu]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(todo), cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("RESULTS "))
    failed = [f"block {i}:\n{err}" for i, err in json.loads(line[len("RESULTS "):]) if err]
    assert not failed, "\n".join(failed)
    assert list(tmp_path.iterdir()) == []
