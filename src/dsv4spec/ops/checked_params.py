"""Remembered parameter checks: the weight tensors an op has validated, held weakly.

A model's weights are the same tensors call after call, so an op checks them once and afterwards
only compares their addresses (an eager call is launch-bound). The entries must neither keep a
destroyed model's weights alive (an engine rebuilt in a long-lived server process) nor let a
later tensor that happens to get a dead one's id pass as checked: each entry holds weak references
whose callbacks drop it when the first of its tensors dies, before that id can be reused.
Tensors that die right after the call (an engine's ``param.data``) are not remembered: the op
checks them alone, in one pass (:func:`remembered`).
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Sequence

import torch

from dsv4spec.ops.plan_scan import check_count


def outlives_the_call(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether an entry for ``tensors`` would be used again: False where a model's ``Parameter``s
    come with plain tensors, the engines' ``param.data`` (a new tensor object on every call), whose
    entry would die with it right after the call, having cost more than the checks it skips (a
    weak reference whose callback runs as its tensor dies is microseconds of host time)."""
    kind = type(tensors[0])
    return all(type(t) is kind for t in tensors)


def remembered(*tensors: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The tensors of an op's call to remember: all but the last (the optional norm weight), and
    that one too where it outlives the call. SGLang's and vLLM's DeepSeek-V4 pass the norm weight
    as ``norm.weight.data`` beside the other weights' ``Parameter``s: a new tensor object on every
    call (the same storage, a fresh version counter), so no entry could find it again by identity,
    and a key on what identifies it (its storage with its dtype, shape, strides and offset: a key
    of the storage alone passes another view of it, ``param.data.view(-1)``) costs as much host
    time to read as checking it, which the op does alone, in one pass, on each call."""
    *weights, last = tensors
    if last is not None and outlives_the_call((*weights, last)):
        weights.append(last)
    return tuple(weights)


class CheckedParams(dict):
    """``key -> (weak references, addresses)`` for parameter tensors that passed an op's checks.

    ``key`` starts with the tensors' ids and holds whatever else the checks depended on (widths,
    device, dtype). The op looks an entry up with ``.get(key)`` (a plain dict lookup on the hot
    path) and compares the tensors' ``data_ptr()`` with the addresses: new storage (``param.data =
    ...``, ``set_``) moves the address and sends the tensor back to the full check. A tensor that
    keeps its address but changes shape or dtype in place (``t_()``, ``as_strided_``) is not
    detected; the kernels then read memory it still owns.

    Past ``limit`` entries the oldest is dropped, so a model built after another still alive gets
    its own entries.
    """

    # no instance dict: ``.get`` resolves on the type, as a plain dict's does
    __slots__ = ("limit", "__weakref__")

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = check_count("limit", limit)

    def remember(self, key: Hashable, tensors: Sequence[torch.Tensor]) -> None:
        """Remember that ``tensors`` (whose ids ``key`` holds) passed the checks, unless some of
        them die right after the call (:func:`outlives_the_call`)."""
        if not outlives_the_call(tensors):
            return
        forget = _forgetter(weakref.ref(self), key)
        refs = tuple(weakref.ref(t, forget) for t in tensors)
        self.pop(key, None)  # checked again (new storage): now the newest
        while len(self) >= self.limit:
            # the oldest, read from a copy: a dying tensor's callback may drop entries meanwhile
            self.pop(next(iter(dict.copy(self)), None), None)
        self[key] = (refs, tuple(t.data_ptr() for t in tensors))

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s entry (its tensors failed the comparison), if there is one."""
        self.pop(key, None)


def _forgetter(checked_ref: weakref.ref, key: Hashable):
    """The callback of an entry's weak references: drops that entry when one of its tensors dies.

    It holds the cache weakly (no cycle through the entry) and drops only the entry holding the
    dying reference: a newer entry under the same key has references of its own.
    """

    def forget(dead: weakref.ref) -> None:
        checked = checked_ref()
        if checked is None:
            return
        entry = checked.get(key)
        if entry is not None and any(ref is dead for ref in entry[0]):
            checked.pop(key, None)

    return forget
