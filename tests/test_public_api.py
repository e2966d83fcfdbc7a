"""The public surface of fcall: ``__all__``, importability, and the typing marker."""

from __future__ import annotations

import importlib
import importlib.resources
import inspect

import fcall

CORE = {"__version__", "from_module", "functional_call", "swap", "to_module"}


def public_names() -> set[str]:
    return {
        name
        for name, value in vars(fcall).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    } | {"__version__"}


def test_all_is_exactly_the_public_names():
    assert len(fcall.__all__) == len(set(fcall.__all__))
    assert set(fcall.__all__) == public_names()
    assert set(fcall.__all__) >= CORE


def test_every_public_name_is_importable():
    for name in fcall.__all__:
        module = importlib.import_module("fcall")
        assert getattr(module, name) is getattr(fcall, name)
        exec(f"from fcall import {name}", {})


def test_star_import_gives_all():
    namespace: dict = {}
    exec("from fcall import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(fcall.__all__)


def test_core_callables():
    assert callable(fcall.to_module) and callable(fcall.functional_call)
    assert callable(fcall.from_module) and isinstance(fcall.swap, type)
    assert isinstance(fcall.__version__, str)


def test_py_typed_is_shipped():
    assert importlib.resources.files("fcall").joinpath("py.typed").is_file()
