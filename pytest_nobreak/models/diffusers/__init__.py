"""``diffusers:<ModelClass>``: a ``diffusers`` model class, shrunk, with random weights.

No download: the model is built from its class's config defaults, shrunk to a few million
parameters (:mod:`.shrinking` lists the sizes), in eval mode, with inputs inferred from its
``forward`` signature and config (:mod:`.inputs`). Imported only when a ``--nobreak-model``
is given: it imports torch, and ``diffusers`` when a ``diffusers:`` SPEC is used.
"""

from pytest_nobreak.models.diffusers.classes import (
    MAX_PARAMS,
    build_diffusers,
    check_diffusers,
    diffusers_set,
)
from pytest_nobreak.models.diffusers.inputs import (
    MAIN_INPUTS,
    Layout,
    diffusers_inputs,
    diffusers_layouts,
)
from pytest_nobreak.models.diffusers.shrinking import SHRINKS, shrink

__all__ = [
    "MAIN_INPUTS",
    "MAX_PARAMS",
    "SHRINKS",
    "Layout",
    "build_diffusers",
    "check_diffusers",
    "diffusers_inputs",
    "diffusers_layouts",
    "diffusers_set",
    "shrink",
]
