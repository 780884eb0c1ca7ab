"""``python -m pytest_nobreak``: CI commands around pytest runs (:mod:`pytest_nobreak.shards`)."""

from __future__ import annotations

import sys

from pytest_nobreak.shards import main

if __name__ == "__main__":
    sys.exit(main())
