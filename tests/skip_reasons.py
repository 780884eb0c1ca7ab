"""Reasons of skips CI accepts (``tests/conftest.py``'s ``ALLOWED_CI_SKIPS``), where the tests
that skip with them read them too."""

#: A test that needs the ``amx`` kernel, on a process without it (:mod:`tests.amx`).
AMX_SKIP = "no amx kernel"
