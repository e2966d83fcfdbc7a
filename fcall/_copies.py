"""While Dynamo traces: swap by installing copies of the slot dicts, not by writing into them.

Written into, a submodule's ``_parameters`` dict is a mutated object that Dynamo
must replay after every call of the compiled function (``clear()`` then
``update()`` with every entry), and to replay it Dynamo guards on each
original tensor it holds (a ``TENSOR_MATCH`` per parameter, evaluated on every
call). ``torch.func.functional_call`` pays both. Installing a copy instead
(``owner.__dict__["_parameters"] = copy``, and the original dict back on
restore) is one attribute store to replay per module, and the original tensors
are never read as graph inputs: the per-call guards of a swap-and-call take
0.6-0.75x those of ``functional_call`` (200 and 1,000 leaves).

Only ``swap`` and ``functional_call`` go this way (their swap is always
undone; a ``to_module`` may stay, and then the module must keep its own dict
objects), and only when no entry is a plain tensor attribute. A forward
that reassigns an entry the swap did not touch (a buffer it updates, say) writes
into the copy; restore carries that entry over into the original dict, as the
in-place swap would have kept it.
"""

from __future__ import annotations

from typing import Any


class _Gone:
    """What restore reports for a slot that the block deleted (``del m.weight``)."""

    def __repr__(self) -> str:
        return "<deleted in the block>"


GONE = _Gone()

_ATTRIBUTE = {"p": "_parameters", "b": "_buffers"}


def install(swap: Any, values: list[Any], read_old: bool) -> None:
    """Write ``values`` into copies of the plan's slot dicts, install the copies on
    their modules; with ``read_old``, also collect what the originals hold."""
    # Per slot dict, keyed by its module's path and kind (id(slot) would guard on the
    # dict's id: another instance of the architecture would recompile): its copy, and
    # the names swapped. A dict at two paths (a shared submodule) never comes here.
    copies: dict[tuple[str, str], tuple[dict, set]] = {}
    swap.live = []
    swap.installed = []
    names = swap.plan.names
    for index in range(len(values)):
        slot, name, _, attributes, kind = swap.plan.entries[index]
        value = values[index]
        where = (names[index][: len(names[index]) - len(name)], kind)
        found = copies.get(where)
        if found is None:
            found = copies[where] = (dict(slot), set())
            attribute = _ATTRIBUTE[kind]
            attributes[attribute] = found[0]
            swap.installed.append((attributes, attribute, slot, *found))
        if read_old:
            swap.old.append(slot[name])
        found[0][name] = value
        found[1].add(name)
        swap.live.append(found[0])


def uninstall(swap: Any) -> list[Any]:
    """Put the original dicts back; return what the copies held for the swapped names."""
    # a name that forward deleted from the copy is back with the original dict
    current = [copy.get(name, GONE) for copy, (_, name) in zip(swap.live, swap.plan.pairs)]
    for attributes, attribute, original, copy, swapped in reversed(swap.installed):
        attributes[attribute] = original
        for name in copy:
            # an entry that forward set and the swap did not touch stays set
            if name not in swapped and (name not in original or copy[name] is not original[name]):
                original[name] = copy[name]
    return current
