"""The weight caches: a value kept per tensor while its stamp holds, dropped with the tensor."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from asic_backend.sim.tensor_cache import TensorCache, stamp
from tests import gc_freeze


class Value:
    """A cached value that can be weakly referenced (to see when the cache lets it go)."""


def cached(cache: TensorCache, key: torch.Tensor, made: list[Value]) -> Value:
    def make() -> Value:
        made.append(Value())
        return made[-1]

    return cache.get(key, stamp(key), make)


def test_a_value_is_kept_while_the_tensor_is_unchanged_and_remade_after_a_write() -> None:
    cache, made = TensorCache(), []
    w = torch.ones(4, 3)
    first = cached(cache, w, made)
    assert cached(cache, w, made) is first
    w.add_(1)
    second = cached(cache, w, made)
    assert second is not first
    assert cached(cache, w, made) is second
    assert len(made) == 2


def test_a_view_finds_the_value_of_its_base_and_another_view_is_remade() -> None:
    cache, made = TensorCache(), []
    w = torch.ones(4, 3)
    first = cached(cache, w.t(), made)
    assert cached(cache, w.t(), made) is first  # a fresh view of the same shape and strides
    assert cached(cache, w[:2], made) is not first
    assert len(made) == 2


def test_discard_drops_one_tensors_value_by_it_or_a_view_of_it() -> None:
    cache, made = TensorCache(), []
    w, other = torch.ones(4, 3), torch.ones(4, 3)
    first, kept = cached(cache, w, made), cached(cache, other, made)
    cache.discard(w.t())
    assert cached(cache, w, made) is not first
    assert cached(cache, other, made) is kept
    cache.discard(torch.ones(2))  # no entry: nothing to do
    assert len(made) == 3


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@gc_freeze.paused()  # it checks that a dropped tensor is collected
def test_an_entry_goes_with_its_tensor_and_a_new_tensor_gets_its_own() -> None:
    cache, made = TensorCache(), []
    w = torch.ones(4, 3)
    value = weakref.ref(cached(cache, w, made))
    made.clear()
    del w
    gc.collect()
    assert value() is None
    assert cache._entries == {}
    other = torch.ones(4, 3)
    assert cached(cache, other, made) is made[-1]


def test_an_inference_tensor_is_never_served_from_the_cache() -> None:
    cache, made = TensorCache(), []
    with torch.inference_mode():
        w = torch.ones(4, 3)
    assert stamp(w) is None
    assert cached(cache, w, made) is not cached(cache, w, made)


def test_clear_forgets_every_value() -> None:
    cache, made = TensorCache(), []
    w = torch.ones(4, 3)
    first = cached(cache, w, made)
    cache.clear()
    assert cached(cache, w, made) is not first
