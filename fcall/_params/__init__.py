"""``TensorDictParams``: a TensorDict that is an ``nn.Module``, one closed subsystem."""
