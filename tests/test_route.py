"""fcall.behind_tensordict(): nothing changes until it is called, everything is put back by
undo() (the very objects), and while it is on tensordict's names run fcall's (issue 25,
point 3)."""

from __future__ import annotations

import inspect
import subprocess
import sys
import types

import pytest
import tensordict
import tensordict.nn
import tensordict.nn.params
import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

import fcall
from tests.support import assert_same_state, state


def _patched_names() -> dict:
    return {
        "TensorDictBase.to_module": inspect.getattr_static(TensorDictBase, "to_module"),
        "TensorDictBase.from_module": inspect.getattr_static(TensorDictBase, "from_module"),
        "TensorDict.from_module": inspect.getattr_static(TensorDict, "from_module"),
        "tensordict.nn.TensorDictParams": tensordict.nn.TensorDictParams,
        "tensordict.nn.params.TensorDictParams": tensordict.nn.params.TensorDictParams,
    }


def test_importing_fcall_patches_nothing_of_tensordict():
    code = (
        "import inspect, tensordict, tensordict.nn\n"
        "from tensordict import TensorDict, TensorDictBase\n"
        "def names():\n"
        "    return (inspect.getattr_static(TensorDictBase, 'to_module'),"
        " inspect.getattr_static(TensorDict, 'from_module'), tensordict.nn.TensorDictParams)\n"
        "before = names()\n"
        "import fcall\n"
        "after = names()\n"
        "assert all(a is b for a, b in zip(before, after)), 'import fcall patched tensordict'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_undo_puts_back_the_very_objects():
    before = _patched_names()
    route = fcall.behind_tensordict()
    try:
        assert route.active
        assert tensordict.nn.TensorDictParams is fcall.TensorDictParams
        assert tensordict.nn.params.TensorDictParams is fcall.TensorDictParams
        assert TensorDictBase.to_module is not before["TensorDictBase.to_module"]
    finally:
        route.undo()
    assert not route.active
    after = _patched_names()
    assert all(after[name] is before[name] for name in before)
    route.undo()  # idempotent
    assert _patched_names() == after


def test_with_block_undoes_on_exception():
    before = _patched_names()
    with pytest.raises(ZeroDivisionError), fcall.behind_tensordict():
        1 / 0  # noqa: B018
    assert all(_patched_names()[name] is before[name] for name in before)


def test_routes_nest():
    before = _patched_names()
    with fcall.behind_tensordict():
        with fcall.behind_tensordict():
            assert tensordict.nn.TensorDictParams is fcall.TensorDictParams
        assert tensordict.nn.TensorDictParams is fcall.TensorDictParams
    assert all(_patched_names()[name] is before[name] for name in before)


def test_a_module_imported_before_gets_fcalls_class_and_back():
    client = types.ModuleType("a_client_of_tensordict")
    client.TensorDictParams = tensordict.nn.TensorDictParams
    sys.modules[client.__name__] = client
    try:
        with fcall.behind_tensordict():
            assert client.TensorDictParams is fcall.TensorDictParams
        assert client.TensorDictParams is tensordict.nn.params.TensorDictParams
        with fcall.behind_tensordict(params_class=False):
            assert client.TensorDictParams is tensordict.nn.params.TensorDictParams
    finally:
        del sys.modules[client.__name__]


def test_to_module_runs_fcalls_and_restores_the_same_objects(monkeypatch):
    calls = []
    real = fcall._fronts.behind_tensordict.to_module

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(fcall._fronts.behind_tensordict, "to_module", spy)
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    before = state(net)
    params = TensorDict.from_module(net).detach().clone().zero_()
    with fcall.behind_tensordict():
        with params.to_module(net, preserve_module_state=False):
            assert (net[0].weight == 0).all()
    assert calls == [{"preserve_module_state": False}]
    assert_same_state(net, before)


@pytest.mark.parametrize("lock", [None, True, False])
@pytest.mark.parametrize("as_module", [False, True])
def test_from_module_is_routed_with_tensordicts_defaults(as_module, lock):
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    kwargs = {} if lock is None else {"lock": lock}
    theirs_method = TensorDict.from_module(net, as_module=as_module, **kwargs)
    theirs_function = tensordict.from_module(net, as_module=as_module, **kwargs)
    with fcall.behind_tensordict():
        ours_method = TensorDict.from_module(net, as_module=as_module, **kwargs)
        ours_function = tensordict.from_module(net, as_module=as_module, **kwargs)
    for ours, theirs in ((ours_method, theirs_method), (ours_function, theirs_function)):
        assert ours.is_locked == theirs.is_locked
        assert isinstance(ours, fcall.TensorDictParams) == as_module
        assert sorted(ours.keys(True, True)) == sorted(theirs.keys(True, True))
        for key in theirs.keys(True, True):
            assert ours[key] is theirs[key] or torch.equal(ours[key], theirs[key])


def test_repr():
    with fcall.behind_tensordict() as route:
        assert repr(route) == "fcall.behind_tensordict(active=True)"
    assert repr(route) == "fcall.behind_tensordict(active=False)"
