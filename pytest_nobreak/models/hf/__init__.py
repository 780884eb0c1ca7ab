"""``hf:<model_type>[:<task>]``: a ``transformers`` architecture, shrunk, with random weights.

No download: the model is built from its config class's defaults, shrunk to a few million
parameters (:mod:`.shrinking` lists the sizes), in eval mode, with inputs inferred from its main
input and config (:mod:`.inputs`). Imported only when a ``--nobreak-model`` is given: it
imports ``transformers`` and torch.
"""

from pytest_nobreak.models.hf.architectures import (
    MAX_PARAMS,
    SET_TASKS,
    TASKS,
    build_hf,
    check_hf,
    hf_set,
)
from pytest_nobreak.models.hf.inputs import hf_inputs, hf_layouts
from pytest_nobreak.models.hf.shrinking import SHRINKS, shallow, shrink
from pytest_nobreak.models.skips import BuildSkip, first_line

__all__ = [
    "MAX_PARAMS",
    "SET_TASKS",
    "SHRINKS",
    "TASKS",
    "BuildSkip",
    "build_hf",
    "check_hf",
    "first_line",
    "hf_inputs",
    "hf_layouts",
    "hf_set",
    "shallow",
    "shrink",
]
