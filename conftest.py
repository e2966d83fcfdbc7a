"""The repository root's conftest.py: it makes the package ``tests`` importable.

pytest (import mode ``prepend``, its default) puts the folder of a conftest.py that is in no
package on ``sys.path`` before importing it, and loads this one in every run under the root,
whichever folder is given and from whichever working directory. So test modules in tests/,
compile_tests/ and elsewhere import the shared helpers as ``tests.support``,
``tests.torchrl_losses``, ``tests.torchrl_routed``, ``tests._dist_workers`` and
``tests._checkpoint_workers``, with no ``pythonpath`` setting; spawned worker processes
inherit that ``sys.path``.
"""
