"""The DUT's ``torch.library`` ops (``torch.ops.asic.*``): how they are registered, and each op.

Imports :mod:`asic_backend.sim`, never :mod:`asic_backend.lower`.
"""
