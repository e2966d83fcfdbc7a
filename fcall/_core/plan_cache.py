"""The eager plan cache: per module, its plans by key structure (``fcall/_plan.py``).

A plan is looked up by the params' signature (their key structure), with
``tie_weights`` and ``strict``; the last one used is tried first. A cached plan is
checked before each use (``Plan.is_current``) and rebuilt if the module changed. Under
Dynamo nothing is cached: the plan is built in the trace (``fcall/_build.py``).
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

from .build import build
from .flatten import Leaves
from .plan import Plan

_MAX_PLANS_PER_MODULE = 16
# Per module, by id: its _Cached plans. Not a WeakKeyDictionary: its get() is Python code,
# about a tenth of a small swap.
_CACHE: dict[int, _Cached] = {}


def forget(module: nn.Module) -> None:
    """Drop the cached plans of ``module`` (one of them was stale)."""
    _CACHE.pop(id(module), None)


class _Cached:
    """The plans of one module: by key structure, and the last one used."""

    __slots__ = ("last_plan", "last_signature", "module", "plans")

    def __init__(self, module: weakref.ref) -> None:
        self.module = module  # a weak reference: the cache must not keep the module alive
        self.plans: dict[Any, Plan] = {}
        self.last_signature: Any = None
        self.last_plan: Plan | None = None


def _cached(module: nn.Module) -> _Cached:
    """The cache entry of ``module``, made on first use."""
    key = id(module)
    found = _CACHE.get(key)
    if found is not None and found.module() is module:
        return found

    def drop(ref: weakref.ref) -> None:  # the module is gone: so are its plans
        entry = _CACHE.get(key)
        if entry is not None and entry.module is ref:
            del _CACHE[key]

    found = _CACHE[key] = _Cached(weakref.ref(module, drop))
    return found


def plan_for(
    module: nn.Module, leaves: Leaves, api: str, *, tie_weights: bool, strict: bool
) -> Plan:
    """The cached plan of ``leaves`` in ``module`` (eager only: under Dynamo a plan is
    built in the trace and never cached, see fcall/_build.py)."""
    signature = (leaves.signature, tie_weights, strict)
    cached = _cached(module)
    # The last swap's key first: equal tuples of the same names compare by identity,
    # where hashing reads every name (a cache miss each, in a cold swap of a big tree).
    if cached.last_signature == signature:
        plan = cached.last_plan
    else:
        plan = cached.plans.get(signature)
    if plan is None or not plan.is_current():
        plan = build(module, leaves.keys, api, tie_weights=tie_weights, strict=strict)
        if len(cached.plans) >= _MAX_PLANS_PER_MODULE:
            cached.plans.pop(next(iter(cached.plans)))
        cached.plans[signature] = plan
    cached.last_signature, cached.last_plan = signature, plan
    return plan
