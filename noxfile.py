"""The version matrix: one session per (torch, tensordict) stack, each in its own venv.

Every session installs fcall with its stack's exact pins (``constraints/``) and runs the
test command of README.md (``python -m pytest -q``). List them with ``nox -l``; run one with
``nox -s "tests(torch2.14.1-td0.15.3)"``. The default stack is the one README.md and
``constraints-ci.txt`` install. A stack whose torch is not on the CI machines' disk comes from
the package index (a CUDA build, run on CPU); for 2.15.0, beyond the local cap,
``PIP_CONFIG_FILE=/dev/null`` lifts it. A stack on another Python than 3.11 takes pyenv's.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NamedTuple

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False


class Stack(NamedTuple):
    """One stack of the matrix: its exact pins, and what else its session installs."""

    constraints: str
    python: str = "3.11"
    extras: tuple[str, ...] = ()
    from_index: bool = False  # torch beyond the local cap: PIP_CONFIG_FILE=/dev/null


STACKS = {
    "default": Stack("constraints-ci.txt"),
    "torch2.14.1-td0.15.3": Stack("constraints/torch2.14.1-td0.15.3.txt"),
    "torch2.15.0-td0.15.3": Stack("constraints/torch2.15.0-td0.15.3.txt", from_index=True),
    "torch2.13.0-td0.14.3-torchrl0.14.1": Stack(
        "constraints/torch2.13.0-td0.14.3-torchrl0.14.1.txt", extras=("torchrl",)
    ),
    "torch2.11.0-td0.15.3-py3.12": Stack(
        "constraints/torch2.11.0-td0.15.3-py3.12.txt", python="3.12"
    ),
    "torch2.12.1-td0.15.3-py3.12": Stack(
        "constraints/torch2.12.1-td0.15.3-py3.12.txt", python="3.12"
    ),
    "torch2.13.0-td0.15.3-py3.13": Stack(
        "constraints/torch2.13.0-td0.15.3-py3.13.txt", python="3.13"
    ),
}
# The stacks that also install the zoo extra (tests/test_zoo.py: transformers and timm, whose
# torchvision loads beside torch 2.14.1, not beside the default stack's CPU torch 2.13.0).
ZOO_STACKS = ("torch2.14.1-td0.15.3",)
# The stacks whose suite runs over every core (pytest-xdist; see tests() for why not all).
PARALLEL_STACKS = (
    "torch2.14.1-td0.15.3",
    "torch2.15.0-td0.15.3",
    "torch2.11.0-td0.15.3-py3.12",
    "torch2.12.1-td0.15.3-py3.12",
    "torch2.13.0-td0.15.3-py3.13",
)
# The stacks .ci/run adds after the default one (`nox -t ci`); the others run by hand
# (docs/versions.md says why).
CI_STACKS = (
    "torch2.11.0-td0.15.3-py3.12",
    "torch2.14.1-td0.15.3",
    "torch2.13.0-td0.14.3-torchrl0.14.1",
)


def interpreter(version: str) -> str:
    """The Python of ``version``: pyenv's (these machines keep 3.12 and 3.13 there, behind
    shims that nox's discovery does not run), else whatever nox finds."""
    found = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    return str(found[-1]) if found else version


@nox.session
@nox.parametrize(
    ("python", "stack"),
    [
        nox.param(interpreter(s.python), name, id=name, tags=["ci"] if name in CI_STACKS else [])
        for name, s in STACKS.items()
    ],
)
def tests(session: nox.Session, stack: str) -> None:
    """The whole suite on one stack: README.md's test command in a venv of its own."""
    constraints, _, extras, from_index = STACKS[stack]
    env = {"PIP_CONFIG_FILE": "/dev/null"} if from_index else {}
    package = ".[test,zoo]" if stack in ZOO_STACKS else ".[test]"
    # pytest-xdist spreads a stack's tests over the machine's cores (`-n auto`), where the
    # tests do not depend on the order they run in. Not on tensordict 0.14: it memoizes per
    # class whether a class is a tensorclass (utils._TENSORCLASS_MEMO) and Dynamo guards the
    # memo's size, so two compile tests recompile when a worker has not run the tests that
    # filled it before them.
    parallel = ("-n", "auto") if stack in PARALLEL_STACKS else ()
    try:
        session.install("-q", "-c", constraints, "-e", package, *extras, "pytest-xdist", env=env)
        session.run(
            "python",
            "-c",
            "import torch, tensordict; print(torch.__version__, tensordict.__version__)",
        )
        session.run("python", "-m", "pytest", "-q", *parallel, *session.posargs)
        if "torchrl" in extras and not session.posargs:
            # TorchRL's own objectives tests on stock tensordict, beside the routed run above
            suite = "conformance/torchrl_suite"
            session.run("python", "-m", "pytest", "-q", suite, "--against", "peer")
    finally:
        if os.environ.get("CI") == "true":
            # A stack's venv is ~1-6 GB (a CUDA build of torch): CI keeps one at a time, so
            # its peak disk is the default .venv and the largest stack, not their sum.
            shutil.rmtree(session.virtualenv.location, ignore_errors=True)
