"""The eager express lane: a plan swapped often, compiled to straight-line Python.

Once the generic path (flatten → plan → prepare → commit) has served one key
structure of a module ``_OFFERS_BEFORE_BUILD`` times, fcall writes that swap out
as two generated functions, the plan's *express*, and makes it the module's:

* ``swap_in(entries, preserve)`` checks, before writing anything, that the params
  TensorDict has exactly the plan's nodes and keys in their order (one
  ``list(d) != keys`` per node; one for a flat dict), that every leaf is a ``Tensor`` or a
  ``Parameter``, that every submodule on a key's path is the same object with as
  many parameters and buffers as when the plan was built (``Plan.is_current``,
  unrolled), and reads every old value (a name gone from its dict is a
  ``KeyError``); then converts (``to_module``'s ``preserve_module_state``, only when
  some value for a parameter does not require grad) and writes. At the first
  mismatch it returns ``None`` with the module untouched, and the generic path runs,
  with its own checks and error messages.
* ``put_back(old, new)`` restores if every slot still holds what the swap put
  there; otherwise the generic restore runs (it also writes a buffer that
  ``forward`` reassigned back into the params).

Unrolled, a leaf costs a subscript on its params node, one on its slot dict and a
write, with the dicts as the functions' globals and the names as constants: no loop
bytecode, no tuple unpacking, no signature to build and hash. Eager swap and restore
take 0.6-0.7x the generic path's time at 10-500 leaves (a flat dict: 0.25-0.5x up
to 10,000 leaves; its generic walk splits every key). Compiling
the source takes what 250 generic swaps take (70 with a flat dict) and grows faster
than the plan, hence the threshold and the size limits below.

Only the plain case gets an express: eager, a TensorDict (or TensorDictParams) of
tensors, a nested dict of tensors, or a flat dict of tensors with string keys (``"0.weight"``, as
``torch.func.functional_call`` takes), no tied names, no plain-attribute slots, no
FSDP2 or DDP, no RNN, ``tie_weights=True`` and ``strict=False`` (the defaults of
every API).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictParams as _TensorDictParamsBase

from ._context import records_a_swap
from ._engine import PRESERVE, Swap, registered_values
from ._flatten import Layout, Leaves, layout_of
from ._plan import UNWATCHED, Plan, current_express, set_express

_IS_LEAF = frozenset({torch.Tensor, torch.nn.Parameter}).__contains__
# Building an express costs about what 250 generic swaps of its plan cost (nested
# TensorDict; ~70 for a flat dict), so it is built after that many (ski rental: a
# structure swapped a few times never pays for code, and one swapped often pays at most
# twice). Nested, the unrolled code loses its lead as it grows (0.7x the generic time
# up to 500 leaves, 0.8x at 700, 0.85-0.95x at 1,000, 1.4-1.6x slower at 10,000); a flat
# dict, with no code per node, keeps it to 10,000 leaves (benchmarks/express_lane.py).
_OFFERS_BEFORE_BUILD = 256
_MAX_LEAVES = 512
_MAX_FLAT_LEAVES = 10_000


class Express:
    """The generated swap of one plan; ``signature`` keys the plan in the cache."""

    __slots__ = ("plan", "put_back", "signature", "swap_in")

    def __init__(self, plan: Plan, signature: Any, functions: tuple[Callable, Callable]) -> None:
        self.plan = plan
        self.signature = signature
        self.swap_in, self.put_back = functions


def try_swap(
    params: Any, module: torch.nn.Module, api: str, mode: str, tie_weights: bool
) -> Swap | None:
    """``params`` swapped into ``module`` by the module's express, or ``None`` (nothing
    written: the generic path runs). Eager only; ``mode`` is ``AS_IS`` or ``PRESERVE``.
    An express serves only the ``tie_weights`` its plan was built for (to_module's plans
    follow no tie: their express must not serve a swap of a tied module)."""
    if torch.compiler.is_compiling():
        return None
    express = current_express(module)
    if express is None or express.plan.tie_weights is not tie_weights:
        return None
    entries = _entries_of(params)
    if entries is None:
        return None
    swapped = express.swap_in(entries, mode == PRESERVE)
    if swapped is None:
        return None
    leaves = Leaves(params, api)
    leaves.values, leaves.signature = swapped[0], express.signature
    swap = Swap(express.plan, mode, leaves, False)
    swap.new, swap.old = swapped[1], swapped[2]
    return swap


def _entries_of(params: Any) -> dict | None:
    """The root dict of an exact TensorDict, of a TensorDictParams' TensorDict, or a plain
    dict itself; ``None`` for anything else, and for the old values of an fcall swap
    (``to_module`` may undo it). Another op's record (tensordict's ``to_module``,
    ``lock_``) changes nothing here."""
    cls = type(params)
    if cls is dict:
        return params
    if cls is not TensorDict:
        # getattr, as _context.undone_by reads it: a TensorDictParams keeps it as its own
        if not isinstance(params, _TensorDictParamsBase) or records_a_swap(
            getattr(params, "_last_op", None)
        ):
            return None
        params = params._param_td
        if type(params) is not TensorDict:
            return None
    attributes = params.__dict__
    return None if records_a_swap(attributes.get("_last_op")) else attributes["_tensordict"]


def _flat_keys(params: Any) -> list[str] | None:
    """The keys of a dict of tensors with string keys (dotted or not), else ``None``:
    the one kind of dict the express takes (``list(d) != keys`` then checks it whole)."""
    if type(params) is not dict:
        return None
    if all(type(key) is str for key in params) and all(map(_IS_LEAF, map(type, params.values()))):
        return list(params)
    return None


def _nested_tensors(node: dict) -> bool:
    """Whether ``node`` is a nested dict whose leaves are all tensors."""
    return all(
        _nested_tensors(value) if type(value) is dict else _IS_LEAF(type(value))
        for value in node.values()
    )


def offer(module: torch.nn.Module, plan: Plan, leaves: Leaves) -> None:
    """After a generic eager swap with the default flags: ``plan``'s express, built at
    its ``_OFFERS_BEFORE_BUILD``-th offer, becomes the module's."""
    params = leaves.params
    if plan.traced or _entries_of(params) is None:
        return
    if plan.express is None:
        plan.offers += 1
        if plan.offers < _OFFERS_BEFORE_BUILD:
            return
        flat_keys = _flat_keys(params)  # None: nodes (a TensorDict, a nested dict)
        if type(params) is dict and flat_keys is None and not _nested_tensors(params):
            plan.express = False  # values of other types: the generic path only
            return
        plan.express = _built_or_false(plan, leaves, flat_keys)
    if plan.express:  # else the module keeps the express it has: each checks all it needs
        set_express(module, plan.express)


