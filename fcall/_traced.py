"""The plan while Dynamo traces: one walk over params and the module tree together.

In eager a plan is built once per key structure and cached (``_plan.py``). Under
``torch.compile`` nothing is cached: Dynamo traces the build on every compile, so
each Python step of it is compile time, per leaf. The generic path makes a key
tuple per leaf, then walks the module tree from the root once per key. This walk
visits each params node once, together with the module it names, and makes per
leaf only the plan entry and its dotted name.

A flat dict (``"0.weight"`` keys, as ``torch.func.functional_call`` takes) is
walked key by key: each key's module is found once per dotted prefix.

Anything unusual (a dotted key in a nested node, a non-string key, a
``_orig_mod.``/``module.`` prefix, a key the module does not have, a value that is
neither a tensor nor a container) returns ``None``, and the generic path runs,
raising the same errors as in eager.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from ._flatten import Leaves, items_of, wrapped
from ._plan import Plan, complete, slot_of, unwrap


def plan_while_tracing(
    params: Any, module: nn.Module, api: str, *, tie_weights: bool, strict: bool
) -> tuple[Plan, Leaves] | None:
    """The plan and leaves of ``params`` for ``module``, or ``None`` to take the generic path."""
    root, _ = unwrap(module)
    items = _items(params, in_tensordict=False)
    if items is None:
        return None
    plan, leaves = Plan(), Leaves(params, api)
    if isinstance(params, dict) and _has_dotted_key(params):
        if not _visit_flat(params, root, plan, leaves.values):
            return None
    elif not _visit(items, isinstance(params, TensorDictBase), root, "", plan, leaves.values):
        return None
    plan.given = len(plan.entries)  # keys of one node are unique, and no key had a dot
    complete(plan, root, module, api, tie_weights=tie_weights, strict=strict)
    plan.names_are_keys = True
    return plan.finish(cached=False), leaves


def _items(node: Any, in_tensordict: bool) -> Any:
    if isinstance(node, TensorDictBase):
        return items_of(wrapped(node))
    if isinstance(node, dict) and not in_tensordict:
        return node.items()
    return None


def _has_dotted_key(params: dict) -> bool:
    for name in params:
        if isinstance(name, str) and "." in name:
            return True
    return False


def _visit_flat(params: dict, root: nn.Module, plan: Plan, values: list) -> bool:
    """Add the leaves of a flat dict: each dotted key names a module and a slot in it."""
    owners = {"": root}  # module per dotted prefix, each found once
    if isinstance(root, nn.RNNBase):
        plan.rnns.append(weakref.ref(root))
    for key, value in params.items():
        if not isinstance(key, str) or not (value is None or isinstance(value, torch.Tensor)):
            return False
        prefix, _, name = key.rpartition(".")
        owner = owners.get(prefix)
        if owner is None:
            owner = _owner_at(prefix, owners, plan)
            if owner is None:
                return False
        slot, kind = slot_of(owner, name)
        if slot is None:
            return False
        if kind == "a":
            plan.has_attributes = True
        plan.entries.append((slot, name, len(values), owner.__dict__, kind))
        plan.names.append(key)
        values.append(value)
    return True


def _owner_at(prefix: str, owners: dict, plan: Plan) -> nn.Module | None:
    """The submodule at dotted ``prefix``, recording each module on its path once."""
    parent_prefix, _, name = prefix.rpartition(".")
    parent = owners.get(parent_prefix)
    if parent is None:
        parent = _owner_at(parent_prefix, owners, plan) if parent_prefix else None
        if parent is None:
            return None
    child = parent._modules.get(name)
    if child is None:
        return None
    plan.chain.append((parent._modules, name, child))
    if isinstance(child, nn.RNNBase):
        plan.rnns.append(weakref.ref(child))
    owners[prefix] = child
    return child


def _visit(
    items: Any, in_tensordict: bool, owner: nn.Module, prefix: str, plan: Plan, values: list
) -> bool:
    """Add the leaves under one params node, whose entries are ``items``, named by ``owner``."""
    if isinstance(owner, nn.RNNBase):
        plan.rnns.append(weakref.ref(owner))
    attributes = owner.__dict__
    for name, value in items:
        # A dotted or non-string name is in no module dict: it falls through to the
        # generic path, which splits or refuses it.
        if value is None or isinstance(value, torch.Tensor):
            slot, kind = slot_of(owner, name)
            if slot is None:
                return False
            if kind == "a":
                plan.has_attributes = True
            plan.entries.append((slot, name, len(values), attributes, kind))
            plan.names.append(prefix + name)
            values.append(value)
            continue
        child = owner._modules.get(name)
        inner = _items(value, in_tensordict)
        if child is None or inner is None:
            return False
        plan.chain.append((owner._modules, name, child))
        inner_in_tensordict = isinstance(value, TensorDictBase)
        if not _visit(inner, inner_in_tensordict, child, prefix + name + ".", plan, values):
            return False
    return True
