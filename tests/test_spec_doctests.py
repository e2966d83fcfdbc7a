"""The examples of the specs fcall follows, run as doctests against fcall.

Copied from shared/spec/to_module.txt (tensordict's ``TensorDictBase.to_module``)
and shared/spec/tensordictparams.txt (``tensordict.TensorDictParams``), with the
tensordict calls rewritten to fcall's:

- ``zeros.to_module(module)`` -> ``fcall.to_module(zeros, module)``
- ``TensorDict.from_module`` -> ``fcall.from_module``
- ``tensordict.nn.TensorDictParams`` -> ``fcall.TensorDictParams`` (or ``fcall._params``
  while the public name is not exported yet)

Everything else, outputs included, is the spec's text.
"""

from __future__ import annotations

import doctest

import pytest
import tensordict.nn

TO_MODULE = """
>>> import torch
>>> from torch import nn
>>> import fcall
>>> module = nn.Linear(3, 4)
>>> params = fcall.from_module(module)
>>> zeros = params.data.clone().zero_()
>>> old_params = fcall.to_module(zeros, module)
>>> bool((module.weight == 0).all())
True
>>> _ = fcall.to_module(old_params, module)  # restores the original values
>>> bool((module.weight != 0).any())
True

Use the tensordict as a context manager to make a functional call. When the block
exits, the original parameters are written back:

>>> with fcall.to_module(zeros, module):
...     y = module(torch.ones(2, 3))  # runs with zeroed parameters
>>> bool((y == 0).all())
True
>>> bool((module.weight != 0).any())
True

The original parameters are written back if the block raises an exception too:

>>> try:
...     with fcall.to_module(zeros, module):
...         raise ValueError("stop")
... except ValueError:
...     pass
>>> bool((module.weight != 0).any())
True
"""

TENSORDICT_PARAMS = """
>>> import torch
>>> from torch import nn
>>> import fcall
>>> try:
...     from fcall import TensorDictParams
... except ImportError:  # not exported yet
...     from fcall._params.params import TensorDictParams
>>> module = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4))
>>> params = fcall.from_module(module)
>>> _ = params.lock_()
>>> p = TensorDictParams(params)
>>> print(p)
TensorDictParams(params=TensorDict(batch_size=[], fields={
    0: {bias: f32[4], weight: f32[4,3]},
    1: {bias: f32[4], weight: f32[4,4]}}))
>>> class CustomModule(nn.Module):
...     def __init__(self, params):
...         super().__init__()
...         self.params = params
>>> m = CustomModule(p)
>>> [name for name, _ in m.named_parameters()]
['params.0.weight', 'params.0.bias', 'params.1.weight', 'params.1.bias']
>>> # The wrapper supports assignment, and values are converted to Parameters
>>> m.params['other'] = torch.randn(3)
>>> isinstance(m.params['other'], nn.Parameter)
True
>>> # A bfloat16 entry becomes a buffer
>>> m.params['half'] = torch.zeros(3, dtype=torch.bfloat16)
>>> [name for name, _ in m.named_buffers()]
['params.half']
"""


class _InstalledTensorDictRepr(doctest.OutputChecker):
    """The spec prints tensordict 0.15's compact repr; tensordict 0.14 prints its long
    form. A printed TensorDictParams is also right when it is exactly what tensordict's
    own ``TensorDictParams`` of the same ``params`` prints on the installed tensordict."""

    def __init__(self, globs: dict) -> None:
        self.globs = globs

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        if super().check_output(want, got, optionflags):
            return True
        if not want.startswith("TensorDictParams(") or "params" not in self.globs:
            return False
        peer = tensordict.nn.TensorDictParams(self.globs["params"])
        return got == f"{peer}\n"


@pytest.mark.parametrize(
    "name, text",
    [("to_module", TO_MODULE), ("TensorDictParams", TENSORDICT_PARAMS)],
    ids=["to_module", "TensorDictParams"],
)
def test_spec_examples(name, text):
    test = doctest.DocTestParser().get_doctest(text, {}, name, None, 0)
    assert len(test.examples) > 10
    flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    runner = doctest.DocTestRunner(checker=_InstalledTensorDictRepr(test.globs), optionflags=flags)
    runner.run(test, out=print)
    assert runner.failures == 0
    assert runner.tries == len(test.examples)
