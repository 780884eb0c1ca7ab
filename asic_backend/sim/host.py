"""What the host has that every host-side module uses: this CPU's flags, which tensors the
host's own buffers and native loops may touch (:func:`plain`), those buffers (:func:`scratch`),
reused by each thread from call to call, and choices forced in a block (:class:`Overrides`).

>>> "avx2" in cpu_flags()                    # an x86 Linux host with AVX2
True
>>> scratch((2, 3), torch.float32).shape
torch.Size([2, 3])
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Iterator

import torch

__all__ = [
    "AMX_PACK_SLOT",
    "INT16_PACK_SLOT",
    "SCRATCH_OPERAND_MAX_BYTES",
    "Overrides",
    "amx_activations",
    "cpu_flags",
    "int16_activations",
    "operand",
    "plain",
    "scratch",
]


class Overrides:
    """A choice forced for the whole process while a block runs (a host kernel, the host
    passes), for tests and benchmarks: the latest block still running holds, in every thread.
    Each block ends its own entry, so blocks that overlap in two threads may end in any order.

    >>> kernel = Overrides()
    >>> with kernel.held("float32"):
    ...     kernel.current()
    'float32'
    >>> kernel.current() is None
    True
    """

    def __init__(self) -> None:
        self._entries: list[list[str]] = []
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._entries)

    def current(self) -> str | None:
        """The value of the latest block still running, or None."""
        last = self._entries[-1:]  # one read: another thread may end its block meanwhile
        return last[0][0] if last else None

    @contextlib.contextmanager
    def held(self, value: str) -> Iterator[None]:
        """``value`` in force in the block."""
        entry = [value]  # its own object: the block removes this entry, not the last one
        with self._lock:
            self._entries.append(entry)
        try:
            yield
        finally:
            with self._lock:  # the search and the removal, which no other block's may split
                index = next(i for i, held in enumerate(self._entries) if held is entry)
                del self._entries[index]


@functools.cache
def cpu_flags() -> tuple[str, ...]:
    """This CPU's feature flags as Linux lists them (``/proc/cpuinfo``); empty elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            line = next((line for line in fh if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ()
    return tuple(line.partition(":")[2].split())


def plain(t: torch.Tensor) -> bool:
    """A CPU tensor with storage (a parameter too), outside any tracing: what the host's own
    buffers and loops may touch directly (:func:`scratch` copies, :mod:`host_passes`' native
    loops). Another subclass (fake, functional), a wrapper, or a dispatch mode (a tracer
    records aten ops; a native loop would be unseen) takes the aten kernels."""
    return (
        type(t) in _PLAIN_TYPES
        and t.device.type == "cpu"
        and torch._C._len_torch_dispatch_stack() == 0
        # Wrappers of a plain type: functionalization's (no data of its own: a null pointer),
        # vmap's and grad's (no storage), and a JIT trace (it would record constants).
        and not torch._is_functional_tensor(t)
        and not torch._C._functorch.is_functorch_wrapped_tensor(t)
        and not torch._C._get_tracing_state()
    )


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def scratch(shape: tuple[int, ...], dtype: torch.dtype, slot: int = 0) -> torch.Tensor:
    """A contiguous ``dtype`` tensor of ``shape`` this thread reuses from call to call (one
    buffer per dtype and ``slot``, grown to the largest shape asked), for a caller that is done
    with it before it asks again: a DUT op's operand or accumulator, never its result. Two
    operands alive at once take two slots."""
    # The view of each shape is kept too: two tensor ops a call are two dispatches, each a
    # cache miss or more once a model's other layers have run in between.
    views = _scratch.views
    key = (shape, dtype, slot)
    view = views.get(key)
    if view is not None:
        return view
    numel = math.prod(shape)
    buf = _scratch.bufs.get((dtype, slot))
    if buf is None or buf.numel() < numel:
        # A normal tensor even under inference_mode, so it can be written outside it later.
        with torch.inference_mode(False):
            buf = _scratch.bufs[(dtype, slot)] = torch.empty(numel, dtype=dtype)
        for old in [k for k in views if k[1:] == (dtype, slot)]:  # views of the old buffer
            del views[old]
    if len(views) >= _SCRATCH_VIEWS:
        views.clear()
    with torch.inference_mode(False):
        view = views[key] = buf[:numel].view(shape)
    return view


#: The most shapes of :func:`scratch` views a thread keeps.
_SCRATCH_VIEWS = 64


class _Scratch(threading.local):
    """This thread's buffers, one per dtype, and their views by shape (:func:`scratch`)."""

    def __init__(self) -> None:
        self.bufs: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self.views: dict[tuple[tuple[int, ...], torch.dtype, int], torch.Tensor] = {}


_scratch = _Scratch()


#: The largest operand :func:`operand` puts in a reused buffer: 64 MiB a slot (a decode step's V
#: at 32 heads × 4096 keys × 128 in float32); a larger one would be kept for the thread's life.
SCRATCH_OPERAND_MAX_BYTES = 64 << 20
#: :func:`operand`'s slots of the ``int16`` kernel: its widened activations
#: (:func:`int16_activations`), and an operand packed for one call.
INT16_A16_SLOT, INT16_PACK_SLOT = 2, 3
#: The ``amx`` kernel's: its activations (:func:`amx_activations`), and an operand packed for
#: one call.
AMX_A_SLOT, AMX_PACK_SLOT = 4, 5


def operand(shape: tuple[int, ...], dtype: torch.dtype, slot: int) -> torch.Tensor:
    """A buffer for a kernel's operand, consumed before the kernel's next call: this thread's
    reused one (:func:`scratch`), or a new tensor past :data:`SCRATCH_OPERAND_MAX_BYTES`.

    Slots: 0 and 1, ``host_gemm``'s float operands; 2 and 3, the ``int16`` kernel's widened
    activations and packed operand; 4 and 5, the ``amx`` kernel's."""
    if math.prod(shape) * dtype.itemsize > SCRATCH_OPERAND_MAX_BYTES:
        return torch.empty(shape, dtype=dtype)
    return scratch(shape, dtype, slot)


def int16_activations(rows: int, k: int) -> torch.Tensor:
    """The ``int16`` kernel's widened activations for ``rows`` rows of K ``k``, each row K
    rounded up to even (``int16_gemm.c``'s pairs): this thread's reused buffer, filled by the
    kernel's GEMM or by the fused linear of :mod:`asic_backend.sim.host_passes`."""
    return operand((rows * (k + k % 2),), torch.int16, INT16_A16_SLOT)


def amx_activations(nbytes: int) -> torch.Tensor:
    """The ``amx`` kernel's activations buffer of ``nbytes`` (``asic_amx_a_bytes``: rows padded
    to its tiles): this thread's reused one, filled by the kernel's GEMM or by the fused linear
    of :mod:`asic_backend.sim.host_passes`."""
    return operand((nbytes,), torch.int8, AMX_A_SLOT)
