"""What torch's registration hooks tell fcall: registrations since a plan was built, and
which modules may hold a tensor that another slot holds too (a tie).

Every ``register_parameter``, ``register_buffer`` and ``register_module`` (module
construction, ``m.head.weight = m.emb.weight``, ``m[1] = m[0]``) calls torch's global
registration hooks. fcall installs hooks that

* count the parameter and submodule registrations that may make a tie
  (``REGISTRATIONS``): a cached eager plan built before the last one is rebuilt
  (``Plan.is_current``), which is how a tie made after the first swap is seen, for one
  integer compare per swap. Only those count: a tensor or module registered before
  into another slot (its first owner is recorded, ``_FIRST_OWNER``), an unseen tensor
  registered into a deep copy, and any registration into a module built before
  ``import fcall`` (what it holds was never seen). Building modules, tensordict's own
  ``to_module`` (which registers each value and then the module's own again, in their
  first slots) and ``m.weight = nn.Parameter(...)`` leave every plan of every module
  current. A plan built in eager records the first owner of each tensor and submodule of
  its tree not seen before (``record_owners``), so that a tie into it is seen even when
  its modules were built before ``import fcall``. Buffers are not counted: a forward
  that reassigns a buffer (``self.count = self.count + 1``) registers it on every call;
* keep a mark in each registering module's ``__dict__`` (``MARK``): an ``_Untied`` of
  its own once the module registers something, ``True`` when a tensor it registers was
  registered before into another slot (both owners), or when it is registered as a
  submodule a second time (it is then at two paths). An ``_Untied`` pickles as ``True``
  and deep-copies as a ``_Copied`` per module, in one ``_CopyGroup`` per deepcopy call:
  the copy's tensors were never seen registered, so registering one of them (or a new
  tensor) into the copy sets ``tied`` on every mark of the group. Marks are never shared
  between modules, and are tested with ``isinstance``: traced, one object (or one
  ``type()``) read through many modules is an aliasing guard per module. While
  tracing, when no module that owns a given key or is on a key's path may be tied, no
  given name is tied to another, and the names-and-ties lookup (keyed on the module
  object, hence guarded on its id) is skipped: one compiled function then serves every
  instance of an architecture, as with ``torch.func``. A module built before ``import
  fcall`` carries no mark: the lookup runs. Ties made by writing a slot dict directly
  (``m._parameters["w"] = t``) are not seen.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

REGISTRATIONS = [0]
MARK = "_fcall_ties"  # the key of the mark in a module's __dict__


class _Untied:
    """The mark of a module none of whose registrations made a tie: one per module.

    One object shared by every module read through each module's ``__dict__`` gave
    Dynamo an aliasing guard (``a is b``) per module, evaluated in Python on every call;
    a mark of its own per module is a ``TYPE_MATCH`` guard."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict) -> _Copied:
        return _Copied(_group_of(memo, False))

    def __copy__(self) -> bool:
        return True

    def __reduce__(self) -> tuple:
        return (bool, (True,))

    def __repr__(self) -> str:
        return "fcall: no tie seen"


class _Copied:
    """The mark of a module of one deep copy of untied modules, one per module, in one
    ``_CopyGroup`` per copy: the copy's tensors were never seen registered, so a
    registration of an unseen tensor into any of its modules sets ``tied`` for all of
    them (where else the copy holds it is unknown)."""

    __slots__ = ("__weakref__", "group", "tied")

    def __init__(self, group: _CopyGroup) -> None:
        self.group = group
        self.tied = group.tied
        group.marks.add(self)

    def __deepcopy__(self, memo: dict) -> _Copied:
        return _Copied(_group_of(memo, self.tied))

    def __copy__(self) -> bool:
        return True

    def __reduce__(self) -> tuple:
        return (bool, (True,))

    def __repr__(self) -> str:
        return f"fcall: a deep copy, tied={self.tied}"


