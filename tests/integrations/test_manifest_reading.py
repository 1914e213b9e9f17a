"""How a manifest check reads an engine's source, on small made-up trees: the aliases a call may
go through, a file edited on disk, where the engine's package starts, which imports bind kernel
names, and which tested version a changed hook is reported closest to."""

import ast
from pathlib import Path

from dsv4spec.integrations import manifest

KERNELS = "eng.kernels"


def test_a_conditional_alias_calls_both_of_its_names():
    tree = ast.parse(
        "def forward(self, reuse):\n"
        "    boundary = fused_reuse if reuse else fused\n"
        "    return boundary(self.x)\n")
    index = manifest.call_index(tree)
    assert index["fused_reuse"] == index["fused"] == [("forward", 3)]


def write(root: Path, relpath: str, text: str) -> None:
    path = root / "eng" / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_file_edited_on_disk_is_read_again(tmp_path):
    hook = manifest.HookSource("kernels.py", "op")
    write(tmp_path, "kernels.py", "def op(x):\n    return x + 1\n")
    before = manifest.hook_parts(manifest.SourceTree(tmp_path, "eng"), hook)
    write(tmp_path, "kernels.py", "def op(x):\n    return x + 2 * x\n")
    after = manifest.hook_parts(manifest.SourceTree(tmp_path, "eng"), hook)
    assert before.keys() == after.keys() and before != after


def test_the_source_root_is_where_the_whole_relative_path_ends():
    relpath = "model_executor/kernels/mhc/tilelang.py"
    root = Path("/site-packages")
    assert manifest.source_root(str(root / "vllm" / relpath), "vllm", relpath) == root
    # the same file name elsewhere in the package, or in another package, is not vLLM's file
    assert manifest.source_root(str(root / "vllm/other/tilelang.py"), "vllm", relpath) is None
    assert manifest.source_root(str(root / "other" / relpath), "vllm", relpath) is None
    assert manifest.source_root(None, "vllm", relpath) is None


def test_only_absolute_imports_of_the_kernels_module_bind_kernel_names():
    tree = ast.parse(
        f"from {KERNELS} import op_a, op_b as local_b\n"
        f"from .{KERNELS} import op_c\n"
        "def f(x):\n    return local_b(op_a(x))\n")
    assert manifest.module_bindings(tree, [KERNELS]) == {
        "binds": ["local_b", "op_a"], "calls": ["local_b", "op_a"]}


def test_a_changed_hook_is_reported_against_the_closest_tested_version():
    parts = {"k.py:op": "1", "k.py:tile": "2", "m.py:caller": "3"}

    def tested(version, tested_parts):
        return {"version": version, "hooks": {"op": {"parts": tested_parts}}}

    manifests = [tested("1.0", {"k.py:op": "0", "k.py:tile": "0", "m.py:caller": "3"}),
                 tested("2.0", {"k.py:op": "1", "k.py:tile": "9", "m.py:gone": "4"}),
                 tested("3.0", {"k.py:op": "0", "k.py:tile": "0", "m.py:caller": "0"})]
    assert manifest._differs(parts, manifests, "op") == (
        "closest tested version 1.0; differs in k.py:op (changed), k.py:tile (changed)")
    # on a tie every closest version is named, and the parts are the newest one's
    manifests[1]["hooks"]["op"]["parts"] = {"k.py:op": "1", "k.py:tile": "2",
                                            "m.py:gone": "4"}
    assert manifest._differs(parts, manifests, "op") == (
        "closest tested version 1.0 / 2.0; differs in m.py:caller (new), m.py:gone (gone)")
    assert manifest._differs(parts, [{"version": "1.0", "hooks": {"op": None}}], "op") == (
        "no tested version defines it")
