"""What a manifest hash ignores: a docstring of a module, class, function or async function (the
first statement, a string), and nothing else: a leading non-string constant, or a string that
is not the first statement, changes the hash."""

import ast

import pytest

from dsv4spec.integrations.manifest import node_hash


def hashed(text: str, of_module: bool = False) -> str:
    tree = ast.parse(text)
    return node_hash(tree if of_module else tree.body[0])


@pytest.mark.parametrize("head", ["def op(x):", "async def op(x):", "class Op:"])
def test_a_docstring_edit_leaves_the_hash(head):
    body = "    y = 1\n" if head.startswith("class") else "    return x\n"
    plain = hashed(f"{head}\n{body}")
    assert hashed(f'{head}\n    """Says what it does."""\n{body}') == plain
    assert hashed(f"{head}\n    'Says it otherwise.'\n{body}") == plain
    assert hashed(f"{head}\n{body}    z = 2\n") != plain  # the control: code is hashed


def test_a_module_docstring_edit_leaves_the_hash():
    plain = hashed("import os\n", of_module=True)
    assert hashed('"""A module."""\nimport os\n', of_module=True) == plain
    assert hashed('"""Another text."""\nimport os\n', of_module=True) == plain


@pytest.mark.parametrize("leading", ["0", "...", "b'bytes'", "None"])
def test_a_leading_constant_that_is_not_a_string_is_code(leading):
    assert hashed(f"def op(x):\n    {leading}\n    return x\n") != hashed(
        "def op(x):\n    return x\n")


def test_only_the_first_string_is_the_docstring():
    one = hashed('def op(x):\n    """Doc."""\n    return x\n')
    assert hashed('def op(x):\n    """Doc."""\n    "a second string"\n    return x\n') != one
