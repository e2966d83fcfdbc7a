"""TorchRL's own objectives tests (DQN, SAC, DDPG, TD3 losses) run against fcall or tensordict.

Vendored from pytorch/rl (see the header of each vendored file): ``test_dqn.py``,
``test_sac.py``, ``test_ddpg.py`` and their helper ``_objectives_common.py``. In TorchRL 0.14
the old ``test/test_cost.py`` is split into ``test/objectives/test_<loss>.py``; the other
helpers they import (``mocking_classes``, ``call_value_nets``, ...) ship inside the installed
wheel as ``torchrl.testing``, so nothing else is vendored.

Routing (``--against``, defined in ``conformance/conftest.py``):

* ``peer``: stock tensordict, nothing patched.
* ``fcall`` (default): every test runs inside ``fcall.behind_tensordict()``. All losses and
  networks of these tests are built inside the test functions (the only fixture above function
  scope is ``LossModuleTestBase._composite_log_prob``, which builds nothing), so the
  ``TensorDictParams`` that ``convert_to_functional`` makes are fcall's and every
  ``to_module``/``from_module`` the losses call goes through fcall. ``test_route_check.py``
  asserts it, and the terminal summary reports how many routed calls fcall served.

Selection: only the classes ``TestDQN``, ``TestSAC``, ``TestDDPG`` and ``TestTD3`` (TorchRL's
names; ``TestTD3BC``, ``TestDiscreteSAC``, ``TestREDQ``, ``TestCrossQ``, ``TestQMixer`` in the same
files are deselected) plus ``test_route_check.py``. All their parametrizations run by default
(about 1 min under peer and 1.5-3 min under fcall on 2 cores). ``--torchrl-every k`` keeps every
k-th parametrization of each test function (collection order, from the first; unparametrized
tests always kept) for a quicker pass. Dropped tests are reported as deselected.

Environment skip: the ``*_prioritized_weights`` tests need TorchRL's C++ extension, whose
segment trees do not load against this torch (ABI mismatch of the wheel); they are skipped,
with that reason, only when the extension is missing.
"""

from __future__ import annotations

import importlib.util
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_HAS_TORCHRL = importlib.util.find_spec("torchrl") is not None

# Without torchrl none of these files can be imported (the default stack has no torchrl).
collect_ignore: list[str] = []
if not _HAS_TORCHRL:
    collect_ignore = [
        "_objectives_common.py",
        "test_ddpg.py",
        "test_dqn.py",
        "test_route_check.py",
        "test_sac.py",
    ]

_HERE = Path(__file__).parent
SELECTED_CLASSES = ("TestDQN", "TestSAC", "TestDDPG", "TestTD3")
_OWN_FILES = ("test_route_check.py",)

# Warning filters, on top of pyproject's ``filterwarnings = error``. TorchRL's own pytest.ini
# does not turn warnings into errors; these are the warnings its tests raise on purpose or
# that TorchRL's test/conftest.py (``set_warnings``) already silences.
_WARNING_FILTERS = (
    # TorchRL's test/conftest.py ``set_warnings``: lazy modules (SAC/TD3 use LazyLinear).
    "ignore:Lazy modules are a new feature under heavy development:UserWarning",
    # TorchRL's test/objectives/conftest.py ``pytestmark`` (which pytest does not apply from a
    # conftest, so upstream never errored on it either): MLP without num_cells.
    "ignore:The current behavior of MLP when not providing `num_cells`",
    # pytest 9 deprecates LossModuleTestBase._composite_log_prob (a class-scoped fixture that
    # is an instance method); TorchRL's CI runs an older pytest.
    "ignore:Class-scoped fixtures defined as instance methods:pytest.PytestRemovedIn10Warning",
)


def pytest_report_header(config: pytest.Config) -> str:
    if not _HAS_TORCHRL:
        return "conformance/torchrl_suite: skipped, torchrl is not installed"
    return f"conformance/torchrl_suite: --against {config.getoption('--against')}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("conformance").addoption(
        "--torchrl-every",
        type=int,
        default=1,
        help="conformance/torchrl_suite: keep every k-th parametrization of each test "
        "(default 1: all)",
    )


def pytest_configure(config: pytest.Config) -> None:
    for spec in _WARNING_FILTERS:
        config.addinivalue_line("filterwarnings", spec)


def _selected(item: pytest.Item, every: int, seen: Counter[tuple[str, str]]) -> bool:
    if item.path.name in _OWN_FILES:
        return True
    cls = getattr(item, "cls", None)
    if cls is None or cls.__name__ not in SELECTED_CLASSES:
        return False
    key = (cls.__name__, getattr(item, "originalname", item.name))
    index = seen[key]
    seen[key] += 1
    return index % every == 0


def _segment_trees_missing() -> str | None:
    """Why TorchRL's prioritized sampler cannot run here, or None when it can."""
    from torchrl.data.replay_buffers.samplers import prioritized

    if getattr(prioritized, "SumSegmentTreeFp32", None) is not None:
        return None
    return (
        "torchrl's C++ extension (_torchrl) did not load against this torch (its segment "
        "trees are missing), so TensorDictPrioritizedReplayBuffer cannot run"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The option exists only when this conftest is an initial one
    # (pytest conformance/torchrl_suite).
    every = max(1, config.getoption("--torchrl-every", default=1))
    seen: Counter[tuple[str, str]] = Counter()
    keep, drop = [], []
    for item in items:
        if not item.path.is_relative_to(_HERE):
            keep.append(item)
        elif _selected(item, every, seen):
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    # The *_prioritized_weights tests are the only ones using TensorDictPrioritizedReplayBuffer.
    reason = _segment_trees_missing() if _HAS_TORCHRL else None
    if reason:
        for item in items:
            if item.path.is_relative_to(_HERE) and "prioritized_weights" in item.name:
                item.add_marker(pytest.mark.skip(reason=reason))


# From TorchRL's test/conftest.py (``prevent_leaking_rng``): a test's seeding must not leak.
@pytest.fixture(autouse=True)
def prevent_leaking_rng() -> Iterator[None]:
    import numpy as np
    import torch

    torch_state = torch.get_rng_state()
    builtin_state = random.getstate()
    numpy_state = np.random.get_state()
    yield
    torch.set_rng_state(torch_state)
    random.setstate(builtin_state)
    np.random.set_state(numpy_state)


_ROUTED_CALLS: Counter[str] = Counter()


def _counting(name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _ROUTED_CALLS[name] += 1
        return fn(*args, **kwargs)

    return wrapper


@pytest.fixture(autouse=True)
def _against(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test behind fcall (``--against fcall``) or on stock tensordict (``peer``)."""
    against = request.config.getoption("--against")
    if against == "peer":
        yield against
        return
    import fcall
    import fcall._fronts.behind_tensordict as route_module

    # Count the calls the route hands to fcall (the route looks these names up at call time).
    mp = pytest.MonkeyPatch()
    for name in ("to_module", "from_module"):
        if callable(getattr(route_module, name, None)):
            mp.setattr(route_module, name, _counting(name, getattr(route_module, name)))
    _ROUTED_CALLS["tests"] += 1
    try:
        with fcall.behind_tensordict():
            yield against
    finally:
        mp.undo()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _ROUTED_CALLS:
        terminalreporter.write_line(
            "conformance/torchrl_suite, fcall route: "
            f"{_ROUTED_CALLS['tests']} tests, {_ROUTED_CALLS['to_module']} to_module and "
            f"{_ROUTED_CALLS['from_module']} from_module calls served by fcall"
        )
