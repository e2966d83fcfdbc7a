"""Recompiles in parameter names: Dynamo's guard-failure reasons, mapped back to the keys.

Dynamo records the reason of every recompile in ``torch._dynamo.utils.guard_failures``
(one string per cache entry that failed, keyed by the compiled function's code), whether
or not ``TORCH_LOGS=recompiles`` is on. Those reasons name guard *sources*
(``params._tensordict['0']._tensordict['weight']``, ``L['params']['0.weight']``) and only the
first failing check of one tensor; ``record_recompiles`` turns each source into the
parameter key it reads, and ``explain`` adds the diff of the whole param set against the
previous one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch._dynamo.utils

from ._layout import Layout, LayoutDiff, diff_layouts

# ``tensor 'params._tensordict['0']._tensordict['weight']' dtype mismatch ...``: a source
# is a name, attributes, then subscripts and attributes (at least one subscript).
_SOURCE = re.compile(r"[A-Za-z_]\w*(?:\.\w+)*\[[^\[\]]*\](?:\[[^\[\]]*\]|\.\w+)*")
_PART = re.compile(r"\[('(?:[^'\\]|\\.)*'|\"[^\"]*\"|-?\d+)\]|\.(\w+)")
# Subscripts that read a container's insides, not a key (``L['p']['_tensordict']['0']``).
_INSIDES = frozenset(
    {"_tensordict", "_param_td", "_parameters", "_buffers", "_modules", "__dict__"}
)
_COMPILE_ID = re.compile(r"^\[?(\d+)/(\d+)(?:_\d+)?\]?:\s*")


def key_of_source(source: str) -> str | None:
    """The dotted parameter key a guard source reads, or ``None`` when it reads no key.

    String subscripts are keys (of a dict, a TensorDict's ``_tensordict``, a module's
    ``_modules`` / ``_parameters`` / ``_buffers``); attributes are the containers' insides.

    >>> key_of_source("params._tensordict['0']._tensordict['weight']")
    '0.weight'
    >>> key_of_source("L['params']['layers.0.weight']")
    'layers.0.weight'
    >>> key_of_source("L['p']['_tensordict']['0']['_tensordict']['weight']")
    '0.weight'
    >>> key_of_source("L['model']._modules['0']._parameters['bias']")
    '0.bias'
    >>> key_of_source("L['params']") is None
    True
    """
    head = re.match(r"[A-Za-z_]\w*", source)
    if head is None:
        return None
    parts = [m.group(1) for m in _PART.finditer(source, head.end())]
    if head.group(0) in ("L", "G") and parts:
        parts = parts[1:]  # L['params']: the local's name, not a key
    keys = [p[1:-1] for p in parts if p is not None and p[:1] in "'\""]
    keys = [k for k in keys if k not in _INSIDES]
    return ".".join(keys) if keys else None


@dataclasses.dataclass(frozen=True)
class GuardFailure:
    """One failed guard of one cache entry, as Dynamo reported it.

    ``reason`` is Dynamo's first line with each source it names replaced by
    `` `key` ``; ``raw`` is Dynamo's text as it was; ``keys`` the parameter keys named.
    """

    compile_id: str
    reason: str
    keys: tuple[str, ...]
    raw: str

    @classmethod
    def parse(cls, text: str, known: Iterable[str] | None = None) -> GuardFailure:
        first = text.split("\nUser stack trace", 1)[0].strip()
        m = _COMPILE_ID.match(first)
        compile_id = f"{m.group(1)}/{m.group(2)}" if m else ""
        body = first[m.end() :] if m else first
        names = set(known) if known is not None else None
        keys: list[str] = []

        def rename(match: re.Match[str]) -> str:
            key = key_of_source(match.group(0))
            if key is None or (names is not None and not _names_a_param(key, names)):
                return match.group(0)
            keys.append(key)
            return f"`{key}`"

        body = _SOURCE.sub(rename, body)
        body = re.sub(r"(?:tensor )?'(`[^`]*`)'", r"\1", body)
        return cls(compile_id, body, tuple(dict.fromkeys(keys)), text)

    def __str__(self) -> str:
        return self.reason


def _names_a_param(key: str, names: set[str]) -> bool:
    return key in names or any(n.startswith(key + ".") for n in names)


@dataclasses.dataclass(frozen=True)
class Recompile:
    """One recompile of one compiled function: the guard that failed on each cache entry
    (most recent entry first), and, from ``explain``, which param set caused it and how its
    layout differs from the set before."""

    function: str
    location: str
    failures: tuple[GuardFailure, ...]
    set_index: int | None = None
    layout_diff: LayoutDiff | None = None

    @property
    def keys(self) -> list[str]:
        """The parameter keys named by the layout diff, then by Dynamo's reasons."""
        named = self.layout_diff.keys() if self.layout_diff is not None else []
        return list(dict.fromkeys(named + [k for f in self.failures for k in f.keys]))

    def __str__(self) -> str:
        where = f"param set {self.set_index} " if self.set_index is not None else ""
        lines = [f"{where}recompiled `{self.function}` ({self.location})"]
        if self.layout_diff is not None:
            prev = self.set_index - 1 if self.set_index else 0
            lines.append(f"  changed from param set {prev}: {self.layout_diff}")
        if self.failures:
            lines.append(f"  Dynamo's reason: {self.failures[0].reason}")
        return "\n".join(lines)


