"""fcall: swap parameter sets into PyTorch modules, free under ``torch.compile``.

>>> import torch, fcall
>>> from torch import nn
>>> model = nn.Linear(2, 1)
>>> params = fcall.from_module(model).detach().clone().zero_()
>>> with fcall.swap(params, model):
...     model(torch.ones(2))
tensor([0.])
"""

from ._errors import UnknownKey as UnknownKey
from ._fronts.behind_tensordict import behind_tensordict as behind_tensordict
from ._fronts.checkpoint import CheckpointMismatch as CheckpointMismatch
from ._fronts.checkpoint import from_checkpoint as from_checkpoint
from ._fronts.from_module import from_module as from_module
from ._fronts.functional_call import functional_call as functional_call
from ._fronts.swap import swap as swap
from ._fronts.to_module import to_module as to_module
from ._params.params import TensorDictParams as TensorDictParams

__version__ = "0.1.0"

__all__ = [
    "CheckpointMismatch",
    "TensorDictParams",
    "UnknownKey",
    "__version__",
    "behind_tensordict",
    "from_checkpoint",
    "from_module",
    "functional_call",
    "swap",
    "to_module",
]
