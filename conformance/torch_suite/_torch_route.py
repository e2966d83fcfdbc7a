"""Late-bound stand-ins for torch's functional-call entry points, for the vendored tests.

torch's tests capture the function under test when their module is imported, e.g.
``subtest(torch.func.functional_call, "torch_func")`` inside a ``@parametrize`` list: the
routing fixture of conftest.py runs later and cannot reach that captured object. The
vendored files pass these functions instead; each one reads the torch attribute when it is
called, so it calls torch's own function under ``--against peer`` and whatever conftest.py's
fixture put there under ``--against fcall``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.utils.stateless


def torch_func(*args: Any, **kwargs: Any) -> Any:
    """``torch.func.functional_call`` as it is bound at call time."""
    return torch.func.functional_call(*args, **kwargs)


def stateless(*args: Any, **kwargs: Any) -> Any:
    """``torch.nn.utils.stateless.functional_call`` as it is bound at call time."""
    return torch.nn.utils.stateless.functional_call(*args, **kwargs)


def stateless_private(*args: Any, **kwargs: Any) -> Any:
    """``torch.nn.utils.stateless._functional_call`` as it is bound at call time."""
    return torch.nn.utils.stateless._functional_call(*args, **kwargs)
