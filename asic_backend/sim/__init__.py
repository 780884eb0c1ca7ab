"""The simulated device: its description, numerics, costs, MAC counts, devices and counters.

Pure device model: imports torch (for tensors) but not ``torch.fx``, and nothing from
:mod:`asic_backend.ops` or :mod:`asic_backend.lower`.
"""
