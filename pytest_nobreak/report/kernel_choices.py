"""The host GEMM kernels the ASIC backend chose by timing, shape by shape, for the run's summary
and its JSON and HTML reports.

At one to four rows by a kept weight, where ``auto`` takes ``int_mm``, the backend times
``int16`` against it on each shape's first weight and keeps ``int16`` where it is faster by a
tenth (:mod:`asic_backend.sim.kernel_choice`). The header can only state that rule, before any
test runs; the summary and the reports say what each process kept. Each xdist worker ships its
own (a choice is per process), and the controller shows them together, naming both kernels
where workers differed; the shards of a run merge the same way. Nothing here imports torch: a
process that never loaded the backend has no choices.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_MODULE = "asic_backend.sim.kernel_choice"

#: A choice as a process ships it: rows, K, N, threads, path, kernel.
Choice = tuple[int, int, int, int, str, str]


def local_choices() -> list[Choice]:
    """This process's choices, or none where the backend's trials never loaded."""
    module = sys.modules.get(_MODULE)
    if module is None:
        return []
    return [(*key, kernel) for key, kernel in module.choices().items()]


def united(choices: Iterable[Sequence[Any]]) -> dict[str, str]:
    """The kernels kept, by shape (``rows×K×N``, threads, path), sorted, as the JSON report's
    ``host_gemm_choices`` holds them; both kernels where processes differed:

    >>> united([(1, 64, 48, 2, "linear", "int16"), (1, 64, 48, 2, "linear", "int_mm")])
    {'1×64×48 2T linear': 'int16 or int_mm (by worker)'}
    """
    kept: dict[tuple[int, int, int, int, str], set[str]] = {}
    for rows, k, n, threads, path, kernel in choices:
        kept.setdefault((int(rows), int(k), int(n), int(threads), str(path)), set()).add(kernel)
    return {
        f"{rows}×{k}×{n} {threads}T {path}": _joined(kernels, "worker")
        for (rows, k, n, threads, path), kernels in sorted(kept.items())
    }


def across_shards(sections: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The ``host_gemm_choices`` of a run's shards, each a process of its own (or several), as
    one: a shape's kernel where the shards that timed it agree, else every kernel any of them
    kept, so that no shard's choice is hidden by another's:

    >>> across_shards([{"1×8×8 1T gemm": "int16"}, {"1×8×8 1T gemm": "int_mm"}])
    {'1×8×8 1T gemm': 'int16 or int_mm (by shard)'}
    """
    kept: dict[str, set[str]] = {}
    for section in sections:
        for shape, value in section.items():
            kept.setdefault(shape, set()).add(value)
    return {
        shape: next(iter(values))
        if len(values) == 1
        else _joined((kernel for value in values for kernel in _kernels(value)), "shard")
        for shape, values in sorted(kept.items())
    }


def _joined(kernels: Iterable[str], by: str) -> str:
    """One shape's value: its kernel, or every kernel kept and who differed
    (``int16 or int_mm (by worker)``); :func:`_kernels` reads it back."""
    names = sorted(set(kernels))
    return names[0] if len(names) == 1 else " or ".join(names) + f" (by {by})"


def _kernels(value: str) -> list[str]:
    """The kernels a value of :func:`_joined` names."""
    return value.split(" (by ")[0].split(" or ")


def shown(choices: Mapping[str, str]) -> str:
    """:func:`united`'s mapping in one line: ``1×2048×6144 1T linear int16; ...``."""
    return "; ".join(f"{shape} {kernel}" for shape, kernel in choices.items())


def summary_line(choices: Mapping[str, str]) -> str | None:
    """The terminal summary's line of :func:`united`'s mapping, or None where no trial decided."""
    if not choices:
        return None
    return f"nobreak: host GEMM by timing (rows×K×N, threads, path): {shown(choices)}"
