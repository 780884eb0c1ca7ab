"""The lowering: from a Dynamo FX graph to one whose matmul-class ops are ``asic::`` ops.

:mod:`~asic_backend.lower.driver` runs one pass per source of GEMMs (float layers, TorchAO, PT2E,
convolutions, attention, the aten graph), each built on :mod:`~asic_backend.lower.rewrite`.
"""
