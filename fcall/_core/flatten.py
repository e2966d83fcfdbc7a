"""Turn a params container into flat leaves, and old values back into a TensorDict.

A params container is a TensorDict (nested keys), a TensorDictParams, or a dict
(nested, or with flat ``"a.b.weight"`` keys, or both). Flattening yields, per
leaf, its key as a tuple of names, the tensor (or ``None``: a slot such as
``bias=None`` held it, and the old values ``to_module`` returns carry it so that
``to_module(old, module)`` puts it back; ``torch.func.functional_call`` accepts
``None`` too), and where it lives (the innermost
container and the key inside it) so that a buffer that ``forward`` reassigns can
be written back on exit.

The walk reads ``TensorDict._tensordict`` directly when the container is an
exact ``TensorDict``: the generic ``items()`` costs more in eager and, under
Dynamo, installs guards on every TensorDict attribute it touches.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict._contextlib import LAST_OP_MAPS
from tensordict.nn import TensorDictParams as _TensorDictParamsBase

from .. import _errors
from .._compat import FCALL_OPS
from .._errors import Fault
from .types import Key, new_entry

if TYPE_CHECKING:
    from .types import Plan

Holder = tuple[Any, Any]  # (innermost container, key inside it)


class Leaves:
    """The leaves of a params container, in its own order.

    ``signature`` identifies the key structure (it keys the plan cache);
    ``keys`` (tuples of names) are made on first use, which in eager is only
    when a plan or an old-values key tree is built. ``holders()`` (where each
    leaf lives) is only needed when a value must be written back into
    ``params``, which is rare: it walks the container again.
    """

    __slots__ = ("_keys", "params", "signature", "values")

    def __init__(self, params: Any) -> None:
        self.params = params
        self.values: list[Any] = []
        self.signature: Any = None
        self._keys: list[Key] | None = None

    @property
    def keys(self) -> list[Key]:
        if self._keys is None:
            self._keys = self._walked_again(None).keys
        return self._keys

    def holders(self) -> list[Holder]:
        found: list[Holder] = []
        self._walked_again(found)
        return found

    def _walked_again(self, holders: list[Holder] | None) -> Leaves:
        """The container walked again, once a front's checks passed: it fails only if the
        container changed since (a non-tensor put into it), maybe where no front words the
        fault (a restore's write-back): it is worded here, as fcall's."""
        try:
            return _walk(self.params, Leaves(self.params), holders)
        except Fault as fault:
            error = fault.worded("fcall")
        raise error


def flatten(params: Any) -> Leaves:
    if torch.compiler.is_compiling():
        return flatten_generic(params)
    return flatten_eager(params)


def flatten_generic(params: Any) -> Leaves:
    """Any params container, eager or traced: a key tuple per leaf."""
    leaves = _walk(params, Leaves(params), None)
    leaves.signature = tuple(leaves.keys)
    return leaves


def flatten_eager(params: Any) -> Leaves:
    """Eager only: an exact TensorDict, the TensorDict of a TensorDictParams and a dict
    (nested or not) whose root names are strings without a dot take a fast walk
    (``_walk_exact``)."""
    if type(params) in _EXACT:
        unbuilt = params.__dict__.get("_key_tree_and_values")
        if unbuilt is not None and unbuilt.signature is not None:
            # Old values nobody has read yet (`old = to_module(p, m); ...;
            # to_module(old, m)`): their values and key structure are those of the
            # swap that returned them; building their nodes to walk them would
            # cost more than the swap.
            leaves = Leaves(params)
            leaves.values = list(unbuilt.values)
            leaves.signature = unbuilt.signature
            return leaves
        entries = params._tensordict
    elif type(params) is dict and not _dotted_or_not_str(params):
        entries = params  # nested or not, with root names that hold no dot
    elif isinstance(params, _TensorDictParamsBase) and type(params._param_td) is TensorDict:
        entries = params._param_td._tensordict  # its registered leaves, as _walk reads them
    elif type(params) is dict:
        return _flat_or_generic(params)
    else:
        return flatten_generic(params)
    leaves = Leaves(params)
    shape: list[Any] = []
    if _walk_exact(entries, leaves.values, shape):
        leaves.signature = tuple(shape)
        return leaves
    return flatten_generic(params)


def _flat_or_generic(params: dict) -> Leaves:
    """A flat dict of tensors with dotted string names (``torch.func``'s form): its names
    are its signature (a string caches its hash), its values the leaves; the key tuples
    are split only when a plan is built (``Leaves.keys``). Anything else: the generic walk.
    A flat signature holds no ``_END_NAMES``, so it never equals a ``_walk_exact`` one."""
    values = list(params.values())
    for value in values:
        cls = type(value)
        if cls is not _Tensor and cls is not _Parameter:
            return flatten_generic(params)
    names = tuple(params)
    try:
        if not all(map(str.__len__, names)):  # an empty name: the generic walk's error
            return flatten_generic(params)
    except TypeError:  # a name that is not a string
        return flatten_generic(params)
    leaves = Leaves(params)
    leaves.values = values
    leaves.signature = names
    return leaves


_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
# In a signature (names are strings): the end of one node's names, and of its children.
_END_NAMES, _END_NODE = None, 0


def _dotted_or_not_str(entries: dict) -> bool:
    try:
        return "." in "".join(entries)  # one C call per node, not a test per name
    except TypeError:  # a name that is not a string (a tuple of names, say)
        return True


def _walk_exact(entries: dict, values: list, shape: list) -> bool:
    """Eager fast path over exact TensorDicts holding plain tensors and Parameters.

    Collects the values, and in ``shape`` the names of each node in pre-order:
    its names, then ``None``, then each child node preceded by its name, then
    ``0`` (without that end, ``{a: {b: t}, b: {y: t}}`` and ``{a: {b: {y: t}},
    b: t}`` would read the same). That identifies the key structure without a
    key tuple per leaf, and, made of strings, it hashes fast (a string caches
    its hash, a tuple does not). Returns False on anything else (the general
    walk then runs).
    """
    shape += entries
    shape.append(_END_NAMES)
    pending = [iter(entries.items())]  # a loop over the nodes, not a call per node
    while pending:
        for name, value in pending[-1]:
            # `is` twice, not `in` a tuple of classes: faster per leaf here.
            cls = type(value)
            if cls is _Parameter or cls is _Tensor:
                values.append(value)
                continue
            if cls is TensorDict or cls is OldValues:
                child = value._tensordict
            elif cls is dict:
                # A dotted name ("a.b") below the root needs no check here: the signature
                # holds it as it is, and a plan is built from the generic walk's keys (which
                # split it), in the same order as these values.
                child = value
            else:
                return False
            shape.append(name)
            shape += child
            shape.append(_END_NAMES)
            pending.append(iter(child.items()))
            break  # into the child; its parent's iterator goes on where it stopped
        else:
            shape.append(_END_NODE)
            pending.pop()
    return True


def _walk(params: Any, leaves: Leaves, holders: list[Holder] | None) -> Leaves:
    leaves._keys = []
    if isinstance(params, TensorDictBase):
        _walk_node(wrapped(params), (), leaves, holders)
    elif isinstance(params, dict):
        _walk_node(params, (), leaves, holders)
    else:
        raise Fault(TypeError, _errors.bad_params, params)
    return leaves


def wrapped(params: TensorDictBase) -> TensorDictBase:
    # A TensorDictParams wraps a TensorDict; swapping reads the registered
    # leaves themselves, not through get-post-hooks. isinstance, not
    # getattr(params, "_param_td", None): on any other TensorDict that getattr
    # becomes a NO_HASATTR guard, which runs TensorDict.__getattr__ in Python on
    # every call of the compiled function, per node.
    if isinstance(params, _TensorDictParamsBase):
        return params._param_td
    return params


def items_of(td: TensorDictBase) -> Any:
    """The entries of ``td``; an exact TensorDict's own dict, read directly."""
    # isinstance, not type(): under Dynamo, comparing type() of two entries
    # installs a Python-evaluated relational guard, run on every call.
    return td._tensordict.items() if isinstance(td, TensorDict) else td.items()


def _walk_node(node: Any, prefix: Key, leaves: Leaves, holders: list[Holder] | None) -> None:
    """The generic walk of one node, a TensorDict or a dict (whose names may be dotted, or
    tuples of names), then of its children; eager and traced alike."""
    # Once per node, not per leaf. Not typing.cast: Dynamo constant-folds a cast of a list
    # of constants into a copy, and the keys would be appended to that copy.
    assert leaves._keys is not None  # _walk set it
    is_dict = isinstance(node, dict)
    for name, value in node.items() if is_dict else items_of(node):
        key = (*prefix, *_split(name)) if is_dict else (*prefix, name)
        if value is None or isinstance(value, torch.Tensor):
            leaves._keys.append(key)
            leaves.values.append(value)
            if holders is not None:
                holders.append((node, name))
        elif isinstance(value, dict):
            _walk_node(value, key, leaves, holders)
        elif isinstance(value, TensorDictBase):
            _walk_node(
                value if isinstance(value, TensorDict) else wrapped(value), key, leaves, holders
            )
        else:
            raise Fault(TypeError, _errors.not_a_tensor, _errors.dotted(key), _payload(value))


def _split(name: Any) -> Key:
    if isinstance(name, tuple):
        return tuple(part for item in name for part in item.split("."))
    return tuple(name.split("."))


def _payload(value: Any) -> Any:
    # A NonTensorData leaf (a tensorclass, not a TensorDictBase) reports the
    # type of what it holds.
    return value.data if getattr(value, "_is_non_tensor", False) else value


class KeyTreeEntry(NamedTuple):
    """One entry of a node of a ``KeyTree``."""

    name: str
    is_leaf: bool
    position: int
    """The index of the leaf value, or of the child node in the ``KeyTree``."""


# The nodes of a nested TensorDict in post-order (the root last), each a list of its entries.
# Traced code makes an entry with `new_entry(KeyTreeEntry, ...)` (types.new_entry).
KeyTree = list[list[KeyTreeEntry]]
_SCALAR = torch.Size(())


def key_tree_of(keys: list[Key]) -> KeyTree:
    """The ``KeyTree`` of the key tuples ``keys`` (leaf ``i``: ``keys[i]``)."""
    nested: dict = {}
    for index, key in enumerate(keys):
        node = nested
        for name in key[:-1]:
            node = node.setdefault(name, {})
        node[key[-1]] = index
    tree: KeyTree = []

    def visit(node: dict) -> int:
        entries = [
            new_entry(KeyTreeEntry, (name, False, visit(child)))
            if isinstance(child, dict)
            else new_entry(KeyTreeEntry, (name, True, child))
            for name, child in node.items()
        ]
        tree.append(entries)
        return len(tree) - 1

    visit(nested)
    return tree


def to_tensordict(keys: list[Key], values: Sequence[Any]) -> TensorDict:
    """``[("a", "w")], [t]`` -> ``TensorDict(a=TensorDict(w=t))``, without checks."""
    return _from_key_tree(key_tree_of(keys), values)


def _from_key_tree(tree: KeyTree, values: Sequence[Any]) -> TensorDict:
    """The one TensorDict builder: the nodes of ``tree``, without the TensorDict's own
    validation. The leaves are known tensors of the module: the checks cost more than the
    swap in eager, and under Dynamo their type checks on a Parameter created in the graph
    crash the guard builder (``NameError: SYNTHETIC_LOCAL``). What
    ``TensorDict._new_unsafe(source, batch_size=torch.Size(()))`` sets, without its
    per-entry loop; spelled ``object.__new__(cls)``, the spelling Dynamo traces."""
    nodes: list[TensorDict] = []
    for entries in tree:
        node = object.__new__(TensorDict)
        attributes = node.__dict__
        attributes["_device"] = None
        attributes["_batch_size"] = _SCALAR
        attributes["_td_dim_names"] = None
        attributes["_tensordict"] = {
            name: values[index] if is_leaf else nodes[index] for name, is_leaf, index in entries
        }
        nodes.append(node)
    return nodes[-1]


class _Unbuilt(NamedTuple):
    """What an ``OldValues`` holds until its nodes are first read."""

    key_tree: KeyTree | None  # None: laid out by the dotted ``names``
    names: list[str] | None
    values: Sequence[Any]
    signature: Any  # that of the params whose keys they have; None: not known


# Traced, calling the NamedTuple class runs Dynamo's polyfill of class instantiation, which
# reads the old values into guarded graph inputs; `tuple.__new__` does not (types.new_entry).
_new_unbuilt = tuple.__new__


class OldValues(TensorDict):
    """The TensorDict of old values that ``to_module`` and ``swap`` return in eager.

    A plain ``TensorDict`` in every respect but one: its nested nodes are built
    on the first read of its entries. Most swaps never read them (``with
    fcall.swap(p, m):`` drops the result), and making one TensorDict per
    submodule would cost more than the swap itself, in eager time and, under
    Dynamo, in tracing time.
    """

    @property
    def _tensordict(self) -> dict:
        attributes = self.__dict__
        entries = attributes.get("_entries")
        if entries is None:
            # an _Unbuilt, read then dropped: `pop` on an object's __dict__ is not traced by
            # Dynamo 2.11
            unbuilt = attributes["_key_tree_and_values"]
            attributes["_key_tree_and_values"] = None
            tree = unbuilt.key_tree
            if tree is None:
                tree = key_tree_of([tuple(name.split(".")) for name in unbuilt.names])
            entries = attributes["_entries"] = _from_key_tree(tree, unbuilt.values)._tensordict
        return entries

    @_tensordict.setter
    def _tensordict(self, entries: dict) -> None:
        self.__dict__["_entries"] = entries
        self.__dict__["_key_tree_and_values"] = None

    # TensorDict's __enter__/__exit__ (tensordict/base.py), without what costs more
    # than a small swap: a tensorclass check on each, and a hasattr that misses
    # through TensorDict.__getattr__ on first entry. Same queue, same dispatch.
    def __enter__(self) -> OldValues:
        if torch.compiler.is_compiling():
            return super().__enter__()
        attributes = self.__dict__
        queue = attributes.get("_last_op_queue")
        if queue is None:
            queue = attributes["_last_op_queue"] = collections.deque()
        queue.append(attributes.get("_last_op"))
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> Any:
        queue = self.__dict__.get("_last_op_queue")
        last_op = queue[-1] if queue else None
        if last_op is None or last_op[0] not in FCALL_OPS or torch.compiler.is_compiling():
            return super().__exit__(exc_type, exc, traceback)
        # fcall's ops are undone on exit whether or not the block raised, as
        # TensorDict.__exit__ does for them (tensordict's own ops take its __exit__).
        cast("collections.deque[Any]", queue).pop()  # not None: last_op came from it
        name, (args, kwargs, _) = last_op  # fcall's ops take no previous value
        result = LAST_OP_MAPS[name](self, args, kwargs, None)
        return False if exc_type is not None else result


_EXACT = (TensorDict, OldValues)


def old_tensordict(plan: Plan, leaves: Leaves, old: Sequence[Any]) -> OldValues:
    """The values ``old`` that the given entries of ``plan`` held, under the keys of
    ``leaves``: a TensorDict whose nodes are built on first read (``OldValues``), in eager
    and under Dynamo alike (tracing a TensorDict per submodule that nobody reads would cost
    more compile time than the rest of the swap). Laid out by the plan's key tree, made once
    per key structure and cached with the plan; a plan built while tracing with no prefix
    stripped (``names_are_keys``) has none: its dotted names are split on the first read.
    ``leaves.signature`` comes along, so that swapping them back in finds the cached plan
    without building the nodes (``flatten_eager``)."""
    if plan.names_are_keys:
        unbuilt = _new_unbuilt(_Unbuilt, (None, plan.names[: plan.given], old, None))
    else:
        if plan.key_tree is None:
            plan.key_tree = key_tree_of(leaves.keys)
        unbuilt = _new_unbuilt(_Unbuilt, (plan.key_tree, None, old, leaves.signature))
    root = object.__new__(OldValues)
    attributes = root.__dict__  # _from_key_tree's node, inline: no call on a warm swap
    attributes["_device"] = None
    attributes["_batch_size"] = _SCALAR
    attributes["_td_dim_names"] = None
    attributes["_key_tree_and_values"] = unbuilt
    return root
