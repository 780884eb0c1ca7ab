"""Values derived from long-lived tensors (weights), cached while the tensor is unchanged.

The DUT's operators quantize a float weight once, derive requantization parameters once, and
the host GEMM keeps a float copy of an int8 weight once (:mod:`asic_backend.sim.host_gemm`): each
keyed by the tensor itself, remade when it is written in place or swapped, and dropped with it.

>>> cache = new_cache()
>>> w = torch.ones(3)
>>> cache.get(w, stamp(w), lambda: w.sum()) is cache.get(w, stamp(w), lambda: w.sum())
True
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from torch import Tensor

__all__ = ["CACHES", "TensorCache", "clear_caches", "new_cache", "stamp"]

_T = TypeVar("_T")


def stamp(t: Tensor | None) -> tuple[Any, ...] | None:
    """What identifies ``t``'s current contents, or None when that cannot be known."""
    if t is None:
        return ()
    if t.is_inference():
        # No version counter: an in-place write would go unnoticed.
        return None
    return (t.data_ptr(), t._version, t.shape, t.stride(), t.dtype)  # torch.Size: a tuple


class TensorCache:
    """Values derived from a long-lived tensor (a weight), keyed by that tensor itself.

    An entry lives as long as its key tensor (weak keys) and is remade when the stamp changes: an
    in-place write bumps ``_version``, a swap changes ``data_ptr``. Without a stamp (inference
    tensors) the value is recomputed on every call rather than risk serving stale numbers.
    """

    def __init__(self) -> None:
        # By the key's id, each entry holding a weak reference to its key (that it is the same
        # tensor, and that drops the entry with it): a hit is one dict lookup, where a
        # WeakIdKeyDictionary builds a reference object per lookup. A DUT op looks up two or
        # three entries a call, and with a model's other layers in between, each Python object
        # a lookup touches is a cache miss: 25 µs a lookup that way, 10 µs this way (CPU caches
        # cold, AVX-512 VNNI host).
        self._entries: dict[int, tuple[weakref.ref[Tensor], tuple[Any, ...], Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Tensor, version: tuple[Any, ...] | None, make: Callable[[], _T]) -> _T:
        """The value made for ``key`` at ``version`` (a :func:`stamp`); None: always remake.

        A view is kept under the tensor it views: a graph that takes a fresh view of a weight
        on every call (an exported TorchAO layer's ``weight.t()``) still finds its entry. The
        stamp holds the view's shape and strides, so another view of it is remade."""
        if version is None:
            return make()
        if key._base is not None:
            key = key._base
        ident = id(key)
        hit = self._entries.get(ident)
        if hit is not None and hit[0]() is not key:
            hit = None  # another tensor's entry: not yet dropped, at an id now reused
        if hit is not None and hit[1] == version:
            value: _T = hit[2]
            return value
        value = make()
        ref = hit[0] if hit is not None else weakref.ref(key, self._dropper(ident))
        with self._lock:
            self._entries[ident] = (ref, version, value)
        return value

    def discard(self, key: Tensor) -> None:
        """Drop ``key``'s entry (its view's, as :meth:`get` keeps it), if it has one: a value
        no longer wanted while the key lives."""
        if key._base is not None:
            key = key._base
        with self._lock:
            hit = self._entries.get(id(key))
            if hit is not None and hit[0]() is key:
                del self._entries[id(key)]

    def _dropper(self, ident: int) -> Callable[[weakref.ref[Tensor]], None]:
        """The callback that drops ``ident``'s entry once its key dies (if it is still that
        key's: a new tensor at the same id has its own)."""
        cache = weakref.ref(self)  # not kept alive by its entries' callbacks

        def drop(ref: weakref.ref[Tensor]) -> None:
            # No lock: this runs wherever the key dies, a collection inside get's locked
            # insert included; a dict's get and pop are atomic on their own.
            live = cache()
            if live is None:
                return
            hit = live._entries.get(ident)
            if hit is not None and hit[0] is ref:
                live._entries.pop(ident, None)

        return drop

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


#: Every cache of values derived from weights, so :func:`clear_caches` empties them all.
CACHES: list[TensorCache] = []


def new_cache() -> TensorCache:
    """A :class:`TensorCache` that :func:`clear_caches` clears."""
    cache = TensorCache()
    CACHES.append(cache)
    return cache


def clear_caches() -> None:
    """Forget every cached quantized weight, requantization parameter and host operand."""
    for cache in CACHES:
        cache.clear()
