"""Message builders shared by the eager and the compiled paths, and ``Fault``, the core's
error before a front words it.

A swap's bad input (a key, a value, a keyword) gets a message that names the API, the
offending key, what was expected and what was found, and how to fix it, and ends by saying
the module was left unchanged, because fcall validates every key and value before it writes
anything. The core (``fcall/_core``) does not know which API called it: it raises a
``Fault`` with the facts, and the front raises ``fault.worded(api)``, once, with its own name.
The other messages here say what they say (a slot deleted inside a ``with`` block, an argument
of the wrong type). ``functional_call``'s extra keys keep torch's words, and
``from_checkpoint`` and ``TensorDictParams`` word their own errors beside their code.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import torch

UNCHANGED = "The module was left unchanged."


class UnknownKey(KeyError):
    """A params key names no parameter, buffer or tensor attribute of the module.

    Raised by ``swap``, ``to_module`` and ``functional_call(..., unknown_keys="raise")``
    before anything is written (``functional_call``'s default sets such a key as an
    attribute, as torch.func does); the message names the key and the nearest existing ones.

    >>> import torch, fcall
    >>> try:
    ...     fcall.swap({"wieght": torch.zeros(1, 1)}, torch.nn.Linear(1, 1)).__enter__()
    ... except fcall.UnknownKey as error:
    ...     print(error.args[0].split(" (")[0])
    fcall.swap: 'wieght' names no parameter or buffer of Linear
    """


class Fault(Exception):
    """What the core found wrong, raised before anything is written. ``args``: the public
    exception's type, the builder of its message (one of this module's, which takes the API's
    name first) and the facts the builder takes after it, the offending key first where there
    is one. The front that called the core raises ``fault.worded(api)`` in its place (outside
    its ``except`` clause, so that no ``Fault`` is chained to the user's error). Not public:
    no ``Fault`` leaves fcall. (No ``__init__`` of its own: Dynamo 2.11 traces an exception
    class's ``super().__init__`` call in no form.)

    >>> fault = Fault(KeyError, given_twice, ["0.weight"])
    >>> fault.worded("fcall.swap").args[0].split(" (")[0]
    "fcall.swap: params gives '0.weight' more than once"
    """

    def worded(self, api: str) -> Exception:
        """The public error, ``api``'s message."""
        kind, words, *facts = self.args
        return kind(words(api, *facts))

    def is_unknown_key(self) -> bool:
        """Whether the public error is ``UnknownKey`` (a key with no slot)."""
        return self.args[0] is UnknownKey


def dotted(key: tuple[str, ...]) -> str:
    return ".".join(key)


def quoted(names: Iterable[str]) -> str:
    return ", ".join(repr(name) for name in names)


# Run, not traced, while Dynamo traces (assume_constant_result: Dynamo calls it and
# takes the string as a constant): tracing difflib would take tens of seconds before
# the KeyError. Not torch.compiler.disable: under fullgraph=True the call of a disabled
# function is itself refused ("Skip calling torch.compiler.disable()d function") and
# the message is never made; this way Dynamo's "Observed exception" carries it.
@torch._dynamo.assume_constant_result
def nearest_names(key: str, names: Iterable[str], count: int = 3) -> str:
    matches = difflib.get_close_matches(key, list(names), n=count, cutoff=0.0)
    return ", ".join(repr(name) for name in matches) or "none"


def unknown_key(api: str, key: tuple[str, ...], root_name: str, names: list[str]) -> str:
    return (
        f"{api}: {dotted(key)!r} names no parameter or buffer of {root_name} "
        f"(the nearest existing keys: {nearest_names(dotted(key), names)}). "
        f"Keys must match module.named_parameters() / named_buffers(). {UNCHANGED}"
    )


def parametrized_key(api: str, key: tuple[str, ...], originals: list[str]) -> str:
    return (
        f"{api}: {dotted(key)!r} is a parametrized tensor (torch.nn.utils.parametrize); its "
        f"values are the parametrization's originals: {quoted(originals)}. Give those keys (the "
        f"parametrization then runs on them), or call fcall.functional_call, where the plain "
        f"name disables the parametrization for the call. {UNCHANGED}"
    )


def not_a_tensor(api: str, key: str, value: object) -> str:
    peer = (  # torch.func's own words (NamedMemberAccessor.swap_tensor)
        f"{value} is not an instance of torch.Tensor\n" if api.endswith("functional_call") else ""
    )
    return (
        f"{peer}{api}: the value at {key!r} is a {type_name(value)}, expected a torch.Tensor. "
        f"Only tensors can be swapped into a module; remove the entry or convert it "
        f"to a tensor. {UNCHANGED}"
    )


def type_name(value: object) -> str:
    """A builtin type's name (``int``); any other type's with its module
    (``functorch.dim.Tensor``, whose bare name reads as torch's)."""
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


EMPTY_NAME = 'tensor name can\'t be empty string ""'  # torch.func's (NamedMemberAccessor)


def not_a_module(api: str, module: object) -> str:
    if api.endswith("from_module"):
        return f"{api}: expected an nn.Module to read parameters from, got {type(module).__name__}."
    return (
        f"{api}: expected an nn.Module to swap parameters into, got "
        f"{type(module).__name__}. Pass the module as the "
        f"{'first' if api.endswith('functional_call') else 'second'} argument."
    )


def bad_params(api: str, params: object) -> str:
    return (
        f"{api}: expected params to be a TensorDict, a TensorDictParams or a dict of "
        f"tensors, got {type(params).__name__}."
    )


def missing_keys(api: str, root_name: str, missing: list[str]) -> str:
    listed = ", ".join(repr(name) for name in sorted(missing))
    return (
        f"Error(s) in reparametrizing for {root_name}:\n\tMissing key(s): {listed}.\n"
        f"{api}(strict=True): params has no value for {len(missing)} key(s) of "
        f"{root_name}: {listed}. Give every parameter and buffer, or pass strict=False "
        f"to keep the module's own values for those. {UNCHANGED}"
    )


def unexpected_keys(api: str, root_name: str, unexpected: list[str], missing: list[str]) -> str:
    """torch.func's ``strict=True`` error (its own words first), then fcall's detail."""
    lines = [f"Unexpected key(s): {', '.join(map(repr, sorted(unexpected)))}."]
    if missing:
        lines.append(f"Missing key(s): {', '.join(map(repr, missing))}.")
    return (
        f"Error(s) in reparametrizing for {root_name}:\n\t" + "\n\t".join(lines) + "\n"
        f"{api}(strict=True): params must give exactly the module's parameters and buffers. "
        f"Remove the unexpected keys, or pass strict=False to set them as attributes for the "
        f"call (torch.func's behaviour). {UNCHANGED}"
    )


def tied_conflict(api: str, names: list[str]) -> str:
    listed = ", ".join(repr(name) for name in sorted(names))
    peer = (  # torch.func's own words, which its tests match
        f"functional_call got multiple values for keys {sorted(names)}, which are tied. "
        f"Consider using tie_weights=False\n"
        if api.endswith("functional_call")
        else ""
    )
    return (
        f"{peer}{api}: got different tensors for the keys {listed}, which the module ties to "
        f"one tensor. Give one of them (the others follow), the same tensor for all, "
        f"or pass tie_weights=False. {UNCHANGED}"
    )


def memo_given(api: str) -> str:
    return f"{api}: memo cannot be passed to the public to_module anymore."


def inplace_with_state_dict(api: str) -> str:
    return f"{api}: inplace argument cannot be passed when use_state_dict=True."


def inplace_none_target(api: str, key: str) -> str:
    return (
        f"{api}(inplace=True): the module holds None at {key!r}, so there is nothing to "
        f"copy into. Swap without inplace=True to set it. {UNCHANGED}"
    )


def inplace_shape(api: str, key: str, got: tuple[int, ...], expected: tuple[int, ...]) -> str:
    return (
        f"{api}(inplace=True): the value at {key!r} has shape {got}, which cannot be "
        f"copied into the module's tensor of shape {expected}. Give a tensor of shape "
        f"{expected}. {UNCHANGED}"
    )


def bad_swap_dest(api: str, swap_dest: object) -> str:
    return (
        f"{api}: swap_dest must be a TensorDict (it is returned and restores the module "
        f"in `with`), got {type(swap_dest).__name__}."
    )


def given_twice(api: str, names: list[str]) -> str:
    return (
        f"{api}: params gives {quoted(names)} more than once (for example as a flat "
        f"'a.b' key and as a nested one). Give each parameter or buffer once. {UNCHANGED}"
    )


def bad_params_part(api: str, position: int, part: object) -> str:
    return (
        f"Expected all elements of parameter_and_buffer_dicts to be dictionaries.\n"
        f"{api}: params is a tuple or list, so each of its elements must be a dict of "
        f"tensors (as torch.func.functional_call's (params, buffers) form), but element "
        f"{position} is of type {type(part).__name__}. Pass dicts, or one dict. {UNCHANGED}"
    )


def given_in_two_dicts(api: str, names: list[str]) -> str:
    return (
        f"{names} appeared in multiple dictionaries; behavior of functional call is "
        f"ambiguous.\n"
        f"{api}: {quoted(names)} appeared in more than one of the params dicts, so which value "
        f"to use is ambiguous. Give each key in one dict only. {UNCHANGED}"
    )


def scripted_module(api: str, module: object) -> str:
    return (
        f"The stateless API can't be used with Jitted modules.\n"
        f"{api}: {type(module).__name__} is a TorchScript module (torch.jit.script or "
        f"torch.jit.trace), and its parameters cannot be swapped; torch.func's stateless "
        f"API refuses it too. Swap into the nn.Module before scripting it. {UNCHANGED}"
    )


def slot_taken_in_block(names: list[str]) -> str:
    return (
        f"fcall: inside the block, {quoted(names)} left its slot and the name now holds something "
        f"else (a parametrization, a plain attribute, another parameter, buffer or "
        f"submodule): every other slot was restored, and {quoted(names)} kept what the block "
        f"made of it. Register parametrizations, pruning or deletions outside the swap."
    )


def data_parallel(api: str) -> str:
    return (
        f"The stateless API can't be used with nn.DataParallel module.\n{api}: swap into "
        f"the wrapped module (module.module), or use DistributedDataParallel. {UNCHANGED}"
    )


def bad_params_form(api: str, params: object) -> str:
    return (
        f"Expected parameter_and_buffer_dicts to be a dict, or a list/tuple of dicts, but got "
        f"{type(params)}.\n{api}: pass a dict of tensors, a TensorDict or a TensorDictParams. "
        f"{UNCHANGED}"
    )


# --- distributed trees (fcall/_core/distributed.py) ------------------------------------------


def _what_works_on_fsdp(root_name: str) -> str:
    return (
        f"What works on an FSDP2 module: param sets without gradients (e.g. "
        f"fcall.from_module({root_name.lower()}).detach().clone(), DTensors with the module's "
        f"placements, or full tensors of the full shape), which fcall copies into the sharded "
        f"parameters and restores exactly on exit."
    )


def requires_grad_on_fsdp(api: str, key: str, root_name: str) -> str:
    return (
        f"{api}: {key!r} requires grad (or is batched by vmap), but {root_name} is sharded with "
        f"FSDP2 (fully_shard). FSDP re-registers its own parameters before every forward, so "
        f"fcall swaps by copying into the sharded parameters: gradients would reach the "
        f"module's parameters, not this value. Pass detached values (params.detach()), or copy "
        f"them in with fcall.to_module(params, module, inplace=True) and train the module's "
        f"own parameters. {_what_works_on_fsdp(root_name)} {UNCHANGED}"
    )


def fsdp_shape(
    api: str,
    key: str,
    shape: torch.Size,
    full_shape: torch.Size,
    local: tuple[int, ...] | None,
) -> str:
    """``local``: the shape of the parameter's local shard, if it is sharded."""
    hint = (
        f" (the local shard has shape {local}; give the full tensor or a DTensor instead)"
        if local is not None and tuple(shape) == local
        else ""
    )
    return (
        f"{api}: {key!r} has shape {tuple(shape)}, but the FSDP2-sharded parameter it "
        f"replaces has full shape {tuple(full_shape)}{hint}. {UNCHANGED}"
    )


def fsdp_mesh(api: str, key: str, mesh: object, target_mesh: object) -> str:
    return (
        f"{api}: {key!r} is a DTensor on {mesh}, but the FSDP2-sharded parameter "
        f"it replaces lives on {target_mesh}. Give a DTensor on the parameter's mesh "
        f"or a full tensor. {UNCHANGED}"
    )


def grad_through_ddp(api: str, key: str) -> str:
    return (
        f"{api}: {key!r} requires grad (or is batched by vmap), but the module is wrapped in "
        f"DistributedDataParallel, whose gradient all-reduce only watches the wrapped module's "
        f"own parameters: this value's gradient would silently stay local to each rank. To "
        f"train swapped parameters, swap into ddp.module (e.g. fcall.functional_call("
        f"ddp.module, params, args)) and all-reduce their gradients yourself "
        f"(torch.distributed.all_reduce(p.grad); p.grad /= world_size), or pass detached "
        f"values for a target network. {UNCHANGED}"
    )