def _split_events(texts: list[str]) -> list[list[str]]:
    """One list per recompile: a recompile checks the cache entries newest first, so a
    reason whose entry is not older than the previous one starts a new recompile."""
    events: list[list[str]] = []
    last = -1
    for text in texts:
        m = _COMPILE_ID.match(text)
        index = int(m.group(2)) if m else -1
        if not events or index < 0 or index >= last:
            events.append([])
        events[-1].append(text)
        last = index
    return events


class RecompileLog:
    """The recompiles seen since it was made (``record_recompiles`` yields one)."""

    def __init__(self, known_keys: Iterable[str] | None = None) -> None:
        self._known = list(known_keys) if known_keys is not None else None
        self._start = {code: len(v) for code, v in torch._dynamo.utils.guard_failures.items()}
        self._frozen: list[Recompile] | None = None

    def _new_texts(self) -> dict[types.CodeType, list[str]]:
        out = {}
        for code, texts in list(torch._dynamo.utils.guard_failures.items()):
            start = self._start.get(code, 0)
            if len(texts) < start:  # torch._dynamo.reset() cleared it meanwhile
                start = 0
            if len(texts) > start:
                out[code] = list(texts[start:])
        return out

    @property
    def recompiles(self) -> list[Recompile]:
        if self._frozen is not None:
            return self._frozen
        out = []
        for code, texts in self._new_texts().items():
            location = f"{code.co_filename}:{code.co_firstlineno}"
            for event in _split_events(texts):
                failures = tuple(GuardFailure.parse(t, self._known) for t in event)
                out.append(Recompile(code.co_name, location, failures))
        return out

    def freeze(self) -> None:
        self._frozen = self.recompiles

    def __len__(self) -> int:
        return len(self.recompiles)

    def __str__(self) -> str:
        found = self.recompiles
        if not found:
            return "no recompile"
        return f"{len(found)} recompile{'s' * (len(found) != 1)}:\n" + "\n".join(
            str(r) for r in found
        )


@contextlib.contextmanager
def record_recompiles(known_keys: Iterable[str] | None = None) -> Iterator[RecompileLog]:
    """Records the recompiles of every compiled function called in the block.

    Each ``Recompile`` gives Dynamo's reasons with guard sources turned into parameter
    keys. Pass ``known_keys`` (the param set's keys) to rename only sources that name one.

    >>> import torch, fcall
    >>> from fcall.testing import record_recompiles
    >>> model = torch.nn.Linear(2, 2)
    >>> @torch.compile(backend="eager")
    ... def step(params, x):
    ...     with fcall.swap(params, model):
    ...         return model(x)
    >>> params = {"weight": torch.ones(2, 2), "bias": torch.zeros(2)}
    >>> with record_recompiles() as log:
    ...     _ = step(params, torch.ones(2))
    ...     _ = step(dict(params, bias=torch.zeros(2, requires_grad=True)), torch.ones(2))
    >>> print(log.recompiles[0].failures[0])
    `bias` requires_grad mismatch. expected requires_grad=0
    >>> torch._dynamo.reset()  # forget the compiled step
    """
    log = RecompileLog(known_keys)
    try:
        yield log
    finally:
        log.freeze()


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Per param set given to ``explain``: its layout, and the recompiles its call caused."""

    layouts: tuple[Layout, ...]
    recompiles: tuple[Recompile, ...]

    def __str__(self) -> str:
        n = len(self.layouts)
        if not self.recompiles:
            return f"{n} param sets, no recompile"
        body = "\n".join(str(r) for r in self.recompiles)
        return f"{n} param sets, {len(self.recompiles)} recompile(s):\n{body}"


def explain(
    fn: Callable[..., Any], param_sets: Iterable[Any], *args: Any, **kwargs: Any
) -> Explanation:
    """Calls ``fn(params, *args, **kwargs)`` for each set and says why each recompile happened.

    ``fn`` is a compiled function that swaps ``params`` into a model. A recompile caused by
    set ``i`` is reported with Dynamo's reasons in parameter keys and the diff of set
    ``i``'s layout against set ``i - 1``'s (keys, Parameter vs tensor, dtype, shape, stride,
    device, ``requires_grad``), grouped when many keys change alike.

    >>> import torch, fcall
    >>> from fcall.testing import explain
    >>> model = torch.nn.Linear(2, 2)
    >>> def step(params, x):
    ...     return fcall.functional_call(model, params, (x.to(params["weight"].dtype),))
    >>> step = torch.compile(step, backend="eager")
    >>> sets = [dict(fcall.from_module(model).detach().clone().flatten_keys(".")) for _ in range(2)]
    >>> sets[1] = {k: v.double() for k, v in sets[1].items()}
    >>> print(explain(step, sets, torch.ones(2)).recompiles[0].layout_diff)
    2 params float32→float64, first: `weight`
    >>> torch._dynamo.reset()  # forget the compiled step
    """
    layouts: list[Layout] = []
    found: list[Recompile] = []
    for i, params in enumerate(param_sets):
        layouts.append(Layout.of(params))
        with record_recompiles(layouts[-1].leaves) as log:
            fn(params, *args, **kwargs)
        diff = diff_layouts(layouts[-2], layouts[-1]) if i else None
        found += [dataclasses.replace(r, set_index=i, layout_diff=diff) for r in log.recompiles]
    return Explanation(tuple(layouts), tuple(found))
