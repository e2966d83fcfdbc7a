"""``fcall.testing``: check, in your own CI, that your model's parameter swaps compile.

``check_swap_parity(model, param_sets, inputs)`` compiles a swap-and-call of ``model`` per
backend, swaps every set in, and raises ``ParityError`` (an ``AssertionError``) when a set
recompiles, the graph breaks, compiled differs from eager, or the module is not restored;
the message names the parameter keys. ``record_recompiles()`` and ``explain(fn, sets, ...)``
say why a compiled function that swaps recompiled, in parameter keys. Hypothesis strategies
are in ``fcall.testing.strategies`` (hypothesis is needed only there).

``import fcall`` does not import this package.
"""

from ._breaks import GraphBreak as GraphBreak
from ._compare import Mismatch as Mismatch
from ._layout import Change as Change
from ._layout import LayoutDiff as LayoutDiff
from ._parity import check_swap_parity as check_swap_parity
from ._recompiles import Explanation as Explanation
from ._recompiles import GuardFailure as GuardFailure
from ._recompiles import Recompile as Recompile
from ._recompiles import RecompileLog as RecompileLog
from ._recompiles import explain as explain
from ._recompiles import record_recompiles as record_recompiles
from ._report import BackendReport as BackendReport
from ._report import Failure as Failure
from ._report import ParityError as ParityError
from ._report import ParityReport as ParityReport

__all__ = [
    "BackendReport",
    "Change",
    "Explanation",
    "Failure",
    "GraphBreak",
    "GuardFailure",
    "LayoutDiff",
    "Mismatch",
    "ParityError",
    "ParityReport",
    "Recompile",
    "RecompileLog",
    "check_swap_parity",
    "explain",
    "record_recompiles",
]
