"""Watching torch.compile: the monitor, its events, the taps into Dynamo, and the failure text.

Nothing here imports pytest; :mod:`~pytest_nobreak.watch.dynamo` imports torch (lazily used).
"""