class _CopyGroup:
    """The marks of one deep copy's modules (read in eager only, never while tracing)."""

    __slots__ = ("marks", "tied")

    def __init__(self, tied: bool) -> None:
        self.tied = tied
        self.marks: weakref.WeakSet[_Copied] = weakref.WeakSet()

    def tie(self) -> None:
        self.tied = True
        for mark in self.marks:
            mark.tied = True


_GROUP = object()  # the key of a deepcopy call's _CopyGroup in its memo (memo keys are ids)


def _group_of(memo: dict, tied: bool) -> _CopyGroup:
    """The one group of a deepcopy call, made on its first mark."""
    group = memo.get(id(_GROUP))
    if group is None:
        group = memo[id(_GROUP)] = _CopyGroup(tied)
    return group


# tensor or module -> (weakref to its first owner, the name it was registered under)
_FIRST_OWNER: Any = WeakIdKeyDictionary()


def _seen(module: nn.Module, name: str, value: Any, slots: str, counted: bool) -> None:
    attributes = module.__dict__
    mark = attributes.get(MARK)
    if mark is None:
        attributes[MARK] = _Untied()
        if module._parameters or module._buffers or module._modules:
            # built before import fcall (a new module's first registration finds its
            # dicts empty): whether this registration ties something is unknown
            _record_own(module)
            _may_tie(counted)
    if value is None or torch.compiler.is_compiling():
        return
    first = _FIRST_OWNER.get(value)
    if type(mark) is _Copied and first is None:
        mark.group.tie()  # a deep copy's own tensor (or a new one) registered into it
        _may_tie(counted)
    owner = None if first is None else first[0]()
    if owner is None:  # never seen, or its first owner is gone: this one is its first
        _FIRST_OWNER[value] = (weakref.ref(module), name)
        return
    if owner is module and first[1] == name:
        return  # back in its first slot (tensordict's to_module restores through the hooks)
    _may_tie(counted)
    if slots == "_modules":  # the submodule is at two paths now, and its tensors
        value.__dict__[MARK] = True
    else:
        attributes[MARK] = True
        owner.__dict__[MARK] = True


def _may_tie(counted: bool) -> None:
    if counted:
        REGISTRATIONS[0] += 1


def _record_own(module: nn.Module) -> None:
    """Record ``module`` as the first owner of what it holds that was never seen."""
    for slots in (module._parameters, module._buffers, module._modules):
        for name, value in slots.items():
            if value is not None and _FIRST_OWNER.get(value) is None:
                _FIRST_OWNER[value] = (weakref.ref(module), name)


def record_owners(root: nn.Module) -> None:
    """``_record_own`` for every module of ``root``'s tree (a plan was built for it); each
    module once, so a tree with a reference cycle ends."""
    for module in root.modules():
        _record_own(module)


def _on_parameter(module: nn.Module, name: str, value: Any) -> None:
    _seen(module, name, value, "_parameters", counted=True)


def _on_buffer(module: nn.Module, name: str, value: Any) -> None:
    _seen(module, name, value, "_buffers", counted=False)


def _on_module(module: nn.Module, name: str, value: Any) -> None:
    _seen(module, name, value, "_modules", counted=True)


def may_be_tied(attributes: dict) -> bool:
    """Whether the module with these ``__dict__`` entries may hold a tied tensor (read
    while tracing: a guard on the mark's type, the same for every untied instance)."""
    mark = attributes.get(MARK)
    # isinstance, not type(mark) is: traced, type() of each module's mark is one class
    # object read from many sources, which Dynamo guards as aliases, per module
    if isinstance(mark, _Untied):
        return False
    return mark.tied if isinstance(mark, _Copied) else True


nn.modules.module.register_module_parameter_registration_hook(_on_parameter)
nn.modules.module.register_module_buffer_registration_hook(_on_buffer)
nn.modules.module.register_module_module_registration_hook(_on_module)
