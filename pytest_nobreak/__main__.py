"""``python -m pytest_nobreak``: CI commands around pytest runs (:mod:`pytest_nobreak.gate.shards`;
``zoo``: :mod:`pytest_nobreak.report.zoo`)."""

from __future__ import annotations

import sys

from pytest_nobreak.gate.shards import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["zoo"]:
        from pytest_nobreak.report import zoo

        sys.exit(zoo.main(sys.argv[2:]))
    sys.exit(main())
