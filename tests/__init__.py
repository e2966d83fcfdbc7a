"""fcall's tests, a package so that test modules import its shared helpers by package name.

``from tests.support import Net, assert_same_state`` works from tests/ and compile_tests/
alike (the helpers are classes and functions used at import time too, in parametrize lists
and module-level models, so not fixtures), and the spawned ranks of tests/test_distributed.py
and tests/test_checkpoint.py unpickle their jobs as ``tests._dist_workers._entry`` and
``tests._checkpoint_workers.checkpoint_job``. The repository root, where the package lives,
is on ``sys.path`` through the root ``conftest.py``.
"""