def _built_or_false(plan: Plan, leaves: Leaves, flat_keys: list[str] | None) -> Express | bool:
    if not _eligible(plan, _MAX_LEAVES if flat_keys is None else _MAX_FLAT_LEAVES):
        return False
    try:
        return _build(plan, leaves, flat_keys)
    except (SyntaxError, RecursionError, MemoryError):
        # CPython refused the source (its limits on nesting and size): the swap that
        # offered the plan has been made, and must not fail for want of a faster lane
        return False


def _eligible(plan: Plan, max_leaves: int) -> bool:
    return (  # plan.traced: offer() never gets that far
        plan.direct
        and not plan.has_attributes
        and not plan.tie_groups
        and not plan.rnns
        and plan.distributed in (None, "")
        and 0 < plan.given <= max_leaves
    )


def _build(plan: Plan, leaves: Leaves, flat_keys: list[str] | None) -> Express:
    if plan.layout is None:
        plan.layout = layout_of(leaves.keys)
    source, constants = _Source(plan, plan.layout, flat_keys).write()
    namespace = {"__builtins__": __builtins__, **constants}  # the constants are its globals
    exec(compile(source, f"<fcall express, {plan.given} leaves>", "exec"), namespace)
    return Express(plan, leaves.signature, (namespace["swap_in"], namespace["put_back"]))


