"""tensordict's own tests of to_module, from_module and TensorDictParams, against fcall.

Vendored from pytorch/tensordict (the header of each file names its path and commit):
``test_td_nn.py`` (test/nn/test_nn.py, the to_module / from_module / TensorDictParams tests
only), ``test_td_methods.py``, ``test_td_generic.py``, ``test_td_mp.py``, ``test_td_errors.py``
(test/tensordict/), ``test_td_compile.py`` (test/compile/) and their helper
``_utils_internal.py``, with tensordict's LICENSE. The files are renamed ``test_td_*`` because
pytest's default import mode needs module basenames unique across a session (tests/ has its
own test_errors.py).

Selection (``pytest_collection_modifyitems``; the rest is reported as deselected):

* a test parametrized over tensordict types (``td_name``) runs only for ``td_params``, the
  TensorDictParams case;
* any other test runs when its name, its class name or its source mentions ``to_module``,
  ``from_module`` or ``TensorDictParams``.

Routing (``--against``, defined in ``conformance/conftest.py``):

* ``peer``: stock tensordict, nothing patched.
* ``fcall`` (default): each test runs inside ``fcall.behind_tensordict()``, undone after it;
  the fixture asserts that the route took effect (``tensordict.nn.TensorDictParams`` and the
  test module's own ``TensorDictParams`` name are ``fcall.TensorDictParams``, ``to_module``
  and ``from_module`` are fcall's) and that ``undo()`` put tensordict's objects back.
  ``_OUTSIDE_API`` lists the tests that exercise what fcall does not take on; they are
  marked ``xfail(strict=True)`` under ``--against fcall`` only.

The files target tensordict 0.15: on another version (TorchRL 0.14's stack has 0.14.3)
nothing here is collected, and the report header says why.
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import tensordict
import tensordict.nn
from tensordict import TensorDict, TensorDictBase

_HERE = Path(__file__).parent
_VENDORED_SERIES = "0.15."

# pytest reads collect_ignore_glob from the nearest conftest.py that has one, so this list
# repeats ../conftest.py's "conftest.py" (kept out of --doctest-modules, see there).
collect_ignore_glob = ["conftest.py"]
if not tensordict.__version__.startswith(_VENDORED_SERIES):
    collect_ignore_glob = ["*.py"]

# Warning filters, on top of pyproject's ``filterwarnings = error``. tensordict's pytest.ini
# sets no warning filter; each of its test modules but test/compile/test_compile.py has a
# ``pytestmark`` of its own that turns warnings into errors, with its own exceptions (kept as
# vendored, and marks take precedence over these ini lines). Two cases need relaxing:
# * import time, where no mark applies: the test modules import deprecated names
#   (test_compile.py: ``PYTREE_REGISTERED_TDS``, ``unravel_keys``; _utils_internal.py
#   decorates a method with ``set_lazy_legacy(True)``), and tensordict 0.15 warns on each;
#   tensordict runs them under Python's default filters, which only print them;
# * the tests of test_compile.py, which tensordict also runs under the default filters.
_VENDORED = "(test_td_|_utils_internal)"  # the modules the import-time filters apply to
_IMPORT_WARNINGS = (
    f"ignore:.*is deprecated and will be removed in TensorDict:DeprecationWarning:{_VENDORED}",
    f"ignore:.*TensorDict 0.17, the default will change:FutureWarning:{_VENDORED}",
)
_DEFAULT_WARNINGS_FILES = ("test_td_compile.py",)

# Test ids below: file::Class::test[params], device parameters written "device" (_test_id).
#
# Tests that fail on stock tensordict 0.15.3 because the vendored commit (a1a061e3, just
# after v0.14.0) predates a 0.15 change: skipped under both --against modes, with the change.
_M = "test_td_methods.py::TestTensorDicts::"
_ERROR_MARK = "under its module's filterwarnings('error')"
_COMPILE_ERROR = (
    "0.15 no longer raises when torch._dynamo.config.inline_inbuilt_nn_modules is False "
    "(torch 2.13 always inlines); the test expects 0.14's RuntimeError"
)
_CACHE = "0.15 no longer returns the cached flatten_keys()/unflatten_keys() of a locked td"
_ND_NAMES = "0.15 drops the names of the dims an n-d tensor index covers; the test expects 0.14's"
_NESTED = f"0.15 deprecates LazyStackedTensorDict.get_nestedtensor(), called {_ERROR_MARK}"
_STALE: dict[str, str] = {
    "test_td_compile.py::TestFunctional::test_functional_error[None]": _COMPILE_ERROR,
    "test_td_compile.py::TestFunctional::test_functional_error[reduce-overhead]": _COMPILE_ERROR,
    f"{_M}test_cache[flatten-td_params-device]": _CACHE,
    f"{_M}test_cache[unflatten-td_params-device]": _CACHE,
    f"{_M}test_copy_at_fast_transition[td_params-device]": (
        "0.15 removed copy_at_(fast=None) (TypeError); the test expects 0.14's FutureWarning"
    ),
    f"{_M}test_index_tensor_nd_names[False-td_params-device]": _ND_NAMES,
    f"{_M}test_index_tensor_nd_names[True-td_params-device]": _ND_NAMES,
    f"{_M}test_nestedtensor_stack[heterogeneous-entry-1-td_params-device]": _NESTED,
    f"{_M}test_nestedtensor_stack[heterogeneous-entry--1-td_params-device]": _NESTED,
    f"{_M}test_nestedtensor_stack[key1-1-td_params-device]": _NESTED,
    f"{_M}test_nestedtensor_stack[key1--1-td_params-device]": _NESTED,
    f"{_M}test_non_tensor_data_pickle[td_params-device]": (
        f"0.15 warns (FutureWarning) when load_memmap unpickles a non-tensor field, {_ERROR_MARK}"
    ),
    f"{_M}test_pop[td_params-device]": (
        "0.15 changed the KeyError message of pop(); the test matches 0.14's"
    ),
    f"{_M}test_set_lazy_legacy[td_params-device]": (
        f"0.15 deprecates set_lazy_legacy(True), {_ERROR_MARK}"
    ),
    f"{_M}test_sorted_keys[td_params-device]": (
        "0.15 renamed the cache entry of sorted_keys() ('_sorted_keys'); the test reads 0.14's"
    ),
}

# Tests of what fcall leaves to tensordict: xfail(strict=True) under --against fcall only.
_FIRST_CLASS_DIMS = (
    "values are functorch.dim first-class-dim tensors, which are not torch.Tensor: "
    "fcall.to_module swaps torch.Tensor values only (TypeError)"
)
_LAZY_UNDER_VMAP = (
    "lazy modules (nn.LazyLinear) materialised inside torch.vmap through to_module: fcall "
    "does not initialise uninitialised parameters from a batched call"
)
_LAZY_LEGACY = (
    "tensordict's lazy-legacy views (set_lazy_legacy(True), deprecated in 0.15, removed in "
    "0.17): TensorDictParams.unsqueeze()/permute()/view()... wrap a lazy _UnsqueezedTensorDict "
    "etc.; fcall.TensorDictParams wraps exact TensorDict trees only and refuses it (TypeError "
    "naming .to_tensordict())"
)
_OUTSIDE_API: dict[str, str] = {
    **{
        f"{_M}{name}": _LAZY_LEGACY
        for name in (
            "test_permute_applied_twice[td_params-device]",
            "test_squeeze_legacy[td_params-device]",
            "test_squeeze_with_none_legacy[td_params-device]",
            "test_stack_onto[td_params-device]",
            "test_transpose_legacy[td_params-device]",
            "test_unsqueeze_legacy[0-td_params-device]",
            "test_unsqueeze_legacy[1-td_params-device]",
            "test_view_legacy[td_params-device]",
        )
    },
    "test_td_mp.py::TestFCD::test_modules[False]": _FIRST_CLASS_DIMS,
    "test_td_mp.py::TestFCD::test_modules[True]": _FIRST_CLASS_DIMS,
    "test_td_generic.py::TestGeneric::test_from_modules_lazy[device-False-False]": (
        _LAZY_UNDER_VMAP
    ),
    "test_td_generic.py::TestGeneric::test_from_modules_lazy[device-False-True]": (
        _LAZY_UNDER_VMAP
    ),
}

_NAMES = re.compile(r"to_module|from_module|TensorDictParams|ToModule")
_DEVICE_ID = re.compile(r"\bdevice\d+\b")


def pytest_report_header(config: pytest.Config) -> str:
    if collect_ignore_glob:
        return (
            f"conformance/tensordict_suite: skipped, the vendored tests target tensordict "
            f"{_VENDORED_SERIES}x and tensordict {tensordict.__version__} is installed"
        )
    return (
        f"conformance/tensordict_suite: --against {config.getoption('--against')} "
        f"(tensordict {tensordict.__version__})"
    )


def pytest_configure(config: pytest.Config) -> None:
    # tensordict's test/conftest.py registers it; with --strict-markers an unknown mark fails
    # at import. No selected test carries it.
    config.addinivalue_line("markers", "slow: tensordict's long-running tests")
    for spec in _IMPORT_WARNINGS:
        config.addinivalue_line("filterwarnings", spec)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """The import-time relaxation again, around the import of each vendored module: when
    this conftest is not an initial one (``pytest conformance``), the ini lines above are
    added after collection has taken its filters."""
    path = getattr(collector, "path", None)
    if path is None or _HERE not in Path(path).parents:
        return (yield)
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", ".*is deprecated and will be removed in TensorDict", DeprecationWarning
        )
        warnings.filterwarnings(
            "ignore", ".*TensorDict 0.17, the default will change", FutureWarning
        )
        return (yield)


@cache
def _source(function: Callable[..., object]) -> str:
    try:
        return inspect.getsource(inspect.unwrap(function))
    except (OSError, TypeError):
        return ""


def _selected(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "td_name" in callspec.params:
        return callspec.params["td_name"] == "td_params"
    cls = getattr(item, "cls", None)
    names = f"{item.name} {cls.__name__ if cls is not None else ''}"
    function = getattr(item, "function", None)
    return bool(_NAMES.search(names) or (function is not None and _NAMES.search(_source(function))))


def _test_id(item: pytest.Item) -> str:
    # "file::Class::test[params]" with the device parameters' ids (device13, device0: their
    # index in tensordict's list of types x devices, which grows with each accelerator) as
    # plain "device", so that the lists above hold on any machine.
    return _DEVICE_ID.sub("device", item.nodeid.rsplit("/", 1)[-1])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    against = config.getoption("--against", default="fcall")
    keep, drop = [], []
    for item in items:
        if _HERE not in item.path.parents:
            keep.append(item)
            continue
        if not _selected(item):
            drop.append(item)
            continue
        keep.append(item)
        test_id = _test_id(item)
        if item.path.name in _DEFAULT_WARNINGS_FILES:
            item.add_marker(pytest.mark.filterwarnings("default"))
        if test_id in _STALE:
            item.add_marker(pytest.mark.skip(reason=_STALE[test_id]))
        elif against == "fcall" and test_id in _OUTSIDE_API:
            item.add_marker(pytest.mark.xfail(strict=True, reason=_OUTSIDE_API[test_id]))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _against(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test behind fcall (``--against fcall``) or on stock tensordict (``peer``)."""
    against = request.config.getoption("--against")
    if against == "peer":
        yield against
        return
    import fcall

    def current() -> tuple[object, ...]:
        # to_module and from_module may live on a base class: look them up as Python does.
        return (
            tensordict.nn.TensorDictParams,
            inspect.getattr_static(TensorDictBase, "to_module"),
            inspect.getattr_static(TensorDictBase, "from_module"),
            inspect.getattr_static(TensorDict, "from_module"),
        )

    stock = current()
    route = fcall.behind_tensordict()
    try:
        # The route is on: tensordict's names lead to fcall's.
        routed = current()
        assert routed[0] is fcall.TensorDictParams
        module_params = getattr(request.module, "TensorDictParams", None)
        assert module_params in (None, fcall.TensorDictParams), module_params
        assert all(now is not before for now, before in zip(routed[1:], stock[1:]))
        yield against
    finally:
        route.undo()
    restored = all(now is before for now, before in zip(current(), stock))
    assert restored, "fcall.behind_tensordict().undo() left a patch behind"
