"""Threads that interleave as often as the interpreter lets them, so that a race in code they
share shows within a test's run, not once in a thousand."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable


def run_interleaved(targets: Iterable[Callable[[], object]]) -> None:
    """Run each of ``targets`` in a thread of its own, all at once, switching threads every
    microsecond (the interpreter's default is every 5 ms); return when all have ended."""
    threads = [threading.Thread(target=target) for target in targets]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
