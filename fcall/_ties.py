"""How a cached eager plan sees a tie made after it was built, with no hook anywhere.

A plan built with ``tie_weights=True`` (or ``strict=True``) knows which names of the
module hold one tensor *when it was built*. A tie made later (``m.head.weight =
m.emb.weight``, ``m[1] = m[0]``, a new parameter registered anywhere in the tree) changes
an object in a parameter or submodule slot, or the size of a slot dict. ``TieWatch``
keeps, for the plan, every such slot that the swap itself does not write (the given keys
and their tied aliases are written and restored by the swap, so their objects are checked
by the swap's own reads), and ``unchanged()`` compares them by identity in one C-level pass
before each reuse of the plan: a change rebuilds the plan, which then sees the tie.

Buffers are left out: a forward that reassigns a buffer (``self.count = self.count + 1``)
would make every plan stale on every call. A tie of two buffers made after a first swap is
therefore not seen in eager (``docs/behaviour.md``).

Under Dynamo no plan is cached: the trace walks the module's tensors for their ties, as
``torch.func.functional_call`` does, and nothing is recorded anywhere. fcall registers no
global hook and writes nothing into a module.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import is_

from torch import nn


class TieWatch:
    """The parameter and submodule slots of a tree that a plan does not write."""

    __slots__ = ("dicts", "names", "sized", "sizes", "values")

    def __init__(self, root: nn.Module, written: Iterable[tuple[dict, str]]) -> None:
        skip = {(id(slot), name) for slot, name in written}
        dicts: list[dict] = []
        names: list[str] = []
        sized: list[dict] = []
        for module in root.modules():  # each module once: a tree with a cycle ends
            for slots in (module._parameters, module._modules):
                sized.append(slots)
                for name in slots:
                    if (id(slots), name) not in skip:
                        dicts.append(slots)
                        names.append(name)
        self.dicts = dicts
        self.names = names
        self.values = list(map(dict.get, dicts, names))
        self.sized = sized
        self.sizes = list(map(len, sized))

    def unchanged(self) -> bool:
        """Whether every watched slot holds the same object, and no slot dict grew or shrank."""
        return list(map(len, self.sized)) == self.sizes and all(
            map(is_, map(dict.get, self.dicts, self.names), self.values)
        )