class _Source:
    """Python source of ``swap_in`` and ``put_back`` for one plan, and the objects it
    names (its globals: a dict is one specialised ``LOAD_GLOBAL`` away)."""

    def __init__(self, plan: Plan, layout: Layout, flat_keys: list[str] | None) -> None:
        self.plan = plan
        self.layout = layout  # of the params TensorDict's nodes
        self.flat_keys = flat_keys  # or, for a flat dict, its keys
        self.constants: dict[str, Any] = {
            "TD": TensorDict,
            "IS_LEAF": _IS_LEAF,
            "CONVERT": functools.partial(registered_values, plan),
            "PARAM": torch.nn.Parameter,
        }
        self.names: dict[int, str] = {}  # id(object) -> its name in the source

    def constant(self, value: Any, prefix: str) -> str:
        name = self.names.get(id(value))
        if name is None:
            name = self.names[id(value)] = f"{prefix}{len(self.constants)}"
            self.constants[name] = value
        return name

    def write(self) -> tuple[str, dict[str, Any]]:
        return "\n".join([*self._swap_in(), *self._put_back(), ""]), self.constants

    def _node_reads(self) -> tuple[list[str], str]:
        """Lines that bind and check every params node dict, and the values' expression."""
        if self.flat_keys is not None:  # one node, and its values are the leaves
            keys = self.constant(self.flat_keys, "K")
            return [f"        if list(d0) != {keys}: return None"], "list(d0.values())"
        lines: list[str] = []
        leaf_reads = [""] * self.plan.given
        pending = [(len(self.layout) - 1, "d0")]  # the layout is post-order: root last
        count = 1
        while pending:  # pre-order, the order the leaves come in
            index, var = pending.pop()
            entries = self.layout[index]
            keys = self.constant([name for name, _, _ in entries], "K")
            lines.append(f"        if list({var}) != {keys}: return None")
            children = []
            for name, is_leaf, at in entries:
                if is_leaf:
                    leaf_reads[at] = f"{var}[{name!r}]"
                    continue
                child, count = f"d{count}", count + 1
                lines.append(f"        {child} = {var}[{name!r}]")
                lines.append(f"        if type({child}) is TD: {child} = {child}._tensordict")
                lines.append(f"        elif type({child}) is not dict: return None")
                children.append((at, child))
            pending.extend(reversed(children))
        return lines, f"[{', '.join(leaf_reads)}]"

    def _slots(self) -> list[str]:
        return [f"{self.constant(slot, 'S')}[{name!r}]" for slot, name in self.plan.pairs]

    def _swap_in(self) -> list[str]:
        plan = self.plan
        node_lines, read_values = self._node_reads()
        values = _unpack("v", plan.given)
        slots = self._slots()
        lines = ["def swap_in(d0, preserve):", "    try:", *node_lines]
        lines.append(f"        values = {read_values}")
        lines.append("        if not all(map(IS_LEAF, map(type, values))): return None")
        lines += self._module_checks()
        lines.append(f"        old = [{', '.join(slots)}]")
        lines += ["    except KeyError:", "        return None", f"    {values} = values"]
        # a value that tracks gradients goes in as it is; a Parameter only with the slot's
        # requires_grad (tensordict's rule), else CONVERT wraps it
        grads = [
            f"(v{i}.requires_grad and (type(v{i}) is not PARAM or old[{i}] is None"
            f" or old[{i}].requires_grad))"
            for i, e in enumerate(plan.entries)
            if e[4] == "p"
        ]
        # to_module(preserve_module_state=True) registers a Parameter given for a buffer
        # as a buffer, as tensordict does
        buffers = [i for i, entry in enumerate(plan.entries) if entry[4] == "b"]
        not_buffers = [f"type(v{i}) is not PARAM" for i in buffers]
        if grads or not_buffers:
            keep = " and ".join(grads + not_buffers)
            lines.append(f"    if preserve and not ({keep}):")
            lines.append("        new = CONVERT(values, old)  # may raise: nothing written yet")
            lines.append(f"        {values} = new")
            lines.append("    else:")
        lines.append("        new = values" if grads or not_buffers else "    new = values")
        lines += [f"    {slot} = v{i}" for i, slot in enumerate(slots)]
        lines.append("    return values, new, old")
        return lines

    def _module_checks(self) -> list[str]:
        # a parameter or submodule slot changed since the plan was built (a new tie?)
        watch = self.plan.watch
        lines = (
            []
            if watch is None
            else [f"        if not {self.constant(watch, 'W')}.unchanged(): return None"]
        )
        for parent, name, child, parameters, n_parameters, buffers, n_buffers in self.plan.checks:
            checks = [f"len({self.constant(parameters, 'P')}) != {n_parameters}"]
            if buffers is not UNWATCHED:
                checks.append(f"len({self.constant(buffers, 'B')}) != {n_buffers}")
            if child is not None:  # None: the root's row
                parent_name, child_name = self.constant(parent, "M"), self.constant(child, "C")
                checks.insert(0, f"{parent_name}.get({name!r}) is not {child_name}")
            lines.append(f"        if {' or '.join(checks)}: return None")
        return lines

    def _put_back(self) -> list[str]:
        given = self.plan.given
        slots = self._slots()
        same = " and ".join(f"{slot} is v{i}" for i, slot in enumerate(slots))
        lines = ["def put_back(old, new):", f"    {_unpack('v', given)} = new", "    try:"]
        lines += [f"        if not ({same}): return False", "    except KeyError:"]
        lines += ["        return False", f"    {_unpack('o', given)} = old"]
        lines += [f"    {slot} = o{i}" for i, slot in enumerate(slots)]
        lines.append("    return True")
        return lines


def _unpack(prefix: str, count: int) -> str:
    names = ", ".join(f"{prefix}{i}" for i in range(count))
    return f"{names}," if count == 1 else names
