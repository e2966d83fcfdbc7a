"""The public surface of fcall: ``__all__``, importability, and the typing marker."""

from __future__ import annotations

import ast
import graphlib
import importlib
import importlib.resources
import inspect
import pathlib

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


def _internal_imports(path: pathlib.Path, package: str) -> set[str]:
    """The fcall modules that ``path`` imports, at any depth of its code (a lazy import in
    a function is an edge too), except under ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.module else base
            if node.module:
                found.add(target)
            else:
                found.update(f"{target}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def test_no_import_cycle_in_fcall():
    root = pathlib.Path(fcall.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = _internal_imports(path, package)
    assert len(graph) > 20  # the walk saw the package
    for name in graph:  # only edges between modules (`from . import _x` names a module)
        graph[name] = {target for target in graph[name] if target in graph} - {name}
    order = list(graphlib.TopologicalSorter(graph).static_order())  # CycleError if a cycle
    assert set(order) == set(graph)


def test_the_errors_fcall_raises_on_purpose_are_public():
    import torch

    assert issubclass(fcall.UnknownKey, KeyError)
    assert issubclass(fcall.CheckpointMismatch, KeyError)
    assert issubclass(fcall.CheckpointMismatch, ValueError)
    try:
        with fcall.swap({"wieght": torch.zeros(1, 1)}, torch.nn.Linear(1, 1)):
            pass
    except fcall.UnknownKey as error:
        assert "'wieght' names no parameter or buffer of Linear" in str(error)
    else:
        raise AssertionError("no UnknownKey")
