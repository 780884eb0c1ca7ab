"""An in-process ``pytester`` run leaves ``torch._dynamo.config`` as it found it
(``tests/conftest.py``'s ``_dynamo_config_kept``). The two tests run in this order."""

from __future__ import annotations

import pytest
import torch._dynamo


def test_an_in_process_run_sets_a_dynamo_setting_at_import(pytester: pytest.Pytester) -> None:
    assert not torch._dynamo.config.capture_scalar_outputs
    pytester.makepyfile(
        "import torch._dynamo\n\ntorch._dynamo.config.capture_scalar_outputs = True\n\n"
        "def test_a():\n    pass\n"
    )
    pytester.runpytest().assert_outcomes(passed=1)
    assert torch._dynamo.config.capture_scalar_outputs  # set in this process, until teardown


def test_the_next_test_finds_it_put_back() -> None:
    assert not torch._dynamo.config.capture_scalar_outputs
