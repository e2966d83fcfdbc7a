"""``fcall.from_checkpoint``: a parameter set read from a ``torch.distributed.checkpoint`` (DCP)
checkpoint, laid out and sharded like the module it is for.

Every leaf is allocated like the module's own tensor (``torch.empty_like``: a DTensor with the
module's mesh and placements under FSDP2 or tensor parallelism, a plain tensor otherwise), then
``torch.distributed.checkpoint.load`` fills it, reading on each rank only the shards that rank
holds and resharding as DCP does (a checkpoint written at another world size loads). Everything
is checked against the checkpoint's metadata first: a mismatch raises one
:class:`CheckpointMismatch` before anything is read.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from .._core.distributed import fsdp_modules, reshard
from .._core.tree import unwrap

__all__ = ["CheckpointMismatch", "from_checkpoint"]

Key = tuple[str, ...]
_API = "fcall.from_checkpoint"
_NOTHING_LOADED = "Nothing was loaded."
_LISTED = 8  # keys named per line of the error; the rest are counted


class CheckpointMismatch(KeyError, ValueError):
    """The checkpoint and the module (or ``keys=``) disagree: keys or shapes. A ``KeyError``
    and a ``ValueError``; its message is printed as it is (not quoted, as a KeyError's).
    Raised by ``fcall.from_checkpoint`` before anything is read.

    >>> import tempfile, warnings, torch, fcall
    >>> import torch.distributed.checkpoint as dcp
    >>> folder = tempfile.mkdtemp()
    >>> with warnings.catch_warnings():  # one process, no process group: DCP says so
    ...     warnings.simplefilter("ignore")
    ...     _ = dcp.save({"weight": torch.zeros(2, 2)}, checkpoint_id=folder)
    >>> try:
    ...     fcall.from_checkpoint(folder, torch.nn.Linear(2, 2))
    ... except fcall.CheckpointMismatch as error:
    ...     print(str(error).splitlines()[1])
      - missing from the checkpoint: 'bias'
    """

    def __str__(self) -> str:
        return str(self.args[0])


def from_checkpoint(
    checkpoint_id: str | os.PathLike[str],
    module: nn.Module,
    *,
    keys: Iterable[str | Key] | None = None,
    prefix: str = "",
) -> TensorDict:
    """A parameter set of ``module`` read from the DCP checkpoint at ``checkpoint_id``.

    ``checkpoint_id`` is the directory ``torch.distributed.checkpoint.save`` wrote (read with
    ``FileSystemReader``).

    The result is laid out like ``fcall.from_module(module)`` (nested keys; parameters and
    persistent buffers, i.e. the module's ``state_dict()`` tensors; tied names share one
    tensor) and allocated like the module's own tensors: under FSDP2 (``fully_shard``) or
    tensor parallelism each leaf is a DTensor with the parameter's mesh and placements, so a
    set costs one rank its shards, not full tensors; otherwise a plain tensor on the module's
    device and dtype (a checkpoint of another dtype is converted to the module's).
    ``torch.distributed.checkpoint.load`` fills it, resharding as DCP does
    (a checkpoint written at world size 2 loads at 1 and the other way round). No leaf
    requires grad. The module is not touched: the same Parameter objects, the same values
    (FSDP2 modules are resharded first, as every fcall swap does). Swap the set in with
    ``with fcall.swap(params, module): ...``.

    Checkpoint keys are the module's ``state_dict()`` keys, as ``dcp.save(model.state_dict(),
    ...)`` writes them. For ``dcp.save({"model": model.state_dict(), ...})`` pass
    ``prefix="model"``. For a DDP- or ``torch.compile``-wrapped module, the keys may carry the
    wrapper's prefix (``ddp.state_dict()``) or not (``get_model_state_dict(ddp)``).

    As ``load_state_dict(strict=True)``: every key must be in the checkpoint with the
    module's shape, and (with ``keys=None``) every tensor of the checkpoint (under
    ``prefix``) must be a key of the module. Otherwise one :class:`CheckpointMismatch` (a
    ``KeyError`` and a ``ValueError``) names all of them before anything is read. ``keys``
    (dotted strings or tuples; a submodule's name selects everything under it) loads that
    subset and ignores the checkpoint's other tensors.

    Under a process group this is a collective, as ``dcp.load``: every rank calls it with
    the same module layout and keys. Without one it reads in this process.

    Examples:
        >>> import tempfile, torch, fcall
        >>> import torch.distributed.checkpoint as dcp
        >>> from torch import nn
        >>> model = nn.Linear(2, 1)
        >>> trained = nn.Linear(2, 1)
        >>> path = tempfile.mkdtemp()
        >>> _ = dcp.save(trained.state_dict(), checkpoint_id=path)
        >>> params = fcall.from_checkpoint(path, model)
        >>> sorted(params.keys())
        ['bias', 'weight']
        >>> with fcall.swap(params, model):
        ...     torch.equal(model(torch.ones(2)), trained(torch.ones(2)))
        True
        >>> params["weight"] is model.weight, torch.equal(model.weight, trained.weight)
        (False, False)
    """
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"{_API}: expected the nn.Module to read a parameter set for as the second "
            f"argument, got {type(module).__name__}."
        )
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = os.fspath(checkpoint_id)
    reshard(fsdp_modules(module))  # the sharded parameters are the ones read
    own = _module_tensors(module)
    metadata = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    prefix = prefix.rstrip(".")
    under = f"{prefix}." if prefix else ""
    stored: dict[str, Any] = {
        name[len(under) :]: meta for name, meta in metadata.items() if name.startswith(under)
    }
    tensors = sorted(n for n, meta in stored.items() if isinstance(meta, TensorStorageMetadata))
    stripped = _stripped(module, list(own), stored)
    selected, unknown = _select(own, keys)

    names = {key: stripped.get(key, ".".join(key)) for key in own}
    problems = _problems(own, names, selected, unknown, stored, tensors, keys is None)
    if problems:  # everything checked against the metadata: nothing allocated or read yet
        raise CheckpointMismatch(
            _mismatch(path, type(unwrap(module)[0]).__name__, problems, names, tensors, under)
        )
    to_load: dict[str, torch.Tensor] = {}  # checkpoint key -> the new leaf it fills
    leaves: dict[Key, torch.Tensor] = {}
    allocated: dict[int, torch.Tensor] = {}  # one leaf per module tensor: ties stay tied
    for key in selected:
        tensor = own[key]
        leaf = allocated.get(id(tensor))
        if leaf is None:
            leaf = allocated[id(tensor)] = _like(tensor)
            to_load[under + names[key]] = leaf
        leaves[key] = leaf

    no_dist = not (dist.is_available() and dist.is_initialized())
    with warnings.catch_warnings():  # DCP warns that it loads in one process: that is meant
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(to_load, storage_reader=dcp.FileSystemReader(path), no_dist=no_dist)
    out = TensorDict()
    for key, leaf in leaves.items():
        out.set(key, leaf)
    return out


def _problems(
    own: dict[Key, torch.Tensor],
    names: dict[Key, str],
    selected: list[Key],
    unknown: list[str],
    stored: dict[str, Any],
    tensors: list[str],
    strict: bool,
) -> list[str]:
    """Each way the checkpoint's metadata does not fit the selected keys, one line each:
    keys= naming nothing, missing keys, (``strict``) unexpected tensors, shapes."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    problems = [f"keys= names no tensor of the module: {_listed(unknown)}"] if unknown else []
    missing: list[str] = []
    shapes: list[str] = []
    for key in selected:
        meta = stored.get(names[key])
        if not isinstance(meta, TensorStorageMetadata):
            missing.append(names[key])
        elif tuple(meta.size) != tuple(own[key].shape):
            shapes.append(
                f"{names[key]!r}: the module's is {tuple(own[key].shape)}, the checkpoint's "
                f"{tuple(meta.size)}"
            )
    if missing:
        problems.append(f"missing from the checkpoint: {_listed(missing)}")
    if strict:
        wanted = set(names.values())
        unexpected = [name for name in tensors if name not in wanted]
        if unexpected:
            problems.append(f"unexpected in the checkpoint: {_listed(unexpected)}")
    if shapes:
        problems.append("shape mismatch: " + "; ".join(shapes))
    return problems


def _module_tensors(module: nn.Module) -> dict[Key, torch.Tensor]:
    """The module's parameters and persistent buffers (its ``state_dict()`` tensors), by key,
    in the module's order; tied names kept, each with the one tensor."""
    out: dict[Key, torch.Tensor] = {}
    for prefix, child in module.named_modules(remove_duplicate=False):
        path = tuple(prefix.split(".")) if prefix else ()
        for name, param in child._parameters.items():
            if param is not None:
                out[(*path, name)] = param
        for name, buffer in child._buffers.items():
            if buffer is not None and name not in child._non_persistent_buffers_set:
                out[(*path, name)] = buffer
    return out


def _stripped(module: nn.Module, own: list[Key], stored: dict[str, Any]) -> dict[Key, str]:
    """Checkpoint names without the DDP / torch.compile wrappers' prefixes, for a checkpoint
    written from the wrapped module (``get_model_state_dict`` writes them so): used when the
    checkpoint has no key under the wrappers' prefix."""
    wrappers = unwrap(module)[1]
    if not wrappers:
        return {}
    head = ".".join(wrappers) + "."
    if any(name.startswith(head) for name in stored):
        return {}
    depth = len(wrappers)
    return {key: ".".join(key[depth:]) for key in own if key[:depth] == tuple(wrappers)}


def _select(
    own: dict[Key, torch.Tensor], keys: Iterable[str | Key] | None
) -> tuple[list[Key], list[str]]:
    """The module keys ``keys`` names (a key, or a submodule: everything under it), and the
    names that match nothing."""
    if keys is None:
        return list(own), []
    asked = [keys] if isinstance(keys, str) else list(keys)
    wanted = [tuple(k.split(".")) if isinstance(k, str) else tuple(k) for k in asked]
    unknown = [".".join(w) for w in wanted if not any(key[: len(w)] == w for key in own)]
    selected = [key for key in own if any(key[: len(w)] == w for w in wanted)]
    return selected, unknown


def _like(tensor: torch.Tensor) -> torch.Tensor:
    """A new, uninitialized leaf laid out as ``tensor``: a DTensor keeps its mesh and
    placements (each rank allocates its shard only); no gradient."""
    with torch.no_grad():
        return torch.empty_like(tensor, requires_grad=False)


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:_LISTED])
    return shown + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")


def _mismatch(
    path: str,
    root_name: str,
    problems: list[str],
    names: dict[Key, str],
    tensors: list[str],
    under: str,
) -> str:
    hint = _prefix_hint(list(names.values()), set(tensors)) if not under else ""
    return (
        f"{_API}: the checkpoint at {path!r} does not fit {root_name}:\n  - "
        + "\n  - ".join(problems)
        + f"\nThe checkpoint's tensors{f' under {under!r}' if under else ''}: "
        f"{_listed(tensors)}; the module's keys: {_listed(list(names.values()))}.\n"
        f"Checkpoint keys are the module's state_dict() keys. {hint}Pass keys=[...] to "
        f"load only the keys both have with the same shape (a swap keeps the module's own "
        f"values for the others). {_NOTHING_LOADED}"
    )


def _prefix_hint(names: list[str], tensors: set[str]) -> str:
    """If the module's keys are all in the checkpoint under one head ("model."), say so."""
    heads = {name.split(".", 1)[0] for name in tensors}
    for head in sorted(heads):
        if names and all(f"{head}.{name}" in tensors for name in names):
            return f"They are under {head!r}: pass prefix={head!r}. "
    return ""
