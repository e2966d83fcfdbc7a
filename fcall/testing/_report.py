"""What ``check_swap_parity`` says: its report, and the ``ParityError`` of each failure kind,
worded in the user's parameter keys."""

from __future__ import annotations

import dataclasses
import enum

from ._breaks import GraphBreak
from ._compare import Mismatch
from ._layout import Layout, diff_layouts
from ._recompiles import GuardFailure, Recompile


class Failure(enum.Enum):
    """What a ``ParityError`` reports."""

    RECOMPILE = "recompile"
    GRAPH_BREAK = "graph break"
    MISMATCH = "mismatch"
    RESTORE = "restore"
    EAGER_FALLBACK = "eager fallback"
    ERROR = "error"
    FIRST_ORDER = "first order"  # order=2: a meta-gradient without its second-order term


class ParityError(AssertionError):
    """A swap that recompiles, breaks the graph, differs from eager or does not restore.

    ``kind`` says which; ``backend`` and ``set_index`` where; ``recompile``,
    ``graph_break`` or ``mismatch`` hold the typed details of that kind.
    """

    def __init__(
        self,
        kind: Failure,
        message: str,
        *,
        backend: str | None = None,
        set_index: int | None = None,
        recompile: Recompile | None = None,
        graph_break: GraphBreak | None = None,
        mismatch: Mismatch | None = None,
    ) -> None:
        self.kind = kind
        self.backend = backend
        self.set_index = set_index
        self.recompile = recompile
        self.graph_break = graph_break
        self.mismatch = mismatch
        where = f"backend {backend!r}: " if backend is not None else ""
        super().__init__(f"[{kind.value}] {where}{message}")


@dataclasses.dataclass(frozen=True)
class BackendReport:
    """One backend's run over every set: graphs compiled for the first set, the graph
    breaks, the recompiles (one per set that compiled anything new), the largest absolute
    difference from eager over every compared value."""

    backend: str
    graphs: int
    graph_breaks: tuple[GraphBreak, ...]
    recompiles: tuple[Recompile, ...]
    max_abs_diff: float

    def __str__(self) -> str:
        return (
            f"{self.backend}: {self.graphs} graph(s), {len(self.graph_breaks)} break(s), "
            f"{len(self.recompiles)} recompile(s), max |compiled - eager| = {self.max_abs_diff:.3g}"
        )


@dataclasses.dataclass(frozen=True)
class ParityReport:
    """What ``check_swap_parity`` checked and measured, per backend."""

    api: str
    sets: int
    backends: tuple[BackendReport, ...]

    def __str__(self) -> str:
        head = f"swap parity ({self.api}, {self.sets} param set(s)): OK"
        return "\n".join([head] + [f"  {b}" for b in self.backends])


def recompile_of(found: list[Recompile], i: int, layouts: list[Layout]) -> Recompile:
    """One recompile per set: Dynamo's reasons (every function that recompiled) and the
    diff of the set's layout against the previous set's."""
    failures: tuple[GuardFailure, ...] = tuple(f for r in found for f in r.failures)
    function, location = (found[0].function, found[0].location) if found else ("step", "")
    diff = diff_layouts(layouts[i - 1], layouts[i])
    return Recompile(function, location, failures, i, diff)


def recompile_error(found: list[Recompile], most: int, sets: int, name: str) -> ParityError:
    last = found[-1]
    lines = [
        f"param set {last.set_index} recompiled the swapped call "
        f"({len(found)} recompile(s) over {sets} sets, max_recompiles={most}).",
        f"  changed from param set {(last.set_index or 1) - 1}: {last.layout_diff}",
    ]
    if last.failures:
        lines.append(f"  Dynamo's reason: {last.failures[0].reason}")
    lines.append(
        "  Every set should have the first one's layout (keys, Parameter vs tensor, dtype, "
        "shape, device, requires_grad), or raise max_recompiles."
    )
    return ParityError(
        Failure.RECOMPILE, "\n".join(lines), backend=name, set_index=last.set_index, recompile=last
    )
