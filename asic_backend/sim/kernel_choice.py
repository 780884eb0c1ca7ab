"""Trials that time two exact host kernels on one weight of a shape and keep the faster.

At one to four rows by a kept weight a GEMM streams the weight from memory, and which kernel
streams it faster, ``int_mm`` (oneDNN) or ``int16`` (the project's AVX2 code), depends on the
shape, the threads and the caches, not on the CPU's flags: in a decode step of 16 DUT linears
on an Intel Xeon with AMX, ``int16`` took 0.66x ``int_mm``'s time at one row and 1.58x at 8,
one thread (``benchmarks/test_int8_path.py::test_decode_step``). So
:func:`asic_backend.sim.host_gemm.static_choice` asks here, per :data:`Key`:

- a decided key gives its kernel (:func:`chosen`);
- else the first weight to call takes a trial (:func:`trial_call`): the two kernels in turn, an
  untimed call of each (its operand just made, in the CPU's caches), then :data:`ROUNDS` timed
  calls each, all giving the same bits; other weights of the key take the caller's default
  meanwhile, and a weight idle for :data:`IDLE_CALLS` of theirs hands the trial to the next;
- ``int16`` is kept where the median of the ratios of its i-th timed call to ``int_mm``'s i-th
  is under :data:`MARGIN`, and where ``int_mm`` stays, the trial's ``int16`` operand of its
  weight is released (unless another row count of the same weight shape chose ``int16``).

>>> kernel, timing = trial_call(key, weight, "int_mm", release)
>>> timing.start(); run(kernel); timing.stop()     # the call timed, into its kernel's list
"""

from __future__ import annotations

import statistics
import threading
import time
import weakref
from collections.abc import Callable

import torch

__all__ = [
    "IDLE_CALLS",
    "KERNELS",
    "MARGIN",
    "ROUNDS",
    "Key",
    "Timing",
    "choices",
    "chosen",
    "forget",
    "trial_call",
]

#: The kernels a trial times, the default first.
KERNELS = ("int_mm", "int16")
#: Timed calls of each kernel in a trial, after an untimed first one each.
ROUNDS = 10
#: ``int16`` is kept where the median of its calls' ratios to ``int_mm``'s is under this: where
#: the two are close, no second copy of a weight. A call of two threads on two busy vCPUs
#: varies by a third from one to the next, and its slow calls are not all the same kernel's, so
#: pairs of neighbouring calls and their median, not each kernel's best call.
MARGIN = 0.9
#: Calls of a key by other weights while its trial's weight is not called, after which the
#: next weight to call takes the trial: a first weight called a few times, then no more (a
#: warm-up, a layer run once), does not hold its shape's choice back.
IDLE_CALLS = 4 * 2 * (1 + ROUNDS)

#: What a choice is kept for: rows, K, N, threads, and the path timed (``linear``: the whole
#: native linear; ``gemm``: the GEMM alone).
Key = tuple[int, int, int, int, str]
#: Releases the ``int16`` operand a trial made of its weight, where ``int_mm`` stays.
Release = Callable[[torch.Tensor], None]


class _Trial:
    """A trial's weight, its calls handed out, and each kernel's calls' times."""

    __slots__ = ("handed", "idle", "release", "times", "weight")

    def __init__(self, weight: torch.Tensor, release: Release) -> None:
        self.weight = weakref.ref(weight)
        self.release = release
        self.handed = 0
        self.idle = 0
        self.times: dict[str, list[float]] = {name: [] for name in KERNELS}


_lock = threading.Lock()
_choices: dict[Key, str] = {}
_trials: dict[Key, _Trial] = {}
#: The clock a trial reads (a test's fake one instead).
_clock = time.perf_counter


class Timing:
    """One call of a trial, of kernel :attr:`kernel` (:func:`trial_call`)."""

    __slots__ = ("_key", "_start", "_trial", "kernel")

    def __init__(self, kernel: str, key: Key, trial: _Trial) -> None:
        self.kernel, self._key, self._trial, self._start = kernel, key, trial, 0.0

    def start(self) -> None:
        """The call starts: its kernel's operand is at hand."""
        self._start = _clock()

    def stop(self) -> None:
        """The call gave its result: its time goes to its kernel's list, and the trial's last
        call decides it. A call that declined (the caller's general path ran) is not stopped."""
        elapsed = _clock() - self._start
        trial, released = self._trial, None
        with _lock:
            if _trials.get(self._key) is not trial:
                return  # decided, handed to another weight, or forgotten meanwhile
            trial.times[self.kernel].append(elapsed)
            if all(len(times) > ROUNDS for times in trial.times.values()):
                winner = _decide(trial)
                _choices[self._key] = winner
                del _trials[self._key]
                if winner != "int16":
                    released = _releasable(self._key, trial)
        if released is not None:
            trial.release(released)


def _decide(trial: _Trial) -> str:
    int_mm, int16 = (trial.times[name][1 : 1 + ROUNDS] for name in KERNELS)  # first left out
    ratio = statistics.median(b / a for a, b in zip(int_mm, int16, strict=True))
    return "int16" if ratio < MARGIN else "int_mm"


def _releasable(key: Key, trial: _Trial) -> torch.Tensor | None:
    """The trial's weight, where no other row count of its shape chose ``int16`` (whose calls
    read the same operand); called under the lock."""
    weight = trial.weight()
    _, k, n, threads, _ = key
    if weight is None or any(
        kernel == "int16" and (other[1], other[2], other[3]) == (k, n, threads)
        for other, kernel in _choices.items()
    ):
        return None
    return weight


def chosen(key: Key) -> str | None:
    """The kernel a finished trial kept for ``key``, or None."""
    return _choices.get(key)


def trial_call(
    key: Key, weight: torch.Tensor, default: str, release: Release
) -> tuple[str, Timing | None]:
    """The kernel this call of ``weight`` runs on while ``key`` is undecided, with the
    :class:`Timing` to start and stop around it where it is one of the trial's; ``default``
    (and None) for another weight than the trial's. ``release(weight)`` frees what the trial
    made for ``int16`` where ``int_mm`` stays, or where the trial passes to another weight."""
    handed_over = None
    with _lock:
        trial = _trials.get(key)
        owner = None if trial is None else trial.weight()
        if trial is not None and owner is not None and owner is not weight:
            trial.idle += 1
            if trial.idle <= IDLE_CALLS:
                return default, None
            handed_over = _releasable(key, trial)
        if trial is None or owner is not weight:  # new, its weight gone, or handed over
            trial = _trials[key] = _Trial(weight, release)
        trial.idle = 0
        kernel = KERNELS[trial.handed % 2]
        trial.handed += 1
    if handed_over is not None:
        release(handed_over)
    return kernel, Timing(kernel, key, trial)


def choices() -> dict[Key, str]:
    """The kernel kept for each key decided so far."""
    return dict(_choices)


def forget() -> None:
    """Forget every trial and choice (a test, a benchmark)."""
    with _lock:
        _choices.clear()
        _trials.clear()
