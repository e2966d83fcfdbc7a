"""Every guide script under examples/ runs to completion (each asserts what it shows)."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GUIDES = [
    "target_network.py",
    "ensemble_vmap.py",
    "maml.py",
    "checkpoint_sweep.py",
    "dcp_checkpoint_sweep.py",  # spawns 2 gloo ranks on 127.0.0.1 itself
    "compiled_training_loop.py",
    "torchrl_dqn_target.py",  # prints a line and exits 0 without torchrl
    "testing_swaps.py",
]


def test_every_guide_script_is_listed():
    # distributed_*.py scripts need several processes and are run by their own tests.
    found = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("distributed_")}
    assert found == set(GUIDES)


@pytest.mark.parametrize("script", GUIDES)
def test_guide_script_runs(script):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr[-4000:]}"
    assert result.stdout.startswith(script.removesuffix(".py") + ":"), result.stdout
