"""How a manifest check reads an engine's source, on small made-up trees: the aliases a call may
go through (a conditional, an import under another name, a module attribute, a ``getattr``), a
definition reached through the name its user imports it as, the definitions a hook relies on, a
file edited on disk, where the engine's package starts, which imports bind kernel names, and
which tested version a changed hook is reported closest to."""

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


def test_a_call_through_an_imported_alias_or_a_module_attribute_calls_the_name():
    tree = ast.parse(
        "from eng.kernels import op as fast_op\n"
        "import eng.kernels as kernels\n"
        "def forward(x):\n"
        "    from eng.other import tile as t\n"
        "    return fast_op(x) + kernels.op(x) + t(x)\n")
    index = manifest.call_index(tree)
    assert index["op"] == [("forward", 5), ("forward", 5)]
    assert index["fast_op"] == [("forward", 5)] and index["tile"] == [("forward", 5)]


def test_a_getattr_alias_and_a_getattr_call_call_the_attribute_name():
    # SGLang 0.5.23's run_eagle_verify reaches the C128 rollback so
    tree = ast.parse(
        "def verify(pool, batch):\n"
        "    clear = getattr(pool.get_kvcache(), 'clear_states', None)\n"
        "    if clear is not None:\n"
        "        clear(batch)\n"
        "    getattr(pool, 'release')(batch)\n"
        "    other = getattr(pool, name)\n"
        "    other(batch)\n")
    index = manifest.call_index(tree)
    assert index["clear_states"] == [("verify", 4)]
    assert index["release"] == [("verify", 5)]
    assert "name" not in index


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


def test_a_helper_definition_resolves_through_the_name_it_is_imported_as(tmp_path):
    # SGLang's backend calls metadata_kernel.init_compression_metadata as
    # _init_compression_metadata_triton; the relative form reaches a sibling module
    write(tmp_path, "layers/backend.py",
          "from eng.kernels.meta import build as _build_triton\n"
          "from ..kernels.meta import LIMIT\n"
          "def op(x):\n    return _build_triton(x, LIMIT)\n")
    write(tmp_path, "kernels/meta.py",
          "LIMIT = 4\ndef build(x, n):\n    return _kernel(x) * n\n"
          "def _kernel(x):\n    return x\ndef _build_triton(x, n):\n    return -x\n")
    hook = manifest.HookSource("layers/backend.py", "op", helper_files=("kernels/meta.py",))
    parts = manifest.hook_parts(manifest.SourceTree(tmp_path, "eng"), hook)
    assert sorted(parts) == ["kernels/meta.py:LIMIT", "kernels/meta.py:_kernel",
                             "kernels/meta.py:build", "layers/backend.py:op"]
    assert manifest.import_sources(ast.parse("from ...x import y\n"), "a/b.py", "eng") == {}


def test_a_definition_a_hook_relies_on_is_a_part_of_its_own(tmp_path):
    write(tmp_path, "kernels.py", "def op(x):\n    return x\n")
    write(tmp_path, "worker.py", "class Worker:\n    def loop(self, n):\n"
                                 "        return range(n - 1)\n")
    hook = manifest.HookSource("kernels.py", "op",
                               relies_on=("worker.py:Worker.loop", "worker.py:Worker.gone"))
    before = manifest.hook_parts(manifest.SourceTree(tmp_path, "eng"), hook)
    assert sorted(before) == ["kernels.py:op", "worker.py:Worker.loop"]
    write(tmp_path, "worker.py", "class Worker:\n    def loop(self, n):\n"
                                 "        return range(n)\n")
    after = manifest.hook_parts(manifest.SourceTree(tmp_path, "eng"), hook)
    assert after["kernels.py:op"] == before["kernels.py:op"]
    assert after["worker.py:Worker.loop"] != before["worker.py:Worker.loop"]


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
